//! [`RedisStore`]: the same [`Limits`] and [`Decision`]s as `turnstile::keyed::Store`, kept in
//! Redis or a Redis Cluster, one atomic function call per decision.

use crate::call::{fcall, Caller};
pub use crate::error::Error;

pub mod lease;
mod settle;

use crate::conn::Conn;
use crate::deny::DenyCache;
use crate::layout::Layout;
use crate::plain::{self, Op, Plain};
use crate::policy::{blind, FailureGate, FailureStats};
use crate::reply;
use lease::Tier;
use redis::{Cmd, ToRedisArgs};
use std::sync::Arc;
use turnstile::keyed::Store;
use turnstile::{Decision, Limits};

/// Limits for many keys, in Redis. See the crate docs.
pub struct RedisStore {
    pub(crate) caller: Caller,
    /// The library's spec of these limits (spec.lua).
    pub(crate) spec: String,
    pub(crate) layout: Layout,
    pub(crate) concurrency: bool,
    /// The first limit's capacity (the failure policy's blind answers name it).
    pub(crate) single: u64,
    pub(crate) gate: FailureGate,
    pub(crate) insurance: Option<Arc<Store>>,
    /// Plain commands instead of the function (a single fixed_window or sliding_window limit;
    /// plain.rs).
    pub(crate) plain: Option<Plain>,
    pub(crate) deny: Option<DenyCache>,
    pub(crate) limits: Limits,
    /// Leases (`lease`), if the store was built with them.
    pub(crate) tier: Option<Arc<Tier>>,
}

impl RedisStore {
    /// The limits every key gets.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The connection (for tests and tools).
    pub fn connection(&self) -> Conn {
        self.caller.conn().clone()
    }

    /// The name of the Functions library the store calls (`FUNCTION LIST` shows it).
    pub fn library_name(&self) -> &str {
        self.caller.library_name()
    }

    /// Loads the library (done on first use, and again whenever Redis lost it).
    pub async fn load(&self) -> Result<(), Error> {
        let mut conn = self.caller.conn().clone();
        self.caller.load(&mut conn, None).await
    }

    /// The Redis keys of `key`'s records, one per limit, all sharing one hash tag: the key's
    /// own, or with [`RedisStoreBuilder::capacity`] its bucket's (a hash holding many keys'
    /// records: see [`RedisStore::record_field`]). With
    /// [`RedisStoreBuilder::plain_commands`], each window's count is at the first of these
    /// followed by `:<window index>` (`now / window`).
    pub fn redis_keys(&self, key: &str) -> Vec<String> {
        self.layout.names(key).keys
    }

    /// With [`RedisStoreBuilder::capacity`], the field holding `key`'s record in each of its
    /// limits' buckets (the limits whose records are packed); else `None`.
    pub fn record_field(&self, key: &str) -> Option<Vec<u8>> {
        self.layout.names(key).field
    }

    /// What the failure path did so far.
    pub fn stats(&self) -> FailureStats {
        self.gate.stats()
    }

    /// Whether the circuit breaker is open (Redis is being left alone).
    pub fn circuit_open(&self) -> bool {
        self.gate.is_open()
    }

    pub(crate) fn is_concurrency(&self) -> bool {
        self.concurrency
    }

    /// The call of `mode` (check "c", refund "r", acquire "a", release "x") for `key` at `now`
    /// (`None`: the server's TIME), `arg` the cost or the stamp.
    pub(crate) fn invocation(
        &self,
        key: &str,
        now: Option<u64>,
        mode: char,
        arg: impl ToRedisArgs,
    ) -> Cmd {
        let names = self.layout.names(key);
        let op = match now {
            Some(n) => format!("{mode}{n}"),
            None => mode.to_string(),
        };
        let f = self.caller.store_fn();
        match names.field {
            Some(field) => fcall(f, &names.keys, (&self.spec, op, arg, field)),
            None => fcall(f, &names.keys, (&self.spec, op, arg)),
        }
    }

    /// One call (timeout, reload: call.rs).
    pub(crate) async fn call(&self, cmd: &Cmd) -> Result<redis::Value, Error> {
        self.caller.call(cmd).await
    }

    pub(crate) async fn decide(
        &self,
        key: &str,
        now: Option<u64>,
        cost: u64,
    ) -> Result<Decision, Error> {
        if let Some(p) = &self.plain {
            return self.plain_decide(p, key, now, cost).await;
        }
        let v = self.call(&self.invocation(key, now, 'c', cost)).await?;
        reply::store(&v).map(|(d, _)| d)
    }

