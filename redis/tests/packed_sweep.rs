//! The packed layout's sweep at explicit times: a record is judged idle with the hour's
//! allowance explicit-time TTLs get, so a later call stamped earlier finds it as the
//! in-memory store does.

mod common;

use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Limit, Limits};
use turnstile_redis::RedisStore;

const S: u64 = 1_000_000_000;

#[test]
fn a_sweep_at_a_later_time_keeps_what_an_earlier_call_still_reads() {
    let server = common::Server::start();
    let rt = common::runtime();
    let limits =
        Limits::new(vec![Limit::fixed_window(1, Duration::from_secs(1)).unwrap()]).unwrap();
    let memory = Store::builder(limits.clone())
        .capacity(1000)
        .build()
        .unwrap();
    rt.block_on(async {
        // Capacity 32: one bucket; 40 keys make it sweep.
        let redis = RedisStore::builder(limits)
            .capacity(32)
            .connect(&server.url())
            .await
            .unwrap();
        let t1 = 1_000 * S;
        for i in 0..40 {
            let k = format!("a{i}");
            let d = redis.check_at(&k, 1, t1).await.unwrap();
            assert_eq!(d, memory.check_at(&k, 1, t1));
        }
        // Ten seconds on, new keys sweep the bucket: every record above is idle then.
        let t2 = t1 + 10 * S;
        for i in 0..40 {
            let k = format!("b{i}");
            let d = redis.check_at(&k, 1, t2).await.unwrap();
            assert_eq!(d, memory.check_at(&k, 1, t2));
        }
        // A call stamped in the first window again: its key still holds its admission.
        let t = t1 + S / 2;
        for i in 0..40 {
            let k = format!("a{i}");
            let d = redis.check_at(&k, 1, t).await.unwrap();
            assert_eq!(d, memory.check_at(&k, 1, t), "{k}");
            assert!(!d.allowed(), "{k}: admitted again");
        }
    });
}
