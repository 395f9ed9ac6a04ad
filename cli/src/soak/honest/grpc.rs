//! The honest gRPC clients: Envoy's `ShouldRateLimit` through envoy-types' generated tonic
//! client (one HTTP/2 connection each, one call at a time), with the password as
//! `authorization` metadata. The domain `soak` is in no configuration: each call goes through
//! the whole service and is answered OK, so that its latency and errors are the measurement.

use super::{connected, key_of, Pace, Recorder, Seen, KEYS, TIMEOUT};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};

type Client = RateLimitServiceClient<Channel>;

async fn connect(addr: SocketAddr) -> crate::Result<Client> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(TIMEOUT)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("{e} ({e:?})"))?;
    Ok(RateLimitServiceClient::new(channel))
}

/// The request for key `k` of client `client` of run `run`.
fn request(run: u64, client: usize, k: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "soak".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "soak_client".into(),
                value: format!("{run}:{client}:{k}"),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// One gRPC client: a `ShouldRateLimit` every `every` until `stop`.
pub async fn grpc_client(
    addr: SocketAddr,
    password: Option<Vec<u8>>,
    (run, client): (u64, usize),
    every: Duration,
    stop: Arc<AtomicBool>,
    rec: Arc<Recorder>,
) -> Seen {
    let mut seen = Seen::new(KEYS);
    let bearer = match password {
        Some(p) => {
            let mut v = b"Bearer ".to_vec();
            v.extend_from_slice(&p);
            match AsciiMetadataValue::try_from(v.as_slice()) {
                Ok(v) => Some(v),
                Err(_) => {
                    seen.failed("the password cannot be gRPC metadata (not ASCII)".into());
                    return seen;
                }
            }
        }
        None => None,
    };
    let mut con = None;
    let mut pace = Pace::new(every, stop);
    let mut i = 0u64;
    while pace.next().await {
        let connect = || async {
            tokio::time::timeout(TIMEOUT, connect(addr))
                .await
                .unwrap_or_else(|_| Err("no connection within 10 s".into()))
        };
        let Some(c) = connected(&mut con, &mut seen, connect).await else {
            continue;
        };
        i += 1;
        let k = key_of(i, KEYS);
        let mut req = tonic::Request::new(request(run, client, k));
        if let Some(b) = &bearer {
            req.metadata_mut().insert("authorization", b.clone());
        }
        let t = Instant::now();
        let r = tokio::time::timeout(TIMEOUT, c.should_rate_limit(req)).await;
        let took = t.elapsed();
        match r {
            Ok(Ok(resp)) => {
                rec.record(took);
                seen.answered(k, resp.into_inner().overall_code != Code::OverLimit as i32);
            }
            Ok(Err(status)) => {
                seen.error(k, format!("ShouldRateLimit: {status}"));
            }
            Err(_) => {
                seen.error(k, "ShouldRateLimit: no answer within 10 s".into());
                con = None;
            }
        }
    }
    seen
}
