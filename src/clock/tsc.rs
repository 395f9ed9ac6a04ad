//! [`TscClock`]: the invariant time-stamp counter, calibrated once per process and anchored to
//! `Instant` per thread.

use super::{nanos, Clock, Nanos};
use std::time::{Duration, Instant};

/// The invariant time-stamp counter scaled to nanoseconds (see the module docs).
///
/// Each thread keeps an *anchor*: a counter reading paired with `Instant`, and a rate in 32.32
/// fixed point. `now = anchor_ns + (rdtsc − anchor_tsc) × rate >> 32`, held at or above the
/// thread's last reading, minus the clock's epoch. The first rate is calibrated once per
/// process over [`TSC_CALIBRATION`] (measured against `Instant` over 2 s, three calibrations:
/// relative error 3e-9 to 1.7e-7). Every [`TSC_REANCHOR`] of counter time (and at once when the
/// counter reads below the anchor), the thread re-anchors: it reads `Instant` again between two
/// counter reads and re-measures the rate over the span since the last anchor. So a changed
/// counter rate (a VM migrated without TSC scaling) skews time for one or two intervals, not for
/// the life of the process, and a backward counter step is never seen as time going backwards.
/// The hot path is the counter read, thread-local loads, a compare, a multiply and a store: no
/// fence, no syscall; `Instant` is read once per interval per thread.
///
/// Worst-case error, by construction (`Anchor`, tested with a synthetic counter):
///
/// * a reading never goes below an earlier reading of the same thread;
/// * between anchors a reading is `anchor + at most TSC_REANCHOR`: whatever the counter does,
///   a thread is never ahead of the `Instant` it anchored on by more than one interval (1 s)
///   plus the anchor's bracket (a few hundred ns; a bracket wider than [`MAX_BRACKET_NS`] is not
///   used to measure a rate);
/// * with a steady counter, the error is the rate's: ≈1e-7 × 1 s = 100 ns at the end of an
///   interval. After a rate change by a factor r, readings drift by up to |1 − 1/r| of the time
///   since the anchor until the next one (at most 1 s of counter time, r s of real time) and the
///   rate measured there is exact from the interval after: e.g. a 10 % change, ≤ 110 ms off for
///   ≤ 2 s. A reading found ahead of `Instant` at a re-anchor holds still (never backwards)
///   until `Instant` catches up: the limits then see time pass too slowly, which admits less;
/// * threads anchor apart, so two threads' readings differ by up to twice the above; every
///   algorithm treats an earlier `now` conservatively.
#[derive(Debug, Clone, Copy)]
pub struct TscClock {
    /// The process-wide reading at which this clock's epoch is.
    epoch: u64,
    mult: u64,
    /// `Some` when the TSC is not usable: the clock is `Instant` then.
    fallback: Option<Instant>,
}

/// How long the one calibration per process spins.
pub const TSC_CALIBRATION: Duration = Duration::from_millis(10);

/// How often (in counter time) each thread re-anchors [`TscClock`] to `Instant`.
pub const TSC_REANCHOR: Duration = Duration::from_secs(1);

/// A re-anchoring bracket (counter, `Instant`, counter) wider than this is not used to measure
/// the counter's rate (the thread was preempted inside it).
pub const MAX_BRACKET_NS: u64 = 20_000;

/// One thread's map from counter ticks to process nanoseconds (see [`TscClock`]). A plain
/// value over an injectable source, so that tests can drive it with any counter.
// Used by the x86-64 counter only (and tests); other targets and loom builds use `Instant`.
#[cfg_attr(not(all(target_arch = "x86_64", not(loom))), allow(dead_code))]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Anchor {
    /// Counter reading and process nanoseconds of the anchor.
    tsc: u64,
    ns: u64,
    /// Nanoseconds per tick, 32.32 fixed point (0: not anchored yet).
    mult: u64,
    /// Ticks after `tsc` within which the anchor is used: `TSC_REANCHOR` at `mult`.
    span: u64,
    /// The last reading handed out (readings never go below it).
    last: u64,
    /// The anchor's bracket was wider than `MAX_BRACKET_NS`: no rate is measured from it.
    loose: bool,
}

/// Where an [`Anchor`] reads time: the counter, and a bracket of it around `Instant`.
#[cfg_attr(not(all(target_arch = "x86_64", not(loom))), allow(dead_code))]
pub(crate) trait TickSource {
    /// `(ticks before, process nanoseconds, ticks after)`.
    fn bracket(&mut self) -> (u64, u64, u64);
}

