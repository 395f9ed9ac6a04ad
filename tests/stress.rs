//! Stress: threads hammering one hot key and many keys, on the keyed [`Store`] and the keyless
//! [`Limiter`], with exact algorithms, asserting exact counts and never timings.
//!
//! * Exact algorithms never admit more than their bound in any window, and under saturating
//!   demand admit exactly the bound (fixed_window, sliding_log, two limits all-or-nothing,
//!   token_bucket at a fixed `now` so that nothing refills).
//! * Refunds are never lost: threads run check + refund pairs, after which the limit is full
//!   again and admits exactly its bound.
//! * Live keys stay consistent: `stats().live == live_ids().len()`, no key live twice, and it
//!   equals the distinct keys inserted (or, with reclaim in rounds, covers the current round).
//!
//! Time is passed explicitly (`*_at(now)`): threads move through windows together, meeting
//! at a barrier between windows, so every check of a window sees the same record window.
//!
//! ```text
//! cargo test --release --test stress                 # short versions, a few seconds
//! cargo test --release --test stress -- --ignored    # long versions, 10^8 checks each
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Decision, Limit, Limiter, Limits, ManualClock};

/// Threads on the lock-free packed records (more than the cores: preemption mid-CAS is part
/// of the test).
const THREADS: usize = 4;
/// Threads on sequence-word records, whose writers serialize: a writer preempted inside the
/// record makes the others spin out their slice, so oversubscribing only slows the test.
const WORD_THREADS: usize = 2;
/// Checks per short test.
const SHORT: u64 = 1_000_000;
/// Checks per long test.
const LONG: u64 = 100_000_000;
const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
/// The hot key.
const HOT: u64 = 0x5eed;

/// The tests of this file one at a time: each already uses every core.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn limits(l: Vec<Limit>) -> Limits {
    Limits::new(l).unwrap()
}

/// One hot key on a keyed store, or a keyless limiter.
enum Hot {
    Keyed(Box<Store<ManualClock>>),
    Keyless(Box<Limiter<ManualClock>>),
}

impl Hot {
    fn both(l: &Limits) -> [Hot; 2] {
        [
            Hot::Keyed(Box::new(
                Store::builder(l.clone())
                    .capacity(1024)
                    .shards(4)
                    .build_with_clock(ManualClock::new(0))
                    .unwrap(),
            )),
            Hot::Keyless(Box::new(Limiter::with_limits(
                l.clone(),
                ManualClock::new(0),
            ))),
        ]
    }
    fn name(&self) -> &'static str {
        match self {
            Hot::Keyed(_) => "keyed",
            Hot::Keyless(_) => "keyless",
        }
    }
    fn check(&self, cost: u64, now: u64) -> Decision {
        match self {
            Hot::Keyed(s) => s.check_at(&HOT, cost, now),
            Hot::Keyless(l) => l.check_at(cost, now),
        }
    }
    fn refund(&self, n: u64, now: u64) {
        match self {
            Hot::Keyed(s) => s.refund_at(&HOT, n, now),
            Hot::Keyless(l) => {
                // The keyless refund reads the clock; every thread sets the same `now`.
                l.clock().set(now);
                l.refund(n)
            }
        }
    }
    fn peek(&self, now: u64) -> Decision {
        match self {
            Hot::Keyed(s) => s.peek_at(&HOT, now),
            Hot::Keyless(l) => l.check_at(0, now),
        }
    }
}

/// `threads` threads move through `steps` time steps together; in step `s` each makes `per`
/// checks of cost 1 at `time(s, i)`. Returns the admissions of each step.
fn in_steps(
    hot: &Hot,
    threads: usize,
    steps: usize,
    per: u64,
    time: impl Fn(usize, u64) -> u64 + Sync,
) -> Vec<u64> {
    let admitted: Vec<AtomicU64> = (0..steps).map(|_| AtomicU64::new(0)).collect();
    let barrier = Barrier::new(threads);
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| {
                for (s, count) in admitted.iter().enumerate() {
                    let n = (0..per)
                        .filter(|&i| hot.check(1, time(s, i)).allowed())
                        .count() as u64;
                    count.fetch_add(n, Ordering::Relaxed);
                    barrier.wait();
                }
            });
        }
    });
    admitted.into_iter().map(|a| a.into_inner()).collect()
}

