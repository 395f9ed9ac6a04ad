//! The keyed store against a sequential model: a `HashMap<key, record>` run through the same
//! pure transitions (themselves checked against naive models in `tests/reference.rs`).

use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;
use turnstile::algo::Cells;
use turnstile::keyed::{FullPolicy, Store};
use turnstile::{Algorithm, Limit, LimitSpec, Limits, Outcome};

const MS: u64 = 1_000_000;

fn limits_for(alg: Algorithm, limit: u64, window_ms: u64) -> Limits {
    let mut spec = LimitSpec::new(alg, limit, Duration::from_millis(window_ms));
    if alg == Algorithm::WindowRing {
        spec.buckets = Some(10);
        spec.window = Duration::from_millis(window_ms * 10);
    }
    Limits::new(vec![spec.build().unwrap()]).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Check(u8, u64),
    Peek(u8),
    Refund(u8, u64),
    Reset(u8),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..12, 1u64..4).prop_map(|(k, c)| Op::Check(k, c)),
        1 => (0u8..12).prop_map(Op::Peek),
        1 => (0u8..12, 1u64..3).prop_map(|(k, n)| Op::Refund(k, n)),
        1 => (0u8..12).prop_map(Op::Reset),
        2 => (0u64..3000).prop_map(|ms| Op::Advance(ms * MS / 10)),
    ]
}

struct Model {
    limits: Limits,
    recs: HashMap<u64, Vec<u64>>,
}

struct V<'a>(&'a mut Vec<u64>);
impl Cells for V<'_> {
    fn get(&self, i: usize) -> u64 {
        self.0[i]
    }
    fn set(&mut self, i: usize, v: u64) {
        self.0[i] = v
    }
}

impl Model {
    fn rec(&mut self, k: u64) -> &mut Vec<u64> {
        let w = self.limits.words();
        self.recs.entry(k).or_insert_with(|| vec![0; w])
    }
    fn check(&mut self, k: u64, cost: u64, now: u64) -> turnstile::Decision {
        let l = self.limits.clone();
        l.decide(&mut V(self.rec(k)), now, cost)
    }
}

