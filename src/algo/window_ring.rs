//! `window_ring`: the notes' "sliding window with counters". W is split into N sub-windows
//! (default 60: "500 per hour" counted per minute); a ring of N small counters; the window's
//! count is the sum of the last N. A request of cost n is admitted iff sum + n ≤ limit.
//!
//! Approximate only at the granularity of one sub-window: requests in the oldest sub-window
//! are all dropped at once when it slides out (at most W/N too early). With N = 60 and
//! W = 1 h, that is 1 minute.
//!
//! # Record layout (`1 + ⌈N / ⌊64/w⌋⌉` words of 64 bits)
//!
//! ```text
//! word 0:  | sub-window index mod 2^38 (38) | running total (26) |
//! word 1+: | counter | counter | ... |   each w = bit length of the limit (≤ 16) bits,
//!                                         ⌊64 / w⌋ to a word, never straddling words
//! ```
//!
//! 500/h in 60 buckets: w = 9, 7 counters a word, 9 words + header = 80 bytes (the notes
//! estimate 1.6 KB). The running total makes a check O(1) (plus the sub-windows that slid out
//! since the last check). Limits ≤ [`MAX_LIMIT`] = 65 535, N ≤ [`MAX_BUCKETS`] = 1024, and the
//! window must split into N whole nanoseconds. A stored index ahead of `now`'s by less than
//! 2^37 (time went backwards) keeps the stored sub-window current: conservative. A ring idle
//! for 2^37 sub-windows or more can look the same and then keeps its counts until the index
//! comes round again: spurious denials, never over-admission. An empty ring (total 0) is
//! fresh at any index.

use super::Cells;
use crate::decision::{ConfigError, Decision};

/// Largest limit (16-bit counters).
pub const MAX_LIMIT: u64 = u16::MAX as u64;
/// Largest number of sub-windows.
pub const MAX_BUCKETS: u64 = 1024;
/// Bits of the sub-window index in the header.
pub const INDEX_BITS: u32 = 38;
/// Bits of the running total.
pub const TOTAL_BITS: u32 = 26;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const TOTAL_MASK: u64 = (1 << TOTAL_BITS) - 1;
const BEHIND: u64 = 1 << (INDEX_BITS - 1);

/// Parameters, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Admissions per window.
    pub limit: u64,
    /// Window, ns.
    pub window: u64,
    /// Sub-windows N.
    pub buckets: u64,
    /// W / N, ns.
    pub sub: u64,
    /// Bits per counter.
    pub width: u32,
    /// Counters per word.
    pub per_word: u64,
    /// Whether denied requests count.
    pub count_denied: bool,
}

impl Params {
    /// `limit` per `window` ns counted in `buckets` sub-windows.
    pub fn new(
        limit: u64,
        window: u64,
        buckets: u64,
        count_denied: bool,
    ) -> Result<Self, ConfigError> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ConfigError::new("limit", format!("window_ring holds 1..={MAX_LIMIT} requests per window (16-bit sub-window counters), got {limit}; use sliding_window or token_bucket for larger limits")));
        }
        if buckets == 0 || buckets > MAX_BUCKETS {
            return Err(ConfigError::new(
                "buckets",
                format!("window_ring takes 1..={MAX_BUCKETS} sub-windows, got {buckets}"),
            ));
        }
        if window == 0 || window % buckets != 0 {
            return Err(ConfigError::new("window", format!("a window of {window} ns does not split into {buckets} sub-windows of whole nanoseconds; pick a window that is a multiple of the bucket count")));
        }
        let width = 64 - limit.leading_zeros();
        Ok(Self {
            limit,
            window,
            buckets,
            sub: window / buckets,
            width,
            per_word: 64 / width as u64,
            count_denied,
        })
    }

    /// Words in a record.
    pub fn words(&self) -> usize {
        1 + self.buckets.div_ceil(self.per_word) as usize
    }

    fn max_count(&self) -> u64 {
        (1 << self.width) - 1
    }
}

#[inline]
fn get_counter<C: Cells + ?Sized>(c: &C, p: &Params, pos: u64) -> u64 {
    let w = 1 + (pos / p.per_word) as usize;
    let sh = (pos % p.per_word) as u32 * p.width;
    (c.get(w) >> sh) & p.max_count()
}

