use std::time::Duration;
use turnstile::keyed::{FullPolicy, Store};
use turnstile::{Limit, Limits, Outcome};

#[test]
fn fill_to_capacity_places_every_key() {
    let l = Limit::token_bucket(10, 10, Duration::from_secs(1)).unwrap();
    let n = 1_000_000u64;
    let s = Store::builder(Limits::new(vec![l]).unwrap())
        .capacity(n)
        .seed(7)
        .shards(2)
        .build()
        .unwrap();
    let mut full = 0;
    for k in 0..n {
        let d = s.check_at(&(k * 7919), 1, 1_000);
        if d.outcome == Outcome::StoreFull {
            full += 1;
        }
    }
    eprintln!(
        "full {full} live {} mem {} B/key {:.2}",
        s.len(),
        s.memory_bytes(),
        s.memory_bytes() as f64 / n as f64
    );
    assert_eq!(s.len() as u64 + full, n);
    assert!(
        full * 1000 <= n,
        "more than 0.1% of keys found no slot: {full}"
    );
    let _ = FullPolicy::Reject;
}
