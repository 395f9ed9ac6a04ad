//! `bench --clocks`: what reading the time costs, alone and inside a check, for each way of
//! reading it; and `bench --callgrind`: a fixed workload whose instruction counts, divided by
//! its checks, give instructions per check (noise-free, unlike nanoseconds on a shared VM).
//!
//! Clocks compared: `Instant` ([`MonotonicClock`]), [`CoarseClock`] (`CLOCK_MONOTONIC_COARSE`),
//! governor's quanta clock, [`TscClock`] (the default: the calibrated invariant TSC), a cached
//! clock (an `AtomicU64` that a background thread refreshes every 100 µs), and `check_batch`'s
//! one clock read per batch.

use super::keys::{self, Distribution};
use super::limits::{governor_quota, store_capacity, throughput_limit};
use super::options::ClockOptions;
use super::run::{self, Mode, Timer, TurnstileDirect, TurnstileKeyed};
use super::suite::{sequences, SEQ_LEN};
use super::text::{fmt_count, fmt_ns, fmt_rate, load_warning, progress};
use governor::clock::Clock as _;
use serde::Serialize;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{
    Algorithm, Clock, CoarseClock, Limit, Limiter, Limits, MonotonicClock, Nanos, TscClock,
};

/// A clock read from an `AtomicU64` that a background thread refreshes every 100 µs.
#[derive(Clone)]
pub struct CachedClock {
    now: Arc<AtomicU64>,
}

impl Clock for CachedClock {
    #[inline]
    fn now(&self) -> Nanos {
        // Relaxed: the value is the only datum; a slightly stale reading is the design.
        self.now.load(Ordering::Relaxed)
    }
}

/// Starts the refresher; it stops when `stop` is set.
fn cached_clock(stop: Arc<AtomicBool>) -> (CachedClock, std::thread::JoinHandle<()>) {
    let mono = MonotonicClock::new();
    let now = Arc::new(AtomicU64::new(mono.now()));
    let c = CachedClock { now: now.clone() };
    let h = std::thread::spawn(move || {
        // Relaxed: as in `CachedClock::now`.
        while !stop.load(Ordering::Relaxed) {
            now.store(mono.now(), Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(100));
        }
    });
    (c, h)
}

/// Median CPU-ns per call of `f` over 21 rounds of 100k calls; and the smallest non-zero
/// step between two readings (`f` returns a reading in ns), i.e. the resolution.
fn read_cost(f: &dyn Fn() -> u64) -> (f64, u64) {
    let mut per = Vec::new();
    let mut step = u64::MAX;
    for _ in 0..21 {
        let t = run::thread_cpu_ns();
        let mut last = f();
        for _ in 0..100_000 {
            let v = black_box(f());
            if v > last {
                step = step.min(v - last);
            }
            last = v;
        }
        per.push((run::thread_cpu_ns() - t) as f64 / 100_000.0);
    }
    per.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    (per[per.len() / 2], step)
}

#[derive(Serialize)]
struct ClockRow {
    clock: &'static str,
    read_ns: f64,
    resolution_ns: u64,
    /// ns per check on the keyless limiter with this clock, 1 thread.
    unkeyed_ns_per_check: Option<f64>,
    /// ns per check on the keyed store (uniform keys), 1 thread.
    keyed_ns_per_check: Option<f64>,
}

fn unkeyed<C: Clock>(limits: &Limits, clock: C, o: &ClockOptions, t: &Timer, name: &str) -> f64 {
    let l = Limiter::with_limits(limits.clone(), clock);
    let seq = vec![0u64; SEQ_LEN];
    let m = run::measure(
        &TurnstileDirect(&l),
        Mode::Single,
        &[&seq[..]],
        Duration::from_secs_f64(o.seconds / 10.0),
        Duration::from_secs_f64(o.seconds),
        t,
    );
    progress(format!(
        "unkeyed, {name}: {} checks/s",
        fmt_rate(m.checks_per_sec)
    ));
    m.cpu_ns as f64 / m.checks as f64
}