    /// A check by plain commands (plain.rs): add the cost (or read), decide from the count,
    /// give the cost back if it was refused and the limit does not count denials.
    async fn plain_decide(
        &self,
        p: &Plain,
        key: &str,
        now: Option<u64>,
        cost: u64,
    ) -> Result<Decision, Error> {
        let at = now.unwrap_or_else(plain::caller_now);
        let base = &self.layout.names(key).keys[0];
        let explicit = now.is_some();
        let n = |c: i64| c.max(0) as u64;
        if !p.adds(cost) {
            let v = self
                .caller
                .plain(&p.pipeline(base, at, explicit, Op::Read))
                .await?;
            let (cur, prev) = plain::counts(&v)?;
            return Ok(p.decide(n(cur), n(prev), at, cost));
        }
        let add = p.pipeline(base, at, explicit, Op::Add(cost as i64));
        let (after, prev) = plain::counts(&self.caller.plain(&add).await?)?;
        let d = p.decide(n(after - cost as i64), n(prev), at, cost);
        if p.undoes(&d) {
            let undo = p.pipeline(base, at, explicit, Op::Add(-(cost as i64)));
            let (left, _) = plain::counts(&self.caller.plain(&undo).await?)?;
            if left < 0 {
                // The key had expired (its window long over) and the undo made it anew at
                // -cost, with a TTL: bring it back to what it holds plus 0.
                let heal = p.pipeline(base, at, explicit, Op::Add(-left));
                self.caller.plain(&heal).await?;
            }
        }
        Ok(d)
    }

