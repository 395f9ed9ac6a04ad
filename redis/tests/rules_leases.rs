//! The rules on Redis with leases (`[backend] leases = "auto"`), against a real redis-server:
//! two processes' `RedisRules` sharing a key never admit over its limit and answer most checks
//! in process; a request whose rules are some leased, some not (a sliding_log) takes from both
//! exactly what it was admitted for (on one node and on a Cluster); leased soft and shadow
//! rules keep their modes; a reload that changes a limit is followed; and a process without
//! leases, reading the same file without `leases`, finds the very counts the leased ones left
//! (the records are named alike); Redis killed, a lease held is spent, then the policy answers.

mod common;

use std::net::IpAddr;
use std::sync::Arc;
use turnstile::rules::{Engine, Request, Rules};
use turnstile_redis::RedisRules;

/// `backend`: `redis = "..."` or `redis_cluster = [...]` (a timeout of 5 s unless given).
/// Leases with no final share (`strand = "0%"`): the windows here are the clock's hours, and
/// in an hour's final share (its last 3 minutes at the default 5 %) nothing is leased, which
/// would make what these tests see depend on the time of day. The final share is tested on
/// the store, at explicit times (`leases`, `lease_differential`).
fn rules(backend: &str, leases: bool, limits: &str) -> Rules {
    let leases = if leases {
        "leases = \"auto\"\nstrand = \"0%\""
    } else {
        ""
    };
    let timeout = if backend.contains("timeout") {
        ""
    } else {
        "timeout = \"5s\""
    };
    let text = format!(
        r#"
[backend]
{backend}
{timeout}
{leases}
{limits}
"#
    );
    Rules::parse(&text, "leases.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

type Node = (Arc<Engine>, Arc<RedisRules>);

async fn nodes(r: &Rules, n: usize) -> Vec<Node> {
    let mut v = Vec::new();
    for _ in 0..n {
        let engine = Arc::new(Engine::new(r.clone()).unwrap());
        let redis = Arc::new(RedisRules::connect(r).await.unwrap());
        v.push((engine, redis));
    }
    v
}

/// `clients` tasks per node, each making `each` requests of `req()`; the admitted count.
async fn drive(nodes: &[Node], clients: usize, each: usize, req: fn() -> Request<'static>) -> u64 {
    let mut tasks = Vec::new();
    for c in 0..clients * nodes.len() {
        let (engine, redis) = nodes[c % nodes.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            for _ in 0..each {
                if redis.explain(&engine, &req()).await.decision.allowed() {
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
    for (_, r) in nodes {
        assert_eq!(r.stats().fallbacks, 0, "{:?}", r.stats());
        r.return_leases().await;
    }
    total
}

/// What a node without leases finds left of `req`'s rule (a peek: cost 0).
async fn remaining(backend: &str, limits: &str, mut req: Request<'_>) -> u64 {
    let r = rules(backend, false, limits);
    let engine = Engine::new(r.clone()).unwrap();
    let redis = RedisRules::connect(&r).await.unwrap();
    req.cost = 0;
    redis.explain(&engine, &req).await.decision.remaining
}

const ONE_RULE: &str = r#"
[[rule]]
name = "customer"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 2000, window = "1h" }]
"#;

#[test]
fn two_processes_sharing_a_key_never_go_over_and_answer_locally() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let url = format!("redis = \"{}\"", server.url());
        let nodes = nodes(&rules(&url, true, ONE_RULE), 2).await;
        let admitted = drive(&nodes, 8, 1000, || Request::new().customer(42)).await;
        let mut checks = 0;
        let mut local = 0;
        for (_, r) in &nodes {
            let st = r.lease_stats();
            eprintln!("{st:?}");
            assert_eq!(st.len(), 1, "{st:?}");
            assert_eq!(st[0].0, "customer");
            checks += st[0].1.checks;
            local += st[0].1.local;
        }
        eprintln!("admitted {admitted}; {local} of {checks} checks local");
        assert_eq!(checks, 16_000);
        assert!(admitted <= 2000, "over the limit: {admitted}");
        assert!(admitted >= 1900, "{admitted}");
        assert!(local * 10 >= checks * 9, "{local} of {checks} local");
        // Everything given back: a process without leases finds exactly what was admitted
        // counted, under the same names.
        let left = remaining(&url, ONE_RULE, Request::new().customer(42)).await;
        assert_eq!(left, 2000 - admitted);
    });
}

fn mixed(ip_limit: u64) -> String {
    format!(
        r#"
[[rule]]
name = "customer"
key = "customer"
limits = [{{ algorithm = "fixed_window", limit = 100, window = "1h" }}]
[[rule]]
name = "ip"
key = "ip"
limits = [{{ algorithm = "sliding_log", limit = {ip_limit}, window = "1h" }}]
"#
    )
}

fn mixed_req() -> Request<'static> {
    Request::new()
        .customer(7)
        .ip("192.0.2.9".parse::<IpAddr>().unwrap())
}

