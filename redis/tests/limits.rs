//! Keys' own limits in a real Redis (`RedisLimits`): set, get and remove; a write by another
//! client (a plain `redis-cli HSET`) applied within 1 s through the tracking invalidation;
//! bad entries skipped; Redis killed: cached entries still answered, unknown keys `Unknown`
//! (the rule's defaults), and after a restart the cache refetches; the engine takes a key's
//! limit from Redis.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile::rules::limits::{KeyLimit, LimitsClass, LimitsSource, Lookup};
use turnstile::rules::{Engine, Request, Rules};
use turnstile_redis::limits::bucket_of;
use turnstile_redis::RedisLimits;

const RULES: &str = r#"
[limits.customers]
key = "customer"
algorithm = "token_bucket"
redis = "redis://127.0.0.1:1"
capacity = 6400

[limits.customers.plans]
free = { limit = 2, window = "1s", burst = 2 }
pro = { limit = 100, window = "1s", burst = 100 }

[[rule]]
name = "per-customer"
key = "customer"
limits_from = "customers"
limits = [{ algorithm = "token_bucket", limit = 5, window = "1s", burst = 5 }]
"#;

fn rules() -> Rules {
    Rules::parse(RULES, "rules.toml").unwrap()
}

fn class() -> LimitsClass {
    rules().classes[0].clone()
}

fn source(r: &common::Server) -> RedisLimits {
    RedisLimits::builder(&class())
        .prefix("t:")
        .timeout(Duration::from_millis(300))
        .connect(&r.url())
        .unwrap()
}

