//! The same generated traces through `RedisStore` (explicit `now`) and through the in-memory
//! `turnstile::keyed::Store` give the same decisions, field for field; every key's TTL covers
//! the time until its record is idle, and a key whose record is idle is gone.
//!
//! Generators in the manner of tests/reference.rs: limits 1, small, large and each maximum;
//! windows from 1 ms to a day (odd ones too); start times at 0, today's Unix time in ns and
//! 2^62 ns; time steps of 0, 1 ns, fractions, whole units ± 1 ns and to the next boundary ± 1;
//! costs 1, small, the capacity and beyond it; checks, peeks, refunds and checks up to two
//! units in the past (time going backwards); 1 to 3 limits.
//! `PROPTEST_CASES=N` runs N cases (default 48).

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::time::Duration;
use turnstile::algo::{fixed_window, sliding_window};
use turnstile::keyed::Store;
use turnstile::{Algorithm, Limit, LimitSpec, Limits};
use turnstile_redis::{RedisStore, EXPLICIT_NOW_TTL_SLACK_MS, MAX_DURATION_NS};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const DAY: u64 = 86_400 * S;

fn window() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(MS),
        Just(7 * MS + 3),
        Just(S),
        Just(60 * S),
        Just(3600 * S),
        Just(DAY),
        MS..=DAY,
    ]
}

fn limit(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![3 => Just(1u64), 6 => 2u64..=12, 2 => 13u64..=1000, 1 => Just(max)]
}

fn one_limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        (limit(fixed_window::MAX_LIMIT), window(), any::<bool>()).prop_map(|(l, w, cd)| {
            LimitSpec {
                count_denied: cd,
                ..LimitSpec::new(Algorithm::FixedWindow, l, Duration::from_nanos(w))
            }
            .build()
            .unwrap()
        }),
        (limit(sliding_window::MAX_LIMIT), window(), any::<bool>()).prop_map(|(l, w, cd)| {
            LimitSpec {
                count_denied: cd,
                ..LimitSpec::new(Algorithm::SlidingWindow, l, Duration::from_nanos(w))
            }
            .build()
            .unwrap()
        }),
        // Buckets spanning more than 2^52 ns are refused on Redis (a test below).
        (
            limit(1 << 20),
            prop_oneof![Just(1u64), Just(15), 1u64..=1000],
            window()
        )
            .prop_filter_map("span beyond 2^52 ns", |(cap, rate, w)| {
                Limit::token_bucket(cap, rate, Duration::from_nanos(w))
                    .ok()
                    .filter(|l| matches!(l, Limit::TokenBucket(p) if p.tau <= MAX_DURATION_NS))
            }),
        (
            prop_oneof![Just(1u64), Just(10), 1u64..=1000],
            window(),
            0u64..=20,
            any::<u8>()
        )
            .prop_map(|(rate, w, burst, d)| {
                let delay = (d % 3 == 0).then_some(d as u64 % (burst + 1));
                Limit::leaky_bucket(rate, Duration::from_nanos(w), burst, delay).unwrap()
            }),
    ]
}

#[derive(Clone, Debug)]
struct Op {
    step: u8,
    raw: u64,
    cost: u8,
    act: u8,
}

fn op() -> impl Strategy<Value = Op> {
    (any::<u8>(), any::<u64>(), any::<u8>(), any::<u8>()).prop_map(|(step, raw, cost, act)| Op {
        step,
        raw,
        cost,
        act,
    })
}

/// A time step (tests/reference.rs's kinds) over the limits' natural periods.
fn step(kind: u8, raw: u64, now: u64, units: &[u64]) -> u64 {
    let unit = units[(raw % units.len() as u64) as usize].clamp(1, 1 << 52);
    let r = raw >> 8;
    let jitter = |x: u64| (x + (r >> 2) % 3).saturating_sub(1);
    match kind % 10 {
        0..=2 => 0,
        3 => 1,
        4 => r % (unit / 8 + 1),
        5 => r % (unit + 1),
        6 => jitter((1 + r % 3) * unit),
        7 | 8 => jitter(unit - now % unit),
        _ => r % (3 * unit + 1),
    }
}

fn cost_of(kind: u8, raw: u64, cap: u64) -> u64 {
    match kind % 16 {
        0..=8 => 1,
        9 | 10 => 1 + raw % cap.min(8),
        11 | 12 => 1 + raw % cap,
        13 => cap,
        14 => cap + 1,
        _ => 0,
    }
}

fn units(l: &Limit) -> u64 {
    match l {
        Limit::FixedWindow(p) => p.window,
        Limit::SlidingWindow(p) => p.window,
        Limit::TokenBucket(p) => p.interval,
        Limit::LeakyBucket(p) => p.interval,
        _ => S,
    }
}

#[test]
fn redis_matches_the_in_memory_store() {
    let server = common::Server::start();
    let rt = common::runtime();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let starts = prop_oneof![
        Just(0u64),
        Just(1_763_900_000 * S),
        Just(1u64 << 62),
        0u64..1 << 62
    ];
    let strategy = (
        prop::collection::vec(one_limit(), 1..=3),
        starts,
        prop::collection::vec(op(), 1..60),
    );
    let case = std::sync::atomic::AtomicU64::new(0);
    let url = server.url();
    runner
        .run(&strategy, |(limits, start, ops)| {
            let c = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            rt.block_on(run_case(&url, c, limits, start, ops))
        })
        .unwrap();
}

