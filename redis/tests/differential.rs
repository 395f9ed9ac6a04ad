//! The same generated traces through `RedisStore` (explicit `now`) and through the in-memory
//! `turnstile::keyed::Store` give the same decisions, field for field, in both layouts (a key
//! per record, and records packed in buckets); every record's TTL covers the time until it is
//! idle, and a record that is idle and equivalent to absent is gone. Every call answers
//! within the store's timeout (a call that looped inside Redis would fail the test there).
//!
//! Generators in the manner of tests/reference.rs: limits 1, small, large and each maximum;
//! windows from 1 ms to a day (odd ones too); start times at 0, today's Unix time in ns, 2^62
//! ns and just below 2^63; time steps of 0, 1 ns, fractions, whole units ± 1 ns, to the next
//! boundary ± 1, and jumps of up to ten years; costs 1, small, the capacity and beyond it;
//! checks, peeks, refunds, settles (a reservation charged past the limits or given back) and
//! checks up to two units in the past (time going backwards); 1 to 3 limits. `PROPTEST_CASES=N` runs N cases (default 48).

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::time::Duration;
use turnstile::algo::{fixed_window, sliding_window, window_ring};
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
        // Logs of up to 2000 (a member per admission: a check of the maximum cost would add
        // 2^20 members in one script call).
        (limit(2000), window(), any::<bool>()).prop_map(|(l, w, cd)| {
            LimitSpec {
                count_denied: cd,
                ..LimitSpec::new(Algorithm::SlidingLog, l, Duration::from_nanos(w))
            }
            .build()
            .unwrap()
        }),
        (
            limit(window_ring::MAX_LIMIT),
            prop_oneof![
                Just(1u64),
                Just(2),
                Just(3),
                Just(60),
                1u64..=100,
                Just(1024)
            ],
            prop_oneof![Just(1u64), Just(MS), Just(S), Just(60 * S), 1u64..=10 * S],
            any::<bool>()
        )
            .prop_map(|(l, n, sub, cd)| {
                LimitSpec {
                    count_denied: cd,
                    buckets: Some(n),
                    ..LimitSpec::new(Algorithm::WindowRing, l, Duration::from_nanos(sub * n))
                }
                .build()
                .unwrap()
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

const YEAR: u64 = 365 * DAY;

/// A time step (tests/reference.rs's kinds) over the limits' natural periods, and jumps of
/// years.
fn step(kind: u8, raw: u64, now: u64, units: &[u64]) -> u64 {
    let unit = units[(raw % units.len() as u64) as usize].clamp(1, 1 << 52);
    let r = raw >> 8;
    let jitter = |x: u64| (x + (r >> 2) % 3).saturating_sub(1);
    match kind % 11 {
        0..=2 => 0,
        3 => 1,
        4 => r % (unit / 8 + 1),
        5 => r % (unit + 1),
        6 => jitter((1 + r % 3) * unit),
        7 | 8 => jitter(unit - now % unit),
        9 => r % (3 * unit + 1),
        _ => r % (10 * YEAR),
    }
}

/// Start times: 0, today, 2^62 ns, just below 2^63 ns (years of steps then cross it), any.
fn starts() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1_763_900_000 * S),
        Just(1u64 << 62),
        ((1u64 << 63) - (1 << 56))..(1u64 << 63),
        0u64..1 << 62
    ]
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
        Limit::SlidingLog(p) => p.window,
        Limit::WindowRing(p) => p.sub,
        _ => S,
    }
}

/// Runs the traces of `limits` (with the start times and operations below) against a real
/// redis-server and the in-memory store, `PROPTEST_CASES` cases (default 48); each case's
/// keys are numbered from `first_case`, so that two runs on one server never share a key.
fn run_traces(
    limits: impl Strategy<Value = Vec<Limit>>,
    starts: impl Strategy<Value = u64>,
    first_case: u64,
    packed: bool,
) {
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
    let strategy = (limits, starts, prop::collection::vec(op(), 1..60));
    let case = std::sync::atomic::AtomicU64::new(first_case);
    let url = server.url();
    runner
        .run(&strategy, |(limits, start, ops)| {
            let c = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            rt.block_on(run_case(&url, c, limits, start, ops, packed))
        })
        .unwrap();
}

