//! The design notes' scenarios, as named tests over the public API.
//!
//! Every test runs on a [`ManualClock`] (tests never sleep) and a keyless [`Limiter`] per user.
//! Times are nanoseconds from the clock's epoch, read as a time of day: `NOON` is 12:00:00.

use std::time::Duration;
use turnstile::{Algorithm, Decision, Limit, LimitSpec, Limiter, Limits, ManualClock, Outcome};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const MIN: u64 = 60 * S;
const HOUR: u64 = 60 * MIN;
/// 12:00:00.
const NOON: u64 = 12 * HOUR;

fn limiter(limits: Vec<Limit>, clock: &ManualClock) -> Limiter<&ManualClock> {
    Limiter::with_limits(Limits::new(limits).unwrap(), clock)
}

/// `n` requests of cost 1 at `now`: which were admitted.
fn burst(l: &Limiter<&ManualClock>, n: usize, now: u64) -> Vec<bool> {
    (0..n).map(|_| l.check_at(1, now).allowed()).collect()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Note 000: "three requests per minute per user", a fixed window; 12:00:03 is in the 12:00:00
/// window, so the counter resets at 12:01:00.
#[test]
fn three_per_minute_per_user() {
    let clock = ManualClock::new(0);
    let kristie = limiter(vec![Limit::fixed_window(3, secs(60)).unwrap()], &clock);
    let bob = limiter(vec![Limit::fixed_window(3, secs(60)).unwrap()], &clock);

    assert_eq!(burst(&kristie, 3, NOON + 3 * S), [true; 3]);
    let d = kristie.check_at(1, NOON + 30 * S);
    assert_eq!(d.outcome, Outcome::Limited);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after_ns, Some(30 * S), "until 12:01:00");
    // Another user has a quota of its own.
    assert_eq!(burst(&bob, 4, NOON + 30 * S), [true, true, true, false]);
    assert!(!kristie.check_at(1, NOON + MIN - 1).allowed());
    assert_eq!(burst(&kristie, 4, NOON + MIN), [true, true, true, false]);
}

/// Note 000's drawback: 3 at 12:00:59 and 3 at 12:01:00 all pass a fixed window (6 in two
/// seconds); a sliding log admits 3 of the 6.
#[test]
fn window_edge_burst() {
    let clock = ManualClock::new(0);
    let fixed = limiter(vec![Limit::fixed_window(3, secs(60)).unwrap()], &clock);
    let log = limiter(vec![Limit::sliding_log(3, secs(60)).unwrap()], &clock);
    let edge = NOON + MIN;

    assert_eq!(burst(&fixed, 3, edge - S), [true; 3]);
    assert_eq!(
        burst(&fixed, 3, edge),
        [true; 3],
        "a new window: 6 in two seconds"
    );

    assert_eq!(burst(&log, 3, edge - S), [true; 3]);
    for _ in 0..3 {
        let d = log.check_at(1, edge);
        assert!(!d.allowed());
        // Until 12:01:59, to the log's tick (56 ns for a 60 s window), never earlier.
        let r = d.retry_after_ns.unwrap();
        assert!((59 * S..59 * S + 56).contains(&r), "{r}");
    }
    assert_eq!(
        burst(&log, 4, edge + 59 * S + 56),
        [true, true, true, false]
    );
}