/// Splits `checks` into steps of `per` checks per thread (at least one step).
fn steps_for(checks: u64, threads: usize, per: u64, targets: u64) -> usize {
    (checks / targets / (threads as u64 * per)).max(1) as usize
}

/// fixed_window: exactly L admitted in every window, the demand being 2 L.
fn fixed_window(checks: u64) {
    let _g = serial();
    let (per, w) = (5_000, S);
    let l = per * THREADS as u64 / 2;
    let lim = limits(vec![
        Limit::fixed_window(l, Duration::from_nanos(w)).unwrap()
    ]);
    for hot in Hot::both(&lim) {
        let steps = steps_for(checks, THREADS, per, 2);
        // Checks spread over the window, from its first to its last nanosecond.
        let got = in_steps(&hot, THREADS, steps, per, |s, i| {
            (10 + s as u64) * w + (i * w / per).min(w - 1)
        });
        for (s, &a) in got.iter().enumerate() {
            assert_eq!(a, l, "{}: window {s} admitted {a}, limit {l}", hot.name());
        }
    }
}

/// Two fixed windows all-or-nothing, L per W and 5 L per 10 W: the first five windows of
/// every ten admit L each, the other five nothing (a 16-byte CAS on the keyless limiter).
fn two_limits(checks: u64) {
    let _g = serial();
    let (per, w) = (5_000, S);
    let l = per * THREADS as u64 / 2;
    let lim = limits(vec![
        Limit::fixed_window(l, Duration::from_nanos(w)).unwrap(),
        Limit::fixed_window(5 * l, Duration::from_nanos(10 * w)).unwrap(),
    ]);
    for hot in Hot::both(&lim) {
        let steps = steps_for(checks, THREADS, per, 2);
        let got = in_steps(&hot, THREADS, steps, per, |s, i| {
            (100 + s as u64) * w + i * (w / per)
        });
        for (s, &a) in got.iter().enumerate() {
            let want = if s % 10 < 5 { l } else { 0 };
            assert_eq!(a, want, "{}: window {s} admitted {a}", hot.name());
        }
    }
}

/// sliding_log, steps of W/4: L admitted at every fourth step, nothing in between, so every
/// window (four consecutive steps) holds exactly L admissions.
fn sliding_log(checks: u64) {
    let _g = serial();
    let (per, w) = (2_000, 4 * MS);
    let l = per * WORD_THREADS as u64 / 2;
    let lim = limits(vec![Limit::sliding_log(l, Duration::from_nanos(w)).unwrap()]);
    for hot in Hot::both(&lim) {
        let steps = steps_for(checks, WORD_THREADS, per, 2);
        let got = in_steps(&hot, WORD_THREADS, steps, per, |s, _| {
            S + s as u64 * (w / 4)
        });
        for (s, &a) in got.iter().enumerate() {
            let want = if s % 4 == 0 { l } else { 0 };
            assert_eq!(a, want, "{}: step {s} admitted {a}", hot.name());
            let window: u64 = got[s.saturating_sub(3)..=s].iter().sum();
            assert!(
                window <= l,
                "{}: {window} in the window ending at step {s}",
                hot.name()
            );
        }
    }
}