#[cfg_attr(not(all(target_arch = "x86_64", not(loom))), allow(dead_code))]
impl Anchor {
    /// The reading at counter value `t` (read just before).
    #[inline(always)]
    pub(crate) fn read(&mut self, t: u64, src: &mut impl TickSource, first_mult: u64) -> u64 {
        // One unsigned compare covers both a counter past the interval and one below the anchor.
        let d = t.wrapping_sub(self.tsc);
        let ns = if d < self.span {
            self.ns + ((d as u128 * self.mult as u128) >> 32) as u64
        } else {
            self.reanchor(src, first_mult)
        };
        let ns = ns.max(self.last);
        self.last = ns;
        ns
    }

    /// Pairs the counter with `Instant` again and re-measures the rate over the span since
    /// the previous anchor; returns the process nanoseconds now.
    #[cold]
    #[inline(never)]
    pub(crate) fn reanchor(&mut self, src: &mut impl TickSource, first_mult: u64) -> u64 {
        // The tightest of a few brackets: a preemption inside one widens it, not the others.
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..4 {
            let (a, ns, b) = src.bracket();
            let w = b.wrapping_sub(a);
            if w < best.0 {
                best = (w, a / 2 + b / 2 + (a & b & 1), ns);
            }
        }
        let (width, t, ns) = best;
        let mult = if self.mult == 0 {
            first_mult
        } else {
            self.mult
        };
        let width_ns = ((width as u128 * mult as u128) >> 32) as u64;
        let mut new_mult = mult;
        // Re-measure the rate when both ends are trustworthy: a tight bracket, the counter and
        // Instant both gone forward, over at least half an interval.
        let half = nanos(TSC_REANCHOR) / 2;
        let loose = width_ns > MAX_BRACKET_NS;
        if self.mult != 0 && !self.loose && !loose && t > self.tsc && ns >= self.ns + half {
            let m = (((ns - self.ns) as u128) << 32) / (t - self.tsc) as u128;
            // A counter slower than 1 MHz or faster than 1 THz is not a TSC we trust.
            if m > 0 && m < 1000 << 32 {
                new_mult = m as u64;
            }
        }
        *self = Anchor {
            tsc: t,
            ns,
            mult: new_mult,
            span: ((nanos(TSC_REANCHOR) as u128) << 32).div_ceil(new_mult.max(1) as u128) as u64,
            last: self.last,
            loose,
        };
        ns
    }
}

#[cfg(all(target_arch = "x86_64", not(loom)))]
mod counter {
    use std::cell::UnsafeCell;
    use std::sync::OnceLock;
    use std::time::Instant;

