//! Settling a cost known only after the work (`Store::settle`, `Engine::settle`): against a
//! naive model of the rules (never more admitted than the limits allow over the settled
//! costs), a settle of the same amount changes no record, a charge past the limit is a debt
//! the next checks wait out, a give-back reaches an elastic pool first; on a manual clock.

mod common;

use common::{engine, E, MS, S};
use proptest::prelude::*;
use std::collections::HashMap;
use turnstile::keyed::Store;
use turnstile::rules::Request;
use turnstile::{Limit, ManualClock};

/// Two rules over fixed windows: per customer, and per route (cost 2 there).
const TWO: &str = r#"
[[rule]]
name = "per-customer"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 20, window = "1s" }]

[[rule]]
name = "per-route"
key = "route"
cost = 2
limits = [{ algorithm = "fixed_window", limit = 50, window = "1s" }]
"#;

/// The rules above, naively: a count per (key, window); a request is admitted if each rule
/// has room for its cost (all or nothing), then each count moves by the settled difference
/// (a give-back never below 0 and only to the current window; a charge up to 2^24 − 1).
#[derive(Default)]
struct Model {
    counts: HashMap<(u8, u64, u64), u64>,
}

impl Model {
    fn rules(cust: u64, route: u64) -> [(u8, u64, u64, u64); 2] {
        // (rule, key, limit, cost multiplier)
        [(0, cust, 20, 1), (1, route, 50, 2)]
    }
    fn check(&mut self, now: u64, cust: u64, route: u64, cost: u64) -> bool {
        let w = now / S;
        let rules = Self::rules(cust, route);
        let fits = rules
            .iter()
            .all(|&(r, k, l, m)| self.counts.get(&(r, k, w)).copied().unwrap_or(0) + cost * m <= l);
        if fits {
            for (r, k, _, m) in rules {
                *self.counts.entry((r, k, w)).or_default() += cost * m;
            }
        }
        fits
    }
    fn settle(&mut self, now: u64, cust: u64, route: u64, reserved: u64, actual: u64) {
        let w = now / S;
        for (r, k, _, m) in Self::rules(cust, route) {
            let c = self.counts.entry((r, k, w)).or_default();
            *c = if actual >= reserved {
                (*c + (actual - reserved) * m).min((1 << 24) - 1)
            } else {
                c.saturating_sub((reserved - actual) * m)
            };
        }
    }
}

