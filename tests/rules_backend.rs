//! `[backend]`: where the rules keep their counts. Parsed and validated here (the core takes no
//! Redis client): every error at its `file:line:column`; the builder API the same way; the
//! engine's plans (what a backend executes) list the rules a check would ask. The execution
//! on a real Redis is tested in `redis/tests/rules.rs`.
#![cfg(feature = "rules")]

use std::time::Duration;
use turnstile::rules::{
    redact_url, Backend, BackendLeaseMode, BackendLeases, BackendPolicy, Engine, KeyClass,
    RedisBackend, RedisNodes, Request, Rule, Rules, StepOutcome, DEFAULT_REDIS_SEED,
};
use turnstile::{Algorithm, ConfigError, Decision, LimitSpec, ManualClock, Outcome};

const RULE: &str =
    "[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{ limit = 5, window = \"1s\" }]\n";

fn parse(backend: &str) -> Result<Rules, String> {
    Rules::parse(&format!("{backend}\n{RULE}"), "b.toml").map_err(|e| e.to_string())
}

#[test]
fn a_redis_backend_with_its_defaults() {
    let r = parse("[backend]\nredis = \"redis://127.0.0.1:6379\"").unwrap();
    assert_eq!(
        r.backend,
        Backend::Redis(RedisBackend {
            nodes: RedisNodes::Single("redis://127.0.0.1:6379".into()),
            timeout: Duration::from_millis(20),
            policy: BackendPolicy::Closed,
            prefix: "ts:".into(),
            seed: DEFAULT_REDIS_SEED,
            leases: BackendLeases::Off,
        })
    );
    assert!(
        r.summary()
            .ends_with("; backend redis redis://127.0.0.1:6379"),
        "{}",
        r.summary()
    );
    assert_eq!(
        Rules::parse(RULE, "m.toml").unwrap().backend,
        Backend::Memory
    );
}

#[test]
fn every_field() {
    let r = parse(
        "[backend]\nredis_cluster = [\"redis://10.0.0.1:7000\", \"redis://[::1]:7001\"]\ntimeout = \"50ms\"\npolicy = \"insurance\"\nexpected_nodes = 4\nprefix = \"api:\"\nseed = 99",
    )
    .unwrap();
    let Backend::Redis(b) = &r.backend else {
        panic!()
    };
    assert_eq!(
        b.nodes,
        RedisNodes::Cluster(vec![
            "redis://10.0.0.1:7000".into(),
            "redis://[::1]:7001".into()
        ])
    );
    assert_eq!(b.timeout, Duration::from_millis(50));
    assert_eq!(b.policy, BackendPolicy::Insurance { expected_nodes: 4 });
    assert_eq!((b.prefix.as_str(), b.seed), ("api:", 99));
    let open = parse("[backend]\nredis = \"redis://h\"\npolicy = \"open\"").unwrap();
    assert!(matches!(&open.backend, Backend::Redis(b) if b.policy == BackendPolicy::Open));
}