/// Polls `get` until `f` holds (at most `within`); how long it took.
fn until(
    s: &RedisLimits,
    id: u64,
    within: Duration,
    f: impl Fn(Lookup) -> bool,
) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < within {
        if f(s.get(id)) {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

fn plan(c: &LimitsClass, p: &str) -> turnstile::Limit {
    let spec = &c.plans.iter().find(|(n, _)| n == p).unwrap().1;
    c.build(spec).unwrap()
}

#[test]
fn set_get_remove_and_a_write_by_another_client_within_a_second() {
    let r = common::Server::start();
    let s = source(&r);
    let c = class();
    assert_eq!(s.buckets(), 100, "capacity 6400 / 64");
    // Not cached yet: Unknown, then fetched in the background: Default (no entry).
    assert_eq!(s.get(7), Lookup::Unknown);
    until(&s, 7, Duration::from_secs(1), |l| l == Lookup::Default).expect("fetched");

    s.set(7, &KeyLimit::Plan("pro".into())).unwrap();
    assert_eq!(s.get(7), Lookup::Own(plan(&c, "pro")), "applied at once");
    assert_eq!(s.entry(7), Some(KeyLimit::Plan("pro".into())));
    let bucket = s.keys().bucket(bucket_of(7, 100));
    assert_eq!(r.cli(&["HGET", &bucket, "7"]), "pro");
    let e = s.set(7, &KeyLimit::Plan("gold".into())).unwrap_err();
    assert!(e.message.contains("no plan `gold`"), "{e}");

    // Another client changes the entry: applied within 1 s.
    let t = Instant::now();
    r.cli(&["HSET", &bucket, "7", "9/1s burst=9"]);
    let own = c
        .build(&c.parse("9/1s burst=9").unwrap().clone().into_spec())
        .unwrap();
    until(&s, 7, Duration::from_secs(1), |l| l == Lookup::Own(own))
        .unwrap_or_else(|| panic!("not applied within 1 s: {:?}", s.get(7)));
    eprintln!("a hand-typed HSET applied after {:?}", t.elapsed());

    // A key of the same bucket never looked up is known as soon as the bucket is.
    let other = (8..10_000)
        .find(|i| bucket_of(*i, 100) == bucket_of(7, 100))
        .unwrap();
    r.cli(&["HSET", &bucket, &other.to_string(), "free"]);
    until(&s, other, Duration::from_secs(1), |l| {
        l == Lookup::Own(plan(&c, "free"))
    })
    .expect("the bucket's other key");

    // A bad entry is skipped (counted): its key gets the defaults.
    let third = (other + 1..20_000)
        .find(|i| bucket_of(*i, 100) == bucket_of(7, 100))
        .unwrap();
    r.cli(&["HSET", &bucket, &third.to_string(), "platinum"]);
    until(&s, 7, Duration::from_secs(1), |_| s.stats().bad_entries > 0).expect("skipped");
    assert_eq!(s.get(third), Lookup::Default);

    assert!(s.remove(7).unwrap());
    assert_eq!(s.get(7), Lookup::Default);
    assert!(!s.remove(7).unwrap());
    let mut all = Vec::new();
    s.export(&mut |id, e| all.push((id, e.to_string())));
    assert_eq!(all, vec![(other, "free".to_string())]);
    let st = s.stats();
    assert!(st.invalidations >= 2 && st.fetches >= 2, "{st:?}");
}

/// `LimitSpec` of a `KeyLimit::Limit`.
trait IntoSpec {
    fn into_spec(self) -> turnstile::LimitSpec;
}
impl IntoSpec for KeyLimit {
    fn into_spec(self) -> turnstile::LimitSpec {
        match self {
            KeyLimit::Limit(s) => s,
            KeyLimit::Plan(p) => panic!("a plan: {p}"),
        }
    }
}

#[test]
fn redis_killed_cached_limits_keep_serving_and_unknown_keys_get_defaults() {
    let mut r = common::Server::start();
    let s = source(&r);
    let c = class();
    s.set(1, &KeyLimit::Plan("pro".into())).unwrap();
    s.get(1);
    until(&s, 1, Duration::from_secs(1), |l| l != Lookup::Unknown).unwrap();
    s.get(2);
    until(&s, 2, Duration::from_secs(1), |l| l == Lookup::Default).unwrap();

    r.kill();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1500) {
        assert_eq!(s.get(1), Lookup::Own(plan(&c, "pro")), "cached, Redis away");
        assert_eq!(s.get(2), Lookup::Default, "cached negative, Redis away");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A key whose bucket was never fetched: Unknown (the rule's defaults), counted.
    let fresh = (3..10_000)
        .find(|i| ![bucket_of(1, 100), bucket_of(2, 100)].contains(&bucket_of(*i, 100)))
        .unwrap();
    let before = s.stats().unknown;
    for _ in 0..5 {
        assert_eq!(s.get(fresh), Lookup::Unknown);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(s.stats().unknown >= before + 5);
    assert!(s.set(5, &KeyLimit::Plan("pro".into())).is_err(), "no Redis");

    // Back (empty): the cache reconnects, refetches what it served, and sees Redis as it is.
    r.restart();
    let b = s.keys().bucket(bucket_of(fresh, 100));
    r.cli(&["HSET", &b, &fresh.to_string(), "free"]);
    until(&s, fresh, Duration::from_secs(5), |l| {
        l == Lookup::Own(plan(&c, "free"))
    })
    .unwrap_or_else(|| panic!("not refetched after restart: {:?}", s.stats()));
    until(&s, 1, Duration::from_secs(3), |l| l == Lookup::Default)
        .expect("the stale entry refetched from the emptied Redis");
    assert!(s.stats().reconnects >= 1);
}

#[test]
fn the_engine_takes_a_keys_limit_from_redis() {
    let r = common::Server::start();
    let s = Arc::new(source(&r));
    s.set(42, &KeyLimit::Plan("free".into())).unwrap();
    let e = Engine::builder(rules())
        .limits_source("customers", s.clone())
        .build()
        .unwrap();
    let req = Request::new().customer(42);
    // First request: Unknown, the rule's 5 apply while the bucket is fetched.
    let _ = e.check(&req);
    until(&s, 42, Duration::from_secs(1), |l| l != Lookup::Unknown).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let allowed = (0..10).filter(|_| e.check(&req).allowed()).count();
    assert_eq!(allowed, 2, "plan free: burst 2");
    let other = Request::new().customer(43);
    let _ = e.check(&other);
    until(&s, 43, Duration::from_secs(1), |l| l != Lookup::Unknown).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let allowed = (0..10).filter(|_| e.check(&other).allowed()).count();
    assert_eq!(allowed, 5, "no entry: the rule's 5");
}
