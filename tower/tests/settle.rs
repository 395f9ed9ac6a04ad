//! Settling over real loopback HTTP: an axum server on 127.0.0.1:0 and a real client. Each
//! request reserves an estimate (10) and its handler says what it actually cost (`?used=N`):
//! an over-estimate gives the difference back, an under-estimate charges it (past the limit:
//! a debt, and the next requests are refused), a response without an actual cost keeps the
//! reservation — for a keyed store (an `ActualCost` extension) and for a rules engine (a
//! response header read by `settle_with`). Stores and engines run on a `ManualClock`.

use axum::extract::Query;
use axum::response::IntoResponse;
use axum::{routing::get, Extension, Router};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::rules::{Engine, Request, Rules};
use turnstile::{Limit as Quota, Limits, ManualClock};
use turnstile_tower::key::Header;
use turnstile_tower::{ActualCost, Describer, EngineLimit, IpSource, RateLimitLayer, StoreLimit};

type Clock = Arc<ManualClock>;

/// The estimate every request reserves.
const ESTIMATE: u64 = 10;

async fn serve(app: Router) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(l, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap()
    });
    addr
}

/// `?used=N`: the response says it cost N (an extension and an `x-used` header); without
/// it, nothing.
async fn work(Query(q): Query<HashMap<String, u64>>) -> axum::response::Response {
    match q.get("used") {
        Some(&n) => (
            Extension(ActualCost(n)),
            [("x-used", n.to_string())],
            "done",
        )
            .into_response(),
        None => "done".into_response(),
    }
}

async fn get_status(c: &reqwest::Client, url: &str) -> u16 {
    c.get(url)
        .header("x-api-key", "k-1")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The path of one test: a request using `used` (None: no actual cost), then what is left.
async fn steps(url: &str, left: impl Fn() -> u64) {
    let c = reqwest::Client::new();
    // Over-estimated: 10 reserved, 4 used, 6 given back.
    assert_eq!(get_status(&c, &format!("{url}/?used=4")).await, 200);
    assert_eq!(left(), 96);
    // Under-estimated: 10 reserved, 30 used, 20 more charged.
    assert_eq!(get_status(&c, &format!("{url}/?used=30")).await, 200);
    assert_eq!(left(), 66);
    // Exactly: nothing changes beyond the reservation.
    assert_eq!(get_status(&c, &format!("{url}/?used=10")).await, 200);
    assert_eq!(left(), 56);
    // No actual cost: the reservation stands.
    assert_eq!(get_status(&c, &format!("{url}/")).await, 200);
    assert_eq!(left(), 46);
    // Far under-estimated: 10 reserved, 100 used: past the limit, a debt.
    assert_eq!(get_status(&c, &format!("{url}/?used=100")).await, 200);
    assert_eq!(left(), 0);
    // Refused until the window ends (nothing reserved, nothing settled).
    assert_eq!(get_status(&c, &format!("{url}/?used=0")).await, 429);
    assert_eq!(left(), 0);
}

#[tokio::test]
async fn a_store_settles_at_the_responses_actual_cost() {
    let clock: Clock = Arc::new(ManualClock::new(0));
    let q = Quota::fixed_window(100, Duration::from_secs(3600)).unwrap();
    let store = Arc::new(
        Store::builder(Limits::new(vec![q]).unwrap())
            .capacity(100)
            .build_with_clock(clock.clone())
            .unwrap(),
    );
    let limit = StoreLimit::new(Arc::clone(&store), Header::named("x-api-key")).cost(ESTIMATE);
    let app = Router::new()
        .route("/", get(work))
        .layer(RateLimitLayer::builder(limit).settle().build());
    let addr = serve(app).await;
    steps(&format!("http://{addr}"), || store.peek("k-1").remaining).await;
    // The debt ends with the window.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(store.peek("k-1").remaining, 100);
}

#[tokio::test]
async fn an_engine_settles_every_rule_at_the_actual_cost_a_header_gives() {
    let clock: Clock = Arc::new(ManualClock::new(0));
    let rules = Rules::parse(
        r#"
[[rule]]
name = "tokens"
key = "api_key"
limits = [{ algorithm = "fixed_window", limit = 100, window = "1h" }]

[[rule]]
name = "route-tokens"
key = "route"
limits = [{ algorithm = "sliding_window", limit = 1000, window = "1h" }]
"#,
        "rules.toml",
    )
    .unwrap();
    let engine = Arc::new(Engine::builder(rules).build_with_clock(clock).unwrap());
    let describe = Describer::new()
        .ip(IpSource::None)
        .api_key(http::HeaderName::from_static("x-api-key"))
        .cost(|_| ESTIMATE);
    let limit = EngineLimit::new(Arc::clone(&engine), describe);
    let layer = RateLimitLayer::builder(limit)
        .settle_with(|head| head.headers.get("x-used")?.to_str().ok()?.parse().ok())
        .build();
    let app = Router::new().route("/", get(work)).layer(layer);
    let addr = serve(app).await;
    // A peek (cost 0): the least remaining of the rules the request matches ("tokens").
    let peek = |api_key: Option<&'static str>| {
        let mut req = Request::new().route("/").method("GET");
        req.api_key = api_key;
        req.cost = 0;
        engine.explain(&req).decision.remaining
    };
    steps(&format!("http://{addr}"), || peek(Some("k-1"))).await;
    // The other rule the reservations touched (keyed by route alone) was settled alike: 154
    // taken of 1000 (the refused request took nothing).
    assert_eq!(peek(None), 1000 - (4 + 30 + 10 + 10 + 100));
}
