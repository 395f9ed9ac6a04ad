//! Memory in Redis on a real server: `memory::measure` fills users per algorithm (what
//! `turnstile memory --backend redis` prints), and window_ring's packed string is smaller than
//! the same counters in a hash (the layout kept, docs/redis.md).

mod common;

use std::time::Duration;
use turnstile::{Limit, Limits};
use turnstile_redis::RedisStore;

#[test]
fn measure_fills_every_algorithm() {
    let server = common::Server::start();
    let rt = common::runtime();
    let rows = rt
        .block_on(turnstile_redis::memory::measure(&server.url(), 300))
        .unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    for a in [
        "fixed_window",
        "sliding_window",
        "token_bucket",
        "leaky_bucket",
        "sliding_log",
        "window_ring",
        "concurrency",
    ] {
        assert!(names.contains(&a), "{a} missing: {names:?}");
    }
    for r in &rows {
        assert_eq!(r.users, 300, "{r:?}");
        assert!(r.memory_usage > 0 && r.bytes_per_user > 0.0, "{r:?}");
    }
    let log = rows
        .iter()
        .find(|r| r.fill.starts_with("500 admissions"))
        .unwrap();
    assert_eq!(log.encoding, "skiplist", "{log:?}");
    assert!(log.memory_usage > 10_000, "{log:?}");
    let ring = rows
        .iter()
        .find(|r| r.fill.starts_with("8 a minute"))
        .unwrap();
    assert!(ring.memory_usage < 400, "{ring:?}");
    assert_eq!(server.cli(&["dbsize"]), "0", "flushed at the end");
}

/// The window_ring layout: a user's 61 counters as the script packs them, against the same
/// counters in a hash (field per sub-window, as the notes' design), by MEMORY USAGE.
#[test]
fn a_packed_ring_is_smaller_than_a_hash() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let t0 = 1_763_900_000_000_000_000u64;
        // (limit per hour, minutes with requests, requests a minute): all admitted.
        for (limit, users, per) in [
            (500, 1u64, 1u64),
            (500, 5, 8),
            (500, 61, 8),
            (60_000, 61, 900),
        ] {
            let l = Limit::window_ring(limit, Duration::from_secs(3600), 60).unwrap();
            let store = RedisStore::builder(Limits::new(vec![l]).unwrap())
                .timeout(Duration::from_secs(5))
                .connect(&server.url())
                .await
                .unwrap();
            server.cli(&["flushall"]);
            for m in 0..users {
                let d = store
                    .check_at("u", per, t0 + m * 60_000_000_000)
                    .await
                    .unwrap();
                assert!(d.allowed());
            }
            // Under a one-letter name each (MEMORY USAGE counts the key's name too).
            server.cli(&["copy", &store.redis_keys("u")[0], "s"]);
            let packed: u64 = server.cli(&["memory", "usage", "s"]).parse().unwrap();
            let mut hset = vec!["hset".to_string(), "h".into(), "t".into(), t0.to_string()];
            for m in 0..users {
                hset.push(m.to_string());
                hset.push(per.to_string());
            }
            let args: Vec<&str> = hset.iter().map(String::as_str).collect();
            server.cli(&args);
            let hash: u64 = server.cli(&["memory", "usage", "h"]).parse().unwrap();
            eprintln!(
                "{limit}/h, {users} counters of {per}: packed string {packed} B, hash {hash} B"
            );
            assert!(packed <= hash, "{users} x {per}: {packed} > {hash}");
        }
    });
}
