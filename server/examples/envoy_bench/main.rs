//! ShouldRateLimit calls per second over gRPC, 1 and 64 concurrent streams, server and load
//! generator each pinned to a core, and in the same run the same checks over the other
//! listeners of `turnstile serve` (HTTP `POST /json`, RESP `TURNSTILE.CHECK`, HTTP
//! `POST /v1/check`): `cargo run --release -p turnstile-server --example envoy_bench -- [SECS]`.
//! `-- decision [CALLS]` measures only the decision without transport (for callgrind:
//! `valgrind --tool=callgrind target/release/examples/envoy_bench decision 100000`).

mod grpc;
mod wire;

use grpc::{decision_ns, run, Report};
use std::time::Duration;
use wire::Wire;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("decision") {
        let calls = args
            .get(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(1_000_000);
        match decision_ns(calls, 10_000) {
            Ok(ns) => println!("decision alone (no transport): {ns:.0} ns of CPU per call"),
            Err(e) => fail(e),
        }
        return;
    }
    let secs: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(5);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    match decision_ns(1_000_000, 10_000) {
        Ok(ns) => println!("decision alone (no transport): {ns:.0} ns of CPU per call\n"),
        Err(e) => fail(e),
    }
    let cores = core_affinity::get_core_ids().map_or(0, |v| v.len());
    let (server, client) = if cores >= 2 {
        (Some(0), Some(1))
    } else {
        (None, None)
    };
    println!("| transport | streams | calls/s | p50 µs | p99 µs | server CPU µs/call | calls/s per server core | calls | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let d = Duration::from_secs(secs);
    // Bounded in time and in count.
    let max = 50_000_000;
    for streams in [1, 64] {
        match run(streams, 10_000, d, max, server, client) {
            Ok(r) => row("gRPC ShouldRateLimit", &r),
            Err(e) => fail(e),
        }
        for w in [Wire::Json, Wire::Resp, Wire::Check] {
            match wire::run(w, streams, 10_000, d, max, client) {
                Ok(r) => row(w.label(), &r),
                Err(e) => fail(e),
            }
        }
    }
}

fn row(label: &str, r: &Report) {
    println!(
        "| {label} | {} | {:.0} | {:.1} | {:.1} | {:.2} | {:.0} | {} | {} |",
        r.streams,
        r.rate(),
        r.p50_us,
        r.p99_us,
        r.server_us_per_call(),
        r.calls_per_server_core(),
        r.calls,
        r.errors
    );
}

fn fail(e: String) -> ! {
    eprintln!("bench failed: {e}");
    std::process::exit(1);
}
