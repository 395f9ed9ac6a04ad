//! Every call returns: the library's loops are bounded before they start and its arithmetic
//! stays exact (no value past 2^53 in a double), so no `now` can make a call spin inside
//! Redis, where every client of the server would wait behind it (`BUSY`).
//!
//! The server answers `BUSY` after 100 ms of a running call (`busy-reply-threshold`) and each
//! call has a 2 s timeout, so a call that spins fails its test within seconds, and the
//! server (the test's own) is killed when the test ends.
//!
//! `PROPTEST_CASES=N` runs N cases (default 64).

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::Arc;
use std::time::Duration;
use turnstile::{Decision, Limit, Limits};
use turnstile_redis::{RedisPermit, RedisStore};

const S: u64 = 1_000_000_000;
const DAY: u64 = 86_400 * S;
const YEAR: u64 = 365 * DAY;

fn server() -> common::Server {
    common::Server::start_with(&["--busy-reply-threshold", "100"])
}

async fn store(url: &str, limits: Vec<Limit>, packed: bool, prefix: &str) -> Arc<RedisStore> {
    let mut b = RedisStore::builder(Limits::new(limits).unwrap())
        .prefix(prefix)
        .timeout(Duration::from_secs(2));
    if packed {
        b = b.capacity(100);
    }
    Arc::new(b.connect(url).await.unwrap())
}

/// The reproduction: concurrency limit 10, lease 1 day, explicit `now`: acquire at t0, at
/// t0 + 9.072e15 ns and again there. The lease set kept its expired lease, scores passed 2^53
/// and the stamp search stopped making progress: the third call never returned.
#[test]
fn a_concurrency_acquire_after_a_huge_jump_returns() {
    let server = server();
    let rt = common::runtime();
    let r = rt.block_on(async {
        let l = Limit::concurrency(10, Duration::from_nanos(DAY)).unwrap();
        let store = store(&server.url(), vec![l], false, "ts:").await;
        let t0 = 1_763_900_000 * S;
        let t1 = t0 + 9_072_000_000_000_000;
        let mut out = Vec::new();
        let mut held = Vec::new();
        for t in [t0, t1, t1] {
            match store.acquire_owned_at("k", 1, t).await {
                Ok(Ok(p)) => {
                    out.push(Ok(p.stamp().map(str::to_owned)));
                    held.push(p);
                }
                Ok(Err(d)) => out.push(Err(format!("{d:?}"))),
                Err(e) => out.push(Err(e.to_string())),
            }
        }
        for p in held {
            p.release_at(t1).await.unwrap();
        }
        out
    });
    let ping = server.cli(&["ping"]);
    assert_eq!(ping, "PONG", "{r:?}");
    let stamps: Vec<String> = r.into_iter().map(|x| x.unwrap().unwrap()).collect();
    let t1 = 1_763_900_000 * S + 9_072_000_000_000_000;
    assert_eq!(stamps[1], (t1 + DAY).to_string());
    assert_eq!(stamps[2], (t1 + DAY + 1).to_string(), "the next free stamp");
}

fn limit() -> impl Strategy<Value = Limit> {
    let d = |ns: u64| Duration::from_nanos(ns);
    let window = prop_oneof![Just(1u64), Just(7), Just(S), Just(DAY), 1u64..=(1 << 51)];
    prop_oneof![
        (1u64..=100, window.clone()).prop_map(move |(n, w)| Limit::fixed_window(n, d(w)).unwrap()),
        (1u64..=100, window.clone())
            .prop_map(move |(n, w)| Limit::sliding_window(n, d(w)).unwrap()),
        (1u64..=100, window.clone()).prop_map(move |(n, w)| Limit::sliding_log(n, d(w)).unwrap()),
        (1u64..=60, 1u64..=60, Just(S)).prop_map(move |(n, b, sub)| Limit::window_ring(
            n,
            d(sub * b),
            b
        )
        .unwrap()),
        (1u64..=100, 1u64..=100, window.clone()).prop_filter_map("span", move |(c, r, w)| {
            Limit::token_bucket(c, r.min(w), d(w))
                .ok()
                .filter(|l| matches!(l, Limit::TokenBucket(p) if p.tau <= 1 << 52))
        }),
        (1u64..=100, window.clone(), 0u64..=5).prop_filter_map("span", move |(r, w, b)| {
            Limit::leaky_bucket(r.min(w), d(w), b, None)
                .ok()
                .filter(|l| matches!(l, Limit::LeakyBucket(p) if p.tau <= 1 << 52))
        }),
        (1u64..=10, window).prop_map(move |(n, w)| Limit::concurrency(n, d(w)).unwrap()),
    ]
}

