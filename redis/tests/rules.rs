//! The rules engine with its counts in a real Redis (`[backend] redis`, `RedisRules`): the
//! same generated traces through the in-memory engine and through Redis (explicit `now`)
//! give the same verdicts, field for field, and the same rule statistics, through checks,
//! refunds and settles (a reserved cost charged past a limit or given back); many clients on
//! one key admit exactly the limit; Redis killed: the policy answers; limits Redis cannot run
//! and an unreachable Redis are refused at their `file:line:column`.
//! `PROPTEST_CASES=N` runs N differential cases (default 32).

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use turnstile::rules::{Engine, Priority, Request, Rules};
use turnstile::{ManualClock, Outcome};
use turnstile_redis::RedisRules;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// A limit as a TOML inline table (`count_denied` only if `cd`).
fn limit(cd: bool) -> impl Strategy<Value = String> {
    let window = prop_oneof![Just("100ms"), Just("1s"), Just("7s")];
    let n = 1u64..=6;
    let any_cd = any::<bool>().prop_map(move |x| x && cd);
    prop_oneof![
        (n.clone(), window.clone(), any_cd.clone()).prop_map(|(l, w, cd)| format!(
            r#"{{ algorithm = "fixed_window", limit = {l}, window = "{w}", count_denied = {cd} }}"#
        )),
        (n.clone(), window.clone(), any_cd.clone()).prop_map(|(l, w, cd)| format!(
            r#"{{ algorithm = "sliding_window", limit = {l}, window = "{w}", count_denied = {cd} }}"#
        )),
        (n.clone(), window.clone(), 1u64..=6).prop_map(|(l, w, b)| format!(
            r#"{{ algorithm = "token_bucket", limit = {l}, window = "{w}", burst = {b} }}"#
        )),
        (n.clone(), window.clone(), 0u64..=3).prop_map(|(l, w, b)| format!(
            r#"{{ algorithm = "leaky_bucket", limit = {l}, window = "{w}", burst = {b} }}"#
        )),
        (n.clone(), window.clone(), any_cd).prop_map(|(l, w, cd)| format!(
            r#"{{ algorithm = "sliding_log", limit = {l}, window = "{w}", count_denied = {cd} }}"#
        )),
        (n, window, prop_oneof![Just(1u64), Just(2), Just(4), Just(5)]).prop_map(|(l, w, b)| format!(
            r#"{{ algorithm = "window_ring", limit = {l}, window = "{w}", buckets = {b} }}"#
        )),
    ]
}

fn limits(cd: bool) -> impl Strategy<Value = String> {
    prop::collection::vec(limit(cd), 1..=2).prop_map(|v| format!("[{}]", v.join(", ")))
}

/// Rules of every mode, an override, route, method and priority conditions, a composite
/// key and a shadow rule; `[shedding]` sheds test traffic at a load of 0.8.
fn rules_text(redis: &str, prefix: &str, l: &[String], soft: bool, elastic: bool) -> String {
    let mode_a = if soft {
        "mode = \"soft\"\nsoft_percent = 50"
    } else {
        "mode = \"hard\""
    };
    let mode_b = if elastic {
        "mode = \"elastic\"\nelastic_percent = 50\nelastic_below = 0.5"
    } else {
        "mode = \"hard\""
    };
    format!(
        r#"
[backend]
{redis}
prefix = "{prefix}"
timeout = "5s"

[shedding]
test = {{ on = 0.8, off = 0.7 }}

[[rule]]
name = "customer"
key = "customer"
{mode_a}
limits = {}

[[rule.override]]
key = "2"
limits = {}

[[rule]]
name = "net:24"
key = "ip/24"
match = {{ route_prefix = ["/v1/"] }}
{mode_b}
limits = {}

[[rule]]
name = "writes"
key = "customer+route"
match = {{ method = ["POST"], priority = ["post", "critical"] }}
limits = {}

[[rule]]
name = "watch"
key = "global"
mode = "shadow"
limits = {}
"#,
        l[0], l[1], l[2], l[3], l[4]
    )
}

