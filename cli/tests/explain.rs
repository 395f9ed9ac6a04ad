//! The explanation of a decision against the built binary, as a user asks for it:
//! `turnstile serve --rules FILE` as a child process on free loopback ports, the `redis` crate
//! sending `TURNSTILE.EXPLAIN` (RESP3 and RESP2) and `TURNSTILE.CHECK`, curl sending
//! `POST /v1/check?explain=1` and `POST /v1/check`. Each explanation is followed by the check
//! it explains: the check does what the explanation said (admitted or denied, the limit, the
//! remaining, the rule), and an explanation asked twice answers the same counters (it consumed
//! nothing).

mod common;
use common::free_port;

use serde_json::{json, Value};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

/// A soft rule on API keys, a hard rule of two limits on customers, a shadow rule on
/// customers; windows of an hour, so that nothing resets during the test.
const RULES: &str = r#"
[[rule]]
name = "soft-keys"
key = "api_key"
mode = "soft"
soft_percent = 50
limits = [{ algorithm = "fixed_window", limit = 4, window = "1h" }]

[[rule]]
name = "pair"
key = "customer"
limits = [
  { algorithm = "fixed_window", limit = 5, window = "1h" },
  { algorithm = "sliding_window", limit = 7, window = "1h" },
]

[[rule]]
name = "watch"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 3, window = "1h" }]
"#;

/// A RESP reply as JSON: maps as objects, bulk strings as text (numbers where they read as
/// one are left as text: the test compares what the server sent).
fn to_json(v: redis::Value) -> Value {
    use redis::Value as R;
    match v {
        R::Nil => Value::Null,
        R::Int(n) => json!(n),
        R::BulkString(b) => json!(String::from_utf8(b).unwrap()),
        R::SimpleString(s) => json!(s),
        R::Array(a) => Value::Array(a.into_iter().map(to_json).collect()),
        R::Map(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (to_json(k).as_str().unwrap().to_string(), to_json(v)))
                .collect(),
        ),
        v => panic!("unexpected RESP value {v:?}"),
    }
}

struct Resp(redis::Connection);

impl Resp {
    fn new(port: u16, resp3: bool) -> Self {
        let proto = if resp3 { "?protocol=resp3" } else { "" };
        let c = redis::Client::open(format!("redis://127.0.0.1:{port}/{proto}")).unwrap();
        Resp(c.get_connection().unwrap())
    }
    fn call(&mut self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.0)
    }
    /// `TURNSTILE.EXPLAIN class key cost` as JSON.
    fn explain(&mut self, class: &str, key: &str, cost: u64) -> Value {
        to_json(
            self.call(&["TURNSTILE.EXPLAIN", class, key, &cost.to_string()])
                .unwrap(),
        )
    }
    /// `TURNSTILE.CHECK class key cost`: allowed, limit, remaining, rule.
    fn check(&mut self, class: &str, key: &str, cost: u64) -> (bool, i64, i64, Value) {
        let v = to_json(
            self.call(&["TURNSTILE.CHECK", class, key, &cost.to_string()])
                .unwrap(),
        );
        let a = v.as_array().unwrap();
        (
            a[0] == json!(1),
            a[1].as_i64().unwrap(),
            a[2].as_i64().unwrap(),
            a[5].clone(),
        )
    }
}

/// What must not change between two explanations of the same state: everything but the
/// times (the clock runs between them).
fn counters(x: &Value) -> Value {
    let mut x = x.clone();
    strip_times(&mut x);
    x
}

fn strip_times(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !k.ends_with("_ms"));
            m.values_mut().for_each(strip_times);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_times),
        _ => {}
    }
}

fn rule<'a>(x: &'a Value, name: &str) -> &'a Value {
    x["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == name)
        .unwrap_or_else(|| panic!("no rule {name} in {x}"))
}

