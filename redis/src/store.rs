//! [`RedisStore`]: the same [`Limits`] and [`Decision`]s as `turnstile::keyed::Store`, kept in
//! Redis or a Redis Cluster, one atomic script call per decision.

use crate::conn::Conn;
use crate::policy::{
    blind, insurance, record_failure, Breaker, Counters, FailurePolicy, FailureStats,
};
use crate::script::{compose, LimitArgs};
use redis::{ServerErrorKind, Value};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use turnstile::keyed::Store;
use turnstile::{ConfigError, Decision, Limits, Outcome};

/// Milliseconds added to every TTL when a call passes an explicit `now` (tests): such a `now`
/// is not the server's clock, so a TTL computed from it must not expire the key under the
/// test's feet. Production calls (server `TIME`) add nothing.
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
    /// The script answered something that is not a decision (a bug; the reply is given).
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
            Error::Reply(r) => write!(f, "unexpected script reply: {r}"),
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
}

impl RedisStoreBuilder {
    /// Key prefix (a namespace, e.g. the rule's name); default `"ts:"`. Must not contain `{`
    /// or `}` (the key itself is the hash tag).
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

    /// Connects to one Redis node.
    pub async fn connect(self, url: &str) -> Result<RedisStore, Error> {
        let conn = Conn::single(url, self.connect_timeout).await?;
        self.build(conn)
    }

    /// Connects to a Redis Cluster through any of its nodes.
    pub async fn connect_cluster(self, urls: &[&str]) -> Result<RedisStore, Error> {
        let conn = Conn::cluster(urls, self.connect_timeout).await?;
        self.build(conn)
    }

    /// Builds over an existing connection.
    pub fn build(self, conn: Conn) -> Result<RedisStore, Error> {
        if self.prefix.contains(['{', '}']) {
            return Err(Error::Key(format!(
                "the key prefix `{}` contains a brace; the key itself is the {{hash tag}}, drop the braces from the prefix",
                self.prefix
            )));
        }
        let (script, largs) = compose(&self.limits)?;
        let mut tail = vec![largs.len().to_string()];
        for a in &largs {
            tail.push(a.code.to_string());
            tail.extend(a.params.iter().map(u64::to_string));
        }
        // fast.lua answers an admission of one fixed_window / token_bucket limit as
        // "<remaining> <reset_after>"; the limit it leaves out is this one.
        let fast_limit = match largs.as_slice() {
            [a] if a.code == "fw" || a.code == "tb" => Some(a.params[0]),
            _ => None,
        };
        let suffixes = largs
            .iter()
            .enumerate()
            .map(|(i, a): (usize, &LimitArgs)| format!(":{i}{}", a.code))
            .collect();
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
        Ok(RedisStore {
            conn,
            script,
            fast_limit,
            tail,
            suffixes,
            prefix: self.prefix,
            timeout: self.timeout,
            policy: self.policy,
            breaker: Breaker::new(self.breaker_threshold, self.breaker_cooldown),
            counters: Counters::default(),
            insurance,
            deny_cache: self.deny_cache.then(|| Mutex::new(HashMap::new())),
            limits: self.limits,
        })
    }
}

/// The over-limit cache: key → (deny until, the smallest cost denied, the decision).
type DenyCache = HashMap<String, (Instant, u64, Decision)>;

/// Entries the over-limit cache holds before it drops the expired ones (then, if still full,
/// all of them).
const DENY_CACHE_MAX: usize = 65_536;

