//! Several limits on one key (`Limits`), decided all-or-nothing, through every record kind:
//! the keyless limiter's 16-byte record (two packed limits), its sequence-word record (three
//! limits, or a variable-size one), and the keyed store's arena record. A denial's
//! `remaining` is the least any limit has left (a request of that cost is admitted at once,
//! one more is not), its `reset_after` counts only what was recorded, and its `retry_after`
//! is the latest over the limits that deny.

use std::sync::Arc;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Decision, Limit, Limiter, Limits, ManualClock, Outcome};

const S: u64 = 1_000_000_000;

/// One way of holding a combined record: check `cost` at `now`, then look at a copy.
trait Holder {
    fn check(&self, cost: u64, now: u64) -> Decision;
}

impl Holder for Limiter<Arc<ManualClock>> {
    fn check(&self, cost: u64, now: u64) -> Decision {
        self.check_at(cost, now)
    }
}

impl Holder for Store<Arc<ManualClock>> {
    fn check(&self, cost: u64, now: u64) -> Decision {
        self.check_at(&7u64, cost, now)
    }
}

/// The same limits held in each record kind: a keyless limiter (two packed limits use the
/// 16-byte record), a keyless limiter with a third limit that never binds (sequence-word
/// record), and a keyed store (arena record).
fn holders(limits: &[Limit]) -> Vec<(&'static str, Box<dyn Holder>)> {
    let clock = Arc::new(ManualClock::new(0));
    let set = Limits::new(limits.to_vec()).unwrap();
    let mut three = limits.to_vec();
    three.push(Limit::fixed_window(1_000_000, Duration::from_secs(1)).unwrap());
    vec![
        (
            "limiter",
            Box::new(Limiter::with_limits(set.clone(), clock.clone())) as Box<dyn Holder>,
        ),
        (
            "limiter, sequence-word record",
            Box::new(Limiter::with_limits(
                Limits::new(three).unwrap(),
                clock.clone(),
            )),
        ),
        (
            "store",
            Box::new(
                Store::builder(set)
                    .capacity(16)
                    .shards(1)
                    .seed(1)
                    .build_with_clock(clock)
                    .unwrap(),
            ),
        ),
    ]
}

/// fixed_window 3 per 10 s and token_bucket of capacity 2 refilled 1 per second.
fn fw3_tb2() -> Vec<Limit> {
    vec![
        Limit::fixed_window(3, Duration::from_secs(10)).unwrap(),
        Limit::token_bucket(2, 1, Duration::from_secs(1)).unwrap(),
    ]
}

#[test]
fn a_denial_reports_the_least_remaining_of_all_limits() {
    // Cost 2 admitted (window 1 left, bucket 0), cost 2 again denied by
    // both. The window's 1 was reported although the bucket holds nothing: a cost-1 request
    // at the same instant is denied.
    for (name, h) in holders(&fw3_tb2()) {
        assert!(h.check(2, 0).allowed(), "{name}");
        let d = h.check(2, 0);
        assert_eq!(d.outcome, Outcome::Limited, "{name}");
        assert_eq!(d.remaining, 0, "{name}: the bucket has nothing left");
        assert!(!h.check(1, 0).allowed(), "{name}");
        // The limit reported is the one whose remainder is reported.
        assert_eq!(d.limit, 2, "{name}");
        // The bucket refills one token per second; the window holds 1 until 10 s: cost 2
        // fits again only at 10 s. Latest of the deniers' waits.
        assert_eq!(d.retry_after_ns, Some(10 * S), "{name}");
        assert!(!h.check(2, 10 * S - 1).allowed(), "{name}");
        assert!(h.check(2, 10 * S).allowed(), "{name}");
    }
}

#[test]
fn a_denial_by_one_limit_reports_no_reset_for_what_was_not_recorded() {
    // A fresh key, cost 3: the window would admit it, the bucket never
    // can. Nothing is recorded, so the key is as fresh as before: reset 0 (it was 10 s, the
    // window's reset as if the request had been counted), remaining 2 (the bucket's).
    for (name, h) in holders(&fw3_tb2()) {
        let d = h.check(3, 0);
        assert_eq!(d.outcome, Outcome::NeverFits, "{name}");
        assert_eq!(d.retry_after_ns, None, "{name}");
        assert_eq!(d.reset_after_ns, 0, "{name}");
        assert_eq!(d.remaining, 2, "{name}");
        // Nothing recorded: the whole window and bucket are still there.
        assert!(h.check(2, 0).allowed(), "{name}");
    }
    // Limited rather than never-fitting: the bucket denies (1 token left), the window would
    // admit. The window's would-be count is not part of the reset; the bucket's is (1 s to
    // refill the token taken at 0) and the window's own (the 1 counted at 0 until 10 s).
    for (name, h) in holders(&fw3_tb2()) {
        assert!(h.check(1, 0).allowed(), "{name}");
        let d = h.check(2, 0);
        assert_eq!(d.outcome, Outcome::Limited, "{name}");
        assert_eq!(d.retry_after_ns, Some(S), "{name}");
        assert_eq!(d.remaining, 1, "{name}");
        assert_eq!(d.reset_after_ns, 10 * S, "{name}");
    }
}

#[test]
fn never_fitting_in_one_limit_records_nothing_in_any() {
    // A count_denied window and a bucket of 2: cost 3 never fits the bucket. A never-fitting
    // request changes no state, so the window does not count it either.
    let limits = vec![
        turnstile::LimitSpec {
            count_denied: true,
            ..turnstile::LimitSpec::new(
                turnstile::Algorithm::FixedWindow,
                3,
                Duration::from_secs(10),
            )
        }
        .build()
        .unwrap(),
        Limit::token_bucket(2, 1, Duration::from_secs(1)).unwrap(),
    ];
    for (name, h) in holders(&limits) {
        let d = h.check(3, 0);
        assert_eq!(d.outcome, Outcome::NeverFits, "{name}");
        assert_eq!(d.reset_after_ns, 0, "{name}");
        assert!(h.check(2, 0).allowed(), "{name}: the window still holds 3");
        assert!(h.check(1, S).allowed(), "{name}");
    }
}

#[test]
fn a_counted_denial_is_in_the_retry() {
    // A count_denied window of 3 per 10 s and a bucket of 2 (1/s). At 0: cost 2 admitted
    // (window 1 left, bucket 0). Cost 1 at 0: the bucket denies (retry 1 s), the window
    // admits it on its own and, counting denials, records it: it is full until 10 s. So the
    // request fits again at 10 s, not at 1 s.
    let limits = vec![
        turnstile::LimitSpec {
            count_denied: true,
            ..turnstile::LimitSpec::new(
                turnstile::Algorithm::FixedWindow,
                3,
                Duration::from_secs(10),
            )
        }
        .build()
        .unwrap(),
        Limit::token_bucket(2, 1, Duration::from_secs(1)).unwrap(),
    ];
    for (name, h) in holders(&limits) {
        assert!(h.check(2, 0).allowed(), "{name}");
        let d = h.check(1, 0);
        assert_eq!(d.outcome, Outcome::Limited, "{name}");
        assert_eq!(d.remaining, 0, "{name}");
        assert_eq!(d.retry_after_ns, Some(10 * S), "{name}");
        assert_eq!(d.reset_after_ns, 10 * S, "{name}");
    }
}
