//! `turnstile serve`'s OpenTelemetry traces as a collector receives them: the test runs an
//! OTLP receiver (the collector's `TraceService` over gRPC, from opentelemetry-proto, or
//! `POST /v1/traces` over HTTP/protobuf) on a free loopback port, starts the binary with the
//! standard `OTEL_*` variables pointing at it, sends a `CL.THROTTLE`, an HTTP `/v1/check` and a
//! gRPC `ShouldRateLimit`, and reads the spans the server exported; with no `OTEL_*` variable
//! (or `OTEL_SDK_DISABLED=true`) nothing reaches it.

mod common;

#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");
const SHOULD_RATE_LIMIT: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// A span as received: its name, kind, ids, attributes (as text), and its resource's
/// `service.name`.
#[derive(Clone, Debug)]
struct Got {
    name: String,
    kind: i32,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent: Vec<u8>,
    attrs: Vec<(String, String)>,
    service: String,
}

impl Got {
    fn attr(&self, k: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// What the receiver has been sent: the first [`KEPT`] spans, and how many in all.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Got>>>, Arc<std::sync::atomic::AtomicUsize>);

/// The spans a receiver keeps (a benchmark's receiver gets millions).
const KEPT: usize = 100_000;

impl Received {
    fn add(&self, r: ExportTraceServiceRequest) {
        let mut all = self.0.lock().unwrap();
        let n: usize = r
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.1.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        if all.len() >= KEPT {
            return;
        }
        for rs in r.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(&kv.value))
                .unwrap_or_default();
            for s in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                all.push(Got {
                    name: s.name,
                    kind: s.kind,
                    trace_id: s.trace_id,
                    span_id: s.span_id,
                    parent: s.parent_span_id,
                    attrs: s
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(&kv.value)))
                        .collect(),
                    service: service.clone(),
                });
            }
        }
    }

    fn spans(&self) -> Vec<Got> {
        self.0.lock().unwrap().clone()
    }

    /// Waits (at most 20 s) until `n` spans named `name` have arrived, for each (name, n).
    fn wait_for(&self, want: &[(&str, usize)]) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.spans();
            let count = |n: &str| got.iter().filter(|g| g.name == n).count();
            if want.iter().all(|&(n, k)| count(n) >= k) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "spans {want:?} not all received after 20 s; got {:?}",
                got.iter().map(|g| &g.name).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.add(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The receiver's runtime and port; it serves until dropped.
struct Receiver {
    _rt: tokio::runtime::Runtime,
    port: u16,
    got: Received,
}

/// An OTLP receiver over gRPC (the collector's TraceService) on `port` (0: a free one);
/// `None` if the port is taken.
fn grpc_receiver(port: u16) -> Option<Receiver> {
    let rt = runtime();
    let got = Received::default();
    let l = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
        .ok()?;
    let port = l.local_addr().unwrap().port();
    let svc = TraceServiceServer::new(got.clone());
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
    );
    Some(Receiver { _rt: rt, port, got })
}

/// An OTLP receiver over HTTP/protobuf (`POST /v1/traces`) on `port` (0: a free one); `None`
/// if the port is taken.
fn http_receiver(port: u16) -> Option<Receiver> {
    use prost::Message;
    let rt = runtime();
    let got = Received::default();
    let l = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
        .ok()?;
    let port = l.local_addr().unwrap().port();
    let g = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let g = g.clone();
            async move {
                match ExportTraceServiceRequest::decode(body) {
                    Ok(r) => {
                        g.add(r);
                        let ok = ExportTraceServiceResponse::default().encode_to_vec();
                        (
                            axum::http::StatusCode::OK,
                            [("content-type", "application/x-protobuf")],
                            ok,
                        )
                    }
                    Err(_) => (
                        axum::http::StatusCode::BAD_REQUEST,
                        [("content-type", "text/plain")],
                        b"not an ExportTraceServiceRequest".to_vec(),
                    ),
                }
            }
        }),
    );
    rt.spawn(async move { axum::serve(l, app).await });
    Some(Receiver { _rt: rt, port, got })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// The server's configuration files in `dir`: rules (one per-customer limit of 1 an hour,
