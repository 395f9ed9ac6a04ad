//! The timed loop shared by every workload: worker threads pinned to cores, a warm-up, a
//! measured window ended by a flag, and latencies sampled so that reading the timer does not
//! dominate what is timed.
//!
//! * Single mode times 1 check in every [`SAMPLE`] with the TSC (`rdtsc`, ~10 ns here, its
//!   rate calibrated against `Instant` at start-up); the other 63 run untimed. The recorded
//!   latency includes one timer read ([`Timer::overhead_ns`] reports it).
//! * Batch mode times 1 batch in every 4 and records batch time / batch size (the amortized
//!   per-check latency).
//! * Throughput is the sum over threads of checks / that thread's measured wall seconds.
//!   Each thread also reads its own CPU time (`CLOCK_THREAD_CPUTIME_ID`) and its involuntary
//!   context switches over the window: on a shared machine a pinned thread is descheduled,
//!   and CPU-ns per check is then the stable measure of what a check costs (the wall rate
//!   measures the scheduler too).
//!
//! Engines are thin impls of [`Checker`], so the loop is monomorphized per engine and the
//! check inlines into it.

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter};
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};
use turnstile::keyed::Store;
use turnstile::{Clock, Decision, Limiter, Outcome, Verdict};

/// One check in this many is timed (single mode).
pub const SAMPLE: usize = 64;
/// Checks between two looks at the stop flag.
pub const CHUNK: usize = 4096;

/// One engine, as the loop sees it.
pub trait Checker: Sync {
    /// Checks one request of cost 1 for `key`; whether it was admitted.
    fn one(&self, key: u64) -> bool;
    /// Checks a batch, compact answers; how many were admitted.
    fn batch(&self, keys: &[u64], _out: &mut [Verdict]) -> u64 {
        keys.iter().map(|&k| self.one(k) as u64).sum()
    }
    /// Checks a batch, a whole `Decision` per key; how many were admitted.
    fn batch_decisions(&self, keys: &[u64], _out: &mut [Decision]) -> u64 {
        keys.iter().map(|&k| self.one(k) as u64).sum()
    }
}

/// turnstile's keyed store.
pub struct TurnstileKeyed<'a, C: Clock>(pub &'a Store<C>);
impl<C: Clock> Checker for TurnstileKeyed<'_, C> {
    #[inline]
    fn one(&self, key: u64) -> bool {
        self.0.check(&key, 1).allowed()
    }
    #[inline]
    fn batch(&self, keys: &[u64], out: &mut [Verdict]) -> u64 {
        self.0.check_batch_verdicts(keys, 1, out);
        out.iter().filter(|d| d.allowed()).count() as u64
    }
    #[inline]
    fn batch_decisions(&self, keys: &[u64], out: &mut [Decision]) -> u64 {
        self.0.check_batch(keys, 1, out);
        out.iter().filter(|d| d.allowed()).count() as u64
    }
}

/// turnstile's keyless limiter (the key is ignored).
pub struct TurnstileDirect<'a, C: Clock>(pub &'a Limiter<C>);
impl<C: Clock> Checker for TurnstileDirect<'_, C> {
    #[inline]
    fn one(&self, _key: u64) -> bool {
        self.0.check(1).allowed()
    }
}

/// governor's keyed limiter (DashMap, std's SipHash `RandomState`, quanta clock).
pub struct GovernorKeyed<'a>(pub &'a DefaultKeyedRateLimiter<u64>);
impl Checker for GovernorKeyed<'_> {
    #[inline]
    fn one(&self, key: u64) -> bool {
        self.0.check_key(&key).is_ok()
    }
}

/// governor's direct (keyless) limiter (the key is ignored).
pub struct GovernorDirect<'a>(pub &'a DefaultDirectRateLimiter);
impl Checker for GovernorDirect<'_> {
    #[inline]
    fn one(&self, _key: u64) -> bool {
        self.0.check().is_ok()
    }
}

/// Single checks, or batches of this size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One `check` per key.
    Single,
    /// `check_batch_verdicts` over this many keys (compact answers).
    Batch(usize),
    /// `check_batch` over this many keys (a whole `Decision` per key).
    BatchDecisions(usize),
}

impl Mode {
    /// "single" or "batch" (the JSON field).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::Batch(_) => "batch",
            Mode::BatchDecisions(_) => "batch_decisions",
        }
    }
}

/// The TSC (x86-64) or `Instant` elsewhere, with its rate.
pub struct Timer {
    ns_per_tick: f64,
    /// Median cost of an empty timed region, in ns (included in every sampled latency).
    pub overhead_ns: f64,
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn ticks() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn ticks() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Timer {
    /// Calibrates the tick rate over ~20 ms.
    pub fn calibrate() -> Self {
        let (i0, t0) = (Instant::now(), ticks());
        while i0.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let (i1, t1) = (Instant::now(), ticks());
        let ns_per_tick = (i1 - i0).as_nanos() as f64 / (t1.wrapping_sub(t0)).max(1) as f64;
        let mut t = Self {
            ns_per_tick,
            overhead_ns: 0.0,
        };
        let mut v: Vec<u64> = (0..10_001)
            .map(|_| {
                let a = t.now();
                let b = t.now();
                b.wrapping_sub(a)
            })
            .collect();
        v.sort_unstable();
        t.overhead_ns = v[v.len() / 2] as f64 * ns_per_tick;
        t
    }

    /// The current tick.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        ticks()
    }

