//! Time, only through the [`Clock`] trait.
//!
//! All algorithms take `now` as monotonic nanoseconds from the clock's own epoch (a `u64`).
//! Nothing in the engine reads a clock by itself: a limiter holds a `Clock`, and every check
//! has a `*_at(now)` variant so that a server can read the clock once per batch.
//!
//! * [`TscClock`] (the default, [`DefaultClock`]) reads the CPU's invariant time-stamp counter
//!   and scales it to nanoseconds with a factor calibrated once per process against
//!   `Instant`. Measured (`turnstile bench --clocks`, `docs/performance.md`): a read costs
//!   12 ns and 13 instructions against `Instant`'s 33 ns and 100 (kvm-clock through the vDSO,
//!   with an ordered `rdtsc`), so a keyless check costs 16 ns instead of 37; a keyed check over
//!   1M keys waits on memory and barely moves (216 against 223 ns). Without an invariant TSC
//!   (CPUID), or off x86-64, it falls back to `Instant`.
//! * [`MonotonicClock`] is `std::time::Instant`, i.e. `CLOCK_MONOTONIC` through the vDSO on
//!   Linux. The kernel keeps it monotonic across cores; a TSC read on one core can be a little
//!   behind one just made on another where the counters are not synchronized (governor issue
//!   299). Choose it where that matters more than ~20-100 ns per check.
//! * [`CoarseClock`] is `CLOCK_MONOTONIC_COARSE`: cheaper, with jiffy resolution (1-4 ms).
//! * [`ManualClock`] is set by hand, for tests: tests never sleep.
//!
//! What if time goes backwards anyway (a caller passing its own `now`)? Every algorithm treats
//! an earlier `now` conservatively — a window counter within `AHEAD` windows of the latest
//! (1/4096 of its index range; farther back it reads as expired) — it never admits more than
//! it would have at the latest time it has seen, and it never panics. See `docs/algorithms.md`.

use crate::sync::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds since a clock's epoch.
pub type Nanos = u64;

/// A source of monotonic nanoseconds.
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds since this clock's epoch.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// `std::time::Instant` relative to a per-clock start: monotonic across threads and cores.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Nanos {
        // An Instant never goes backwards (std clamps); 2^64 ns is 584 years.
        self.start.elapsed().as_nanos() as u64
    }
}

/// The clock stores, limiters and rules engines use unless given another.
pub type DefaultClock = TscClock;

/// The invariant time-stamp counter scaled to nanoseconds (see the module docs).
///
/// `now = (rdtsc − base) × mult >> 32`: `mult` is nanoseconds per tick in 32.32 fixed point,
/// calibrated once per process over [`TSC_CALIBRATION`] against `Instant` (measured against
/// `Instant` over 2 s, three calibrations: relative error 3e-9 to 1.7e-7, so a limit of 1000
/// per second stays within 1000.0002). The counter is read without a
/// fence: a check needs no ordering against other instructions, and a fence is exactly the
/// cost this clock exists to avoid. A reading a little behind another core's (unsynchronized
/// counters) is safe: every algorithm treats an earlier `now` conservatively, and `now` is
/// clamped at the clock's epoch.
#[derive(Debug, Clone, Copy)]
pub struct TscClock {
    base: u64,
    mult: u64,
    /// `Some` when the TSC is not usable: the clock is `Instant` then.
    fallback: Option<Instant>,
}

/// How long the one calibration per process spins.
pub const TSC_CALIBRATION: Duration = Duration::from_millis(10);

#[cfg(all(target_arch = "x86_64", not(loom)))]
mod tsc {
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
}

#[cfg(not(all(target_arch = "x86_64", not(loom))))]
mod tsc {
    pub(super) fn read() -> u64 {
        0
    }
    pub(super) fn mult() -> Option<u64> {
        None
    }
}

impl TscClock {
    /// A clock whose epoch is now (calibrating first, once per process: ~10 ms).
    pub fn new() -> Self {
        match tsc::mult() {
            Some(mult) => Self {
                base: tsc::read(),
                mult,
                fallback: None,
            },
            None => Self {
                base: 0,
                mult: 0,
                fallback: Some(Instant::now()),
            },
        }
    }

    /// Whether the TSC is in use (`false`: the clock is `Instant`).
    pub fn is_tsc(&self) -> bool {
        self.fallback.is_none()
    }

    /// Nanoseconds per counter tick (0 when falling back to `Instant`).
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
        // Saturating: a core whose counter is behind the one that set `base` reads 0.
        let d = tsc::read().saturating_sub(self.base);
        ((d as u128 * self.mult as u128) >> 32) as u64
    }
}

/// `CLOCK_MONOTONIC_COARSE`: a vDSO read of the last tick, 1-4 ms resolution.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoarseClock;

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC_COARSE exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64)
    }
}

/// A clock set by hand. Shared between threads; `advance` and `set` are visible to all.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock at `start` nanoseconds.
    pub fn new(start: Nanos) -> Self {
        Self {
            now: AtomicU64::new(start),
        }
    }
    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        // Relaxed: the clock value is the only datum; no other memory is published with it.
        self.now.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
    /// Sets the clock (backwards too: tests of time going backwards use this).
    pub fn set(&self, t: Nanos) {
        // Relaxed: as in `advance`.
        self.now.store(t, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        // Relaxed: as in `advance`.
        self.now.load(Ordering::Relaxed)
    }
}

/// Whole nanoseconds in a `Duration`, saturating at `u64::MAX`.
#[inline]
pub fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
