//! `fixed_window`: one counter per window, window = floor(now / W).
//!
//! 12:00:03 with a 60 s window falls in the 12:00:00 window (note 000). Exact within a window;
//! up to 2 × limit can pass around a window edge (3 at 12:00:59 and 3 at 12:01:00 with 3/min).
//!
//! # Packed state (63 bits; bit 63 belongs to the keyed store)
//!
//! ```text
//!  62                 24 23                  0
//! +---------------------+---------------------+
//! | window index mod 2^39 |   count (24 bits)   |
//! +---------------------+---------------------+
//! ```
//!
//! * `count` ≤ [`MAX_LIMIT`] = 2^24 − 1: larger limits are refused when the limit is built.
//!   With `count_denied`, denied costs are added too and the counter saturates at 2^24 − 1.
//! * The index is kept mod 2^39 (17 years of 1 ms windows). A stored index ahead of now's by
//!   at most [`AHEAD`] = 2^27 windows means the caller's time went backwards: the stored
//!   window is used, so a small step back never finds a fresh window. Any other distance is a
//!   record that has expired ("far behind means expired"), so a long absence never locks a
//!   client out. The index comes round only after 2^39 windows (never for windows of 2^25 ns,
//!   34 ms, or more: 2^64 ns is the whole clock); a record idle within `AHEAD` windows short
//!   of a multiple of 2^39 windows (or exactly one) reads as recent and keeps its count for at
//!   most `AHEAD` + 1 windows more. A step back of more than `AHEAD` windows finds a fresh
//!   window (at most one limit more per such step).
//! * A request that cannot fit before the end of the clock (the next window starts at 2^64 ns
//!   or later) is `NeverFits`, as is a cost above the limit: neither is counted, with or
//!   without `count_denied`.
//! * State 0 is the fresh record. A count of 0 is fresh at any index: an empty record is never
//!   held in an old window.

use crate::decision::{ConfigError, Decision};

/// Bits of the count field.
pub const COUNT_BITS: u32 = 24;
/// Bits of the window-index field.
pub const INDEX_BITS: u32 = 39;
/// The largest limit a fixed window can hold.
pub const MAX_LIMIT: u64 = (1 << COUNT_BITS) - 1;
const COUNT_MASK: u64 = MAX_LIMIT;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// Windows a stored index may be ahead of now's and be read as time going backwards; beyond,
/// the record has expired (module docs).
pub const AHEAD: u64 = 1 << (INDEX_BITS - 12);

/// Parameters, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Admissions per window.
    pub limit: u64,
    /// Window length, ns.
    pub window: u64,
    /// Whether denied requests count against the window (note 002's drawback; off by default).
    pub count_denied: bool,
}

impl Params {
    /// Validates `limit` per `window` ns.
    pub fn new(limit: u64, window: u64, count_denied: bool) -> Result<Self, ConfigError> {
        super::limit_in(
            limit,
            MAX_LIMIT,
            || {
                format!("fixed_window holds 1..={MAX_LIMIT} requests per window (a {COUNT_BITS}-bit counter)")
            },
            "use token_bucket for larger rates",
        )?;
        super::window_at_least_1ns(window)?;
        Ok(Self {
            limit,
            window,
            count_denied,
        })
    }
}

#[inline]
fn unpack(s: u64) -> (u64, u64) {
    ((s >> COUNT_BITS) & INDEX_MASK, s & COUNT_MASK)
}
#[inline]
fn pack(idx: u64, count: u64) -> u64 {
    ((idx & INDEX_MASK) << COUNT_BITS) | (count & COUNT_MASK)
}

/// The window the record is in at `now`: (index mod 2^39, count, ns from `now` until that
/// window ends; more than `u64::MAX` if it ends past the end of the clock).
#[inline]
fn current(s: u64, now: u64, p: &Params) -> (u64, u64, u128) {
    let full = now / p.window;
    let cur = full & INDEX_MASK;
    let (idx, count) = unpack(s);
    let d = cur.wrapping_sub(idx) & INDEX_MASK;
    let end_of = |windows_ahead: u64| {
        (full as u128 + windows_ahead as u128 + 1) * p.window as u128 - now as u128
    };
    if d == 0 {
        (cur, count, end_of(0))
    } else if d >= INDEX_MASK + 1 - AHEAD && count > 0 {
        // Time went backwards a little: stay in the stored (later) window. (An empty record
        // has nothing to keep: it is fresh whatever its index, e.g. state 0 at any time.)
        (idx, count, end_of(INDEX_MASK + 1 - d))
    } else {
        // Behind, or far ahead: expired.
        (cur, 0, end_of(0))
    }
}