/// Note 002, problem 1 (and note 000's estimates): 500 requests per hour, three ways. 10 a
/// minute for 50 minutes fill all three; they differ in when they let traffic in again.
#[test]
fn five_hundred_per_hour() {
    let clock = ManualClock::new(0);
    let log = limiter(vec![Limit::sliding_log(500, secs(3600)).unwrap()], &clock);
    let ring = limiter(
        vec![Limit::window_ring(500, secs(3600), 60).unwrap()],
        &clock,
    );
    let sliding = limiter(
        vec![Limit::sliding_window(500, secs(3600)).unwrap()],
        &clock,
    );
    // Records: 2 + 250 words (2016 bytes; the notes estimate 12 KB per user for a sorted set),
    // 10 words (80 bytes; the notes: 1.6 KB), 1 word.
    assert_eq!(log.limits().limits()[0].words(), 252);
    assert_eq!(ring.limits().limits()[0].words(), 10);
    assert_eq!(sliding.limits().limits()[0].words(), 1);

    for l in [&log, &ring, &sliding] {
        for m in 0..50 {
            assert_eq!(burst(l, 10, NOON + m * MIN + S), [true; 10], "minute {m}");
        }
    }
    let at = NOON + 55 * MIN;
    let tick = 3353; // ⌈3600 s / 2^30⌉ ns
                     // The log: exact, until 12:00:01's requests are an hour old.
    let r = log.check_at(1, at).retry_after_ns.unwrap();
    assert!((5 * MIN + S..5 * MIN + S + tick).contains(&r), "{r}");
    // The ring: from 13:00 minute 12:00 straddles the window's start, its 10 weighted by the
    // share still inside, 10 × (60 s − e) / 60 s rounded to nearest: 9 once e > 3 s.
    assert_eq!(
        ring.check_at(1, at).retry_after_ns,
        Some(5 * MIN + 3 * S + 1)
    );
    // Two windows: all 500 in the 12:00 window; from 13:00 they are weighted by the part of
    // the window still overlapping, ⌊500 × (W − e) / W⌋ ≤ 499 from 1 ns past 13:00.
    assert_eq!(sliding.check_at(1, at).retry_after_ns, Some(5 * MIN + 1));

    // At 13:00:30: the log has freed 12:00:01's 10, the ring half of minute 12:00's 10 (it
    // takes them for spread over the minute), and the two windows ⌊500 × 3570 / 3600⌋ = 495
    // still counted.
    let later = NOON + HOUR + 30 * S;
    assert_eq!(log.check_at(0, later).remaining, 10);
    assert_eq!(ring.check_at(0, later).remaining, 5);
    assert_eq!(sliding.check_at(0, later).remaining, 5);
}

/// Note 002, problem 2: at most 10 requests a minute and 2 seconds between requests. Two
/// limits on one key, all-or-nothing: a request refused by the gap does not use up the minute.
#[test]
fn ten_per_minute_with_two_second_gap() {
    let clock = ManualClock::new(0);
    let per_minute = Limit::sliding_log(10, secs(60)).unwrap();
    // The gap: a bucket of one token, refilled every 2 s.
    let gap = Limit::token_bucket(1, 1, secs(2)).unwrap();
    let both = limiter(vec![per_minute, gap], &clock);
    let minute_only = limiter(vec![per_minute], &clock);

    // One request a second for a minute.
    let mut admitted = vec![];
    for s in 0..60 {
        let now = NOON + s * S;
        let d = both.check_at(1, now);
        if d.allowed() {
            admitted.push(s);
        } else if s < 19 {
            assert_eq!(d.retry_after_ns, Some(S), "at {s} s: the gap");
        } else {
            // From 19 s the minute is full (at 19 s the gap denies too: the later retry wins).
            let r = d.retry_after_ns.unwrap();
            assert!(
                (60 * S - s * S..60 * S - s * S + 56).contains(&r),
                "at {s} s: the minute, {r}"
            );
        }
    }
    // Every other second until the minute's quota is used up at 18 s. Had the 9 refused
    // requests at odd seconds counted, the quota would have run out at 9 s, as it does for the
    // per-minute limit alone:
    assert_eq!(admitted, [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]);
    let alone: Vec<u64> = (0..19)
        .filter(|s| minute_only.check_at(1, NOON + s * S).allowed())
        .collect();
    assert_eq!(alone, (0..10).collect::<Vec<_>>());
    // A minute after the first, the next.
    assert!(!both.check_at(1, NOON + 60 * S - 1).allowed());
    assert!(both.check_at(1, NOON + 60 * S + 56).allowed());
}

/// Note 002: limit 7 a minute, 5 in the previous minute, 3 in the current one, a request at
/// 30 % of it: 3 + 5 × 0.7 = 6.5, counted as 6, so it goes through.
#[test]
fn sliding_window_three_plus_five_times_point_seven() {
    let clock = ManualClock::new(0);
    let l = limiter(vec![Limit::sliding_window(7, secs(60)).unwrap()], &clock);
    assert_eq!(burst(&l, 5, NOON - 30 * S), [true; 5], "previous minute");
    assert_eq!(burst(&l, 3, NOON + 12 * S), [true; 3], "current minute");
    let at = NOON + 18 * S; // 30 % of the current minute
    assert_eq!(l.check_at(0, at).remaining, 1, "estimate ⌊5 × 0.7⌋ + 3 = 6");
    let d = l.check_at(1, at);
    assert!(d.allowed());
    assert_eq!(d.remaining, 0);
    assert!(!l.check_at(1, at).allowed());
}

