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
//!          stamps are unique within a record (the later of acquire + TTL and the largest
//!          stamp held + 1), so a stamp names its permit.
//! ```
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

fn live<C: Cells + ?Sized>(c: &C, p: &Params, now: u64) -> (u64, u64, u64) {
    let (mut n, mut max, mut latest) = (0, 0, 0);
    for i in 0..p.limit as usize {
        let v = c.get(i);
        if is_live(v, now) {
            n += 1;
            // Never idle within the clock while a u64::MAX stamp is held.
            latest = latest.max(if v == u64::MAX { u64::MAX } else { v - now });
        }
        max = max.max(v);
    }
    (n, max, latest)
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
    let (active, max, latest) = live(c, p, now);
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
            // A lease stamped u64::MAX never frees within the clock: it never fits.
            (after < u64::MAX).then(|| after - now)
        };
        return (
            Decision::deny(p.limit, p.limit - active, latest, retry),
            None,
        );
    }
    let stamp = now.saturating_add(p.lease).max(max.saturating_add(1));
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
    let d = Decision::allow(p.limit, p.limit - active - cost, latest.max(held));
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
    live(c, p, now).2
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
}
