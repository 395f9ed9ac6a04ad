//! `sliding_window`: the two-window weighted counter (Cloudflare 2017; note 002).
//!
//! estimate = ⌊previous × (W − elapsed) / W⌋ + current. A request of cost n is admitted iff
//! estimate + n ≤ limit. The floor is the notes' rounding: 3 + 5 × 0.7 = 6.5 counts as 6, so
//! with a limit of 7 that request goes through; Cloudflare's 42 × 45/60 + 18 = 49.5 → 49 < 50.
//! Approximate: it assumes the previous window's requests were spread evenly.
//!
//! # Packed state (63 bits; bit 63 belongs to the keyed store)
//!
//! ```text
//!  62            40 39            20 19             0
//! +----------------+----------------+----------------+
//! | index mod 2^23 | previous (20)  | current (20)   |
//! +----------------+----------------+----------------+
//! ```
//!
//! * Counts ≤ [`MAX_LIMIT`] = 2^20 − 1 (larger limits are refused; with `count_denied` the
//!   counters saturate there).
//! * The index is mod 2^23. A stored index ahead of `now`'s by less than 2^22 (time went
//!   backwards) is treated as the current window at elapsed 0, the most conservative
//!   weighting. A record idle for 2^22 windows or more (70 minutes of 1 ms windows, 48 days of
//!   1 s ones) can look the same and then keeps its counts until `now`'s index comes round
//!   again, at most 2^22 windows later (an exact multiple of 2^23 aliases outright): spurious
//!   denials, never over-admission. Counts of 0 are fresh at any index (state 0 included).

use crate::decision::{ConfigError, Decision};

/// Bits of each count field.
pub const COUNT_BITS: u32 = 20;
/// Bits of the window index.
pub const INDEX_BITS: u32 = 23;
/// The largest limit.
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
    /// Whether denied requests count.
    pub count_denied: bool,
}