    /// Ticks to nanoseconds.
    #[inline]
    pub fn ns(&self, ticks: u64) -> u64 {
        (ticks as f64 * self.ns_per_tick) as u64
    }
}

/// CPU time of the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Involuntary context switches of the calling thread so far (0 where unsupported).
pub fn preemptions() -> u64 {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is valid and writable; RUSAGE_THREAD is Linux's per-thread usage.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    if r == 0 {
        ru.ru_nivcsw as u64
    } else {
        0
    }
}

/// What one measured window gave.
pub struct Measured {
    /// Checks in the window, all threads.
    pub checks: u64,
    /// CPU time of the worker threads over the window, ns, summed.
    pub cpu_ns: u64,
    /// Wall time of the worker threads over the window, ns, summed.
    pub wall_ns: u64,
    /// Sum over threads of checks per CPU-second: the rate with the cores to themselves.
    pub cpu_checks_per_sec: f64,
    /// Involuntary context switches of the workers over the window.
    pub preemptions: u64,
    /// Of which admitted.
    pub allowed: u64,
    /// Sum over threads of checks per second.
    pub checks_per_sec: f64,
    /// Sampled latencies, ns, all threads.
    pub hist: Histogram<u64>,
    /// The longest thread window, seconds.
    pub seconds: f64,
}

/// A placeholder decision for batch output buffers.
pub fn blank() -> Decision {
    Decision {
        outcome: Outcome::Allowed,
        limit: 0,
        remaining: 0,
        reset_after_ns: 0,
        retry_after_ns: None,
        delay_ns: 0,
    }
}

/// A worker's batch output buffers.
struct Outs {
    decisions: Vec<Decision>,
    verdicts: Vec<Verdict>,
}

/// A latency histogram from 1 ns to 60 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

#[inline(always)]
fn chunk<C: Checker>(
    c: &C,
    mode: Mode,
    keys: &[u64],
    hist: &mut Histogram<u64>,
    out: &mut Outs,
    t: &Timer,
) -> (u64, u64) {
    let mut allowed = 0u64;
    match mode {
        Mode::Single => {
            for g in keys.chunks_exact(SAMPLE) {
                let t0 = t.now();
                let a = c.one(g[0]);
                let t1 = t.now();
                hist.saturating_record(t.ns(t1.wrapping_sub(t0)).max(1));
                allowed += a as u64;
                for &k in &g[1..] {
                    allowed += c.one(k) as u64;
                }
            }
            (keys.len() as u64, allowed)
        }
        Mode::Batch(b) | Mode::BatchDecisions(b) => {
            let mut n = 0u64;
            let mut one = |g: &[u64]| match mode {
                Mode::BatchDecisions(_) => c.batch_decisions(g, &mut out.decisions),
                _ => c.batch(g, &mut out.verdicts),
            };
            for (i, g) in keys.chunks_exact(b).enumerate() {
                if i % 4 == 0 {
                    let t0 = t.now();
                    allowed += one(g);
                    let t1 = t.now();
                    hist.saturating_record((t.ns(t1.wrapping_sub(t0)) / b as u64).max(1));
                } else {
                    allowed += one(g);
                }
                n += b as u64;
            }
            (n, allowed)
        }
    }
}

/// Where a timed run stands, shared by its workers: warm-up, then the measured window, then
/// stop. Relaxed: the flag carries no data; each thread's results come back through `join`.
pub(crate) struct Phase(AtomicU8);

/// What a worker does next, as [`Window::step`] tells it.
pub(crate) enum Step {
    /// Run the next chunk.
    Go,
    /// The measured window opened just now: reset the counters, then run the next chunk.
    Opened,
    /// The run is over.
    Stop,
}

/// One worker's view of the measured window: when it opened, and the thread's CPU time and
/// preemptions then.
#[derive(Default)]
pub(crate) struct Window {
    start: Option<Instant>,
    cpu0: u64,
    pre0: u64,
}

/// What one worker spent over the measured window.
pub(crate) struct Spent {
    /// Wall time since the window opened (zero if it never did).
    pub wall: Duration,
    /// The thread's CPU time over the window, ns.
    pub cpu_ns: u64,
    /// The thread's involuntary context switches over the window.
    pub preemptions: u64,
}

