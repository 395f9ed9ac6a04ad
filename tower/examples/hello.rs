//! An axum hello world, with or without turnstile's layer (keyed by peer IP, IETF headers on,
//! a quota nothing exceeds): the server of the `wrk` comparison in `docs/tower.md`. One thread
//! (run it pinned with `taskset`).
//!
//! - `--layer`: `Router::layer`, the usual way (axum wraps the layer around each route and
//!   boxes it again);
//! - `--layer-outside`: the layer around the whole router, as a service (`Layer::layer(router)`),
//!   for a limit every route shares: no per-route boxing;
//! - `--no-headers`: the layer without its rate-limit headers (`HeaderStyle::None`).
//!
//! `cargo run --release -p turnstile-tower --example hello -- [--layer | --layer-outside] [--no-headers] [--addr 127.0.0.1:3001]`

use axum::extract::Request;
use axum::{routing::get, Router};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tower::Layer;
use turnstile::keyed::Store;
use turnstile::Limit;
use turnstile_tower::{HeaderStyle, PeerIp, RateLimitLayer, StoreLimit};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let inside = args.iter().any(|a| a == "--layer");
    let outside = args.iter().any(|a| a == "--layer-outside");
    let headers = if args.iter().any(|a| a == "--no-headers") {
        HeaderStyle::None
    } else {
        HeaderStyle::Ietf
    };
    let addr: SocketAddr = args
        .iter()
        .position(|a| a == "--addr")
        .and_then(|i| args.get(i + 1))
        .map_or("127.0.0.1:3001", |s| s.as_str())
        .parse()
        .expect("--addr IP:PORT");
    let layer = || {
        let quota = Limit::token_bucket(1_000_000_000, 1_000_000_000, Duration::from_secs(1))
            .expect("quota");
        let store = Arc::new(Store::with_capacity(quota, 100_000).expect("store"));
        RateLimitLayer::builder(StoreLimit::new(store, PeerIp))
            .headers(headers.clone())
            .build()
    };
    let mut app = Router::new().route("/", get(|| async { "Hello, World!" }));
    if inside {
        app = app.layer(layer());
    }
    let l = tokio::net::TcpListener::bind(addr).await.expect("bind");
    eprintln!("listening on http://{addr} (layer inside: {inside}, outside: {outside})");
    if outside {
        // The layer's body carries its permit; axum's server takes its own body type.
        let svc = tower::ServiceExt::<Request>::map_response(layer().layer(app), |r| {
            r.map(axum::body::Body::new)
        });
        let make =
            axum::ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(svc);
        axum::serve(l, make).await.expect("serve");
    } else {
        axum::serve(l, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .expect("serve");
    }
}