#[test]
fn a_broken_backend_is_refused_at_its_line_and_column() {
    let cases: &[(&str, &str)] = &[
        (
            "[backend]\ntimeout = \"5ms\"",
            "b.toml:1:1: [backend] names no Redis",
        ),
        (
            "[backend]\nredis = \"redis://a\"\nredis_cluster = [\"redis://b\"]",
            "b.toml:3:17: give one of redis",
        ),
        (
            "[backend]\nredis = \"http://a:1\"",
            "b.toml:2:9: `http://a:1` is not a Redis URL",
        ),
        (
            "[backend]\nredis = \"redis://\"",
            "b.toml:2:9: `redis://` names no host",
        ),
        (
            "[backend]\nredis = \"redis://a:0\"",
            "b.toml:2:9: `redis://a:0`: the port must be 1..=65535",
        ),
        (
            "[backend]\nredis = \"redis://a:6379/x\"",
            "b.toml:2:9: `redis://a:6379/x`: the path is a database number",
        ),
        (
            "[backend]\nredis_cluster = [\"redis://a:1\", \"redis://b:2/3\"]",
            "b.toml:2:33: `redis://b:2/3`: a Redis Cluster has only database 0",
        ),
        (
            "[backend]\nredis_cluster = []",
            "b.toml:2:17: redis_cluster lists 0 URLs",
        ),
        (
            "[backend]\nredis = \"redis://a\"\ntimeout = \"0s\"",
            "b.toml:3:11: timeout 0ns is out of range: give 1ms..=60s",
        ),
        (
            "[backend]\nredis = \"redis://a\"\ntimeout = 20",
            "b.toml:3:11: a duration needs a unit",
        ),
        (
            "[backend]\nredis = \"redis://a\"\npolicy = \"fail-open\"",
            "b.toml:3:10: unknown policy `fail-open`",
        ),
        (
            "[backend]\nredis = \"redis://a\"\npolicy = \"insurance\"",
            "b.toml:3:10: policy = \"insurance\" needs expected_nodes",
        ),
        (
            "[backend]\nredis = \"redis://a\"\nexpected_nodes = 3",
            "b.toml:3:18: `expected_nodes` applies to policy = \"insurance\"",
        ),
        (
            "[backend]\nredis = \"redis://a\"\npolicy = \"insurance\"\nexpected_nodes = 0",
            "b.toml:4:18: expected_nodes = 0",
        ),
        (
            "[backend]\nredis = \"redis://a\"\nprefix = \"{x}\"",
            "b.toml:3:10: prefix `{x}` must be",
        ),
        (
            "[backend]\nredis = \"redis://a\"\nport = 1",
            "b.toml:3:1: unknown field `port`",
        ),
        ("[backend]\nredis = 6379", "b.toml:2:9: invalid type"),
    ];
    for (text, want) in cases {
        let e = parse(text).unwrap_err();
        assert!(e.starts_with(want), "{text:?}\n got: {e}\nwant: {want}");
    }
}

#[test]
fn passwords_are_not_shown() {
    assert_eq!(redact_url("redis://:pw@h:1/0"), "redis://:***@h:1/0");
    assert_eq!(redact_url("redis://u:pw@h"), "redis://u:***@h");
    assert_eq!(redact_url("redis://h:1"), "redis://h:1");
    let r = parse("[backend]\nredis = \"redis://:hunter2@127.0.0.1:6379\"").unwrap();
    assert!(!r.summary().contains("hunter2") && !format!("{r:?}").contains("hunter2"));
    let e = parse("[backend]\nredis = \"redis://:hunter2@h:99999\"").unwrap_err();
    assert!(!e.contains("hunter2"), "{e}");
}

#[test]
fn the_builder_validates_the_backend_too() {
    let rule = Rule::new("r", KeyClass::customer()).limit(LimitSpec::new(
        Algorithm::FixedWindow,
        5,
        Duration::from_secs(1),
    ));
    let mut b = RedisBackend::single("redis://127.0.0.1:6379");
    b.timeout = Duration::ZERO;
    let e = Rules::builder()
        .rule(rule.clone())
        .backend(Backend::Redis(b))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("builder: backend timeout: timeout 0ns"),
        "{e}"
    );
    let ok = Rules::builder()
        .rule(rule)
        .backend(Backend::Redis(RedisBackend::cluster(["redis://a:1"])))
        .build()
        .unwrap();
    assert!(ok.summary().contains("backend redis cluster (1 URLs)"));
}