fn keyed<C: Clock>(
    limits: &Limits,
    clock: C,
    o: &ClockOptions,
    seq: &[u64],
    t: &Timer,
    name: &str,
    mode: Mode,
) -> crate::Result<f64> {
    let s = Store::builder(limits.clone())
        .capacity(store_capacity(o.algorithm, o.keys))
        .seed(0x7475_726e)
        .build_with_clock(clock)?;
    for r in 0..o.keys {
        s.check(&keys::key_id(r), 1);
    }
    let m = run::measure(
        &TurnstileKeyed(&s),
        mode,
        &[seq],
        Duration::from_secs_f64(o.seconds / 10.0),
        Duration::from_secs_f64(o.seconds),
        t,
    );
    progress(format!(
        "{} uniform, {name}: {} checks/s",
        fmt_count(o.keys),
        fmt_rate(m.checks_per_sec)
    ));
    Ok(m.cpu_ns as f64 / m.checks as f64)
}

/// Runs `--clocks`.
pub fn run(o: &ClockOptions) -> crate::Result<()> {
    load_warning();
    let t = Timer::calibrate();
    let limits = Limits::new(vec![throughput_limit(o.algorithm)?])?;
    let stop = Arc::new(AtomicBool::new(false));
    let (cached, refresher) = cached_clock(stop.clone());
    let mono = MonotonicClock::new();
    let tsc = TscClock::new();
    let quanta = governor::clock::QuantaClock::default();
    let q0 = quanta.now();
    progress("raw clock reads");
    let raw: Vec<(&'static str, (f64, u64))> = vec![
        ("Instant (MonotonicClock)", read_cost(&|| mono.now())),
        ("CoarseClock", read_cost(&|| CoarseClock.now())),
        (
            "quanta (governor's clock)",
            read_cost(&|| {
                use governor::clock::Reference;
                quanta.now().duration_since(q0).as_u64()
            }),
        ),
        (
            "TscClock (default; rdtsc, scaled)",
            read_cost(&|| tsc.now()),
        ),
        ("cached AtomicU64 (100 µs)", read_cost(&|| cached.now())),
    ];
    let seq = sequences(Distribution::Uniform, o.keys, 1, SEQ_LEN);
    let m = Measure {
        limits: &limits,
        o,
        seq: &seq,
        t: &t,
    };
    let mut rows = Vec::new();
    for (i, (name, (read, res))) in raw.into_iter().enumerate() {
        let (u, k) = match i {
            0 => m.both(mono, name)?,
            1 => m.both(CoarseClock, name)?,
            3 => m.both(tsc, name)?,
            4 => m.both(cached.clone(), name)?,
            // quanta is governor's clock, not one turnstile's checks take.
            _ => (None, None),
        };
        rows.push(ClockRow {
            clock: name,
            read_ns: read,
            resolution_ns: res,
            unkeyed_ns_per_check: u,
            keyed_ns_per_check: k,
        });
    }
    let b = keyed(
        &limits,
        TscClock::new(),
        o,
        &seq,
        &t,
        "TscClock, check_batch 32",
        Mode::Batch(32),
    )?;
    rows.push(ClockRow {
        clock: "TscClock once per check_batch of 32",
        read_ns: rows[3].read_ns / 32.0,
        resolution_ns: rows[3].resolution_ns,
        unkeyed_ns_per_check: None,
        keyed_ns_per_check: Some(b),
    });
    stop.store(true, Ordering::Relaxed);
    let _ = refresher.join();
    print_clocks(o, &rows);
    Ok(())
}

/// One clock inside checks: a keyless limiter and a keyed store, each on one thread.
struct Measure<'a> {
    limits: &'a Limits,
    o: &'a ClockOptions,
    seq: &'a [u64],
    t: &'a Timer,
}

