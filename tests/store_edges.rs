//! The keyed store at its edges: sizes the builder must refuse with a `ConfigError` instead of
//! panicking, and checks whose caller-supplied time lags behind a reclaim.

use std::time::Duration;
use turnstile::keyed::{FullPolicy, Store};
use turnstile::{Limit, Limiter, Limits, ManualClock, Outcome};

fn limits() -> Limits {
    Limits::new(vec![
        Limit::fixed_window(10, Duration::from_secs(1)).unwrap()
    ])
    .unwrap()
}

fn build(capacity: Option<u64>, budget: Option<usize>, shards: usize) -> String {
    let mut b = Store::builder(limits()).shards(shards).seed(1);
    if let Some(c) = capacity {
        b = b.capacity(c);
    }
    if let Some(m) = budget {
        b = b.memory_budget(m);
    }
    match b.build_with_clock(ManualClock::new(0)) {
        Ok(s) => panic!(
            "built a store of {} keys in {} bytes",
            s.capacity(),
            s.memory_bytes()
        ),
        Err(e) => e.to_string(),
    }
}

/// Sizes past what a shard can place are refused with an error naming the fix (more shards),
/// not an assertion panic or an overflow.
#[test]
fn oversized_stores_are_config_errors() {
    let e = build(Some(3_000_000_000), None, 1);
    assert!(e.contains("shards"), "{e}");
    let e = build(Some(u64::MAX), None, 1);
    assert!(e.contains("capacity"), "{e}");
    let e = build(Some(u64::MAX), None, 1 << 16);
    assert!(e.contains("capacity"), "{e}");
    let e = build(None, Some(usize::MAX), 1);
    assert!(e.contains("memory_budget"), "{e}");
    let e = build(None, Some(usize::MAX), 1 << 16);
    assert!(e.contains("memory_budget"), "{e}");
}

/// Placement uses 24 bits of the key's mix per home bucket: a shard of more than 2^24 buckets
/// would have buckets no key can reach (the store would fill below its stated capacity), so
/// the builder refuses it. One key more than the largest shard's capacity is refused; the
/// largest builds (its memory is reserved, not touched).
#[test]
fn a_shard_past_the_placement_range_is_refused() {
    let max = turnstile::keyed::max_keys_per_shard();
    let e = build(Some(max + 1), None, 1);
    assert!(e.contains("at least 2 shards"), "{e}");
    let s = Store::builder(limits())
        .shards(1)
        .capacity(max)
        .build_with_clock(ManualClock::new(0))
        .unwrap();
    assert_eq!(s.capacity(), max);
    let e = build(Some(4 * max + 1), None, 4);
    assert!(e.contains("at least 8 shards"), "{e}");
}

const SEC: u64 = 1_000_000_000;

/// A check stamped before a reclaim: token_bucket of capacity 1 refilling 1 per 10 s, a
/// store of 8 slots. `k0` is admitted at 100 s; checks of other keys stamped 120 s fill the
/// store and reclaim `k0`'s record (idle by then), and one of them is reset to leave room;
/// `k0` checked at 105 s must get the answer
/// its record would have given — denied, as the keyless limiter denies it — not a fresh one.
#[test]
fn a_check_stamped_before_a_reclaim_is_not_answered_fresh() {
    let limit = Limit::token_bucket(1, 1, Duration::from_secs(10)).unwrap();
    let s = Store::builder(Limits::new(vec![limit]).unwrap())
        .capacity(1)
        .shards(1)
        .seed(1)
        .policy(FullPolicy::Reject)
        .build_with_clock(ManualClock::new(0))
        .unwrap();
    let keyless = Limiter::new(limit);
    assert!(s.check_at(&0u64, 1, 100 * SEC).allowed());
    assert!(keyless.check_at(1, 100 * SEC).allowed());
    let mut k = 1u64;
    while s.live_ids().contains(&0) {
        assert!(s.check_at(&k, 1, 120 * SEC).allowed());
        k += 1;
        assert!(k < 1000, "k0 never reclaimed");
    }
    assert!(s.stats().reclaimed >= 1);
    // Room for k0 again (else it would only find the store full).
    assert!(s.reset(&1u64));
    let want = keyless.check_at(1, 105 * SEC);
    assert!(!want.allowed());
    let got = s.check_at(&0u64, 1, 105 * SEC);
    assert!(!got.allowed(), "store {got:?}, keyless {want:?}");
    assert_eq!(got.outcome, Outcome::Limited);
    // It fits again once the caller's time reaches the reclaim's: the answer says when.
    let retry = got.retry_after_ns.expect("a retry hint");
    assert!(retry > 0 && retry <= 15 * SEC, "{got:?}");
    // The same through the batch entry point.
    let mut out = [got; 1];
    s.check_batch_at(&[0u64], 1, 105 * SEC, &mut out);
    assert!(!out[0].allowed(), "{:?}", out[0]);
    // A key with a live record is answered exactly at any time, lagging or not.
    assert!(!s.check_at(&2u64, 1, 110 * SEC).allowed());
}
