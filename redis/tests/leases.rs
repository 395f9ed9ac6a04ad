//! Leases: 4 simulated nodes (own connections) on one key over 10^5 requests; the admitted
//! total stays within each mode's stated bound (docs/redis.md).

mod common;

use std::sync::Arc;
use std::time::Duration;
use turnstile::{Limit, Limits};
use turnstile_redis::lease::{LeaseMode, LeasedStore};
use turnstile_redis::RedisStore;

const NODES: u64 = 4;
const REQUESTS: u64 = 100_000;
const LIMIT: u64 = 1000;

async fn run(url: &str, mode: LeaseMode, key: &str) -> (u64, u64) {
    let mut tasks = Vec::new();
    for _ in 0..NODES {
        // A bucket refilling one an hour: LIMIT admissions in all, whatever the timing.
        let l = Limit::token_bucket(LIMIT, 1, Duration::from_secs(3600)).unwrap();
        let store = RedisStore::builder(Limits::new(vec![l]).unwrap())
            .timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .unwrap();
        let node = Arc::new(LeasedStore::new(store, mode).unwrap());
        let key = key.to_string();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..REQUESTS / NODES {
                admitted += node.check(&key, 1).await.unwrap().allowed() as u64;
            }
            (admitted, node.round_trips())
        }));
    }
    let (mut admitted, mut trips) = (0, 0);
    for t in tasks {
        let (a, r) = t.await.unwrap();
        admitted += a;
        trips += r;
    }
    (admitted, trips)
}

#[test]
fn leases_stay_within_their_bounds() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let chunk = 100;
        let (a, trips) = run(&server.url(), LeaseMode::Reserve { chunk }, "reserve").await;
        eprintln!("reserve chunk {chunk}: admitted {a} of {LIMIT}, {trips} round trips");
        assert!(a <= LIMIT, "reservation never over-admits: {a}");
        assert!(
            a >= LIMIT - NODES * chunk,
            "at most nodes x chunk stranded: {a}"
        );

        let flush = 100;
        let (a, trips) = run(&server.url(), LeaseMode::Delayed { flush }, "delayed").await;
        eprintln!("delayed flush {flush}: admitted {a} of {LIMIT}, {trips} round trips");
        assert!(
            a <= LIMIT + NODES * flush,
            "over-admits at most nodes x flush: {a}"
        );
        assert!(a >= LIMIT, "{a}");
    });
}
