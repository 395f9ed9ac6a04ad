//! Limits given per check: a store of one packed algorithm whose records keep state only, and
//! whose limit comes with each check ([`Store::check_with`]). One store then serves every
//! customer's own limit, every plan, or every parameter set of redis-cell's `CL.THROTTLE`,
//! with one record per key.
//!
//! A packed record's state does not hold its limit's numbers: a token bucket keeps a time
//! (the TAT), a window its count and window index. So a check may decide a record by any
//! limit that reads it as the same state ([`Limit::carries_to`]), and when a key's limit
//! changes its state carries over by that algorithm's rule:
//!
//! | algorithm | given per check | a change of limit keeps |
//! |---|---|---|
//! | token_bucket | any capacity, rate and period | the TAT, as redis-cell keeps it: the backlog (TAT − now) is kept as a time, so the new bucket has (τ' − backlog) / T' tokens left, none until the backlog drains below τ' |
//! | leaky_bucket | any rate, period, burst and delay | the TAT: the time the queue takes to drain, now at the new rate (nginx would keep the queued count instead; they agree when only the burst changes) |
//! | fixed_window | limit and `count_denied`, the store's window | the window's count, compared with the new limit |
//! | sliding_window | limit and `count_denied`, the store's window | both windows' counts, weighted and compared with the new limit |
//!
//! The window is the layout of a window record (its index counts windows of that length), and
//! the store judges idle records by it when it reclaims room, so a window store takes limits
//! of its own window only; a limit it cannot read is refused ([`LimitMismatch`]) before it
//! touches any record. Idle records of a bucket are judged by their TAT alone, whatever limits
//! wrote them.
//!
//! The check path is the store's own: the key's id (hashed once, reusable for
//! [`Store::prefetch`]), one lookup and one 16-byte CAS with the given limit's transition
//! inlined; no allocation, no lock. Snapshots ([`Store::export_packed`]) hold the states only,
//! so they restore under any limits.

use super::key::Key;
use super::ops::{Evaluate, Refund, Settle};
use super::store::Store;
use crate::algo::{Algorithm, Limit};
use crate::clock::{Clock, Nanos};
use crate::decision::Decision;
use std::fmt;

/// A limit given with a check that a store's records cannot be read under (see the module
/// docs): the check is refused, and no record is touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitMismatch {
    /// The store's algorithm; `None` for a store whose records are not one packed limit
    /// (several limits per key, or sliding_log, window_ring, concurrency).
    pub store: Option<Algorithm>,
    /// The given limit's algorithm.
    pub given: Algorithm,
    /// The store's window and the given one, in ns, when both are windows of one algorithm
    /// that differ.
    pub windows: Option<(u64, u64)>,
}

impl fmt::Display for LimitMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.store, self.windows) {
            (None, _) => write!(
                f,
                "limits are given per check only to a store of one packed limit (fixed_window, \
                 sliding_window, token_bucket or leaky_bucket); this store keeps larger records, \
                 so check it with its own limits"
            ),
            (Some(s), Some((sw, gw))) => write!(
                f,
                "a {s} store counts in windows of {sw} ns, and a limit of a {gw} ns window \
                 cannot read its records (the window is the record's layout); give the store's \
                 window, or keep a store per window"
            ),
            (Some(s), None) => write!(
                f,
                "a {s} store's records cannot be read as {}; give a {s} limit, or keep a store \
                 per algorithm",
                self.given
            ),
        }
    }
}

impl std::error::Error for LimitMismatch {}

/// The window a packed limit counts in, if it counts in windows.
fn window_of(l: &Limit) -> Option<u64> {
    match l {
        Limit::FixedWindow(p) => Some(p.window),
        Limit::SlidingWindow(p) => Some(p.window),
        _ => None,
    }
}

impl<C: Clock> Store<C> {
    /// Whether `limit` may be given with this store's checks: the store is packed (one packed
    /// limit per key) and its records read as the same state under `limit`
    /// ([`Limit::carries_to`]: the same algorithm, and for a window the same window).
    #[inline]
    pub fn accepts(&self, limit: &Limit) -> Result<(), LimitMismatch> {
        match &self.packed {
            Some(own) if own.carries_to(limit) => Ok(()),
            own => Err(mismatch(own.as_ref(), limit)),
        }
    }