impl Measure<'_> {
    /// CPU-ns per check of the keyless limiter and of the keyed store with `clock`.
    fn both<C: Clock + Clone>(
        &self,
        clock: C,
        name: &str,
    ) -> crate::Result<(Option<f64>, Option<f64>)> {
        let u = unkeyed(self.limits, clock.clone(), self.o, self.t, name);
        let k = keyed(
            self.limits,
            clock,
            self.o,
            self.seq,
            self.t,
            name,
            Mode::Single,
        )?;
        Ok((Some(u), Some(k)))
    }
}

/// The table (or the JSON document) of `--clocks`.
fn print_clocks(o: &ClockOptions, rows: &[ClockRow]) {
    if o.json {
        let doc =
            serde_json::json!({ "clocks": rows, "algorithm": o.algorithm.name(), "keys": o.keys });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serializable")
        );
        return;
    }
    println!(
        "{:<36} {:>8} {:>10} {:>14} {:>14}",
        "clock",
        "read",
        "resolution",
        "unkeyed check",
        format!("{} keyed", fmt_count(o.keys))
    );
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1} ns"));
    for r in rows {
        println!(
            "{:<36} {:>5.1} ns {:>10} {:>14} {:>14}",
            r.clock,
            r.read_ns,
            fmt_ns(r.resolution_ns),
            f(r.unkeyed_ns_per_check),
            f(r.keyed_ns_per_check)
        );
    }
    println!(
        "\n(CPU-ns; 1 thread, {} keys uniform, {} per check)",
        fmt_count(o.keys),
        o.algorithm
    );
}

// ---- callgrind ---------------------------------------------------------------------------

#[inline(never)]
fn cg_turnstile_insert(s: &Store, n: u64) -> u64 {
    (0..n)
        .filter(|&r| s.check(&keys::key_id(r), 1).allowed())
        .count() as u64
}

#[inline(never)]
fn cg_turnstile_single(s: &Store, seq: &[u64]) -> u64 {
    seq.iter().filter(|k| s.check(*k, 1).allowed()).count() as u64
}

#[inline(never)]
fn cg_turnstile_single_at(s: &Store, seq: &[u64], now: Nanos) -> u64 {
    seq.iter()
        .filter(|k| s.check_at(*k, 1, black_box(now)).allowed())
        .count() as u64
}

/// `cg_turnstile_single_at` with the store's limit given with each check
/// (`Store::check_with_at`): the same records, the limit coming from the caller.
#[inline(never)]
fn cg_turnstile_single_with(s: &Store, seq: &[u64], limit: &Limit, now: Nanos) -> u64 {
    seq.iter()
        .filter(|k| {
            s.check_with_at(*k, black_box(limit), 1, black_box(now))
                .is_ok_and(|d| d.allowed())
        })
        .count() as u64
}

#[inline(never)]
fn cg_turnstile_batch_verdicts(s: &Store, seq: &[u64], b: usize) -> u64 {
    let mut out = vec![turnstile::Verdict::default(); b];
    let mut n = 0;
    for g in seq.chunks_exact(b) {
        s.check_batch_verdicts(g, 1, &mut out);
        n += out.iter().filter(|d| d.allowed()).count() as u64;
    }
    n
}

#[inline(never)]
fn cg_turnstile_batch(s: &Store, seq: &[u64], b: usize) -> u64 {
    let mut out = vec![run::blank(); b];
    let mut n = 0;
    for g in seq.chunks_exact(b) {
        s.check_batch(g, 1, &mut out);
        n += out.iter().filter(|d| d.allowed()).count() as u64;
    }
    n
}

#[inline(never)]
fn cg_turnstile_direct(l: &Limiter, n: u64) -> u64 {
    (0..n).filter(|_| l.check(1).allowed()).count() as u64
}

#[inline(never)]
fn cg_governor_insert(g: &governor::DefaultKeyedRateLimiter<u64>, n: u64) -> u64 {
    (0..n)
        .filter(|&r| g.check_key(&keys::key_id(r)).is_ok())
        .count() as u64
}