impl Window {
    /// Looks at the phase once per chunk; on the first look inside the measured window,
    /// reads the thread's clocks.
    #[inline(always)]
    pub(crate) fn step(&mut self, phase: &Phase) -> Step {
        match phase.0.load(Ordering::Relaxed) {
            2 => Step::Stop,
            1 if self.start.is_none() => {
                (self.cpu0, self.pre0) = (thread_cpu_ns(), preemptions());
                self.start = Some(Instant::now());
                Step::Opened
            }
            _ => Step::Go,
        }
    }

    /// Reads the thread's clocks at the end of the run: wall, then CPU, then preemptions.
    pub(crate) fn spent(&self) -> Spent {
        let wall = self.start.map_or(Duration::ZERO, |s| s.elapsed());
        let cpu_ns = thread_cpu_ns().saturating_sub(self.cpu0);
        let preemptions = preemptions().saturating_sub(self.pre0);
        Spent {
            wall,
            cpu_ns,
            preemptions,
        }
    }
}

/// Runs `work(i, phase)` on `threads` threads pinned round-robin to the cores, for `warmup`
/// and then a measured `window`, and returns what each thread gave, in thread order. Each
/// worker loops on [`Window::step`] until it says stop. `what` names the workers in the
/// message of a worker's panic.
pub(crate) fn phased<T: Send>(
    threads: usize,
    warmup: Duration,
    window: Duration,
    what: &str,
    work: impl Fn(usize, &Phase) -> T + Sync,
) -> Vec<T> {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    // 0 warm-up, 1 measure, 2 stop.
    let phase = Phase(AtomicU8::new(0));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
                let (phase, work) = (&phase, &work);
                s.spawn(move || {
                    if let Some(core) = core {
                        core_affinity::set_for_current(core);
                    }
                    work(i, phase)
                })
            })
            .collect();
        std::thread::sleep(warmup);
        phase.0.store(1, Ordering::Relaxed);
        std::thread::sleep(window);
        phase.0.store(2, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("{what} worker panicked"))
            })
            .collect()
    })
}

/// One thread's figures: checks, allowed, measured seconds, CPU ns, preemptions, latencies.
type PerThread = (u64, u64, f64, u64, u64, Histogram<u64>);

/// Runs `c` on `seqs.len()` threads (thread i walks `seqs[i]` round and round), pinned
/// round-robin to the cores, for `warmup` and then a measured `window`.
pub fn measure<C: Checker>(
    c: &C,
    mode: Mode,
    seqs: &[&[u64]],
    warmup: Duration,
    window: Duration,
    timer: &Timer,
) -> Measured {
    let per_thread = phased(seqs.len(), warmup, window, "bench", |i, phase| {
        worker(c, mode, seqs[i], phase, timer)
    });
    fold(per_thread)
}

/// One worker of [`measure`]: walks `seq` chunk by chunk until the phase says stop.
fn worker<C: Checker>(c: &C, mode: Mode, seq: &[u64], phase: &Phase, timer: &Timer) -> PerThread {
    let b = match mode {
        Mode::Single => 1,
        Mode::Batch(b) | Mode::BatchDecisions(b) => b,
    };
    let mut out = Outs {
        decisions: vec![blank(); b],
        verdicts: vec![Verdict::default(); b],
    };
    let mut hist = histogram();
    let (mut checks, mut allowed, mut pos) = (0u64, 0u64, 0usize);
    let mut w = Window::default();
    loop {
        match w.step(phase) {
            Step::Stop => break,
            Step::Opened => {
                hist.reset();
                (checks, allowed) = (0, 0);
            }
            Step::Go => {}
        }
        let end = (pos + CHUNK).min(seq.len());
        let (n, a) = chunk(c, mode, &seq[pos..end], &mut hist, &mut out, timer);
        checks += n;
        allowed += a;
        pos = if end == seq.len() { 0 } else { end };
    }
    let spent = w.spent();
    let secs = spent.wall.as_secs_f64();
    (checks, allowed, secs, spent.cpu_ns, spent.preemptions, hist)
}

/// Sums the threads' figures into one [`Measured`].
fn fold(per_thread: Vec<PerThread>) -> Measured {
    let mut m = Measured {
        checks: 0,
        cpu_ns: 0,
        wall_ns: 0,
        cpu_checks_per_sec: 0.0,
        preemptions: 0,
        allowed: 0,
        checks_per_sec: 0.0,
        hist: histogram(),
        seconds: 0.0,
    };
    for (checks, allowed, secs, cpu, pre, hist) in per_thread {
        m.checks += checks;
        m.allowed += allowed;
        if secs > 0.0 {
            m.checks_per_sec += checks as f64 / secs;
        }
        if cpu > 0 {
            m.cpu_checks_per_sec += checks as f64 * 1e9 / cpu as f64;
        }
        m.cpu_ns += cpu;
        m.wall_ns += (secs * 1e9) as u64;
        m.preemptions += pre;
        m.seconds = m.seconds.max(secs);
        m.hist.add(&hist).expect("same bounds");
    }
    m
}