/// its counts in Redis when `redis` is given) and an Envoy domain.
fn configs(dir: &std::path::Path, redis: Option<&str>) -> (String, String) {
    let rules = dir.join("rules.toml");
    let backend = redis.map_or(String::new(), |url| {
        format!("[backend]\nredis = \"{url}\"\ntimeout = \"2s\"\n\n")
    });
    std::fs::write(
        &rules,
        format!(
            "{backend}[[rule]]\nname = \"per-customer\"\nkey = \"customer\"\n\
             limits = [{{ algorithm = \"fixed_window\", limit = 1, window = \"1h\" }}]\n"
        ),
    )
    .unwrap();
    let envoy = dir.join("envoy.yaml");
    std::fs::write(
        &envoy,
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .unwrap();
    (
        rules.to_str().unwrap().to_string(),
        envoy.to_str().unwrap().to_string(),
    )
}

/// The ports of a started server.
struct Ports {
    resp: u16,
    http: u16,
    grpc: u16,
}

/// `turnstile serve` with the rules and Envoy files, its environment without any `OTEL_*`
/// variable of the test's but with `env`, its log in `log`.
fn serve(
    rules: &str,
    envoy: &str,
    env: &[(&str, String)],
    log: &std::path::Path,
) -> (common::Running, Ports) {
    let p = Ports {
        resp: common::free_port(),
        http: common::free_port(),
        grpc: common::free_port(),
    };
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--workers", "1", "--throttle-keys", "1000"])
        .args(["--resp", &format!("127.0.0.1:{}", p.resp)])
        .args(["--http", &format!("127.0.0.1:{}", p.http)])
        .args(["--grpc", &format!("127.0.0.1:{}", p.grpc)])
        .args(["--rules", rules, "--envoy-config", envoy])
        .env("RUST_LOG", "info");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = common::spawn_listening_logged(&mut cmd, &[p.resp, p.http, p.grpc], log);
    (child, p)
}

/// One RESP command, its reply's first line and the lines after it (`lines` in all).
fn resp(port: u16, args: &[&str], lines: usize) -> Vec<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd += &format!("${}\r\n{a}\r\n", a.len());
    }
    s.write_all(cmd.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    (0..lines)
        .map(|_| {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            l.trim_end().to_string()
        })
        .collect()
}

/// `POST /v1/check` for customer `key` with extra header lines: the status.
fn check(port: u16, key: &str, headers: &str) -> u16 {
    let body = format!(r#"{{"key_class":"customer","key":"{key}"}}"#);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split(' ').nth(1).unwrap().parse().unwrap()
}

/// One gRPC ShouldRateLimit for domain `edge`, descriptor api_key=`key`: the overall code.
fn should_rate_limit(port: u16, key: &str) -> i32 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("connects");
        let r = c
            .should_rate_limit(RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "api_key".into(),
                        value: key.into(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 1,
            })
            .await
            .expect("ShouldRateLimit");
        r.get_ref().overall_code
    })
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// The three requests, each asserted as answered: a CL.THROTTLE, two checks of one customer
/// (the second over its limit, in the caller's trace), a ShouldRateLimit.
fn send_requests(p: &Ports) {
    let r = resp(p.resp, &["CL.THROTTLE", "user:1", "15", "30", "60"], 2);
    assert_eq!(r, ["*5", ":0"], "CL.THROTTLE allowed");
    assert_eq!(check(p.http, "42", ""), 200);
    let tp = format!("traceparent: 00-{TRACE_ID}-{PARENT_ID}-01\r\n");
    assert_eq!(check(p.http, "42", &tp), 429);
    assert_eq!(should_rate_limit(p.grpc, "k1"), 1, "OK");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The spans of [`send_requests`], with their names and attributes.
fn assert_request_spans(got: &[Got]) {
    let named = |n: &str| got.iter().filter(|g| g.name == n).collect::<Vec<_>>();
    let server = SpanKind::Server as i32;
    let t = named("CL.THROTTLE");
    assert_eq!(t.len(), 1, "{got:#?}");
    assert_eq!(t[0].kind, server);
    assert_eq!(t[0].service, "turnstile-under-test");
    assert_eq!(t[0].attr("turnstile.protocol"), Some("resp"));
    assert_eq!(t[0].attr("turnstile.command"), Some("CL.THROTTLE"));
    assert_eq!(t[0].attr("turnstile.decision"), Some("allowed"));

    let mut h = named("POST /v1/check");
    assert_eq!(h.len(), 2, "{got:#?}");
    h.sort_by_key(|s| s.attr("http.response.status_code").map(str::to_string));
    let (ok, over) = (h[0], h[1]);
    for s in [ok, over] {
        assert_eq!(s.kind, server);
        assert_eq!(s.attr("turnstile.protocol"), Some("http"));
        assert_eq!(s.attr("http.route"), Some("/v1/check"));
        assert_eq!(s.attr("http.request.method"), Some("POST"));
        assert_eq!(s.attr("turnstile.key_class"), Some("customer"));
    }
    assert_eq!(ok.attr("http.response.status_code"), Some("200"));
    assert_eq!(ok.attr("turnstile.decision"), Some("allowed"));
    assert_eq!(over.attr("http.response.status_code"), Some("429"));
    assert_eq!(over.attr("turnstile.decision"), Some("limited"));
    assert_eq!(over.attr("turnstile.rule"), Some("per-customer"));
    // The caller's trace continues: its trace id, its span the parent.
    assert_eq!(hex(&over.trace_id), TRACE_ID);
    assert_eq!(hex(&over.parent), PARENT_ID);
    assert!(
        ok.parent.is_empty(),
        "a request without traceparent is a root"
    );

    let g = named(SHOULD_RATE_LIMIT);
    assert_eq!(g.len(), 1, "{got:#?}");
    assert_eq!(g[0].kind, server);
    assert_eq!(g[0].attr("turnstile.protocol"), Some("grpc"));
    assert_eq!(g[0].attr("rpc.system"), Some("grpc"));
    assert_eq!(g[0].attr("rpc.method"), Some("ShouldRateLimit"));
    assert_eq!(g[0].attr("turnstile.domain"), Some("edge"));
    assert_eq!(g[0].attr("turnstile.decision"), Some("OK"));
}

fn otel_env(endpoint: String, protocol: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_string()),
        ("OTEL_SERVICE_NAME", "turnstile-under-test".to_string()),
        ("OTEL_TRACES_SAMPLER", "always_on".to_string()),
        // Export every 100 ms, not every 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
    ]
}

