//! `token_bucket`: capacity (burst) B, refill of `rate` tokens per `period`, continuous, cost n.
//!
//! Formulated as GCRA (virtual scheduling, ITU-T I.371): the state is one time, the *theoretical
//! arrival time* TAT at which the bucket would be full again. With T = period / rate (ns per
//! token) and τ = B × T:
//!
//! ```text
//! admit n at now  ⟺  max(TAT, now) + n·T − now ≤ τ      then TAT := max(TAT, now) + n·T
//! tokens(now)      =  (τ − max(0, TAT − now)) / T       (the notes' tokens-and-timestamp form)
//! ```
//!
//! The equivalence with the notes' form (tokens, last timestamp, refill, cap at capacity) is a
//! test (`tests/reference.rs`). T is a whole number of nanoseconds, rounded *up* from
//! period / rate, so the bucket never refills faster than configured (relative error < 1/T:
//! 1.5e-8 for 15/s).
//!
//! # Packed state (63 bits; bit 63 belongs to the keyed store)
//!
//! ```text
//!  62                                             0
//! +------------------------------------------------+
//! |  TAT, ns since the clock's epoch (63 bits)      |
//! +------------------------------------------------+
//! ```
//!
//! 2^63 ns is 292 years. A TAT is at most 2^63 − 2: a request that would push it further
//! cannot be admitted at any time the state can hold and is `NeverFits` (so is every request
//! once `now` itself is past it, with `remaining` 0: nothing fits any more). State 0 (TAT in
//! the past) is a full bucket. An earlier `now` only makes TAT − now larger: time going
//! backwards admits less, never more.

use crate::decision::{ConfigError, Decision};

/// Largest TAT.
pub const MAX_TAT: u64 = (1 << 63) - 1;
/// The largest τ = capacity × T: a quarter of the TAT range, so that TAT + τ never saturates
/// for a clock younger than 219 years.
pub const MAX_TAU: u64 = 1 << 61;

/// Parameters, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Capacity B (the burst), in tokens.
    pub capacity: u64,
    /// T: ns per token.
    pub interval: u64,
    /// τ = B × T.
    pub tau: u64,
}

impl Params {
    /// `rate` tokens per `period` ns, holding at most `capacity`.
    pub fn new(capacity: u64, rate: u64, period: u64) -> Result<Self, ConfigError> {
        if rate == 0 {
            return Err(ConfigError::new(
                "limit",
                "the refill rate must be at least 1 token per period",
            ));
        }
        if period == 0 {
            return Err(ConfigError::new(
                "window",
                "the refill period must be at least 1 ns",
            ));
        }
        if rate > period {
            return Err(ConfigError::new("limit", format!("{rate} tokens per {period} ns is more than one per nanosecond, the finest refill step; lower the rate")));
        }
        let interval = period.div_ceil(rate);
        Self::with_interval(capacity, interval)
    }

    /// One token every `interval` ns, holding at most `capacity`.
    pub fn with_interval(capacity: u64, interval: u64) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new(
                "burst",
                "the capacity (burst) must be at least 1 token",
            ));
        }
        if interval == 0 {
            return Err(ConfigError::new(
                "limit",
                "more than one token per nanosecond cannot be represented; lower the rate",
            ));
        }
        match capacity.checked_mul(interval) {
            Some(tau) if tau <= MAX_TAU => Ok(Self { capacity, interval, tau }),
            _ => Err(ConfigError::new(
                "burst",
                format!("capacity {capacity} × {interval} ns per token exceeds the 2^61 ns (73 years) a bucket can span; lower the burst or raise the rate"),
            )),
        }
    }
}

/// The shared GCRA step over a TAT in [`MAX_TAT`]: `n·T` fits at `now` iff
/// `max(TAT, now) + n·T ≤ top`, with `top = min(now + τ, MAX_TAT − 1)` (the bucket's depth,
/// and the last time a TAT can hold).
#[derive(Clone, Copy)]
pub(crate) struct Gcra {
    /// max(TAT, now).
    base: u64,
    top: u64,
    interval: u64,
    tau: u64,
}

