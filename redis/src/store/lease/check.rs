//! A store's checks, peeks and refunds through its lease tier: answered from the key's lease
//! when it holds one, else a lease call (a check that also reserves), else one check in
//! Redis; and the lease call itself.

use super::batch::Io;
use super::record::{Spend, Spent};
use super::settle::{Credit, Debit, Grant, Held, Settle, Unfetch};
use super::{LeaseMode, Tier};
use crate::call::fcall;
use crate::error::Error;
use crate::store::RedisStore;
use redis::Cmd;
use std::sync::Arc;
use turnstile::Decision;

/// Waits for another caller's fetch of the same key, at most this many times per check
/// (then the check goes to Redis alone).
const MAX_WAITS: u32 = 3;

impl RedisStore {
    /// [`RedisStore::check`] with leases: a lease answers locally; a call Redis does not
    /// answer is the failure policy's (a held lease is spent first, whatever Redis does).
    pub(crate) async fn leased_check(&self, tier: &Arc<Tier>, key: &str, cost: u64) -> Decision {
        match self.tier_check(tier, key, cost, None).await {
            Ok(d) => d,
            Err(_) => self.fallback(key, cost),
        }
    }

    /// A check through `tier` at the node's time or an explicit `now`; a Redis call that
    /// fails is reported to the failure gate and returned as the error.
    pub(crate) async fn tier_check(
        &self,
        tier: &Arc<Tier>,
        key: &str,
        cost: u64,
        explicit: Option<u64>,
    ) -> Result<Decision, Error> {
        let id = tier.id(key);
        let counters = tier.counters();
        let (mut waits, mut counted) = (0, false);
        loop {
            let mut spent = self.look(tier, id, key, cost, explicit, !counted, true);
            counted = true;
            if let (Spent::Wait, true) = (&spent, waits < MAX_WAITS) {
                // Another caller is fetching this key's lease. Register with its waiters, then
                // look again (a fetch that ended in between would not wake us), then wait:
                // bounded by the fetch's own timeout; a fetch dropped mid-call clears its flag
                // and wakes us (`FetchGuard`). Only waiters touch the `Notify` (its list is
                // behind a lock): never a check answered from its lease.
                let notified = tier.waiters(id).notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                spent = self.look(tier, id, key, cost, explicit, false, true);
                if let Spent::Wait = spent {
                    waits += 1;
                    let _ = tokio::time::timeout(self.caller.timeout(), notified).await;
                    continue;
                }
            }
            return match spent {
                Spent::Local(d) => {
                    counters.check(id, true);
                    // An answer without I/O: spend a unit of the task's cooperative budget
                    // (a thread-local count; it yields once the budget is out), so that a task
                    // checking leased keys in a loop lets the runtime's other tasks — the
                    // lease calls among them — run, as any tokio resource does.
                    tokio::task::coop::consume_budget().await;
                    Ok(d)
                }
                Spent::Check | Spent::Wait => {
                    counters.check(id, false);
                    self.one_check(tier, key, cost, explicit).await
                }
                Spent::Fetch { rate, pending } => {
                    counters.check(id, false);
                    let fetch = Fetch {
                        tier,
                        id,
                        key,
                        cost,
                        rate,
                        pending,
                        explicit,
                    };
                    self.fetch(fetch).await
                }
            };
        }
    }

    /// The key's record's answer to a check of `cost` (`count`: counted in its rate;
    /// `claim`: a lease that is out is this caller's to fetch).
    #[allow(clippy::too_many_arguments)]
    fn look(
        &self,
        tier: &Tier,
        id: u64,
        key: &str,
        cost: u64,
        explicit: Option<u64>,
        count: bool,
        claim: bool,
    ) -> Spent {
        let now = tier.now(explicit);
        let mut spend = Spend {
            shape: tier.shape(),
            counters: tier.counters(),
            key: key.as_bytes(),
            cost,
            now,
            count,
            claim,
        };
        tier.table.update(id, now, &mut spend)
    }

    /// [`RedisStore::check`]'s answer if this node can give it without Redis: a lease of the
    /// key spent, or a denial Redis gave (until its retry time). `None`: nothing was decided
    /// or counted, call [`RedisStore::check`]. No allocation, no lock, no await: a caller
    /// that must otherwise build a future (the tower layer) answers the leased keys at once.
    pub fn check_local(&self, key: &str, cost: u64) -> Option<Decision> {
        let tier = self.tier.as_ref()?;
        if cost == 0 {
            return None;
        }
        let id = tier.id(key);
        match self.look(tier, id, key, cost, None, true, false) {
            Spent::Local(d) => {
                tier.counters().check(id, true);
                Some(d)
            }
            _ => None,
        }
    }

    /// One check in Redis (not leased), through the failure gate: on one server at its time,
    /// in the next batched call (batch.rs).
    async fn one_check(
        &self,
        tier: &Arc<Tier>,
        key: &str,
        cost: u64,
        explicit: Option<u64>,
    ) -> Result<Decision, Error> {
        if !self.gate.admit(1) {
            return Err(Error::Reply("the circuit is open".into()));
        }
        let batched =
            if explicit.is_none() && self.plain.is_none() && !self.caller.conn().is_cluster() {
                let names = self.layout.names(key);
                let io = || Io {
                    caller: self.caller.clone(),
                    spec: self.spec.clone(),
                };
                let field = names.field.unwrap_or_default();
                let timeout = self.caller.timeout();
                tier.batch
                    .check(tier, io, names.keys, field, cost, timeout)
                    .await
            } else {
                None
            };
        let r = match batched {
            Some(r) => r,
            None => {
                tier.counters().call(false);
                self.decide(key, explicit, cost).await
            }
        };
        match r {
            Ok(d) => {
                self.gate.succeeded(1);
                Ok(d)
            }
            Err(e) => {
                self.gate.failed(&e);
                Err(e)
            }
        }
    }