fn run(
    alg: Algorithm,
    limit: u64,
    window_ms: u64,
    ops: &[Op],
    capacity: u64,
) -> Result<(), TestCaseError> {
    let limits = limits_for(alg, limit, window_ms);
    let store = Store::builder(limits.clone())
        .capacity(capacity)
        .shards(2)
        .seed(3)
        .build()
        .unwrap();
    let mut model = Model {
        limits,
        recs: HashMap::new(),
    };
    let mut now = 10 * MS;
    for o in ops {
        match *o {
            Op::Check(k, c) => {
                let key = k as u64 * 1_000_003;
                let a = store.check_at(&key, c, now);
                let b = model.check(key, c, now);
                prop_assert_eq!(a, b, "check key {} cost {} at {}", k, c, now);
            }
            Op::Peek(k) => {
                let key = k as u64 * 1_000_003;
                let a = store.peek_at(&key, now);
                let b = model.check(key, 0, now);
                prop_assert_eq!(a, b, "peek key {} at {}", k, now);
            }
            Op::Refund(k, n) => {
                let key = k as u64 * 1_000_003;
                store.refund_at(&key, n, now);
                let l = model.limits.clone();
                if let Some(r) = model.recs.get_mut(&key) {
                    l.refund(&mut V(r), now, n);
                }
            }
            Op::Reset(k) => {
                let key = k as u64 * 1_000_003;
                store.reset(&key);
                model.recs.remove(&key);
            }
            Op::Advance(d) => now += d,
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn store_matches_model_every_algorithm(
        alg in prop::sample::select(vec![Algorithm::FixedWindow, Algorithm::SlidingWindow, Algorithm::TokenBucket,
            Algorithm::LeakyBucket, Algorithm::SlidingLog, Algorithm::WindowRing]),
        limit in 1u64..8,
        window_ms in 1u64..2000,
        ops in prop::collection::vec(op(), 1..150),
    ) {
        run(alg, limit, window_ms, &ops, 1000)?;
    }

    /// A tiny store: records of idle keys are reclaimed to make room, which must be invisible
    /// (an idle record is equivalent to a fresh one) as long as the live keys fit.
    #[test]
    fn reclaim_is_invisible(
        alg in prop::sample::select(vec![Algorithm::FixedWindow, Algorithm::TokenBucket, Algorithm::SlidingLog]),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        run(alg, 3, 5, &ops, 64)?;
    }
}

#[test]
fn multi_limit_store_is_all_or_nothing() {
    let per_min = Limit::sliding_log(10, Duration::from_secs(60)).unwrap();
    let gap = Limit::token_bucket(1, 1, Duration::from_secs(2)).unwrap();
    let store = Store::builder(Limits::new(vec![per_min, gap]).unwrap())
        .capacity(100)
        .build()
        .unwrap();
    let s = 1_000_000_000u64;
    assert!(store.check_at(&7u64, 1, s).allowed());
    // Denied by the gap: the per-minute log must not be charged.
    for i in 1..20 {
        assert!(!store.check_at(&7u64, 1, s + i * 50 * MS).allowed());
    }
    // The 19 denials were not logged: the per-minute log holds 1, so every 2 s passes until
    // 10 are in the minute.
    let mut admitted = 1;
    for i in 1..30 {
        admitted += store.check_at(&7u64, 1, s + i * 2 * s).allowed() as u32;
    }
    assert_eq!(admitted, 10);
}

fn flood(policy: FullPolicy) -> (Store, u64) {
    let l = Limit::fixed_window(5, Duration::from_secs(60)).unwrap();
    let store = Store::builder(Limits::new(vec![l]).unwrap())
        .capacity(10_000)
        .policy(policy)
        .seed(1)
        .build()
        .unwrap();
    let before = store.memory_bytes();
    let mut allowed = 0;
    for k in 0..100_000u64 {
        allowed += store
            .check_at(&(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)), 1, MS)
            .allowed() as u64;
    }
    assert_eq!(
        store.memory_bytes(),
        before,
        "the store never allocates after it is built"
    );
    (store, allowed)
}

#[test]
fn flood_of_ten_times_capacity_stays_in_budget_reject() {
    let (store, allowed) = flood(FullPolicy::Reject);
    let st = store.stats();
    assert_eq!(st.live, store.live_ids().len() as u64);
    assert_eq!(st.live + st.rejected, 100_000);
    assert_eq!(allowed, st.live);
    assert!(st.live >= 10_000, "capacity honoured: {st:?}");
    assert!(
        st.rejected > 0 && st.evicted == 0 && st.untracked == 0,
        "{st:?}"
    );
}

#[test]
fn flood_allow_untracked_counts() {
    let (store, allowed) = flood(FullPolicy::AllowUntracked);
    let st = store.stats();
    assert_eq!(allowed, 100_000, "fail open admits everyone");
    assert_eq!(st.live + st.untracked, 100_000);
    assert!(st.untracked > 0 && st.rejected == 0);
}

#[test]
fn flood_evict_stalest_counts() {
    let (store, allowed) = flood(FullPolicy::EvictStalest);
    let st = store.stats();
    assert_eq!(allowed, 100_000);
    assert_eq!(st.inserted, 100_000);
    assert_eq!(st.live + st.evicted, 100_000, "{st:?}");
    assert!(st.evicted > 0);
}

#[test]
fn budget_is_never_exceeded() {
    for budget in [64 * 1024, 1 << 20, 10 << 20] {
        for alg in [
            Algorithm::TokenBucket,
            Algorithm::SlidingLog,
            Algorithm::WindowRing,
        ] {
            let limits = limits_for(alg, 500, 360_000);
            let s = Store::builder(limits)
                .memory_budget(budget)
                .build()
                .unwrap();
            assert!(
                s.memory_bytes() <= budget,
                "{alg}: {} > {budget}",
                s.memory_bytes()
            );
            assert!(s.capacity() > 0);
        }
    }
    let tiny = Store::builder(limits_for(Algorithm::SlidingLog, 500, 1000))
        .memory_budget(100)
        .build();
    assert!(tiny.is_err());
}

/// A reclaimed slot taken by another key starts fresh, and a live key's state is never seen
/// by another key.
#[test]
fn slot_reuse_isolates_keys() {
    let l = Limit::fixed_window(2, Duration::from_millis(10)).unwrap();
    let store = Store::builder(Limits::new(vec![l]).unwrap())
        .capacity(16)
        .shards(1)
        .seed(9)
        .policy(FullPolicy::Reject)
        .build()
        .unwrap();
    let mut now = MS;
    for round in 0..50u64 {
        // Exhaust a batch of keys, then let them go idle and bring new ones.
        for k in 0..16u64 {
            let key = round * 1000 + k;
            let d1 = store.check_at(&key, 1, now);
            if d1.outcome == Outcome::StoreFull {
                continue;
            }
            assert!(
                d1.allowed(),
                "a new key starts fresh (round {round}, key {k})"
            );
            assert_eq!(d1.remaining, 1, "a new key never sees another key's count");
            assert!(store.check_at(&key, 1, now).allowed());
            assert!(!store.check_at(&key, 1, now).allowed());
        }
        now += 20 * MS;
    }
    assert!(store.stats().reclaimed > 0);
}

#[test]
fn two_threads_one_hot_key_admit_exactly_the_limit() {
    let l = Limit::fixed_window(50_000, Duration::from_secs(3600)).unwrap();
    let store = Store::builder(Limits::new(vec![l]).unwrap())
        .capacity(1000)
        .build()
        .unwrap();
    let admitted: u64 = std::thread::scope(|s| {
        let h: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    (0..100_000)
                        .filter(|_| store.check_at(&42u64, 1, MS).allowed())
                        .count() as u64
                })
            })
            .collect();
        h.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 50_000);
    assert_eq!(store.len(), 1);
}