const ALL: [(&str, usize); 3] = [
    ("CL.THROTTLE", 1),
    ("POST /v1/check", 2),
    (SHOULD_RATE_LIMIT, 1),
];

/// Over gRPC: a span per request on each protocol, named and attributed.
#[test]
fn spans_of_each_protocol_reach_a_grpc_otlp_receiver() {
    let rx = grpc_receiver(0).expect("a free port");
    let dir = tempfile::tempdir().unwrap();
    let (rules, envoy) = configs(dir.path(), None);
    let env = otel_env(format!("http://127.0.0.1:{}", rx.port), "grpc");
    let (_s, p) = serve(&rules, &envoy, &env, &dir.path().join("log"));
    send_requests(&p);
    assert_request_spans(&rx.got.wait_for(&ALL));
}

/// Over HTTP/protobuf (the default protocol): the same spans.
#[test]
fn spans_of_each_protocol_reach_an_http_otlp_receiver() {
    let rx = http_receiver(0).expect("a free port");
    let dir = tempfile::tempdir().unwrap();
    let (rules, envoy) = configs(dir.path(), None);
    let mut env = otel_env(format!("http://127.0.0.1:{}", rx.port), "");
    env.retain(|(k, _)| *k != "OTEL_EXPORTER_OTLP_PROTOCOL");
    let (_s, p) = serve(&rules, &envoy, &env, &dir.path().join("log"));
    send_requests(&p);
    assert_request_spans(&rx.got.wait_for(&ALL));
}

/// With the counts in Redis (a real redis-server), a TURNSTILE.CHECK's span has the Redis
/// call as its child, in its trace.
#[test]
fn redis_calls_are_children_of_the_request_span() {
    let redis = redis_harness::Server::start();
    let rx = grpc_receiver(0).expect("a free port");
    let dir = tempfile::tempdir().unwrap();
    let (rules, envoy) = configs(dir.path(), Some(&redis.url()));
    let env = otel_env(format!("http://127.0.0.1:{}", rx.port), "grpc");
    let (_s, p) = serve(&rules, &envoy, &env, &dir.path().join("log"));
    let r = resp(p.resp, &["TURNSTILE.CHECK", "customer", "7"], 2);
    assert_eq!(r, ["*6", ":1"], "allowed");
    let got = rx.got.wait_for(&[("TURNSTILE.CHECK", 1), ("FCALL", 1)]);
    let cmd = got.iter().find(|g| g.name == "TURNSTILE.CHECK").unwrap();
    assert_eq!(cmd.attr("turnstile.decision"), Some("allowed"));
    assert_eq!(cmd.attr("turnstile.key_class"), Some("customer"));
    let call = got.iter().find(|g| g.name == "FCALL").unwrap();
    assert_eq!(call.kind, SpanKind::Client as i32);
    assert_eq!(call.attr("db.system.name"), Some("redis"));
    assert_eq!(call.trace_id, cmd.trace_id, "one trace");
    assert_eq!(call.parent, cmd.span_id, "the command's child");
}

