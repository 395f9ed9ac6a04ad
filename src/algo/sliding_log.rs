//! `sliding_log`: exact. The times of the last L admissions in a ring sized by the limit L.
//!
//! A request of cost n at `now` is admitted iff fewer than L − n + 1 admissions fall in
//! (now − W, now]. The ring holds admissions in time order, so that is one look: the n-th
//! oldest of the ring (the one the n-th new entry would overwrite) must have expired. O(1) per
//! check; `remaining` is a binary search.
//!
//! # Record layout (`2 + ⌈L / 2⌉` words)
//!
//! ```text
//! word 0:  base tick (u64)
//! word 1:  | count of entries (32) | head: next write position (32) |
//! word 2+: | entry | entry |   u32 each: 0 = empty, else tick − base + 1
//! ```
//!
//! Times are in ticks of `tick` ns, the smallest tick with W ≤ 2^30 ticks (1 ns for windows up
//! to 1.07 s; 80 µs for a day). An admission is recorded at ⌈now / tick⌉ — never earlier than
//! it happened — so expiry is never early: with tick > 1 the log is exact at tick resolution
//! and errs only towards denial. Entries are u32 offsets from `base`; when an offset would
//! pass 2^32 − 2 the record is rebased (O(L), at most once per 2^31 ticks ≥ 2 W), clamping
//! entries older than the new base, which are all expired.
//!
//! 500/h: 2 + 250 words = 2016 bytes (the notes estimate 12 KB).
//!
//! Time going backwards: expiry is judged at the caller's `now` (fewer expired), admissions
//! are recorded no earlier than the newest entry (the ring stays ordered): conservative.

use super::Cells;
use crate::decision::{ConfigError, Decision};

/// The largest limit (ring length).
pub const MAX_LIMIT: u64 = 1 << 20;
const TICK_SPAN: u64 = 1 << 30;

/// Parameters, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// L: admissions per window.
    pub limit: u64,
    /// W, ns.
    pub window: u64,
    /// Tick, ns.
    pub tick: u64,
    /// Whether denied requests are logged too.
    pub count_denied: bool,
}

impl Params {
    /// `limit` per `window` ns.
    pub fn new(limit: u64, window: u64, count_denied: bool) -> Result<Self, ConfigError> {
        super::limit_in(
            limit,
            MAX_LIMIT,
            || format!("sliding_log keeps 1..={MAX_LIMIT} timestamps (4 bytes each)"),
            "use window_ring or sliding_window for large limits",
        )?;
        super::window_at_least_1ns(window)?;
        Ok(Self {
            limit,
            window,
            tick: window.div_ceil(TICK_SPAN).max(1),
            count_denied,
        })
    }

    /// Words in a record.
    pub fn words(&self) -> usize {
        2 + self.limit.div_ceil(2) as usize
    }
}

#[inline]
fn entry<C: Cells + ?Sized>(c: &C, i: u64) -> u64 {
    (c.get(2 + (i / 2) as usize) >> (32 * (i % 2))) & 0xffff_ffff
}

#[inline]
fn set_entry<C: Cells + ?Sized>(c: &mut C, i: u64, v: u64) {
    let w = 2 + (i / 2) as usize;
    let sh = 32 * (i % 2);
    let old = c.get(w);
    c.set(w, (old & !(0xffff_ffff << sh)) | (v << sh));
}

struct View {
    base: u64,
    head: u64,
    count: u64,
}

#[inline]
fn view<C: Cells + ?Sized>(c: &C) -> View {
    let h = c.get(1);
    View {
        base: c.get(0),
        head: h & 0xffff_ffff,
        count: h >> 32,
    }
}