#[test]
fn redis_matches_the_in_memory_store() {
    run_traces(
        prop::collection::vec(one_limit(), 1..=3),
        starts(),
        0,
        false,
    );
}

/// The same with records packed in buckets (`capacity`): a small capacity, so that the keys
/// of many cases share a bucket (and its sweeps).
#[test]
fn packed_records_match_the_in_memory_store() {
    run_traces(
        prop::collection::vec(one_limit(), 1..=3),
        starts(),
        1 << 40,
        true,
    );
}

/// A store of one fixed_window or token_bucket limit (the commonest) alone, in both layouts,
/// so that the default case count exercises them (among one to three limits of six
/// algorithms, fewer cases reach them).
#[test]
fn single_windows_and_buckets_match_the_in_memory_store() {
    let one = || {
        one_limit()
            .prop_filter("fixed_window or token_bucket", |l| {
                matches!(l, Limit::FixedWindow(_) | Limit::TokenBucket(_))
            })
            .prop_map(|l| vec![l])
    };
    run_traces(one(), starts(), 1 << 32, false);
    run_traces(one(), starts(), 1 << 33, true);
}

async fn run_case(
    url: &str,
    case: u64,
    limits: Vec<Limit>,
    start: u64,
    ops: Vec<Op>,
    packed: bool,
) -> Result<(), TestCaseError> {
    let ls = Limits::new(limits.clone()).unwrap();
    let mut b = RedisStore::builder(ls.clone()).timeout(Duration::from_secs(5));
    if packed {
        b = b.capacity(100);
    }
    let redis = b.connect(url).await.unwrap();
    let mem = Store::builder(ls.clone()).capacity(16).build().unwrap();
    let key = format!("case{case}");
    // A shadow record for the idle times: each limit's words at its offset.
    let mut rec = vec![0u64; ls.words()];
    let offsets: Vec<std::ops::Range<usize>> = limits
        .iter()
        .scan(0, |at, l| {
            let r = *at..*at + l.words();
            *at += l.words();
            Some(r)
        })
        .collect();
    // The Redis log drops admissions that have left the window at every write, so a check
    // at an earlier time no longer sees them (the in-memory ring does): time going backwards
    // is tested apart (`a_log_forgets_what_left_the_window`).
    let backwards = !limits.iter().any(|l| matches!(l, Limit::SlidingLog(_)));
    let cap = limits.iter().map(Limit::capacity).min().unwrap();
    let us: Vec<u64> = limits.iter().map(units).collect();
    let Some(span) = span(&limits) else {
        return Ok(());
    };
    let mut now = start;
    for (i, o) in ops.iter().enumerate() {
        now += step(o.step, o.raw, now, &us).min(span / 64);
        let cost = cost_of(o.cost, o.raw >> 3, cap);
        let before = rec.clone();
        let what;
        // Time going backwards: a check up to two units before the latest time.
        let mut at = now;
        match o.act % 12 {
            9 if backwards => {
                at = now.saturating_sub((o.raw >> 11) % (2 * us[0] + 1));
                what = format!("check({cost}) {} ns back", now - at);
                let m = mem.check_at(key.as_str(), cost, at);
                let r = redis.check_at(&key, cost, at).await.unwrap();
                ls.decide(&mut rec[..], at, cost);
                prop_assert_eq!(r, m, "step {} {} at {}", i, what, at);
            }
            0..=6 | 9 => {
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
            11 => {
                // A reservation (a check of the estimated cost), then, if admitted, its settle
                // at an actual cost below, equal or past the limits (a debt).
                let m = mem.check_at(key.as_str(), cost, now);
                let r = redis.check_at(&key, cost, now).await.unwrap();
                ls.decide(&mut rec[..], now, cost);
                prop_assert_eq!(r, m, "step {} reserve({}) at {}", i, cost, now);
                let actual = actual_of(o.raw >> 17, cost, cap);
                let mut after = rec.clone();
                settle_model(&ls, &mut after, now, cost, actual);
                what = format!("settle({cost} -> {actual})");
                if m.allowed() && within_redis_debt(&limits, &after, &offsets, now) {
                    let settled = mem.settle_at(key.as_str(), cost, actual, now);
                    redis.settle_at(&key, cost, actual, now).await.unwrap();
                    if settled {
                        rec = after;
                    }
                    let m = mem.peek_at(key.as_str(), now);
                    let r = redis.peek_at(&key, now).await.unwrap();
                    prop_assert_eq!(r, m, "step {} peek after {} at {}", i, what, now);
                }
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
        for (j, l) in limits.iter().enumerate() {
            let r = &rec[offsets[j].clone()];
            let wrote = *r != before[offsets[j].clone()];
            let t = Ttl {
                // Idle at the latest time the trace reached (a record must outlive it), and
                // at the time of this step's write (which sets the TTL).
                idle: l.idle_in(r, now),
                idle_at: l.idle_in(r, at),
                wrote,
                gone: !matches!(l, Limit::TokenBucket(_) | Limit::LeakyBucket(_)),
            };
            check_ttl(&redis, &key, j, &t)
                .await
                .map_err(|m| TestCaseError::fail(format!("step {i} {what}: {m}")))?;
        }
    }
    Ok(())
}

/// A settle's actual cost: none, less, the same, a little more, past the limits.
fn actual_of(raw: u64, reserved: u64, cap: u64) -> u64 {
    match raw % 6 {
        0 => 0,
        1 => reserved.saturating_sub(1 + (raw >> 3) % 3),
        2 => reserved,
        3 => reserved + 1 + (raw >> 3) % 3,
        4 => reserved + cap,
        _ => reserved.saturating_add(3 * cap + (raw >> 3) % 7),
    }
}

/// The settle on the shadow record: the difference charged or given back on every limit.
fn settle_model(ls: &Limits, rec: &mut [u64], now: u64, reserved: u64, actual: u64) {
    if actual > reserved {
        ls.charge(rec, now, actual - reserved);
    } else if actual < reserved {
        ls.refund(rec, now, reserved - actual);
    }
}

/// Whether every bucket's debt after a settle is within 2^52 ns of now, where Redis caps a
/// bucket's debt (docs/redis.md; in memory, at 2^63 ns): past it the two differ by design.
fn within_redis_debt(
    limits: &[Limit],
    rec: &[u64],
    offsets: &[std::ops::Range<usize>],
    now: u64,
) -> bool {
    limits.iter().zip(offsets).all(|(l, o)| match l {
        Limit::TokenBucket(_) | Limit::LeakyBucket(_) => l.idle_in(&rec[o.clone()], now) < 1 << 52,
        _ => true,
    })
}

/// The span of time a trace of `limits` may cover without the in-memory packed window
/// indexes aliasing (a spurious denial there, docs/algorithms.md; Redis keeps whole times and
/// never aliases); `None` if a denial's retry could reach past it (then the case is left out).
fn span(limits: &[Limit]) -> Option<u64> {
    let span = limits
        .iter()
        .map(|l| match l {
            Limit::SlidingWindow(p) => p.window.saturating_mul(1 << 21),
            Limit::FixedWindow(p) => p.window.saturating_mul(1 << 37),
            // Indexes kept mod ~2^38 sub-windows, read as ahead within 2^26 of that.
            Limit::WindowRing(p) => p.sub.saturating_mul(1 << 36),
            _ => u64::MAX,
        })
        .min()
        .unwrap();
    // A denial's retry is checked against every limit at now + retry (Limits::denial): a
    // retry reaching past a sliding window's aliasing span finds the in-memory record
    // aliased, where Redis keeps whole times.
    let horizon = limits
        .iter()
        .map(|l| match l {
            Limit::FixedWindow(p) => p.window,
            Limit::SlidingWindow(p) => p.window.saturating_mul(2),
            Limit::TokenBucket(p) => p.tau,
            Limit::LeakyBucket(p) => p.tau,
            Limit::SlidingLog(p) => p.window,
            Limit::WindowRing(p) => p.window.saturating_add(p.sub.saturating_mul(2)),
            Limit::Concurrency(p) => p.lease,
        })
        .max()
        .unwrap();
    (horizon.saturating_mul(4) <= span).then_some(span)
}

/// What a step left of one limit's record, for its TTL.
struct Ttl {
    idle: u64,
    idle_at: u64,
    wrote: bool,
    /// Whether an idle record is equivalent to absent at every time (deleted when written
    /// idle); a bucket's TAT brought back to now by a refund is not (kept a millisecond).
    gone: bool,
}

/// TTLs: never shorter than the record's idle time; just after a write, exactly it (rounded
/// up to a ms; a bucket of packed records: at least it, its deadline a whole second); an idle
/// record that is equivalent to absent gone once written.
async fn check_ttl(redis: &RedisStore, key: &str, j: usize, t: &Ttl) -> Result<(), String> {
    let rkey = &redis.redis_keys(key)[j];
    let mut conn = redis.connection();
    let q = |c: &str| {
        let mut cmd = redis::cmd(c);
        cmd.arg(rkey);
        cmd
    };
    let pttl: i64 = q("PTTL").query_async(&mut conn).await.unwrap();
    let slack = EXPLICIT_NOW_TTL_SLACK_MS as i64;
    let want = t.idle.div_ceil(MS) as i64 + slack;
    let set = t.idle_at.div_ceil(MS).max(1) as i64 + slack;
    let kind: String = q("TYPE").query_async(&mut conn).await.unwrap();
    // A bucket of packed records (a hash): this key's field.
    let field = redis.record_field(key).filter(|_| kind == "hash");
    let present = match (&field, pttl) {
        (_, -2) => false,
        (Some(f), _) => {
            let n: i64 = q("HEXISTS").arg(f).query_async(&mut conn).await.unwrap();
            n == 1
        }
        (None, _) => true,
    };
    if t.idle > 0 && (!present || pttl < want - 2000) {
        return Err(format!(
            "{rkey} expires in {pttl} ms (present: {present}), idle in {} ns",
            t.idle
        ));
    }
    if t.wrote && t.idle_at == 0 && t.gone && present {
        return Err(format!("{rkey}: an idle record kept (ttl {pttl})"));
    }
    if t.wrote && present && field.is_none() && pttl > set {
        return Err(format!("{rkey}: ttl {pttl} > {set}"));
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

/// Concurrency: the same traces of acquires (permits held), releases, plain checks (a lease
/// only its expiry frees) and peeks through Redis (explicit now) and the in-memory store:
/// equal decisions, field for field (the stamps too: a permit's reset is its stamp − now).
/// Time only moves forward here: the Redis set drops expired leases at each write, the
/// in-memory cells keep them until reused (docs/redis.md).
#[test]
fn concurrency_matches_the_in_memory_store() {
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
    let strategy = (
        prop_oneof![Just(1u64), 2u64..=8, 9u64..=100],
        prop_oneof![
            Just(1u64),
            Just(3),
            Just(MS),
            Just(S),
            1u64..=DAY,
            Just(26 * DAY)
        ],
        starts(),
        prop::collection::vec(op(), 1..80),
    );
    let case = std::sync::atomic::AtomicU64::new(0);
    let url = server.url();
    runner
        .run(&strategy, |(limit, lease, start, ops)| {
            let c = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            rt.block_on(concurrency_case(&url, c, limit, lease, start, ops))
        })
        .unwrap();
}

async fn concurrency_case(
    url: &str,
    case: u64,
    limit: u64,
    lease: u64,
    start: u64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    use std::sync::Arc;
    use turnstile::ManualClock;
    let ls = Limits::new(vec![LimitSpec::new(
        Algorithm::Concurrency,
        limit,
        Duration::from_nanos(lease),
    )
    .build()
    .unwrap()])
    .unwrap();
    let redis = Arc::new(
        RedisStore::builder(ls.clone())
            .timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .unwrap(),
    );
    let clock = Arc::new(ManualClock::new(start));
    let mem = Arc::new(
        Store::builder(ls)
            .capacity(16)
            .build_with_clock(clock.clone())
            .unwrap(),
    );
    let key = format!("conc{case}");
    let mut held = Vec::new();
    let mut now = start;
    for (i, o) in ops.iter().enumerate() {
        now += step(o.step, o.raw, now, &[lease, 1, limit]);
        clock.set(now);
        let cost = cost_of(o.cost, o.raw >> 3, limit);
        // Whether this step wrote the key (its TTL is then exactly the idle time).
        let mut wrote = false;
        match o.act % 8 {
            0..=3 => {
                let m = mem.acquire_owned_at(key.as_str(), cost, now);
                let r = redis.acquire_owned_at(&key, cost, now).await.unwrap();
                match (m, r) {
                    (Ok(m), Ok(r)) => {
                        prop_assert_eq!(r.decision(), m.decision(), "step {} acquire({})", i, cost);
                        wrote = cost > 0;
                        held.push((m, r));
                    }
                    (Err(m), Err(r)) => prop_assert_eq!(r, m, "step {} acquire({})", i, cost),
                    (m, r) => {
                        prop_assert!(false, "step {} acquire({}): {:?} / {:?}", i, cost, m, r)
                    }
                }
            }
            4 | 5 if !held.is_empty() => {
                let (m, r) = held.remove((o.raw % held.len() as u64) as usize);
                drop(m);
                wrote = r.release_at(now).await.unwrap() > 0;
            }
            6 => {
                let m = mem.check_at(key.as_str(), cost, now);
                let r = redis.check_at(&key, cost, now).await.unwrap();
                prop_assert_eq!(r, m, "step {} check({})", i, cost);
                wrote = r.allowed() && cost > 0;
            }
            _ => {
                let m = mem.peek_at(key.as_str(), now);
                let r = redis.peek_at(&key, now).await.unwrap();
                prop_assert_eq!(r, m, "step {} peek", i);
            }
        }
        // The key lives as long as a lease does, no longer.
        let idle = mem.peek_at(key.as_str(), now).reset_after_ns;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(redis.redis_keys(&key)[0].as_str())
            .query_async(&mut redis.connection())
            .await
            .unwrap();
        if idle == 0 {
            prop_assert!(
                !wrote || pttl == -2,
                "step {}: idle key kept, ttl {}",
                i,
                pttl
            );
        } else {
            let want = idle.div_ceil(MS) as i64 + EXPLICIT_NOW_TTL_SLACK_MS as i64;
            prop_assert!(
                pttl >= want - 2000,
                "step {}: ttl {} for idle {} ns",
                i,
                pttl,
                idle
            );
            prop_assert!(
                !wrote || pttl <= want,
                "step {}: ttl {} for idle {} ns",
                i,
                pttl,
                idle
            );
        }
    }
    for (m, r) in held {
        drop(m);
        r.release_at(now).await.unwrap();
    }
    Ok(())
}

/// Time going backwards on sliding_log, where Redis and memory differ by design: every Redis
/// write drops the admissions that have left the window at its `now`, so a later check at an
/// earlier time does not see them again (the in-memory ring keeps them until overwritten and
/// judges them at the caller's time). The bound: admissions are recorded no earlier than the
/// newest, and within any window of recorded times the log never holds more than its limit,
/// in Redis as in memory.
#[test]
fn a_log_forgets_what_left_the_window() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let l = Limit::sliding_log(3, Duration::from_secs(60)).unwrap();
        let ls = Limits::new(vec![l]).unwrap();
        let redis = RedisStore::builder(ls.clone())
            .timeout(Duration::from_secs(5))
            .connect(&server.url())
            .await
            .unwrap();
        let mem = Store::builder(ls).capacity(16).build().unwrap();
        // The difference: 3 at 100 s; a check at 161 s drops them in Redis; at 160 s memory
        // still counts them (recorded at 100 s rounded up to the 56 ns tick), Redis does not.
        for _ in 0..3 {
            assert!(redis.check_at("k", 1, 100 * S).await.unwrap().allowed());
            assert!(mem.check_at("k", 1, 100 * S).allowed());
        }
        assert!(redis.check_at("k", 1, 161 * S).await.unwrap().allowed());
        assert!(mem.check_at("k", 1, 161 * S).allowed());
        assert!(!mem.check_at("k", 1, 160 * S).allowed());
        assert!(redis.check_at("k", 1, 160 * S).await.unwrap().allowed());

        // The bound, over a trace with steps back of up to two windows (no refunds): the
        // recorded times never hold more than 3 within 60 s.
        let Limit::SlidingLog(p) = l else {
            unreachable!()
        };
        let tick = p.tick;
        let key = "trace";
        let mut now = 1_000 * S;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..1500 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            now = match x % 4 {
                0 => now.saturating_sub(x % (120 * S)),
                _ => now + x % (30 * S),
            };
            redis.check_at(key, 1 + (x >> 40) % 2, now).await.unwrap();
            let log: Vec<u8> = redis::cmd("GET")
                .arg(&redis.redis_keys(key)[0])
                .query_async(&mut redis.connection())
                .await
                .unwrap();
            let t = log_times(&log, tick);
            for (j, &e) in t.iter().enumerate() {
                let within = t[..=j].iter().filter(|&&a| a + 60 * S > e).count();
                assert!(
                    within <= 3,
                    "step {i}: {within} admissions within 60 s: {t:?}"
                );
            }
        }
    });
}

/// The times of a packed log (lua/sliding_log.lua): `<base ns>:` and 4-byte big-endian
/// entries in ticks after it.
fn log_times(log: &[u8], tick: u64) -> Vec<u64> {
    let colon = log.iter().position(|&b| b == b':').expect("a log's header");
    let base: u64 = std::str::from_utf8(&log[..colon]).unwrap().parse().unwrap();
    log[colon + 1..]
        .chunks_exact(4)
        .map(|e| base + u32::from_be_bytes([e[0], e[1], e[2], e[3]]) as u64 * tick)
        .collect()
}

/// Concurrency with the clock stepping back (up to two leases): nothing breaks (the set's
/// base moves down), releases work, and the set never holds more than the limit's cells.
/// (Which expired cells make room differs from memory, so the decisions may too.)
#[test]
fn leases_survive_a_clock_stepping_back() {
    use std::sync::Arc;
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let l = Limit::concurrency(4, Duration::from_secs(10)).unwrap();
        let redis = Arc::new(
            RedisStore::builder(Limits::new(vec![l]).unwrap())
                .timeout(Duration::from_secs(5))
                .connect(&server.url())
                .await
                .unwrap(),
        );
        let mut held = Vec::new();
        let mut now = 1_000 * S;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..1500 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            now = match x % 4 {
                0 => now.saturating_sub(x % (20 * S)),
                _ => now + x % (3 * S),
            };
            if x % 3 == 0 && !held.is_empty() {
                let p: turnstile_redis::RedisPermit =
                    held.swap_remove((x >> 20) as usize % held.len());
                p.release_at(now).await.unwrap();
            } else if let Ok(p) = redis
                .acquire_owned_at("k", 1 + (x >> 40) % 2, now)
                .await
                .unwrap()
            {
                held.push(p);
            }
            let d = redis.peek_at("k", now).await.unwrap();
            assert!(d.remaining <= 4, "step {i}: {d:?}");
            let cells: u64 = redis::cmd("ZCARD")
                .arg(&redis.redis_keys("k")[0])
                .query_async(&mut redis.connection())
                .await
                .unwrap();
            assert!(
                cells <= 5,
                "step {i}: {cells} members (4 cells and the base)"
            );
        }
        for p in held {
            p.release_at(now).await.unwrap();
        }
    });
}