/// Check + refund pairs of cost 1-3 from every thread at a fixed `now`; afterwards the limit
/// is full again (peek) and admits exactly its capacity. Returns the admitted pairs.
fn refund_pairs(hot: &Hot, threads: usize, pairs: u64, capacity: u64, now: u64) -> u64 {
    let admitted = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for t in 0..threads as u64 {
            let admitted = &admitted;
            sc.spawn(move || {
                let mut n = 0;
                for i in 0..pairs {
                    let cost = 1 + (i + t) % 3;
                    if hot.check(cost, now).allowed() {
                        n += 1;
                        hot.refund(cost, now);
                    }
                }
                admitted.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    let p = hot.peek(now);
    assert_eq!(
        p.remaining,
        capacity,
        "{}: a refund was lost: {p:?}",
        hot.name()
    );
    let drained = (0..capacity + 10)
        .filter(|_| hot.check(1, now).allowed())
        .count() as u64;
    assert_eq!(drained, capacity, "{}: after the refunds", hot.name());
    admitted.into_inner()
}

fn refunds(checks: u64) {
    let _g = serial();
    let now = 1000 * S;
    let day = Duration::from_secs(86_400);
    let packed = [
        Limit::fixed_window(8, day).unwrap(),
        Limit::token_bucket(8, 1, day).unwrap(),
    ];
    for l in packed {
        for hot in Hot::both(&limits(vec![l])) {
            let n = refund_pairs(&hot, THREADS, checks / 4 / 2 / THREADS as u64, 8, now);
            assert!(n > 0, "{}: some pairs were admitted", hot.name());
        }
    }
    // Sequence-word records: sliding_log, and two limits on one key.
    let words = [
        limits(vec![Limit::sliding_log(8, day).unwrap()]),
        limits(vec![
            Limit::sliding_log(8, day).unwrap(),
            Limit::token_bucket(8, 1, day).unwrap(),
        ]),
    ];
    for lim in words {
        for hot in Hot::both(&lim) {
            let n = refund_pairs(
                &hot,
                WORD_THREADS,
                checks / 4 / 2 / WORD_THREADS as u64,
                8,
                now,
            );
            assert!(n > 0, "{}: some pairs were admitted", hot.name());
        }
    }
}

/// token_bucket at a fixed `now` (no refill): every thread drains; exactly the capacity.
fn token_bucket_drain(checks: u64) {
    let _g = serial();
    let now = 5 * S;
    let cap = 1000;
    let lim = limits(vec![Limit::token_bucket(
        cap,
        cap,
        Duration::from_secs(3600),
    )
    .unwrap()]);
    let rounds = (checks / 2 / (THREADS as u64 * 4 * cap)).max(1);
    for hot in Hot::both(&lim) {
        for r in 0..rounds {
            // A fresh, full bucket each round: one hour later it has refilled.
            let at = now + r * 3600 * S;
            let got = in_steps(&hot, THREADS, 1, 4 * cap, |_, _| at);
            assert_eq!(got[0], cap, "{}: round {r}", hot.name());
        }
    }
}

/// `keys` keys, every thread checks each of them `passes` times (starting at different keys),
/// cost 1 at a fixed `now`: every key admits exactly `min(limit, demand)`, and the store holds
/// each key once.
fn many_keys(limit: Limit, keys: u64, passes: u64, threads: usize) {
    let now = 7 * S;
    let store = Store::builder(limits(vec![limit]))
        .capacity(keys + keys / 2)
        .shards(8)
        .seed(11)
        .build_with_clock(ManualClock::new(0))
        .unwrap();
    let admitted: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|sc| {
        for t in 0..threads as u64 {
            let (store, admitted) = (&store, &admitted);
            sc.spawn(move || {
                let start = t * keys / threads as u64;
                for _ in 0..passes {
                    for j in 0..keys {
                        let k = (start + j) % keys;
                        let key = k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                        if store.check_at(&key, 1, now).allowed() {
                            admitted[k as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let want = limit.capacity().min(passes * threads as u64);
    for (k, a) in admitted.iter().enumerate() {
        assert_eq!(a.load(Ordering::Relaxed), want, "key {k}");
    }
    let st = store.stats();
    let mut ids = store.live_ids();
    assert_eq!(st.live, ids.len() as u64, "stats().live against the scan");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as u64, keys, "each key live exactly once");
    assert_eq!(store.len() as u64, keys);
    assert_eq!(st.inserted, keys, "each key inserted once: {st:?}");
    assert_eq!((st.rejected, st.reclaimed, st.evicted), (0, 0, 0), "{st:?}");
}

fn many_keys_all(checks: u64) {
    let _g = serial();
    let hour = Duration::from_secs(3600);
    // At most 250k keys; more passes for more checks.
    let keys = |threads: usize, passes: u64| (checks / 3 / threads as u64 / passes).min(250_000);
    let passes = (checks / 3 / THREADS as u64 / 250_000).max(1);
    let l = (passes * THREADS as u64 / 2).clamp(1, 1000);
    many_keys(
        Limit::fixed_window(l, hour).unwrap(),
        keys(THREADS, passes),
        passes,
        THREADS,
    );
    many_keys(
        Limit::token_bucket(l, 1, hour).unwrap(),
        keys(THREADS, passes),
        passes,
        THREADS,
    );
    let passes = (checks / 3 / WORD_THREADS as u64 / 250_000).max(2);
    let l = (passes * WORD_THREADS as u64 / 2).clamp(1, 16);
    many_keys(
        Limit::sliding_log(l, hour).unwrap(),
        keys(WORD_THREADS, passes),
        passes,
        WORD_THREADS,
    );
}

/// Rounds of fresh keys, ten times the capacity in all, on packed records: idle records of
/// earlier rounds are reclaimed while threads insert the new ones. Each key of a round admits
/// exactly the limit, and the live count stays consistent with the scan.
fn churn(limit: Limit, checks: u64) {
    let keys: u64 = 2_000;
    let store = Store::builder(limits(vec![limit]))
        .capacity(2 * keys)
        .shards(4)
        .seed(5)
        .build_with_clock(ManualClock::new(0))
        .unwrap();
    let l = limit.capacity();
    let per_round = keys * (l + 1);
    let rounds = (checks / per_round).max(20);
    for r in 0..rounds {
        // Well past the window and the reclaim grace of the previous round.
        let now = S + r * 10 * MS;
        let admitted: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|sc| {
            for t in 0..THREADS as u64 {
                let (store, admitted) = (&store, &admitted);
                sc.spawn(move || {
                    // Each key gets l + 1 attempts, spread over the threads.
                    for a in (t..keys * (l + 1)).step_by(THREADS) {
                        let k = (a * 7919) % keys;
                        if store.check_at(&(r << 32 | k), 1, now).allowed() {
                            admitted[k as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        for (k, a) in admitted.iter().enumerate() {
            assert_eq!(a.load(Ordering::Relaxed), l, "round {r} key {k}");
        }
        let st = store.stats();
        let ids = store.live_ids();
        assert_eq!(st.live, ids.len() as u64, "round {r}: {st:?}");
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len(), "round {r}: a key is live twice");
        let current = ids.iter().filter(|&&id| id >> 32 == r).count() as u64;
        assert_eq!(current, keys, "round {r}: every key of the round is live");
        assert_eq!(st.rejected, 0, "round {r}: {st:?}");
    }
    let st = store.stats();
    assert!(st.reclaimed > 0, "{st:?}");
    // A key can be inserted more than once: a record that a helper published fresh for a
    // stalled inserter is idle, so another thread may reclaim it before the inserter applies
    // its request, and the inserter inserts again (its admissions stay exact, checked above).
    assert!(st.inserted >= rounds * keys, "{st:?}");
    assert_eq!(st.inserted - st.reclaimed, st.live, "{st:?}");
}

fn churn_all(checks: u64) {
    let _g = serial();
    churn(
        Limit::fixed_window(3, Duration::from_millis(1)).unwrap(),
        checks / 2,
    );
    churn(
        Limit::token_bucket(3, 3, Duration::from_millis(1)).unwrap(),
        checks / 2,
    );
}

macro_rules! stress {
    ($($short:ident, $long:ident => $f:ident;)*) => {$(
        #[test]
        fn $short() {
            $f(SHORT);
        }
        #[test]
        #[ignore = "long: cargo test --release --test stress -- --ignored"]
        fn $long() {
            $f(LONG);
        }
    )*};
}

stress! {
    hot_key_fixed_window_exact_per_window, long_hot_key_fixed_window => fixed_window;
    hot_key_two_limits_all_or_nothing, long_hot_key_two_limits => two_limits;
    hot_key_sliding_log_exact_per_window, long_hot_key_sliding_log => sliding_log;
    hot_key_token_bucket_drains_exactly, long_hot_key_token_bucket => token_bucket_drain;
    refunds_are_never_lost, long_refunds => refunds;
    many_keys_admit_exactly_and_live_once, long_many_keys => many_keys_all;
    churn_reclaims_consistently, long_churn => churn_all;
}