/// Customer (leased, 100) and IP (a sliding_log, per request) rules on every request: with
/// the IP limit above the customer's, the customer rule denies and the IP rule's charges are
/// given back in Redis; below it, the IP rule denies and the customer's go back into its
/// lease.
#[test]
fn a_request_of_leased_and_unleased_rules_is_all_or_nothing() {
    for ip_limit in [120u64, 80] {
        let server = common::Server::start();
        mixed_run(&format!("redis = \"{}\"", server.url()), ip_limit);
    }
}

/// The same on a Redis Cluster (the two rules' keys in different slots).
#[test]
fn a_request_of_leased_and_unleased_rules_is_all_or_nothing_on_a_cluster() {
    let cluster = common::Cluster::start();
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    for ip_limit in [120u64, 80] {
        // A prefix per run: each starts afresh.
        let backend = format!(
            "redis_cluster = [{}]\nprefix = \"ip{ip_limit}:\"",
            urls.join(", ")
        );
        mixed_run(&backend, ip_limit);
    }
}

/// Two processes leasing the customer rule of `mixed(ip_limit)` on `backend`.
fn mixed_run(backend: &str, ip_limit: u64) {
    let rt = common::runtime();
    let text = mixed(ip_limit);
    rt.block_on(async {
        let nodes = nodes(&rules(backend, true, &text), 2).await;
        let admitted = drive(&nodes, 8, 40, mixed_req).await;
        for (_, r) in &nodes {
            let st = r.lease_stats();
            eprintln!("{st:?}");
            // The sliding_log rule is not leased.
            let names: Vec<&str> = st.iter().map(|s| s.0.as_str()).collect();
            assert_eq!(names, ["customer"]);
        }
        eprintln!("ip limit {ip_limit}: admitted {admitted}");
        let most = ip_limit.min(100);
        assert!(admitted <= most, "over: {admitted}");
        assert!(admitted * 10 >= most * 9, "{admitted}");
        // Both rules kept exactly the admitted requests' charges: the denied ones were
        // given back to the rule that admitted them, leased or not.
        let cust = remaining(backend, &text, Request::new().customer(7)).await;
        let ip = Request::new().ip("192.0.2.9".parse::<IpAddr>().unwrap());
        let ip = remaining(backend, &text, ip).await;
        assert_eq!((cust, ip), (100 - admitted, ip_limit - admitted));
    });
}

