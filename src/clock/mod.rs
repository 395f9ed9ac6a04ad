//! Time, only through the [`Clock`] trait.
//!
//! All algorithms take `now` as monotonic nanoseconds from the clock's own epoch (a `u64`).
//! Nothing in the engine reads a clock by itself: a limiter holds a `Clock`, and every check
//! has a `*_at(now)` variant so that a server can read the clock once per batch.
//!
//! * [`TscClock`] (the default, [`DefaultClock`]) reads the CPU's invariant time-stamp counter
//!   and scales it to nanoseconds from a per-thread anchor to `Instant`, renewed once a second
//!   (the rate re-measured each time). Measured (`turnstile bench --clocks`,
//!   `docs/performance.md`): a read costs 23 instructions (13 before the per-thread anchor)
//!   and, with the first calibration, 12 ns against `Instant`'s 33 ns and 100 (kvm-clock through the vDSO,
//!   with an ordered `rdtsc`), so a keyless check costs 16 ns instead of 37; a keyed check over
//!   1M keys waits on memory and barely moves (216 against 223 ns). Without an invariant TSC
//!   (CPUID), or off x86-64, it falls back to `Instant`.
//! * [`MonotonicClock`] is `std::time::Instant`, i.e. `CLOCK_MONOTONIC` through the vDSO on
//!   Linux. The kernel keeps it monotonic across cores; a TSC read on one core can be a little
//!   behind one just made on another where the counters are not synchronized (governor issue
//!   299). Choose it where that matters more than ~20-100 ns per check.
//! * `CoarseClock` (feature `coarse-clock`) is `CLOCK_MONOTONIC_COARSE`: cheaper, with jiffy
//!   resolution (1-4 ms).
//! * [`ManualClock`] is set by hand, for tests: tests never sleep.
//!
//! What if time goes backwards anyway (a caller passing its own `now`)? Every algorithm treats
//! an earlier `now` conservatively — a window counter within `AHEAD` windows of the latest
//! (1/4096 of its index range; farther back it reads as expired) — it never admits more than
//! it would have at the latest time it has seen, and it never panics. See `docs/algorithms.md`.

mod tsc;

pub use tsc::{TscClock, MAX_BRACKET_NS, TSC_CALIBRATION, TSC_REANCHOR};

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

/// `CLOCK_MONOTONIC_COARSE`: a vDSO read of the last tick, 1-4 ms resolution (feature
/// `coarse-clock`).
#[cfg(feature = "coarse-clock")]
#[derive(Debug, Clone, Copy, Default)]
pub struct CoarseClock;

#[cfg(feature = "coarse-clock")]
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