/// Cloudflare's example (note 002): 50 a minute, 42 in the previous minute, 18 in the current,
/// 15 s into it: 42 × 45/60 + 18 = 49.5, counted as 49 < 50: allowed.
#[test]
fn cloudflare_42_45_60_plus_18() {
    let clock = ManualClock::new(0);
    let l = limiter(vec![Limit::sliding_window(50, secs(60)).unwrap()], &clock);
    assert_eq!(burst(&l, 42, NOON - 30 * S), [true; 42]);
    let at = NOON + 15 * S;
    assert_eq!(burst(&l, 18, at), [true; 18]);
    assert_eq!(l.check_at(0, at).remaining, 1, "⌊42 × 45/60⌋ + 18 = 49");
    assert!(l.check_at(1, at).allowed());
    let d = l.check_at(1, at);
    assert_eq!(d.outcome, Outcome::Limited);
    // With 19 now in the current window, the next fits once ⌊42 × (60 − e)/60⌋ ≤ 30, i.e.
    // 42 × (60 − e) < 31 × 60: e > 60 × 11/42 = 15.714285714... s, from 15.714285715 s.
    assert_eq!(d.retry_after_ns, Some(714_285_715));
}

/// Note 000: "15 requests per second for Customer A": a token bucket of 15 refilled 15 a
/// second. A burst of 15, then one every 66.67 ms (T = ⌈1 s / 15⌉ = 66 666 667 ns).
#[test]
fn customer_a_fifteen_per_second() {
    let clock = ManualClock::new(0);
    let l = limiter(vec![Limit::token_bucket(15, 15, secs(1)).unwrap()], &clock);
    let t = 66_666_667;
    assert_eq!(
        burst(&l, 16, NOON),
        [[true; 15].as_slice(), &[false]].concat()
    );
    assert_eq!(l.check_at(1, NOON).retry_after_ns, Some(t));
    for k in 1..=30 {
        assert!(!l.check_at(1, NOON + k * t - 1).allowed(), "{k}");
        assert_eq!(burst(&l, 2, NOON + k * t), [true, false], "{k}");
    }
}

/// Note 000's Java `TokenBucket(250, TimeUnit.MINUTES)`: capacity 250 / 60 = 4 (int
/// division), refilled at 250 a minute. After 1 s, five `take()`s, after another 1 s five
/// more; the Java prints true ×4, false, true ×4, false, and so does this. (The bucket starts
/// full here, empty there: the Java's first second refills it to 4.)
#[test]
fn note_000_token_bucket_250_per_minute() {
    let clock = ManualClock::new(0);
    let capacity = 250 / 60;
    let l = limiter(
        vec![Limit::token_bucket(capacity, 250, secs(60)).unwrap()],
        &clock,
    );
    clock.set(S);
    let first: Vec<bool> = (0..5).map(|_| l.check(1).allowed()).collect();
    clock.advance(secs(1));
    let second: Vec<bool> = (0..5).map(|_| l.check(1).allowed()).collect();
    assert_eq!(
        [first, second].concat(),
        [true, true, true, true, false, true, true, true, true, false]
    );
}

/// By default a denied request costs nothing: note 002's drawback of the sorted-set log
/// ("dropped requests are also counted ... it will affect the user for the next hour") is
/// avoided.
#[test]
fn denied_requests_do_not_consume_by_default() {
    let clock = ManualClock::new(0);
    let l = limiter(vec![Limit::sliding_log(3, secs(60)).unwrap()], &clock);
    assert_eq!(burst(&l, 3, NOON), [true; 3]);
    assert_eq!(burst(&l, 5, NOON + 30 * S), [false; 5]);
    assert_eq!(
        burst(&l, 4, NOON + MIN + 56),
        [true, true, true, false],
        "a minute after the first three"
    );
}

/// `count_denied` opts into the notes' behaviour: denied requests are logged too.
#[test]
fn count_denied_option() {
    let clock = ManualClock::new(0);
    let spec = LimitSpec {
        count_denied: true,
        ..LimitSpec::new(Algorithm::SlidingLog, 3, secs(60))
    };
    let l = limiter(vec![spec.build().unwrap()], &clock);
    assert_eq!(burst(&l, 3, NOON), [true; 3]);
    assert_eq!(burst(&l, 5, NOON + 30 * S), [false; 5]);
    let d = l.check_at(1, NOON + MIN + 56);
    assert!(!d.allowed(), "the denials at 12:00:30 hold the log");
    let r = d.retry_after_ns.unwrap();
    assert!((30 * S - 56..30 * S).contains(&r), "until 12:01:30: {r}");
    // By then the denials have expired, but the one just refused at 12:01:00 is logged too.
    assert_eq!(burst(&l, 3, NOON + 90 * S + 56), [true, true, false]);

    // The same for a window counter: the denials push the next window's estimate up.
    let spec = LimitSpec {
        count_denied: true,
        ..LimitSpec::new(Algorithm::SlidingWindow, 3, secs(60))
    };
    let counted = limiter(vec![spec.build().unwrap()], &clock);
    let plain = limiter(vec![Limit::sliding_window(3, secs(60)).unwrap()], &clock);
    for l in [&counted, &plain] {
        assert_eq!(
            burst(l, 6, NOON + 30 * S),
            [true, true, true, false, false, false]
        );
    }
    // 12:01:30: ⌊prev × 0.5⌋ with prev 3 (plain) or 6 (counted).
    assert_eq!(plain.check_at(0, NOON + 90 * S).remaining, 2);
    assert_eq!(counted.check_at(0, NOON + 90 * S).remaining, 0);
}

