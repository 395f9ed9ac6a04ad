//! `turnstile bench --engine redis` and `turnstile memory --backend redis` against a real
//! redis-server (a child process on a free loopback port, stopped at the end), with small
//! inputs; and the errors when Redis is unreachable or the URL is missing.

use serde_json::Value;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

// The one harness of the workspace's Redis tests (turnstile-redis's).
#[path = "../../redis/tests/common/mod.rs"]
mod common;
use common::Server as Redis;

fn turnstile(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(args)
        .output()
        .expect("the turnstile binary runs")
}

fn json(args: &[&str]) -> Value {
    let out = turnstile(args);
    assert!(
        out.status.success(),
        "turnstile {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

#[test]
fn bench_engine_redis_reports_every_algorithm_beside_incr() {
    let redis = Redis::start();
    let url = redis.url();
    let doc = json(&[
        "bench",
        "--engine",
        "redis",
        "--redis-url",
        &url,
        "--redis-requests",
        "256",
        "--json",
    ]);
    assert_eq!(doc["engine"], "redis");
    let rows = doc["results"].as_array().unwrap();
    for c in [1, 64] {
        for name in [
            "INCR",
            "fixed_window",
            "token_bucket",
            "sliding_window",
            "leaky_bucket",
            "sliding_log",
            "window_ring",
            "concurrency (acquire + release)",
            "fixed_window, leases (auto), 64 hot keys",
        ] {
            let r = rows
                .iter()
                .find(|r| r["name"] == name && r["concurrency"] == c)
                .unwrap_or_else(|| panic!("no row {name} at {c}"));
            assert!(r["calls_per_sec"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["vs_incr"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
}

#[test]
fn memory_backend_redis_reports_the_notes_rows() {
    let redis = Redis::start();
    let url = redis.url();
    let doc = json(&[
        "memory",
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--users",
        "50",
        "--json",
    ]);
    assert_eq!(doc["backend"], "redis");
    let rows = doc["results"].as_array().unwrap();
    // Four counter algorithms in both layouts, sliding_log, window_ring and concurrency once
    // checked, and the notes' two full rows.
    assert_eq!(rows.len(), 13, "{rows:?}");
    let packed: Vec<&Value> = rows.iter().filter(|r| r["layout"] == "packed").collect();
    assert_eq!(packed.len(), 4, "{rows:?}");
    for r in packed {
        assert_eq!(r["notes_bytes_per_user"], 34, "{r}");
        assert_eq!(r["encoding"], "listpack", "{r}");
        assert!(r["notes_arithmetic"].is_string(), "{r}");
    }
    let log = rows
        .iter()
        .find(|r| r["algorithm"] == "sliding_log" && r["notes_bytes_per_user"] == 12028)
        .expect("the notes' log of 500");
    // A packed log of 500: 4 bytes an entry, a third of the notes' 12 KB at most.
    assert!(log["memory_usage"].as_u64().unwrap() <= 4_100, "{log}");
    let ring = rows
        .iter()
        .find(|r| r["algorithm"] == "window_ring" && r["notes_bytes_per_user"] == 1588)
        .expect("the notes' 60 counters");
    assert!(ring["memory_usage"].as_u64().unwrap() < 1588, "{ring}");
    for r in rows {
        assert!(r["in_memory_bytes_per_user"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn unreachable_redis_is_a_clear_error() {
    // A port nobody listens on: bound, then released.
    let port = common::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    for args in [
        vec![
            "bench",
            "--engine",
            "redis",
            "--redis-url",
            url.as_str(),
            "--redis-requests",
            "100",
        ],
        vec![
            "memory",
            "--backend",
            "redis",
            "--redis-url",
            url.as_str(),
            "--users",
            "10",
        ],
    ] {
        let t0 = Instant::now();
        let out = turnstile(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&format!("redis at {url}")), "{err}");
        assert!(err.contains("redis-server"), "says what to do: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "gave up in {:?}",
            t0.elapsed()
        );
    }
    for (args, want) in [
        (vec!["bench", "--engine", "redis"], "needs --redis-url"),
        (vec!["memory", "--backend", "redis"], "needs --redis-url"),
        (
            vec!["bench", "--redis-url", url.as_str()],
            "is for --engine redis",
        ),
    ] {
        let out = turnstile(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
