//! Costs known only from the response (tokens an LLM call took, rows a query scanned, bytes
//! sent): the check reserves an estimate, and the response settles it at the actual cost.
//!
//! Turned on by [`crate::Builder::settle`] (the handler sets an [`ActualCost`] extension on
//! its response) or [`crate::Builder::settle_with`] (a function reads the actual cost from
//! the response's head: a header, the status). The estimate is what the limit checks
//! ([`crate::StoreLimit::cost`], a [`crate::Describer::cost`] function, a
//! `RedisLimit::cost`); once the inner service has answered, the layer calls
//! [`crate::Limit::settle`] with it and the actual cost: the difference is charged (past the
//! limit the key owes it, and its next requests are refused until it is paid) or given back,
//! on every limit the reservation touched, all or nothing (one step of the key's record, one
//! settle of the engine, one Redis call). No actual cost (none set, an error, a request
//! dropped before its response): the reservation stands.
//!
//! ```
//! use axum::{body::Body, http::Request, routing::get, Router};
//! use std::{sync::Arc, time::Duration};
//! use tower::ServiceExt; // oneshot
//! use turnstile::{keyed::Store, Limit};
//! use turnstile_tower::{key::Header, ActualCost, RateLimitLayer, StoreLimit};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // 1000 tokens an hour per API key; each request reserves 100 and pays what it used.
//! let quota = Limit::fixed_window(1000, Duration::from_secs(3600)).unwrap();
//! let store = Arc::new(Store::with_capacity(quota, 100_000).unwrap());
//! let limit = StoreLimit::new(Arc::clone(&store), Header::named("x-api-key")).cost(100);
//! let app = Router::new()
//!     .route("/", get(|| async { (axum::Extension(ActualCost(30)), "used 30 tokens") }))
//!     .layer(RateLimitLayer::builder(limit).settle().build());
//!
//! let request = Request::get("/").header("x-api-key", "k-1").body(Body::empty()).unwrap();
//! assert_eq!(app.oneshot(request).await.unwrap().status(), 200);
//! assert_eq!(store.peek("k-1").remaining, 970); // 100 reserved, 70 given back
//! # }
//! ```

use std::sync::Arc;

/// The actual cost of a request, set by the handler as an extension of its response: the
/// layer settles the request's reserved cost at it ([`crate::Builder::settle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ActualCost(pub u64);

/// Reads a response's actual cost from its head; `None`: the reservation stands.
pub type SettleFn = Arc<dyn Fn(&http::response::Parts) -> Option<u64> + Send + Sync>;

/// An admitted request's reservation, kept until its response: the request's head (what an
/// engine describes again to reach the same rules), the key id and the reserved cost.
pub(crate) struct Reservation {
    pub(crate) parts: http::request::Parts,
    pub(crate) id: u64,
    pub(crate) cost: u64,
}

/// The actual cost the response's [`ActualCost`] extension gives.
pub(crate) fn by_extension(p: &http::response::Parts) -> Option<u64> {
    p.extensions.get::<ActualCost>().map(|a| a.0)
}