#[derive(Clone, Debug)]
enum Op {
    Check {
        customer: Option<u64>,
        ip: u8,
        route: u8,
        post: bool,
        priority: Option<u8>,
        cost: u64,
    },
    Refund {
        customer: Option<u64>,
        ip: u8,
        route: u8,
        post: bool,
    },
    Settle {
        customer: Option<u64>,
        ip: u8,
        route: u8,
        post: bool,
        reserved: u64,
        actual: u64,
    },
    Advance(u64),
    Load(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let customer = prop_oneof![Just(None), (0u64..4).prop_map(Some)];
    prop_oneof![
        12 => (customer.clone(), 0u8..3, 0u8..4, any::<bool>(), prop_oneof![4 => Just(None), 1 => (0u8..4).prop_map(Some)], prop_oneof![Just(0u64), Just(1), Just(1), Just(2), Just(3)])
            .prop_map(|(customer, ip, route, post, priority, cost)| Op::Check { customer, ip, route, post, priority, cost }),
        2 => (customer.clone(), 0u8..3, 0u8..4, any::<bool>())
            .prop_map(|(customer, ip, route, post)| Op::Refund { customer, ip, route, post }),
        4 => (customer.clone(), 0u8..3, 0u8..4, any::<bool>(), 0u64..4, prop_oneof![0u64..4, 5u64..=20])
            .prop_map(|(customer, ip, route, post, reserved, actual)| Op::Settle { customer, ip, route, post, reserved, actual }),
        4 => prop_oneof![Just(0u64), Just(1), Just(50 * MS), Just(333 * MS), Just(S), Just(7 * S)].prop_map(Op::Advance),
        1 => (0u8..3).prop_map(Op::Load),
    ]
}

const ROUTES: [Option<&str>; 4] = [Some("/v1/a"), Some("/v1/b"), Some("/health"), None];

fn request<'a>(
    customer: Option<u64>,
    ip: u8,
    route: u8,
    post: bool,
    addr: &'a [IpAddr; 3],
) -> Request<'a> {
    let mut r = Request::new().ip(addr[ip as usize]);
    r.customer = customer;
    r.route = ROUTES[route as usize];
    r.method = Some(if post { "POST" } else { "GET" });
    r
}

#[test]
fn redis_rules_match_the_in_memory_engine() {
    let server = common::Server::start();
    differential_run(&format!("redis = \"{}\"", server.url()), true, 32);
}

/// The same on a 3-master cluster, where the rules of different key ids live in different
/// slots: decided per slot, consuming then refunding across them. Without `count_denied`
/// (with it, each slot's first denier records its denial: docs/redis.md).
#[test]
fn redis_cluster_rules_match_the_in_memory_engine() {
    let cluster = common::Cluster::start();
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    differential_run(&format!("redis_cluster = [{}]", urls.join(", ")), false, 12);
}

fn differential_run(redis: &str, cd: bool, default_cases: u32) {
    let rt = common::runtime();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec(limits(cd), 5),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(1_763_900_000 * S), 0u64..1 << 62],
        prop::collection::vec(op(), 1..80),
    );
    let case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&strategy, |(l, soft, elastic, start, ops)| {
            let c = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let text = rules_text(redis, &format!("c{c}:"), &l, soft, elastic);
            rt.block_on(differential(&text, start, ops))
        })
        .unwrap();
}

async fn differential(text: &str, start: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rules = Rules::parse(text, "case.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mem = Engine::builder(rules.clone())
        .seed(7)
        .build_with_clock(ManualClock::new(start))
        .unwrap();
    let planner = Engine::builder(rules.clone())
        .seed(7)
        .build_with_clock(ManualClock::new(start))
        .unwrap();
    let redis = RedisRules::connect(&rules).await.unwrap();
    let addr: [IpAddr; 3] = [
        "10.0.0.5".parse().unwrap(),
        "10.0.0.77".parse().unwrap(),
        "10.0.1.5".parse().unwrap(),
    ];
    let mut now = start;
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Check {
                customer,
                ip,
                route,
                post,
                priority,
                cost,
            } => {
                let mut req = request(customer, ip, route, post, &addr);
                req.cost = cost;
                req.priority = priority.map(|p| Priority::ALL[p as usize]);
                let want = mem.explain_at(&req, now);
                let got = redis.explain_at(&planner, &req, now).await.unwrap();
                prop_assert_eq!(&got, &want, "step {} {:?} at {}\n{}", i, op, now, text);
            }
            Op::Refund {
                customer,
                ip,
                route,
                post,
            } => {
                let req = request(customer, ip, route, post, &addr);
                let want = mem.refund_at(&req, now);
                let got = redis.refund_at(&planner, &req, now).await.unwrap();
                prop_assert_eq!(got, want, "step {} {:?}", i, op);
            }
            Op::Settle {
                customer,
                ip,
                route,
                post,
                reserved,
                actual,
            } => {
                let mut req = request(customer, ip, route, post, &addr);
                req.cost = reserved;
                let want = mem.settle_at(&req, actual, now);
                let got = redis.settle_at(&planner, &req, actual, now).await.unwrap();
                prop_assert_eq!(got, want, "step {} {:?}", i, op);
                // Where the key stands after it (a peek: what TURNSTILE.SETTLE answers).
                req.cost = 0;
                let want = mem.explain_at(&req, now);
                let got = redis.explain_at(&planner, &req, now).await.unwrap();
                prop_assert_eq!(
                    &got,
                    &want,
                    "step {} peek after {:?} at {}\n{}",
                    i,
                    op,
                    now,
                    text
                );
            }
            Op::Advance(d) => now += d,
            Op::Load(u) => {
                let u = [0.0, 0.6, 0.9][u as usize];
                mem.report_utilization(u);
                planner.report_utilization(u);
            }
        }
    }
    for name in mem.rule_names() {
        prop_assert_eq!(mem.rule_stats(&name), planner.rule_stats(&name), "{}", name);
    }
    Ok(())
}

