//! An axum server rate-limited by a rules file: one client IP may make 10 requests a minute;
//! GETs are shed with a 503 while two requests are in flight.
//!
//! ```sh
//! cargo run --release -p turnstile-tower --example axum -- [--addr 127.0.0.1:3000] \
//!     [--rules tower/examples/rules.toml] [--trust-proxy CIDR]...
//! ```
//!
//! No proxy is trusted unless `--trust-proxy` names it: then the client IP is the rightmost
//! `X-Forwarded-For` address that is not a trusted proxy.

use axum::{routing::get, Router};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use turnstile::rules::{Engine, Rules};
use turnstile_tower::{
    ClientIp, Describer, EngineLimit, IpSource, Policy, RateLimitLayer, TrustedProxies,
};

struct Args {
    addr: SocketAddr,
    rules: String,
    trust: Vec<String>,
}

// Three flags: a hand-written loop keeps the example free of an argument parser dependency.
fn args() -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.1:3000".parse().unwrap(),
        rules: concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules.toml").into(),
        trust: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--addr" => {
                let v = value()?;
                a.addr = v
                    .parse()
                    .map_err(|e| format!("--addr {v}: {e}; write e.g. 127.0.0.1:3000"))?;
            }
            "--rules" => a.rules = value()?,
            "--trust-proxy" => a.trust.push(value()?),
            "-h" | "--help" => {
                println!(
                    "usage: axum [--addr IP:PORT] [--rules FILE] [--trust-proxy CIDR]...\n\n\
                     An axum server limited by turnstile's rules (tower/README.md).\n\n  \
                     --addr IP:PORT       where to listen [default: 127.0.0.1:3000]\n  \
                     --rules FILE         the rules file [default: tower/examples/rules.toml]\n  \
                     --trust-proxy CIDR   a proxy whose Forwarded / X-Forwarded-For / X-Real-IP\n  \
                     \x20                    headers are believed (repeatable; none by default)"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`; try --help")),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let rules = Rules::from_file(&a.rules).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let trusted = TrustedProxies::parse(&a.trust).unwrap_or_else(|e| {
        eprintln!("--trust-proxy: {e}");
        std::process::exit(2)
    });
    let engine = Arc::new(Engine::new(rules).expect("validated rules compile"));
    let describe = Describer::new().ip(IpSource::Client(ClientIp::new(trusted)));
    let layer = RateLimitLayer::builder(EngineLimit::new(engine.clone(), describe))
        .policy(Policy::new("per-ip", Some(Duration::from_secs(60))).unwrap())
        .on_decision(turnstile_tower::observe::tracing_observer())
        .build();
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                "slow\n"
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind(a.addr)
        .await
        .unwrap_or_else(|e| {
            eprintln!("cannot listen on {}: {e}", a.addr);
            std::process::exit(1)
        });
    eprintln!("listening on http://{} ({})", a.addr, engine.summary());
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .expect("server");
}