    #[inline(always)]
    pub(super) fn read() -> u64 {
        // SAFETY: rdtsc has no preconditions on x86-64 (it is unprivileged unless CR4.TSD,
        // which no mainstream OS sets for user space).
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// Whether CPUID reports an invariant TSC (constant rate in every P-, C- and T-state).
    fn invariant() -> bool {
        use core::arch::x86_64::__cpuid;
        // SAFETY: cpuid is available on every x86-64 CPU; leaf 0x8000_0000 reports the
        // highest extended leaf, and 0x8000_0007 is read only if it exists. (Newer compilers
        // declare `__cpuid` safe, hence the allow.)
        #[allow(unused_unsafe)]
        unsafe {
            __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
        }
    }

    /// The process's time origin for every anchor.
    fn origin() -> Instant {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(Instant::now)
    }

    /// Nanoseconds per tick in 32.32 fixed point, or `None` without a usable TSC.
    pub(super) fn mult() -> Option<u64> {
        static MULT: OnceLock<Option<u64>> = OnceLock::new();
        *MULT.get_or_init(|| {
            if !invariant() {
                return None;
            }
            // Bracket an Instant read by two counter reads and take the midpoint, at the start
            // and after TSC_CALIBRATION; the ratio of the spans is the rate. Of 16 brackets the
            // tightest is kept: a thread preempted inside one would move its midpoint by up to
            // a time slice, skewing the rate by tens of percent on a loaded machine.
            let pair = || {
                let mut best = (u64::MAX, 0, Instant::now());
                for _ in 0..16 {
                    let a = read();
                    let i = Instant::now();
                    let b = read();
                    if b.wrapping_sub(a) < best.0 {
                        best = (b.wrapping_sub(a), a / 2 + b / 2, i);
                    }
                }
                (best.1, best.2)
            };
            let (t0, i0) = pair();
            let (mut t1, mut i1) = pair();
            while i1.duration_since(i0) < super::TSC_CALIBRATION {
                (t1, i1) = pair();
            }
            let ns = i1.duration_since(i0).as_nanos();
            let ticks = t1.checked_sub(t0)? as u128;
            if ticks == 0 {
                return None;
            }
            let m = (ns << 32) / ticks;
            // A counter slower than 1 MHz or faster than 1 THz is not a TSC we trust.
            (m > 0 && m < 1000 << 32).then_some(m as u64)
        })
    }

    /// The real counter and `Instant`.
    struct Real;
    impl super::TickSource for Real {
        fn bracket(&mut self) -> (u64, u64, u64) {
            let a = read();
            let i = Instant::now();
            let b = read();
            (
                a,
                i.saturating_duration_since(origin()).as_nanos() as u64,
                b,
            )
        }
    }

    thread_local! {
        // Const-initialized and without a destructor: a plain thread-local access (an
        // fs-relative address), never a lazy-init check or a registration. An `UnsafeCell`,
        // updated in place: a `Cell` copied the whole anchor in and out on every reading
        // (35 instructions per reading against 13 before re-anchoring; docs/performance.md).
        static ANCHOR: UnsafeCell<super::Anchor> = const {
            UnsafeCell::new(super::Anchor { tsc: 0, ns: 0, mult: 0, span: 0, last: 0, loose: false })
        };
    }

    /// This thread's reading, in process nanoseconds (`mult`: the calibrated rate).
    #[inline(always)]
    pub(super) fn now(mult: u64) -> u64 {
        let t = read();
        ANCHOR.with(|c| {
            // SAFETY: the anchor is this thread's own, and no other reference to it exists
            // while `read` runs: `read` and `reanchor` call nothing that reads this clock
            // (only rdtsc and `Instant::now`), so there is no re-entrant access.
            let a = unsafe { &mut *c.get() };
            a.read(t, &mut Real, mult)
        })
    }
}

#[cfg(not(all(target_arch = "x86_64", not(loom))))]
mod counter {
    pub(super) fn mult() -> Option<u64> {
        None
    }
    pub(super) fn now(_: u64) -> u64 {
        0
    }
}

impl TscClock {
    /// A clock whose epoch is now (calibrating first, once per process: ~10 ms).
    pub fn new() -> Self {
        match counter::mult() {
            Some(mult) => Self {
                epoch: counter::now(mult),
                mult,
                fallback: None,
            },
            None => Self {
                epoch: 0,
                mult: 0,
                fallback: Some(Instant::now()),
            },
        }
    }

    /// Whether the TSC is in use (`false`: the clock is `Instant`).
    pub fn is_tsc(&self) -> bool {
        self.fallback.is_none()
    }

