//! [`RedisStore`]: the same [`Limits`] and [`Decision`]s as `turnstile::keyed::Store`, kept in
//! Redis or a Redis Cluster, one atomic function call per decision.

use crate::call::{fcall, Caller};
use crate::conn::Conn;
use crate::deny::DenyCache;
use crate::layout::Layout;
use crate::plain::{self, Op, Plain};
use crate::policy::{blind, insurance, FailureGate, FailurePolicy, FailureStats};
use crate::reply;
use crate::script::{limit_args, store_spec};
use redis::{Cmd, ToRedisArgs};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{ConfigError, Decision, Limit, Limits};

/// Milliseconds added to every TTL when a call passes an explicit `now` (tests): such a `now`
/// is not the server's clock, so a TTL computed from it must not expire the key under the
/// test's feet. Production calls (server `TIME`) add nothing. (The library's `SLACK_MS`.)
pub const EXPLICIT_NOW_TTL_SLACK_MS: u64 = 3_600_000;

/// Why a call to Redis gave no decision.
#[derive(Debug)]
pub enum Error {
    /// The limits cannot run on Redis (see the message).
    Config(ConfigError),
    /// Redis answered with an error, or the connection failed.
    Redis(redis::RedisError),
    /// No answer within the per-call timeout.
    Timeout(Duration),
    /// The library answered something that is not a decision (a bug; the reply is given), or
    /// the server cannot run it (see the message).
    Reply(String),
    /// A key cannot be used (see the message).
    Key(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(e) => write!(f, "{e}"),
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::Timeout(t) => write!(f, "redis did not answer within {t:?}"),
            Error::Reply(r) => write!(f, "unexpected reply: {r}"),
            Error::Key(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

/// Builds a [`RedisStore`].
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    limits: Limits,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    policy: FailurePolicy,
    breaker_threshold: u64,
    breaker_cooldown: Duration,
    deny_cache: bool,
    insurance_keys: u64,
    capacity: Option<u64>,
    plain: bool,
}

impl RedisStoreBuilder {
    /// Key prefix (a namespace, e.g. the rule's name); default `"ts:"`. Must not contain `{`
    /// or `}` (the key, or its bucket, is the hash tag).
    pub fn prefix(mut self, p: impl Into<String>) -> Self {
        self.prefix = p.into();
        self
    }
    /// Per-call timeout (default 20 ms); past it the failure policy answers.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    /// Timeout of a connection attempt (default 1 s).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }
    /// What to answer when Redis does not (default [`FailurePolicy::Closed`]).
    pub fn policy(mut self, p: FailurePolicy) -> Self {
        self.policy = p;
        self
    }
    /// Consecutive failures that open the circuit (default 5), and how long it stays open
    /// before one probe call (default 1 s).
    pub fn breaker(mut self, threshold: u64, cooldown: Duration) -> Self {
        self.breaker_threshold = threshold;
        self.breaker_cooldown = cooldown;
        self
    }
    /// Answer denials of keys known to be over their limit (until their retry time) without a
    /// round trip (default off). It only ever denies: a request the cache does not cover goes
    /// to Redis. A refund through this store clears the key; another node's refund is not
    /// seen, so a cached key may be denied until its retry time although it would fit again.
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_cache = on;
        self
    }
    /// Keys the insurance store holds (policy [`FailurePolicy::Insurance`]; default 100 000).
    pub fn insurance_keys(mut self, keys: u64) -> Self {
        self.insurance_keys = keys;
        self
    }
    /// Packs the records of fixed_window, sliding_window, token_bucket and leaky_bucket limits
    /// as fields of hashes of 32 to 64 keys each, sized for `keys` live keys: about 27-29
    /// bytes of Redis memory per key and limit instead of 130-170 (docs/redis.md). Every
    /// process sharing these limits must give the same `keys` (it maps keys to hashes); more
    /// keys than that still work, in larger hashes. Default: a Redis key per record.
    pub fn capacity(mut self, keys: u64) -> Self {
        self.capacity = Some(keys);
        self
    }

    /// Decides a store of one fixed_window or sliding_window limit by plain commands instead
    /// of a function call (default off): a transaction of `INCRBY` and `PEXPIRE … NX` on a key
    /// named by the window (the way envoyproxy/ratelimit counts; sliding_window also `GET`s
    /// the previous window's), then the cost given back when it did not fit (unless the limit
    /// counts denials); a refund is a function call. About a quarter of a function call's
    /// work in redis-server (docs/redis.md, "What a call costs").
    ///
    /// **The window is picked by the caller's clock** (`SystemTime::now()`, or the explicit
    /// `now` of `check_at`), not the server's `TIME`: every process sharing the limit must
    /// have clocks that agree to within a small part of the window. A process whose clock is
    /// ahead counts in the next window early; one behind counts in the previous window while
    /// its key lives (to the end of the last window reading it, plus
    /// [`crate::PLAIN_CLOCK_SLACK_MS`]), and past that starts it afresh, admitting up to the
    /// limit again there. Decisions equal the in-memory
    /// store's while each caller's time moves forward; a call at a time before the latest
    /// write is decided in its own (earlier) window, where the in-memory record would stay in
    /// the later one. Concurrent callers may be refused transiently when together they pass
    /// the limit; never admitted past it.
    ///
    /// Only for a single fixed_window or sliding_window limit, one key per record (no
    /// [`RedisStoreBuilder::capacity`]), on one node (`connect`, not `connect_cluster`): the
    /// store is refused otherwise.
    pub fn plain_commands(mut self, on: bool) -> Self {
        self.plain = on;
        self
    }

    /// Connects to one Redis node (7.0 or later) and loads the library.
    pub async fn connect(self, url: &str) -> Result<RedisStore, Error> {
        let conn = Conn::single(url, self.connect_timeout).await?;
        let store = self.build(conn)?;
        store.load().await?;
        Ok(store)
    }

    /// Connects to a Redis Cluster through any of its nodes and loads the library on every
    /// master.
    pub async fn connect_cluster(self, urls: &[&str]) -> Result<RedisStore, Error> {
        let conn = Conn::cluster(urls, self.connect_timeout).await?;
        let store = self.build(conn)?;
        store.load().await?;
        Ok(store)
    }

    /// Builds over an existing connection (the library is loaded on first use).
    pub fn build(self, conn: Conn) -> Result<RedisStore, Error> {
        if self.prefix.contains(['{', '}']) {
            return Err(Error::Key(format!(
                "the key prefix `{}` contains a brace; the key itself is the {{hash tag}}, drop the braces from the prefix",
                self.prefix
            )));
        }
        let ls = self.limits.limits();
        let plain = match (self.plain, Plain::of(ls)) {
            (false, _) => None,
            (true, Some(p)) if self.capacity.is_none() && !conn.is_cluster() => Some(p),
            (true, _) => {
                return Err(Error::Config(ConfigError::new(
                    "plain_commands",
                    "plain commands decide a single fixed_window or sliding_window limit, one key per record (no capacity), on one node (not a cluster); use the function call (the default) for these limits",
                )))
            }
        };
        let args = ls.iter().map(limit_args).collect::<Result<Vec<_>, _>>()?;
        let layout = Layout::new(&self.prefix, ls, &args, self.capacity);
        let insurance = match self.policy {
            FailurePolicy::Insurance { expected_nodes } => Some(Arc::new(
                insurance(&self.limits, expected_nodes, self.insurance_keys).ok_or_else(|| {
                    Error::Config(ConfigError::new(
                        "policy",
                        "the insurance store could not be built for these limits",
                    ))
                })?,
            )),
            _ => None,
        };
        let backend = format!("store {:?}", self.prefix);
        Ok(RedisStore {
            caller: Caller::new(conn, self.timeout),
            spec: store_spec(layout.packed(), &self.limits, &args),
            concurrency: matches!(ls, [Limit::Concurrency(_)]),
            single: ls.first().map_or(0, Limit::capacity),
            layout,
            gate: FailureGate::new(
                self.policy,
                self.breaker_threshold,
                self.breaker_cooldown,
                backend,
            ),
            insurance,
            plain,
            deny: self.deny_cache.then(DenyCache::default),
            limits: self.limits,
        })
    }
}

/// Limits for many keys, in Redis. See the crate docs.
pub struct RedisStore {
    caller: Caller,
    /// The library's spec of these limits (spec.lua).
    spec: String,
    layout: Layout,
    concurrency: bool,
    /// The first limit's capacity (the failure policy's blind answers name it).
    single: u64,
    pub(crate) gate: FailureGate,
    pub(crate) insurance: Option<Arc<Store>>,
    /// Plain commands instead of the function (a single fixed_window or sliding_window limit;
    /// plain.rs).
    plain: Option<Plain>,
    deny: Option<DenyCache>,
    limits: Limits,
}

impl RedisStore {
    /// A builder for a store applying `limits` (all-or-nothing) to every key.
    pub fn builder(limits: Limits) -> RedisStoreBuilder {
        RedisStoreBuilder {
            limits,
            prefix: "ts:".into(),
            timeout: Duration::from_millis(20),
            connect_timeout: Duration::from_secs(1),
            policy: FailurePolicy::Closed,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(1),
            deny_cache: false,
            insurance_keys: 100_000,
            capacity: None,
            plain: false,
        }
    }

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

