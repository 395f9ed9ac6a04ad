//! `turnstile serve --grpc ADDR --envoy-config FILE`: the real server start (`start`), a tonic
//! client over loopback, then a graceful stop; and the start refused with a clear error for a
//! bad configuration or a missing flag.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use std::net::SocketAddr;
use turnstile_server::{start, ServeArgs};

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
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
    let addr = free_port();
    let running = start(args(Some(addr), Some(path))).unwrap();
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
    let e = start(args(Some(free_port()), Some(bad)))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("bad.yaml:4:") && e.contains("invalid rate limit unit 'fortnight'"),
        "{e}"
    );
    let e = start(args(Some(free_port()), None))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--envoy-config"), "{e}");
}
