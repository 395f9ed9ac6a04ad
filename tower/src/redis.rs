//! The layer over a [`RedisStore`] (feature `redis`): many machines behind one limit.
//!
//! The layer's [`Limit`] trait answers synchronously (an in-memory check takes nanoseconds);
//! a Redis check is a network round trip. So the Redis layer is two services: an async one
//! ([`RedisRateLimit`]) that extracts the key, awaits [`RedisStore::check`] (its timeout and
//! failure policy included: it never fails) and puts the decision into the request's
//! extensions, in front of the usual [`RateLimit`] service over [`Decided`], a [`Limit`] that
//! reads it back. Everything the layer answers — headers, 429 / 503, `Retry-After`, gRPC,
//! observers, a shaper's delay and its refund on cancellation — is the usual layer's, unchanged.
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
//! use turnstile_tower::{key::PeerIp, redis::{RedisLimit, RedisRateLimitLayer}};
//!
//! let quota = Quota::sliding_window(100, Duration::from_secs(60))?;
//! let store = RedisStore::builder(Limits::new(vec![quota])?)
//!     .connect("redis://127.0.0.1:6379").await?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RedisRateLimitLayer::new(RedisLimit::new(Arc::new(store), PeerIp)));
//! # Ok(()) }
//! ```

use crate::key::{Key, KeyExtractor};
use crate::limit::{Check, Limit, NoKey};
use crate::service::{Builder, RateLimit, RateLimitLayer};
use http::request::Parts;
use http::Request;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;
use turnstile::keyed::{Key as _, KeyHasher};
use turnstile::{Decision, Outcome};
use turnstile_redis::RedisStore;

/// The seed every node hashes keys with unless told otherwise ([`RedisLimit::seed`]).
pub const DEFAULT_SEED: u64 = 0x7475_726e_7374_696c;

/// A [`RedisStore`] and a key extractor; every request costs `cost` (default 1).
pub struct RedisLimit<K> {
    store: Arc<RedisStore>,
    key: K,
    cost: u64,
    hasher: KeyHasher,
    no_key: NoKey,
}

