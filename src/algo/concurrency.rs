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

fn live<C: Cells + ?Sized>(c: &C, p: &Params, now: u64) -> (u64, u64) {
    let (mut n, mut latest) = (0, 0);
    for i in 0..p.limit as usize {
        let v = c.get(i);
        if v > now {
            n += 1;
            latest = latest.max(v - now);
        }
    }
    (n, latest)
}

/// Cells holding a value in `lo..=hi`.
fn held<C: Cells + ?Sized>(c: &C, p: &Params, lo: u64, hi: u64) -> u64 {
    (0..p.limit as usize)
        .filter(|&i| (lo..=hi).contains(&c.get(i)))
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
    // Invariant: fewer cells hold a value in lo..=hi than there are values in it, so one is
    // free. Halve towards the lower half whenever that half keeps the invariant; otherwise
    // the upper half does (the counts add up).
    if held(c, p, lo, hi) > hi - lo {
        return None;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if held(c, p, lo, mid) <= mid - lo {
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
    if cost == 0 {
        return (Decision::allow(p.limit, p.limit - active, latest), None);
    }
    // Saturating: a huge cost must be refused, not wrap around into an admission.
    if active.saturating_add(cost) > p.limit {
        let retry = if cost > p.limit {
            None
        } else {
            // The (active + cost − limit)-th earliest expiry frees enough.
            let mut need = active + cost - p.limit;
            let mut after = now;
            while need > 0 {
                let (mut next, mut same) = (u64::MAX, 0);
                for i in 0..p.limit as usize {
                    let v = c.get(i);
                    if v > after && v < next {
                        (next, same) = (v, 1);
                    } else if v == next {
                        same += 1;
                    }
                }
                after = next;
                need = need.saturating_sub(same);
            }
            Some(after - now)
        };
        return (
            Decision::deny(p.limit, p.limit - active, latest, retry),
            None,
        );
    }
    let Some(stamp) = free_stamp(c, p, now) else {
        // Within `limit + 1` ns of the clock's end: no stamp of its own is left (module docs).
        return (
            Decision::deny(p.limit, p.limit - active, latest, None),
            None,
        );
    };
    if apply {
        let mut left = cost;
        for i in 0..p.limit as usize {
            if left == 0 {
                break;
            }
            if c.get(i) <= now {
                c.set(i, stamp);
                left -= 1;
            }
        }
    }
    let d = Decision::allow(p.limit, p.limit - active - cost, latest.max(stamp - now));
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
