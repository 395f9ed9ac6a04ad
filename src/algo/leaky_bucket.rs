//! `leaky_bucket`: a queue draining at `rate` per `period`, as a meter or as a shaper.
//!
//! The nginx `limit_req` semantics, exactly. With T = period / rate, nginx keeps an `excess`
//! per key: `excess := max(0, excess − rate·elapsed + 1)`; a request is rejected when
//! `excess > burst`, and otherwise delayed by `(excess − delay) / rate` when `excess > delay`.
//! In virtual-scheduling form (the same packed TAT as `token_bucket`) excess after a request
//! is `(TAT' − now) / T − 1`, so:
//!
//! ```text
//! TAT' = max(TAT, now) + n·T
//! reject       ⟺ TAT' − now > (burst + 1)·T                (nothing is recorded)
//! delay        = max(0, TAT' − now − (delay + 1)·T)           (shaper only)
//! ```
//!
//! * Meter: `delay = burst` (nginx `nodelay`): never delays, rejects when full. As a meter the
//!   leaky bucket is the token bucket with capacity `burst + 1` (GCRA is both).
//! * Shaper: the first `delay + 1` requests of a burst pass at once, the next `burst − delay`
//!   are admitted with a wait that spaces them T apart; beyond that they are rejected.
//!
//! # Packed state
//! Identical to `token_bucket`: one 63-bit TAT in ns.

use super::token_bucket::{Gcra, MAX_TAU};
use crate::decision::{ConfigError, Decision};

/// Meter or shaper.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Reject when full, never delay (nginx `nodelay`).
    Meter,
    /// Admit with a delay (nginx `delay=N`; the first N excess requests pass undelayed).
    Shaper {
        /// Excess requests that pass without a delay (0..=burst).
        delay: u64,
    },
}

/// Parameters, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// T: ns per request drained.
    pub interval: u64,
    /// nginx `burst`: excess requests the queue holds.
    pub burst: u64,
    /// Excess requests admitted undelayed (= burst for a meter).
    pub delay: u64,
    /// (burst + 1) · T.
    pub tau: u64,
    /// (delay + 1) · T.
    pub free: u64,
    /// Meter or shaper.
    pub mode: Mode,
}

impl Params {
    /// Drains `rate` per `period` ns, queueing `burst` excess requests.
    pub fn new(rate: u64, period: u64, burst: u64, mode: Mode) -> Result<Self, ConfigError> {
        if rate == 0 {
            return Err(ConfigError::new(
                "limit",
                "the drain rate must be at least 1 request per period",
            ));
        }
        if period == 0 {
            return Err(ConfigError::new(
                "window",
                "the period must be at least 1 ns",
            ));
        }
        let interval = period.div_ceil(rate);
        let delay = match mode {
            Mode::Meter => burst,
            Mode::Shaper { delay } if delay <= burst => delay,
            Mode::Shaper { delay } => {
                return Err(ConfigError::new("delay", format!("delay ({delay}) must be at most burst ({burst}): it counts the excess requests that pass undelayed")))
            }
        };
        let tau = burst
            .checked_add(1)
            .and_then(|b| b.checked_mul(interval))
            .filter(|&t| t <= MAX_TAU);
        let Some(tau) = tau else {
            return Err(ConfigError::new(
                "burst",
                "burst × interval exceeds the 2^61 ns a bucket can span; lower the burst",
            ));
        };
        Ok(Self {
            interval,
            burst,
            delay,
            tau,
            free: (delay + 1) * interval,
            mode,
        })
    }

    /// Requests the bucket holds: burst + 1.
    pub fn capacity(&self) -> u64 {
        self.burst + 1
    }
}

/// The transition. Cost 0 peeks. (A request that cannot be admitted before the TAT's range
/// ends, 2^63 ns, is `NeverFits`: see `token_bucket`.)
// Always inlined, in other crates too: a call returns the 56-byte `Decision` through memory,
// and the caller's wide reload of it stalls on store forwarding (a server's `CL.THROTTLE`,
// where the compiler chose the call: docs/service.md).
#[inline(always)]
pub fn decide(tat: u64, now: u64, p: &Params, cost: u64) -> (u64, Decision) {
    let cap = p.capacity();
    let backlog = tat.saturating_sub(now);
    let g = Gcra::new(tat, now, p.interval, p.tau);
    if cost == 0 {
        return (tat, Decision::allow(cap, g.remaining(), backlog));
    }
    match g.take(now, cost, cap) {
        Ok(new) => {
            let after = new - now;
            let mut d = Decision::allow(cap, g.remaining_after(new), after);
            d.delay_ns = after.saturating_sub(p.free);
            (new, d)
        }
        Err(retry) => (tat, Decision::deny(cap, g.remaining(), backlog, retry)),
    }
}

/// Gives `n` back.
#[inline]
pub fn refund(tat: u64, now: u64, p: &Params, n: u64) -> u64 {
    Gcra::refund(tat, now, p.interval, n)
}

/// Adds `n` to the queue whatever it holds (a settled cost above the one checked): past its
/// burst, the queue drains them before it admits again.
#[inline]
pub fn charge(tat: u64, now: u64, p: &Params, n: u64) -> u64 {
    Gcra::charge(tat, now, p.interval, n)
}

/// Nanoseconds until empty.
#[inline]
pub fn idle_in(tat: u64, now: u64, _p: &Params) -> u64 {
    tat.saturating_sub(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    const MS: u64 = 1_000_000;

    /// nginx `limit_req zone rate=10r/s burst=5 delay=2`: 8 back-to-back requests → 3 pass at
    /// once, 3 are delayed 100, 200, 300 ms, 2 are rejected.
    #[test]
    fn nginx_delay_semantics() {
        let p = Params::new(10, 1000 * MS, 5, Mode::Shaper { delay: 2 }).unwrap();
        let mut tat = 0;
        let mut out = vec![];
        for _ in 0..8 {
            let (t, d) = decide(tat, 1000 * MS, &p, 1);
            tat = t;
            out.push(if d.allowed() {
                Some(d.delay_ns / MS)
            } else {
                None
            });
        }
        assert_eq!(
            out,
            vec![
                Some(0),
                Some(0),
                Some(0),
                Some(100),
                Some(200),
                Some(300),
                None,
                None
            ]
        );
    }

    #[test]
    fn meter_never_delays() {
        let p = Params::new(10, 1000 * MS, 5, Mode::Meter).unwrap();
        let mut tat = 0;
        let mut admitted = 0;
        for _ in 0..10 {
            let (t, d) = decide(tat, 0, &p, 1);
            tat = t;
            assert_eq!(d.delay_ns, 0);
            admitted += d.allowed() as u32;
        }
        assert_eq!(admitted, 6);
    }

    #[test]
    fn delay_must_fit_burst() {
        assert!(Params::new(10, 1000, 2, Mode::Shaper { delay: 3 }).is_err());
    }
}
