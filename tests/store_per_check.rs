//! The keyed store with limits given per check (`Store::check_with_at`): one record per key,
//! whatever limit decides it — redis-cell's change of parameters, the carry-over of each
//! algorithm, the limits a store refuses, the id form a server's pipeline uses, reclaim and
//! snapshots. (The decisions themselves are checked against the reference models and the
//! decision contract, limits changing between checks: tests/reference.rs, tests/contract.rs.)

use std::time::Duration;
use turnstile::algo::token_bucket;
use turnstile::keyed::{FullPolicy, Key, Store};
use turnstile::{Algorithm, Limit, Limits, ManualClock, Outcome};

const S: u64 = 1_000_000_000;
const T0: u64 = 1_000 * S;

fn store(base: Limit, capacity: u64) -> Store<ManualClock> {
    Store::builder(Limits::new(vec![base]).unwrap())
        .capacity(capacity)
        .seed(7)
        .build_with_clock(ManualClock::new(T0))
        .unwrap()
}

/// redis-cell's limit for `CL.THROTTLE key max_burst count period`: capacity max_burst + 1,
/// one token per period / count.
fn cell(max_burst: u64, count: u64, period_s: u64) -> Limit {
    let interval = period_s * S / count;
    Limit::TokenBucket(token_bucket::Params::with_interval(max_burst + 1, interval).unwrap())
}

/// `CL.THROTTLE m 2 10 60` three times, then `CL.THROTTLE m 5 10 60`: redis-cell answers
/// `[0, 6, 2, -1, 24]`, the arrival time kept across the change of parameters.
#[test]
fn redis_cells_change_of_parameters() {
    let s = store(cell(0, 1, 1), 1000);
    for _ in 0..3 {
        assert!(s
            .check_with_at("m", &cell(2, 10, 60), 1, T0)
            .unwrap()
            .allowed());
    }
    let d = s.check_with_at("m", &cell(5, 10, 60), 1, T0).unwrap();
    assert!(d.allowed());
    assert_eq!((d.limit, d.remaining), (6, 2));
    assert_eq!(d.reset_after_ns, 24 * S);
    assert_eq!(s.len(), 1, "one record for every parameter set");
}

/// A fixed window's count carries over to a new limit of the same window: a lower limit than
/// the count denies until the window ends, a higher one admits what is left of it.
#[test]
fn a_window_count_is_compared_with_the_new_limit() {
    let w = Duration::from_secs(60);
    let s = store(Limit::fixed_window(100, w).unwrap(), 1000);
    let ten = Limit::fixed_window(10, w).unwrap();
    let five = Limit::fixed_window(5, w).unwrap();
    for _ in 0..8 {
        assert!(s.check_with_at(&1u64, &ten, 1, T0).unwrap().allowed());
    }
    let d = s.check_with_at(&1u64, &five, 1, T0).unwrap();
    assert_eq!((d.outcome, d.remaining), (Outcome::Limited, 0));
    let window_end = (T0 / (60 * S) + 1) * 60 * S;
    assert_eq!(d.retry_after_ns, Some(window_end - T0));
    assert!(s
        .check_with_at(&1u64, &five, 1, window_end)
        .unwrap()
        .allowed());
    let d = s
        .check_with_at(&2u64, &Limit::fixed_window(20, w).unwrap(), 8, T0)
        .unwrap();
    assert_eq!(d.remaining, 12);
    let d = s
        .check_with_at(&2u64, &Limit::fixed_window(30, w).unwrap(), 1, T0)
        .unwrap();
    assert_eq!(d.remaining, 21, "the 8 counted, and this one");
}

/// A store refuses a limit whose records it cannot read — another algorithm, another window,
/// or any limit for a store of larger records — saying why, and touches no record.
#[test]
fn limits_a_store_cannot_read_are_refused() {
    let w = Duration::from_secs(60);
    let s = store(Limit::fixed_window(100, w).unwrap(), 1000);
    let e = s
        .check_with_at(
            &1u64,
            &Limit::fixed_window(100, Duration::from_secs(1)).unwrap(),
            1,
            T0,
        )
        .unwrap_err();
    assert_eq!(e.windows, Some((60 * S, S)));
    assert!(e.to_string().contains("windows of 60000000000 ns"), "{e}");
    let e = s
        .check_with_at(&1u64, &Limit::token_bucket(5, 5, w).unwrap(), 1, T0)
        .unwrap_err();
    assert_eq!(
        (e.store, e.given),
        (Some(Algorithm::FixedWindow), Algorithm::TokenBucket)
    );
    assert!(e.to_string().contains("give a fixed_window limit"), "{e}");
    assert!(s.is_empty(), "a refused check touches nothing");
    let log = store(Limit::sliding_log(5, w).unwrap(), 100);
    let e = log
        .check_with_at(&1u64, &Limit::sliding_log(5, w).unwrap(), 1, T0)
        .unwrap_err();
    assert_eq!(e.store, None);
    assert!(e.to_string().contains("one packed limit"), "{e}");
    assert!(s
        .peek_with_at(&1u64, &Limit::token_bucket(1, 1, w).unwrap(), T0)
        .is_err());
    assert!(s
        .refund_with_at(&1u64, &Limit::token_bucket(1, 1, w).unwrap(), 1, T0)
        .is_err());
}