/// A request that did not use its quota gives it back.
#[test]
fn refund_gives_back() {
    let clock = ManualClock::new(NOON);
    let fixed = limiter(vec![Limit::fixed_window(3, secs(60)).unwrap()], &clock);
    assert_eq!(burst(&fixed, 4, NOON), [true, true, true, false]);
    fixed.refund(1);
    assert_eq!(burst(&fixed, 2, NOON), [true, false]);

    let bucket = limiter(vec![Limit::token_bucket(15, 15, secs(1)).unwrap()], &clock);
    assert_eq!(burst(&bucket, 15, NOON), [true; 15]);
    bucket.refund(5);
    assert_eq!(bucket.peek().remaining, 5);
    bucket.refund(100);
    assert_eq!(bucket.peek().remaining, 15, "never above capacity");

    let log = limiter(vec![Limit::sliding_log(3, secs(60)).unwrap()], &clock);
    assert_eq!(burst(&log, 4, NOON), [true, true, true, false]);
    log.refund(2);
    assert_eq!(burst(&log, 3, NOON), [true, true, false]);

    // Two limits: both get it back.
    let two = limiter(
        vec![
            Limit::fixed_window(3, secs(60)).unwrap(),
            Limit::sliding_window(5, secs(60)).unwrap(),
        ],
        &clock,
    );
    assert_eq!(burst(&two, 4, NOON), [true, true, true, false]);
    two.refund(3);
    assert_eq!(burst(&two, 4, NOON), [true, true, true, false]);
}

fn every_algorithm() -> Vec<Limit> {
    vec![
        Limit::fixed_window(3, secs(60)).unwrap(),
        Limit::sliding_window(3, secs(60)).unwrap(),
        Limit::sliding_log(3, secs(60)).unwrap(),
        Limit::window_ring(3, secs(60), 6).unwrap(),
        Limit::token_bucket(3, 1, secs(20)).unwrap(),
        Limit::leaky_bucket(1, secs(20), 2, Some(1)).unwrap(),
        Limit::concurrency(3, secs(60)).unwrap(),
    ]
}

/// Cost 0 peeks: always answered allowed, with what is left, and changes nothing.
#[test]
fn cost_zero_peek_changes_nothing() {
    for limit in every_algorithm() {
        let clock = ManualClock::new(NOON);
        let peeked = limiter(vec![limit], &clock);
        let plain = limiter(vec![limit], &clock);
        for k in 0..40u64 {
            let now = NOON + k * 7 * S;
            for _ in 0..3 {
                let d = peeked.check_at(0, now);
                assert_eq!(d.outcome, Outcome::Allowed, "{limit:?}");
                clock.set(now);
                assert_eq!(peeked.peek().remaining, d.remaining);
            }
            let (a, b) = (
                peeked.check_at(1 + k % 2, now),
                plain.check_at(1 + k % 2, now),
            );
            assert_eq!(a, b, "{limit:?} at step {k}");
            assert_eq!(
                peeked.check_at(0, now).remaining,
                a.remaining,
                "{limit:?}: a peek sees what the check left"
            );
        }
    }
}