    /// A lease call for `f.key` and its settling into the key's record.
    async fn fetch(&self, f: Fetch<'_>) -> Result<Decision, Error> {
        let tier = f.tier;
        let mut guard = FetchGuard {
            tier,
            id: f.id,
            explicit: f.explicit,
            done: false,
        };
        if !self.gate.admit(1) {
            return Err(Error::Reply("the circuit is open".into()));
        }
        let sent = tier.now(f.explicit);
        let share = (tier.cfg.strand * 1e6) as u64;
        // Delayed mode reserves nothing: its lease call is a check (and a record of what it
        // admitted), and the allowance comes from what Redis then has left.
        let rate = match tier.cfg.mode {
            LeaseMode::Reserve => f.rate,
            LeaseMode::Delayed { .. } => 0,
        };
        let longest = tier.shape().longest;
        let cmd = self.lease_invocation(f.key, f.explicit, f.cost, rate, share, f.pending, longest);
        tier.counters().call(true);
        let v = match self.call(&cmd).await {
            Ok(v) => v,
            Err(e) => {
                self.gate.failed(&e);
                tier.counters().unrecorded(f.pending);
                return Err(e);
            }
        };
        let (grant, flushed): (Grant, u64) =
            super::settle::parse_grant(&v, self.limits.limits().len())?;
        self.gate.succeeded(1);
        tier.counters()
            .unrecorded(f.pending.saturating_sub(flushed));
        let now = tier.now(f.explicit);
        let mut settle = Settle {
            shape: tier.shape(),
            counters: tier.counters(),
            grant: &grant,
            cost: f.cost,
            pending_sent: f.pending,
            sent,
            now,
            list: None,
        };
        let d = tier.table.update(f.id, now, &mut settle);
        if let Some(due) = settle.list {
            tier.listed.add(f.id, due);
        }
        guard.done = true;
        tier.waiters(f.id).notify_waiters();
        Ok(d)
    }

    /// The lease call (`l`) for `key`: the request's `cost`, the node's `rate` for the key
    /// (cost units per 10^12 ns), the final `share` (ppm), delayed mode's `pending`, the
    /// `longest` a lease is sized for (ns).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lease_invocation(
        &self,
        key: &str,
        now: Option<u64>,
        cost: u64,
        rate: u64,
        share: u64,
        pending: u64,
        longest: u64,
    ) -> Cmd {
        let names = self.layout.names(key);
        let f = self.caller.store_fn();
        let field = names.field.unwrap_or_default();
        let args = (
            &self.spec,
            op('l', now),
            cost,
            field,
            rate,
            share,
            pending,
            longest,
        );
        fcall(f, &names.keys, args)
    }

    /// What this node holds of `key` (a peek adds it).
    pub(crate) fn held(&self, tier: &Tier, key: &str, explicit: Option<u64>) -> u64 {
        let now = tier.now(explicit);
        let mut op = Held {
            shape: tier.shape(),
            now,
        };
        tier.table.update(tier.id(key), now, &mut op)
    }

    /// A refund of `n` into `key`'s lease; what is left for Redis.
    pub(crate) fn credit(&self, tier: &Tier, key: &str, n: u64, explicit: Option<u64>) -> u64 {
        let now = tier.now(explicit);
        let mut op = Credit {
            shape: tier.shape(),
            key: key.as_bytes(),
            n,
            now,
        };
        tier.table.update(tier.id(key), now, &mut op)
    }
}

impl RedisStore {
    /// A settled charge of `n` for `key`, from its lease if the lease holds all of it; what
    /// is left for Redis (0 or `n`: [`Debit`]).
    pub(crate) fn debit(&self, tier: &Tier, key: &str, n: u64, explicit: Option<u64>) -> u64 {
        let now = tier.now(explicit);
        let mut op = Debit {
            shape: tier.shape(),
            counters: tier.counters(),
            key: key.as_bytes(),
            n,
            now,
        };
        tier.table.update(tier.id(key), now, &mut op)
    }
}

/// A lease op's second argument: its letter, then the explicit now if any.
pub(crate) fn op(mode: char, now: Option<u64>) -> String {
    match now {
        Some(n) => format!("{mode}{n}"),
        None => mode.to_string(),
    }
}

/// One lease call to make.
struct Fetch<'a> {
    tier: &'a Tier,
    id: u64,
    key: &'a str,
    cost: u64,
    rate: u64,
    pending: u64,
    explicit: Option<u64>,
}

/// Clears the key's fetch flag and wakes its waiters if the fetch ends without settling (an
/// error, or the caller's future dropped mid-call).
struct FetchGuard<'a> {
    tier: &'a Tier,
    id: u64,
    explicit: Option<u64>,
    done: bool,
}

impl Drop for FetchGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            let now = self.tier.now(self.explicit);
            self.tier.table.update(self.id, now, &mut Unfetch);
            self.tier.waiters(self.id).notify_waiters();
        }
    }
}