/// A refund that brings a bucket's TAT back to now leaves a record that is idle from now on
/// but not at an earlier time: a check stamped earlier still finds its backlog, in memory and
/// in Redis alike (the record is kept a millisecond, not deleted). Token bucket and fixed
/// window: refund at t, check at t − 160 ms.
#[test]
fn a_refund_to_now_is_read_alike_at_an_earlier_time() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let ls = Limits::new(vec![
            Limit::token_bucket(2, 2, Duration::from_secs(1)).unwrap(),
            Limit::fixed_window(10, Duration::from_secs(60)).unwrap(),
        ])
        .unwrap();
        for packed in [false, true] {
            let mut b = RedisStore::builder(ls.clone()).timeout(Duration::from_secs(5));
            if packed {
                b = b.capacity(100);
            }
            let redis = b.connect(&server.url()).await.unwrap();
            let mem = Store::builder(ls.clone()).capacity(16).build().unwrap();
            let t = 1_763_900_030 * S;
            for (what, at, cost) in [
                ("check", t, 2),
                ("refund", t, 2),
                ("check", t - 160 * MS, 2),
            ] {
                if what == "refund" {
                    mem.refund_at("k", cost, at);
                    redis.refund_at("k", cost, at).await.unwrap();
                    continue;
                }
                let m = mem.check_at("k", cost, at);
                let r = redis.check_at("k", cost, at).await.unwrap();
                assert_eq!(r, m, "packed {packed}: {what}({cost}) at {at}");
            }
            server.cli(&["flushall"]);
        }
    });
}