impl Params {
    /// Validates `limit` per `window` ns.
    pub fn new(limit: u64, window: u64, count_denied: bool) -> Result<Self, ConfigError> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ConfigError::new(
                "limit",
                format!("sliding_window holds 1..={MAX_LIMIT} requests per window (two {COUNT_BITS}-bit counters), got {limit}; use token_bucket for larger rates"),
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
fn unpack(s: u64) -> (u64, u64, u64) {
    (
        (s >> (2 * COUNT_BITS)) & INDEX_MASK,
        (s >> COUNT_BITS) & COUNT_MASK,
        s & COUNT_MASK,
    )
}
#[inline]
fn pack(idx: u64, prev: u64, cur: u64) -> u64 {
    ((idx & INDEX_MASK) << (2 * COUNT_BITS))
        | ((prev & COUNT_MASK) << COUNT_BITS)
        | (cur & COUNT_MASK)
}

/// (index, previous, current, elapsed in the window) as seen at `now`.
#[inline]
fn view(s: u64, now: u64, p: &Params) -> (u64, u64, u64, u64) {
    let full = now / p.window;
    let cur_idx = full & INDEX_MASK;
    let (idx, prev, cur) = unpack(s);
    let d = cur_idx.wrapping_sub(idx) & INDEX_MASK;
    let elapsed = now - full * p.window;
    if d == 0 {
        (idx, prev, cur, elapsed)
    } else if d == 1 {
        (cur_idx, cur, 0, elapsed)
    } else if d >= BEHIND && (prev | cur) != 0 {
        // Time went backwards. (Empty counts are fresh whatever the index, e.g. state 0.)
        (idx, prev, cur, 0)
    } else {
        (cur_idx, 0, 0, elapsed)
    }
}

/// ⌊prev × (W − e) / W⌋.
#[inline]
fn weighted(prev: u64, w: u64, e: u64) -> u64 {
    ((prev as u128 * (w - e) as u128) / w as u128) as u64
}

/// Smallest x in [0, W) with ⌊prev × (W − x) / W⌋ ≤ a, i.e. prev × (W − x) < (a + 1) × W.
#[inline]
fn first_elapsed_fitting(prev: u64, w: u64, a: u64) -> u64 {
    if prev == 0 {
        return 0;
    }
    let q = (a as u128 + 1) * w as u128;
    let c = q.div_ceil(prev as u128);
    (w as u128 + 1).saturating_sub(c) as u64
}

/// The transition. Cost 0 peeks.
#[inline]
pub fn decide(s: u64, now: u64, p: &Params, cost: u64) -> (u64, Decision) {
    let w = p.window;
    let (idx, prev, cur, e) = view(s, now, p);
    let est = weighted(prev, w, e) + cur;
    let reset_of = |prev: u64, cur: u64| {
        if cur > 0 {
            2 * w - e
        } else if prev > 0 {
            w - e
        } else {
            0
        }
    };
    if cost == 0 {
        return (
            s,
            Decision::allow(p.limit, p.limit.saturating_sub(est), reset_of(prev, cur)),
        );
    }
    if est.saturating_add(cost) <= p.limit {
        let cur2 = cur + cost;
        let d = Decision::allow(p.limit, p.limit - est - cost, reset_of(prev, cur2));
        return (pack(idx, prev, cur2), d);
    }
    let cur2 = if p.count_denied {
        cur.saturating_add(cost).min(COUNT_MASK)
    } else {
        cur
    };
    let retry = if cost > p.limit {
        None
    } else if cur2 + cost <= p.limit {
        // Fits later in this window, once enough of `prev` has slid out. (`cur2`: a counted
        // denial is part of what the retry must wait out.)
        let x = first_elapsed_fitting(prev, w, p.limit - cur2 - cost);
        Some(x.saturating_sub(e).max(1))
    } else {
        // Next window: previous becomes `cur2`, current 0.
        let x = first_elapsed_fitting(cur2, w, p.limit - cost);
        Some(w - e + x)
    };
    let new = if p.count_denied {
        pack(idx, prev, cur2)
    } else {
        s
    };
    let est2 = weighted(prev, w, e) + cur2;
    (
        new,
        Decision::deny(
            p.limit,
            p.limit.saturating_sub(est2),
            reset_of(prev, cur2),
            retry,
        ),
    )
}

/// Gives `n` back to the current window's count.
#[inline]
pub fn refund(s: u64, now: u64, p: &Params, n: u64) -> u64 {
    let (idx, prev, cur, _) = view(s, now, p);
    pack(idx, prev, cur.saturating_sub(n))
}

/// Nanoseconds until equivalent to a fresh record.
#[inline]
pub fn idle_in(s: u64, now: u64, p: &Params) -> u64 {
    let (_, prev, cur, e) = view(s, now, p);
    if cur > 0 {
        2 * p.window - e
    } else if prev > 0 {
        p.window - e
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const S: u64 = 1_000_000_000;

    #[test]
    fn notes_three_plus_five_times_point_seven() {
        // limit 7/min; 5 in the previous minute, 3 in the current; a request at 30 % of it.
        let p = Params::new(7, 60 * S, false).unwrap();
        let s = pack(1, 5, 3);
        let (_, d) = decide(s, 60 * S + 18 * S, &p, 1);
        assert!(d.allowed(), "3 + 5 x 0.7 = 6.5 -> 6 < 7");
    }

    #[test]
    fn cloudflare_example() {
        let p = Params::new(50, 60 * S, false).unwrap();
        let s = pack(1, 42, 18);
        let (_, d) = decide(s, 60 * S + 15 * S, &p, 1);
        assert!(d.allowed(), "42 x 45/60 + 18 = 49.5 -> 49 < 50");
        let s = pack(1, 42, 19);
        let (_, d) = decide(s, 60 * S + 15 * S, &p, 1);
        assert!(!d.allowed());
    }

    #[test]
    fn retry_after_is_exact() {
        let p = Params::new(10, 1000, false).unwrap();
        let s = pack(1, 10, 0);
        let (_, d) = decide(s, 1000, &p, 1);
        assert!(!d.allowed());
        let r = d.retry_after_ns.unwrap();
        assert!(!decide(s, 1000 + r - 1, &p, 1).1.allowed());
        assert!(decide(s, 1000 + r, &p, 1).1.allowed());
    }
}
