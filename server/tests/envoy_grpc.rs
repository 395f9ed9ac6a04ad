//! The compatibility suite over real sockets: a tonic client calls ShouldRateLimit on a server
//! listening on 127.0.0.1:0, and a raw HTTP/1.1 client posts the same requests to `/json`.
//! Each case is named after the upstream test it ports (docs/envoy.md lists them).

use bytes::{Buf, BufMut};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Code;
use turnstile_server::envoy::{self, config::parse, Envoy, Settings};

const OK: i32 = 1;
const OVER: i32 = 2;

/// Ported from upstream's basic_config.yaml, plus a shadow limit, an unlimited key, a wildcard
/// and a limit to exhaust.
const CFG: &str = "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1, name: hourly}
  - key: key6
    rate_limit: {unlimited: true}
  - key: wild
    value: foo*
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
";

struct Server {
    grpc: SocketAddr,
    http: SocketAddr,
    stop: Vec<oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Server {
    async fn start(cfg: &str) -> Server {
        let e =
            Arc::new(Envoy::new(&parse("cfg.yaml", cfg).unwrap(), Settings::default()).unwrap());
        let gl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (grpc, http) = (gl.local_addr().unwrap(), hl.local_addr().unwrap());
        let (s1, r1) = oneshot::channel::<()>();
        let (s2, r2) = oneshot::channel::<()>();
        let e2 = e.clone();
        let t1 = tokio::spawn(async move {
            envoy::grpc::serve(gl, e2, async {
                let _ = r1.await;
            })
            .await
            .unwrap();
        });
        let t2 = tokio::spawn(async move {
            axum::serve(hl, envoy::json_router(e, 64 << 10))
                .with_graceful_shutdown(async {
                    let _ = r2.await;
                })
                .await
                .unwrap();
        });
        Server {
            grpc,
            http,
            stop: vec![s1, s2],
            tasks: vec![t1, t2],
        }
    }

    async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    async fn stop(self) {
        for s in self.stop {
            let _ = s.send(());
        }
        for t in self.tasks {
            t.await.unwrap();
        }
    }
}

fn req(hits: u32, ds: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "test-domain".into(),
        descriptors: ds
            .iter()
            .map(|es| RateLimitDescriptor {
                entries: es
                    .iter()
                    .map(|(k, v)| Entry {
                        key: k.to_string(),
                        value: v.to_string(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

fn limited(code: i32, rpu: u32, unit: i32, name: &str, remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code,
        current_limit: Some(RateLimit {
            name: name.into(),
            requests_per_unit: rpu,
            unit,
        }),
        limit_remaining: remaining,
        ..Default::default()
    }
}

fn no_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: OK,
        ..Default::default()
    }
}

/// Compares field by field; `duration_until_reset` only for presence and range (it depends on
/// the wall clock: 1..=the window).
fn check(got: &RateLimitResponse, overall: i32, want: &[DescriptorStatus], case: &str) {
    assert_eq!(got.overall_code, overall, "{case}: overall code");
    assert_eq!(got.statuses.len(), want.len(), "{case}: statuses");
    for (i, (g, w)) in got.statuses.iter().zip(want).enumerate() {
        assert_eq!(g.code, w.code, "{case}: status {i} code");
        assert_eq!(
            g.current_limit, w.current_limit,
            "{case}: status {i} current_limit"
        );
        assert_eq!(
            g.limit_remaining, w.limit_remaining,
            "{case}: status {i} limit_remaining"
        );
        match (&g.current_limit, &g.duration_until_reset) {
            (Some(l), Some(d)) => {
                let window =
                    [0, 1, 60, 3600, 86_400, 2_592_000, 31_536_000, 604_800][l.unit as usize];
                assert!(
                    d.seconds >= 1 && d.seconds <= window,
                    "{case}: status {i} reset {d:?}"
                );
            }
            (None, None) => {}
            other => panic!("{case}: status {i}: limit and reset {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compatibility_suite_over_grpc() {
    let server = Server::start(CFG).await;
    let mut c = server.client().await;
    let call = |r: RateLimitRequest| {
        let mut c = c.clone();
        async move { c.should_rate_limit(r).await.unwrap().into_inner() }
    };

    // TestBasicConfig's lookups, answered by the service.
    let r = call(req(0, &[&[("key1", "value1"), ("subkey1", "something")]])).await;
    check(
        &r,
        OK,
        &[limited(OK, 5, 1, "", 4)],
        "basic: key1_value1.subkey1",
    );
    let r = call(req(0, &[&[("key1", "value1"), ("subkey1", "subvalue1")]])).await;
    check(
        &r,
        OK,
        &[limited(OK, 10, 1, "", 9)],
        "basic: key1_value1.subkey1_subvalue1",
    );
    let r = call(req(0, &[&[("key2", "something")]])).await;
    check(&r, OK, &[limited(OK, 20, 2, "", 19)], "basic: key2 default");
    let r = call(req(0, &[&[("key2", "value2")]])).await;
    check(&r, OK, &[limited(OK, 30, 2, "", 29)], "basic: key2_value2");
    let r = call(req(0, &[&[("key1", "something")]])).await;
    check(&r, OK, &[no_limit()], "basic: key1 without its value");
    let r = call(req(0, &[&[("key1", "value1")]])).await;
    check(
        &r,
        OK,
        &[no_limit()],
        "basic: key1_value1 has no limit of its own",
    );

    // TestService: several descriptors, one over → OVER_LIMIT, statuses in request order.
    let r = call(req(0, &[&[("key3", "a")], &[("nothing", "x")]])).await;
    check(
        &r,
        OK,
        &[limited(OK, 1, 3, "hourly", 0), no_limit()],
        "service: first",
    );
    let r = call(req(0, &[&[("nothing", "x")], &[("key3", "a")]])).await;
    check(
        &r,
        OVER,
        &[no_limit(), limited(OVER, 1, 3, "hourly", 0)],
        "service: over",
    );

    // TestUnlimited: OK with limit_remaining = MaxUint32.
    let r = call(req(0, &[&[("key6", "x")]])).await;
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    check(
        &r,
        OK,
        &[DescriptorStatus {
            code: OK,
            limit_remaining: u32::MAX,
            ..Default::default()
        }],
        "unlimited",
    );

    // TestWildcardConfig through the service: foo1 and foo2 share nothing but the limit.
    let r = call(req(2, &[&[("wild", "foo1")]])).await;
    check(&r, OK, &[limited(OK, 2, 4, "", 0)], "wildcard foo1");
    let r = call(req(0, &[&[("wild", "foo2")]])).await;
    check(&r, OK, &[limited(OK, 2, 4, "", 1)], "wildcard foo2");
    let r = call(req(0, &[&[("wild", "foo1")]])).await;
    check(
        &r,
        OVER,
        &[limited(OVER, 2, 4, "", 0)],
        "wildcard foo1 over",
    );
    let r = call(req(0, &[&[("wild", "bar")]])).await;
    check(&r, OK, &[no_limit()], "wildcard no match");

    // TestShadowModeConfig through the service: over but OK.
    let _ = call(req(0, &[&[("shadow", "s")]])).await;
    let r = call(req(0, &[&[("shadow", "s")]])).await;
    check(&r, OK, &[limited(OK, 1, 4, "", 0)], "shadow");

    // Unknown domain: OK, no limit.
    let mut u = req(0, &[&[("key2", "x")]]);
    u.domain = "unknown".into();
    check(&call(u).await, OK, &[no_limit()], "unknown domain");

    // Upstream's service errors (TestEmptyDomain, TestEmptyDescriptors): a plain Go error,
    // which grpc-go sends as UNKNOWN with the message.
    let mut e = req(0, &[&[("key2", "x")]]);
    e.domain.clear();
    let s = c.should_rate_limit(e).await.unwrap_err();
    assert_eq!(s.code(), Code::Unknown);
    assert_eq!(s.message(), "rate limit domain must not be empty");
    let s = c.should_rate_limit(req(0, &[])).await.unwrap_err();
    assert_eq!(s.code(), Code::Unknown);
    assert_eq!(s.message(), "rate limit descriptor list must not be empty");
    server.stop().await;
}

/// Sends raw bytes as the request message.
#[derive(Clone, Default)]
struct RawCodec;
struct RawEncoder;
struct RespDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RespDecoder {
    type Item = RateLimitResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut DecodeBuf<'_>,
    ) -> Result<Option<RateLimitResponse>, tonic::Status> {
        let b = src.copy_to_bytes(src.remaining());
        RateLimitResponse::decode(b)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = RateLimitResponse;
    type Encoder = RawEncoder;
    type Decoder = RespDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RespDecoder {
        RespDecoder
    }
}

async fn raw_call(addr: SocketAddr, body: Vec<u8>) -> Result<RateLimitResponse, tonic::Status> {
    raw_call_to(
        addr,
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        body,
    )
    .await
}

async fn raw_call_to(
    addr: SocketAddr,
    path: &'static str,
    body: Vec<u8>,
) -> Result<RateLimitResponse, tonic::Status> {
    let ch = tonic::transport::Endpoint::new(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut g = tonic::client::Grpc::new(ch).max_encoding_message_size(64 << 20);
    g.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(path);
    g.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_an_error_status() {
    let server = Server::start(CFG).await;
    // Malformed protobuf: field 1 (domain) claims 1000 bytes and has 3; then a bad wire type.
    for body in [
        vec![0x0a, 0xe8, 0x07, b'a', b'b', b'c'],
        vec![0x0f, 0x01],
        vec![0xff; 32],
    ] {
        let s = raw_call(server.grpc, body.clone()).await.unwrap_err();
        assert!(
            matches!(s.code(), Code::Internal | Code::InvalidArgument),
            "{body:?}: {s:?}"
        );
    }
    // A valid message through the raw path works (the codec is not the problem).
    let ok = raw_call(server.grpc, req(0, &[&[("key2", "raw")]]).encode_to_vec())
        .await
        .unwrap();
    assert_eq!(ok.overall_code, OK);
    // More descriptors than a request may have; a 1 MB value (past the message size
    // limit, `--max-body`, before the entry's own); an override with an unknown unit.
    let mut c = server.client().await;
    let ds: Vec<String> = (0..1025).map(|i| i.to_string()).collect();
    let owned: Vec<[(&str, &str); 1]> = ds.iter().map(|v| [("key2", v.as_str())]).collect();
    let refs: Vec<&[(&str, &str)]> = owned.iter().map(|a| &a[..]).collect();
    let s = c.should_rate_limit(req(0, &refs)).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    let big = "v".repeat(1 << 20);
    let s = c
        .should_rate_limit(req(0, &[&[("key2", &big)]]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::OutOfRange, "{s:?}");
    let mut r = req(0, &[&[("key2", "x")]]);
    r.descriptors[0].limit = Some(
        envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 1,
            unit: 42,
        },
    );
    let s = c.should_rate_limit(r).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    // A message over the size limit.
    let huge = req(0, &[&[("key2", &"w".repeat(5 << 20))]]).encode_to_vec();
    let s = raw_call(server.grpc, huge).await.unwrap_err();
    assert_eq!(s.code(), Code::OutOfRange, "{s:?}");
    // Another method, another service: UNIMPLEMENTED, as gRPC servers answer (the health
    // service beside it too).
    for path in [
        "/envoy.service.ratelimit.v3.RateLimitService/Nope",
        "/grpc.health.v1.Health/Nope",
        "/nope.v1.Nope/Check",
    ] {
        let s = raw_call_to(
            server.grpc,
            path,
            req(0, &[&[("key2", "x")]]).encode_to_vec(),
        )
        .await
        .unwrap_err();
        assert_eq!(s.code(), Code::Unimplemented, "{path}: {s:?}");
    }
    // HTTP/1 on the gRPC port: refused (the connection is closed), and the server lives on.
    let mut h1 = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
    h1.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        h1.read_to_end(&mut sink),
    )
    .await;
    assert!(!sink.starts_with(b"HTTP/1.1 200"), "{sink:?}");
    // The server still answers.
    let r = c
        .should_rate_limit(req(0, &[&[("key2", "after")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OK);
    server.stop().await;
}

async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let msg = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(msg.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_endpoint_and_healthcheck() {
    let server = Server::start(CFG).await;
    let (s, b) = http(server.http, "GET", "/healthcheck", "").await;
    assert_eq!((s, b.as_str()), (200, "OK"));
    let body =
        r#"{"domain":"test-domain","descriptors":[{"entries":[{"key":"key3","value":"j"}]}]}"#;
    let (s, b) = http(server.http, "POST", "/json", body).await;
    assert_eq!(s, 200, "{b}");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["code"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "HOUR");
    assert_eq!(v["statuses"][0]["currentLimit"]["name"], "hourly");
    assert!(
        v["statuses"][0].get("limitRemaining").is_none(),
        "0 is left out: {b}"
    );
    assert!(v["statuses"][0]["durationUntilReset"]
        .as_str()
        .unwrap()
        .ends_with('s'));
    let (s, b) = http(server.http, "POST", "/json", body).await;
    assert_eq!(s, 429, "{b}");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    // Bad requests: 400 with a reason.
    let (s, b) = http(server.http, "POST", "/json", "{nope").await;
    assert_eq!(s, 400);
    assert!(b.contains("invalid JSON"), "{b}");
    let (s, b) = http(
        server.http,
        "POST",
        "/json",
        r#"{"domain":"","descriptors":[{}]}"#,
    )
    .await;
    assert_eq!(s, 400);
    assert!(b.contains("domain must not be empty"), "{b}");
    server.stop().await;
}

/// Requests compressed with gzip (`grpc-encoding: gzip`, as grpc-go clients send them once
/// the gzip compressor is registered) are answered like plain ones, on the rate limit service
/// and the health service; a small compressed message that inflates past the message bound
/// (`--max-body`) is refused with `RESOURCE_EXHAUSTED`, the decompression stopped at the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_compressed_requests_are_accepted_within_the_message_bound() {
    use tonic::codec::CompressionEncoding;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let server = Server::start(CFG).await;
    let mut c = server
        .client()
        .await
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    let r = c
        .should_rate_limit(req(0, &[&[("key2", "gz")]]))
        .await
        .unwrap_or_else(|s| panic!("a gzip request: {s:?}"))
        .into_inner();
    check(&r, OK, &[limited(OK, 20, 2, "", 19)], "gzip: key2 default");
    // The same key again, compressed: counted on the same limit.
    let r = c
        .should_rate_limit(req(0, &[&[("key2", "gz")]]))
        .await
        .unwrap()
        .into_inner();
    check(&r, OK, &[limited(OK, 20, 2, "", 18)], "gzip: counted");
    // 1 MiB of one byte compresses to about 1 KiB: under the bound on the wire, over it
    // decompressed.
    let bomb = "v".repeat(1 << 20);
    let s = c
        .should_rate_limit(req(0, &[&[("key2", &bomb)]]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(s.message().contains("size limit"), "{s:?}");
    // The health service, compressed.
    let ch = tonic::transport::Endpoint::new(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(ch).send_compressed(CompressionEncoding::Gzip);
    let r = h
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap_or_else(|s| panic!("a gzip health check: {s:?}"));
    assert_eq!(r.get_ref().status(), ServingStatus::Serving);
    let s = h
        .check(HealthCheckRequest {
            service: "x".repeat(64 << 10),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    // The connection still answers.
    let r = c
        .should_rate_limit(req(0, &[&[("key2", "gz")]]))
        .await
        .unwrap()
        .into_inner();
    check(&r, OK, &[limited(OK, 20, 2, "", 17)], "gzip: after");
    server.stop().await;
}
