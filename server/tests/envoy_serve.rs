//! `turnstile serve --grpc ADDR --envoy-config FILE`: the real server start (`start`), a tonic
//! client over loopback, then a graceful stop; `POST /json` and `/healthcheck` on the HTTP
//! listener (curl), the Envoy counters on `/metrics`, reloads (POST /v1/reload, a file change,
//! SIGHUP) that change a limit, and a broken file refused while the old limits keep answering;
//! and the start refused with a clear error for a bad configuration or a missing flag.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
mod common;
use common::curl;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use turnstile_server::{start, Running, ServeArgs};

/// `--grpc 127.0.0.1:0`: the server binds a free port and says which (`Running::grpc`). A port
/// found free beforehand could be taken by a parallel test's listener before the server binds it.
fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn args(grpc: Option<SocketAddr>, cfg: Option<std::path::PathBuf>) -> ServeArgs {
    let mut a = ServeArgs::new();
    a.resp = "127.0.0.1:0".parse().unwrap();
    a.http = "127.0.0.1:0".parse().unwrap();
    a.workers = Some(1);
    a.throttle_keys = 10_000;
    a.grpc = grpc;
    a.envoy_config = cfg;
    a
}

#[test]
fn serve_answers_should_rate_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .unwrap();
    let running = start(args(Some(any_port()), Some(path))).unwrap();
    let addr = running.grpc.expect("the gRPC listener's address");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let codes = rt.block_on(async {
        let mut c = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let req = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: "10.0.0.1".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(
                c.should_rate_limit(req.clone())
                    .await
                    .unwrap()
                    .into_inner()
                    .overall_code,
            );
        }
        codes
    });
    assert_eq!(codes, [1, 1, 2]);
    running.stop();
    running.join().unwrap();
}

#[test]
fn serve_refuses_bad_envoy_flags() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    let e = start(args(Some(any_port()), Some(bad)))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("bad.yaml:4:") && e.contains("invalid rate limit unit 'fortnight'"),
        "{e}"
    );
    let e = start(args(Some(any_port()), None))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--envoy-config"), "{e}");
}

fn config(limit: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
    )
}

/// Writes `text` to `path` through a temporary file and a rename, as editors and config
/// management do (a reader never sees half a file).
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// One ShouldRateLimit over gRPC: (overall code, requests_per_unit, limit_remaining).
fn grpc(rt: &tokio::runtime::Runtime, addr: SocketAddr, value: &str) -> (i32, u32, u32) {
    rt.block_on(async {
        let mut c = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let r = c
            .should_rate_limit(request(value))
            .await
            .unwrap()
            .into_inner();
        let s = &r.statuses[0];
        (
            r.overall_code,
            s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit),
            s.limit_remaining,
        )
    })
}

fn json(r: &Running, value: &str) -> (u16, serde_json::Value) {
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"remote_address","value":"{value}"}}]}}]}}"#
    );
    let (code, text) = curl("POST", &format!("http://{}/json", r.http), Some(&body));
    (
        code,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

fn scrape(r: &Running) -> prometheus_parse::Scrape {
    let (code, body) = curl("GET", &format!("http://{}/metrics", r.http), None);
    assert_eq!(code, 200);
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid exposition")
}

fn sample(s: &prometheus_parse::Scrape, name: &str, label: &str, value: &str) -> f64 {
    s.samples
        .iter()
        .find(|x| x.metric == name && x.labels.get(label) == Some(value))
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
        .unwrap_or_else(|| panic!("no {name}{{{label}=\"{value}\"}}"))
}

/// Polls `f` (at most 10 s) until it holds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn json_metrics_and_reloads_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    write(&path, &config(2));
    let mut a = args(Some("127.0.0.1:0".parse().unwrap()), Some(path.clone()));
    a.watch_every = Duration::from_millis(50);
    let r = start(a).unwrap();
    let addr = r.grpc.expect("the gRPC address");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // gRPC and /json answer from the same counters.
    assert_eq!(grpc(&rt, addr, "10.0.0.1"), (1, 2, 1));
    let (code, body) = json(&r, "10.0.0.1");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["overallCode"], "OK", "{body}");
    assert_eq!(body["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
    let (code, body) = json(&r, "10.0.0.1");
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["overallCode"], "OVER_LIMIT", "{body}");
    assert_eq!(grpc(&rt, addr, "10.0.0.1").0, 2);
    assert_eq!(
        curl("GET", &format!("http://{}/healthcheck", r.http), None),
        (200, "OK".into())
    );
    let (code, body) = curl("POST", &format!("http://{}/json", r.http), Some("{"));
    assert_eq!(code, 400, "{body}");
    // Upstream's counters on /metrics: 4 hits, the 3rd and 4th over the limit.
    let m = scrape(&r);
    let key = "edge.remote_address";
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_total_hits", "key", key),
        4.0
    );
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_over_limit", "key", key),
        2.0
    );
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_within_limit", "key", key),
        2.0
    );

    // POST /v1/reload with a new limit: the new limit answers.
    write(&path, &config(5));
    let (code, body) = curl("POST", &format!("http://{}/v1/reload", r.http), None);
    assert_eq!(code, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["envoy"]["domains"], 1, "{body}");
    assert_eq!(grpc(&rt, addr, "10.0.0.2"), (1, 5, 4));

    // A broken file is refused with file:line:column, counted, and the limit of 5 stays.
    write(
        &path,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let (code, body) = curl("POST", &format!("http://{}/v1/reload", r.http), None);
    assert_eq!(code, 422, "{body}");
    assert!(
        body.contains("config.yaml:4:") && body.contains("fortnight"),
        "{body}"
    );
    assert_eq!(grpc(&rt, addr, "10.0.0.2"), (1, 5, 3));
    assert_eq!(json(&r, "10.0.0.2").1["statuses"][0]["limitRemaining"], 2);
    let m = scrape(&r);
    assert!(sample(&m, "turnstile_envoy_reloads_total", "result", "failed") >= 1.0);
    let ok = sample(&m, "turnstile_envoy_reloads_total", "result", "ok");
    assert!(ok >= 1.0);

    // A change of the file is picked up without being asked.
    write(&path, &config(7));
    eventually("the file change reloads the limit of 7", || {
        grpc(&rt, addr, "10.0.0.3").1 == 7
    });
    assert!(sample(&scrape(&r), "turnstile_envoy_reloads_total", "result", "ok") > ok);
    r.stop();
    r.join().unwrap();
}

#[test]
fn sighup_reloads_the_envoy_configuration() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf")).unwrap();
    let path = dir.path().join("conf/a.yaml");
    write(&path, &config(2));
    // Only POST /json: no --grpc needed; no file watch, so that only the signal reloads.
    let mut a = args(None, Some(dir.path().join("conf")));
    a.watch_every = Duration::ZERO;
    let r = start(a).unwrap();
    assert!(r.grpc.is_none());
    let limit =
        |r: &Running| json(r, "x").1["statuses"][0]["currentLimit"]["requestsPerUnit"].clone();
    assert_eq!(limit(&r), 2);
    write(&path, &config(9));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(limit(&r), 2, "reloaded without a signal");
    // SAFETY: raise(3) sends SIGHUP to this process, whose handler the server installed
    // before `start` returned; no memory is involved.
    assert_eq!(unsafe { libc::raise(libc::SIGHUP) }, 0);
    eventually("SIGHUP reloads the limit of 9", || limit(&r) == 9);
    r.stop();
    r.join().unwrap();
}
