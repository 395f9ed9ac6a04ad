//! ShouldRateLimit calls per second, 1 and 64 concurrent streams, server and load generator
//! each pinned to a core: `cargo run --release -p turnstile-server --example envoy_bench -- [SECS]`.

use std::time::Duration;
use turnstile_server::envoy::bench::{decision_ns, run};

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    match decision_ns(1_000_000, 10_000) {
        Ok(ns) => println!("decision alone (no transport): {ns:.0} ns of CPU per call\n"),
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::exit(1);
        }
    }
    let cores = core_affinity::get_core_ids().map_or(0, |v| v.len());
    let (server, client) = if cores >= 2 {
        (Some(0), Some(1))
    } else {
        (None, None)
    };
    println!("| streams | calls/s | p50 µs | p99 µs | server CPU µs/call | calls/s per server core | calls | errors |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for streams in [1, 64] {
        // Bounded in time and in count.
        match run(
            streams,
            10_000,
            Duration::from_secs(secs),
            50_000_000,
            server,
            client,
        ) {
            Ok(r) => println!(
                "| {} | {:.0} | {:.1} | {:.1} | {:.2} | {:.0} | {} | {} |",
                r.streams,
                r.rate(),
                r.p50_us,
                r.p99_us,
                r.server_us_per_call(),
                r.calls_per_server_core(),
                r.calls,
                r.errors
            ),
            Err(e) => {
                eprintln!("bench failed: {e}");
                std::process::exit(1);
            }
        }
    }
}