#[test]
fn two_threads_inserting_the_same_new_keys_never_duplicate() {
    let l = Limit::token_bucket(3, 1, Duration::from_secs(3600)).unwrap();
    for alg_store in [
        Store::builder(Limits::new(vec![l]).unwrap())
            .capacity(20_000)
            .build()
            .unwrap(),
        Store::builder(limits_for(Algorithm::SlidingLog, 3, 3_600_000))
            .capacity(20_000)
            .build()
            .unwrap(),
    ] {
        let store = &alg_store;
        let admitted: u64 = std::thread::scope(|s| {
            let h: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(move || {
                        (0..10_000u64)
                            .map(|k| {
                                (0..3)
                                    .filter(|_| store.check_at(&k, 1, MS).allowed())
                                    .count() as u64
                            })
                            .sum::<u64>()
                    })
                })
                .collect();
            h.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            admitted, 30_000,
            "each key admits exactly 3 over both threads"
        );
        assert_eq!(store.len(), 10_000);
        let mut ids = store.live_ids();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 10_000, "no key is live twice");
    }
}

#[test]
fn string_and_ip_keys() {
    let l = Limit::fixed_window(5, Duration::from_secs(1)).unwrap();
    let store = Store::builder(Limits::new(vec![l]).unwrap())
        .capacity(100)
        .seed(5)
        .build()
        .unwrap();
    for _ in 0..5 {
        assert!(store.check_at("user:241531", 1, MS).allowed());
    }
    assert!(!store.check_at("user:241531", 1, MS).allowed());
    assert!(store.check_at("user:241532", 1, MS).allowed());
    let a: std::net::IpAddr = "2001:db8::1".parse().unwrap();
    let b: std::net::IpAddr = "2001:db8::2".parse().unwrap();
    assert!(store.check_at(&a, 5, MS).allowed());
    assert!(
        !store.check_at(&b, 1, MS).allowed(),
        "same /64 shares the limit"
    );
}

/// IPv4 clients of a dual-stack listener arrive as `::ffff:a.b.c.d`: each is its own key, the
/// same key as its plain IPv4 address, and neither shares a limit with `::1` (before, every
/// one of them and `::1` were the single key `::/64`).
#[test]
fn ipv4_mapped_clients_are_their_ipv4_keys() {
    use std::net::IpAddr;
    let l = Limit::fixed_window(1, Duration::from_secs(60)).unwrap();
    let store = Store::builder(Limits::new(vec![l]).unwrap())
        .capacity(100)
        .seed(5)
        .build()
        .unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert!(store.check_at(&ip("::ffff:198.51.100.1"), 1, MS).allowed());
    assert!(
        store.check_at(&ip("::ffff:198.51.100.2"), 1, MS).allowed(),
        "another IPv4 client has its own limit"
    );
    assert!(
        !store.check_at(&ip("198.51.100.1"), 1, MS).allowed(),
        "the mapped and the plain address are one client"
    );
    assert!(
        store.check_at(&ip("::1"), 1, MS).allowed(),
        "::1 is not an IPv4 client"
    );
    assert!(store.check_at(&ip("127.0.0.1"), 1, MS).allowed());
    // The same through parsed keys, as the CLI and rules files give them.
    let k = turnstile::keyed::parse_key("::ffff:198.51.100.3").unwrap();
    assert!(store.check_at(&k, 1, MS).allowed());
    assert!(!store.check_at(&ip("198.51.100.3"), 1, MS).allowed());
}