    /// Checks a request of `cost` for `key` now, decided by `limit` instead of the store's own
    /// (see the module docs for what carries over when a key's limit changes). As
    /// [`Store::check`], the key's buckets are fetched before the clock is read.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::Store;
    /// use turnstile::{Clock, Limit, Limits};
    ///
    /// // redis-cell's `CL.THROTTLE m 2 10 60` is a bucket of 3 refilled one per 6 s.
    /// let minute = Duration::from_secs(60);
    /// let small = Limit::token_bucket(3, 10, minute)?;
    /// let store = Store::builder(Limits::new(vec![small])?).capacity(1000).build()?;
    /// let now = store.clock().now();
    /// for _ in 0..3 {
    ///     assert!(store.check_with_at("m", &small, 1, now)?.allowed());
    /// }
    /// // `CL.THROTTLE m 5 10 60`: a bucket of 6, and the three drawn are still drawn.
    /// let large = Limit::token_bucket(6, 10, minute)?;
    /// let d = store.check_with_at("m", &large, 1, now)?;
    /// assert!(d.allowed());
    /// assert_eq!((d.remaining, d.reset_after_ns), (2, 24_000_000_000));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn check_with<K: Key + ?Sized>(
        &self,
        key: &K,
        limit: &Limit,
        cost: u64,
    ) -> Result<Decision, LimitMismatch> {
        self.accepts(limit)?;
        let id = key.key_id(&self.hasher);
        let (shard, home) = self.locate(id);
        shard.prefetch_home(home);
        Ok(self.check_packed(shard, home, id, limit, self.clock.now(), cost))
    }

    /// [`Store::check_with`] at `now` (which may lag as [`Store::check_at`]'s may).
    ///
    /// A server answering a pipeline hashes each key once (`store.hasher().bytes(key)`, an id
    /// that is its own [`Key`]), calls [`Store::prefetch`] with the ids of the commands it has
    /// in hand, then checks each id here, so that their misses to memory overlap.
    #[inline]
    pub fn check_with_at<K: Key + ?Sized>(
        &self,
        key: &K,
        limit: &Limit,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, LimitMismatch> {
        self.accepts(limit)?;
        let id = key.key_id(&self.hasher);
        let (shard, home) = self.locate(id);
        Ok(self.check_packed(shard, home, id, limit, now, cost))
    }

    /// [`Store::peek_at`] decided by `limit`: what `key` has left under it, consuming nothing.
    pub fn peek_with_at<K: Key + ?Sized>(
        &self,
        key: &K,
        limit: &Limit,
        now: Nanos,
    ) -> Result<Decision, LimitMismatch> {
        self.accepts(limit)?;
        Ok(self.run_check(limit, key.key_id(&self.hasher), now, 0, false, false))
    }

    /// [`Store::evaluate_at`] decided by `limit`: what a check would answer, recording
    /// nothing.
    pub fn evaluate_with_at<K: Key + ?Sized>(
        &self,
        key: &K,
        limit: &Limit,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, LimitMismatch> {
        self.accepts(limit)?;
        let mut op = Evaluate {
            by: limit,
            now,
            cost,
        };
        Ok(self.run(key.key_id(&self.hasher), now, false, &mut op))
    }

    /// [`Store::refund_at`] decided by `limit`: gives `n` back, as `limit` counts them.
    pub fn refund_with_at<K: Key + ?Sized>(
        &self,
        key: &K,
        limit: &Limit,
        n: u64,
        now: Nanos,
    ) -> Result<(), LimitMismatch> {
        self.accepts(limit)?;
        let mut op = Refund { by: limit, now, n };
        self.run(key.key_id(&self.hasher), now, false, &mut op);
        Ok(())
    }

    /// [`Store::settle_at`] decided by `limit`: charges or gives back the difference, as
    /// `limit` counts it.
    pub fn settle_with_at<K: Key + ?Sized>(
        &self,
        key: &K,
        limit: &Limit,
        reserved: u64,
        actual: u64,
        now: Nanos,
    ) -> Result<bool, LimitMismatch> {
        self.accepts(limit)?;
        if reserved == actual {
            return Ok(true);
        }
        let mut op = Settle {
            by: limit,
            now,
            reserved,
            actual,
        };
        Ok(self.run(key.key_id(&self.hasher), now, false, &mut op))
    }
}

/// Why `given` cannot read the records of a store whose packed limit is `own`.
#[cold]
fn mismatch(own: Option<&Limit>, given: &Limit) -> LimitMismatch {
    let store = own.map(Limit::algorithm);
    let windows = match (own.and_then(window_of), window_of(given)) {
        (Some(a), Some(b)) if store == Some(given.algorithm()) && a != b => Some((a, b)),
        _ => None,
    };
    LimitMismatch {
        store,
        given: given.algorithm(),
        windows,
    }
}