/// No `OTEL_*` variable: no exporter (the log says nothing of traces, and receivers on the
/// OTLP default ports, where they are free, get nothing); `OTEL_SDK_DISABLED=true` beside an
/// endpoint: the same.
#[test]
fn nothing_is_exported_without_otel_variables_or_when_disabled() {
    let rx = grpc_receiver(0).expect("a free port");
    let defaults: Vec<Receiver> = [grpc_receiver(4317), http_receiver(4318)]
        .into_iter()
        .flatten()
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (rules, envoy) = configs(dir.path(), None);
    let mut disabled = otel_env(format!("http://127.0.0.1:{}", rx.port), "grpc");
    disabled.push(("OTEL_SDK_DISABLED", "true".to_string()));
    for (i, env) in [Vec::new(), disabled].into_iter().enumerate() {
        let log = dir.path().join(format!("log{i}"));
        let (s, p) = serve(&rules, &envoy, &env, &log);
        send_requests(&p);
        // Ten times the batch delay the variables ask for.
        std::thread::sleep(Duration::from_secs(1));
        drop(s);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("serving"), "{text}");
        assert!(!text.contains("OpenTelemetry"), "{text}");
        assert!(rx.got.spans().is_empty(), "{:?}", rx.got.spans());
        for d in &defaults {
            assert!(d.got.spans().is_empty(), "port {}", d.port);
        }
    }
}

/// Not a test: the OTLP receiver over gRPC for measuring the cost of tracing
/// (docs/service.md, "Tracing"), on `OTLP_RECEIVER_PORT` for `OTLP_RECEIVER_SECS` seconds
/// (default 600); prints the spans it received. Run with `--ignored --exact`.
#[test]
#[ignore = "a receiver for benchmarks, not a test"]
fn otlp_receiver_for_benchmarks() {
    let port = std::env::var("OTLP_RECEIVER_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(4317);
    let secs = std::env::var("OTLP_RECEIVER_SECS")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(600);
    let rx = grpc_receiver(port).expect("the receiver's port is free");
    std::thread::sleep(Duration::from_secs(secs));
    let n = rx.got.1.load(std::sync::atomic::Ordering::Relaxed);
    println!("spans received: {n}");
}

/// `parentbased_traceidratio` at 0: no root request is spanned, while a request whose caller's
/// trace is sampled (`traceparent` flags 01) is, in that trace; at 0.5, about half the
/// CL.THROTTLEs are.
#[test]
fn roots_follow_the_ratio_and_callers_their_own_decision() {
    let rx = grpc_receiver(0).expect("a free port");
    let dir = tempfile::tempdir().unwrap();
    let (rules, envoy) = configs(dir.path(), None);
    let mut env = otel_env(format!("http://127.0.0.1:{}", rx.port), "grpc");
    env.retain(|(k, _)| *k != "OTEL_TRACES_SAMPLER");
    env.push(("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".into()));
    env.push(("OTEL_TRACES_SAMPLER_ARG", "0".into()));
    let (s, p) = serve(&rules, &envoy, &env, &dir.path().join("log0"));
    send_requests(&p);
    rx.got.wait_for(&[("POST /v1/check", 1)]);
    // Five batch delays more: a root span exported by mistake would be in.
    std::thread::sleep(Duration::from_millis(500));
    let got = rx.got.spans();
    drop(s);
    assert_eq!(got.len(), 1, "only the caller's: {got:#?}");
    assert_eq!(hex(&got[0].trace_id), TRACE_ID);
    assert_eq!(got[0].attr("turnstile.decision"), Some("limited"));

    let rx = grpc_receiver(0).expect("a free port");
    let mut env = otel_env(format!("http://127.0.0.1:{}", rx.port), "grpc");
    env.retain(|(k, _)| *k != "OTEL_TRACES_SAMPLER");
    env.push(("OTEL_TRACES_SAMPLER", "traceidratio".into()));
    env.push(("OTEL_TRACES_SAMPLER_ARG", "0.5".into()));
    let (_s, p) = serve(&rules, &envoy, &env, &dir.path().join("log1"));
    let mut c = TcpStream::connect(("127.0.0.1", p.resp)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let one = "*5\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$4\r\n1000\r\n$4\r\n1000\r\n$2\r\n60\r\n";
    c.write_all(one.repeat(400).as_bytes()).unwrap();
    let mut r = BufReader::new(c);
    for _ in 0..400 * 6 {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
    }
    // 400 draws at 1/2: 200, sd 10; within 5 sd.
    rx.got.wait_for(&[("CL.THROTTLE", 150)]);
    std::thread::sleep(Duration::from_millis(500));
    let n = rx
        .got
        .spans()
        .iter()
        .filter(|g| g.name == "CL.THROTTLE")
        .count();
    assert!((150..=250).contains(&n), "{n} of 400");
}
