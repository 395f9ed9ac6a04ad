//! The lease record's rules on a plain array of words (no table, no Redis): rates, when a key
//! is worth a lease, what a bucket's held tokens are worth as its TAT comes nearer.

use super::counters::Counters;
use super::record::{Shape, Spend, Spent};
use super::settle::{Grant, Settle};
use super::LeaseMode;
use turnstile::keyed::RecordOp;
use turnstile::{Decision, Outcome};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

fn shape(bucket_t: Vec<u64>) -> Shape {
    let finals = vec![None; bucket_t.len()];
    Shape {
        mode: LeaseMode::Reserve,
        bucket_t,
        period: 100 * MS,
        horizon: S,
        min_checks: 4,
        stale: 50 * MS,
        longest: S,
        recheck: S,
        finals,
    }
}

fn spend(sh: &Shape, c: &Counters, rec: &mut [u64], now: u64) -> Spent {
    Spend {
        shape: sh,
        counters: c,
        key: b"k",
        cost: 1,
        now,
        count: true,
        claim: true,
    }
    .apply(rec)
}

fn admitted(remaining: u64, reset: u64) -> Decision {
    Decision {
        outcome: Outcome::Allowed,
        limit: 100,
        remaining,
        reset_after_ns: reset,
        retry_after_ns: None,
        delay_ns: 0,
    }
}

#[test]
fn a_key_is_leased_once_its_rate_fills_a_lease() {
    let (sh, c) = (shape(vec![0]), Counters::default());
    let mut rec = vec![0u64; sh.words()];
    let t0 = 1_700_000_000 * S;
    // Three checks: not yet seen for four requests.
    for i in 0..3 {
        assert!(matches!(
            spend(&sh, &c, &mut rec, t0 + i * MS),
            Spent::Check
        ));
    }
    // The fourth, 10 ms after the first: 4 in 10 ms is 400/s (a new key's rate is over the
    // time since its first check), 400 in a lease of 1 s.
    match spend(&sh, &c, &mut rec, t0 + 10 * MS) {
        Spent::Fetch { rate, .. } => {
            assert_eq!(rate, 400_000, "cost units per 10^12 ns: 400 per second")
        }
        s => panic!("{s:?}"),
    }
    // Another caller meanwhile waits for that fetch; after its flag goes stale, fetches.
    assert!(matches!(
        spend(&sh, &c, &mut rec, t0 + 11 * MS),
        Spent::Wait
    ));
    assert!(matches!(
        spend(&sh, &c, &mut rec, t0 + 70 * MS),
        Spent::Fetch { .. }
    ));
}

#[test]
fn rates_carry_over_one_period_and_forget_older_ones() {
    let (sh, c) = (shape(vec![0]), Counters::default());
    let mut rec = vec![0u64; sh.words()];
    let t0 = 1_700_000_000 * S - 1_700_000_000 * S % (100 * MS);
    for i in 0..10 {
        let _ = spend(&sh, &c, &mut rec, t0 + i * MS);
    }
    // Half way through the next period, half of the previous one still counts: 5 + 1.
    match spend(&sh, &c, &mut rec, t0 + 150 * MS) {
        Spent::Fetch { rate, .. } => assert_eq!(rate, 60_000),
        s => panic!("{s:?}"),
    }
    let _ = Settle {
        shape: &sh,
        counters: &c,
        grant: &Grant {
            granted: 0,
            last: false,
            epoch: 0,
            ends: vec![S],
            decision: admitted(0, S),
        },
        cost: 1,
        pending_sent: 0,
        sent: t0,
        now: t0,
        list: None,
    }
    .apply(&mut rec[..]);
    // Two periods later nothing is left of them: one request is not worth a lease.
    assert!(matches!(
        spend(&sh, &c, &mut rec, t0 + 350 * MS),
        Spent::Check
    ));
}

