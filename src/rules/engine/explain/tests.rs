//! The explanation against the check it explains: same verdict on the same state, nothing
//! consumed.

use super::{LimitsFrom, RuleMode, RuleStep};
use crate::clock::ManualClock;
use crate::rules::{Engine, Request, Rules};
use proptest::prelude::*;

const RULES: &str = r#"
[[rule]]
name = "two-limits"
key = "customer"
limits = [
  { algorithm = "fixed_window", limit = 5, window = "1s" },
  { algorithm = "sliding_window", limit = 8, window = "10s" },
]
[[rule.override]]
key = "2"
limits = [{ algorithm = "fixed_window", limit = 2, window = "1s" }]

[[rule]]
name = "soft"
key = "customer"
mode = "soft"
soft_percent = 50
limits = [{ algorithm = "token_bucket", limit = 6, window = "1s", burst = 6 }]

[[rule]]
name = "routes"
key = "customer+route"
match = { route_prefix = ["/v1/"] }
limits = [{ algorithm = "sliding_log", limit = 4, window = "2s" }]

[[rule]]
name = "elastic"
key = "customer"
mode = "elastic"
elastic_percent = 50
elastic_below = 1.0
limits = [{ algorithm = "fixed_window", limit = 7, window = "1s" }]

[[rule]]
name = "watch"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 3, window = "1s" }]
"#;

fn engine() -> Engine<ManualClock> {
    let rules = Rules::parse(RULES, "t.toml").unwrap();
    Engine::builder(rules)
        .seed(7)
        .build_with_clock(ManualClock::new(0))
        .unwrap()
}

fn stats(e: &Engine<ManualClock>) -> Vec<crate::rules::RuleStats> {
    ["two-limits", "soft", "routes", "elastic", "watch"]
        .iter()
        .map(|n| e.rule_stats(n).unwrap())
        .collect()
}

#[test]
fn a_fresh_key_is_explained_rule_by_rule() {
    let e = engine();
    let req = Request::new().customer(1).route("/v1/x").cost(2);
    let x = e.explanation_at(&req, 1_000);
    let names: Vec<&str> = x.rules.iter().map(|r| &*r.rule).collect();
    assert_eq!(names, ["two-limits", "soft", "routes", "elastic", "watch"]);
    let modes: Vec<RuleMode> = x.rules.iter().map(|r| r.mode).collect();
    use RuleMode::*;
    assert_eq!(modes, [Hard, Soft, Hard, Elastic, Shadow]);
    let r = &x.rules[0];
    assert_eq!((r.key, r.cost, r.limits_from), (1, 2, LimitsFrom::Rule));
    assert_eq!(r.limits.len(), 2);
    assert_eq!(
        (r.limits[0].limit, r.limits[0].used, r.limits[0].remaining),
        (5, 0, 5)
    );
    assert_eq!(r.limits[0].remaining_after, 3);
    // The soft rule is reported against its nominal limit.
    assert_eq!(x.rules[1].limits[0].limit, 6);
    assert_eq!(x.rules[4].step, RuleStep::WouldAdmit);
    assert!(x.verdict.decision.allowed());
    assert_eq!(x.verdict.decision.remaining, 2);
    // The tightest limit: the sliding log's 4 − 2.
    let d = x.decided_by.unwrap();
    assert_eq!((&*x.rules[d.rule].rule, d.limit), ("routes", Some(0)));
    // An override's limits.
    let o = e.explanation_at(&Request::new().customer(2), 1_000);
    assert_eq!(o.rules[0].limits_from, LimitsFrom::Override);
    assert_eq!(o.rules[0].limits[0].limit, 2);
}

#[test]
fn a_denial_names_its_rule_and_limit_and_the_shadow_rule_is_not_reached() {
    let e = engine();
    let req = Request::new().customer(2);
    assert!(e.check_at(&req, 10).allowed());
    assert!(e.check_at(&req, 10).allowed());
    let x = e.explanation_at(&req, 10);
    assert!(!x.verdict.decision.allowed());
    assert_eq!(x.verdict.rule.as_deref(), Some("two-limits"));
    let d = x.decided_by.unwrap();
    assert_eq!((d.rule, d.limit), (0, Some(0)));
    assert_eq!(x.rules[0].limits[0].used, 2);
    assert_eq!(x.rules[0].step, RuleStep::Denies);
    assert!(x.rules[1..].iter().all(|r| r.step == RuleStep::NotReached));
    assert_eq!(x.verdict, e.explain_at(&req, 10));
}

#[test]
fn a_shadow_rule_that_would_deny_is_counted_in_the_verdict_only() {
    let e = engine();
    let req = Request::new().customer(9);
    for _ in 0..3 {
        e.check_at(&req, 5);
    }
    let before = stats(&e);
    let x = e.explanation_at(&req, 5);
    let watch = x.rules.iter().find(|r| &*r.rule == "watch").unwrap();
    assert_eq!(watch.step, RuleStep::WouldDeny);
    assert_eq!(x.verdict.would_deny, 1);
    assert!(x.verdict.decision.allowed());
    assert_eq!(stats(&e), before, "an explanation counts nothing");
}

/// A step of the property: a request and a time step.
fn step() -> impl Strategy<Value = (u64, u64, bool, u64)> {
    (0u64..4, 0u64..4, any::<bool>(), 0u64..400_000_000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// On any state, the explanation's verdict is the check's, repeating it changes nothing,
    /// and the deciding rule is the denying one.
    #[test]
    fn explanation_agrees_with_the_check(steps in proptest::collection::vec(step(), 1..120)) {
        let e = engine();
        let mut now = 1_000;
        for (customer, cost, routed, dt) in steps {
            now += dt;
            let mut req = Request::new().customer(customer).cost(cost);
            if routed {
                req = req.route("/v1/r");
            }
            let before = stats(&e);
            let x = e.explanation_at(&req, now);
            prop_assert_eq!(&e.explanation_at(&req, now), &x, "an explanation consumes nothing");
            prop_assert_eq!(stats(&e), before);
            let v = e.explain_at(&req, now);
            prop_assert_eq!(&x.verdict, &v);
            // Each rule's limits say what its step says: all admit, or one does not.
            for r in &x.rules {
                let all = r.limits.iter().all(|l| l.admits);
                match r.step {
                    RuleStep::Admits | RuleStep::WouldAdmit => prop_assert!(all, "{:?}", r),
                    RuleStep::Denies | RuleStep::WouldDeny | RuleStep::AdmitsFromPool => {
                        prop_assert!(!all, "{:?}", r)
                    }
                    RuleStep::NotReached => {}
                }
            }
            match (&v.rule, x.decider()) {
                (Some(r), Some(d)) => {
                    prop_assert_eq!(r, &d.rule);
                    prop_assert_eq!(d.step, RuleStep::Denies);
                    let l = x.decided_by.unwrap().limit.unwrap();
                    prop_assert!(!d.limits[l].admits);
                }
                (Some(_), None) => prop_assert!(false, "a denial without its decider"),
                (None, Some(d)) => {
                    prop_assert!(matches!(d.step, RuleStep::Admits | RuleStep::AdmitsFromPool));
                    prop_assert_eq!(d.decision.remaining, v.decision.remaining);
                }
                (None, None) => prop_assert_eq!(v.decision.remaining, u64::MAX),
            }
        }
    }
}
