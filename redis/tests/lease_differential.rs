//! Leased decisions against exact ones. Generated traces of checks (costs 1 to 3), refunds,
//! sweeps and give-backs by 1 to 4 nodes (stores with leases, each its own table, at explicit
//! times) on 1 to 3 keys of 1 or 2 window and bucket limits:
//!
//! * **never over**: every admission the nodes made, and every refund, replayed in order into
//!   one exact in-memory store (`turnstile::keyed::Store`) at the same times, is admitted
//!   there too — the fleet's admissions are a trace the limits alone admit;
//! * **the difference is what leases hold** (a fixed window, checks only): in every window
//!   where a node denied a request of cost c, Redis's count reached the limit less c - 1; so
//!   the admissions the nodes made fall short of the exact limit by at most what Redis
//!   counted for leases that were never spent, which the test reports.
//!
//! `PROPTEST_CASES=N` runs N cases (default 64).

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::collections::HashMap;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Limit, Limits};
use turnstile_redis::{Conn, Leases, RedisStore};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

fn window() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(10 * MS),
        Just(50 * MS),
        Just(7 * MS + 3),
        Just(S),
        5 * MS..=2 * S
    ]
}

fn one_limit() -> impl Strategy<Value = Limit> {
    let d = Duration::from_nanos;
    prop_oneof![
        (1u64..=40, window()).prop_map(move |(l, w)| Limit::fixed_window(l, d(w)).unwrap()),
        (1u64..=40, window()).prop_map(move |(l, w)| Limit::sliding_window(l, d(w)).unwrap()),
        (1u64..=40, 1u64..=40, window())
            .prop_map(move |(c, r, w)| Limit::token_bucket(c, r, d(w)).unwrap()),
        (1u64..=40, 0u64..=20, window()).prop_map(move |(r, b, w)| Limit::leaky_bucket(
            r,
            d(w),
            b,
            None
        )
        .unwrap()),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Check { node: usize, key: u8, cost: u64 },
    Refund { node: usize, key: u8 },
    Sweep { node: usize },
    Return { node: usize },
}

#[derive(Clone, Debug)]
struct Case {
    limits: Vec<Limit>,
    nodes: usize,
    start: u64,
    /// Each op with the time step before it.
    ops: Vec<(u64, Op)>,
}

fn ops(nodes: usize, span: u64, checks_only: bool) -> impl Strategy<Value = Vec<(u64, Op)>> {
    let step =
        prop_oneof![6 => Just(0u64), 10 => 0..=span / 50, 2 => 0..=span / 4, 1 => 0..=span * 2];
    let cost = prop_oneof![8 => Just(1u64), 2 => 2u64..=3];
    let op = (0..nodes, 0u8..3, cost, 0u8..100).prop_map(move |(node, key, cost, k)| match k {
        _ if checks_only => Op::Check { node, key, cost },
        0..=84 => Op::Check { node, key, cost },
        85..=91 => Op::Refund { node, key },
        92..=97 => Op::Sweep { node },
        _ => Op::Return { node },
    });
    prop::collection::vec((step, op), 1..400)
}

fn span(limits: &[Limit]) -> u64 {
    limits
        .iter()
        .map(|l| match l {
            Limit::FixedWindow(p) => p.window,
            Limit::SlidingWindow(p) => p.window,
            Limit::TokenBucket(p) => p.tau,
            Limit::LeakyBucket(p) => p.tau,
            _ => S,
        })
        .min()
        .unwrap_or(S)
        .max(MS)
}

fn case(checks_only: bool) -> impl Strategy<Value = Case> {
    let limits = prop_oneof![
        one_limit().prop_map(|l| vec![l]),
        (one_limit(), one_limit()).prop_map(|(a, b)| vec![a, b]),
    ];
    let limits = if checks_only {
        (1u64..=40, window())
            .prop_map(|(l, w)| vec![Limit::fixed_window(l, Duration::from_nanos(w)).unwrap()])
            .boxed()
    } else {
        limits.boxed()
    };
    (limits, 1usize..=4, 0u64..=10 * S).prop_flat_map(move |(limits, nodes, off)| {
        let sp = span(&limits);
        (
            Just(limits),
            Just(nodes),
            Just(1_700_000_000 * S + off),
            ops(nodes, sp, checks_only),
        )
            .prop_map(|(limits, nodes, start, ops)| Case {
                limits,
                nodes,
                start,
                ops,
            })
    })
}

/// What happened, in order: admissions and refunds, at their times.
enum Event {
    Admitted { at: u64, key: u8, cost: u64 },
    Refunded { at: u64, key: u8, n: u64 },
}

struct Run {
    events: Vec<Event>,
    /// Per (key, window start) of a single fixed window: admitted units, the largest cost
    /// denied, and Redis's count at the window's end.
    windows: HashMap<(u8, u64), (u64, u64, u64)>,
    stranded: u64,
}

async fn run(conn: &Conn, prefix: &str, c: &Case) -> Result<Run, TestCaseError> {
    let limits = Limits::new(c.limits.clone()).unwrap();
    let leases = Leases::auto().sweep_every(None);
    let mut nodes = Vec::new();
    for _ in 0..c.nodes {
        let s = RedisStore::builder(limits.clone())
            .prefix(prefix)
            .timeout(Duration::from_secs(5))
            .leases(leases.clone())
            .build(conn.clone())
            .unwrap();
        nodes.push(s);
    }
    // Redis's own view, without leases: the window's count at its end.
    let plain = RedisStore::builder(limits.clone())
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .build(conn.clone())
        .unwrap();
    let fw = match c.limits[..] {
        [Limit::FixedWindow(p)] => Some((p.window, p.limit)),
        _ => None,
    };
    let mut out = Run {
        events: Vec::new(),
        windows: HashMap::new(),
        stranded: 0,
    };
    // Per node and key: the time of its latest admissions, and their units.
    let mut held: HashMap<(usize, u8), (u64, u64)> = HashMap::new();
    let mut now = c.start;
    for (step, op) in &c.ops {
        let next = now + step;
        if let Some((w, _)) = fw {
            // The windows that end before the next op: Redis's count at their end.
            if next / w != now / w {
                let end = (now / w + 1) * w - 1;
                for key in 0..3u8 {
                    let d = plain.peek_at(&format!("k{key}"), end).await.unwrap();
                    let e = out.windows.entry((key, now / w)).or_default();
                    e.2 = d.limit - d.remaining;
                }
            }
        }
        now = next;
        match *op {
            Op::Check { node, key, cost } => {
                let d = nodes[node]
                    .check_at(&format!("k{key}"), cost, now)
                    .await
                    .unwrap();
                if d.allowed() {
                    out.events.push(Event::Admitted { at: now, key, cost });
                    let h = held.entry((node, key)).or_insert((now, 0));
                    if h.0 != now {
                        *h = (now, 0);
                    }
                    h.1 += cost;
                }
                if let Some((w, _)) = fw {
                    let e = out.windows.entry((key, now / w)).or_default();
                    if d.allowed() {
                        e.0 += cost;
                    } else {
                        e.1 = e.1.max(cost);
                    }
                }
            }
            Op::Refund { node, key } => {
                // A refund of an admission this node just made (a cancelled request): one the
                // limits still hold. (A refund of one they forgot — an earlier window, a
                // bucket refilled past it — changes nothing in memory, but in Redis it frees
                // what the count holds then, perhaps another node's lease: docs/redis.md.)
                // A bucket's TAT is one number: a refund Redis takes frees its last token,
                // which may be one another node holds (docs/redis.md): window limits only.
                let buckets = c
                    .limits
                    .iter()
                    .any(|l| matches!(l, Limit::TokenBucket(_) | Limit::LeakyBucket(_)));
                let h = held.get_mut(&(node, key)).filter(|h| h.0 == now && h.1 > 0);
                if let (Some(h), false) = (h, buckets) {
                    h.1 -= 1;
                    nodes[node]
                        .refund_at(&format!("k{key}"), 1, now)
                        .await
                        .unwrap();
                    out.events.push(Event::Refunded { at: now, key, n: 1 });
                }
            }
            Op::Sweep { node } => nodes[node].sweep_leases_at(now).await,
            Op::Return { node } => nodes[node].return_leases_at(now).await,
        }
    }
    if let Some((w, _)) = fw {
        let end = (now / w + 1) * w - 1;
        for key in 0..3u8 {
            let d = plain.peek_at(&format!("k{key}"), end).await.unwrap();
            out.windows.entry((key, now / w)).or_default().2 = d.limit - d.remaining;
        }
    }
    out.stranded = nodes
        .iter()
        .map(|n| n.lease_stats().unwrap().stranded)
        .sum();
    Ok(out)
}

fn replay(c: &Case, events: &[Event]) -> Result<(), TestCaseError> {
    let exact = Store::builder(Limits::new(c.limits.clone()).unwrap())
        .capacity(64)
        .build()
        .unwrap();
    for (i, e) in events.iter().enumerate() {
        match *e {
            Event::Admitted { at, key, cost } => {
                let d = exact.check_at(&format!("k{key}"), cost, at);
                prop_assert!(
                    d.allowed(),
                    "admission {i} (key {key}, cost {cost}, at +{} ns) is over the limits: {d:?}",
                    at - c.start
                );
            }
            Event::Refunded { at, key, n } => exact.refund_at(&format!("k{key}"), n, at),
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

fn each_case(checks_only: bool, check: impl Fn(&Case, &Run) -> Result<(), TestCaseError>) {
    let server = common::Server::start();
    let rt = common::runtime();
    let conn = rt
        .block_on(Conn::single(&server.url(), Duration::from_secs(1)))
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    });
    let n = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&case(checks_only), |c| {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let r = rt.block_on(run(&conn, &format!("c{i}:"), &c))?;
            check(&c, &r)
        })
        .unwrap();
}

#[test]
fn leased_admissions_are_never_over_the_limits() {
    each_case(false, |c, r| replay(c, &r.events));
}

#[test]
fn a_window_falls_short_only_by_what_leases_hold() {
    each_case(true, |c, r| {
        replay(c, &r.events)?;
        let Limit::FixedWindow(p) = c.limits[0] else {
            unreachable!()
        };
        for (&(key, w), &(admitted, denied, counted)) in &r.windows {
            prop_assert!(
                admitted <= counted,
                "key {key} window {w}: {admitted} > {counted}"
            );
            if denied > 0 {
                prop_assert!(
                    counted + denied > p.limit,
                    "key {key} window {w}: a request of {denied} denied while Redis counted {counted} of {}",
                    p.limit
                );
            }
        }
        Ok(())
    });
}