/// Limits for many keys, in Redis. See the crate docs.
pub struct RedisStore {
    conn: Conn,
    script: redis::Script,
    /// For one fixed_window / token_bucket limit, checked by fast.lua: the limit an admission
    /// leaves out of its short reply.
    fast_limit: Option<u64>,
    /// ARGV from [5] on: the number of limits, then each one's code and parameters.
    tail: Vec<String>,
    /// Each limit's key suffix (`:<index><code>`).
    suffixes: Vec<String>,
    prefix: String,
    timeout: Duration,
    policy: FailurePolicy,
    pub(crate) breaker: Breaker,
    pub(crate) counters: Counters,
    pub(crate) insurance: Option<Arc<Store>>,
    /// key → (deny until, the smallest cost denied, the decision).
    deny_cache: Option<Mutex<DenyCache>>,
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
        }
    }

    /// The limits every key gets.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The connection (for tests and tools).
    pub fn connection(&self) -> Conn {
        self.conn.clone()
    }

    /// The script's SHA1 (what `EVALSHA` names).
    pub fn script_sha(&self) -> &str {
        self.script.get_hash()
    }

    /// The Redis keys of `key`, one per limit, all sharing the hash tag `{key}`.
    pub fn redis_keys(&self, key: &str) -> Vec<String> {
        self.suffixes
            .iter()
            .map(|s| format!("{}{{{key}}}{s}", self.prefix))
            .collect()
    }

    /// What the failure path did so far.
    pub fn stats(&self) -> FailureStats {
        self.counters.snapshot()
    }

    /// Whether the circuit breaker is open (Redis is being left alone).
    pub fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    pub(crate) fn invocation(
        &self,
        key: &str,
        now: Option<u64>,
        cost: impl redis::ToRedisArgs,
        mode: &str,
    ) -> redis::Cmd {
        let mut c = redis::cmd("EVALSHA");
        c.arg(self.script.get_hash()).arg(self.suffixes.len());
        for s in &self.suffixes {
            c.arg(format!("{}{{{key}}}{s}", self.prefix));
        }
        match now {
            Some(n) => c.arg(n).arg(cost).arg(mode).arg(EXPLICIT_NOW_TTL_SLACK_MS),
            None => c.arg("").arg(cost).arg(mode).arg(0),
        };
        c.arg(&self.tail);
        c
    }

    /// One script call with the timeout; `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`)
    /// loads the script and calls again.
    pub(crate) async fn call(&self, cmd: redis::Cmd) -> Result<Value, Error> {
        let mut conn = self.conn.clone();
        let run = async {
            match cmd.query_async::<Value>(&mut conn).await {
                Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                    self.script.load_async(&mut conn).await?;
                    Ok(cmd.query_async::<Value>(&mut conn).await?)
                }
                r => Ok(r?),
            }
        };
        match tokio::time::timeout(self.timeout, run).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout(self.timeout)),
        }
    }

    async fn decide(&self, key: &str, now: Option<u64>, cost: u64) -> Result<Decision, Error> {
        let v = self.call(self.check_invocation(key, now, cost)).await?;
        self.parse_check(v)
    }

    /// A check of `cost`: fast.lua's short arguments when it answers this store's checks
    /// (five instead of nine: each argument costs the server about a GET), else driver.lua's.
    pub(crate) fn check_invocation(&self, key: &str, now: Option<u64>, cost: u64) -> redis::Cmd {
        if self.fast_limit.is_none() || cost == 0 {
            return self.invocation(key, now, cost, "c");
        }
        // `tail` is ["1", code, parameters...] for one limit.
        let mut c = redis::cmd("EVALSHA");
        c.arg(self.script.get_hash())
            .arg(1)
            .arg(format!("{}{{{key}}}{}", self.prefix, self.suffixes[0]))
            .arg(&self.tail[1])
            .arg(cost)
            .arg(&self.tail[2..]);
        if let Some(n) = now {
            c.arg(n).arg(EXPLICIT_NOW_TTL_SLACK_MS);
        }
        c
    }

    /// A check's reply: fast.lua's short admission or driver.lua's decision.
    pub(crate) fn parse_check(&self, v: Value) -> Result<Decision, Error> {
        match (&v, self.fast_limit) {
            (Value::BulkString(b), Some(limit)) => parse_short(b, limit)
                .ok_or_else(|| Error::Reply(format!("{:?}", String::from_utf8_lossy(b)))),
            _ => parse(v),
        }
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
        self.uncache(key);
        self.call(self.invocation(key, None, n, "r")).await?;
        Ok(())
    }

    /// [`RedisStore::refund`] at an explicit `now`.
    pub async fn refund_at(&self, key: &str, n: u64, now: u64) -> Result<(), Error> {
        self.uncache(key);
        self.call(self.invocation(key, Some(now), n, "r")).await?;
        Ok(())
    }

    /// Checks a request of `cost` for `key`: Redis if it answers within the timeout, else the
    /// failure policy (counted in [`RedisStore::stats`]). Never fails.
    pub async fn check(&self, key: &str, cost: u64) -> Decision {
        if let Some(d) = self.cached_denial(key, cost) {
            return d;
        }
        if !self.breaker.allow() {
            self.counters
                .short_circuited
                .fetch_add(1, Ordering::Relaxed);
            return self.fallback(key, cost);
        }
        let r = self.try_check(key, cost).await;
        self.settle(key, cost, r)
    }

    /// The policy's bookkeeping after one call.
    pub(crate) fn settle(&self, key: &str, cost: u64, r: Result<Decision, Error>) -> Decision {
        // Relaxed: statistics.
        match r {
            Ok(d) => {
                self.breaker.success();
                self.counters.redis.fetch_add(1, Ordering::Relaxed);
                self.remember(key, cost, &d);
                d
            }
            Err(e) => {
                self.settle_failure(e);
                self.fallback(key, cost)
            }
        }
    }

    /// Counts a failed call and tells the breaker.
    pub(crate) fn settle_failure(&self, e: Error) {
        let backend = format_args!("store {:?}", self.prefix);
        record_failure(&self.counters, &self.breaker, &e, &backend, self.policy);
    }

    pub(crate) fn fallback(&self, key: &str, cost: u64) -> Decision {
        self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        match (&self.insurance, self.policy) {
            (Some(s), _) => s.check(key, cost),
            (None, p) => blind(p, self.limits.limits()[0].capacity()),
        }
    }

    fn remember(&self, key: &str, cost: u64, d: &Decision) {
        let (Some(cache), Some(retry)) = (&self.deny_cache, d.retry_after_ns) else {
            return;
        };
        if d.outcome != Outcome::Limited {
            return;
        }
        let until = Instant::now() + Duration::from_nanos(retry);
        // A lock on the cache: taken only with the deny cache on, beside a network round trip
        // (tens of µs) it is small; entries are per key, so a sharded map would buy little.
        let mut m = cache.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= DENY_CACHE_MAX {
            let now = Instant::now();
            m.retain(|_, e| e.0 > now);
            if m.len() >= DENY_CACHE_MAX {
                m.clear();
            }
        }
        let e = m.entry(key.to_owned()).or_insert((until, cost, *d));
        if cost <= e.1 {
            *e = (until, cost, *d);
        }
    }

    fn cached_denial(&self, key: &str, cost: u64) -> Option<Decision> {
        let cache = self.deny_cache.as_ref()?;
        let mut m = cache.lock().unwrap_or_else(|p| p.into_inner());
        let &(until, min_cost, d) = m.get(key)?;
        let now = Instant::now();
        if now >= until {
            m.remove(key);
            return None;
        }
        if cost < min_cost {
            return None;
        }
        self.counters.cached_denials.fetch_add(1, Ordering::Relaxed);
        let left = (until - now).as_nanos() as u64;
        Some(Decision {
            retry_after_ns: Some(left.max(1)),
            reset_after_ns: d.reset_after_ns.max(left),
            ..d
        })
    }

    fn uncache(&self, key: &str) {
        if let Some(c) = &self.deny_cache {
            c.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
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
        if !self.breaker.allow() {
            self.counters
                .short_circuited
                .fetch_add(keys.len() as u64, Ordering::Relaxed);
            return keys.iter().map(|k| self.fallback(k, cost)).collect();
        }
        match self.try_check_many(keys, cost).await {
            Ok(v) => {
                for (k, d) in keys.iter().zip(&v) {
                    self.remember(k, cost, d);
                }
                self.breaker.success();
                self.counters
                    .redis
                    .fetch_add(keys.len() as u64, Ordering::Relaxed);
                v
            }
            Err(e) => keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    if i == 0 {
                        self.settle(k, cost, Err(Error::Reply(e.to_string())))
                    } else {
                        self.fallback(k, cost)
                    }
                })
                .collect(),
        }
    }

    async fn many(
        &self,
        keys: &[&str],
        now: Option<u64>,
        cost: u64,
    ) -> Result<Vec<Decision>, Error> {
        if self.conn.is_cluster() {
            let calls = keys.iter().map(|k| self.decide(k, now, cost));
            return futures_util::future::join_all(calls)
                .await
                .into_iter()
                .collect();
        }
        let mut pipe = redis::pipe();
        for k in keys {
            pipe.add_command(self.check_invocation(k, now, cost));
        }
        pipe.ignore_errors();
        let mut conn = self.conn.clone();
        let run = async {
            let mut vals: Vec<Value> = pipe.query_async(&mut conn).await?;
            let noscript = |v: &Value| matches!(v, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript));
            if vals.iter().any(noscript) {
                // The script cache was lost mid-stream: load it and run the calls that did not.
                self.script.load_async(&mut conn).await?;
                let again: Vec<usize> = (0..vals.len()).filter(|&i| noscript(&vals[i])).collect();
                let mut p2 = redis::pipe();
                for &i in &again {
                    p2.add_command(self.check_invocation(keys[i], now, cost));
                }
                p2.ignore_errors();
                let redo: Vec<Value> = p2.query_async(&mut conn).await?;
                for (i, v) in again.into_iter().zip(redo) {
                    vals[i] = v;
                }
            }
            Ok::<_, Error>(vals)
        };
        let vals = match tokio::time::timeout(self.timeout, run).await {
            Ok(r) => r?,
            Err(_) => return Err(Error::Timeout(self.timeout)),
        };
        vals.into_iter().map(|v| self.parse_check(v)).collect()
    }
}