/// Explains, explains again, then checks: the check agrees, nothing was consumed.
fn agree(c: &mut Resp, class: &str, key: &str, cost: u64) -> Value {
    let x = c.explain(class, key, cost);
    assert_eq!(
        counters(&c.explain(class, key, cost)),
        counters(&x),
        "explain consumed nothing"
    );
    let (allowed, limit, remaining, denier) = c.check(class, key, cost);
    assert_eq!(x["allowed"], json!(i64::from(allowed)), "{x}");
    assert_eq!(
        (x["limit"].as_i64(), x["remaining"].as_i64()),
        (Some(limit), Some(remaining)),
        "{x}"
    );
    assert_eq!(x["rule"], denier, "{x}");
    x
}

fn server(dir: &std::path::Path) -> (common::Running, u16, u16) {
    let rules = dir.join("rules.toml");
    std::fs::write(&rules, RULES).unwrap();
    let rules = rules.to_str().unwrap();
    let args = [
        "--workers",
        "2",
        "--throttle-keys",
        "10000",
        "--rules",
        rules,
    ];
    common::serve::with_args(BIN, &args)
}

#[test]
fn resp_explanations_agree_with_the_checks_that_follow() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, port, _) = server(dir.path());
    let mut c = Resp::new(port, true);

    // A hard rule of two limits and a shadow rule; costs 2, 2, 2 (denied: 1 left of 5), 1, 1.
    let x = agree(&mut c, "customer", "1", 2);
    assert_eq!(x["decided_by"], json!({"rule": "pair", "limit": 0}), "{x}");
    let pair = rule(&x, "pair");
    assert_eq!(pair["mode"], "hard");
    assert_eq!(pair["key"], "1", "a customer id is its own key id");
    assert_eq!(pair["limits_from"], "rule");
    assert_eq!(pair["limits"][0]["algorithm"], "fixed_window");
    assert_eq!(pair["limits"][1]["algorithm"], "sliding_window");
    assert_eq!(
        (
            pair["limits"][0]["counter"].as_i64(),
            pair["limits"][0]["remaining"].as_i64()
        ),
        (Some(0), Some(5))
    );
    assert_eq!(pair["limits"][0]["remaining_after"], 3);
    assert_eq!(rule(&x, "watch")["mode"], "shadow");
    assert_eq!(rule(&x, "watch")["step"], "would_admit");

    let x = agree(&mut c, "customer", "1", 2);
    assert_eq!(rule(&x, "pair")["limits"][0]["counter"], 2, "{x}");
    // The shadow rule would deny (2 + 2 > 3); the request is admitted all the same.
    assert_eq!(rule(&x, "watch")["step"], "would_deny", "{x}");
    assert_eq!(x["allowed"], 1);

    let x = agree(&mut c, "customer", "1", 2);
    assert_eq!(x["allowed"], 0, "{x}");
    assert_eq!(x["rule"], "pair");
    assert_eq!(rule(&x, "pair")["step"], "denies");
    assert_eq!(rule(&x, "pair")["limits"][0]["admits"], 0);
    assert_eq!(
        rule(&x, "pair")["limits"][1]["admits"],
        1,
        "7 − 4 leaves room for 2"
    );
    assert_eq!(x["decided_by"], json!({"rule": "pair", "limit": 0}));
    assert_eq!(rule(&x, "watch")["step"], "not_reached");

    let x = agree(&mut c, "customer", "1", 1);
    assert_eq!(
        (x["allowed"].as_i64(), x["remaining"].as_i64()),
        (Some(1), Some(0))
    );
    let x = agree(&mut c, "customer", "1", 1);
    assert_eq!(x["allowed"], 0);
    assert_eq!(rule(&x, "pair")["limits"][0]["counter"], 5);

    soft_rule_through_its_band(&mut c);

    // Cost 0 explains a peek; the priority is the method's default.
    let x = c.explain("customer", "2", 0);
    assert_eq!(
        (
            x["allowed"].as_i64(),
            x["cost"].as_i64(),
            x["priority"].as_str()
        ),
        (Some(1), Some(0), Some("get"))
    );

    // RESP2: the same map, as a flat array of names and values.
    let mut c2 = Resp::new(port, false);
    let flat = to_json(c2.call(&["TURNSTILE.EXPLAIN", "customer", "1"]).unwrap());
    let flat = flat.as_array().unwrap();
    assert_eq!(flat.len() % 2, 0);
    assert_eq!((&flat[0], &flat[1]), (&json!("allowed"), &json!(0)));
    refusals(&mut c2);
}

