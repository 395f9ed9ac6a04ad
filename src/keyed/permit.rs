//! Concurrency permits held across `.await`: [`Store::acquire_owned`] and the [`StorePermit`]
//! that gives its lease back when dropped.

use super::ops::{Acquire, Release};
use super::store::Store;
use crate::algo::Limit;
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::keyed::Key;
use std::sync::Arc;

/// In-flight capacity of one key of a [`Store`], held until dropped (see
/// [`Store::acquire_owned`]). Owns an `Arc` of the store: `Send` and `'static` when the clock
/// is, so it can be held across `.await` and moved between tasks.
#[must_use = "the permit is released as soon as it is dropped"]
pub struct StorePermit<C: Clock = DefaultClock> {
    store: Arc<Store<C>>,
    id: u64,
    /// The lease's stamp; `None` for a permit that releases nothing.
    stamp: Option<u64>,
    decision: Decision,
}

impl<C: Clock> StorePermit<C> {
    /// The decision that granted it.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl<C: Clock> Drop for StorePermit<C> {
    fn drop(&mut self) {
        if let Some(stamp) = self.stamp {
            self.store.release(self.id, stamp);
        }
    }
}

impl<C: Clock> std::fmt::Debug for StorePermit<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorePermit")
            .field("id", &self.id)
            .field("stamp", &self.stamp)
            .field("decision", &self.decision)
            .finish()
    }
}

impl<C: Clock> Store<C> {
    /// For a concurrency limit: takes `cost` of `key`'s in-flight permits, held until the
    /// returned [`StorePermit`] drops (or its lease expires, if it never does). The permit owns
    /// an `Arc` of the store, so it can move into a task and be held across `.await`.
    ///
    /// A plain [`Store::check`] on a concurrency store takes a lease that only its expiry
    /// frees (`refund` cannot name it); `acquire_owned` is how to give it back early. For any
    /// other limit, this answers as `check` and its permit releases nothing.
    pub fn acquire_owned<K: Key + ?Sized>(
        self: &Arc<Self>,
        key: &K,
        cost: u64,
    ) -> Result<StorePermit<C>, Decision> {
        self.acquire_owned_at(key, cost, self.clock().now())
    }

    /// [`Store::acquire_owned`] at `now`.
    pub fn acquire_owned_at<K: Key + ?Sized>(
        self: &Arc<Self>,
        key: &K,
        cost: u64,
        now: Nanos,
    ) -> Result<StorePermit<C>, Decision> {
        let id = key.key_id(self.hasher());
        let (decision, stamp) = match self.limits().limits() {
            [Limit::Concurrency(p)] => self.run(id, now, false, &mut Acquire { p, now, cost }),
            _ => (self.check_id(id, now, cost), None),
        };
        if decision.allowed() {
            Ok(StorePermit {
                store: Arc::clone(self),
                id,
                stamp,
                decision,
            })
        } else {
            Err(decision)
        }
    }

    /// Frees the permit `stamp` of key id `id` (a no-op if its lease expired and its cells
    /// were reused, or its record is gone).
    fn release(&self, id: u64, stamp: u64) {
        if let [Limit::Concurrency(p)] = self.limits().limits() {
            self.run(id, self.clock().now(), false, &mut Release { p, stamp })
        }
    }
}
