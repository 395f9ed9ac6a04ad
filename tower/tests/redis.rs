//! The layer over a RedisStore (feature `redis`), over real loopback HTTP against a real
//! redis-server (a child process on a free port): two servers ("nodes") share one limit;
//! the answers are the usual layer's; Redis away is answered by the store's failure policy.

use axum::{routing::get, Router};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile::{Limit as Quota, Limits};
use turnstile_redis::{FailurePolicy, RedisStore};
use turnstile_tower::key::Header;
use turnstile_tower::redis::RedisLimit;
use turnstile_tower::{NoKey, Policy, RateLimitLayer};

// The one harness of the workspace's Redis tests (turnstile-redis's).
#[path = "../../redis/tests/common/mod.rs"]
mod common;
use common::Server as Redis;

async fn store(url: &str, policy: FailurePolicy) -> Arc<RedisStore> {
    let q = Quota::token_bucket(5, 1, Duration::from_secs(3600)).unwrap();
    Arc::new(
        RedisStore::builder(Limits::new(vec![q]).unwrap())
            .timeout(Duration::from_secs(2))
            .policy(policy)
            .breaker(1000, Duration::from_secs(1))
            .connect(url)
            .await
            .unwrap(),
    )
}

/// A node: an axum server on a free loopback port behind the Redis layer.
async fn node(layer: RateLimitLayer<RedisLimit<Header>>) -> SocketAddr {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    addr
}

fn layer(store: Arc<RedisStore>) -> RateLimitLayer<RedisLimit<Header>> {
    RateLimitLayer::builder(RedisLimit::new(store, Header::named("x-api-key")))
        .policy(Policy::new("per-key", None).unwrap())
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_one_limit_over_http() {
    let redis = Redis::start();
    let a = node(layer(store(&redis.url(), FailurePolicy::Closed).await)).await;
    let b = node(layer(store(&redis.url(), FailurePolicy::Closed).await)).await;
    let c = reqwest::Client::new();
    let get = |addr: SocketAddr, key: &'static str| {
        c.get(format!("http://{addr}/"))
            .header("x-api-key", key)
            .send()
    };
    // 5 an hour, spread over both nodes: 5 admitted, then 429 on either.
    for i in 0..5 {
        let r = get(if i % 2 == 0 { a } else { b }, "secret-key-1")
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "request {i}");
        let rem = r.headers()["ratelimit"].to_str().unwrap().to_string();
        assert!(rem.contains(&format!("r={}", 4 - i)), "{rem}");
    }
    for addr in [a, b] {
        let r = get(addr, "secret-key-1").await.unwrap();
        assert_eq!(r.status(), 429);
        let retry: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        // One token an hour: the next within the hour, rounded up to whole seconds.
        assert!((3590..=3600).contains(&retry), "{retry}");
    }
    // Another key has its own limit.
    assert_eq!(get(b, "secret-key-2").await.unwrap().status(), 200);
    // The keys in Redis are hashes: the API keys never appear there.
    let keys = Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "--scan"])
        .output()
        .unwrap();
    let keys = String::from_utf8_lossy(&keys.stdout);
    assert_eq!(keys.lines().count(), 2, "{keys}");
    assert!(!keys.contains("secret"), "{keys}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_away_is_answered_by_the_policy_and_no_key_by_the_setting() {
    let mut redis = Redis::start();
    let closed = node(layer(store(&redis.url(), FailurePolicy::Closed).await)).await;
    let open = node(layer(store(&redis.url(), FailurePolicy::Open).await)).await;
    let pass = node(
        RateLimitLayer::builder(RedisLimit::new(
            store(&redis.url(), FailurePolicy::Closed).await,
            Header::named("x-api-key"),
        ))
        .no_key(NoKey::PassThrough)
        .build(),
    )
    .await;
    let c = reqwest::Client::new();
    let get = |addr: SocketAddr| {
        c.get(format!("http://{addr}/"))
            .header("x-api-key", "k")
            .send()
    };
    assert_eq!(get(closed).await.unwrap().status(), 200);
    // Without the header: 500 by default, passed through when told so.
    let bare = |addr: SocketAddr| c.get(format!("http://{addr}/")).send();
    assert_eq!(bare(closed).await.unwrap().status(), 500);
    assert_eq!(bare(pass).await.unwrap().status(), 200);
    redis.kill();
    let r = get(closed).await.unwrap();
    assert_eq!(r.status(), 503, "fail closed: shed, not a limit");
    assert_eq!(get(open).await.unwrap().status(), 200, "fail open");
}