/// Two processes' engines (two connections) share one Redis: 16 clients x 40 requests on one
/// customer, under a customer rule and an IP rule, admit exactly the tighter limit.
#[test]
fn many_clients_on_one_key_admit_exactly_the_limit() {
    let server = common::Server::start();
    race(&format!("redis = \"{}\"", server.url()));
    // The IP rule was charged by admitted requests only (all-or-nothing in one script).
    let count = server.cli(&["--scan", "--pattern", "ts:ip:*"]);
    assert_eq!(count.lines().count(), 2, "{count}");
}

/// The same on a cluster: the customer and IP rules live in different slots (consume, then
/// refund across them).
#[test]
fn many_clients_on_one_key_admit_exactly_the_limit_on_a_cluster() {
    let cluster = common::Cluster::start();
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    race(&format!("redis_cluster = [{}]", urls.join(", ")));
}

fn race(backend: &str) {
    let rt = common::runtime();
    let text = format!(
        r#"
[backend]
{backend}
timeout = "5s"
[[rule]]
name = "customer"
key = "customer"
limits = [{{ algorithm = "token_bucket", limit = 100, window = "1h", burst = 100 }}]
[[rule]]
name = "ip"
key = "ip"
limits = [{{ algorithm = "fixed_window", limit = 150, window = "1h" }}, {{ algorithm = "sliding_log", limit = 120, window = "1h" }}]
"#
    );
    let rules = Rules::parse(&text, "race.toml").unwrap();
    let admitted = rt.block_on(async {
        let mut nodes = Vec::new();
        for _ in 0..2 {
            let engine = Arc::new(Engine::new(rules.clone()).unwrap());
            let redis = Arc::new(RedisRules::connect(&rules).await.unwrap());
            nodes.push((engine, redis));
        }
        let mut tasks = Vec::new();
        for c in 0..16 {
            let (engine, redis) = nodes[c % 2].clone();
            tasks.push(tokio::spawn(async move {
                let ip: IpAddr = "192.0.2.1".parse().unwrap();
                let mut n = 0;
                for _ in 0..40 {
                    let req = Request::new().customer(42).ip(ip);
                    if redis.explain(&engine, &req).await.decision.allowed() {
                        n += 1;
                    }
                }
                n
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        for (_, r) in &nodes {
            assert_eq!(r.stats().fallbacks, 0, "{:?}", r.stats());
        }
        // The IP rule kept exactly the admitted requests' charges (the denied ones were
        // never recorded, or given back).
        let (engine, redis) = &nodes[0];
        let mut peek = Request::new().ip("192.0.2.1".parse::<IpAddr>().unwrap());
        peek.cost = 0;
        let v = redis.explain(engine, &peek).await;
        assert_eq!((v.decision.limit, v.decision.remaining), (120, 20));
        total
    });
    assert_eq!(admitted, 100);
}

/// A shadow rule counts and never denies; a soft rule admits its tolerance and reports the
/// nominal limit.
#[test]
fn shadow_and_soft_rules_on_redis() {
    let server = common::Server::start();
    let rt = common::runtime();
    let text = format!(
        r#"
[backend]
redis = "{}"
timeout = "5s"
[[rule]]
name = "soft"
key = "customer"
mode = "soft"
soft_percent = 50
limits = [{{ algorithm = "fixed_window", limit = 10, window = "1h" }}]
[[rule]]
name = "shadow"
key = "customer"
mode = "shadow"
limits = [{{ algorithm = "fixed_window", limit = 3, window = "1h" }}]
"#,
        server.url()
    );
    let rules = Rules::parse(&text, "modes.toml").unwrap();
    rt.block_on(async {
        let engine = Engine::new(rules.clone()).unwrap();
        let redis = RedisRules::connect(&rules).await.unwrap();
        let req = Request::new().customer(1);
        let mut admitted = 0;
        for i in 0..20 {
            let v = redis.explain(&engine, &req).await;
            if v.decision.allowed() {
                admitted += 1;
                assert_eq!(v.decision.limit, 10, "the nominal limit");
                assert_eq!(v.decision.remaining, 10u64.saturating_sub(i + 1));
            } else {
                assert_eq!(v.rule.as_deref(), Some("soft"));
            }
        }
        assert_eq!(admitted, 15, "10 + 50 %");
        let s = engine.rule_stats("soft").unwrap();
        assert_eq!((s.denied, s.over_nominal), (5, 5));
        let w = engine.rule_stats("shadow").unwrap();
        assert_eq!(w.would_deny, 12, "15 admitted past a shadow limit of 3");
        assert_eq!(redis.stats().redis, 20);
    });
}

fn policy_rules(url: &str, policy: &str) -> Rules {
    let text = format!(
        r#"
[backend]
redis = "{url}"
timeout = "1s"
{policy}
[[rule]]
name = "r"
key = "customer"
limits = [{{ algorithm = "fixed_window", limit = 100, window = "1h" }}]
"#
    );
    Rules::parse(&text, "policy.toml").unwrap()
}

/// Redis killed mid-run: each policy answers (no panic), fallbacks are counted, the circuit
/// opens; a restarted Redis is used again.
#[test]
fn a_killed_redis_is_answered_by_the_policy() {
    let mut server = common::Server::start();
    let rt = common::runtime();
    let url = server.url();
    rt.block_on(async {
        let policies = [
            ("policy = \"closed\"", Some(false)),
            ("policy = \"open\"", Some(true)),
            ("policy = \"insurance\"\nexpected_nodes = 4", None),
        ];
        let mut nodes = Vec::new();
        for (p, _) in &policies {
            let rules = policy_rules(&url, p);
            let engine = Engine::new(rules.clone()).unwrap();
            let redis = RedisRules::connect(&rules).await.unwrap();
            let d = redis.explain(&engine, &Request::new().customer(9)).await;
            assert!(d.decision.allowed());
            nodes.push((engine, redis));
        }
        server.kill();
        for ((engine, redis), (p, want)) in nodes.iter().zip(&policies) {
            let mut admitted = 0;
            for _ in 0..60 {
                let v = redis.explain(engine, &Request::new().customer(9)).await;
                match want {
                    Some(true) => assert_eq!(v.decision.outcome, Outcome::Untracked, "{p}"),
                    Some(false) => assert_eq!(v.decision.outcome, Outcome::StoreFull, "{p}"),
                    None => {}
                }
                admitted += u32::from(v.decision.allowed());
            }
            if want.is_none() {
                assert_eq!(admitted, 25, "insurance: 100 / 4 nodes");
            }
            let s = redis.stats();
            assert_eq!(s.fallbacks, 60, "{p}: {s:?}");
            assert!(s.opened >= 1 && s.short_circuited > 0, "{p}: {s:?}");
            assert!(redis.circuit_open());
            // A refund while Redis is away is an error, not a panic.
            assert!(redis
                .refund(engine, &Request::new().customer(9))
                .await
                .is_err());
        }
        server.restart();
        // The breaker lets a probe through after its cooldown (1 s); bounded wait.
        let (engine, redis) = &nodes[0];
        let t0 = std::time::Instant::now();
        loop {
            let v = redis.explain(engine, &Request::new().customer(9)).await;
            if v.decision.outcome == Outcome::Allowed {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "Redis never used again"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!redis.circuit_open());
    });
}

/// What Redis cannot run is refused where it is written; so is an unreachable Redis.
#[test]
fn refused_at_load_with_file_line_column() {
    let rt = common::runtime();
    let long = r#"
[backend]
redis = "redis://127.0.0.1:1"
[[rule]]
name = "r"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 1, window = "60d" }]
"#;
    let rules = Rules::parse(long, "long.toml").unwrap();
    let e = RedisRules::check(&rules).unwrap_err().to_string();
    assert!(e.starts_with("long.toml:7:61: "), "{e}");
    assert!(
        e.contains("52 days") && e.contains("[backend] redis"),
        "{e}"
    );

    let port = common::free_port();
    let text = format!(
        "\n[backend]\nredis = \"redis://:secret@127.0.0.1:{port}\"\n[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{{ limit = 1, window = \"1s\" }}]\n"
    );
    let rules = Rules::parse(&text, "down.toml").unwrap();
    let t0 = std::time::Instant::now();
    let e = rt
        .block_on(RedisRules::connect(&rules))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("down.toml:3:9: cannot connect to Redis at redis://:***@127.0.0.1:"),
        "{e}"
    );
    assert!(!e.contains("secret"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}
