//! # turnstile-redis
//!
//! turnstile's algorithms on Redis and Redis Cluster, for limits that many machines share.
//!
//! ```no_run
//! use std::time::Duration;
//! use turnstile::{Limit, Limits};
//! use turnstile_redis::{FailurePolicy, RedisStore};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // 15 requests per second per customer, shared by every process using this Redis.
//!     let limits = Limits::new(vec![Limit::token_bucket(15, 15, Duration::from_secs(1))?])?;
//!     let store = RedisStore::builder(limits)
//!         .prefix("api:")
//!         .timeout(Duration::from_millis(20))                // then the policy answers
//!         .policy(FailurePolicy::Insurance { expected_nodes: 4 }) // in memory at 15 / 4
//!         .connect("redis://127.0.0.1:6379")                 // or .connect_cluster(&[...])
//!         .await?;
//!     let d = store.check("customer-a", 1).await; // never fails: the policy answers for Redis
//!     if !d.allowed() {
//!         println!("429, Retry-After: {:?}", d.retry_after());
//!     }
//!     Ok(())
//! }
//! ```
//!
//! * [`RedisStore`] takes the same [`turnstile::Limits`] as the in-memory
//!   `turnstile::keyed::Store` and answers the same [`turnstile::Decision`]s: every decision is
//!   one call of a Redis Functions library (`FCALL`; the library loaded again when Redis lost
//!   it), several limits on one key all-or-nothing in that one call, their keys sharing the
//!   `{hash tag}` of the key so that they live in one Cluster slot.
//! * One clock: the script reads the server's `TIME`, so machines with skewed clocks agree.
//!   [`RedisStore::check_at`] passes an explicit `now` instead, for tests that run one trace
//!   through Redis and through the in-memory engine.
//! * Opt-in, for one fixed or sliding window:
//!   [`RedisStoreBuilder::plain_commands`] decides by plain commands (`MULTI; INCRBY; PEXPIRE
//!   … NX; EXEC` on a key per window, envoyproxy/ratelimit's way) at about a quarter of a
//!   script call's cost in Redis, with the window picked by the caller's clock.
//! * Every algorithm: fixed and sliding window, token and leaky bucket (strings), sliding_log
//!   (a sorted set of admission times), window_ring (a packed string of sub-window counters),
//!   concurrency (a sorted set of leases; [`RedisStore::acquire_owned`] and [`RedisPermit`]).
//! * Every key carries a TTL equal to the time until it is equivalent to absent.
//! * When Redis is slow or down: a per-call timeout (default 20 ms), then a
//!   [`FailurePolicy`] (open, closed, or an in-memory insurance limiter at limit ÷ nodes),
//!   behind a circuit breaker; every fallback counted ([`FailureStats`]).
//!
//! * Leases ([`RedisStoreBuilder::leases`], [`lease`]): the keys whose rate makes it pay are
//!   spent in process between round trips, from a bounded lock-free table; reserve mode never
//!   admits over the limits.
//! * The rules engine's counts in Redis: [`RedisRules`] executes the engine's plans (a rules
//!   file's `[backend] redis = "..."`), one function call per request on one node.
//!
//! See `docs/redis.md`.

#![warn(missing_docs)]

mod builder;
mod call;
mod conn;
mod deny;
mod error;
mod layout;
pub mod limits;
mod permit;
mod plain;
mod policy;
mod reply;
pub mod rules;
mod script;
mod store;

pub use builder::RedisStoreBuilder;
pub use call::enable_call_spans;
pub use conn::Conn;
pub use error::Error;
pub use limits::{RedisLimits, RedisLimitsStats};
pub use permit::RedisPermit;
pub use plain::PLAIN_CLOCK_SLACK_MS;
pub use policy::{FailurePolicy, FailureStats};
pub use rules::{RedisRules, UnconnectedRules};
pub use script::EXPLICIT_NOW_TTL_SLACK_MS;
pub use script::{max_limit, MAX_CALL_US, MAX_DURATION_NS, MAX_ZSET_DURATION_NS};
pub use store::lease;
pub use store::lease::{LeaseMode, LeaseStats, Leases};
pub use store::RedisStore;
