//! `concurrency`: an in-flight limit (Stripe's concurrent-requests limiter).
//!
//! `acquire` takes `cost` lease cells and returns a permit stamp; `release` frees them. Every
//! lease carries an expiry (acquire time + lease TTL): a holder that dies, or a permit that is
//! leaked, gives its capacity back when the lease expires, not never.
//!
//! # Record layout (`L` words, L = the limit)
//!
//! ```text
//! word i:  lease expiry, ns (0 = free). All cells of one permit hold the same stamp, and
//!          stamps are unique within a record, so a stamp names its permit.
//! ```
//!
//! A permit's stamp is acquire + TTL (saturating), or, if a cell holds that value already,
//! the nearest free value above it (`free_stamp`): at most `limit` values are held, so one of
//! the `limit + 1` values from the target up is free, and a lease is never shorter than asked
//! and at most `limit` ns longer. Where that range would pass `u64::MAX` (a lease of
//! `Duration::MAX`, or one running past the clock's end) the last `limit + 1` values are used:
//! each permit still gets a stamp of its own, and one release frees only its own cells (a
//! saturated `now + TTL` shared by every permit let one release free them all). Only within
//! `limit + 1` ns of the clock's end (584 years) may no stamp be left: the
//! acquire is then refused as never fitting.
//!
//! 8 bytes per concurrent slot. Releasing an expired (and perhaps re-issued) lease is a no-op,
//! because its cells no longer hold its stamp. Time going backwards counts more leases as
//! live: conservative.

use super::Cells;
use crate::decision::{ConfigError, Decision};

/// The largest in-flight limit.
pub const MAX_LIMIT: u64 = 1 << 16;

/// Parameters, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Requests in flight at most.
    pub limit: u64,
    /// Lease TTL, ns.
    pub lease: u64,
}

impl Params {
    /// At most `limit` in flight, each lease expiring after `lease` ns.
    pub fn new(limit: u64, lease: u64) -> Result<Self, ConfigError> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ConfigError::new(
                "limit",
                format!("concurrency takes 1..={MAX_LIMIT} requests in flight, got {limit}"),
            ));
        }
        if lease == 0 {
            return Err(ConfigError::new(
                "window",
                "the lease TTL must be at least 1 ns; set it above your slowest request",
            ));
        }
        Ok(Self { limit, lease })
    }

    /// Words in a record.
    pub fn words(&self) -> usize {
        self.limit as usize
    }
}

/// Whether a cell stamped `v` holds a live lease at `now`. A stamp of `u64::MAX` (the last
/// time of the clock) never expires: at `now = u64::MAX` it is still held.
#[inline]
fn is_live(v: u64, now: u64) -> bool {
    v > now || v == u64::MAX
}

fn live<C: Cells + ?Sized>(c: &C, p: &Params, now: u64) -> (u64, u64) {
    let (mut n, mut latest) = (0, 0);
    for i in 0..p.limit as usize {
        let v = c.get(i);
        if is_live(v, now) {
            n += 1;
            // Never idle within the clock while a u64::MAX stamp is held.
            latest = latest.max(if v == u64::MAX { u64::MAX } else { v - now });
        }
    }
    (n, latest)
}

/// How many more permits can get a stamp of their own at `now` once `taken` more are issued
/// (one permit of any cost takes one stamp, so `remaining` is all the free cells or none):
/// unbounded except within `limit` ns of the clock's end, where only the values in
/// `now + 1..=u64::MAX` (`u64::MAX` itself at `now = u64::MAX`: such a lease never expires)
/// that no permit holds are left. `remaining` never promises more (a
/// denial of a cost within `remaining` would break the decision's contract).
fn stamps_left<C: Cells + ?Sized>(c: &C, p: &Params, now: u64, taken: u64) -> u64 {
    let span = (u64::MAX - now).max(1);
    if span > p.limit {
        // At least `span - active > limit - active` values are free: never the bound.
        return u64::MAX;
    }
    // Distinct stamps held after `now`; quadratic, but only in the last `limit` ns of the
    // clock.
    let n = p.limit as usize;
    let distinct = (0..n)
        .filter(|&i| {
            let v = c.get(i);
            is_live(v, now) && (0..i).all(|j| c.get(j) != v)
        })
        .count() as u64;
    span.saturating_sub(distinct + taken)
}

/// Cells holding a value in `lo..=hi`.
fn held<C: Cells + ?Sized>(c: &C, p: &Params, lo: u64, hi: u64) -> u64 {
    (0..p.limit as usize)
        .filter(|&i| (lo..=hi).contains(&c.get(i)))
        .count() as u64
}

