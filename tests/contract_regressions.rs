//! One regression test per defect of a single limit's `Decision` that the contract test
//! (`tests/contract.rs`) was written to catch: each failed before its fix.

use std::time::Duration;
use turnstile::algo::{sliding_window, window_ring};
use turnstile::{Algorithm, Decision, Limit, LimitSpec, Limits, Outcome};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const DAY: u64 = 86_400 * S;

/// One limit over its own record.
struct One {
    limits: Limits,
    rec: Vec<u64>,
}

impl One {
    fn new(l: Limit) -> Self {
        let limits = Limits::new(vec![l]).unwrap();
        let rec = vec![0; limits.words()];
        Self { limits, rec }
    }
    fn check(&mut self, now: u64, cost: u64) -> Decision {
        self.limits.decide(&mut self.rec[..], now, cost)
    }
    fn peek(&self, now: u64, cost: u64) -> Decision {
        let mut rec = self.rec.clone();
        self.limits.decide(&mut rec[..], now, cost)
    }
}

fn spec(algorithm: Algorithm, limit: u64, window: u64) -> LimitSpec {
    LimitSpec::new(algorithm, limit, Duration::from_nanos(window))
}

/// Defect 1: a client that stopped at its limit and came back after a long absence was
/// denied, for up to 2^22 windows (48 days of 1 s windows), because a far-behind window index
/// read as time going backwards. Far behind now means expired, in every packed window index.
#[test]
fn defect_1_a_long_absence_never_locks_out() {
    let cases = [
        (Algorithm::SlidingWindow, 15, S, 49 * DAY),
        (Algorithm::SlidingWindow, 15, S, 60 * DAY),
        (Algorithm::SlidingWindow, 15, 100 * MS, 5 * DAY),
        (Algorithm::FixedWindow, 15, MS, 9 * 365 * DAY),
        (Algorithm::WindowRing, 15, 60 * MS, 5 * 365 * DAY),
    ];
    for (algorithm, limit, window, idle) in cases {
        let mut one = One::new(spec(algorithm, limit, window).build().unwrap());
        let t0 = 1000 * S;
        for _ in 0..limit {
            assert!(one.check(t0, 1).allowed());
        }
        let d = one.check(t0 + idle, limit);
        assert!(d.allowed(), "{algorithm} idle {idle} ns: {d:?}");
    }
}

/// Defect 2: `count_denied` counted a never-fitting cost in fixed_window and sliding_window
/// but not in sliding_log and window_ring. The rule everywhere: a request that never fits is
/// not counted (it changes no state).
#[test]
fn defect_2_a_never_fitting_cost_is_never_counted() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::WindowRing,
    ] {
        let mut s = spec(algorithm, 3, 10 * S);
        s.count_denied = true;
        if algorithm == Algorithm::WindowRing {
            s.buckets = Some(10);
        }
        let mut one = One::new(s.build().unwrap());
        let d = one.check(0, 4);
        assert_eq!(d.outcome, Outcome::NeverFits, "{algorithm}");
        assert!(
            one.rec.iter().all(|&w| w == 0),
            "{algorithm}: state changed"
        );
        assert!(one.check(0, 1).allowed(), "{algorithm}");
    }
}

/// Defect 5: sliding_window with time going backwards across a window edge counted retry and
/// reset from the stored window's start as if it were `now`: too early.
#[test]
fn defect_5_sliding_window_backwards_across_an_edge() {
    let mut one = One::new(Limit::sliding_window(1, Duration::from_secs(10)).unwrap());
    assert!(one.check(12 * S, 1).allowed());
    assert!(one.check(21 * S, 1).allowed());
    let d = one.check(19 * S, 1);
    assert_eq!(d.retry_after_ns, Some(11 * S + 1), "{d:?}");
    assert_eq!(d.reset_after_ns, 21 * S, "{d:?}");
    assert!(!one.peek(19 * S + 11 * S, 1).allowed());
    assert!(one.peek(19 * S + 11 * S + 1, 1).allowed());
}

/// Defect 6a: window_ring with `count_denied` returned the reset from before the denial was
/// counted.
#[test]
fn defect_6_window_ring_counted_denial_resets_after_itself() {
    let mut s = spec(Algorithm::WindowRing, 1, 10 * S);
    s.buckets = Some(10);
    s.count_denied = true;
    let mut one = One::new(s.build().unwrap());
    assert!(one.check(S / 2, 1).allowed());
    let d = one.check(5 * S + S / 2, 1);
    assert!(!d.allowed());
    assert_eq!(d.reset_after_ns, 10 * S + S / 2, "{d:?}");
    assert_eq!(one.peek(5 * S + S / 2, 0).reset_after_ns, d.reset_after_ns);
}