/// A soft rule: 4 nominal, 6 admitted (its band reported as 0 remaining), the 7th denied.
fn soft_rule_through_its_band(c: &mut Resp) {
    for n in 1..=7 {
        let x = agree(c, "api_key", "k", 1);
        let soft = rule(&x, "soft-keys");
        assert_eq!(soft["mode"], "soft");
        assert_eq!(soft["limits"][0]["limit"], 4, "the nominal limit");
        assert_eq!(x["allowed"], json!(i64::from(n <= 6)), "request {n}: {x}");
        assert_ne!(soft["key"], "k", "an API key's id is its hash");
    }
}

/// Bad input: clear errors, nothing explained.
fn refusals(c2: &mut Resp) {
    for (args, want) in [
        (
            &["TURNSTILE.EXPLAIN", "customer"][..],
            "wrong number of arguments",
        ),
        (&["TURNSTILE.EXPLAIN", "customer", "x"][..], "api_key"),
        (
            &["TURNSTILE.EXPLAIN", "customer", "1", "-1"][..],
            "must be positive",
        ),
        (
            &["TURNSTILE.EXPLAIN", "customer", "1", "1", "urgent"][..],
            "unknown priority",
        ),
    ] {
        let e = c2.call(args).unwrap_err().to_string();
        assert!(e.contains(want), "{args:?}: {e}");
    }
}

/// curl POST with a JSON body: the status and the body.
fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let o = Command::new("curl")
        .args(["-s", "-m", "10", "-w", "\n%{http_code}", "-X", "POST"])
        .args(["-H", "content-type: application/json", "--data-binary"])
        .arg(body.to_string())
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8(o.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (
        code.parse().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[test]
fn http_explanations_agree_with_the_checks_that_follow() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, _, port) = server(dir.path());
    let body = json!({"key_class": "customer", "key": "9", "cost": 3, "method": "POST"});
    let mut denied = false;
    for _ in 0..3 {
        let (code, x) = post(port, "/v1/check?explain=1", &body);
        assert_eq!(
            code, 200,
            "an explanation is answered 200 whatever it says: {x}"
        );
        let (_, again) = post(port, "/v1/check?explain=true", &body);
        assert_eq!(counters(&again), counters(&x), "explain consumed nothing");
        assert_eq!(x["priority"], "post");
        let (code, c) = post(port, "/v1/check", &body);
        assert_eq!(
            code,
            if x["allowed"] == true { 200 } else { 429 },
            "{x} then {c}"
        );
        for f in ["allowed", "outcome", "limit", "remaining", "rule", "shed"] {
            assert_eq!(x[f], c[f], "{f}: {x} then {c}");
        }
        denied |= x["allowed"] == false;
    }
    assert!(denied, "cost 3 of 5: the second is denied");
    // A query that is not an explanation is still the check.
    let (code, c) = post(
        port,
        "/v1/check?explain=0",
        &json!({"key_class": "customer", "key": "10"}),
    );
    assert_eq!((code, &c["remaining"]), (200, &json!(4)), "{c}");
    let (code, e) = post(port, "/v1/check?explain=yes", &body);
    assert_eq!(code, 400);
    assert!(e["error"].as_str().unwrap().contains("explain=1"), "{e}");
    let (code, e) = post(
        port,
        "/v1/check?explain=1",
        &json!({"key_class": "planet", "key": "x"}),
    );
    assert_eq!(code, 400);
    assert!(
        e["error"].as_str().unwrap().contains("unknown key class"),
        "{e}"
    );
    let m = Command::new("curl")
        .args([
            "-s",
            "-m",
            "10",
            &format!("http://127.0.0.1:{port}/metrics"),
        ])
        .output()
        .unwrap();
    let m = String::from_utf8(m.stdout).unwrap();
    assert!(m.contains("turnstile_explains_total 6"), "{m}");
}