/// A cost larger than the limit can ever hold: `NeverFits`, no retry, nothing recorded.
#[test]
fn never_fits_outcome() {
    for limit in every_algorithm() {
        let clock = ManualClock::new(NOON);
        let l = limiter(vec![limit], &clock);
        let d = l.check_at(4, NOON);
        assert_eq!(d.outcome, Outcome::NeverFits, "{limit:?}");
        assert_eq!(d.retry_after_ns, None);
        assert!(!d.allowed());
        assert_eq!(d.remaining, 3, "{limit:?}: nothing was taken");
        assert!(
            l.check_at(3, NOON).allowed(),
            "{limit:?}: the whole capacity is still there"
        );
        assert_eq!(
            l.check_at(u64::MAX, NOON).outcome,
            Outcome::NeverFits,
            "{limit:?}"
        );
    }
    // Several limits: never fits if one never does, even when another is merely limited.
    let clock = ManualClock::new(NOON);
    let l = limiter(
        vec![
            Limit::fixed_window(10, secs(60)).unwrap(),
            Limit::token_bucket(2, 1, secs(1)).unwrap(),
        ],
        &clock,
    );
    assert_eq!(l.check_at(3, NOON).outcome, Outcome::NeverFits);
    assert!(l.check_at(2, NOON).allowed());
    let d = l.check_at(2, NOON);
    assert_eq!(
        (d.outcome, d.retry_after_ns),
        (Outcome::Limited, Some(2 * S))
    );
    let d = l.check_at(11, NOON);
    assert_eq!((d.outcome, d.retry_after_ns), (Outcome::NeverFits, None));
}

/// Note 001's concurrent-requests limiter: permits held while a request is in flight,
/// released on drop, and freed by their lease if a holder leaks one.
#[test]
fn concurrency_permits() {
    let clock = ManualClock::new(NOON);
    let l = limiter(vec![Limit::concurrency(2, secs(10)).unwrap()], &clock);
    let a = l.acquire(1).unwrap();
    assert_eq!(a.decision().remaining, 1);
    let b = l.acquire(1).unwrap();
    let Err(d) = l.acquire(1) else {
        panic!("a third permit")
    };
    assert_eq!(d.outcome, Outcome::Limited);
    assert_eq!(d.retry_after_ns, Some(10 * S), "a's lease");
    assert_eq!(
        l.acquire(3).err().map(|d| d.outcome),
        Some(Outcome::NeverFits)
    );
    drop(a);
    assert_eq!(l.peek().remaining, 1);
    let c = l.acquire(1).unwrap();

    // Leaked: nobody will release b and c.
    std::mem::forget(b);
    std::mem::forget(c);
    clock.advance(secs(9));
    assert!(l.acquire(1).is_err());
    // Leases expire 10 s after acquisition (stamps are unique: b's is 1 ns later than 10 s,
    // c's 2 ns).
    clock.set(NOON + 10 * S + 2);
    let both = l.acquire(2).unwrap();
    assert_eq!(both.decision().remaining, 0);
    drop(both);

    // A holder whose lease expired and was handed to someone else cannot release it.
    let l = limiter(vec![Limit::concurrency(1, secs(10)).unwrap()], &clock);
    clock.set(NOON);
    let old = l.acquire(1).unwrap();
    clock.set(NOON + 11 * S);
    let new = l.acquire(1).unwrap();
    drop(old);
    assert!(l.acquire(1).is_err(), "the late release freed nothing");
    drop(new);
    assert!(l.acquire(1).is_ok());
}

/// nginx `limit_req zone rate=10r/s burst=5 delay=2` (a leaky bucket as a shaper): of 8
/// back-to-back requests 3 pass at once, 3 wait 100, 200 and 300 ms, 2 are rejected. With
/// `nodelay` (a meter) 6 pass at once.
#[test]
fn leaky_bucket_shaper_delays() {
    let clock = ManualClock::new(NOON);
    let shaper = limiter(
        vec![Limit::leaky_bucket(10, secs(1), 5, Some(2)).unwrap()],
        &clock,
    );
    let out: Vec<Decision> = (0..8).map(|_| shaper.check_at(1, NOON)).collect();
    let delays: Vec<Option<u64>> = out
        .iter()
        .map(|d| d.allowed().then_some(d.delay_ns / MS))
        .collect();
    assert_eq!(
        delays,
        [
            Some(0),
            Some(0),
            Some(0),
            Some(100),
            Some(200),
            Some(300),
            None,
            None
        ]
    );
    assert_eq!(out[6].retry_after_ns, Some(100 * MS));
    assert!(!shaper.check_at(1, NOON + 100 * MS - 1).allowed());
    let d = shaper.check_at(1, NOON + 100 * MS);
    assert!(d.allowed());
    assert_eq!(d.delay_ns, 300 * MS, "still the fourth place in the queue");

    let meter = limiter(
        vec![Limit::leaky_bucket(10, secs(1), 5, None).unwrap()],
        &clock,
    );
    let out: Vec<Decision> = (0..8).map(|_| meter.check_at(1, NOON)).collect();
    assert_eq!(out.iter().filter(|d| d.allowed()).count(), 6);
    assert!(out.iter().all(|d| d.delay_ns == 0));
}