/// fast.lua's admission, "<remaining> <reset_after ns>", of a limit of `limit`.
fn parse_short(b: &[u8], limit: u64) -> Option<Decision> {
    let s = std::str::from_utf8(b).ok()?;
    let (remaining, reset) = s.split_once(' ')?;
    Some(Decision {
        outcome: Outcome::Allowed,
        limit,
        remaining: remaining.parse().ok()?,
        reset_after_ns: reset.parse().ok()?,
        retry_after_ns: None,
        delay_ns: 0,
    })
}

/// A script reply as a [`Decision`].
pub(crate) fn parse(v: Value) -> Result<Decision, Error> {
    parse_full(v).map(|(d, _)| d)
}

/// A script reply as a [`Decision`] and, after an acquire, the permit's stamp.
pub(crate) fn parse_full(v: Value) -> Result<(Decision, Option<String>), Error> {
    if let Value::ServerError(e) = v {
        return Err(Error::Redis(e.into()));
    }
    let dbg = format!("{v:?}");
    let bad = || Error::Reply(dbg.clone());
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let mut f = [0i64; 6];
    for (i, x) in f.iter_mut().enumerate() {
        let item = items.get(i).ok_or_else(bad)?;
        *x = redis::from_redis_value_ref(item).map_err(|_| bad())?;
    }
    let stamp = match items.get(6) {
        None => None,
        Some(x) => {
            let s: String = redis::from_redis_value_ref(x).map_err(|_| bad())?;
            (!s.is_empty()).then_some(s)
        }
    };
    let [o, limit, remaining, reset, retry, delay] = f;
    let outcome = match o {
        0 => Outcome::Allowed,
        1 => Outcome::Limited,
        2 => Outcome::NeverFits,
        _ => return Err(bad()),
    };
    let u = |x: i64| x.max(0) as u64;
    Ok((
        Decision {
            outcome,
            limit: u(limit),
            remaining: u(remaining),
            reset_after_ns: u(reset),
            retry_after_ns: (retry >= 0).then(|| u(retry)),
            delay_ns: u(delay),
        },
        stamp,
    ))
}
