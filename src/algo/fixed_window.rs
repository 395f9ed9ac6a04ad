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
//! * The index is kept mod 2^39 (17 years of 1 ms windows). An index "behind" the stored one
//!   by less than 2^38 means the caller's time went backwards: the stored window is used, so
//!   an earlier `now` never finds a fresh window. A record idle for 2^38 windows or more
//!   (8.7 years of 1 ms windows) can look the same and then keeps its count until the index
//!   comes round again (at most 2^38 windows more; an idle time of an exact multiple of 2^39
//!   windows aliases outright): spurious denials, never an over-admission.
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
const BEHIND: u64 = 1 << (INDEX_BITS - 1);

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
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ConfigError::new(
                "limit",
                format!("fixed_window holds 1..={MAX_LIMIT} requests per window (a {COUNT_BITS}-bit counter), got {limit}; use token_bucket for larger rates"),
            ));
        }
        if window == 0 {
            return Err(ConfigError::new(
                "window",
                "the window must be at least 1 ns",
            ));
        }
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

/// The window the record is in at `now`: (index mod 2^39, count, ns until that window ends).
#[inline]
fn current(s: u64, now: u64, p: &Params) -> (u64, u64, u64) {
    let full = now / p.window;
    let cur = full & INDEX_MASK;
    let (idx, count) = unpack(s);
    let d = cur.wrapping_sub(idx) & INDEX_MASK;
    let end_of = |windows_ahead: u64| {
        full.saturating_add(windows_ahead)
            .saturating_add(1)
            .saturating_mul(p.window)
            .saturating_sub(now)
    };
    if d == 0 {
        (cur, count, end_of(0))
    } else if d >= BEHIND && count > 0 {
        // Time went backwards: stay in the stored (later) window. (An empty record has
        // nothing to keep: it is fresh whatever its index, e.g. state 0 at any time.)
        (idx, count, end_of((1 << INDEX_BITS) - d))
    } else {
        (cur, 0, end_of(0))
    }
}

/// The transition: `(new_state, decision)` for a request of `cost` at `now`. Cost 0 peeks.
#[inline]
pub fn decide(s: u64, now: u64, p: &Params, cost: u64) -> (u64, Decision) {
    let (idx, count, ends_in) = current(s, now, p);
    let reset = |c: u64| if c == 0 { 0 } else { ends_in };
    if cost == 0 {
        return (
            s,
            Decision::allow(p.limit, p.limit.saturating_sub(count), reset(count)),
        );
    }
    if count.saturating_add(cost) <= p.limit {
        let c = count + cost;
        return (pack(idx, c), Decision::allow(p.limit, p.limit - c, ends_in));
    }
    let retry = if cost > p.limit { None } else { Some(ends_in) };
    let ns = if p.count_denied {
        pack(idx, count.saturating_add(cost).min(COUNT_MASK))
    } else {
        s
    };
    let c = if p.count_denied {
        count.saturating_add(cost).min(COUNT_MASK)
    } else {
        count
    };
    (
        ns,
        Decision::deny(p.limit, p.limit.saturating_sub(c), reset(c), retry),
    )
}

/// Gives `n` back to the current window (nothing to give back once the window has passed).
#[inline]
pub fn refund(s: u64, now: u64, p: &Params, n: u64) -> u64 {
    let (idx, count, _) = current(s, now, p);
    pack(idx, count.saturating_sub(n))
}

/// Nanoseconds until the record is equivalent to a fresh one (0: it already is).
#[inline]
pub fn idle_in(s: u64, now: u64, p: &Params) -> u64 {
    let (_, count, ends_in) = current(s, now, p);
    if count == 0 {
        0
    } else {
        ends_in
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