/// Envoy's rate limit configuration: a counted limit, a shadow limit, an unlimited key. Day
/// windows (on the Unix epoch, as upstream's): nothing resets during the test.
const ENVOY: &str = "\
domain: explain
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3, name: per-user}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
";

mod grpc {
    pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    pub use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
}

fn rls(hits: u32, ds: &[(&str, &str)]) -> grpc::RateLimitRequest {
    grpc::RateLimitRequest {
        domain: "explain".into(),
        descriptors: ds
            .iter()
            .map(|(k, v)| grpc::RateLimitDescriptor {
                entries: vec![grpc::Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

/// One `ShouldRateLimit` call, `x-turnstile-explain` set to `explain` if given: the answer
/// and the explanation the response's metadata carries.
async fn call(
    c: &mut grpc::RateLimitServiceClient<tonic::transport::Channel>,
    req: grpc::RateLimitRequest,
    explain: Option<&'static str>,
) -> Result<(grpc::RateLimitResponse, Option<Value>), tonic::Status> {
    let mut r = tonic::Request::new(req);
    if let Some(v) = explain {
        r.metadata_mut()
            .insert("x-turnstile-explain", v.parse().unwrap());
    }
    let r = c.should_rate_limit(r).await?;
    let x = r
        .metadata()
        .get("x-turnstile-explain")
        .map(|v| serde_json::from_str(v.to_str().unwrap()).unwrap());
    Ok((r.into_inner(), x))
}

/// The answer's codes by name, overall and per descriptor.
fn codes(a: &grpc::RateLimitResponse) -> (String, Vec<String>) {
    let name = |c: i32| if c == 2 { "OVER_LIMIT" } else { "OK" }.to_string();
    (
        name(a.overall_code),
        a.statuses.iter().map(|s| name(s.code)).collect(),
    )
}

#[test]
fn grpc_explanations_in_the_metadata_agree_with_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("explain.yaml");
    std::fs::write(&config, ENVOY).unwrap();
    let (grpc, resp, http) = (free_port(), free_port(), free_port());
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--workers", "1", "--throttle-keys", "1000"])
        .args(["--resp", &format!("127.0.0.1:{resp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--grpc", &format!("127.0.0.1:{grpc}")])
        .arg("--envoy-config")
        .arg(&config)
        .env_remove("SHADOW_MODE")
        .env_remove("QUOTA_MODE")
        .env("RUST_LOG", "warn");
    let _server = common::spawn_listening(&mut cmd, &[grpc]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = grpc::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
            .await
            .unwrap();
        // Not asked: no explanation.
        let (a, x) = call(&mut c, rls(1, &[("user", "carol")]), None)
            .await
            .unwrap();
        assert_eq!((codes(&a).0.as_str(), x), ("OK", None));
        let (_, x) = call(&mut c, rls(1, &[("user", "carol")]), Some("0"))
            .await
            .unwrap();
        assert_eq!(x, None);

        // 2 of 3, then 2 more: over. Each explanation is of the answer it comes with, and
        // its counter is what the calls before counted (the explanation counted nothing).
        let mut seen = 0;
        // A request-level hits_addend of 0 counts 1, as upstream counts it.
        for (hits, want) in [(2, "OK"), (2, "OVER_LIMIT"), (0, "OVER_LIMIT")] {
            let (a, x) = call(&mut c, rls(hits, &[("user", "alice")]), Some("1"))
                .await
                .unwrap();
            let x = x.expect("asked: explained");
            let (overall, each) = codes(&a);
            assert_eq!(overall, want, "{x}");
            assert_eq!(x["overall_code"], overall.as_str(), "{x}");
            let d = &x["descriptors"][0];
            assert_eq!(d["code"], each[0].as_str(), "{x}");
            assert_eq!(d["remaining"], a.statuses[0].limit_remaining, "{x}");
            assert_eq!(d["counter"], seen, "{x}");
            let hits = if hits == 0 { 1 } else { hits };
            assert_eq!(d["counter_after"], seen + hits, "{x}");
            assert_eq!(d["matched"], "explain.user", "{x}");
            assert_eq!(d["limit"], json!(["per-user", 3, "day"]), "{x}");
            assert_eq!(d["mode"], "hard");
            assert!(d["key"].as_str().unwrap().ends_with("user|alice"), "{x}");
            assert!(d["key_id"].as_str().unwrap().parse::<u64>().is_ok(), "{x}");
            seen += hits;
        }

        several_descriptors(&mut c).await;

        // A value that is not a yes or a no is refused, saying what is expected.
        let e = call(&mut c, rls(1, &[("user", "dan")]), Some("please"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("expected 1"), "{e:?}");
    });

    json_explains(http);
}

/// Several descriptors: the shadow one over (answered OK), the unlimited one, the counted one.
async fn several_descriptors(c: &mut grpc::RateLimitServiceClient<tonic::transport::Channel>) {
    let ds = [("shadowed", "s"), ("free", "f"), ("user", "bob")];
    call(c, rls(1, &ds[..1]), None).await.unwrap();
    let (a, x) = call(c, rls(1, &ds), Some("true")).await.unwrap();
    let x = x.unwrap();
    assert_eq!(
        codes(&a),
        ("OK".to_string(), vec!["OK".to_string(); 3]),
        "{x}"
    );
    assert_eq!(x["overall_code"], "OK");
    let d = &x["descriptors"];
    assert_eq!(
        (&d[0]["mode"], &d[0]["over"], &d[0]["code"]),
        (&json!("shadow"), &json!(true), &json!("OK")),
        "{x}"
    );
    assert_eq!(d[1]["matched"], "unlimited: explain.free", "{x}");
    assert_eq!(d[2]["remaining"], 2, "{x}");
    assert_eq!(x["decided_by"], 0, "the shadow limit has nothing left: {x}");
}

/// `POST /json` explains in the response header of that name.
fn json_explains(http: u16) {
    let body = r#"{"domain":"explain","descriptors":[{"entries":[{"key":"user","value":"erin"}]}],"hitsAddend":2}"#;
    for (counter, code, status) in [(0, "OK", 200), (2, "OVER_LIMIT", 429)] {
        let (got, headers, answer) = post_json(http, body, "1");
        assert_eq!(got, status, "{answer}");
        let x: Value = headers
            .iter()
            .find_map(|h| h.strip_prefix("x-turnstile-explain: "))
            .map(|v| serde_json::from_str(v).unwrap())
            .unwrap_or_else(|| panic!("no explanation in {headers:?}"));
        assert_eq!(x["overall_code"], code, "{x}");
        assert_eq!(x["descriptors"][0]["counter"], counter, "{x}");
        assert_eq!(answer["overallCode"], code, "{answer}");
    }
    let (got, _, _) = post_json(http, body, "maybe");
    assert_eq!(got, 400);
}

/// curl `POST /json` with `x-turnstile-explain: explain`: the status, the response's header
/// lines, the body.
fn post_json(port: u16, body: &str, explain: &str) -> (u16, Vec<String>, Value) {
    let o = Command::new("curl")
        .args(["-s", "-m", "10", "-D", "-", "-X", "POST"])
        .args(["-H", "content-type: application/json"])
        .args(["-H", &format!("x-turnstile-explain: {explain}")])
        .args(["--data-binary", body])
        .arg(format!("http://127.0.0.1:{port}/json"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8(o.stdout).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines.map(|l| l.trim_end().to_string()).collect();
    (
        status,
        headers,
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}