#[inline]
fn set_counter<C: Cells + ?Sized>(c: &mut C, p: &Params, pos: u64, v: u64) {
    let w = 1 + (pos / p.per_word) as usize;
    let sh = (pos % p.per_word) as u32 * p.width;
    let m = p.max_count() << sh;
    let old = c.get(w);
    c.set(w, (old & !m) | ((v << sh) & m));
}

/// How the record looks at `now` without touching it.
struct View {
    /// Full index of the current sub-window.
    cur: u64,
    /// Sub-windows that slid out since the stored one (0 if none or time went backwards).
    slid: u64,
    /// The live total.
    total: u64,
}

fn view<C: Cells + ?Sized>(c: &C, now: u64, p: &Params) -> View {
    let h = c.get(0);
    let (idx, total) = (h >> TOTAL_BITS, h & TOTAL_MASK);
    let b = now / p.sub;
    let d = (b & INDEX_MASK).wrapping_sub(idx) & INDEX_MASK;
    // An empty ring is fresh whatever its stored index (e.g. state 0 at any time); its
    // counters are all 0, so nothing needs sliding when the index is behind.
    if d == 0 || total == 0 {
        return View {
            cur: b,
            // (No sliding when the stored index is ahead, or would lie before time 0.)
            slid: if d < BEHIND && d <= b {
                d.min(p.buckets)
            } else {
                0
            },
            total,
        };
    }
    if d >= BEHIND {
        return View {
            cur: b + ((1 << INDEX_BITS) - d),
            slid: 0,
            total,
        };
    }
    if d > b {
        // The stored sub-window would lie before time 0: it came from a clock far ahead
        // (wrapped index). Keep the counts as they are: conservative, and nothing underflows.
        return View {
            cur: b,
            slid: 0,
            total,
        };
    }
    let slid = d.min(p.buckets);
    let old = b - d;
    let mut t = total;
    for k in 1..=slid {
        t -= get_counter(c, p, (old + k) % p.buckets).min(t);
    }
    View {
        cur: b,
        slid,
        total: t,
    }
}

/// Full index of the newest sub-window with a non-zero count, if any (after sliding).
fn newest_nonzero<C: Cells + ?Sized>(c: &C, p: &Params, v: &View) -> Option<u64> {
    if v.total == 0 {
        return None;
    }
    (0..p.buckets - v.slid.min(p.buckets))
        // Near time 0 the window reaches before sub-window 0: stop there.
        .map_while(|k| v.cur.saturating_sub(v.slid).checked_sub(k))
        .find(|&j| get_counter(c, p, j % p.buckets) > 0)
}

fn slide<C: Cells + ?Sized>(c: &mut C, p: &Params, v: &View) {
    let old = v.cur.saturating_sub(v.slid);
    for k in 1..=v.slid {
        set_counter(c, p, (old + k) % p.buckets, 0);
    }
    c.set(0, ((v.cur & INDEX_MASK) << TOTAL_BITS) | v.total);
}

/// The transition, in place. Cost 0 peeks and changes nothing; `apply = false` evaluates
/// without recording (the first phase of an all-or-nothing multi-limit check).
pub fn decide<C: Cells + ?Sized>(
    c: &mut C,
    now: u64,
    p: &Params,
    cost: u64,
    apply: bool,
) -> Decision {
    let v = view(c, now, p);
    let reset = |total: u64, newest: Option<u64>| match newest {
        Some(j) if total > 0 => (j + p.buckets).saturating_mul(p.sub).saturating_sub(now),
        _ => 0,
    };
    let newest = newest_nonzero(c, p, &v);
    if cost == 0 {
        return Decision::allow(
            p.limit,
            p.limit.saturating_sub(v.total),
            reset(v.total, newest),
        );
    }
    // Saturating: a huge cost must be refused, not wrap around into an admission.
    let fits = v.total.saturating_add(cost) <= p.limit;
    if fits || (p.count_denied && cost <= p.limit) {
        let ends = (v.cur + p.buckets)
            .saturating_mul(p.sub)
            .saturating_sub(now);
        let mut d = if fits {
            Decision::allow(p.limit, p.limit - v.total - cost, ends)
        } else {
            denied(c, now, p, &v, cost, reset(v.total, newest))
        };
        if apply {
            slide(c, p, &v);
            let pos = v.cur % p.buckets;
            let cnt = get_counter(c, p, pos);
            let add = cost.min(p.max_count() - cnt);
            set_counter(c, p, pos, cnt + add);
            let total = (v.total + add).min(TOTAL_MASK);
            c.set(0, ((v.cur & INDEX_MASK) << TOTAL_BITS) | total);
            if !fits {
                d.remaining = p.limit.saturating_sub(total);
                // The denial is counted too: the retry waits for the ring as it is now.
                d.retry_after_ns = denied(c, now, p, &view(c, now, p), cost, 0).retry_after_ns;
            }
        }
        return d;
    }
    denied(c, now, p, &v, cost, reset(v.total, newest))
}

