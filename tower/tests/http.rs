//! The layer over real loopback HTTP: an axum (or tonic) server on 127.0.0.1:0 and a real
//! client. Stores and engines run on a `ManualClock`: no test sleeps to let a limit pass.

use axum::{routing::get, Router};
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::rules::{Engine, Rules};
use turnstile::{Decision, Limit as Quota, Limits, ManualClock, Outcome};
use turnstile_tower::key::{Global, Header};
use turnstile_tower::observe::{Answer, Event};
use turnstile_tower::{
    ClientIp, Describer, EngineLimit, HeaderStyle, IpSource, NoKey, Policy, ProxyHeader,
    RateLimitLayer, StoreLimit, TrustedProxies,
};

type Clock = Arc<ManualClock>;

fn store(q: Quota, clock: &Clock) -> Arc<Store<Clock>> {
    Arc::new(
        Store::builder(Limits::new(vec![q]).unwrap())
            .capacity(1000)
            .seed(1)
            .build_with_clock(clock.clone())
            .unwrap(),
    )
}

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

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

/// Decisions the layer made, in order.
type Seen = Arc<Mutex<Vec<(Answer, Option<Decision>)>>>;

fn recorder() -> (Seen, impl Fn(&Event<'_>) + Send + Sync + 'static) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    (seen, move |e: &Event<'_>| {
        s.lock().unwrap().push((e.answer, e.decision.copied()));
    })
}

fn h<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

fn secs_up(ns: u64) -> u64 {
    ns.div_ceil(1_000_000_000)
}

/// Every header value is what the decision behind it says; the 4th request of 3 a minute is a
/// 429 whose Retry-After, once waited out (on the manual clock), gives a 200 again.
#[tokio::test]
async fn headers_match_the_decision_and_retry_after_is_honest() {
    let clock = Clock::new(ManualClock::new(1_000_000_000));
    let s = store(
        Quota::fixed_window(3, Duration::from_secs(60)).unwrap(),
        &clock,
    );
    let (seen, rec) = recorder();
    let layer = RateLimitLayer::builder(StoreLimit::new(s, Header::named("x-api-key")))
        .policy(Policy::new("per-key", Some(Duration::from_secs(60))).unwrap())
        .on_decision(rec)
        .build();
    let addr = serve(hello().layer(layer)).await;
    let c = reqwest::Client::new();
    let url = format!("http://{addr}/");
    let send = || c.get(&url).header("x-api-key", "k1").send();
    for i in 0..4 {
        clock.advance(Duration::from_millis(1500));
        let r = send().await.unwrap();
        let (answer, d) = seen.lock().unwrap()[i];
        let d = d.unwrap();
        assert_eq!(h(&r, "ratelimit-policy"), Some("\"per-key\";q=3;w=60"));
        if i < 3 {
            assert_eq!(answer, Answer::Admitted);
            assert_eq!(r.status(), 200);
            assert_eq!(d.remaining, 2 - i as u64);
            let want = format!(
                "\"per-key\";r={};t={}",
                d.remaining,
                secs_up(d.reset_after_ns)
            );
            assert_eq!(h(&r, "ratelimit"), Some(want.as_str()));
            assert_eq!(h(&r, "retry-after"), None);
            assert_eq!(r.text().await.unwrap(), "hello");
        } else {
            assert_eq!(answer, Answer::Limited);
            assert_eq!(r.status(), 429);
            let retry = secs_up(d.retry_after_ns.unwrap()).max(1);
            assert_eq!(h(&r, "retry-after"), Some(retry.to_string().as_str()));
            let want = format!("\"per-key\";r=0;t={retry}");
            assert_eq!(h(&r, "ratelimit"), Some(want.as_str()));
            assert_eq!(h(&r, "content-type"), Some("application/problem+json"));
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["status"], 429);
            assert_eq!(body["title"], "Too Many Requests");
            assert_eq!(body["violated-policies"][0], "per-key");
            assert_eq!(body["retry_after"], retry);
            // One nanosecond early is still refused; Retry-After itself is admitted.
            clock.advance(Duration::from_secs(retry) - Duration::from_nanos(1));
            assert!(d.retry_after_ns.unwrap() > Duration::from_secs(retry - 1).as_nanos() as u64);
            clock.advance(Duration::from_nanos(1));
            let r = send().await.unwrap();
            assert_eq!(r.status(), 200, "after Retry-After");
        }
    }
    // Another key is not affected.
    let r = c.get(&url).header("x-api-key", "k2").send().await.unwrap();
    assert_eq!(r.status(), 200);
    // No key: 500 by default.
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 500);
}

