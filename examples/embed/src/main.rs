//! The README's embedding example, as an outside crate runs it (`default-features = false`).

use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Limit, Limits, Outcome};

fn main() {
    // 500 requests per hour per customer, exact (a log of the last 500 admissions per key),
    // and at most 10 per second on top, checked all-or-nothing; room for 10 000 customers.
    let limits = Limits::new(vec![
        Limit::sliding_log(500, Duration::from_secs(3600)).unwrap(),
        Limit::token_bucket(10, 10, Duration::from_secs(1)).unwrap(),
    ])
    .unwrap();
    let store = Store::builder(limits).capacity(10_000).build().unwrap();

    let customer: u64 = 241_531;
    let d = store.check(&customer, 1);
    assert!(d.allowed());
    assert_eq!(d.remaining, 9); // the tighter of the two limits

    // API keys and IP addresses work the same way, without allocating.
    assert!(store.check("api-key-6f1d", 1).allowed());
    let ip: std::net::IpAddr = "203.0.113.9".parse().unwrap();
    let d = store.check(&ip, 11);
    assert_eq!(d.outcome, Outcome::NeverFits); // a cost of 11 can never fit a burst of 10
    assert_eq!(d.retry_after(), None);
    println!("the README's embedding example ran: every assertion held");
}
