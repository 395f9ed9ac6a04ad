//! HTTP (curl as the client), /metrics (parsed by a Prometheus text parser), hot reload,
//! the `redis` crate as a pipelined client, and snapshots across a restart, against the server
//! in process on loopback.

mod common;
use common::curl_head;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use turnstile::keyed::Store;
use turnstile::Limits;
use turnstile_server::throttle::{emission_ns, limit_of, reply};
use turnstile_server::{start, RateLimitHeaders, Running, ServeArgs, ServeError};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("turnstile-server-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn args(f: impl FnOnce(&mut ServeArgs)) -> ServeArgs {
    let mut a = ServeArgs::new();
    a.resp = "127.0.0.1:0".parse().unwrap();
    a.http = "127.0.0.1:0".parse().unwrap();
    a.workers = Some(2);
    a.throttle_keys = 10_000;
    f(&mut a);
    a
}

const RULES: &str = r#"
[[rule]]
name = "per-customer"
key = "customer"
limits = [{ algorithm = "token_bucket", limit = 3, window = "1h" }]
"#;

fn metrics(r: &Running) -> prometheus_parse::Scrape {
    let (status, _, body) = curl_head("GET", &format!("http://{}/metrics", r.http), None);
    assert_eq!(status, 200);
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid exposition")
}

/// The value of `name` with label `label` = `value` (or without labels if `label` is empty).
fn sample(s: &prometheus_parse::Scrape, name: &str, label: &str, value: &str) -> f64 {
    s.samples
        .iter()
        .find(|x| x.metric == name && (label.is_empty() || x.labels.get(label) == Some(value)))
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
        .unwrap_or_else(|| panic!("no sample {name}{{{label}={value}}}"))
}

fn stop(r: Running) {
    r.stop();
    r.join().unwrap();
}

/// Whether the response head has this header line (lowercase, as `curl_head` gives it).
fn has_line(head: &str, line: &str) -> bool {
    head.lines().any(|l| l.trim_end() == line)
}