    /// Checks a request of `cost` for `key` on Redis, at the server's time; no failure policy
    /// (an error is returned).
    pub async fn try_check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.checked(key, None, cost).await
    }

    /// A check through the lease tier if the store has one, else in Redis.
    pub(crate) async fn checked(
        &self,
        key: &str,
        now: Option<u64>,
        cost: u64,
    ) -> Result<Decision, Error> {
        match &self.tier {
            Some(t) if cost > 0 => self.tier_check(t, key, cost, now).await,
            _ => self.decide(key, now, cost).await,
        }
    }

    /// [`RedisStore::try_check`] at an explicit `now` (ns) instead of the server's `TIME`: for
    /// tests that run one trace through Redis and the in-memory store. Keys written this way
    /// live [`EXPLICIT_NOW_TTL_SLACK_MS`] longer than their idle time.
    pub async fn check_at(&self, key: &str, cost: u64, now: u64) -> Result<Decision, Error> {
        self.checked(key, Some(now), cost).await
    }

    /// Looks at `key`'s limits without consuming. With leases, `remaining` includes what
    /// this node holds of the key (Redis counted it already).
    pub async fn peek(&self, key: &str) -> Result<Decision, Error> {
        self.peeked(key, None).await
    }

    /// [`RedisStore::peek`] at an explicit `now`.
    pub async fn peek_at(&self, key: &str, now: u64) -> Result<Decision, Error> {
        self.peeked(key, Some(now)).await
    }

    async fn peeked(&self, key: &str, now: Option<u64>) -> Result<Decision, Error> {
        let mut d = self.decide(key, now, 0).await?;
        if let Some(t) = &self.tier {
            d.remaining = d.remaining.saturating_add(self.held(t, key, now));
        }
        Ok(d)
    }

    /// Gives `n` back to `key`'s limits.
    pub async fn refund(&self, key: &str, n: u64) -> Result<(), Error> {
        self.refund_inner(key, n, None).await
    }

    /// [`RedisStore::refund`] at an explicit `now`.
    pub async fn refund_at(&self, key: &str, n: u64, now: u64) -> Result<(), Error> {
        self.refund_inner(key, n, Some(now)).await
    }

    pub(crate) async fn refund_inner(
        &self,
        key: &str,
        n: u64,
        now: Option<u64>,
    ) -> Result<(), Error> {
        if let Some(c) = &self.deny {
            c.forget(key);
        }
        // With leases, what the key's lease spent goes back into it first.
        if let Some(t) = self.tier.as_ref().filter(|_| n > 0) {
            let rest = self.credit(t, key, n, now);
            if rest == 0 {
                return Ok(());
            }
            return self.refund_redis(key, rest, now).await;
        }
        self.refund_redis(key, n, now).await
    }

    /// A refund of `n` in Redis.
    async fn refund_redis(&self, key: &str, n: u64, now: Option<u64>) -> Result<(), Error> {
        if let Some(p) = &self.plain {
            let at = now.unwrap_or_else(plain::caller_now);
            let k = p.key(&self.layout.names(key).keys[0], at);
            // Only this window's count, as in memory; by a function call: no plain command
            // gives back without going below 0.
            let v = self
                .call(&fcall(self.caller.plain_fn(), &[k], (n, p.ceiling())))
                .await?;
            return reply::integer(&v).map(|_| ());
        }
        let v = self.call(&self.invocation(key, now, 'r', n)).await?;
        reply::integer(&v).map(|_| ())
    }

    /// Checks a request of `cost` for `key`: Redis if it answers within the timeout, else the
    /// failure policy (counted in [`RedisStore::stats`]). Never fails.
    pub async fn check(&self, key: &str, cost: u64) -> Decision {
        if let Some(t) = &self.tier {
            if cost > 0 {
                return self.leased_check(t, key, cost).await;
            }
        }
        if let Some(d) = self.deny.as_ref().and_then(|c| c.lookup(key, cost)) {
            self.gate.cached_denial();
            return d;
        }
        if !self.gate.admit(1) {
            return self.fallback(key, cost);
        }
        match self.try_check(key, cost).await {
            Ok(d) => {
                self.answered(key, cost, &d);
                d
            }
            Err(e) => {
                self.gate.failed(&e);
                self.fallback(key, cost)
            }
        }
    }

    /// A decision Redis gave: counted, and remembered if the deny cache is on.
    pub(crate) fn answered(&self, key: &str, cost: u64, d: &Decision) {
        self.gate.succeeded(1);
        if let Some(c) = &self.deny {
            c.remember(key, cost, d);
        }
    }

    /// The failure policy's decision (counted).
    pub(crate) fn fallback(&self, key: &str, cost: u64) -> Decision {
        self.gate.fell_back(1);
        match &self.insurance {
            Some(s) => s.check(key, cost),
            None => blind(self.gate.policy, self.single),
        }
    }

    /// Checks many keys in one pipeline (one node) or concurrently over the multiplexed
    /// connection (a cluster, where the keys live on different nodes); no failure policy.
    pub async fn try_check_many(&self, keys: &[&str], cost: u64) -> Result<Vec<Decision>, Error> {
        self.many(keys, None, cost).await
    }

    /// [`RedisStore::try_check_many`] at an explicit `now`.
    pub async fn check_many_at(
        &self,
        keys: &[&str],
        cost: u64,
        now: u64,
    ) -> Result<Vec<Decision>, Error> {
        self.many(keys, Some(now), cost).await
    }

    /// [`RedisStore::check`] for many keys, pipelined; the failure policy answers all of them
    /// if the pipeline fails.
    pub async fn check_many(&self, keys: &[&str], cost: u64) -> Vec<Decision> {
        if self.tier.is_some() {
            let calls = keys.iter().map(|k| self.check(k, cost));
            return futures_util::future::join_all(calls).await;
        }
        let n = keys.len() as u64;
        if !self.gate.admit(n) {
            return keys.iter().map(|k| self.fallback(k, cost)).collect();
        }
        match self.try_check_many(keys, cost).await {
            Ok(v) => {
                self.gate.succeeded(n);
                if let Some(c) = &self.deny {
                    for (k, d) in keys.iter().zip(&v) {
                        c.remember(k, cost, d);
                    }
                }
                v
            }
            Err(e) => {
                self.gate.failed(&e);
                keys.iter().map(|k| self.fallback(k, cost)).collect()
            }
        }
    }

    async fn many(
        &self,
        keys: &[&str],
        now: Option<u64>,
        cost: u64,
    ) -> Result<Vec<Decision>, Error> {
        if self.caller.conn().is_cluster() || self.plain.is_some() || self.tier.is_some() {
            let calls = keys.iter().map(|k| self.checked(k, now, cost));
            return futures_util::future::join_all(calls)
                .await
                .into_iter()
                .collect();
        }
        let cmds: Vec<Cmd> = keys
            .iter()
            .map(|k| self.invocation(k, now, 'c', cost))
            .collect();
        let vals = self.caller.pipeline(&cmds).await?;
        vals.iter()
            .map(|v| reply::store(v).map(|(d, _)| d))
            .collect()
    }
}
