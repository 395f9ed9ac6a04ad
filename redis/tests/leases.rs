//! Leases against a real redis-server: nodes are stores with connections of their own.

mod common;

use std::sync::Arc;
use std::time::Duration;
use turnstile::{Limit, Limits};
use turnstile_redis::{LeaseMode, Leases, RedisStore};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

async fn node(url: &str, limits: Vec<Limit>, leases: Leases) -> RedisStore {
    RedisStore::builder(Limits::new(limits).unwrap())
        .timeout(Duration::from_secs(5))
        .leases(leases)
        .connect(url)
        .await
        .unwrap()
}

fn explicit() -> Leases {
    Leases::auto().sweep_every(None)
}

#[test]
fn a_hot_key_is_leased_and_answered_locally() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let l = Limit::fixed_window(1000, Duration::from_secs(10)).unwrap();
        let n = node(&server.url(), vec![l], explicit()).await;
        let t0 = 1_000 * S;
        let mut admitted = 0;
        for i in 0..2000u64 {
            let d = n.check_at("hot", 1, t0 + i * MS).await.unwrap();
            admitted += d.allowed() as u64;
        }
        let st = n.lease_stats().unwrap();
        eprintln!("{st:?}");
        assert_eq!(admitted, 1000, "{st:?}");
        assert!(st.local > 1900, "{st:?}");
        assert!(st.round_trips < 20, "{st:?}");
    });
}

#[test]
fn nodes_sharing_a_key_never_admit_over_its_limit() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        for mode in [LeaseMode::Reserve, LeaseMode::Delayed { flush: 50 }] {
            let l = Limit::fixed_window(1000, Duration::from_secs(3600)).unwrap();
            let mut tasks = Vec::new();
            let key = format!("shared-{mode:?}");
            for _ in 0..4 {
                let n = Arc::new(node(&server.url(), vec![l], Leases::auto().mode(mode)).await);
                let key = key.clone();
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0u64;
                    for _ in 0..5000 {
                        admitted += n.check(&key, 1).await.allowed() as u64;
                    }
                    n.return_leases().await;
                    (admitted, n.lease_stats().unwrap())
                }));
            }
            let mut admitted = 0;
            for t in tasks {
                let (a, st) = t.await.unwrap();
                eprintln!("{mode:?}: {a} {st:?}");
                admitted += a;
            }
            eprintln!("{mode:?}: admitted {admitted}");
            match mode {
                LeaseMode::Reserve => assert!((950..=1000).contains(&admitted), "{admitted}"),
                LeaseMode::Delayed { flush } => {
                    assert!((1000..=1000 + 4 * flush).contains(&admitted), "{admitted}")
                }
            }
        }
    });
}

/// Settles on a leased key: each request reserves 2 and uses 1 (a give-back into the lease)
/// or 3 (a charge, from the lease when it holds it); every unit is counted in Redis exactly
/// once — after the leases are given back, the key's count in Redis is the units the requests
/// used — and the lease answered most of them locally.
#[test]
fn settles_on_a_leased_key_are_counted_once() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let w = 10 * S;
        let l = Limit::fixed_window(1000, Duration::from_nanos(w)).unwrap();
        let n = node(&server.url(), vec![l], explicit()).await;
        let t0 = 1_000 * S;
        let (mut admitted, mut units) = (0u64, 0u64);
        for i in 0..1500u64 {
            let t = t0 + i * MS;
            if !n.check_at("hot", 2, t).await.unwrap().allowed() {
                continue;
            }
            admitted += 1;
            let actual = if i % 2 == 0 { 1 } else { 3 };
            n.settle_at("hot", 2, actual, t).await.unwrap();
            units += actual;
        }
        n.return_leases_at(t0 + 1500 * MS).await;
        let st = n.lease_stats().unwrap();
        // The record: the window's start plus its count, one integer (lua/fixed_window.lua).
        let key = &n.redis_keys("hot")[0];
        let v: String = redis::cmd("GET")
            .arg(key)
            .query_async(&mut n.connection())
            .await
            .unwrap();
        let count = (v.parse::<u128>().unwrap() % u128::from(w)) as u64;
        eprintln!("admitted {admitted}, units {units}, count {count}, {st:?}");
        assert_eq!(count, units, "{st:?}");
        assert!(admitted >= 450 && units <= 1000 + 2, "{admitted} {units}");
        assert!(st.local > 400, "{st:?}");
    });
}

#[test]
fn one_by_one_checks_go_in_shared_calls_and_decide_as_alone() {
    // Keys checked too rarely to be leased (3 checks each; a lease needs 4) by 32 tasks at
    // once on one leased store: their checks go to Redis together (op "m"), each decided as
    // alone — every key admits exactly its limit of 2 — in fewer calls than checks. One
    // limit, two (each check's keys in turn), and the packed layout (a field per check).
    let server = common::Server::start();
    let rt = common::runtime();
    let hour = Duration::from_secs(3600);
    let fw = Limit::fixed_window(2, hour).unwrap();
    let sw = Limit::sliding_window(5, hour).unwrap();
    let cases = [
        ("one", vec![fw], None),
        ("two", vec![sw, fw], None),
        ("packed", vec![fw], Some(4096)),
    ];
    rt.block_on(async {
        for (name, limits, capacity) in cases {
            let mut b = RedisStore::builder(Limits::new(limits).unwrap())
                .prefix(format!("batch-{name}:"))
                .timeout(Duration::from_secs(5))
                .leases(explicit());
            if let Some(c) = capacity {
                b = b.capacity(c);
            }
            let n = Arc::new(b.connect(&server.url()).await.unwrap());
            const KEYS: usize = 300;
            let mut tasks = Vec::new();
            for t in 0..32usize {
                let n = Arc::clone(&n);
                tasks.push(tokio::spawn(async move {
                    let mut admitted = vec![0u64; KEYS];
                    // Each key three times over all tasks: task t checks keys t, t + 32, ...
                    // in three rounds, offset so that tasks do not check one key at once.
                    for round in 0..3 {
                        for k in (0..KEYS).filter(|k| (k + round) % 32 == t) {
                            admitted[k] += n.check(&format!("k{k}"), 1).await.allowed() as u64;
                        }
                    }
                    admitted
                }));
            }
            let mut admitted = vec![0u64; KEYS];
            for t in tasks {
                for (a, x) in admitted.iter_mut().zip(t.await.unwrap()) {
                    *a += x;
                }
            }
            let st = n.lease_stats().unwrap();
            eprintln!("{name}: {st:?}");
            assert_eq!(st.checks, 3 * KEYS as u64, "{name}");
            assert_eq!(st.local, 0, "{name}: nothing leased");
            assert!(admitted.iter().all(|&a| a == 2), "{name}: {admitted:?}");
            assert!(st.round_trips < st.checks, "{name}: {st:?}");
        }
    });
}
