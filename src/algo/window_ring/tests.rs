use super::*;
const MIN: u64 = 60_000_000_000;

#[test]
fn five_hundred_per_hour_in_minutes() {
    let p = Params::new(500, 60 * MIN, 60, false).unwrap();
    // 61 nine-bit counters, 7 to a word: 9 words and the header.
    assert_eq!(p.words(), 10);
    let mut rec = vec![0u64; p.words()];
    // 10 per minute for 50 minutes = 500, then denied until minute 0 starts sliding out.
    for m in 0..50 {
        for _ in 0..10 {
            assert!(decide(&mut rec[..], m * MIN + 1, &p, 1, true).allowed());
        }
    }
    let d = decide(&mut rec[..], 55 * MIN, &p, 1, true);
    assert!(!d.allowed());
    // From 60 min minute 0 straddles the window's start: 10 × (s − e)/s rounds to 9 once
    // below 9.5, e > s/20 = 3 s: 490 + 9 = 499.
    assert_eq!(d.retry_after_ns, Some(5 * MIN + MIN / 20 + 1));
    assert!(!decide(&mut rec[..], 60 * MIN + MIN / 20, &p, 1, true).allowed());
    assert!(decide(&mut rec[..], 60 * MIN + MIN / 20 + 1, &p, 1, true).allowed());
    assert!(!decide(&mut rec[..], 60 * MIN + MIN / 20 + 1, &p, 1, true).allowed());
    // Half-way through minute 60: 491 + round(10 / 2) = 496.
    assert_eq!(
        decide(&mut rec[..], 60 * MIN + MIN / 2, &p, 0, true).remaining,
        4
    );
    // Minute 0 is gone at 61 min; minute 1 now straddles: 491 − 10 + 10 = 491.
    assert_eq!(decide(&mut rec[..], 61 * MIN, &p, 0, true).remaining, 9);
}

/// One sub-window: the two-window estimate, its share rounded to nearest, halves up.
#[test]
fn one_bucket_rounds_the_share_to_nearest() {
    let p = Params::new(10, 1000, 1, false).unwrap();
    let mut rec = vec![0u64; p.words()];
    assert!(decide(&mut rec[..], 0, &p, 3, true).allowed());
    // 3 in [0, 1000); at t in [1000, 2000) they count 3 × (2000 − t) / 1000.
    for (t, counted) in [(1000, 3), (1500, 2), (1510, 1), (1833, 1), (1834, 0)] {
        assert_eq!(
            decide(&mut rec[..], t, &p, 0, true).remaining,
            10 - counted,
            "{t}"
        );
    }
}

/// Whatever `now` — time 0, the end of u64 with nanosecond sub-windows, time going
/// backwards, wrapped indices — nothing overflows (checked with overflow checks on) and a
/// denial that can be retried waits at least 1 ns.
#[test]
fn extreme_times_never_overflow() {
    let mut times = vec![
        0,
        1,
        2,
        59,
        60,
        61,
        1 << 37,
        (1 << 38) + 3,
        1 << 62,
        u64::MAX - 61,
        u64::MAX - 1,
        u64::MAX,
    ];
    times.extend(times.clone().into_iter().rev());
    for (n, window) in [(1, 1), (3, 3), (60, 60), (60, 60 * MIN), (1024, 1024)] {
        for count_denied in [false, true] {
            let p = Params::new(3, window, n, count_denied).unwrap();
            let mut rec = vec![0u64; p.words()];
            for round in 0..3 {
                for &t in &times {
                    for cost in [0, 1, 2, 3, 4, u64::MAX] {
                        let d = decide(&mut rec[..], t, &p, cost, true);
                        assert!(d.retry_after_ns.is_none_or(|r| r >= 1));
                        assert!(d.remaining <= 3);
                    }
                    idle_in(&rec[..], t, &p);
                    refund(&mut rec[..], t, &p, 1 + round);
                }
            }
        }
    }
}

#[test]
fn refuses_bad_params() {
    assert!(Params::new(70_000, 60, 60, false).is_err());
    assert!(Params::new(5, 61, 60, false).is_err());
    assert!(Params::new(5, 60, 0, false).is_err());
}

/// Found by fuzzing (store_differential): 4 per 4 ns in four 1 ns sub-windows, a record
/// last written more than 2^38 sub-windows before `now`. Its index aliased to a sub-window
/// that had not written the counters, the total was kept, and the record counted 4 while
/// `idle_in` called it idle, so reclaiming it would have changed a decision.
#[test]
fn an_aliased_index_is_idle_only_when_it_counts_nothing() {
    let p = Params::new(4, 4, 4, false).unwrap();
    let rec = [0x4cb6_8c00_0000_0004u64, 4];
    let now = 31_540_420_899_000_000;
    assert_eq!(idle_in(&rec[..], now, &p), 0);
    for cost in 0..6 {
        let mut r = rec;
        let mut fresh = [0u64; 2];
        assert_eq!(
            decide(&mut r[..], now, &p, cost, true),
            decide(&mut fresh[..], now, &p, cost, true),
            "cost {cost}"
        );
    }
}

proptest::proptest! {
    /// Whatever the record holds (any words, any index, any time): if it is idle it
    /// decides as a fresh one, the property the store's reclaim relies on.
    #[test]
    fn any_idle_record_decides_as_fresh(
        limit in 1u64..20,
        buckets in 1u64..9,
        sub in 1u64..6,
        words in proptest::collection::vec(proptest::prelude::any::<u64>(), 4),
        now in 0u64..1 << 62,
        count_denied in proptest::prelude::any::<bool>(),
        behind in proptest::option::of(0u64..12),
        counters in 0u8..3,
    ) {
        let p = Params::new(limit, sub * buckets, buckets, count_denied).unwrap();
        let mut words = words;
        // Random counters, all zero (a total no counter holds), or one non-zero.
        match counters {
            0 => {}
            1 => words[1..].fill(0),
            _ => {
                let w = words[1];
                words[1..].fill(0);
                words[1] = w & 0xffff;
            }
        }
        if let Some(k) = behind {
            // A stored index a few sub-windows behind now's, counters at any slots: what
            // an index aliased after 2^38 sub-windows looks like.
            let idx = (now / sub).wrapping_sub(k) % p.period();
            words[0] = idx << TOTAL_BITS | (words[0] & TOTAL_MASK);
        }
        let rec = &words[..p.words()];
        if idle_in(rec, now, &p) == 0 {
            for cost in 0..limit + 2 {
                let mut r = rec.to_vec();
                let mut fresh = vec![0u64; p.words()];
                proptest::prop_assert_eq!(
                    decide(&mut r[..], now, &p, cost, true),
                    decide(&mut fresh[..], now, &p, cost, true),
                    "cost {}", cost
                );
            }
        }
    }
}
