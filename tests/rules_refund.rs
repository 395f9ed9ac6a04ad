//! `Engine::refund`: a request that was admitted and did not happen gives its cost back to
//! every rule it matches, by mode (hard, soft, elastic, shadow), by algorithm, through
//! overrides and conditions; on a manual clock.

mod common;

use common::{admitted, engine};
use std::time::Duration;
use turnstile::rules::{Priority, Request};
use turnstile::Outcome;

#[test]
fn every_rule_gets_the_cost_back() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "per-customer"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 3, window = "1m" }]

[[rule]]
name = "per-ip"
key = "ip"
cost = 2
limits = [{ algorithm = "token_bucket", limit = 10, window = "1h" }]
"#,
    );
    let a = Request::new().customer(1).ip([10, 0, 0, 1]);
    assert_eq!(admitted(&e, &a, 4), 3);
    // Both rules took the request: 3 of 3 and 6 of 10.
    assert_eq!(e.refund(&a), 2);
    let d = e.check(&a);
    assert!(d.allowed());
    assert_eq!(e.check(&a).outcome, Outcome::Limited);
    // The IP rule got its 2 back: 6 of 10 taken by the 3 requests that stayed admitted, 4
    // left for another customer.
    let b = Request::new().customer(2).ip([10, 0, 0, 1]);
    assert_eq!(admitted(&e, &b, 3), 2);
    // The request's cost times the rule's cost: 6 back to the IP (4 of 10 taken), and the
    // customer's 2 back (a refund never goes past the full limit).
    assert_eq!(e.refund(&b.cost(3)), 2);
    assert_eq!(admitted(&e, &b, 5), 3);
    // No rule applies: nothing given back.
    assert_eq!(e.refund(&Request::new().api_key("k")), 0);
}

#[test]
fn refunds_follow_conditions_and_overrides() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "writes"
key = "customer"
match = { route_prefix = ["/v1/charges"], method = ["POST"] }
limits = [{ algorithm = "sliding_window", limit = 1, window = "1m" }]
[[rule.override]]
key = 42
limits = [{ algorithm = "sliding_log", limit = 2, window = "1m" }]

[[rule]]
name = "tests"
key = "customer"
match = { priority = "test" }
limits = [{ algorithm = "window_ring", limit = 1, window = "1m" }]
"#,
    );
    let w = Request::new()
        .customer(1)
        .route("/v1/charges")
        .method("POST");
    assert_eq!(admitted(&e, &w, 2), 1);
    // Another method or route matches no rule: nothing to give back, still denied.
    assert_eq!(e.refund(&w.method("GET")), 0);
    assert_eq!(e.refund(&w.route("/v1/customers")), 0);
    assert!(!e.check(&w).allowed());
    assert_eq!(e.refund(&w), 1);
    assert!(e.check(&w).allowed());
    // The override's own store (a sliding log: its newest admission comes back).
    let o = w.customer(42);
    assert_eq!(admitted(&e, &o, 3), 2);
    assert_eq!(e.refund(&o), 1);
    assert_eq!(admitted(&e, &o, 3), 1);
    // By priority.
    let t = Request::new().customer(5).priority(Priority::Test);
    assert_eq!(admitted(&e, &t, 2), 1);
    assert_eq!(e.refund(&t.priority(Priority::Get)), 0);
    assert_eq!(e.refund(&t), 1);
    assert_eq!(admitted(&e, &t, 2), 1);
}

#[test]
fn soft_rules_refill_their_band_and_shadow_rules_are_refunded() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "soft"
key = "customer"
mode = "soft"
soft_percent = 50
limits = [{ algorithm = "fixed_window", limit = 4, window = "1m" }]

[[rule]]
name = "trial"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 5, window = "1m" }]
"#,
    );
    let a = Request::new().customer(1);
    // 4 nominal + 2 in the band; the 6th is over the shadow's 5.
    assert_eq!(admitted(&e, &a, 7), 6);
    assert_eq!(e.rule_stats("soft").unwrap().over_nominal, 2);
    assert_eq!(e.rule_stats("trial").unwrap().would_deny, 1);
    assert_eq!(e.refund(&a), 2);
    assert_eq!(e.refund(&a), 2);
    // Two back in the soft store (both band units) and in the shadow's (now 3 of 5).
    assert_eq!(admitted(&e, &a, 3), 2);
    let st = e.rule_stats("soft").unwrap();
    assert_eq!((st.over_nominal, st.denied), (4, 2));
    assert_eq!(e.rule_stats("trial").unwrap().would_deny, 1);
}

#[test]
fn elastic_rules_give_back_to_the_pool_first() {
    let (e, _) = engine(
        r#"
[load]
max_in_flight = 10

[[rule]]
name = "elastic"
key = "customer"
mode = "elastic"
elastic_percent = 50
elastic_below = 0.7
limits = [{ algorithm = "fixed_window", limit = 4, window = "1m" }]
"#,
    );
    let a = Request::new().customer(1);
    e.report_utilization(0.1);
    // 4 of its own and 2 from the pool.
    assert_eq!(admitted(&e, &a, 8), 6);
    assert_eq!(e.refund(&a), 1);
    // Under high load the pool is closed: the refund went to the pool, so nothing is
    // admitted from the rule's own (spent) limits...
    e.report_utilization(0.9);
    assert_eq!(admitted(&e, &a, 2), 0);
    // ...and under low load again the pool has its unit back.
    e.report_utilization(0.1);
    assert_eq!(admitted(&e, &a, 2), 1);
    // With the pool untouched, the refund goes to the rule's own limits.
    let b = Request::new().customer(2);
    assert_eq!(admitted(&e, &b, 4), 4);
    assert_eq!(e.refund(&b), 1);
    e.report_utilization(0.9);
    assert_eq!(admitted(&e, &b, 2), 1);
}

#[test]
fn a_window_gives_back_only_while_it_lasts() {
    let (e, clock) = engine(
        r#"
[[rule]]
name = "fw"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 2, window = "1s" }]
"#,
    );
    let a = Request::new().customer(1);
    assert_eq!(admitted(&e, &a, 2), 2);
    clock.advance(Duration::from_secs(1));
    assert_eq!(admitted(&e, &a, 1), 1);
    // Refunds beyond what the current window holds cap at the full limit.
    for _ in 0..3 {
        assert_eq!(e.refund(&a), 1);
    }
    assert_eq!(admitted(&e, &a, 3), 2);
}
