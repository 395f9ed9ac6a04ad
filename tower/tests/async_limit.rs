//! A limit whose check answers with a future ([`Checking::Pending`]), as a Redis store's does,
//! through `tower::ServiceExt` with no server: the layer answers exactly as for the same check
//! made at once, and the inner service's back-pressure reaches the caller while a check waits.

use futures_util::FutureExt;
use http::{Request, Response};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::{Layer, Service, ServiceExt};
use turnstile::keyed::Store;
use turnstile::{Limit as Quota, Limits, ManualClock};
use turnstile_tower::key::Header;
use turnstile_tower::{Check, Checking, Limit, NoKey, RateLimitLayer, StoreLimit};

type Clock = Arc<ManualClock>;
type Inner = StoreLimit<Header, Clock>;

/// A store's check, answered only once `gate` gives a permit (one per check).
struct Deferred {
    inner: Inner,
    gate: Arc<Semaphore>,
}

impl Limit for Deferred {
    type Permit = ();
    type Future = Pin<Box<dyn Future<Output = Check<()>> + Send>>;
    fn check(&self, parts: &http::request::Parts, no_key: NoKey) -> Checking<(), Self::Future> {
        let check = match self.inner.check(parts, no_key) {
            Checking::Ready(c) => c,
            Checking::Pending(_) => unreachable!("a store answers at once"),
        };
        let gate = Arc::clone(&self.gate);
        Checking::Pending(Box::pin(async move {
            gate.acquire().await.expect("open").forget();
            check
        }))
    }
    fn refund(&self, parts: &http::request::Parts, id: u64, cost: u64) {
        self.inner.refund(parts, id, cost);
    }
    fn class(&self) -> &'static str {
        "deferred"
    }
}

fn store_limit() -> Inner {
    let q = Quota::fixed_window(2, Duration::from_secs(60)).unwrap();
    let store = Store::builder(Limits::new(vec![q]).unwrap())
        .capacity(100)
        .seed(1)
        .build_with_clock(Clock::new(ManualClock::new(1_000_000_000)))
        .unwrap();
    StoreLimit::new(Arc::new(store), Header::named("x-api-key"))
}

fn request(key: Option<&str>) -> Request<String> {
    let mut r = Request::builder().uri("/");
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    r.body(String::new()).unwrap()
}

async fn hello(_: Request<String>) -> Result<Response<String>, Infallible> {
    Ok(Response::new("hello".into()))
}

/// Status and every header of a response, sorted, for comparison.
fn answer<B>(r: &Response<B>) -> (u16, Vec<(String, String)>) {
    let mut h: Vec<_> = r
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    h.sort();
    (r.status().as_u16(), h)
}

#[tokio::test]
async fn a_pending_check_is_answered_as_the_same_check_made_at_once() {
    let gate = Arc::new(Semaphore::new(100));
    let now = RateLimitLayer::builder(store_limit())
        .no_key(NoKey::Error)
        .build();
    let later = RateLimitLayer::builder(Deferred {
        inner: store_limit(),
        gate: gate.clone(),
    })
    .no_key(NoKey::Error)
    .build();
    let sync = tower::service_fn(hello);
    // Admitted twice, then refused; another key; no key at all.
    for key in [Some("a"), Some("a"), Some("a"), Some("b"), None] {
        let a = now.layer(sync).oneshot(request(key)).await.unwrap();
        let b = later.layer(sync).oneshot(request(key)).await.unwrap();
        assert_eq!(answer(&a), answer(&b), "key {key:?}");
    }
    assert_eq!(gate.available_permits(), 100 - 5, "each check waited");
}

/// While a check waits, the request holds the inner service instance `poll_ready` made ready:
/// with a concurrency limit of 1 inside, the layer is not ready again until that request is
/// answered; a refusal gives the slot back as soon as it is decided.
#[tokio::test]
async fn a_waiting_check_keeps_the_inner_services_back_pressure() {
    let gate = Arc::new(Semaphore::new(0));
    let inner = tower::limit::ConcurrencyLimit::new(tower::service_fn(hello), 1);
    let layer = RateLimitLayer::new(Deferred {
        inner: store_limit(),
        gate: gate.clone(),
    });
    let mut svc = layer.layer(inner);
    svc.ready().await.unwrap();
    let first = svc.call(request(Some("k")));
    assert!(
        svc.ready().now_or_never().is_none(),
        "ready again while the first request holds the only slot"
    );
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().status(), 200);
    svc.ready().await.unwrap();
    // Two admitted, the third refused: its slot comes back with the refusal.
    assert_eq!(
        {
            gate.add_permits(1);
            svc.call(request(Some("k"))).await.unwrap().status()
        },
        200
    );
    svc.ready().await.unwrap();
    gate.add_permits(1);
    let r = svc.call(request(Some("k"))).await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(
        svc.ready().now_or_never().is_some(),
        "the refused request's slot is free again"
    );
}