async fn run_case(
    url: &str,
    case: u64,
    limits: Vec<Limit>,
    start: u64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let ls = Limits::new(limits.clone()).unwrap();
    let redis = RedisStore::builder(ls.clone())
        .timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap();
    let mem = Store::builder(ls.clone()).capacity(16).build().unwrap();
    let mut conn = redis.connection();
    let key = format!("case{case}");
    let rkeys = redis.redis_keys(&key);
    // A shadow record (every supported limit is one packed word) for the idle times.
    let mut rec = vec![0u64; ls.words()];
    let cap = limits.iter().map(Limit::capacity).min().unwrap();
    let us: Vec<u64> = limits.iter().map(units).collect();
    // The in-memory packed window indexes alias once a record is idle for 2^22 windows
    // (sliding_window) or 2^38 (fixed_window): a spurious denial there (docs/algorithms.md).
    // Redis keeps whole times and never aliases, so traces stay within those spans.
    let span = limits
        .iter()
        .map(|l| match l {
            Limit::SlidingWindow(p) => p.window.saturating_mul(1 << 21),
            Limit::FixedWindow(p) => p.window.saturating_mul(1 << 37),
            _ => u64::MAX,
        })
        .min()
        .unwrap();
    let mut now = start;
    for (i, o) in ops.iter().enumerate() {
        now += step(o.step, o.raw, now, &us).min(span / 64);
        let cost = cost_of(o.cost, o.raw >> 3, cap);
        let before = rec.clone();
        let what;
        // Time going backwards: a check up to two units before the latest time.
        let mut at = now;
        match o.act % 10 {
            9 => {
                at = now.saturating_sub((o.raw >> 11) % (2 * us[0] + 1));
                what = format!("check({cost}) {} ns back", now - at);
                let m = mem.check_at(key.as_str(), cost, at);
                let r = redis.check_at(&key, cost, at).await.unwrap();
                ls.decide(&mut rec[..], at, cost);
                prop_assert_eq!(r, m, "step {} {} at {}", i, what, at);
            }
            0..=6 => {
                what = format!("check({cost})");
                let m = mem.check_at(key.as_str(), cost, now);
                let r = redis.check_at(&key, cost, now).await.unwrap();
                ls.decide(&mut rec[..], now, cost);
                prop_assert_eq!(r, m, "step {} {} at {}", i, what, now);
            }
            7 | 8 => {
                what = "peek".to_string();
                let m = mem.peek_at(key.as_str(), now);
                let r = redis.peek_at(&key, now).await.unwrap();
                prop_assert_eq!(r, m, "step {} peek at {}", i, now);
            }
            _ => {
                what = format!("refund({cost})");
                mem.refund_at(key.as_str(), cost, now);
                redis.refund_at(&key, cost, now).await.unwrap();
                ls.refund(&mut rec[..], now, cost);
                let m = mem.peek_at(key.as_str(), now);
                let r = redis.peek_at(&key, now).await.unwrap();
                prop_assert_eq!(r, m, "step {} peek after refund at {}", i, now);
            }
        }
        // TTLs: never shorter than the record's idle time; just after a write, exactly it
        // (rounded up to a ms); an idle record's key gone once written.
        for (j, l) in limits.iter().enumerate() {
            // Idle at the latest time the trace reached (a key must outlive it), and at the
            // time of this step's write (which sets the TTL).
            let idle = l.idle_in(&[rec[j]][..], now);
            let want = idle.div_ceil(MS) as i64 + EXPLICIT_NOW_TTL_SLACK_MS as i64;
            let idle_at = l.idle_in(&[rec[j]][..], at);
            let set = idle_at.div_ceil(MS) as i64 + EXPLICIT_NOW_TTL_SLACK_MS as i64;
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&rkeys[j])
                .query_async(&mut conn)
                .await
                .unwrap();
            if idle > 0 {
                prop_assert!(
                    pttl >= want - 2000,
                    "step {} {}: key {} expires in {} ms, idle in {} ns",
                    i,
                    what,
                    rkeys[j],
                    pttl,
                    idle
                );
            }
            if rec[j] != before[j] {
                if idle_at == 0 {
                    prop_assert_eq!(pttl, -2, "step {} {}: idle record's key kept", i, what);
                } else {
                    prop_assert!(pttl <= set, "step {} {}: ttl {} > {}", i, what, pttl, set);
                }
            }
        }
    }
    Ok(())
}

#[test]
fn durations_beyond_2_pow_52_ns_are_refused() {
    let rt = common::runtime();
    let server = common::Server::start();
    let l = Limit::token_bucket(10_000, 1, Duration::from_secs(3600)).unwrap();
    let r = rt.block_on(RedisStore::builder(Limits::new(vec![l]).unwrap()).connect(&server.url()));
    let e = r.err().expect("refused").to_string();
    assert!(e.contains("2^52"), "{e}");
}
