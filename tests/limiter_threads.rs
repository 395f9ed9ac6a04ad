//! Two threads hammering one keyless [`Limiter`] at a fixed `now` (so that nothing refills or
//! expires): the compare-and-swap loops must admit exactly the limit, never one more, and a
//! multi-limit record must show no more consumption than was admitted.
//!
//! Covers the three record protocols: one packed limit (`AtomicU64`), two packed limits
//! (`AtomicU128`), and the sequence word (variable-size algorithms, three limits). Not timed.
//!
//! Sequence-word records take fewer attempts: their writers serialize, and on an oversubscribed
//! machine a writer preempted inside the record makes the other thread spin out its time slice.

use std::time::Duration;
use turnstile::{Algorithm, Limit, Limiter, Limits, ManualClock};

/// Attempts per thread on a packed record (lock-free CAS).
const ATTEMPTS: u64 = 200_000;
/// Attempts per thread on a sequence-word record (still 5 × the limit in all).
const WORDS_ATTEMPTS: u64 = 25_000;
const S: u64 = 1_000_000_000;
/// A fixed `now`, at the start of a 10 s window.
const NOW: u64 = 1000 * S;
const DAY: Duration = Duration::from_secs(86_400);

fn limiter(limits: Vec<Limit>) -> Limiter<ManualClock> {
    Limiter::with_limits(Limits::new(limits).unwrap(), ManualClock::new(0))
}

/// Two threads, `attempts` checks of cost 1 each at `now`: how many were admitted.
fn hammer(l: &Limiter<ManualClock>, now: u64, attempts: u64) -> u64 {
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(move || {
                    (0..attempts)
                        .filter(|_| l.check_at(1, now).allowed())
                        .count() as u64
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    })
}

#[test]
fn one_limit_admits_exactly_the_limit() {
    let limits = [
        Limit::fixed_window(10_000, Duration::from_secs(60)).unwrap(),
        Limit::sliding_window(10_000, Duration::from_secs(60)).unwrap(),
        Limit::sliding_log(10_000, Duration::from_secs(60)).unwrap(),
        Limit::window_ring(10_000, Duration::from_secs(60), 60).unwrap(),
        // One token a day: nothing refills at a fixed now anyway.
        Limit::token_bucket(10_000, 1, DAY).unwrap(),
        Limit::leaky_bucket(1, DAY, 9_999, None).unwrap(),
        // A check scans all the lease cells: a smaller limit.
        Limit::concurrency(64, Duration::from_secs(60)).unwrap(),
    ];
    for limit in limits {
        let l = limiter(vec![limit]);
        let (want, attempts) = match limit.algorithm() {
            Algorithm::Concurrency => (64, 2_000),
            a if a.is_packed() => (10_000, ATTEMPTS),
            _ => (10_000, WORDS_ATTEMPTS),
        };
        assert_eq!(hammer(&l, NOW, attempts), want, "{limit:?}");
        assert_eq!(l.check_at(0, NOW).remaining, 0, "{limit:?}");
    }
}

/// Two packed limits: one `AtomicU128`, decided all-or-nothing.
#[test]
fn two_limits_all_or_nothing() {
    let fixed = Limit::fixed_window(10_000, Duration::from_secs(10)).unwrap();
    let bucket = Limit::token_bucket(15_000, 1, DAY).unwrap();
    let l = limiter(vec![fixed, bucket]);
    assert_eq!(hammer(&l, NOW, ATTEMPTS), 10_000);
    assert_eq!(l.check_at(0, NOW).remaining, 0);
    // Next window: the fixed window is fresh, so what is left is the bucket's: it lost exactly
    // the 10 000 admitted, none of the 390 000 refused.
    let next = NOW + 10 * S;
    assert_eq!(l.check_at(0, next).remaining, 5_000);
    assert_eq!(hammer(&l, next, ATTEMPTS), 5_000);
    assert_eq!(l.check_at(0, next).remaining, 0);
}

/// Three limits (one of them variable-size): the sequence-word record.
#[test]
fn three_limits_all_or_nothing() {
    let log = Limit::sliding_log(10_000, Duration::from_secs(1)).unwrap();
    let fixed = Limit::fixed_window(12_000, Duration::from_secs(10)).unwrap();
    let bucket = Limit::token_bucket(15_000, 1, DAY).unwrap();
    let l = limiter(vec![log, fixed, bucket]);
    assert_eq!(hammer(&l, NOW, WORDS_ATTEMPTS), 10_000, "the log's limit");
    assert_eq!(l.check_at(0, NOW).remaining, 0);

    // The log has expired: what is left is the fixed window's, 12 000 − 10 000.
    let t = NOW + S;
    assert_eq!(l.check_at(0, t).remaining, 2_000);
    assert_eq!(hammer(&l, t, WORDS_ATTEMPTS), 2_000, "the fixed window's");

    // The window is over: what is left is the bucket's, 15 000 − 12 000.
    let t = NOW + 10 * S;
    assert_eq!(l.check_at(0, t).remaining, 3_000);
    assert_eq!(hammer(&l, t, WORDS_ATTEMPTS), 3_000, "the bucket's");
    assert_eq!(l.check_at(0, t).remaining, 0);
}