    async fn decide(&self, key: &str, now: Option<u64>, cost: u64) -> Result<Decision, Error> {
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
        self.decide(key, None, cost).await
    }

    /// [`RedisStore::try_check`] at an explicit `now` (ns) instead of the server's `TIME`: for
    /// tests that run one trace through Redis and the in-memory store. Keys written this way
    /// live [`EXPLICIT_NOW_TTL_SLACK_MS`] longer than their idle time.
    pub async fn check_at(&self, key: &str, cost: u64, now: u64) -> Result<Decision, Error> {
        self.decide(key, Some(now), cost).await
    }

    /// Looks at `key`'s limits without consuming.
    pub async fn peek(&self, key: &str) -> Result<Decision, Error> {
        self.decide(key, None, 0).await
    }

    /// [`RedisStore::peek`] at an explicit `now`.
    pub async fn peek_at(&self, key: &str, now: u64) -> Result<Decision, Error> {
        self.decide(key, Some(now), 0).await
    }

    /// Gives `n` back to `key`'s limits.
    pub async fn refund(&self, key: &str, n: u64) -> Result<(), Error> {
        self.refund_inner(key, n, None).await
    }

    /// [`RedisStore::refund`] at an explicit `now`.
    pub async fn refund_at(&self, key: &str, n: u64, now: u64) -> Result<(), Error> {
        self.refund_inner(key, n, Some(now)).await
    }

    async fn refund_inner(&self, key: &str, n: u64, now: Option<u64>) -> Result<(), Error> {
        if let Some(c) = &self.deny {
            c.forget(key);
        }
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
        if self.caller.conn().is_cluster() || self.plain.is_some() {
            let calls = keys.iter().map(|k| self.decide(k, now, cost));
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