/// Leased soft and shadow rules keep their modes: a soft rule admits its tolerance and
/// reports its nominal limit; a shadow rule counts and never denies.
#[test]
fn leased_soft_and_shadow_rules_keep_their_modes() {
    let server = common::Server::start();
    let rt = common::runtime();
    let limits = r#"
[[rule]]
name = "soft"
key = "customer"
mode = "soft"
soft_percent = 50
limits = [{ algorithm = "fixed_window", limit = 10, window = "1h" }]
[[rule]]
name = "shadow"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 3, window = "1h" }]
"#;
    let r = rules(&format!("redis = \"{}\"", server.url()), true, limits);
    rt.block_on(async {
        let engine = Engine::new(r.clone()).unwrap();
        let redis = RedisRules::connect(&r).await.unwrap();
        let req = Request::new().customer(1);
        let mut admitted = 0;
        for _ in 0..40 {
            let v = redis.explain(&engine, &req).await;
            if v.decision.allowed() {
                admitted += 1;
                assert_eq!(v.decision.limit, 10, "the nominal limit");
            } else {
                assert_eq!(v.rule.as_deref(), Some("soft"));
            }
        }
        let st = redis.lease_stats();
        eprintln!("{st:?}");
        let names: Vec<&str> = st.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(names, ["shadow", "soft"]);
        assert!(st.iter().all(|s| s.1.local > 0), "{st:?}");
        assert_eq!(admitted, 15, "10 + 50 %");
        let s = engine.rule_stats("soft").unwrap();
        assert_eq!((s.denied, s.over_nominal), (25, 5));
        let w = engine.rule_stats("shadow").unwrap();
        assert_eq!(w.would_deny, 12, "15 admitted past a shadow limit of 3");
    });
}

/// A reload that changes a leased rule's limit is followed: the rule gets a tier of the new
/// limit, on the same records (a window of the same length keeps its count).
#[test]
fn a_reload_that_changes_a_leased_limit_is_followed() {
    let server = common::Server::start();
    let rt = common::runtime();
    let url = format!("redis = \"{}\"", server.url());
    let at = |limit: u64| {
        let text = format!(
            r#"
[[rule]]
name = "customer"
key = "customer"
limits = [{{ algorithm = "fixed_window", limit = {limit}, window = "1h" }}]
"#
        );
        rules(&url, true, &text)
    };
    rt.block_on(async {
        let engine = Engine::new(at(50)).unwrap();
        let redis = RedisRules::connect(&at(50)).await.unwrap();
        let req = Request::new().customer(3);
        let mut admitted = 0;
        for _ in 0..100 {
            admitted += redis.explain(&engine, &req).await.decision.allowed() as u64;
        }
        assert_eq!(admitted, 50);
        engine.reload(at(80)).unwrap();
        redis.reload(&at(80)).unwrap();
        for _ in 0..100 {
            admitted += redis.explain(&engine, &req).await.decision.allowed() as u64;
        }
        let st = redis.lease_stats();
        eprintln!("{st:?}");
        assert_eq!(st.len(), 1);
        assert!(st[0].1.local > 0, "{st:?}");
        assert_eq!(admitted, 80);
    });
}

/// Redis killed: a lease held is still spent, then the failure policy answers (closed:
/// denials), counted as fallbacks.
#[test]
fn redis_away_leases_are_spent_then_the_policy_answers() {
    let mut server = common::Server::start();
    let rt = common::runtime();
    let backend = format!("redis = \"{}\"\ntimeout = \"200ms\"", server.url());
    let text = r#"
[[rule]]
name = "customer"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 100000, window = "1h" }]
"#;
    let r = rules(&backend, true, text);
    rt.block_on(async {
        let engine = Engine::new(r.clone()).unwrap();
        let redis = RedisRules::connect(&r).await.unwrap();
        let req = Request::new().customer(5);
        // A hot key: leased.
        for _ in 0..2000 {
            assert!(redis.explain(&engine, &req).await.decision.allowed());
        }
        let before = redis.lease_stats()[0].1;
        assert!(before.lease_calls > 0, "{before:?}");
        server.kill();
        let (mut admitted, mut denied) = (0u64, 0u64);
        for _ in 0..100_000 {
            if redis.explain(&engine, &req).await.decision.allowed() {
                admitted += 1;
            } else {
                denied += 1;
                if denied > 100 {
                    break;
                }
            }
        }
        let after = redis.lease_stats()[0].1;
        eprintln!(
            "admitted {admitted}, denied {denied}; {before:?} {after:?} {:?}",
            redis.stats()
        );
        assert!(admitted > 0, "the lease held was spent");
        assert!(denied > 100, "then the policy (closed) answered");
        assert!(redis.stats().fallbacks > 100, "{:?}", redis.stats());
    });
}