#[inline(never)]
fn cg_governor_keyed(g: &governor::DefaultKeyedRateLimiter<u64>, seq: &[u64]) -> u64 {
    seq.iter().filter(|k| g.check_key(k).is_ok()).count() as u64
}

#[inline(never)]
fn cg_governor_direct(g: &governor::DefaultDirectRateLimiter, n: u64) -> u64 {
    (0..n).filter(|_| g.check().is_ok()).count() as u64
}

#[inline(never)]
fn cg_clock_instant(n: u64) -> u64 {
    let c = MonotonicClock::new();
    (0..n).map(|_| black_box(c.now()) & 1).sum()
}

#[inline(never)]
fn cg_clock_default(c: &TscClock, n: u64) -> u64 {
    (0..n).map(|_| black_box(c.now()) & 1).sum()
}

/// Runs `--callgrind`: every `cg_*` function does a known number of checks; their inclusive
/// instruction counts divided by that number are instructions per check.
pub fn callgrind(a: Algorithm, keys: u64, checks: u64, batch: usize) -> crate::Result<()> {
    let limits = Limits::new(vec![throughput_limit(a)?])?;
    let s = Store::builder(limits.clone())
        .capacity(store_capacity(a, keys))
        .seed(0x7475_726e)
        .build()?;
    let seq = keys::sequence(
        Distribution::Uniform,
        keys,
        checks as usize,
        0x0be7_c4ec_5eed,
    );
    let g = governor::RateLimiter::keyed(governor_quota());
    let gd = governor::RateLimiter::direct(governor_quota());
    let l = Limiter::with_limits(limits, TscClock::new());
    let b = batch.min(checks as usize).max(1);
    let batched = checks as usize / b * b;
    // In this order: the keys are inserted first, so every later check is a lookup.
    let mut results = Vec::new();
    results.push(("cg_turnstile_insert", keys, cg_turnstile_insert(&s, keys)));
    results.push(("cg_governor_insert", keys, cg_governor_insert(&g, keys)));
    results.push(("cg_turnstile_single", checks, cg_turnstile_single(&s, &seq)));
    let now = s.clock().now();
    results.push((
        "cg_turnstile_single_at",
        checks,
        cg_turnstile_single_at(&s, &seq, now),
    ));
    if a.is_packed() {
        let limit = s.limits().limits()[0];
        results.push((
            "cg_turnstile_single_with",
            checks,
            cg_turnstile_single_with(&s, &seq, &limit, now),
        ));
    }
    let batch_keys = &seq[..batched];
    results.push((
        "cg_turnstile_batch",
        batched as u64,
        cg_turnstile_batch(&s, batch_keys, b),
    ));
    results.push((
        "cg_turnstile_batch_verdicts",
        batched as u64,
        cg_turnstile_batch_verdicts(&s, batch_keys, b),
    ));
    results.push(("cg_governor_keyed", checks, cg_governor_keyed(&g, &seq)));
    results.push((
        "cg_turnstile_direct",
        checks,
        cg_turnstile_direct(&l, checks),
    ));
    results.push((
        "cg_governor_direct",
        checks,
        cg_governor_direct(&gd, checks),
    ));
    results.push(("cg_clock_instant", checks, cg_clock_instant(checks)));
    let c = *s.clock();
    results.push(("cg_clock_default", checks, cg_clock_default(&c, checks)));
    // Under valgrind CPUID may hide the invariant TSC: then the default clock is Instant.
    println!("# default clock is the TSC: {}", c.is_tsc());
    println!("# {a}, {} keys, uniform; batch {b}", fmt_count(keys));
    println!("# function checks admitted");
    for (f, n, ok) in results {
        println!("{f} {n} {ok}");
    }
    println!("# instructions per check = inclusive Ir of the function / checks:");
    println!("#   valgrind --tool=callgrind --callgrind-out-file=cg.out target/release/turnstile bench --callgrind");
    println!("#   callgrind_annotate --inclusive=yes cg.out | grep cg_");
    Ok(())
}
