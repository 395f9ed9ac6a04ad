//! A [`RedisStore`] behind the layer (feature `redis`): many machines behind one limit.
//!
//! [`RedisLimit`] is one more [`Limit`]: its check is a network round trip, so it answers with
//! a future ([`Checking::Pending`]), which the layer's response future awaits before it answers
//! as for any other limit — headers, 429 / 503, `Retry-After`, gRPC, observers, a shaper's
//! delay and its refund on cancellation. [`RedisStore::check`] applies its own timeout and
//! failure policy: the check never fails. Meanwhile the request holds the inner service it was
//! admitted to by `poll_ready`, so the inner service's back-pressure holds.
//!
//! Leases: a store built with [`turnstile_redis::RedisStoreBuilder::leases`] answers the keys
//! it holds leases for in process ([`RedisStore::check_local`]): such a check is decided at
//! once ([`Checking::Ready`]), without the boxed future and the round trip; other keys are
//! checked in Redis as without leases.
//!
//! Keys: the extractor's [`Key`](crate::Key) becomes a key id through a [`KeyHasher`] with a
//! fixed seed (every node must hash alike: the same [`RedisLimit::seed`] everywhere), and the
//! Redis key is that id in hex. Texts (API keys, tokens) thus never appear in Redis.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use axum::{routing::get, Router};
//! use turnstile::{Limit as Quota, Limits};
//! use turnstile_redis::RedisStore;
//! use turnstile_tower::{key::PeerIp, redis::RedisLimit, RateLimitLayer};
//!
//! let quota = Quota::sliding_window(100, Duration::from_secs(60))?;
//! let store = RedisStore::builder(Limits::new(vec![quota])?)
//!     .connect("redis://127.0.0.1:6379").await?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(RedisLimit::new(Arc::new(store), PeerIp)));
//! # Ok(()) }
//! ```

use crate::key::KeyExtractor;
use crate::limit::{key_id, store_check, Check, Checking, Limit, NoKey};
use http::request::Parts;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use turnstile::keyed::KeyHasher;
use turnstile_redis::RedisStore;

/// The seed every node hashes keys with unless told otherwise ([`RedisLimit::seed`]).
pub const DEFAULT_SEED: u64 = 0x7475_726e_7374_696c;

/// A [`RedisStore`] and a key extractor; every request costs `cost` (default 1).
pub struct RedisLimit<K> {
    store: Arc<RedisStore>,
    key: K,
    cost: u64,
    hasher: KeyHasher,
}

impl<K: KeyExtractor> RedisLimit<K> {
    /// Requests keyed by `key` against `store`.
    pub fn new(store: Arc<RedisStore>, key: K) -> Self {
        Self {
            store,
            key,
            cost: 1,
            hasher: KeyHasher::with_seed(DEFAULT_SEED, 64),
        }
    }
    /// Each request costs `cost`.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }
    /// The seed keys are hashed with, and the prefix IPv6 addresses are grouped by: the same on
    /// every node sharing the store (default [`DEFAULT_SEED`], /64).
    pub fn seed(mut self, seed: u64, ipv6_prefix: u8) -> Self {
        self.hasher = KeyHasher::with_seed(seed, ipv6_prefix);
        self
    }
    /// The store.
    pub fn store(&self) -> &Arc<RedisStore> {
        &self.store
    }
}

/// The Redis key of key id `id`: its 16 hex digits, on the stack.
struct RedisKey([u8; 16]);

impl RedisKey {
    fn of(id: u64) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut b = [0u8; 16];
        for (i, d) in b.iter_mut().enumerate() {
            *d = HEX[(id >> (60 - 4 * i)) as usize & 15];
        }
        RedisKey(b)
    }

    fn as_str(&self) -> &str {
        // Hex digits are ASCII.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// The Redis key of key id `id`.
fn redis_key(id: u64) -> String {
    RedisKey::of(id).as_str().to_owned()
}

/// The future of a Redis check. Boxed: one allocation beside a network round trip.
pub type RedisCheck = Pin<Box<dyn Future<Output = Check<()>> + Send>>;

impl<K: KeyExtractor> Limit for RedisLimit<K> {
    /// Nothing is counted in flight: the decision is Redis's.
    type Permit = ();
    type Future = RedisCheck;
    fn check(&self, parts: &Parts, no_key: NoKey) -> Checking<(), RedisCheck> {
        let id = match key_id(&self.key, parts, no_key, &self.hasher) {
            Ok(id) => id,
            Err(answer) => return Checking::Ready(answer),
        };
        // A leased key (a store built with leases) is answered here: no future, no
        // allocation, no round trip.
        if let Some(d) = self.store.check_local(RedisKey::of(id).as_str(), self.cost) {
            return Checking::Ready(store_check(d, id, self.cost));
        }
        let (store, cost) = (Arc::clone(&self.store), self.cost);
        Checking::Pending(Box::pin(async move {
            store_check(store.check(&redis_key(id), cost).await, id, cost)
        }))
    }
    /// A shaped request cancelled while it waited: its cost goes back to Redis (in the
    /// background: `Drop` cannot await).
    fn refund(&self, _parts: &Parts, id: u64, cost: u64) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(&self.store);
            rt.spawn(async move {
                let _ = store.refund(&redis_key(id), cost).await;
            });
        }
    }
    /// [`RedisStore::settle`] (one call, every limit of the key; through the key's lease
    /// when the store has leases), in the background: the response does not wait for it.
    fn settle(&self, _parts: &Parts, id: u64, reserved: u64, actual: u64) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(&self.store);
            rt.spawn(async move {
                let _ = store.settle(&redis_key(id), reserved, actual).await;
            });
        }
    }
    fn class(&self) -> &'static str {
        self.key.class()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_key_is_the_ids_hex() {
        for id in [0u64, 1, 0xdead_beef, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(RedisKey::of(id).as_str(), format!("{id:016x}"));
        }
    }
}
