//! [`RedisStoreBuilder`]: a store's options, checked when it is built.

use crate::call::Caller;
use crate::conn::Conn;
use crate::deny::DenyCache;
use crate::error::Error;
use crate::layout::Layout;
use crate::plain::Plain;
use crate::policy::{insurance, FailureGate, FailurePolicy};
use crate::script::{limit_args, store_spec};
use crate::store::lease::{Leases, Tier};
use crate::store::RedisStore;
use std::sync::Arc;
use std::time::Duration;
use turnstile::{ConfigError, Limit, Limits};

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
            leases: None,
            rules_names: false,
        }
    }
}

/// Builds a [`RedisStore`].
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    pub(crate) limits: Limits,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) policy: FailurePolicy,
    pub(crate) breaker_threshold: u64,
    pub(crate) breaker_cooldown: Duration,
    pub(crate) deny_cache: bool,
    pub(crate) insurance_keys: u64,
    pub(crate) capacity: Option<u64>,
    pub(crate) plain: bool,
    pub(crate) leases: Option<Leases>,
    /// Records named as the rules on Redis name theirs (`Layout::suffixed`).
    pub(crate) rules_names: bool,
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
    /// as fields of hashes of 32 to 64 keys each, sized for `keys` live keys: about 26
    /// bytes of Redis memory per key and limit instead of 138-177 (docs/redis.md). Every
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

    /// Spends each key's quota in process between round trips, for the keys whose rate makes
    /// it worth it (default: off, every check a round trip). See [`crate::store::lease`]: reserve
    /// mode never admits over the limit; what a node holds unspent goes back to Redis when
    /// the key goes idle, when the lease ends, on [`RedisStore::return_leases`] and when the
    /// store is dropped. For window and bucket limits that do not count denials, by the
    /// function call (not [`RedisStoreBuilder::plain_commands`]); others are refused.
    pub fn leases(mut self, leases: Leases) -> Self {
        self.leases = Some(leases);
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
        let mut layout = Layout::new(&self.prefix, ls, &args, self.capacity);
        if self.rules_names {
            layout = layout.suffixed();
        }
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
        let tier = match self.leases {
            Some(_) if plain.is_some() => return Err(Error::Config(ConfigError::new(
                "leases",
                "leases run on the function call; build the store without plain_commands to lease",
            ))),
            Some(l) => Some(Arc::new(Tier::new(l, &self.limits, self.timeout)?)),
            None => None,
        };
        let backend = format!("store {:?}", self.prefix);
        let store = RedisStore {
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
            tier,
        };
        store.start_sweeper();
        Ok(store)
    }
}