/// The two older header forms, and the text body.
#[tokio::test]
async fn older_header_forms_and_text_body() {
    let clock = Clock::new(ManualClock::new(0));
    for (style, prefix) in [
        (HeaderStyle::RateLimit, "ratelimit-"),
        (HeaderStyle::XRateLimit, "x-ratelimit-"),
    ] {
        let s = store(
            Quota::fixed_window(1, Duration::from_secs(10)).unwrap(),
            &clock,
        );
        let layer = RateLimitLayer::builder(StoreLimit::new(s, Global))
            .headers(style)
            .body(turnstile_tower::BodyStyle::Text)
            .build();
        let addr = serve(hello().layer(layer)).await;
        let url = format!("http://{addr}/");
        let r = reqwest::get(&url).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(h(&r, &format!("{prefix}limit")), Some("1"));
        assert_eq!(h(&r, &format!("{prefix}remaining")), Some("0"));
        assert_eq!(h(&r, &format!("{prefix}reset")), Some("10"));
        let r = reqwest::get(&url).await.unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(h(&r, "retry-after"), Some("10"));
        assert_eq!(h(&r, &format!("{prefix}reset")), Some("10"));
        assert!(r.text().await.unwrap().starts_with("Too Many Requests: "));
    }
}

/// The client IP: `X-Forwarded-For` from a peer that is not a trusted proxy is ignored (every
/// request counts under the peer), the same header through a trusted proxy picks the key.
#[tokio::test]
async fn forwarded_for_counts_only_through_a_trusted_proxy() {
    let clock = Clock::new(ManualClock::new(0));
    for (trusted, separate) in [("10.0.0.0/8", false), ("127.0.0.0/8", true)] {
        let s = store(
            Quota::fixed_window(1, Duration::from_secs(60)).unwrap(),
            &clock,
        );
        let key = ClientIp::new(TrustedProxies::parse([trusted]).unwrap());
        let addr = serve(hello().layer(RateLimitLayer::new(StoreLimit::new(s.clone(), key)))).await;
        let c = reqwest::Client::new();
        let url = format!("http://{addr}/");
        let xff = |v: &'static str| c.get(&url).header("x-forwarded-for", v).send();
        assert_eq!(xff("1.2.3.4").await.unwrap().status(), 200);
        let other = xff("5.6.7.8").await.unwrap().status();
        assert_eq!(other == 200, separate, "trusting {trusted}");
        // The spoofed left part is never the key: the rightmost untrusted address is.
        let spoof = xff("1.1.1.1, 5.6.7.8").await.unwrap().status();
        assert_eq!(spoof, 429, "trusting {trusted}");
        if separate {
            assert_eq!(s.len(), 2, "keys 1.2.3.4 and 5.6.7.8");
        } else {
            assert_eq!(s.len(), 1, "the peer only");
        }
    }
    // Forwarded (RFC 7239), with a port and an IPv6 address.
    let s = store(
        Quota::fixed_window(1, Duration::from_secs(60)).unwrap(),
        &clock,
    );
    let key =
        ClientIp::new(TrustedProxies::parse(["127.0.0.1"]).unwrap()).header(ProxyHeader::Forwarded);
    let addr = serve(hello().layer(RateLimitLayer::new(StoreLimit::new(s, key)))).await;
    let c = reqwest::Client::new();
    let url = format!("http://{addr}/");
    let fwd = |v: &'static str| c.get(&url).header("forwarded", v).send();
    assert_eq!(
        fwd("for=\"[2001:db8::1]:4711\"").await.unwrap().status(),
        200
    );
    assert_eq!(
        fwd("for=\"[2001:db8::2]:1\"").await.unwrap().status(),
        429,
        "one /64"
    );
    assert_eq!(fwd("for=192.0.2.1;proto=http").await.unwrap().status(), 200);
}