fn check_body(key: &str) -> String {
    format!(r#"{{"key_class":"customer","key":"{key}","route":"/v1/x","method":"GET"}}"#)
}

#[test]
fn check_metrics_and_reload() {
    let d = tmpdir("reload");
    let rules = d.join("rules.toml");
    std::fs::write(&rules, RULES).unwrap();
    let r = start(args(|a| {
        a.rules = Some(rules.clone());
        a.watch_every = Duration::from_millis(50);
    }))
    .unwrap();
    let url = format!("http://{}/v1/check", r.http);
    for i in 0..3 {
        let (status, head, body) = curl_head("POST", &url, Some(&check_body("7")));
        assert_eq!(status, 200, "{i}: {body}");
        // draft-10's fields by default, not the older names.
        assert!(
            has_line(&head, "ratelimit-policy: \"default\";q=3"),
            "{head}"
        );
        assert!(
            head.contains(&format!("ratelimit: \"default\";r={};t=", 2 - i)),
            "{head}"
        );
        assert!(!head.contains("ratelimit-limit"), "{head}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["allowed"], true);
    }
    let (status, head, body) = curl_head("POST", &url, Some(&check_body("7")));
    assert_eq!(status, 429, "{body}");
    assert!(head.contains("retry-after: 1200"), "{head}");
    assert!(
        has_line(&head, "ratelimit: \"default\";r=0;t=1200"),
        "{head}"
    );
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["allowed"], false);
    assert_eq!(v["rule"], "per-customer");
    let retry = v["retry_after_ms"].as_i64().unwrap();
    assert!((1_190_000..=1_200_000).contains(&retry), "{retry}");
    // Errors are JSON.
    let (status, _, body) = curl_head("POST", &url, Some("{nope"));
    assert_eq!(status, 400);
    assert!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("invalid JSON")
    );
    let (status, _, body) = curl_head("POST", &url, Some(r#"{"key_class":"planet","key":"x"}"#));
    assert_eq!(status, 400, "{body}");
    let big = format!(
        r#"{{"key_class":"customer","key":"{}"}}"#,
        "9".repeat(70_000)
    );
    let (status, _, body) = curl_head("POST", &url, Some(&big));
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("\"error\""), "{body}");
    // The same body chunked, without a Content-Length: the limit counts what arrives.
    let o = std::process::Command::new("curl")
        .args(["-s", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}"])
        .args([
            "-H",
            "Transfer-Encoding: chunked",
            "--data-binary",
            &big,
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "413");
    let (status, _, _) = curl_head("GET", &format!("http://{}/healthz", r.http), None);
    assert_eq!(status, 200);
    // Rules loaded, their counts in memory: ready.
    let (status, _, body) = curl_head("GET", &format!("http://{}/readyz", r.http), None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""status":"ready""#), "{body}");

    let m = metrics(&r);
    assert_eq!(
        sample(&m, "turnstile_checks_total", "result", "allowed"),
        3.0
    );
    assert_eq!(
        sample(&m, "turnstile_checks_total", "result", "denied"),
        1.0
    );
    assert_eq!(sample(&m, "turnstile_http_checks_total", "", ""), 4.0);
    assert_eq!(
        sample(&m, "turnstile_rule_events_total", "event", "denied"),
        1.0
    );
    assert_eq!(
        sample(&m, "turnstile_rule_keys", "rule", "per-customer"),
        1.0
    );

    // A broken file: refused with file:line:column, counted, the old rules stay.
    std::fs::write(&rules, RULES.replace("limit = 3", "limit = \"three\"")).unwrap();
    let (status, _, body) = curl_head("POST", &format!("http://{}/v1/reload", r.http), None);
    assert_eq!(status, 422, "{body}");
    let msg = serde_json::from_str::<serde_json::Value>(&body).unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.starts_with(&format!("{}:5:", rules.display())), "{msg}");
    assert_eq!(
        curl_head("POST", &url, Some(&check_body("7"))).0,
        429,
        "old rules kept, and the key's state"
    );
    assert!(sample(&metrics(&r), "turnstile_reloads_total", "result", "failed") >= 1.0);
    // A good file, picked up by the watch (bounded wait).
    std::fs::write(
        &rules,
        RULES
            .replace("customer\"\nlimits", "customer\"\nmode = \"hard\"\nlimits")
            .replace("limit = 3", "limit = 5"),
    )
    .unwrap();
    let t0 = Instant::now();
    while sample(&metrics(&r), "turnstile_reloads_total", "result", "ok") < 1.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the file change was not picked up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, head, _) = curl_head("POST", &url, Some(&check_body("8")));
    assert_eq!(status, 200);
    assert!(
        has_line(&head, "ratelimit-policy: \"default\";q=5"),
        "{head}"
    );
    stop(r);
}

/// `--ratelimit-headers legacy` sends the earlier drafts' names instead, `both` both, with the
/// same numbers.
#[test]
fn legacy_and_both_header_forms() {
    let d = tmpdir("header-forms");
    let rules = d.join("rules.toml");
    std::fs::write(&rules, RULES).unwrap();
    for (style, draft, legacy) in [
        (RateLimitHeaders::Legacy, false, true),
        (RateLimitHeaders::Both, true, true),
    ] {
        let r = start(args(|a| {
            a.rules = Some(rules.clone());
            a.ratelimit_headers = style;
        }))
        .unwrap();
        let url = format!("http://{}/v1/check", r.http);
        let (status, head, _) = curl_head("POST", &url, Some(&check_body("7")));
        assert_eq!(status, 200, "{style:?}: {head}");
        for line in [
            "ratelimit-limit: 3",
            "ratelimit-remaining: 2",
            "ratelimit-reset: 1200",
        ] {
            assert_eq!(has_line(&head, line), legacy, "{style:?}: {line} in {head}");
        }
        for line in [
            "ratelimit-policy: \"default\";q=3",
            "ratelimit: \"default\";r=2;t=1200",
        ] {
            assert_eq!(has_line(&head, line), draft, "{style:?}: {line} in {head}");
        }
        stop(r);
    }
}

#[test]
fn redis_crate_pipelined() {
    let r = start(args(|_| {})).unwrap();
    let client = redis::Client::open(format!("redis://{}/", r.resp)).unwrap();
    let mut con = client.get_connection().unwrap();
    // What the client sent on connecting (CLIENT SETINFO) is counted too.
    let before = sample(&metrics(&r), "turnstile_resp_commands_total", "", "");
    let p = (9i64, 1i64, 3600i64);
    let store = Store::builder(Limits::new(vec![limit_of(p).unwrap()]).unwrap())
        .capacity(1000)
        .build()
        .unwrap();
    let e = emission_ns(p.1, p.2).unwrap();
    let mut pipe = redis::pipe();
    let mut want = Vec::new();
    for i in 0..200 {
        let key = format!("k{}", i % 7);
        pipe.cmd("CL.THROTTLE").arg(&key).arg(p.0).arg(p.1).arg(p.2);
        want.push(
            reply(&store.check(key.as_str(), 1), p.0, e)
                .as_array()
                .to_vec(),
        );
    }
    let got: Vec<Vec<i64>> = pipe.query(&mut con).unwrap();
    assert_eq!(got, want);
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    // Counted per pipeline, before the replies are sent: every command read is in /metrics.
    let m = metrics(&r);
    let limited = want.iter().filter(|w| w[0] == 1).count() as f64;
    assert!(limited > 0.0 && limited < 200.0);
    assert_eq!(
        sample(&m, "turnstile_throttle_total", "result", "limited"),
        limited
    );
    assert_eq!(
        sample(&m, "turnstile_throttle_total", "result", "allowed"),
        200.0 - limited
    );
    assert_eq!(
        sample(&m, "turnstile_resp_commands_total", "", "") - before,
        201.0
    );
    // One latency observation per CL.THROTTLE, in the histogram's +Inf bucket and its count.
    let hist = m
        .samples
        .iter()
        .find_map(|x| match (&x.metric[..], &x.value) {
            ("turnstile_check_seconds", prometheus_parse::Value::Histogram(h)) => Some(h.clone()),
            _ => None,
        })
        .expect("turnstile_check_seconds histogram");
    let inf = hist.iter().find(|b| b.less_than.is_infinite()).unwrap();
    assert_eq!(inf.count, 200.0);
    assert!(
        hist.windows(2).all(|w| w[0].count <= w[1].count),
        "{hist:?}"
    );
    stop(r);
}

fn throttle(r: &Running, key: &str) -> Vec<i64> {
    let client = redis::Client::open(format!("redis://{}/", r.resp)).unwrap();
    let mut con = client.get_connection().unwrap();
    redis::cmd("CL.THROTTLE")
        .arg(key)
        .arg(9)
        .arg(1)
        .arg(3600)
        .query(&mut con)
        .unwrap()
}

fn with_snapshot(path: &Path, required: bool) -> ServeArgs {
    args(|a| {
        a.snapshot = Some(path.to_path_buf());
        a.snapshot_required = required;
        a.snapshot_every = Duration::ZERO;
    })
}

#[test]
fn snapshot_survives_a_restart_and_bad_files_are_refused() {
    let d = tmpdir("snap");
    let path = d.join("throttle.snap");
    let r = start(with_snapshot(&path, false)).unwrap();
    for _ in 0..4 {
        throttle(&r, "a");
    }
    throttle(&r, "b");
    stop(r);
    assert!(path.exists(), "graceful shutdown writes the snapshot");
    let r = start(with_snapshot(&path, true)).unwrap();
    // 10 per burst: "a" used 4, "b" 1.
    assert_eq!(throttle(&r, "a")[2], 5);
    assert_eq!(throttle(&r, "b")[2], 8);
    assert_eq!(throttle(&r, "c")[2], 9);
    stop(r);

    // Truncated: refused, never half-loaded; the server starts empty, or not at all when
    // the snapshot is required.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    match start(with_snapshot(&path, true)) {
        Err(ServeError::Snapshot(e)) => assert!(e.to_string().contains("truncated"), "{e}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a truncated snapshot was accepted"),
    }
    let r = start(with_snapshot(&path, false)).unwrap();
    assert_eq!(throttle(&r, "a")[2], 9, "started empty");
    stop(r);
}

/// A known path with a method it does not serve: 405, `Allow`, and the JSON error body of every
/// other error.
#[test]
fn a_wrong_method_gets_405_with_allow_and_a_json_error() {
    let r = start(args(|_| {})).expect("server starts");
    for (method, path, allow) in [
        ("GET", "/v1/check", "allow: post"),
        ("DELETE", "/v1/reload", "allow: post"),
        ("POST", "/metrics", "allow: get,head"),
    ] {
        let (status, head, body) = curl_head(method, &format!("http://{}{path}", r.http), None);
        assert_eq!(status, 405, "{method} {path}: {head}");
        assert!(head.contains(allow), "{method} {path}: {head}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
        let e = v["error"].as_str().expect("an error field");
        assert!(e.starts_with(&format!("{method} {path}: ")), "{e}");
    }
    stop(r);
}