/// A fixed_window or sliding_window limit by plain commands (`plain_commands`): equal
/// Decisions to the in-memory store while time moves forward (plain commands decide a call at
/// an earlier time in its own window, by design: docs/redis.md), checks, peeks and refunds;
/// the window's key lives until the end of the last window reading it plus the explicit-now
/// slack, never without a TTL.
#[test]
fn plain_windows_match_the_in_memory_store() {
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
    let windows = one_limit().prop_filter("fixed_window or sliding_window", |l| {
        matches!(l, Limit::FixedWindow(_) | Limit::SlidingWindow(_))
    });
    let strategy = (windows, starts(), prop::collection::vec(op(), 1..60));
    let case = std::sync::atomic::AtomicU64::new(1 << 44);
    let url = server.url();
    runner
        .run(&strategy, |(limit, start, ops)| {
            let c = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            rt.block_on(plain_case(&url, c, limit, start, ops))
        })
        .unwrap();
}

async fn plain_case(
    url: &str,
    case: u64,
    limit: Limit,
    start: u64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    // The window, and how many windows read a window's count (its key's life).
    let (w, reads) = match &limit {
        Limit::FixedWindow(p) => (p.window, 1),
        Limit::SlidingWindow(p) => (p.window, 2),
        _ => unreachable!(),
    };
    let ls = Limits::new(vec![limit]).unwrap();
    let redis = RedisStore::builder(ls.clone())
        .timeout(Duration::from_secs(5))
        .plain_commands(true)
        .connect(url)
        .await
        .unwrap();
    let mem = Store::builder(ls.clone()).capacity(16).build().unwrap();
    let key = format!("case{case}");
    let cap = limit.capacity();
    let us = [units(&limit)];
    let Some(span) = span(std::slice::from_ref(&limit)) else {
        return Ok(());
    };
    let mut conn = redis.connection();
    let mut now = start;
    for (i, o) in ops.iter().enumerate() {
        now = now.saturating_add(step(o.step, o.raw, now, &us).min(span / 64));
        let cost = cost_of(o.cost, o.raw >> 3, cap);
        match o.act % 12 {
            0..=6 | 9 => {
                let m = mem.check_at(key.as_str(), cost, now);
                let r = redis.check_at(&key, cost, now).await.unwrap();
                prop_assert_eq!(r, m, "step {} check({}) at {}", i, cost, now);
            }
            7 | 8 => {
                let m = mem.peek_at(key.as_str(), now);
                let r = redis.peek_at(&key, now).await.unwrap();
                prop_assert_eq!(r, m, "step {} peek at {}", i, now);
            }
            _ => {
                mem.refund_at(key.as_str(), cost, now);
                redis.refund_at(&key, cost, now).await.unwrap();
                let m = mem.peek_at(key.as_str(), now);
                let r = redis.peek_at(&key, now).await.unwrap();
                prop_assert_eq!(r, m, "step {} peek after refund({}) at {}", i, cost, now);
            }
        }
        // The window's key, if written, lives to the window's end plus the slack.
        let k = format!("{}:{}", redis.redis_keys(&key)[0], now / w);
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        let ends = ((u128::from(now) / u128::from(w) + reads) * u128::from(w) - u128::from(now))
            .div_ceil(1_000_000) as i64;
        let slack = EXPLICIT_NOW_TTL_SLACK_MS as i64;
        // Set by the window's first write (a TTL never missing: never -1); the real time a
        // step takes is well under 5 s.
        let whole = (u128::from(w) * reads).div_ceil(1_000_000) as i64;
        prop_assert!(
            pttl == -2 || (pttl > slack + ends - 5000 && pttl <= slack + whole),
            "step {} key {} pttl {} (window ends in {} ms)",
            i,
            k,
            pttl,
            ends
        );
    }
    Ok(())
}