/// The earliest expiry after `after` (`u64::MAX` if none) and how many cells hold it.
fn next_expiry<C: Cells + ?Sized>(c: &C, p: &Params, after: u64) -> (u64, u64) {
    let (mut next, mut same) = (u64::MAX, 0);
    for i in 0..p.limit as usize {
        let v = c.get(i);
        if v > after && v < next {
            (next, same) = (v, 1);
        } else if v == next {
            same += 1;
        }
    }
    (next, same)
}

/// The wait from `now` until a stamp is free at or after `after` (the time enough cells are),
/// trying each later expiry; `None` if only a lease stamped `u64::MAX` (never expiring) would
/// have to go.
fn stamp_free_from<C: Cells + ?Sized>(c: &C, p: &Params, now: u64, mut after: u64) -> Option<u64> {
    while after < u64::MAX && stamps_left(c, p, after, 0) == 0 {
        after = next_expiry(c, p, after).0;
    }
    // A lease stamped u64::MAX never frees within the clock: it never fits.
    (after < u64::MAX).then(|| after - now)
}

/// Distinct stamps held in `lo..=hi`.
fn stamps_in<C: Cells + ?Sized>(c: &C, p: &Params, lo: u64, hi: u64) -> u64 {
    (0..p.limit as usize)
        .filter(|&i| {
            let v = c.get(i);
            (lo..=hi).contains(&v) && (0..i).all(|j| c.get(j) != v)
        })
        .count() as u64
}