impl View {
    /// Position of the k-th oldest entry (0-based).
    #[inline]
    fn pos(&self, p: &Params, k: u64) -> u64 {
        (self.head + p.limit - self.count + k) % p.limit
    }
    /// Expiry time (ns, u128: it may lie past the end of the clock) of the entry at `i`.
    #[inline]
    fn expiry<C: Cells + ?Sized>(&self, c: &C, p: &Params, i: u64) -> u128 {
        let tick = self.base as u128 + (entry(c, i) - 1) as u128;
        tick * p.tick as u128 + p.window as u128
    }
    /// Unexpired entries at `now` (binary search over the ordered ring).
    fn live<C: Cells + ?Sized>(&self, c: &C, p: &Params, now: u64) -> u64 {
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.expiry(c, p, self.pos(p, mid)) <= now as u128 {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        self.count - lo
    }
    fn newest_expiry<C: Cells + ?Sized>(&self, c: &C, p: &Params, now: u64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        until(self.expiry(c, p, self.pos(p, self.count - 1)), now)
    }
}

/// Nanoseconds from `now` to `t` (0 if past), clamped to `u64::MAX`.
#[inline]
fn until(t: u128, now: u64) -> u64 {
    t.saturating_sub(now as u128).min(u64::MAX as u128) as u64
}

/// A retry at `t`, if `t` is a time of the clock (else the request never fits).
#[inline]
fn retry_at(t: u128, now: u64) -> Option<u64> {
    (t <= u64::MAX as u128).then(|| until(t, now))
}

/// The transition, in place. Cost 0 peeks; `apply = false` evaluates without recording.
pub fn decide<C: Cells + ?Sized>(
    c: &mut C,
    now: u64,
    p: &Params,
    cost: u64,
    apply: bool,
) -> Decision {
    let v = view(c);
    let live = v.live(c, p, now);
    if cost == 0 {
        return Decision::allow(p.limit, p.limit - live, v.newest_expiry(c, p, now));
    }
    if cost > p.limit {
        return Decision::deny(p.limit, p.limit - live, v.newest_expiry(c, p, now), None);
    }
    // The k-th oldest entry would be overwritten by the last of the `cost` new ones.
    let k = (v.count + cost).saturating_sub(p.limit);
    let blocker = if k == 0 {
        None
    } else {
        Some(v.expiry(c, p, v.pos(p, k - 1)))
    };
    let fits = blocker.is_none_or(|e| e <= now as u128);
    let retry = blocker.and_then(|e| retry_at(e, now));
    if fits {
        let mut d = Decision::allow(p.limit, p.limit - (live + cost).min(p.limit), p.window);
        if apply {
            record(c, p, &v, now, cost);
            d.reset_after_ns = view(c).newest_expiry(c, p, now);
        } else {
            // What recording would report: the new entries' expiry, at the tick `record`
            // logs them at.
            let t = now.div_ceil(p.tick).max(newest_tick(c, p, &v)) as u128;
            d.reset_after_ns = until(t * p.tick as u128 + p.window as u128, now);
        }
        return d;
    }
    // A denial is logged (count_denied) only if it can be retried within the clock once
    // logged: every entry then expires by the logged tick's expiry.
    let logged_tick = now.div_ceil(p.tick).max(newest_tick(c, p, &v)) as u128;
    let countable =
        retry.is_some() && logged_tick * p.tick as u128 + p.window as u128 <= u64::MAX as u128;
    if p.count_denied && countable && apply {
        record(c, p, &v, now, cost);
        let v2 = view(c);
        // The denial is logged too: the retry waits for the log as it is now.
        let k2 = v2.count + cost - p.limit;
        return Decision::deny(
            p.limit,
            p.limit - v2.live(c, p, now),
            v2.newest_expiry(c, p, now),
            retry_at(v2.expiry(c, p, v2.pos(p, k2 - 1)), now),
        );
    }
    Decision::deny(p.limit, p.limit - live, v.newest_expiry(c, p, now), retry)
}

/// The tick of the newest entry (0 if none).
fn newest_tick<C: Cells + ?Sized>(c: &C, p: &Params, v: &View) -> u64 {
    if v.count == 0 {
        0
    } else {
        v.base + (entry(c, v.pos(p, v.count - 1)) - 1)
    }
}

fn record<C: Cells + ?Sized>(c: &mut C, p: &Params, v: &View, now: u64, cost: u64) {
    let mut base = v.base;
    let newest = newest_tick(c, p, v);
    let t = now.div_ceil(p.tick).max(newest);
    if v.count == 0 {
        base = t;
        c.set(0, base);
    } else if t - base >= u32::MAX as u64 - 1 {
        let nb = t - (1 << 31);
        for k in 0..v.count {
            let i = v.pos(p, k);
            let abs = base + (entry(c, i) - 1);
            set_entry(c, i, abs.saturating_sub(nb) + 1);
        }
        base = nb;
        c.set(0, base);
    }
    let off = t - base + 1;
    for k in 0..cost {
        set_entry(c, (v.head + k) % p.limit, off);
    }
    let head = (v.head + cost) % p.limit;
    let count = (v.count + cost).min(p.limit);
    c.set(1, (count << 32) | head);
}

/// Gives back the `n` newest admissions. (With `count_denied` the ring holds the newest L
/// requests, denied ones included: the newest may be denials, and what they displaced from the
/// ring does not come back.)
pub fn refund<C: Cells + ?Sized>(c: &mut C, p: &Params, n: u64) {
    let v = view(c);
    let n = n.min(v.count);
    let mut head = v.head;
    for _ in 0..n {
        head = (head + p.limit - 1) % p.limit;
        set_entry(c, head, 0);
    }
    c.set(1, ((v.count - n) << 32) | head);
}

/// Logs `n` more admissions at `now` whatever the log holds (a settled cost above the one
/// checked). The log holds the newest `limit` entries: a charge past the limit fills it with
/// entries of `now` (the key is then denied for a whole window), and what it displaces does
/// not come back on a refund.
pub fn charge<C: Cells + ?Sized>(c: &mut C, now: u64, p: &Params, n: u64) {
    if n == 0 {
        return;
    }
    let v = view(c);
    record(c, p, &v, now, n.min(p.limit));
}

/// Nanoseconds until the record is equivalent to a fresh one.
pub fn idle_in<C: Cells + ?Sized>(c: &C, now: u64, p: &Params) -> u64 {
    view(c).newest_expiry(c, p, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    const S: u64 = 1_000_000_000;

    #[test]
    fn exact_at_the_window_edge() {
        let p = Params::new(3, 60 * S, false).unwrap();
        let mut rec = vec![0u64; p.words()];
        for _ in 0..3 {
            assert!(decide(&mut rec[..], 59 * S, &p, 1, true).allowed());
        }
        for _ in 0..3 {
            let d = decide(&mut rec[..], 60 * S, &p, 1, true);
            assert!(!d.allowed());
            // Exact to the tick (56 ns for a 60 s window), never early.
            let r = d.retry_after_ns.unwrap();
            assert!((59 * S..59 * S + p.tick).contains(&r), "{r}");
        }
        assert!(decide(&mut rec[..], 119 * S + p.tick, &p, 3, true).allowed());
    }

    #[test]
    fn rebase_keeps_order() {
        let p = Params::new(2, 10, false).unwrap();
        let mut rec = vec![0u64; p.words()];
        let mut t = 0;
        for _ in 0..20 {
            assert!(decide(&mut rec[..], t, &p, 1, true).allowed());
            assert!(decide(&mut rec[..], t, &p, 1, true).allowed());
            assert!(!decide(&mut rec[..], t + 9, &p, 1, true).allowed());
            t += 1 << 29;
        }
    }
}
