//! [`RedisStore::settle`]: a cost known only after the work, settled in Redis against the
//! cost a check reserved — the difference charged or given back on every limit of the key in
//! one function call (lua/settle.lua), as `turnstile::keyed::Store::settle` does in memory.

use super::{Error, RedisStore};
use crate::plain::{self, Op};
use crate::reply;

impl RedisStore {
    /// Settles a check of `key` that reserved `reserved` (an estimate: tokens an LLM call may
    /// take, rows a query may scan) at its `actual` cost, on every limit of the key, all or
    /// nothing (one function call):
    ///
    /// * more than reserved: the difference is charged whatever the limits hold — past a
    ///   limit the key owes it, and its next checks are denied until it is paid (per
    ///   algorithm as in memory: `docs/algorithms.md`); a charge to an absent key creates its
    ///   records;
    /// * less: the difference is given back, as [`RedisStore::refund`] gives it;
    /// * the same: nothing is done (no call).
    ///
    /// With leases (reserve mode), a give-back goes into the key's lease first, as a refund
    /// does; a charge is taken from the lease when the lease holds all of it unspent (those
    /// admissions were counted in Redis when granted), else it goes to Redis whole. So every
    /// unit a node spends was counted in Redis first: never over. Delayed mode charges in
    /// Redis. No failure policy: an error means nothing was settled in Redis.
    pub async fn settle(&self, key: &str, reserved: u64, actual: u64) -> Result<(), Error> {
        self.settle_inner(key, reserved, actual, None).await
    }

    /// [`RedisStore::settle`] at an explicit `now` (ns) instead of the server's `TIME`.
    pub async fn settle_at(
        &self,
        key: &str,
        reserved: u64,
        actual: u64,
        now: u64,
    ) -> Result<(), Error> {
        self.settle_inner(key, reserved, actual, Some(now)).await
    }

    pub(crate) async fn settle_inner(
        &self,
        key: &str,
        reserved: u64,
        actual: u64,
        now: Option<u64>,
    ) -> Result<(), Error> {
        if actual <= reserved {
            return match reserved - actual {
                0 => Ok(()),
                back => self.refund_inner(key, back, now).await,
            };
        }
        let n = actual - reserved;
        if let Some(c) = &self.deny {
            c.forget(key);
        }
        if let Some(t) = &self.tier {
            if self.debit(t, key, n, now) == 0 {
                return Ok(());
            }
        }
        if let Some(p) = &self.plain {
            // A window's key of its own: the charge is one more increment (the count may pass
            // the limit; the decision reads it as in memory).
            let at = now.unwrap_or_else(plain::caller_now);
            let base = &self.layout.names(key).keys[0];
            let add = i64::try_from(n).unwrap_or(i64::MAX);
            let pipe = p.pipeline(base, at, now.is_some(), Op::Add(add));
            return self.caller.plain(&pipe).await.map(|_| ());
        }
        let v = self.call(&self.invocation(key, now, 's', n)).await?;
        reply::integer(&v).map(|_| ())
    }
}