/// A stamp after `now` that no cell holds: `now + lease` if free, else the nearest free value
/// above it (module docs). `None` only within `limit + 1` ns of `u64::MAX`.
fn free_stamp<C: Cells + ?Sized>(c: &C, p: &Params, now: u64) -> Option<u64> {
    let target = now.saturating_add(p.lease);
    if held(c, p, target, target) == 0 {
        return Some(target);
    }
    // `limit + 1` candidates from the target up (a lease never shorter than asked), or, where
    // that would pass `u64::MAX`, the last `limit + 1` values; never at or before `now`.
    let mut hi = target.saturating_add(p.limit);
    let mut lo = (hi - p.limit).max(now.checked_add(1)?);
    // Invariant: fewer stamps are held in lo..=hi than there are values in it, so one is
    // free. Halve towards the lower half whenever that half keeps the invariant; otherwise
    // the upper half does (the counts add up). Counting cells (at least the stamps, since a
    // permit of cost k holds k cells) is enough over `limit + 1` values, and linear; a range
    // cut short by `now` near the clock's end needs the distinct stamps, whose count is
    // quadratic but only ever taken in the last `limit` ns of the clock.
    let clamped = hi - lo < p.limit;
    let count = |lo: u64, hi: u64| {
        if clamped {
            stamps_in(c, p, lo, hi)
        } else {
            held(c, p, lo, hi)
        }
    };
    if count(lo, hi) > hi - lo {
        return None;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if count(lo, mid) <= mid - lo {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

/// Takes `cost` leases if they fit; returns the decision and, when allowed with `apply`, the
/// permit's stamp. Cost 0 peeks.
pub fn acquire<C: Cells + ?Sized>(
    c: &mut C,
    now: u64,
    p: &Params,
    cost: u64,
    apply: bool,
) -> (Decision, Option<u64>) {
    let (active, latest) = live(c, p, now);
    let free = if stamps_left(c, p, now, 0) > 0 {
        p.limit - active
    } else {
        0
    };
    if cost == 0 {
        return (Decision::allow(p.limit, free, latest), None);
    }
    // Saturating: a huge cost must be refused, not wrap around into an admission.
    if active.saturating_add(cost) > p.limit {
        let retry = if cost > p.limit {
            None
        } else {
            // The (active + cost − limit)-th earliest expiry frees enough cells; in the last
            // `limit` ns of the clock a stamp must be free then too (`stamps_left`), else the
            // next expiry is tried.
            let mut need = active + cost - p.limit;
            let mut after = now;
            while need > 0 {
                let (next, same) = next_expiry(c, p, after);
                after = next;
                need = need.saturating_sub(same);
            }
            stamp_free_from(c, p, now, after)
        };
        return (Decision::deny(p.limit, free, latest, retry), None);
    }
    let Some(stamp) = free_stamp(c, p, now) else {
        // Within `limit + 1` ns of the clock's end: no stamp of its own is left (module docs)
        // until one expires.
        let retry = stamp_free_from(c, p, now, now);
        return (Decision::deny(p.limit, free, latest, retry), None);
    };
    let remaining = if stamps_left(c, p, now, 1) > 0 {
        p.limit - active - cost
    } else {
        0
    };
    if apply {
        let mut left = cost;
        for i in 0..p.limit as usize {
            if left == 0 {
                break;
            }
            if !is_live(c.get(i), now) {
                c.set(i, stamp);
                left -= 1;
            }
        }
    }
    let held = if stamp == u64::MAX {
        u64::MAX
    } else {
        stamp - now
    };
    let d = Decision::allow(p.limit, remaining, latest.max(held));
    (d, apply.then_some(stamp))
}

/// Frees the cells of the permit `stamp`; returns how many were freed (0 if it had expired and
/// been reused, or was released already).
pub fn release<C: Cells + ?Sized>(c: &mut C, p: &Params, stamp: u64) -> u64 {
    let mut n = 0;
    for i in 0..p.limit as usize {
        if c.get(i) == stamp {
            c.set(i, 0);
            n += 1;
        }
    }
    n
}

/// Nanoseconds until no lease is live.
pub fn idle_in<C: Cells + ?Sized>(c: &C, now: u64, p: &Params) -> u64 {
    live(c, p, now).1
}

#[cfg(test)]
mod tests {
    use super::*;
    const S: u64 = 1_000_000_000;

    #[test]
    fn acquire_release_and_expiry() {
        let p = Params::new(2, 10 * S).unwrap();
        let mut rec = vec![0u64; p.words()];
        let (d, a) = acquire(&mut rec[..], S, &p, 1, true);
        assert!(d.allowed());
        let (d, _b) = acquire(&mut rec[..], S, &p, 1, true);
        assert!(d.allowed());
        let (d, _) = acquire(&mut rec[..], S, &p, 1, true);
        assert!(!d.allowed());
        assert_eq!(release(&mut rec[..], &p, a.unwrap()), 1);
        assert!(acquire(&mut rec[..], S, &p, 1, true).0.allowed());
        // Nobody releases: the leases expire.
        assert!(!acquire(&mut rec[..], 5 * S, &p, 1, true).0.allowed());
        assert!(acquire(&mut rec[..], 12 * S, &p, 2, true).0.allowed());
    }

    /// A lease of `Duration::MAX`, or one running past the clock's end, must still give each
    /// permit its own stamp: releasing one frees one (before, `now + lease` saturated to one
    /// stamp shared by every permit, and one release freed them all).
    #[test]
    fn saturated_leases_keep_distinct_permits() {
        for (lease, now) in [
            (u64::MAX, S),
            (3600 * S, u64::MAX - 1800 * S),
            (3600 * S, u64::MAX - 10),
            (1, S),
        ] {
            let p = Params::new(3, lease).unwrap();
            let mut rec = vec![0u64; p.words()];
            let stamps: Vec<u64> = (0..3)
                .map(|_| {
                    let (d, st) = acquire(&mut rec[..], now, &p, 1, true);
                    assert!(d.allowed(), "lease {lease} at {now}");
                    st.unwrap()
                })
                .collect();
            assert!(stamps.iter().all(|&s| s > now));
            assert!(
                stamps[0] != stamps[1] && stamps[1] != stamps[2] && stamps[0] != stamps[2],
                "{stamps:?}"
            );
            assert!(!acquire(&mut rec[..], now, &p, 1, true).0.allowed());
            assert_eq!(
                release(&mut rec[..], &p, stamps[1]),
                1,
                "one release, one permit"
            );
            assert!(acquire(&mut rec[..], now, &p, 1, true).0.allowed());
            assert!(
                !acquire(&mut rec[..], now, &p, 1, true).0.allowed(),
                "the other two are still held"
            );
        }
    }

    /// Churn at one instant (acquire, release one, acquire) never hands out a held stamp, and
    /// stamps stay within `limit` ns of the lease's end.
    #[test]
    fn stamps_stay_unique_under_churn() {
        let p = Params::new(4, u64::MAX).unwrap();
        let mut rec = vec![0u64; p.words()];
        let mut held: Vec<u64> = Vec::new();
        for i in 0..1000u64 {
            if held.len() == 4 {
                let s = held.remove((i % 4) as usize);
                assert_eq!(release(&mut rec[..], &p, s), 1);
            }
            let (d, st) = acquire(&mut rec[..], S, &p, 1, true);
            assert!(d.allowed());
            let st = st.unwrap();
            assert!(!held.contains(&st) && st >= u64::MAX - 4, "{st}");
            held.push(st);
        }
    }

    /// Only at the very end of the clock, with no value left after `now`, is an acquire refused.
    #[test]
    fn the_clock_end_refuses_instead_of_sharing() {
        let p = Params::new(3, 10).unwrap();
        let mut rec = vec![0u64; p.words()];
        let now = u64::MAX - 1;
        assert!(acquire(&mut rec[..], now, &p, 1, true).0.allowed());
        let (d, _) = acquire(&mut rec[..], now, &p, 1, true);
        assert_eq!(d.outcome, crate::decision::Outcome::NeverFits);
    }
}