/// Times anywhere: near 0, near 2^63, years apart either way, a nanosecond apart.
fn time() -> impl Strategy<Value = u64> {
    let top = 1u64 << 63;
    prop_oneof![
        0u64..1000,
        (top - 1000)..top,
        0u64..top,
        (0u64..40).prop_map(move |y| y * YEAR),
        (0u64..40).prop_map(move |y| top - y * YEAR),
    ]
}

#[derive(Clone, Debug)]
enum Act {
    Check(u64),
    Peek,
    Refund(u64),
    Acquire(u64),
    Release,
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        4 => (1u64..=12).prop_map(Act::Check),
        1 => Just(Act::Peek),
        1 => (1u64..=12).prop_map(Act::Refund),
        3 => (1u64..=12).prop_map(Act::Acquire),
        2 => Just(Act::Release),
    ]
}

fn sane(d: &Decision) -> Result<(), TestCaseError> {
    prop_assert!(d.remaining <= d.limit, "{:?}", d);
    Ok(())
}

/// Any algorithm, alone or two together (concurrency alone), in both layouts, through
/// checks, peeks, refunds, acquires and releases at times that jump anywhere: every call
/// answers within its timeout with a decision, and the server stays responsive.
#[test]
fn every_call_returns_at_any_time() {
    let server = server();
    let rt = common::runtime();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec(limit(), 1..=2),
        any::<bool>(),
        prop::collection::vec((time(), act()), 1..40),
    );
    let case = std::sync::atomic::AtomicU64::new(0);
    let url = server.url();
    runner
        .run(&strategy, |(mut limits, packed, ops)| {
            if limits.iter().any(|l| matches!(l, Limit::Concurrency(_))) {
                limits.truncate(1);
            }
            let c = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            rt.block_on(run(&url, c, limits, packed, ops))
        })
        .unwrap();
    assert_eq!(server.cli(&["ping"]), "PONG");
}

async fn run(
    url: &str,
    case: u64,
    limits: Vec<Limit>,
    packed: bool,
    ops: Vec<(u64, Act)>,
) -> Result<(), TestCaseError> {
    let store = store(url, limits, packed, &format!("t{case}:")).await;
    let mut held: Vec<RedisPermit> = Vec::new();
    for (i, (now, act)) in ops.into_iter().enumerate() {
        let at = |e: turnstile_redis::Error| TestCaseError::fail(format!("op {i} at {now}: {e}"));
        match act {
            Act::Check(c) => sane(&store.check_at("k", c, now).await.map_err(at)?)?,
            Act::Peek => sane(&store.peek_at("k", now).await.map_err(at)?)?,
            Act::Refund(n) => store.refund_at("k", n, now).await.map_err(at)?,
            Act::Acquire(c) => match store.acquire_owned_at("k", c, now).await.map_err(at)? {
                Ok(p) => {
                    sane(p.decision())?;
                    held.push(p);
                }
                Err(d) => sane(&d)?,
            },
            Act::Release => {
                if let Some(p) = held.pop() {
                    p.release_at(now).await.map_err(at)?;
                }
            }
        }
    }
    for p in held {
        p.release_at(0).await.unwrap();
    }
    Ok(())
}