/// A time in ns, clamped to `u64::MAX` ("not within the clock").
#[inline]
fn clamp(t: u128) -> u64 {
    t.min(u64::MAX as u128) as u64
}

/// The transition: `(new_state, decision)` for a request of `cost` at `now`. Cost 0 peeks.
// Always inlined, in other crates too: a call returns the 56-byte `Decision` through memory,
// and the caller's wide reload of it stalls on store forwarding (a server's `CL.THROTTLE`,
// where the compiler chose the call: docs/service.md).
#[inline(always)]
pub fn decide(s: u64, now: u64, p: &Params, cost: u64) -> (u64, Decision) {
    let (idx, count, ends_in) = current(s, now, p);
    let reset = |c: u64| if c == 0 { 0 } else { clamp(ends_in) };
    if cost == 0 {
        return (
            s,
            Decision::allow(p.limit, p.limit.saturating_sub(count), reset(count)),
        );
    }
    if count.saturating_add(cost) <= p.limit {
        let c = count + cost;
        return (
            pack(idx, c),
            Decision::allow(p.limit, p.limit - c, reset(c)),
        );
    }
    // The next window must start within the clock for a retry to be possible.
    let retry =
        (cost <= p.limit && now as u128 + ends_in <= u64::MAX as u128).then_some(ends_in as u64);
    if p.count_denied && retry.is_some() {
        let c = count.saturating_add(cost).min(COUNT_MASK);
        (
            pack(idx, c),
            Decision::deny(p.limit, p.limit.saturating_sub(c), reset(c), retry),
        )
    } else {
        // Not counted: the same state.
        (
            s,
            Decision::deny(p.limit, p.limit.saturating_sub(count), reset(count), retry),
        )
    }
}

/// Gives `n` back to the current window (nothing to give back once the window has passed).
#[inline]
pub fn refund(s: u64, now: u64, p: &Params, n: u64) -> u64 {
    let (idx, count, _) = current(s, now, p);
    pack(idx, count.saturating_sub(n))
}

/// Takes `n` more in the current window whatever the limit (a settled cost above the one
/// checked): the count may pass the limit, up to 2^24 − 1, and the window's next checks are
/// denied until it ends; what is over the limit is forgotten with the window.
#[inline]
pub fn charge(s: u64, now: u64, p: &Params, n: u64) -> u64 {
    let (idx, count, _) = current(s, now, p);
    pack(idx, count.saturating_add(n).min(COUNT_MASK))
}

/// Nanoseconds until the record is equivalent to a fresh one (0: it already is).
#[inline]
pub fn idle_in(s: u64, now: u64, p: &Params) -> u64 {
    let (_, count, ends_in) = current(s, now, p);
    if count == 0 {
        0
    } else {
        clamp(ends_in)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const S: u64 = 1_000_000_000;

    #[test]
    fn counts_per_window_and_resets() {
        let p = Params::new(3, 60 * S, false).unwrap();
        let mut s = 0;
        for i in 0..3 {
            let (n, d) = decide(s, 10 * S, &p, 1);
            assert!(d.allowed(), "request {i}");
            s = n;
        }
        let (_, d) = decide(s, 59 * S, &p, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after_ns, Some(S));
        let (_, d) = decide(s, 60 * S, &p, 1);
        assert!(d.allowed());
    }

    #[test]
    fn refuses_oversized_limit() {
        assert!(Params::new(MAX_LIMIT + 1, S, false).is_err());
        assert!(Params::new(MAX_LIMIT, S, false).is_ok());
        assert!(Params::new(0, S, false).is_err());
        assert!(Params::new(1, 0, false).is_err());
    }

    #[test]
    fn time_backwards_does_not_reopen_a_window() {
        let p = Params::new(1, S, false).unwrap();
        let (s, d) = decide(0, 5 * S, &p, 1);
        assert!(d.allowed());
        let (_, d) = decide(s, 4 * S, &p, 1);
        assert!(!d.allowed(), "an earlier now must not find a fresh window");
    }
}