/// A shaper's delay is waited by the usual layer; a request cancelled while it waits gives its
/// cost back to Redis, so the next one is delayed as much as the cancelled one was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_shaped_request_is_refunded_in_redis() {
    use std::sync::Mutex;
    let redis = Redis::start();
    // 1 a second, burst 5, no request undelayed beyond the first: the i-th waits i seconds.
    let q = Quota::leaky_bucket(1, Duration::from_secs(1), 5, Some(0)).unwrap();
    let s = Arc::new(
        RedisStore::builder(Limits::new(vec![q]).unwrap())
            .timeout(Duration::from_secs(2))
            .connect(&redis.url())
            .await
            .unwrap(),
    );
    let delays = Arc::new(Mutex::new(Vec::new()));
    let d2 = delays.clone();
    let addr = node(
        RateLimitLayer::builder(RedisLimit::new(s, Header::named("x-api-key")))
            .on_decision(move |e| {
                if let Some(d) = e.decision {
                    d2.lock().unwrap().push(d.delay_ns);
                }
            })
            .build(),
    )
    .await;
    let c = reqwest::Client::new();
    let send = |timeout: u64| {
        c.get(format!("http://{addr}/"))
            .header("x-api-key", "k")
            .timeout(Duration::from_millis(timeout))
            .send()
    };
    assert_eq!(send(5000).await.unwrap().status(), 200);
    // Delayed about 1 s: the client gives up after 100 ms, the layer drops the wait.
    assert!(send(100).await.is_err());
    let t0 = Instant::now();
    loop {
        // The refund runs in the background: the third request is delayed about 1 s again
        // once it has landed (2 s if it never does).
        let r = send(100).await;
        assert!(r.is_err());
        let last = *delays.lock().unwrap().last().unwrap();
        if last <= 1_000_000_000 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "never refunded: {delays:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Settling through Redis: each request reserves 10 and its handler says what it used; the
/// layer settles in the background (one Redis call per request), so the test waits (bounded)
/// until Redis shows it: 4 used gives 6 back, 30 used charges 20 more, 200 used leaves a debt
/// and the next request is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_limit_settles_at_the_responses_actual_cost() {
    use axum::extract::Query;
    use std::collections::HashMap;
    use turnstile::keyed::KeyHasher;
    use turnstile_tower::redis::DEFAULT_SEED;
    use turnstile_tower::ActualCost;

    let redis = Redis::start();
    let q = Quota::fixed_window(100, Duration::from_secs(3600)).unwrap();
    let store = Arc::new(
        RedisStore::builder(Limits::new(vec![q]).unwrap())
            .timeout(Duration::from_secs(2))
            .connect(&redis.url())
            .await
            .unwrap(),
    );
    let limit = RedisLimit::new(Arc::clone(&store), Header::named("x-api-key")).cost(10);
    let used = |Query(q): Query<HashMap<String, u64>>| async move {
        (axum::Extension(ActualCost(q["used"])), "done")
    };
    let app = Router::new()
        .route("/", get(used))
        .layer(RateLimitLayer::builder(limit).settle().build());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    // The Redis key of the API key "k-1": its id under the layer's seed, in hex.
    let id = KeyHasher::with_seed(DEFAULT_SEED, 64).bytes(b"k-1");
    let key = format!("{id:016x}");
    let c = reqwest::Client::new();
    let send = |n: u64| {
        c.get(format!("http://{addr}/?used={n}"))
            .header("x-api-key", "k-1")
            .send()
    };
    let settled_to = |want: u64| {
        let (store, key) = (Arc::clone(&store), key.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let left = store.peek(&key).await.unwrap().remaining;
                if left == want || Instant::now() > deadline {
                    return left;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    assert_eq!(send(4).await.unwrap().status(), 200);
    assert_eq!(settled_to(96).await, 96);
    assert_eq!(send(30).await.unwrap().status(), 200);
    assert_eq!(settled_to(66).await, 66);
    assert_eq!(send(200).await.unwrap().status(), 200);
    assert_eq!(settled_to(0).await, 0);
    assert_eq!(send(0).await.unwrap().status(), 429);
}
