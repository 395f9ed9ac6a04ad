//! Memory in Redis on a real server: records packed in buckets hold a user in at most the
//! notes' 34 bytes, a log of 500 in at most 4 100, and window_ring's packed string is smaller
//! than the same counters in a hash (the layouts kept, docs/redis.md). `turnstile memory
//! --backend redis` prints every row (cli/tests/redis_backend.rs).

mod common;

use std::time::Duration;
use turnstile::{Limit, Limits};
use turnstile_redis::RedisStore;

fn used_memory(server: &common::Server) -> u64 {
    let info = server.cli(&["info", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory's used_memory")
}

/// `users` users checked once (pipelined by 500), in a store of `limit` packed for them:
/// used_memory's growth per user.
async fn bytes_per_user(server: &common::Server, limit: Limit, users: u64) -> f64 {
    let store = RedisStore::builder(Limits::new(vec![limit]).unwrap())
        .timeout(Duration::from_secs(10))
        .capacity(users)
        .connect(&server.url())
        .await
        .unwrap();
    let ids: Vec<String> = (0..users).map(|i| format!("user{i}")).collect();
    let fill = || async {
        for chunk in ids.chunks(500) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let d = store.try_check_many(&refs, 1).await.unwrap();
            assert!(d.iter().all(|d| d.allowed()));
        }
    };
    // A first fill (then flushed): the server's buffers for this connection and its
    // pipelines, and the library's caches, grow outside the figure.
    fill().await;
    server.cli(&["flushdb"]);
    let before = used_memory(server);
    fill().await;
    let per = (used_memory(server) - before) as f64 / users as f64;
    server.cli(&["flushdb"]);
    per
}

#[test]
fn packed_records_take_at_most_34_bytes_a_user() {
    let server = common::Server::start();
    let rt = common::runtime();
    let h = Duration::from_secs(3600);
    rt.block_on(async {
        for l in [
            Limit::fixed_window(500, h).unwrap(),
            Limit::sliding_window(500, h).unwrap(),
            Limit::token_bucket(500, 500, h).unwrap(),
            Limit::leaky_bucket(500, h, 499, None).unwrap(),
        ] {
            let per = bytes_per_user(&server, l, 20_000).await;
            eprintln!("{}: {per:.1} B per user", l.algorithm().name());
            assert!(per <= 34.0, "{l:?}: {per} B per user");
            let ht = server.cli(&["info", "keyspace"]);
            assert!(!ht.contains("keys="), "flushed: {ht}");
        }
    });
}

#[test]
fn a_log_of_500_takes_at_most_4100_bytes() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let l = Limit::sliding_log(500, Duration::from_secs(3600)).unwrap();
        let store = RedisStore::builder(Limits::new(vec![l]).unwrap())
            .timeout(Duration::from_secs(10))
            .connect(&server.url())
            .await
            .unwrap();
        let t0 = 1_763_900_000_000_000_000u64;
        for m in 0..100 {
            let d = store
                .check_at("u", 5, t0 + m * 36_000_000_000)
                .await
                .unwrap();
            assert!(d.allowed());
        }
        let key = &store.redis_keys("u")[0];
        let usage: u64 = server.cli(&["memory", "usage", key]).parse().unwrap();
        eprintln!("a log of 500: MEMORY USAGE {usage} B");
        assert!(usage <= 4_100, "{usage}");
        assert!(!store
            .check_at("u", 1, t0 + 3_599_000_000_000)
            .await
            .unwrap()
            .allowed());
    });
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