impl<K: KeyExtractor> RedisLimit<K> {
    /// Requests keyed by `key` against `store`.
    pub fn new(store: Arc<RedisStore>, key: K) -> Self {
        Self {
            store,
            key,
            cost: 1,
            hasher: KeyHasher::with_seed(DEFAULT_SEED, 64),
            no_key: NoKey::default(),
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
    /// The answer to a request without a key (default: 500). Set here, not on the builder:
    /// the Redis check happens before the usual layer sees the request.
    pub fn no_key(mut self, n: NoKey) -> Self {
        self.no_key = n;
        self
    }
    /// The store.
    pub fn store(&self) -> &Arc<RedisStore> {
        &self.store
    }
}

/// The Redis key of key id `id`.
fn redis_key(id: u64) -> String {
    format!("{id:016x}")
}

/// What the async service decided, carried to [`Decided`] in the request's extensions.
#[derive(Clone, Copy, Debug)]
enum Verdict {
    Decided { decision: Decision, id: u64 },
    Unchecked,
    NoKey,
}

#[derive(Clone, Copy, Debug)]
struct Carried(Verdict);

/// The [`Limit`] of the usual layer behind [`RedisRateLimit`]: answers what Redis decided
/// (read from the request's extensions). A request that did not pass the async service is
/// answered as having no key.
pub struct Decided {
    store: Arc<RedisStore>,
    cost: u64,
    class: &'static str,
}

impl Limit for Decided {
    /// Nothing is counted in flight: the decision is Redis's.
    type Permit = ();
    fn check(&self, parts: &Parts, _no_key: NoKey) -> Check<()> {
        match parts.extensions.get::<Carried>() {
            Some(Carried(Verdict::Decided { decision, id })) => {
                if decision.allowed() {
                    Check::Admitted {
                        decision: *decision,
                        permit: None,
                        refund: Some((*id, self.cost)),
                    }
                } else {
                    Check::Denied {
                        decision: *decision,
                        // Redis away and the policy closed: 503, as a full in-memory store.
                        shed: decision.outcome == Outcome::StoreFull,
                        rule: None,
                    }
                }
            }
            Some(Carried(Verdict::Unchecked)) => Check::Unchecked,
            Some(Carried(Verdict::NoKey)) | None => Check::NoKey,
        }
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
    fn class(&self) -> &'static str {
        self.class
    }
}

/// Rate limiting against Redis in front of any tower service over `http` requests: the async
/// check, then the usual layer. `Clone` shares the store and the configuration.
pub struct RedisRateLimitLayer<K> {
    limit: Arc<RedisLimit<K>>,
    inner: RateLimitLayer<Decided>,
}

impl<K> Clone for RedisRateLimitLayer<K> {
    fn clone(&self) -> Self {
        Self {
            limit: Arc::clone(&self.limit),
            inner: self.inner.clone(),
        }
    }
}

impl<K: KeyExtractor> RedisRateLimitLayer<K> {
    /// A layer over `limit` with the usual defaults (IETF headers, problem+json).
    pub fn new(limit: RedisLimit<K>) -> Self {
        Self::configured(limit, |b| b)
    }

    /// A layer over `limit` whose answers `f` configures on the usual [`Builder`] (headers,
    /// policy name, body, observer, the longest shaping delay; not `no_key`, which is
    /// [`RedisLimit::no_key`]).
    pub fn configured(
        limit: RedisLimit<K>,
        f: impl FnOnce(Builder<Decided>) -> Builder<Decided>,
    ) -> Self {
        let decided = Decided {
            store: Arc::clone(&limit.store),
            cost: limit.cost,
            class: limit.key.class(),
        };
        Self {
            inner: f(RateLimitLayer::builder(decided)).build(),
            limit: Arc::new(limit),
        }
    }
}

impl<S, K> Layer<S> for RedisRateLimitLayer<K> {
    type Service = RedisRateLimit<RateLimit<S, Decided>, K>;
    fn layer(&self, inner: S) -> Self::Service {
        RedisRateLimit {
            inner: self.inner.layer(inner),
            limit: Arc::clone(&self.limit),
        }
    }
}

/// The async check in front of the usual service (from [`RedisRateLimitLayer`]).
pub struct RedisRateLimit<S, K> {
    inner: S,
    limit: Arc<RedisLimit<K>>,
}

impl<S: Clone, K> Clone for RedisRateLimit<S, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limit: Arc::clone(&self.limit),
        }
    }
}

/// The future of [`RedisRateLimit`]: the Redis round trip, then the inner call. Boxed: one
/// allocation beside a network round trip.
pub type RedisFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, K, B> Service<Request<B>> for RedisRateLimit<S, K>
where
    S: Service<Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    K: KeyExtractor,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = RedisFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // The inner service is made ready in the future, after the Redis check.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let l = &self.limit;
        let id = match l.key.extract(&parts) {
            Some(k) => Some(k.key_id(&l.hasher)),
            None => match l.no_key {
                NoKey::Error => None,
                NoKey::PassThrough => {
                    parts.extensions.insert(Carried(Verdict::Unchecked));
                    None
                }
                NoKey::Anonymous => Some(Key::Anonymous.key_id(&l.hasher)),
            },
        };
        let limit = Arc::clone(&self.limit);
        let mut inner = self.inner.clone();
        Box::pin(async move {
            if let Some(id) = id {
                let decision = limit.store.check(&redis_key(id), limit.cost).await;
                parts
                    .extensions
                    .insert(Carried(Verdict::Decided { decision, id }));
            } else if parts.extensions.get::<Carried>().is_none() {
                parts.extensions.insert(Carried(Verdict::NoKey));
            }
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            inner.call(Request::from_parts(parts, body)).await
        })
    }
}