#[derive(Clone, Debug)]
struct Step {
    dt: u64,
    cust: u64,
    route: u64,
    reserved: u64,
    actual: u64,
    settle_later: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0u64..400,
        0u64..3,
        0u64..2,
        1u64..6,
        0u64..12,
        any::<bool>(),
    )
        .prop_map(|(dt, cust, route, reserved, actual, settle_later)| Step {
            dt: dt * MS,
            cust,
            route,
            reserved,
            actual,
            settle_later,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every decision as the model's: admitted only while each rule's settled costs leave room.
    #[test]
    fn settles_agree_with_the_model(steps in proptest::collection::vec(step(), 1..120)) {
        let (e, clock) = engine(TWO);
        let mut m = Model::default();
        let mut now = 1000 * S;
        // A request admitted and not settled yet (settled at the next step's time).
        let mut pending: Option<(u64, u64, u64, u64)> = None;
        let routes = ["/a", "/b"];
        for (i, s) in steps.iter().enumerate() {
            now += s.dt;
            clock.set(now);
            if let Some((c, r, res, act)) = pending.take() {
                let req = Request::new().customer(c).route(routes[r as usize]).cost(res);
                prop_assert_eq!(e.settle(&req, act), 2);
                m.settle(now, c, r, res, act);
            }
            let req = Request::new().customer(s.cust).route(routes[s.route as usize]).cost(s.reserved);
            let got = e.check(&req).allowed();
            let want = m.check(now, s.cust, s.route, s.reserved);
            prop_assert_eq!(got, want, "step {}: {:?}", i, s);
            if got {
                if s.settle_later {
                    pending = Some((s.cust, s.route, s.reserved, s.actual));
                } else {
                    prop_assert_eq!(e.settle(&req, s.actual), 2);
                    m.settle(now, s.cust, s.route, s.reserved, s.actual);
                }
            }
        }
    }

    /// A settle of the same amount changes no record of any store.
    #[test]
    fn the_same_amount_is_a_no_op(steps in proptest::collection::vec(step(), 1..60), x in 0u64..8) {
        let (e, clock) = engine(TWO);
        let mut now = 1000 * S;
        for s in &steps {
            now += s.dt;
            clock.set(now);
            let req = Request::new().customer(s.cust).route("/a").cost(s.reserved);
            if e.check(&req).allowed() {
                e.settle(&req, s.actual);
            }
        }
        let records = |e: &E| {
            let mut v = Vec::new();
            e.for_each_store(|name, st| st.export_records(|id, w| v.push((name.to_string(), id, w.to_vec()))));
            v.sort();
            v
        };
        let before = records(&e);
        for c in 0..3 {
            let req = Request::new().customer(c).route("/a").cost(x);
            e.settle(&req, x);
        }
        prop_assert_eq!(before, records(&e));
    }
}

/// A charge past a token bucket's depth is a debt: denied until it is refilled, exactly.
#[test]
fn a_charge_past_the_limit_is_waited_out() {
    let (e, clock) = engine(
        r#"
[[rule]]
name = "tokens"
key = "customer"
limits = [{ algorithm = "token_bucket", limit = 10, window = "1s", burst = 10 }]
"#,
    );
    let req = Request::new().customer(1);
    assert!(e.check(&req).allowed());
    // Reserved 1, cost 50: the bucket (10, 9 left) owes 40.
    assert_eq!(e.settle(&req, 50), 1);
    let d = e.check(&req);
    assert!(!d.allowed());
    // 41 tokens to refill at 10 a second before one fits: 4.1 s.
    assert_eq!(d.retry_after_ns, Some(4_100 * MS));
    clock.advance(std::time::Duration::from_millis(4_099));
    assert!(!e.check(&req).allowed());
    clock.advance(std::time::Duration::from_millis(1));
    assert!(e.check(&req).allowed());
}

/// A give-back reaches an elastic rule's extra pool first (its charges are the newest); a
/// charge goes to the rule's own limits.
#[test]
fn elastic_pool_first_on_a_give_back() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "el"
key = "customer"
mode = "elastic"
elastic_percent = 50
elastic_below = 1.0
limits = [{ algorithm = "fixed_window", limit = 4, window = "1m" }]
"#,
    );
    let req = Request::new().customer(9).cost(2);
    // 4 from the limits, 2 from the pool of 2.
    assert!(e.check(&req).allowed());
    assert!(e.check(&req).allowed());
    assert!(e.check(&req).allowed());
    assert!(!e.check(&Request::new().customer(9)).allowed());
    // Actual 0 for the last request: the pool gets its 2 back, so 2 more fit (from the pool).
    e.settle(&req, 0);
    assert!(e.check(&Request::new().customer(9)).allowed());
    assert!(e.check(&Request::new().customer(9)).allowed());
    assert!(!e.check(&Request::new().customer(9)).allowed());
    assert_eq!(e.rule_stats("el").unwrap().elastic, 3);
}

/// The store's settle: all of its limits in one step; absent keys; the same amount.
#[test]
fn store_settle_over_every_limit() {
    use std::time::Duration;
    let limits = turnstile::Limits::new(vec![
        Limit::fixed_window(10, Duration::from_secs(1)).unwrap(),
        Limit::sliding_log(5, Duration::from_secs(10)).unwrap(),
    ])
    .unwrap();
    let clock = ManualClock::new(100 * S);
    let store = Store::builder(limits)
        .capacity(1000)
        .build_with_clock(clock)
        .unwrap();
    // Nothing to give back to an absent key; a charge creates its record.
    assert!(!store.settle(&1u64, 3, 1));
    assert!(store.settle(&1u64, 3, 3));
    assert!(store.settle(&2u64, 0, 2));
    assert_eq!(store.peek(&2u64).remaining, 3);
    // Reserved 2, actual 5: the log (5 in 10 s) is full, the window has 5 of 10 left.
    assert!(store.check(&3u64, 2).allowed());
    assert!(store.settle(&3u64, 2, 5));
    assert!(!store.check(&3u64, 1).allowed());
    // Actual 1 after all: 4 back to both limits at once.
    assert!(store.settle(&3u64, 5, 1));
    assert_eq!(store.peek(&3u64).remaining, 4);
    assert!(store.check(&3u64, 4).allowed());
    assert!(!store.check(&3u64, 1).allowed());
}

/// A shadow rule is settled too: it keeps counting what an enforcing rule in its place would.
#[test]
fn shadow_rules_are_settled_too() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "s"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 10, window = "1m" }]
"#,
    );
    let req = Request::new().customer(5).cost(2);
    assert!(e.check(&req).allowed());
    // Actual 10: the shadow window is full, so the next request would be denied.
    assert_eq!(e.settle(&req, 10), 1);
    assert!(e.check(&Request::new().customer(5)).allowed());
    assert_eq!(e.rule_stats("s").unwrap().would_deny, 1);
    // Actual 0 after all: 10 back, and it would admit again.
    let ten = Request::new().customer(5).cost(10);
    e.settle(&ten, 0);
    assert!(e.check(&Request::new().customer(5)).allowed());
    assert_eq!(e.rule_stats("s").unwrap().would_deny, 1);
}