impl Gcra {
    #[inline]
    pub(crate) fn new(tat: u64, now: u64, interval: u64, tau: u64) -> Self {
        Self {
            base: tat.max(now),
            top: now.saturating_add(tau).min(MAX_TAT - 1),
            interval,
            tau,
        }
    }
    /// Requests that fit now (0 once `now` is past what a TAT can hold: 2^63 ns, 292 years).
    #[inline]
    pub(crate) fn remaining(&self) -> u64 {
        self.remaining_after(self.base)
    }
    /// Requests that fit now once the TAT is `tat` (≥ the base).
    #[inline]
    pub(crate) fn remaining_after(&self, tat: u64) -> u64 {
        self.top.saturating_sub(tat) / self.interval
    }
    /// `Ok(new TAT)` if `cost` fits now; else `Err(retry)`: ns until it fits, `None` if it never
    /// does (more than the capacity, or not before the TAT's range ends).
    #[inline]
    pub(crate) fn take(&self, now: u64, cost: u64, capacity: u64) -> Result<u64, Option<u64>> {
        // A multiply, not `remaining()`'s divide, on the hot path.
        let room = self.top.saturating_sub(self.base);
        if let Some(n) = cost.checked_mul(self.interval).filter(|&n| n <= room) {
            return Ok(self.base + n);
        }
        if cost > capacity {
            return Err(None);
        }
        // It fits at t = TAT + n·T − τ (≤ TAT, as n·T ≤ τ), if that TAT can be held.
        let need = self.base as u128 + cost as u128 * self.interval as u128;
        if need > (MAX_TAT - 1) as u128 {
            return Err(None);
        }
        Err(Some((need - self.tau as u128 - now as u128) as u64))
    }
    /// The TAT `tat` with `n` requests of `interval` ns given back at `now`: never before `now`
    /// (a bucket holds no more than full), unchanged if already there.
    #[inline]
    pub(crate) fn refund(tat: u64, now: u64, interval: u64, n: u64) -> u64 {
        if tat <= now {
            return tat;
        }
        tat.saturating_sub(n.saturating_mul(interval)).max(now)
    }
    /// The TAT `tat` with `n` requests of `interval` ns taken at `now` whatever the bucket
    /// holds: past its depth, the bucket owes them (a debt), and checks wait until it has
    /// refilled them. The TAT stays below [`MAX_TAT`].
    #[inline]
    pub(crate) fn charge(tat: u64, now: u64, interval: u64, n: u64) -> u64 {
        tat.max(now)
            .saturating_add(n.saturating_mul(interval))
            .min(MAX_TAT - 1)
    }
}

/// The transition. Cost 0 peeks.
// Always inlined, in other crates too: a call returns the 56-byte `Decision` through memory,
// and the caller's wide reload of it stalls on store forwarding (a server's `CL.THROTTLE`,
// where the compiler chose the call: docs/service.md).
#[inline(always)]
pub fn decide(tat: u64, now: u64, p: &Params, cost: u64) -> (u64, Decision) {
    let backlog = tat.saturating_sub(now);
    let g = Gcra::new(tat, now, p.interval, p.tau);
    if cost == 0 {
        return (tat, Decision::allow(p.capacity, g.remaining(), backlog));
    }
    match g.take(now, cost, p.capacity) {
        Ok(new) => (
            new,
            Decision::allow(p.capacity, g.remaining_after(new), new - now),
        ),
        Err(retry) => (
            tat,
            Decision::deny(p.capacity, g.remaining(), backlog, retry),
        ),
    }
}

/// Gives `n` tokens back (never above capacity).
#[inline]
pub fn refund(tat: u64, now: u64, p: &Params, n: u64) -> u64 {
    Gcra::refund(tat, now, p.interval, n)
}

/// Takes `n` tokens whatever the bucket holds (a settled cost above the one checked): below
/// empty, the bucket owes them and admits again once it has refilled past them. A debt that
/// would end past the TAT's range (2^63 ns) is capped there, and the key's next checks are
/// `NeverFits`.
#[inline]
pub fn charge(tat: u64, now: u64, p: &Params, n: u64) -> u64 {
    Gcra::charge(tat, now, p.interval, n)
}

/// Nanoseconds until the bucket is full (equivalent to a fresh record).
#[inline]
pub fn idle_in(tat: u64, now: u64, _p: &Params) -> u64 {
    tat.saturating_sub(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    const S: u64 = 1_000_000_000;

    #[test]
    fn burst_then_rate() {
        let p = Params::new(15, 15, S).unwrap();
        let mut tat = 0;
        for i in 0..15 {
            let (t, d) = decide(tat, 10 * S, &p, 1);
            assert!(d.allowed(), "burst {i}");
            tat = t;
        }
        let (_, d) = decide(tat, 10 * S, &p, 1);
        assert!(!d.allowed());
        let r = d.retry_after_ns.unwrap();
        assert!(!decide(tat, 10 * S + r - 1, &p, 1).1.allowed());
        assert!(decide(tat, 10 * S + r, &p, 1).1.allowed());
    }

    #[test]
    fn never_fits() {
        let p = Params::new(3, 1, S).unwrap();
        let (_, d) = decide(0, S, &p, 4);
        assert_eq!(d.outcome, crate::Outcome::NeverFits);
    }

    #[test]
    fn refuses_unrepresentable() {
        assert!(Params::new(0, 1, S).is_err());
        assert!(Params::new(1, 0, S).is_err());
        assert!(Params::new(1, 2 * S, S).is_err());
        assert!(Params::new(u64::MAX, 1, S).is_err());
    }
}
