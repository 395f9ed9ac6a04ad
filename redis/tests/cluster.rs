//! RedisStore on a real 3-master Redis Cluster: the race across clients, several limits of one
//! key in one slot, a slot moved under a live key (MOVED followed, state kept), and a master
//! killed (errors answered by the policy, no panic).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};
use turnstile::{Limit, Limits, Outcome};
use turnstile_redis::RedisStore;

fn two_buckets() -> Limits {
    Limits::new(vec![
        Limit::token_bucket(100, 1, Duration::from_secs(3600)).unwrap(),
        Limit::fixed_window(1000, Duration::from_secs(3600)).unwrap(),
    ])
    .unwrap()
}

#[test]
fn cluster_race_moved_and_a_dead_master() {
    assert_eq!(
        common::slot("123456789"),
        12739,
        "the CRC16 of the Redis Cluster spec"
    );
    let mut cluster = common::Cluster::start();
    let rt = common::runtime();
    let urls = cluster.urls();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    rt.block_on(async {
        // The race: 16 clients, own connections, one key: exactly the limit, on each
        // algorithm exact at a test's time scale.
        let h = Duration::from_secs(3600);
        let cases = [
            two_buckets(),
            Limits::new(vec![Limit::sliding_log(100, h).unwrap()]).unwrap(),
            Limits::new(vec![Limit::concurrency(100, h).unwrap()]).unwrap(),
            Limits::new(vec![
                Limit::window_ring(100, h, 60).unwrap(),
                Limit::sliding_log(150, h).unwrap(),
            ])
            .unwrap(),
        ];
        for (i, ls) in cases.into_iter().enumerate() {
            let mut tasks = Vec::new();
            for _ in 0..16 {
                let store = RedisStore::builder(ls.clone())
                    .timeout(Duration::from_secs(5))
                    .connect_cluster(&refs)
                    .await
                    .unwrap();
                let key = format!("race{i}");
                tasks.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    for _ in 0..40 {
                        n += store.try_check(&key, 1).await.unwrap().allowed() as u64;
                    }
                    n
                }));
            }
            let mut admitted = 0;
            for t in tasks {
                admitted += t.await.unwrap();
            }
            assert_eq!(admitted, 100, "case {i}");
        }

        // Keys on every master, several limits each in one slot; pipelined.
        let store = RedisStore::builder(two_buckets())
            .timeout(Duration::from_secs(5))
            .connect_cluster(&refs)
            .await
            .unwrap();
        let keys: Vec<String> = (0..30).map(|i| format!("user{i}")).collect();
        let krefs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let d = store.try_check_many(&krefs, 1).await.unwrap();
        assert!(d.iter().all(|d| d.remaining == 99));
        for k in store.redis_keys("user0") {
            assert_eq!(common::slot(&k), common::slot("user0"), "{k}");
        }
        let per_node: Vec<u64> = cluster
            .nodes
            .iter()
            .map(|n| n.cli(&["dbsize"]).parse().unwrap())
            .collect();
        assert!(
            per_node.iter().all(|&n| n > 0),
            "keys on every master: {per_node:?}"
        );

        // A slot moved under a live key: the client follows MOVED and the state moved with it.
        let moved = (0..10_000)
            .map(|i| format!("m{i}"))
            .find(|k| common::slot(k) < 50)
            .unwrap();
        store.try_check(&moved, 1).await.unwrap();
        let owner = cluster
            .nodes
            .iter()
            .position(|n| {
                n.cli(&["dbsize"]) != "0"
                    && n.cli(&[
                        "cluster",
                        "countkeysinslot",
                        &common::slot(&moved).to_string(),
                    ]) != "0"
            })
            .unwrap();
        let to = (owner + 1) % 3;
        let id = |i: usize| cluster.nodes[i].cli(&["cluster", "myid"]);
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "reshard",
                &format!("127.0.0.1:{}", cluster.nodes[0].port),
            ])
            .args(["--cluster-from", &id(owner), "--cluster-to", &id(to)])
            .args(["--cluster-slots", "50", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let s = common::slot(&moved).to_string();
        assert_ne!(
            cluster.nodes[to].cli(&["cluster", "countkeysinslot", &s]),
            "0",
            "moved"
        );
        let d = store.try_check(&moved, 1).await.unwrap();
        assert_eq!(d.remaining, 98, "the state followed its slot");

        // A master killed: the keys it held fail (answered by the policy), the others go on.
        cluster.nodes[2].kill();
        let t0 = Instant::now();
        let mut ok = 0;
        for k in &krefs {
            let d = store.check(k, 1).await;
            if d.outcome == Outcome::Allowed {
                ok += 1;
            } else {
                assert_eq!(d.outcome, Outcome::StoreFull);
            }
        }
        assert!(ok > 0 && ok < 30, "{ok} answered by the live masters");
        assert!(store.stats().fallbacks > 0);
        assert!(t0.elapsed() < Duration::from_secs(30));
    });
}