fn denied<C: Cells + ?Sized>(
    c: &C,
    now: u64,
    p: &Params,
    v: &View,
    cost: u64,
    reset: u64,
) -> Decision {
    let retry = if cost > p.limit {
        None
    } else {
        // Oldest first: the sub-window whose expiry frees enough.
        let mut freed = 0;
        let mut at = None;
        for k in (0..p.buckets).rev() {
            let j = match v.cur.checked_sub(k) {
                Some(j) => j,
                None => continue,
            };
            // Sub-windows entered since the stored one still hold expired counts: they are 0.
            if j + v.slid <= v.cur {
                freed += get_counter(c, p, j % p.buckets);
            }
            if v.total - freed.min(v.total) + cost <= p.limit {
                at = Some(
                    (j + p.buckets)
                        .saturating_mul(p.sub)
                        .saturating_sub(now)
                        .max(1),
                );
                break;
            }
        }
        Some(at.unwrap_or_else(|| {
            (v.cur + p.buckets)
                .saturating_mul(p.sub)
                .saturating_sub(now)
                .max(1)
        }))
    };
    Decision::deny(p.limit, p.limit.saturating_sub(v.total), reset, retry)
}

/// Gives `n` back, newest sub-windows first.
pub fn refund<C: Cells + ?Sized>(c: &mut C, now: u64, p: &Params, n: u64) {
    let v = view(c, now, p);
    slide(c, p, &v);
    let mut left = n;
    let mut total = v.total;
    for k in 0..p.buckets {
        if left == 0 {
            break;
        }
        let Some(j) = v.cur.checked_sub(k) else { break };
        let pos = j % p.buckets;
        let cnt = get_counter(c, p, pos);
        let take = cnt.min(left);
        set_counter(c, p, pos, cnt - take);
        left -= take;
        total -= take.min(total);
    }
    c.set(0, ((v.cur & INDEX_MASK) << TOTAL_BITS) | total);
}

/// Nanoseconds until the record is equivalent to a fresh one.
pub fn idle_in<C: Cells + ?Sized>(c: &C, now: u64, p: &Params) -> u64 {
    let v = view(c, now, p);
    match newest_nonzero(c, p, &v) {
        Some(j) => (j + p.buckets).saturating_mul(p.sub).saturating_sub(now),
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIN: u64 = 60_000_000_000;

    #[test]
    fn five_hundred_per_hour_in_minutes() {
        let p = Params::new(500, 60 * MIN, 60, false).unwrap();
        assert_eq!(p.words(), 10);
        let mut rec = vec![0u64; p.words()];
        // 10 per minute for 50 minutes = 500, then denied until minute 0's count slides out.
        for m in 0..50 {
            for _ in 0..10 {
                assert!(decide(&mut rec[..], m * MIN + 1, &p, 1, true).allowed());
            }
        }
        let d = decide(&mut rec[..], 55 * MIN, &p, 1, true);
        assert!(!d.allowed());
        assert_eq!(d.retry_after_ns, Some(5 * MIN));
        assert!(decide(&mut rec[..], 60 * MIN, &p, 10, true).allowed());
        assert!(!decide(&mut rec[..], 60 * MIN, &p, 1, true).allowed());
    }

    #[test]
    fn refuses_bad_params() {
        assert!(Params::new(70_000, 60, 60, false).is_err());
        assert!(Params::new(5, 61, 60, false).is_err());
        assert!(Params::new(5, 60, 0, false).is_err());
    }
}