    /// Nanoseconds per counter tick as calibrated (0 when falling back to `Instant`).
    pub fn ns_per_tick(&self) -> f64 {
        self.mult as f64 / (1u64 << 32) as f64
    }
}

impl Default for TscClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TscClock {
    #[inline]
    fn now(&self) -> Nanos {
        if let Some(start) = self.fallback {
            return start.elapsed().as_nanos() as u64;
        }
        // Saturating: another thread's anchor may put it a little before this clock's epoch.
        counter::now(self.mult).saturating_sub(self.epoch)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The calibrated TSC must advance with `Instant` (within 2 % and 1 ms over a 20 ms spin;
    /// a miscalibration by a power of two or a wrong shift fails by far), and never go below
    /// its epoch. Each `Instant` read is bracketed by two clock reads, so that a preemption
    /// between the reads widens the accepted range instead of failing the test.
    #[test]
    fn tsc_clock_tracks_instant() {
        let c = TscClock::new();
        let (a0, i0, b0) = (c.now(), Instant::now(), c.now());
        while i0.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let (a1, i1, b1) = (c.now(), Instant::now(), c.now());
        let di = i1.duration_since(i0).as_nanos() as i128;
        // The clock's span between the two Instant reads lies in [a1 - b0, b1 - a0].
        let (lo, hi) = (a1 as i128 - b0 as i128, b1 as i128 - a0 as i128);
        let slack = di / 50 + 1_000_000;
        assert!(
            lo - slack <= di && di <= hi + slack,
            "Instant advanced {di} ns while TscClock advanced {lo}..{hi} ns (tsc: {})",
            c.is_tsc()
        );
        assert!(b1 >= a1 && a1 >= b0 && b0 >= a0);
    }

    /// A synthetic machine: real time, and a counter at `num / den` ticks per ns.
    struct Fake {
        real: u64,
        tsc: u64,
        num: u64,
        den: u64,
        /// Extra ticks inside each bracket (a preempted re-anchor).
        gap: u64,
    }
    impl Fake {
        /// A counter at 3 ticks per nanosecond, at `real` ns, no gap.
        fn at(real: u64) -> Self {
            Self {
                real,
                tsc: 1 << 40,
                num: 3,
                den: 1,
                gap: 0,
            }
        }
        fn advance(&mut self, ns: u64) {
            self.real += ns;
            self.tsc = self.tsc.wrapping_add(ns * self.num / self.den);
        }
    }
    impl TickSource for Fake {
        fn bracket(&mut self) -> (u64, u64, u64) {
            (self.tsc, self.real, self.tsc + self.gap)
        }
    }
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    /// Drives an anchor calibrated for 3 ticks/ns through `ms` milliseconds, calling `event` at
    /// each, and returns every (real, reading) pair; asserts readings never go backwards.
    fn drive(f: &mut Fake, ms: u64, mut event: impl FnMut(u64, &mut Fake)) -> Vec<(u64, u64)> {
        let mult = (1u64 << 32) / 3;
        let mut a = Anchor::default();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for i in 0..ms {
            event(i, f);
            let r = a.read(f.tsc, f, mult);
            if let Some(&(_, last)) = out.last() {
                assert!(r >= last, "at {i} ms: {r} < {last}");
            }
            out.push((f.real, r));
            f.advance(MS);
        }
        out
    }

    /// A counter whose rate changes (a VM moved to a host with another TSC frequency, without
    /// scaling): the error is bounded while the rate is re-measured, and gone two intervals
    /// later. Calibrated once per process, as before, the clock stayed a third off for good.
    #[test]
    fn tsc_rate_change_is_re_measured() {
        let mut f = Fake::at(5 * S);
        // 3 GHz, then 2 GHz from 3 s on.
        let out = drive(&mut f, 10_000, |i, f| {
            if i == 3_000 {
                f.num = 2;
            }
        });
        for (i, &(real, r)) in out.iter().enumerate() {
            let err = real.abs_diff(r);
            // Before the change: the calibration is exact here.
            if i < 3_000 {
                assert!(err <= 2, "at {i} ms: off by {err} ns");
            }
            // During the change: at most |1 - 1/r| of 1.5 s of real time (1 s of counter
            // time at the new rate) plus the interval before.
            assert!(err <= 600 * MS, "at {i} ms: off by {err} ns");
            // Two intervals later the rate is re-measured exactly.
            if i >= 6_000 {
                assert!(err <= 2, "at {i} ms: off by {err} ns");
            }
        }
    }

    /// A counter that steps backwards is re-anchored at once and never read as time going
    /// backwards; one that leaps forward is ahead by less than one interval, then holds still
    /// until real time catches up.
    #[test]
    fn tsc_steps_never_go_backwards() {
        let mut f = Fake::at(S);
        let out = drive(&mut f, 6_000, |i, f| match i {
            1_500 => f.tsc -= 1 << 39,
            2_600 => f.tsc += 3 * 300 * MS,
            _ => {}
        });
        for (i, &(real, r)) in out.iter().enumerate() {
            let err = real.abs_diff(r);
            // drive() asserted monotonicity; the error stays under one interval.
            assert!(err < S, "at {i} ms: off by {err} ns");
            // The leap reads as 300 ms ahead, and at the next anchor as a counter 30 % fast
            // for one interval (readings hold, then lag); exact again at the one after.
            if (1_500..2_600).contains(&i) || i >= 4_700 {
                assert!(err <= 2, "at {i} ms: off by {err} ns");
            }
        }
        assert!(
            out[2_650].1 >= out[2_650].0 + 299 * MS,
            "the leap reads as time passing"
        );
        // The backward step: the reading after it is the true time, not earlier.
        assert!(out[1_500].1.abs_diff(out[1_500].0) <= 2);
    }

    /// A bracket stretched by a preemption anchors, but is not used to measure the rate.
    #[test]
    fn a_wide_bracket_does_not_skew_the_rate() {
        let mult = (1u64 << 32) / 3;
        let mut f = Fake::at(S);
        let mut a = Anchor::default();
        a.read(f.tsc, &mut f, mult);
        f.gap = 3 * 4 * MS;
        f.advance(2 * S);
        a.read(f.tsc, &mut f, mult);
        assert_eq!(a.mult, mult, "a 4 ms bracket measures no rate");
        f.gap = 0;
        f.advance(2 * S);
        a.read(f.tsc, &mut f, mult);
        assert_eq!(a.mult, mult, "nor does the interval that starts at it");
    }

    /// Readings are monotonic on one thread.
    #[test]
    fn tsc_clock_is_monotonic_on_one_thread() {
        let c = TscClock::new();
        let mut last = c.now();
        for _ in 0..100_000 {
            let t = c.now();
            assert!(t >= last, "{t} < {last}");
            last = t;
        }
    }
}