/// Two clones of one layer (two servers) count in one store.
#[tokio::test]
async fn clones_share_one_store() {
    let clock = Clock::new(ManualClock::new(0));
    let s = store(
        Quota::fixed_window(3, Duration::from_secs(60)).unwrap(),
        &clock,
    );
    let layer = RateLimitLayer::new(StoreLimit::new(s, Global));
    let a = serve(hello().layer(layer.clone())).await;
    let b = serve(hello().layer(layer)).await;
    let mut codes = Vec::new();
    for addr in [a, b, a, b] {
        codes.push(
            reqwest::get(format!("http://{addr}/"))
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(codes, [200, 200, 200, 429]);
}

fn engine(text: &str, clock: &Clock) -> Arc<Engine<Clock>> {
    let rules = Rules::parse(text, "test").unwrap();
    Arc::new(
        Engine::builder(rules)
            .seed(1)
            .build_with_clock(clock.clone())
            .unwrap(),
    )
}

/// Hot reload of the rules file changes the limit of the next request.
#[tokio::test]
async fn hot_reload_changes_the_limit() {
    let clock = Clock::new(ManualClock::new(0));
    let rule = |n: u32| {
        format!(
            "[[rule]]\nname = \"per-ip\"\nkey = \"ip\"\nlimits = [{{ algorithm = \"fixed_window\", limit = {n}, window = \"1m\" }}]\n"
        )
    };
    let dir = std::env::temp_dir().join(format!("turnstile-tower-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.toml");
    std::fs::write(&file, rule(2)).unwrap();
    let e = Arc::new(
        Engine::builder(Rules::from_file(&file).unwrap())
            .build_with_clock(clock.clone())
            .unwrap(),
    );
    let layer = RateLimitLayer::new(EngineLimit::new(e.clone(), Describer::new()));
    let addr = serve(hello().layer(layer)).await;
    let url = format!("http://{addr}/");
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(reqwest::get(&url).await.unwrap().status().as_u16());
    }
    assert_eq!(codes, [200, 200, 429]);
    std::fs::write(&file, rule(5)).unwrap();
    e.reload_file(&file).unwrap();
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status(), 200, "the new limit applies at once");
    assert_eq!(h(&r, "ratelimit-policy"), Some("\"default\";q=5"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A streaming response holds its in-flight permit until the client goes away mid-stream;
/// while it is held, shedding answers 503 with Retry-After; once the client disconnects the
/// permit is back.
#[tokio::test]
async fn a_disconnected_stream_releases_its_permit() {
    let clock = Clock::new(ManualClock::new(0));
    let e = engine(
        r#"
[load]
max_in_flight = 1
[shedding]
retry_after = "2s"
get = { on = 1.0, off = 0.5 }
[[rule]]
name = "all"
key = "global"
limits = [{ algorithm = "fixed_window", limit = 1000, window = "1m" }]
"#,
        &clock,
    );
    let app = Router::new()
        .route(
            "/stream",
            get(|| async {
                // A body that sends one chunk and then never ends.
                let s = futures_util::stream::once(async {
                    Ok::<_, std::io::Error>(Bytes::from_static(b"first"))
                })
                .chain(futures_util::stream::pending());
                axum::body::Body::from_stream(s)
            }),
        )
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(EngineLimit::new(
            e.clone(),
            Describer::new(),
        )));
    let addr = serve(app).await;
    let mut r = reqwest::get(format!("http://{addr}/stream")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.chunk().await.unwrap().unwrap(), "first");
    assert_eq!(e.in_flight(), 1, "held while the body streams");
    let shed = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(shed.status(), 503);
    assert_eq!(h(&shed, "retry-after"), Some("2"));
    drop(r);
    // The server notices the closed connection asynchronously: wait for it, bounded.
    for _ in 0..2000 {
        if e.in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(e.in_flight(), 0, "released when the client went away");
    let ok = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.text().await.unwrap(), "hello");
    assert_eq!(e.in_flight(), 0, "a finished body releases it too");
}

use futures_util::StreamExt as _;

/// A client that gives up before the handler answers: hyper drops the response future, and
/// with it the permit the future held (no body was ever made).
#[tokio::test]
async fn a_cancelled_handler_releases_its_permit() {
    let clock = Clock::new(ManualClock::new(0));
    let e = engine(
        r#"
[[rule]]
name = "all"
key = "global"
limits = [{ algorithm = "fixed_window", limit = 1000, window = "1m" }]
"#,
        &clock,
    );
    let app = Router::new()
        .route("/never", get(std::future::pending::<&'static str>))
        .layer(RateLimitLayer::new(EngineLimit::new(
            e.clone(),
            Describer::new(),
        )));
    let addr = serve(app).await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let wait = c.get(format!("http://{addr}/never")).send();
    let watch = async {
        // In flight while the handler runs (bounded wait for the request to arrive).
        for _ in 0..2000 {
            if e.in_flight() == 1 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        false
    };
    let (r, held) = tokio::join!(wait, watch);
    assert!(held, "the permit is held while the handler runs");
    assert!(r.unwrap_err().is_timeout());
    for _ in 0..2000 {
        if e.in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(e.in_flight(), 0, "released when the handler was dropped");
}

/// A per-route limit under a global one: the IETF fields list both policies (the inner
/// layer's first), each with the values of its own decision.
#[tokio::test]
async fn nested_layers_list_every_policy() {
    let clock = Clock::new(ManualClock::new(0));
    let route = store(
        Quota::fixed_window(2, Duration::from_secs(60)).unwrap(),
        &clock,
    );
    let global = store(
        Quota::fixed_window(100, Duration::from_secs(3600)).unwrap(),
        &clock,
    );
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route_layer(
            RateLimitLayer::builder(StoreLimit::new(route, Global))
                .policy(Policy::new("route", Some(Duration::from_secs(60))).unwrap())
                .build(),
        )
        .layer(
            RateLimitLayer::builder(StoreLimit::new(global, Global))
                .policy(Policy::new("global", Some(Duration::from_secs(3600))).unwrap())
                .build(),
        );
    let addr = serve(app).await;
    let url = format!("http://{addr}/");
    let all = |r: &reqwest::Response, name: &str| -> Vec<String> {
        r.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    };
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        all(&r, "ratelimit-policy"),
        ["\"route\";q=2;w=60", "\"global\";q=100;w=3600"]
    );
    assert_eq!(
        all(&r, "ratelimit"),
        ["\"route\";r=1;t=60", "\"global\";r=99;t=3600"]
    );
    reqwest::get(&url).await.unwrap();
    // The route's limit refuses the third; the refusal still passes the global layer.
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        all(&r, "ratelimit"),
        ["\"route\";r=0;t=60", "\"global\";r=97;t=3600"]
    );
}

/// A shaped request (leaky bucket shaper) waits out its delay; if the client gives up while
/// it waits, its cost is given back: the next request is delayed as long as it was, not
/// twice as long.
#[tokio::test]
async fn a_cancelled_shaped_request_refunds_its_cost() {
    let clock = Clock::new(ManualClock::new(0));
    // 1 per hour, burst 10, no request undelayed beyond the first: the second waits 1 h.
    let s = store(
        Quota::leaky_bucket(1, Duration::from_secs(3600), 10, Some(0)).unwrap(),
        &clock,
    );
    let (seen, rec) = recorder();
    let layer = RateLimitLayer::builder(StoreLimit::new(s.clone(), Global))
        .max_delay(Duration::from_secs(7200))
        .on_decision(rec)
        .build();
    let addr = serve(hello().layer(layer)).await;
    let url = format!("http://{addr}/");
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
    let global = u64::MAX; // Key::Global's id
    let after_first = s.peek(&global).remaining;
    three_cancelled_waits(&url, &seen, "refunded", || {
        s.peek(&global).remaining == after_first
    })
    .await;
}

/// After one admitted request, three clients give up on requests a shaper delays by 1 h.
/// `gone` says the server has dropped a cancelled wait (it sees the disconnect
/// asynchronously: waited for, bounded; `what` names it). Each cancelled wait must have
/// given its cost back: each next request is delayed 1 h, not 2, 3 or 4.
async fn three_cancelled_waits(url: &str, seen: &Seen, what: &str, gone: impl Fn() -> bool) {
    let c = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(c.get(url).send().await.unwrap_err().is_timeout());
        for _ in 0..2000 {
            if gone() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(gone(), "{what}");
    }
    let seen = seen.lock().unwrap().clone();
    let delays: Vec<_> = seen
        .iter()
        .map(|(a, d)| (*a, d.unwrap().delay_ns))
        .collect();
    let hour = 3_600_000_000_000;
    assert_eq!(
        delays,
        [
            (Answer::Admitted, 0),
            (Answer::Delayed, hour),
            (Answer::Delayed, hour),
            (Answer::Delayed, hour)
        ],
        "each cancelled wait gave its cost back"
    );
}

/// The same over a rules engine: a shaper rule's cancelled wait gives the request back to
/// the engine (`Engine::refund`, the request described again from its head), so the next
/// request of the key is delayed as long as the cancelled one was.
#[tokio::test]
async fn a_cancelled_shaped_request_refunds_its_cost_to_the_engine() {
    let clock = Clock::new(ManualClock::new(0));
    let e = engine(
        r#"
[[rule]]
name = "shaper"
key = "ip"
limits = [{ algorithm = "leaky_bucket", limit = 1, window = "1h", burst = 10, delay = 0 }]
"#,
        &clock,
    );
    let (seen, rec) = recorder();
    let layer = RateLimitLayer::builder(EngineLimit::new(e.clone(), Describer::new()))
        .max_delay(Duration::from_secs(7200))
        .on_decision(rec)
        .build();
    let addr = serve(hello().layer(layer)).await;
    let url = format!("http://{addr}/");
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
    // The permit goes after the refund (`Wait`'s fields drop in order).
    three_cancelled_waits(&url, &seen, "the cancelled wait is gone", || {
        e.in_flight() == 0
    })
    .await;
}

/// Under `route_layer`, the key is the matched route template and the method: two ids of
/// one route share a counter, another method or route does not.
#[tokio::test]
async fn route_layer_keys_by_the_matched_path() {
    let clock = Clock::new(ManualClock::new(0));
    let s = store(
        Quota::fixed_window(2, Duration::from_secs(60)).unwrap(),
        &clock,
    );
    let app = Router::new()
        .route(
            "/users/{id}",
            get(|| async { "user" }).post(|| async { "made" }),
        )
        .route("/items/{id}", get(|| async { "item" }))
        .route_layer(RateLimitLayer::new(StoreLimit::new(
            s,
            turnstile_tower::key::RouteMethod,
        )));
    let addr = serve(app).await;
    let c = reqwest::Client::new();
    let mut codes = Vec::new();
    for path in ["/users/1", "/users/2", "/users/3", "/items/1"] {
        let r = c.get(format!("http://{addr}{path}")).send().await.unwrap();
        codes.push(r.status().as_u16());
    }
    let r = c
        .post(format!("http://{addr}/users/9"))
        .send()
        .await
        .unwrap();
    codes.push(r.status().as_u16());
    // An unmatched path never reaches a route layer.
    let r = c.get(format!("http://{addr}/nope")).send().await.unwrap();
    codes.push(r.status().as_u16());
    assert_eq!(codes, [200, 200, 429, 200, 200, 404]);
}

/// A shadow rule never changes the answer and is counted; a soft rule admits its tolerance
/// while the headers show the nominal limit.
#[tokio::test]
async fn shadow_and_soft_rules_over_http() {
    let clock = Clock::new(ManualClock::new(0));
    let e = engine(
        r#"
[[rule]]
name = "soft"
key = "global"
mode = "soft"
soft_percent = 50
limits = [{ algorithm = "fixed_window", limit = 4, window = "1m" }]

[[rule]]
name = "trial"
key = "global"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 1, window = "1m" }]
"#,
        &clock,
    );
    let addr = serve(hello().layer(RateLimitLayer::new(EngineLimit::new(
        e.clone(),
        Describer::new(),
    ))))
    .await;
    let url = format!("http://{addr}/");
    let mut codes = Vec::new();
    let mut limits = Vec::new();
    for _ in 0..7 {
        let r = reqwest::get(&url).await.unwrap();
        codes.push(r.status().as_u16());
        limits.push(h(&r, "ratelimit-policy").unwrap_or("").to_string());
    }
    assert_eq!(codes, [200, 200, 200, 200, 200, 200, 429], "4 + 50 %");
    assert!(limits.iter().all(|l| l == "\"default\";q=4"), "{limits:?}");
    let st = e.rule_stats("trial").unwrap();
    assert_eq!(st.would_deny, 5, "the shadow rule counted, never refused");
    assert_eq!(e.rule_stats("soft").unwrap().over_nominal, 2);
}

/// Without a key: pass-through and the anonymous key.
#[tokio::test]
async fn requests_without_a_key() {
    let clock = Clock::new(ManualClock::new(0));
    let s = store(
        Quota::fixed_window(1, Duration::from_secs(60)).unwrap(),
        &clock,
    );
    let pass = RateLimitLayer::builder(StoreLimit::new(s.clone(), Header::named("x-api-key")))
        .no_key(NoKey::PassThrough)
        .build();
    let anon = RateLimitLayer::builder(StoreLimit::new(s, Header::named("x-api-key")))
        .no_key(NoKey::Anonymous)
        .build();
    let a = serve(hello().layer(pass)).await;
    let b = serve(hello().layer(anon)).await;
    for _ in 0..3 {
        let r = reqwest::get(format!("http://{a}/")).await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            r.headers().get("ratelimit").is_none(),
            "unchecked: no headers"
        );
    }
    let codes: Vec<u16> = futures_util::future::join_all((0..2).map(|_| async {
        reqwest::get(format!("http://{b}/"))
            .await
            .unwrap()
            .status()
            .as_u16()
    }))
    .await;
    let mut codes = codes;
    codes.sort();
    assert_eq!(codes, [200, 429], "one shared anonymous key");
}

/// The engine behind the layer keys by the client IP behind a trusted proxy, per route.
#[tokio::test]
async fn engine_rules_per_client_ip() {
    let clock = Clock::new(ManualClock::new(0));
    let e = engine(
        r#"
[[rule]]
name = "root"
key = "ip"
match = { route_prefix = "/" }
limits = [{ algorithm = "fixed_window", limit = 2, window = "1m" }]
"#,
        &clock,
    );
    let d = Describer::new().ip(IpSource::Client(ClientIp::new(
        TrustedProxies::parse(["127.0.0.1/32"]).unwrap(),
    )));
    let addr = serve(hello().layer(RateLimitLayer::new(EngineLimit::new(e.clone(), d)))).await;
    let c = reqwest::Client::new();
    let url = format!("http://{addr}/");
    let send = |ip: &'static str| c.get(&url).header("x-forwarded-for", ip).send();
    let mut codes = Vec::new();
    for ip in ["9.9.9.9", "9.9.9.9", "9.9.9.9", "8.8.8.8"] {
        codes.push(send(ip).await.unwrap().status().as_u16());
    }
    assert_eq!(codes, [200, 200, 429, 200]);
    assert_eq!(e.rule_keys("root"), Some(2));
    let _ = Outcome::Allowed;
}

/// A refusal names the rule that denied it: the problem document's violated policy (not the
/// layer's policy name) and the observer's event, over the engine's one-rule fast path and
/// its general path alike.
#[tokio::test]
async fn a_refusal_names_the_rule_that_denied() {
    let clock = Clock::new(ManualClock::new(0));
    let e = engine(
        r#"
[[rule]]
name = "per-ip"
key = "ip"
limits = [{ algorithm = "fixed_window", limit = 3, window = "1m" }]

[[rule]]
name = "reports"
key = "ip"
match = { route_prefix = "/report" }
limits = [{ algorithm = "fixed_window", limit = 1, window = "1m" }]
"#,
        &clock,
    );
    let rules: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let r2 = rules.clone();
    let layer = RateLimitLayer::builder(EngineLimit::new(e, Describer::new()))
        .policy(Policy::new("api", None).unwrap())
        .on_decision(move |ev: &Event<'_>| {
            if ev.answer == Answer::Limited {
                r2.lock().unwrap().push(ev.rule.map(str::to_owned));
            }
        })
        .build();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/report", get(|| async { "report" }))
        .layer(layer);
    let addr = serve(app).await;
    let get = |path: &'static str| reqwest::get(format!("http://{addr}{path}"));
    let violated = |body: &str| -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(body).unwrap()["violated-policies"].clone()
    };
    // `/report`: both rules apply (the general path); the second is denied by "reports"
    // (and "per-ip" is given its unit back: all or nothing).
    assert_eq!(get("/report").await.unwrap().status(), 200);
    let r = get("/report").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        violated(&r.text().await.unwrap()),
        serde_json::json!(["reports"])
    );
    // `/`: only "per-ip" applies (the one-rule path): 2 more, then its refusal.
    for _ in 0..2 {
        assert_eq!(get("/").await.unwrap().status(), 200);
    }
    let r = get("/").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        violated(&r.text().await.unwrap()),
        serde_json::json!(["per-ip"])
    );
    assert_eq!(
        *rules.lock().unwrap(),
        [Some("reports".to_owned()), Some("per-ip".to_owned())]
    );
}

/// A tonic server behind the layer: a refused call is `RESOURCE_EXHAUSTED` with the retry
/// time in its metadata.
#[tokio::test]
async fn tonic_gets_resource_exhausted() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let clock = Clock::new(ManualClock::new(0));
    let s = store(
        Quota::fixed_window(1, Duration::from_secs(30)).unwrap(),
        &clock,
    );
    let (_reporter, health) = tonic_health::server::health_reporter();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let layer = RateLimitLayer::new(StoreLimit::new(s, Global));
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l)),
    );
    let ch = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = HealthClient::new(ch);
    let ok = c
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(
        ok.metadata().get("ratelimit").unwrap(),
        "\"default\";r=0;t=30"
    );
    let err = c
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(err.metadata().get("retry-after").unwrap(), "30");
    assert_eq!(
        err.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "30000"
    );
    assert!(
        err.message().contains("retry after 30 s"),
        "{}",
        err.message()
    );
}