#[test]
fn a_buckets_held_tokens_lapse_as_its_tat_comes_near() {
    // A bucket of T = 10 ms: 10 tokens granted beyond the request, the TAT 100 ms ahead.
    let t = 10 * MS;
    let (sh, c) = (shape(vec![t]), Counters::default());
    let mut rec = vec![0u64; sh.words()];
    let t0 = 1_700_000_000 * S;
    let grant = Grant {
        granted: 11,
        last: false,
        epoch: t0,
        ends: vec![100 * MS + 300_000],
        decision: admitted(0, 100 * MS),
    };
    let d = Settle {
        shape: &sh,
        counters: &c,
        grant: &grant,
        cost: 1,
        pending_sent: 0,
        sent: t0,
        now: t0,
        list: None,
    }
    .apply(&mut rec[..]);
    assert!(d.allowed());
    // At +50 ms the TAT covers 5 tokens only: one is spent, the other five lapsed for good.
    match spend(&sh, &c, &mut rec, t0 + 50 * MS) {
        Spent::Local(d) => assert!(d.allowed()),
        s => panic!("{s:?}"),
    }
    assert_eq!(c.snapshot(0).stranded, 5);
    // 4 left, and the cover keeps shrinking: at +80 ms, 2 are worth anything.
    for i in 0..2 {
        assert!(
            matches!(spend(&sh, &c, &mut rec, t0 + 80 * MS), Spent::Local(_)),
            "{i}"
        );
    }
    // Then none: Redis had nothing left after the grant, so the node denies until the
    // lease's end without asking.
    match spend(&sh, &c, &mut rec, t0 + 80 * MS) {
        Spent::Local(d) => assert!(!d.allowed(), "{d:?}"),
        s => panic!("{s:?}"),
    }
}

/// Settles `grant` for a request of cost 1 sent and answered at `t`.
fn settle(sh: &Shape, c: &Counters, rec: &mut [u64], grant: &Grant, t: u64) -> Decision {
    Settle {
        shape: sh,
        counters: c,
        grant,
        cost: 1,
        pending_sent: 0,
        sent: t,
        now: t,
        list: None,
    }
    .apply(rec)
}

#[test]
fn a_fixed_window_redis_found_spent_is_spent_here_until_its_end() {
    // A fixed window of 1 s, its final share 50 ms: a lease ends 50 ms before the window.
    let mut sh = shape(vec![0]);
    sh.finals = vec![Some(50 * MS)];
    let c = Counters::default();
    let t0 = 1_700_000_000 * S;
    // A grant of all that was left, 600 ms before the window's end: once spent, the node
    // denies until the window's end (not its lease's), without asking.
    let mut rec = vec![0u64; sh.words()];
    let grant = Grant {
        granted: 3,
        last: false,
        epoch: t0,
        ends: vec![550 * MS],
        decision: admitted(0, 600 * MS),
    };
    assert!(settle(&sh, &c, &mut rec, &grant, t0).allowed());
    for _ in 0..2 {
        assert!(matches!(spend(&sh, &c, &mut rec, t0 + MS), Spent::Local(d) if d.allowed()));
    }
    match spend(&sh, &c, &mut rec, t0 + 560 * MS) {
        Spent::Local(d) => assert!(!d.allowed() && d.retry_after_ns == Some(40 * MS), "{d:?}"),
        s => panic!("{s:?}"),
    }
    // A denial that found the window spent holds until its retry (the window's end)...
    let denied = |remaining, retry| Grant {
        granted: 0,
        last: false,
        epoch: t0,
        ends: vec![550 * MS],
        decision: Decision {
            outcome: Outcome::Limited,
            limit: 100,
            remaining,
            reset_after_ns: 600 * MS,
            retry_after_ns: Some(retry),
            delay_ns: 0,
        },
    };
    let mut rec = vec![0u64; sh.words()];
    let _ = settle(&sh, &c, &mut rec, &denied(0, 600 * MS), t0);
    match spend(&sh, &c, &mut rec, t0 + 560 * MS) {
        Spent::Local(d) => assert!(!d.allowed(), "{d:?}"),
        s => panic!("{s:?}"),
    }
    // ... and one that found some left (less than the request) looks again at the lease's end,
    // where other nodes give back what they hold.
    let mut rec = vec![0u64; sh.words()];
    let _ = settle(&sh, &c, &mut rec, &denied(1, 600 * MS), t0);
    assert!(!matches!(
        spend(&sh, &c, &mut rec, t0 + 560 * MS),
        Spent::Local(_)
    ));
}
