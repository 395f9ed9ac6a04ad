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
//! * The index is mod 2^23. A stored index ahead of now's by at most [`AHEAD`] = 2^11 windows
//!   means time went backwards: the stored window stays current, at elapsed 0 (the most
//!   conservative weighting), and retry and reset count from that window's start, not from
//!   `now`. Any other distance is a record that has expired ("far behind means expired"): a
//!   long absence never locks a client out. The index comes round after 2^23 windows (97 days
//!   of 1 s windows); a record idle within `AHEAD` windows short of a multiple of that, or up
//!   to one window past it, reads as recent and keeps its counts for at most `AHEAD` + 2
//!   windows more. A step back of more than `AHEAD` windows finds fresh counts (at most one
//!   limit more per such step). Counts of 0 are fresh at any index (state 0 included).
//! * Windows are at most [`MAX_WINDOW`] = 2^63 − 1 ns, so that the two windows a count is
//!   held for fit the clock. A request that cannot fit before the end of the clock is
//!   `NeverFits`, as is a cost above the limit: neither is counted, with or without
//!   `count_denied`. Times are computed in u128: nothing wraps at any `now`.

use crate::decision::{ConfigError, Decision};

/// Bits of each count field.
pub const COUNT_BITS: u32 = 20;
/// Bits of the window index.
pub const INDEX_BITS: u32 = 23;
/// The largest limit.
pub const MAX_LIMIT: u64 = (1 << COUNT_BITS) - 1;
const COUNT_MASK: u64 = MAX_LIMIT;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// Windows a stored index may be ahead of now's and be read as time going backwards; beyond,
/// the record has expired (module docs).
pub const AHEAD: u64 = 1 << (INDEX_BITS - 12);
/// The longest window: a count is held for two windows, which must fit the clock.
pub const MAX_WINDOW: u64 = u64::MAX / 2;

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
        super::limit_in(
            limit,
            MAX_LIMIT,
            || {
                format!("sliding_window holds 1..={MAX_LIMIT} requests per window (two {COUNT_BITS}-bit counters)")
            },
            "use token_bucket for larger rates",
        )?;
        if window == 0 || window > MAX_WINDOW {
            return Err(ConfigError::new(
                "window",
                format!("sliding_window takes windows of 1..={MAX_WINDOW} ns (two windows must fit the 2^64 ns clock), got {window}"),
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

/// The record as seen at `now`.
struct View {
    idx: u64,
    prev: u64,
    cur: u64,
    /// Elapsed in the window, for the weighting: 0 when time went backwards.
    e: u64,
    /// The window's start, ns (after `now` when time went backwards).
    start: u128,
}

#[inline]
fn view(s: u64, now: u64, p: &Params) -> View {
    let full = now / p.window;
    let cur_idx = full & INDEX_MASK;
    let (idx, prev, cur) = unpack(s);
    let d = cur_idx.wrapping_sub(idx) & INDEX_MASK;
    let start = full as u128 * p.window as u128;
    let e = now - full * p.window;
    let fresh = View {
        idx: cur_idx,
        prev: 0,
        cur: 0,
        e,
        start,
    };
    if d == 0 {
        View {
            idx,
            prev,
            cur,
            e,
            start,
        }
    } else if d == 1 {
        View {
            idx: cur_idx,
            prev: cur,
            cur: 0,
            e,
            start,
        }
    } else if d >= INDEX_MASK + 1 - AHEAD && (prev | cur) != 0 {
        // Time went backwards a little: the stored window, which starts after `now`. (Empty
        // counts are fresh whatever the index, e.g. state 0.)
        let start = (full as u128 + (INDEX_MASK + 1 - d) as u128) * p.window as u128;
        if start > u64::MAX as u128 {
            // No time of the clock lies in that window: not a window this record was in.
            return fresh;
        }
        View {
            idx,
            prev,
            cur,
            e: 0,
            start,
        }
    } else {
        // Behind, or far ahead: expired.
        fresh
    }
}

impl View {
    /// Nanoseconds from `now` until `prev` and `cur` have slid out (clamped to `u64::MAX`).
    fn reset(&self, p: &Params, now: u64, prev: u64, cur: u64) -> u64 {
        let w = p.window as u128;
        let at = if cur > 0 {
            self.start + 2 * w
        } else if prev > 0 {
            self.start + w
        } else {
            return 0;
        };
        (at - now as u128).min(u64::MAX as u128) as u64
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
// Always inlined, in other crates too: a call returns the 56-byte `Decision` through memory,
// and the caller's wide reload of it stalls on store forwarding (a server's `CL.THROTTLE`,
// where the compiler chose the call: docs/service.md).
#[inline(always)]
pub fn decide(s: u64, now: u64, p: &Params, cost: u64) -> (u64, Decision) {
    let w = p.window;
    let v = view(s, now, p);
    let (idx, prev, cur, e) = (v.idx, v.prev, v.cur, v.e);
    let est = weighted(prev, w, e) + cur;
    if cost == 0 {
        return (
            s,
            Decision::allow(
                p.limit,
                p.limit.saturating_sub(est),
                v.reset(p, now, prev, cur),
            ),
        );
    }
    if est.saturating_add(cost) <= p.limit {
        let cur2 = cur + cost;
        let d = Decision::allow(p.limit, p.limit - est - cost, v.reset(p, now, prev, cur2));
        return (pack(idx, prev, cur2), d);
    }
    // With `count_denied` a denial that can be retried is counted, and the retry waits for it.
    let counted = cur.saturating_add(cost).min(COUNT_MASK);
    let retry = |cur2: u64| -> Option<u64> {
        if cost > p.limit {
            return None;
        }
        // The first time (ns since the window's start) the request fits.
        let at = if cur2 + cost <= p.limit {
            // Later in this window, once enough of `prev` has slid out.
            first_elapsed_fitting(prev, w, p.limit - cur2 - cost).max(e + 1) as u128
        } else {
            // Next window: previous becomes `cur2`, current 0.
            w as u128 + first_elapsed_fitting(cur2, w, p.limit - cost) as u128
        };
        let at = v.start + at;
        // Past the end of the clock: it never fits.
        (at <= u64::MAX as u128).then(|| (at - now as u128) as u64)
    };
    if p.count_denied {
        if let Some(r) = retry(counted) {
            let est2 = weighted(prev, w, e) + counted;
            return (
                pack(idx, prev, counted),
                Decision::deny(
                    p.limit,
                    p.limit.saturating_sub(est2),
                    v.reset(p, now, prev, counted),
                    Some(r),
                ),
            );
        }
    }
    // Not counted (never fits, or not counting denials): the same state.
    (
        s,
        Decision::deny(
            p.limit,
            p.limit.saturating_sub(est),
            v.reset(p, now, prev, cur),
            retry(cur),
        ),
    )
}

/// Gives `n` back to the current window's count.
#[inline]
pub fn refund(s: u64, now: u64, p: &Params, n: u64) -> u64 {
    let v = view(s, now, p);
    pack(v.idx, v.prev, v.cur.saturating_sub(n))
}

/// Takes `n` more in the current window whatever the limit (a settled cost above the one
/// checked): the current count may pass the limit, up to 2^20 − 1, and weighs on the next
/// window as any count does.
#[inline]
pub fn charge(s: u64, now: u64, p: &Params, n: u64) -> u64 {
    let v = view(s, now, p);
    pack(v.idx, v.prev, v.cur.saturating_add(n).min(COUNT_MASK))
}

/// Nanoseconds until equivalent to a fresh record.
#[inline]
pub fn idle_in(s: u64, now: u64, p: &Params) -> u64 {
    let v = view(s, now, p);
    v.reset(p, now, v.prev, v.cur)
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