/// Defect 6b: window_ring counters with `count_denied` capped at 2^bitlen(limit) − 1, so
/// extra denials were dropped and the ring reopened early. Limit 2 per 2 s in two 1 s
/// sub-windows: 2 admitted and 5 denials counted at 0.5 s make 7 in sub-window 0, which, as it
/// straddles the window's start in [2 s, 3 s), counts round(7 · r / s) for the r ns of it
/// still inside: a cost of 1 fits once r ≤ ⌈3 s / 14⌉ − 1 (a 2-bit counter of 3: r < s / 2).
#[test]
fn defect_6_window_ring_counts_every_denial() {
    let mut s = spec(Algorithm::WindowRing, 2, 2 * S);
    s.buckets = Some(2);
    s.count_denied = true;
    let l = s.build().unwrap();
    let Limit::WindowRing(p) = l else {
        unreachable!()
    };
    assert!(p.max_count() >= 7);
    let mut one = One::new(l);
    assert!(one.check(S / 2, 2).allowed());
    let mut last = None;
    for _ in 0..5 {
        let d = one.check(S / 2, 1);
        assert!(!d.allowed());
        last = d.retry_after_ns;
    }
    let r_max = (3 * S).div_ceil(14) - 1;
    let opens = 3 * S - r_max;
    // The last denial's retry waits for all 7.
    assert_eq!(last, Some(opens - S / 2));
    assert!(!one.peek(2 * S + S / 2, 1).allowed(), "reopened early");
    assert!(!one.peek(opens - 1, 1).allowed());
    assert!(one.peek(opens, 1).allowed());
}

/// Found by the contract test: a window_ring's index aliased (a clock far ahead, then back)
/// named other slots than the ones written, so its retry disagreed with its own later answers.
/// Indexes are now kept mod a multiple of N + 1.
#[test]
fn window_ring_aliased_index_reads_as_its_own_slots() {
    let l = Limit::window_ring(2, Duration::from_nanos(2000), 2).unwrap();
    let mut one = One::new(l);
    let t1 = 9_347_341_972_886_518_000;
    assert!(one.check(t1, 1).allowed());
    let now = 1 << 63;
    let d = one.check(now, 2);
    if let Some(r) = d.retry_after_ns {
        assert!(!one.peek(now + r - 1, 2).allowed(), "{d:?}");
        assert!(one.peek(now + r, 2).allowed(), "{d:?}");
    }
    let Limit::WindowRing(p) = l else {
        unreachable!()
    };
    assert_eq!(p.period() % 3, 0);
    assert!(p.period() > (1 << window_ring::INDEX_BITS) - 3);
}

/// Defect 7: the edges of time and size.
#[test]
fn defect_7_edges_of_time_and_size() {
    // sliding_window windows must leave room for two of them on the clock.
    assert!(spec(Algorithm::SlidingWindow, 1, 1 << 63).build().is_err());
    assert!(
        spec(Algorithm::SlidingWindow, 1, sliding_window::MAX_WINDOW)
            .build()
            .is_ok()
    );
    let mut one = One::new(
        spec(Algorithm::SlidingWindow, 1, sliding_window::MAX_WINDOW)
            .build()
            .unwrap(),
    );
    let d = one.check(sliding_window::MAX_WINDOW + 5, 1);
    assert!(d.allowed());
    assert!(d.reset_after_ns > 0, "a held count resets later, not now");

    // At the end of the clock nothing admits without limit, and no retry lies past it.
    let top = u64::MAX;
    for l in [
        Limit::fixed_window(1, Duration::from_secs(1)).unwrap(),
        Limit::sliding_log(1, Duration::from_secs(1)).unwrap(),
        Limit::concurrency(1, Duration::from_secs(1)).unwrap(),
        Limit::sliding_window(1, Duration::from_secs(1)).unwrap(),
        Limit::window_ring(1, Duration::from_secs(1), 10).unwrap(),
    ] {
        let mut one = One::new(l);
        assert!(one.check(top - 5, 1).allowed(), "{l:?}");
        let d = one.check(top, 1);
        assert_eq!(d.outcome, Outcome::NeverFits, "{l:?}: {d:?}");
        assert_eq!(d.retry_after_ns, None);
    }

    // Buckets past their TAT's range (2^63 ns): NeverFits with nothing remaining, not a
    // retry of 1 ns forever.
    for l in [
        Limit::token_bucket(3, 1, Duration::from_secs(1)).unwrap(),
        Limit::leaky_bucket(1, Duration::from_secs(1), 2, None).unwrap(),
    ] {
        let mut one = One::new(l);
        let d = one.check((1 << 63) + 7, 1);
        assert_eq!(d.outcome, Outcome::NeverFits, "{l:?}: {d:?}");
        assert_eq!(d.remaining, 0);
    }
}