/// A backend refuses what it cannot run where it is written: the limit's field, an
/// override's, an elastic pool's.
#[test]
fn check_limits_reports_at_the_limit() {
    let text = "[[rule]]\nname = \"a\"\nkey = \"customer\"\nmode = \"elastic\"\nlimits = [{ limit = 5, window = \"1s\" }, { algorithm = \"fixed_window\", limit = 9, window = \"2s\" }]\n[[rule.override]]\nkey = 7\nlimits = [{ algorithm = \"token_bucket\", limit = 3, window = \"1s\" }]\n";
    let rules = Rules::parse(text, "c.toml").unwrap();
    let refuse = |alg: Algorithm, pool: bool| {
        let mut seen = 0;
        let r = rules.check_limits(|rule, l| {
            assert_eq!(rule.name, "a");
            if l.algorithm() == alg {
                seen += 1;
                if !pool || seen == 2 {
                    return Err(ConfigError::new("window", "too long here"));
                }
            }
            Ok(())
        });
        r.unwrap_err().to_string()
    };
    assert_eq!(
        refuse(Algorithm::FixedWindow, false),
        "c.toml:5:91: too long here"
    );
    assert_eq!(
        refuse(Algorithm::FixedWindow, true),
        "c.toml:5:91: too long here (the elastic pool)"
    );
    // An override's limit.
    assert_eq!(
        refuse(Algorithm::TokenBucket, false),
        "c.toml:8:61: too long here"
    );
}

/// The plan lists the rules a check would ask, enforcing then shadow, with the backend's
/// key ids; `finish` answers as the engine for the outcomes given.
#[test]
fn plans_list_what_a_check_would_ask() {
    let text = r#"
[[rule]]
name = "watch"
key = "global"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 1, window = "1s" }]
[[rule]]
name = "soft"
key = "customer"
mode = "soft"
soft_percent = 50
limits = [{ algorithm = "fixed_window", limit = 10, window = "1s" }]
[[rule]]
name = "keys"
key = "api_key"
match = { route_prefix = "/v1/" }
limits = [{ algorithm = "fixed_window", limit = 3, window = "1s" }]
[[rule.override]]
key = "vip"
limits = [{ algorithm = "fixed_window", limit = 30, window = "1s" }]
"#;
    let rules = Rules::parse(text, "p.toml").unwrap();
    let e = Engine::builder(rules)
        .seed(1)
        .build_with_clock(ManualClock::new(0))
        .unwrap();
    let keys = turnstile::keyed::KeyHasher::with_seed(5, 64);
    let req = Request::new().customer(42).api_key("vip").route("/v1/x");
    let p = e.plan_at(&req, 0, &keys);
    let names: Vec<&str> = p.steps().iter().map(|s| p.rule_name(s)).collect();
    assert_eq!(names, ["soft", "keys", "watch"]);
    let s = p.steps();
    assert_eq!(s[0].key(), 42);
    assert_eq!(s[1].key(), keys.bytes(b"vip"));
    assert!(s[1].is_override() && !s[0].is_override());
    assert!(s[2].is_shadow());
    assert_eq!(p.limits(&s[0]).limits()[0].capacity(), 15, "soft: scaled");
    assert_eq!(p.limits(&s[1]).limits()[0].capacity(), 30, "the override's");
    // The soft rule admitted in its band; the shadow rule would deny.
    let allow = |limit, remaining| Decision {
        outcome: Outcome::Allowed,
        limit,
        remaining,
        reset_after_ns: 0,
        retry_after_ns: None,
        delay_ns: 0,
    };
    let deny = |limit, retry| Decision {
        outcome: Outcome::Limited,
        limit,
        remaining: 0,
        reset_after_ns: retry,
        retry_after_ns: Some(retry),
        delay_ns: 0,
    };
    let v = p.finish(&[
        Some(StepOutcome::main(allow(15, 2))),
        Some(StepOutcome::main(allow(30, 29))),
        Some(StepOutcome::main(deny(1, 1))),
    ]);
    assert!(v.decision.allowed());
    assert_eq!((v.decision.limit, v.decision.remaining), (10, 0));
    assert_eq!((v.matched, v.would_deny, v.rule), (2, 1, None));
    assert_eq!(e.rule_stats("soft").unwrap().over_nominal, 1);
    assert_eq!(e.rule_stats("watch").unwrap().would_deny, 1);
    // A denial by the second rule names it.
    let v = p.finish(&[
        Some(StepOutcome::main(allow(15, 9))),
        Some(StepOutcome::main(deny(30, 5))),
        None,
    ]);
    assert_eq!(v.rule.as_deref(), Some("keys"));
    assert_eq!(v.decision.retry_after_ns, Some(5));
    // Per limit, counted as the in-memory check counts: (limit, checks, admitted, denied,
    // shadow_denied, near_limit). The soft rule's first admission (0 left of its nominal 10)
    // is near the limit; the override's key counts under `override`.
    let rows = |rule: &str| -> Vec<(String, [u64; 5])> {
        e.limit_stats(rule)
            .unwrap()
            .into_iter()
            .map(|l| {
                let v = [
                    l.checks,
                    l.admitted,
                    l.denied,
                    l.shadow_denied,
                    l.near_limit,
                ];
                (l.limit, v)
            })
            .collect()
    };
    assert_eq!(rows("soft"), [("0".into(), [2, 2, 0, 0, 1])]);
    assert_eq!(
        rows("keys"),
        [("0".into(), [0; 5]), ("override".into(), [2, 1, 1, 0, 0])]
    );
    assert_eq!(rows("watch"), [("0".into(), [1, 0, 0, 1, 0])]);
    // No rule: nothing to ask.
    assert!(e.plan_at(&Request::new(), 0, &keys).steps().len() == 1);
}

