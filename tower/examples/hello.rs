//! An axum hello world, with (`--layer`) or without turnstile's layer (keyed by peer IP,
//! IETF headers on, a quota nothing exceeds): the server of the `wrk` comparison in
//! `docs/tower.md`. One thread (run it pinned with `taskset`).
//!
//! `cargo run --release -p turnstile-tower --example hello -- [--layer] [--addr 127.0.0.1:3001]`

use axum::{routing::get, Router};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::Limit;
use turnstile_tower::{PeerIp, RateLimitLayer, StoreLimit};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let layer = args.iter().any(|a| a == "--layer");
    let addr: SocketAddr = args
        .iter()
        .position(|a| a == "--addr")
        .and_then(|i| args.get(i + 1))
        .map_or("127.0.0.1:3001", |s| s.as_str())
        .parse()
        .expect("--addr IP:PORT");
    let mut app = Router::new().route("/", get(|| async { "Hello, World!" }));
    if layer {
        let quota = Limit::token_bucket(1_000_000_000, 1_000_000_000, Duration::from_secs(1))
            .expect("quota");
        let store = Arc::new(Store::with_capacity(quota, 100_000).expect("store"));
        app = app.layer(RateLimitLayer::new(StoreLimit::new(store, PeerIp)));
    }
    let l = tokio::net::TcpListener::bind(addr).await.expect("bind");
    eprintln!("listening on http://{addr} (layer: {layer})");
    axum::serve(l, app.into_make_service_with_connect_info::<SocketAddr>())
        .await
        .expect("serve");
}
