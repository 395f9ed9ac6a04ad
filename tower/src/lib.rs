//! # turnstile-tower
//!
//! Rate limiting for axum, tonic and any tower service over `http` requests, on the turnstile
//! engine: one keyed [`Store`](turnstile::keyed::Store) and a key extractor, or a rules
//! [`Engine`](turnstile::rules::Engine) that decides per customer, IP, API key, route, method
//! and priority.
//!
//! * **Keys** ([`key`]): global, the peer IP, the client IP behind trusted proxies (the
//!   rightmost untrusted address of `Forwarded`, `X-Forwarded-For` or `X-Real-IP`, see
//!   [`ip`]), a header, a bearer token, an extension, the matched route and method, a closure.
//! * **Answers** ([`answer`]): 429 over a limit, 503 when shed, `Retry-After` in whole seconds
//!   rounded up (≥ 1); rate-limit headers in draft-ietf-httpapi-ratelimit-headers-10's form,
//!   `RateLimit-*` or `X-RateLimit-*` ([`write_headers`], usable without the layer); a
//!   problem+json or text body or the application's own; over gRPC, `RESOURCE_EXHAUSTED` with
//!   the retry time in metadata.
//! * **Permits**: an engine's in-flight permit is owned by the response body until it ends or
//!   is dropped ([`RateLimitBody`]).
//! * **Shaping**: a leaky-bucket shaper's delay is waited (bounded), and refunded if the
//!   request is cancelled while it waits.
//! * **Settling** ([`settle`]): a request reserves an estimated cost, and its response settles
//!   it at the actual one (an [`ActualCost`] extension, or [`Builder::settle_with`]): the
//!   difference charged or given back on every limit the reservation touched.
//!
//! ```
//! use axum::{body::Body, http::Request, routing::get, Router};
//! use std::{sync::Arc, time::Duration};
//! use tower::ServiceExt; // oneshot
//! use turnstile::{keyed::Store, Limit};
//! use turnstile_tower::{key::Header, RateLimitLayer, StoreLimit};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // 2 requests a minute per API key, room for 100 000 keys.
//! let store = Store::with_capacity(Limit::fixed_window(2, Duration::from_secs(60)).unwrap(), 100_000);
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(StoreLimit::new(Arc::new(store.unwrap()), Header::named("x-api-key"))));
//!
//! for expected in [200, 200, 429] {
//!     let request = Request::get("/").header("x-api-key", "k-1").body(Body::empty()).unwrap();
//!     let response = app.clone().oneshot(request).await.unwrap();
//!     assert_eq!(response.status(), expected);
//!     assert!(response.headers().contains_key("ratelimit-policy"));
//! }
//! # }
//! ```
//!
//! A server keys by the client's address instead with [`PeerIp`] (served with
//! `into_make_service_with_connect_info::<SocketAddr>()`) or [`ClientIp`] behind trusted
//! proxies; `cargo run --release -p turnstile-tower --example axum` runs one (docs/tower.md).

// No unsafe code in a default build; `unsafe-fast-headers` allows one block (headers.rs).
#![cfg_attr(not(feature = "unsafe-fast-headers"), forbid(unsafe_code))]
#![cfg_attr(feature = "unsafe-fast-headers", deny(unsafe_code))]
#![warn(missing_docs)]

pub mod answer;
mod body;
mod headers;
pub mod ip;
pub mod key;
mod limit;
pub mod observe;
#[cfg(feature = "redis")]
pub mod redis;
mod service;
pub mod settle;

pub use answer::{write_headers, BodyStyle, Denial, HeaderStyle, Policy};
pub use body::RateLimitBody;
pub use ip::{ProxyHeader, TrustedProxies};
pub use key::{ClientIp, Key, KeyExtractor, PeerIp};
pub use limit::{
    is_shed, retry_after_secs, Check, Checking, Describe, Describer, EngineLimit, IpSource, Limit,
    Never, NoKey, StoreLimit,
};
pub use service::{Builder, Config, RateLimit, RateLimitLayer, ResponseFuture};
pub use settle::ActualCost;