#[test]
fn the_redis_example_is_valid() {
    let r = Rules::from_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/rules-redis.toml"
    ))
    .unwrap();
    assert!(matches!(r.backend, Backend::Redis(_)));
    assert_eq!(r.rules.len(), 2);
}

#[test]
fn leases_are_off_unless_asked_and_their_keys_are_checked() {
    let url = "[backend]\nredis = \"redis://127.0.0.1:6379\"\n";
    let leases = |extra: &str| {
        parse(&format!("{url}{extra}")).map(|r| match r.backend {
            Backend::Redis(b) => b.leases,
            Backend::Memory => unreachable!(),
        })
    };
    assert_eq!(leases(""), Ok(BackendLeases::Off));
    assert_eq!(leases("leases = \"off\""), Ok(BackendLeases::Off));
    let auto = BackendLeases::Auto {
        strand_ppm: 50_000,
        mode: BackendLeaseMode::Reserve,
    };
    assert_eq!(leases("leases = \"auto\""), Ok(auto));
    assert_eq!(
        leases("leases = \"auto\"\nstrand = \"2.5%\"\nmode = \"delayed\"\nflush = 50"),
        Ok(BackendLeases::Auto {
            strand_ppm: 25_000,
            mode: BackendLeaseMode::Delayed { flush: 50 }
        })
    );
    let r = parse(&format!("{url}leases = \"auto\"")).unwrap();
    assert!(
        r.summary().contains("never over the limits"),
        "{}",
        r.summary()
    );
    for (bad, says) in [
        ("leases = \"sometimes\"", "expected auto"),
        ("strand = \"5%\"", "applies to leases"),
        ("leases = \"auto\"\nstrand = \"60%\"", "0% to 50%"),
        ("leases = \"auto\"\nstrand = \"0.05\"", "as a percentage"),
        ("leases = \"auto\"\nmode = \"later\"", "expected reserve"),
        (
            "leases = \"auto\"\nflush = 10",
            "applies to mode = \"delayed\"",
        ),
        (
            "leases = \"auto\"\nmode = \"delayed\"\nflush = 0",
            "at least 1",
        ),
    ] {
        let e = leases(bad).unwrap_err();
        assert!(e.contains(says) && e.contains("b.toml:"), "{bad}: {e}");
    }
}