/// `check_batch_at` must decide exactly as the same checks made one by one with `check_at`, in
/// order, and `check_batch_verdicts_at` answer their verdicts: batches shorter and longer than
/// its pipeline (2 × 4 keys), empty ones, keys repeated inside a batch (a later check of a key
/// sees the earlier one's update), new keys inserted mid-batch, and time moving between
/// batches; packed and arena-backed limits, and a store small enough to fill; with the tags
/// batched checks read (`batch_hints`) and without (batched checks then scan).
#[test]
fn check_batch_decides_as_sequential_checks() {
    use turnstile::{Decision, ManualClock, Verdict};
    let limits = [
        Limit::token_bucket(5, 3, Duration::from_secs(1)).unwrap(),
        Limit::fixed_window(4, Duration::from_secs(1)).unwrap(),
        Limit::sliding_window(4, Duration::from_secs(1)).unwrap(),
        Limit::sliding_log(3, Duration::from_secs(1)).unwrap(),
        Limit::leaky_bucket(3, Duration::from_secs(1), 4, Some(2)).unwrap(),
        Limit::window_ring(6, Duration::from_secs(1), 4).unwrap(),
    ];
    for l in limits {
        for (capacity, hints) in [(40u64, true), (4_000, true), (40, false), (4_000, false)] {
            let build = |hints| {
                Store::builder(Limits::new(vec![l]).unwrap())
                    .capacity(capacity)
                    .seed(11)
                    .shards(2)
                    .batch_hints(hints)
                    .build_with_clock(ManualClock::new(0))
                    .unwrap()
            };
            let (batched, single, verdicts) = (build(hints), build(true), build(hints));
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut rnd = |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            let mut now = 1_000_000_000u64;
            let mut checks = 0;
            for round in 0..300 {
                let len = rnd(41) as usize;
                let keys: Vec<u64> = (0..len).map(|_| rnd(60)).collect();
                let cost = 1 + rnd(2);
                let blank = Decision {
                    outcome: Outcome::Limited,
                    limit: u64::MAX,
                    remaining: u64::MAX,
                    reset_after_ns: u64::MAX,
                    retry_after_ns: None,
                    delay_ns: u64::MAX,
                };
                let mut out = vec![blank; len];
                batched.check_batch_at(&keys, cost, now, &mut out);
                // Not the all-zero word of an admission: a verdict left unwritten shows.
                let mut vs = vec![Verdict::from(&blank); len];
                verdicts.check_batch_verdicts_at(&keys, cost, now, &mut vs);
                for (i, k) in keys.iter().enumerate() {
                    let d = single.check_at(k, cost, now);
                    assert_eq!(
                        out[i], d,
                        "{l:?}, capacity {capacity}, hints {hints}, round {round}, key {k} at {i} of {len}"
                    );
                    assert_eq!(
                        vs[i],
                        Verdict::from(&d),
                        "verdict: {l:?}, capacity {capacity}, hints {hints}, round {round}, key {k} at {i} of {len}"
                    );
                }
                checks += len;
                now += rnd(300_000_000);
            }
            assert!(checks > 5_000);
            let (mut a, mut b) = (batched.live_ids(), single.live_ids());
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{l:?}: live keys differ");
        }
    }
}

/// A concurrency limit in a `Store`: owned permits (an `Arc` of the store inside, `Send` and
/// `'static`, so they cross threads and `.await`) released on drop, one permit each.
#[test]
fn store_concurrency_permits_are_owned_and_released_on_drop() {
    use std::sync::Arc;
    use turnstile::keyed::StorePermit;
    use turnstile::ManualClock;
    fn send_static<T: Send + 'static>(_: &T) {}
    let s = 1_000_000_000u64;
    for lease in [Duration::from_secs(3600), Duration::MAX] {
        let l = Limit::concurrency(2, lease).unwrap();
        let store = Arc::new(
            Store::builder(Limits::new(vec![l]).unwrap())
                .capacity(100)
                .seed(1)
                .build_with_clock(ManualClock::new(s))
                .unwrap(),
        );
        let a: StorePermit<ManualClock> = store.acquire_owned(&7u64, 1).unwrap();
        send_static(&a);
        let b = store.acquire_owned(&7u64, 1).unwrap();
        let third = store.acquire_owned(&7u64, 1).unwrap_err();
        assert_eq!(third.outcome, Outcome::Limited, "{lease:?}");
        assert!(store.acquire_owned(&8u64, 1).is_ok(), "another key");
        drop(a);
        let c = store
            .acquire_owned(&7u64, 1)
            .expect("dropping a permit frees it");
        assert!(
            store.acquire_owned(&7u64, 1).is_err(),
            "{lease:?}: and frees only its own"
        );
        std::thread::spawn(move || drop(b)).join().unwrap();
        let d = store
            .acquire_owned(&7u64, 1)
            .expect("released on another thread");
        assert!(store.acquire_owned(&7u64, 1).is_err());
        drop((c, d));
        assert_eq!(store.peek(&7u64).remaining, 2);
    }
    // Any other limit: the check's answer, and a permit that releases nothing.
    let l = Limit::fixed_window(1, Duration::from_secs(60)).unwrap();
    let store = Arc::new(
        Store::builder(Limits::new(vec![l]).unwrap())
            .capacity(10)
            .build()
            .unwrap(),
    );
    drop(store.acquire_owned(&1u64, 1).unwrap());
    assert!(store.acquire_owned(&1u64, 1).is_err());
}