/// A server's pipeline: each key hashed once to an id (`hasher().bytes`), the ids prefetched,
/// then checked by id — the same record as a check by the key itself.
#[test]
fn a_key_id_hashed_once_checks_the_keys_record() {
    let s = store(cell(0, 1, 1), 1000);
    let keys: Vec<String> = (0..32).map(|i| format!("user:{i}")).collect();
    let ids: Vec<u64> = keys
        .iter()
        .map(|k| s.hasher().bytes(k.as_bytes()))
        .collect();
    for (k, id) in keys.iter().zip(&ids) {
        assert_eq!(k.as_str().key_id(s.hasher()), *id);
        s.prefetch(id);
    }
    let l = cell(3, 1, 1);
    for id in &ids {
        assert_eq!(s.check_with_at(id, &l, 1, T0).unwrap().remaining, 3);
    }
    for k in &keys {
        assert_eq!(s.check_with_at(k.as_str(), &l, 1, T0).unwrap().remaining, 2);
    }
}

/// Ten thousand distinct parameter sets on one store: one record per key, none per parameter
/// set, and each key decided by its own.
#[test]
fn ten_thousand_parameter_sets_share_one_store() {
    let s = store(cell(0, 1, 1), 20_000);
    let bytes = s.memory_bytes();
    for k in 0..10_000u64 {
        let l = cell(k % 97, 1 + k % 89, 1 + k % 83);
        let d = s.check_with_at(&k, &l, 1, T0).unwrap();
        assert!(d.allowed());
        assert_eq!(d.remaining, k % 97, "key {k}");
    }
    assert_eq!(s.len(), 10_000);
    assert_eq!(s.memory_bytes(), bytes, "a store never grows");
}

/// Records written under given limits are reclaimed by their own idleness (a bucket: its TAT
/// passed), whatever limit wrote them; a busy one is not.
#[test]
fn records_of_given_limits_are_reclaimed_when_idle() {
    let base = cell(0, 1, 1);
    let s = Store::builder(Limits::new(vec![base]).unwrap())
        .capacity(8)
        .shards(1)
        .seed(7)
        .policy(FullPolicy::Reject)
        .build_with_clock(ManualClock::new(T0))
        .unwrap();
    // Fill the table, every key drawing an hour ahead under its own limit.
    let hour = Limit::token_bucket(1, 1, Duration::from_secs(3600)).unwrap();
    let mut live = Vec::new();
    for k in 0..1000u64 {
        let d = s.check_with_at(&k, &hour, 1, T0).unwrap();
        if d.outcome == Outcome::StoreFull {
            assert_eq!(d.limit, 1, "a refusal reports the given limit");
            break;
        }
        live.push(k);
    }
    let n = live.len();
    assert!(n >= 8, "{n}");
    // Half an hour on, nothing is idle: a new key is refused.
    let later = T0 + 1800 * S;
    let d = s.check_with_at(&5000u64, &hour, 1, later).unwrap();
    assert_eq!(d.outcome, Outcome::StoreFull);
    // Two hours on, every record's TAT has passed: room again, and the reclaimed keys decide
    // as fresh ones.
    let after = T0 + 7200 * S;
    assert!(s
        .check_with_at(&5000u64, &hour, 1, after)
        .unwrap()
        .allowed());
    assert!(s.stats().reclaimed >= 1);
    assert_eq!(s.len(), n);
}

/// A snapshot of a store given limits per check holds states only: restored into a store of
/// another base limit (same algorithm, same seed), every key decides as before.
#[test]
fn snapshots_restore_under_any_limits() {
    let a = store(cell(0, 1, 1), 1000);
    let limits: Vec<Limit> = (0..50).map(|k| cell(k % 7, 1 + k % 5, 60)).collect();
    for (k, l) in limits.iter().enumerate() {
        a.check_with_at(&(k as u64), l, 1 + k as u64 % 3, T0)
            .unwrap();
    }
    let b = store(cell(9, 9, 9), 1000);
    let mut n = 0;
    assert!(a.export_packed(|id, state| {
        assert!(b.import_packed(id, state, T0));
        n += 1;
    }));
    assert_eq!(n, a.len());
    let t = T0 + 7 * S;
    for (k, l) in limits.iter().enumerate() {
        let k = k as u64;
        assert_eq!(
            a.check_with_at(&k, l, 1, t).unwrap(),
            b.check_with_at(&k, l, 1, t).unwrap(),
            "key {k}"
        );
    }
}
