//! The rules engine: each mode and each shedding rule under a manual clock, all-or-nothing
//! across rules, overrides and key classes, reload (also under concurrent checks), the error
//! positions of bad files, the example file, the CLI, and no allocation per check.

mod common;

use common::{admitted, engine, E, S};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use turnstile::rules::{
    Engine, KeyClass, KeyPart, LoadSettings, Mode, Priority, Request, Rule, Rules, Shedding,
    UNLIMITED,
};
use turnstile::{Algorithm, LimitSpec, ManualClock, Outcome};

// ---- a counting allocator: proves a check allocates nothing -------------------------------

struct Counting;
thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
}
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to `System` unchanged; it only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if TRACK.with(|t| t.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if TRACK.with(|t| t.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for `dealloc`.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---- helpers ------------------------------------------------------------------------------

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn fw(limit: u64, window: Duration) -> LimitSpec {
    LimitSpec::new(Algorithm::FixedWindow, limit, window)
}

// ---- modes --------------------------------------------------------------------------------

#[test]
fn hard_mode_denies_at_the_limit() {
    let (e, clock) = engine(
        r#"
[[rule]]
name = "per-customer"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 3, window = "1s" }]
"#,
    );
    let a = Request::new().customer(1);
    assert_eq!(admitted(&e, &a, 3), 3);
    let d = e.check(&a);
    assert_eq!(d.outcome, Outcome::Limited);
    assert_eq!(d.limit, 3);
    assert!(d.retry_after().unwrap() <= Duration::from_secs(1));
    assert_eq!(admitted(&e, &Request::new().customer(2), 5), 3);
    clock.advance(Duration::from_secs(1));
    assert!(e.check(&a).allowed());
    assert_eq!(e.rule_stats("per-customer").unwrap().denied, 3);
}

#[test]
fn soft_mode_admits_ten_percent_over_and_reports_the_nominal_limit() {
    // The notes: 500 requests per hour + 10 % = 550.
    let (e, _) = engine(
        r#"
[[rule]]
name = "hourly"
key = "customer"
mode = "soft"
soft_percent = 10
limits = [{ algorithm = "fixed_window", limit = 500, window = "1h" }]
"#,
    );
    let a = Request::new().customer(241_531);
    let first = e.check(&a);
    assert_eq!((first.limit, first.remaining), (500, 499));
    assert_eq!(admitted(&e, &a, 498), 498);
    let at_limit = e.check(&a);
    assert!(at_limit.allowed());
    assert_eq!((at_limit.limit, at_limit.remaining), (500, 0));
    // 50 more in the tolerance band, reported as 0 remaining of 500.
    for _ in 0..50 {
        let d = e.check(&a);
        assert!(d.allowed());
        assert_eq!((d.limit, d.remaining), (500, 0));
    }
    let d = e.check(&a);
    assert_eq!(d.outcome, Outcome::Limited);
    assert_eq!(d.limit, 500);
    let st = e.rule_stats("hourly").unwrap();
    assert_eq!((st.over_nominal, st.denied), (50, 1));
}

#[test]
fn elastic_mode_draws_the_extra_pool_only_under_low_load() {
    let (e, clock) = engine(
        r#"
[load]
max_in_flight = 10

[[rule]]
name = "elastic"
key = "customer"
mode = "elastic"
elastic_percent = 50
elastic_below = 0.7
limits = [{ algorithm = "fixed_window", limit = 10, window = "1s" }]
"#,
    );
    let a = Request::new().customer(1);
    // Reported utilization low: 10 + 5 extra.
    e.report_utilization(0.2);
    assert_eq!(admitted(&e, &a, 20), 15);
    assert_eq!(e.rule_stats("elastic").unwrap().elastic, 5);
    // Reported utilization high: the nominal 10 only.
    clock.advance(Duration::from_secs(1));
    e.report_utilization(0.9);
    assert_eq!(admitted(&e, &a, 20), 10);
    // In flight measured by the engine: 7 of 10 in flight is a load of 0.7 → no extra.
    clock.advance(Duration::from_secs(1));
    e.report_utilization(0.0);
    let guards: Vec<_> = (0..7).map(|_| e.enter()).collect();
    assert_eq!(e.in_flight(), 7);
    assert_eq!(admitted(&e, &a, 20), 10);
    drop(guards);
    assert_eq!(e.in_flight(), 0);
    // Load gone: the pool is available again within the same window.
    assert_eq!(admitted(&e, &a, 20), 5);
    // The pool is charged only after the nominal limits deny: a fresh key uses the nominal first.
    let d = e.check(&Request::new().customer(2));
    assert_eq!((d.limit, d.remaining), (10, 9));
}

/// More than 64 enforcing rules on one route: a denial by the last one gives each elastic
/// rule's cost back to the store that took it (its pool), including rules past the 64th.
#[test]
fn refund_returns_pool_charges_beyond_64_rules() {
    let mut text = String::from("[load]\nmax_in_flight = 10\n");
    for i in 0..69 {
        text.push_str(&format!(
            "[[rule]]\nname = \"e{i}\"\nkey = \"global\"\nmode = \"elastic\"\nelastic_percent = 100\n\
             limits = [{{ algorithm = \"fixed_window\", limit = 1, window = \"1h\" }}]\n"
        ));
    }
    text.push_str(
        "[[rule]]\nname = \"last\"\nkey = \"global\"\nmatch = { route_prefix = \"/limited\" }\n\
         limits = [{ algorithm = \"fixed_window\", limit = 1, window = \"1h\" }]\n",
    );
    let (e, _) = engine(&text);
    let limited = Request::new().route("/limited");
    let free = Request::new().route("/free");
    // 1: every nominal limit takes it. 2: every pool takes it, `last` denies: all refunded.
    assert!(e.check(&limited).allowed());
    assert!(!e.check(&limited).allowed());
    for i in [0, 63, 64, 68] {
        assert_eq!(e.rule_stats(&format!("e{i}")).unwrap().elastic, 1, "e{i}");
    }
    // 3: the pools were refunded, so they admit again (a refund to the nominal stores would
    // have let the nominal limits admit instead, without drawing the pools).
    assert!(e.check(&free).allowed());
    for i in [0, 63, 64, 68] {
        assert_eq!(e.rule_stats(&format!("e{i}")).unwrap().elastic, 2, "e{i}");
    }
    assert!(!e.check(&free).allowed());
}

#[test]
fn shadow_mode_always_allows_and_counts_would_be_denials() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "trial"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 2, window = "1s" }]
"#,
    );
    let a = Request::new().customer(1);
    assert_eq!(admitted(&e, &a, 5), 5);
    assert_eq!(e.rule_stats("trial").unwrap().would_deny, 3);
    let v = e.explain(&a);
    assert!(v.decision.allowed());
    assert_eq!((v.would_deny, v.rule), (1, None));
}

#[test]
fn shadow_rule_is_not_charged_when_an_enforcing_rule_denies() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "enforce"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 1, window = "1s" }]

[[rule]]
name = "trial"
key = "ip"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 2, window = "1s" }]
"#,
    );
    let x = ip("10.0.0.1");
    assert!(e.check(&Request::new().customer(1).ip(x)).allowed());
    // Denied by `enforce`: `trial` is not charged.
    assert!(!e.check(&Request::new().customer(1).ip(x)).allowed());
    assert!(e.check(&Request::new().customer(2).ip(x)).allowed());
    assert_eq!(e.rule_stats("trial").unwrap().would_deny, 0);
    assert!(e.check(&Request::new().customer(3).ip(x)).allowed());
    assert_eq!(e.rule_stats("trial").unwrap().would_deny, 1);
}

// ---- all-or-nothing, overrides, keys, matching ----------------------------------------------

#[test]
fn all_or_nothing_across_rules() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "per-customer"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 10, window = "1m" }]

[[rule]]
name = "per-ip"
key = "ip"
limits = [{ algorithm = "token_bucket", limit = 2, window = "1m" }]
"#,
    );
    let from_x = Request::new().customer(1).ip(ip("10.0.0.1"));
    assert_eq!(admitted(&e, &from_x, 2), 2);
    let v = e.explain(&from_x);
    assert!(!v.decision.allowed());
    assert_eq!(v.rule.as_deref(), Some("per-ip"));
    // The denied requests took nothing from per-customer: 8 of 10 are left.
    for i in 0..8 {
        let r = Request::new().customer(1).ip(ip(&format!("10.0.1.{i}")));
        assert!(e.check(&r).allowed(), "request {i}");
    }
    let v = e.explain(&Request::new().customer(1).ip(ip("10.0.2.1")));
    assert_eq!(v.rule.as_deref(), Some("per-customer"));
    // per-customer is checked first: its denial never charged per-ip, 10.0.2.1 still has 2.
    assert_eq!(
        admitted(&e, &Request::new().customer(2).ip(ip("10.0.2.1")), 3),
        2
    );
}

#[test]
fn the_tightest_rule_is_reported() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "a"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 10, window = "1m" }]
[[rule]]
name = "b"
key = "global"
limits = [{ algorithm = "fixed_window", limit = 5, window = "1m" }]
"#,
    );
    let d = e.check(&Request::new().customer(1));
    assert_eq!((d.limit, d.remaining), (5, 4));
    // No rule applies to a request without a customer id except the global one.
    let d = e.check(&Request::new());
    assert_eq!((d.limit, d.remaining), (5, 3));
}

#[test]
fn overrides_per_key() {
    // The notes' config store: customer 241531 → 5 requests per 1 s.
    let (e, clock) = engine(
        r#"
[[rule]]
name = "customers"
key = "customer"
limits = [{ algorithm = "sliding_window", limit = 100, window = "1s" }]
[[rule.override]]
key = "241531"
limits = [{ time_window_sec = 1, capacity = 5 }]
[[rule.override]]
key = 42
limits = [{ algorithm = "token_bucket", limit = 15, window = "1s" }]
"#,
    );
    assert_eq!(admitted(&e, &Request::new().customer(241_531), 10), 5);
    assert_eq!(admitted(&e, &Request::new().customer(42), 20), 15);
    assert_eq!(admitted(&e, &Request::new().customer(7), 120), 100);
    clock.advance(Duration::from_secs(2));
    assert_eq!(admitted(&e, &Request::new().customer(241_531), 10), 5);
}

#[test]
fn key_classes() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "net"
key = "ip/24/64"
limits = [{ algorithm = "fixed_window", limit = 2, window = "1m" }]
[[rule.override]]
key = "203.0.113.0/24"
limits = [{ algorithm = "fixed_window", limit = 4, window = "1m" }]

[[rule]]
name = "cust-route"
key = "customer+route"
match = { route_prefix = "/r/" }
limits = [{ algorithm = "fixed_window", limit = 1, window = "1m" }]
[[rule.override]]
key = { customer = 9, route = "/r/big" }
limits = [{ algorithm = "fixed_window", limit = 3, window = "1m" }]

[[rule]]
name = "keys"
key = "api_key"
match = { route_prefix = "/k/" }
limits = [{ algorithm = "fixed_window", limit = 1, window = "1m" }]
"#,
    );
    let n = |a: &str| Request::new().ip(ip(a));
    assert!(e.check(&n("10.0.0.1")).allowed());
    assert!(e.check(&n("10.0.0.200")).allowed());
    assert!(!e.check(&n("10.0.0.7")).allowed(), "same /24");
    assert!(e.check(&n("10.0.1.1")).allowed(), "other /24");
    assert_eq!(admitted(&e, &n("203.0.113.50"), 6), 4, "override");
    assert_eq!(admitted(&e, &n("2001:db8:1:2::1"), 1), 1);
    assert_eq!(admitted(&e, &n("2001:db8:1:2:ffff::9"), 2), 1, "same /64");
    assert_eq!(admitted(&e, &n("2001:db8:1:3::1"), 1), 1, "other /64");

    let cr = |c: u64, r: &'static str| Request::new().customer(c).route(r);
    assert!(e.check(&cr(1, "/r/a")).allowed());
    assert!(!e.check(&cr(1, "/r/a")).allowed());
    assert!(e.check(&cr(1, "/r/b")).allowed());
    assert!(e.check(&cr(2, "/r/a")).allowed());
    assert_eq!(admitted(&e, &cr(9, "/r/big"), 5), 3);
    // A request without the key's parts is not subject to the rule.
    assert_eq!(e.check(&Request::new().route("/r/a")), UNLIMITED);

    let k = |key: &'static str| Request::new().api_key(key).route("/k/x");
    assert!(e.check(&k("sk_1")).allowed());
    assert!(!e.check(&k("sk_1")).allowed());
    assert!(e.check(&k("sk_2")).allowed());
}

#[test]
fn matching_conditions() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "writes"
key = "customer"
match = { route_prefix = ["/v1/charges", "/v1/refunds"], method = ["post", "PUT"] }
limits = [{ algorithm = "fixed_window", limit = 1, window = "1m" }]

[[rule]]
name = "tests"
key = "customer"
match = { priority = "test" }
limits = [{ algorithm = "fixed_window", limit = 1, window = "1m" }]
"#,
    );
    let w = |r: &'static str, m: &'static str| Request::new().customer(1).route(r).method(m);
    assert!(e.check(&w("/v1/charges/ch_1", "POST")).allowed());
    assert!(
        !e.check(&w("/v1/refunds", "PUT")).allowed(),
        "same rule, same key"
    );
    assert_eq!(e.check(&w("/v1/charges", "GET")), UNLIMITED, "method");
    assert_eq!(e.check(&w("/v1/customers", "POST")), UNLIMITED, "route");
    assert_eq!(
        e.check(&w("/v1/charge", "POST")),
        UNLIMITED,
        "shorter than the prefix"
    );
    assert_eq!(
        e.check(&Request::new().customer(1).method("POST")),
        UNLIMITED,
        "no route"
    );
    let t = Request::new().customer(5).priority(Priority::Test);
    assert!(e.check(&t).allowed());
    assert!(!e.check(&t).allowed());
    assert_eq!(e.check(&Request::new().customer(5)), UNLIMITED);
}

#[test]
fn rule_and_request_costs_multiply() {
    let (e, _) = engine(
        r#"
[[rule]]
name = "search"
key = "customer"
cost = 5
limits = [{ algorithm = "fixed_window", limit = 20, window = "1m" }]
"#,
    );
    let d = e.check(&Request::new().customer(1).cost(2));
    assert_eq!(d.remaining, 10);
    assert!(e.check(&Request::new().customer(1).cost(2)).allowed());
    assert!(!e.check(&Request::new().customer(1)).allowed());
    // Cost 0 looks without consuming.
    assert_eq!(e.check(&Request::new().customer(3).cost(0)).remaining, 20);
}

// ---- shedding ------------------------------------------------------------------------------

const SHED: &str = r#"
[load]
max_in_flight = 10
sample = "0s"

[shedding]
retry_after = "2s"
test = { on = 0.5, off = 0.4 }
get = { on = 0.7, off = 0.6 }
post = { on = 0.75, off = 0.65 }

[[rule]]
name = "everyone"
key = "global"
limits = [{ algorithm = "token_bucket", limit = 1000000, window = "1s" }]
"#;

fn shed(e: &E, p: Priority) -> bool {
    let v = e.explain(&Request::new().priority(p));
    assert_eq!(v.shed, !v.decision.allowed());
    v.shed
}

#[test]
fn lowest_priorities_are_shed_first_with_hysteresis() {
    let (e, _) = engine(SHED);
    let all = |e: &E| Priority::ALL.map(|p| shed(e, p));
    // [critical, post, get, test]
    e.report_utilization(0.45);
    assert_eq!(all(&e), [false, false, false, false]);
    e.report_utilization(0.55);
    assert_eq!(all(&e), [false, false, false, true]);
    e.report_utilization(0.72);
    assert_eq!(all(&e), [false, false, true, true]);
    e.report_utilization(0.8);
    assert_eq!(all(&e), [false, true, true, true]);
    // Between off and on: still shed (no flapping).
    e.report_utilization(0.66);
    assert_eq!(all(&e), [false, true, true, true]);
    e.report_utilization(0.62);
    assert_eq!(all(&e), [false, false, true, true]);
    e.report_utilization(0.55);
    assert_eq!(all(&e), [false, false, false, true]);
    // Rising again to 0.65 does not restart get (its `on` is 0.7).
    e.report_utilization(0.65);
    assert_eq!(all(&e), [false, false, false, true]);
    e.report_utilization(0.3);
    assert_eq!(all(&e), [false, false, false, false]);
    // Critical is never shed by threshold here, whatever the load.
    e.report_utilization(5.0);
    assert_eq!(all(&e), [false, true, true, true]);
    let d = e.check(&Request::new().method("GET"));
    assert_eq!(d.outcome, Outcome::Limited);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(2)));
    let counts = e.shed_counts();
    assert!(counts[Priority::Test.index()] >= counts[Priority::Get.index()]);
    assert_eq!(counts[Priority::Critical.index()], 0);
}

#[test]
fn shedding_follows_requests_in_flight() {
    let (e, _) = engine(SHED);
    let get = Request::new().method("GET");
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(e.admit(&get).expect("under 0.7"));
    }
    // 7 of 10 in flight: GET is shed, POST (0.75) is not.
    assert!(e.admit(&get).is_err());
    let post = Request::new().method("POST");
    held.push(e.admit(&post).unwrap());
    assert!(e.admit(&post).is_err(), "8 of 10 ≥ 0.75");
    assert_eq!(
        e.shedding(),
        vec![Priority::Post, Priority::Get, Priority::Test]
    );
    // Finishing requests lowers the load; the hysteresis keeps POST shed until < 0.65.
    held.truncate(7);
    assert!(e.admit(&post).is_err(), "0.7 is above post.off");
    held.truncate(6);
    assert!(e.admit(&post).is_ok(), "0.6 < 0.65");
    held.clear();
    assert!(e.admit(&get).is_ok());
}

/// An owned guard outlives the borrow of the engine, moves to another thread, and still counts
/// in the load that shedding reads until it drops there.
#[test]
fn owned_in_flight_guards_cross_threads() {
    let (e, _) = engine(SHED);
    let e = Arc::new(e);
    let get = Request::new().method("GET");
    let held: Vec<_> = (0..7)
        .map(|_| e.admit_owned(&get).expect("under 0.7"))
        .collect();
    assert_eq!(held[0].decision().outcome, Outcome::Allowed);
    assert!(e.admit_owned(&get).is_err(), "7 of 10 in flight sheds GET");
    let extra = e.enter_owned();
    assert_eq!(e.in_flight(), 8);
    let t = std::thread::spawn(move || {
        drop(extra);
        drop(held);
    });
    t.join().unwrap();
    assert_eq!(e.in_flight(), 0);
    assert!(e.admit_owned(&get).is_ok());
}

#[test]
fn critical_traffic_keeps_a_reserved_share() {
    let (e, _) = engine(
        r#"
[load]
max_in_flight = 10
[shedding]
critical_reserve = 0.2
[[rule]]
name = "everyone"
key = "global"
limits = [{ algorithm = "token_bucket", limit = 1000000, window = "1s" }]
"#,
    );
    let post = Request::new().method("POST");
    let crit = Request::new().priority(Priority::Critical);
    let mut held: Vec<_> = (0..8).map(|_| e.admit(&post).unwrap()).collect();
    // 8 of 10 in flight: the last 20 % is critical's.
    assert!(e.admit(&post).is_err());
    assert!(e.admit(&Request::new().priority(Priority::Test)).is_err());
    held.push(e.admit(&crit).unwrap());
    held.push(e.admit(&crit).unwrap());
    assert!(
        e.admit(&crit).is_ok(),
        "critical is never shed by the reserve"
    );
    assert_eq!(e.shed_counts()[Priority::Post.index()], 1);
    held.truncate(7);
    assert!(e.admit(&post).is_ok());
}

// ---- reload ---------------------------------------------------------------------------------

const BASE: &str = r#"
[[rule]]
name = "steady"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 5, window = "1h" }]

[[rule]]
name = "churn"
key = "customer"
match = { route_prefix = "/churn" }
limits = [{ algorithm = "fixed_window", limit = 5, window = "1h" }]
"#;

#[test]
fn reload_keeps_the_state_of_unchanged_rules() {
    let (e, _) = engine(BASE);
    let steady = Request::new().customer(1);
    let churn = Request::new().customer(1).route("/churn");
    assert_eq!(admitted(&e, &steady, 3), 3);
    assert_eq!(admitted(&e, &churn, 1), 1); // steady: 4 taken
    let next = BASE.replace(
        "route_prefix = \"/churn\" }\nlimits = [{ algorithm = \"fixed_window\", limit = 5",
        "route_prefix = \"/churn\" }\nlimits = [{ algorithm = \"fixed_window\", limit = 6",
    )
        + "\n[[rule]]\nname = \"new\"\nkey = \"ip\"\nlimits = [{ limit = 1, window = \"1s\" }]\n";
    let rep = e.reload_str(&next, "next.toml").unwrap();
    assert_eq!(rep.kept, vec!["steady"]);
    // churn's limit changed, its window did not: its count is carried over (tests/rules_contract.rs).
    assert_eq!(rep.carried, vec!["churn"]);
    assert_eq!(rep.fresh, vec!["new"]);
    assert!(rep.removed.is_empty());
    assert_eq!(admitted(&e, &steady, 5), 1, "steady kept its 4");
    assert_eq!(e.rule_names(), vec!["steady", "churn", "new"]);
    let rep = e.reload_str(BASE, "base.toml").unwrap();
    assert_eq!(rep.removed, vec!["new"]);
    // Mode hard → shadow keeps the store (same limits); hard → soft 20 % rescales 5 to 6
    // (the same window: carried over).
    let shadow = BASE.replacen(
        "key = \"customer\"\n",
        "key = \"customer\"\nmode = \"shadow\"\n",
        1,
    );
    assert_eq!(
        e.reload_str(&shadow, "s.toml").unwrap().kept,
        vec!["steady", "churn"]
    );
    let soft = BASE.replacen(
        "key = \"customer\"\n",
        "key = \"customer\"\nmode = \"soft\"\nsoft_percent = 20\n",
        1,
    );
    assert_eq!(
        e.reload_str(&soft, "s.toml").unwrap().carried,
        vec!["steady"]
    );
}

#[test]
fn a_bad_reload_changes_nothing() {
    let (e, _) = engine(BASE);
    let a = Request::new().customer(1);
    assert_eq!(admitted(&e, &a, 4), 4);
    let bad = BASE.replace(
        "limit = 5, window = \"1h\"",
        "limit = 5, window = \"1 hour\"",
    );
    let err = e.reload_str(&bad, "bad.toml").unwrap_err();
    assert_eq!(
        (err.origin.as_str(), err.line, err.column),
        ("bad.toml", 5, 61)
    );
    assert!(
        err.to_string()
            .starts_with("bad.toml:5:61: `1 hour` is not a duration"),
        "{err}"
    );
    assert_eq!(
        admitted(&e, &a, 5),
        1,
        "old rules and their state still in force"
    );
}

#[test]
fn reload_under_concurrent_checks_loses_no_state() {
    // Two threads check one key of an unchanged rule while a third reloads, alternating
    // between two files that differ in another rule, at least 50 times during the checks. The
    // unchanged rule admits exactly its limit in total: no reload ever gave it a fresh store.
    const LIMIT: usize = 3000;
    let text = |n: u64| {
        format!(
            r#"
[[rule]]
name = "steady"
key = "customer"
limits = [{{ algorithm = "fixed_window", limit = {LIMIT}, window = "1h" }}]

[[rule]]
name = "churn"
key = "customer"
match = {{ route_prefix = "/churn" }}
capacity = 1000
limits = [{{ algorithm = "fixed_window", limit = {n}, window = "1h" }}]
"#
        )
    };
    let (e, _) = engine(&text(1));
    let e = Arc::new(e);
    let stop = Arc::new(AtomicBool::new(false));
    let reloads = Arc::new(AtomicU64::new(0));
    let reloader = {
        let (e, stop, reloads) = (e.clone(), stop.clone(), reloads.clone());
        std::thread::spawn(move || {
            let mut n = 2;
            while !stop.load(Ordering::Relaxed) {
                let rep = e.reload_str(&text(n), "churn.toml").unwrap();
                assert_eq!(rep.kept, vec!["steady"]);
                n = if n == 2 { 3 } else { 2 };
                reloads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let checkers: Vec<_> = (0..2)
        .map(|_| {
            let e = e.clone();
            let reloads = reloads.clone();
            std::thread::spawn(move || {
                // At least LIMIT checks, and on until 50 reloads happened meanwhile.
                let r = Request::new().customer(1);
                let (mut n, mut admitted) = (0, 0);
                while n < LIMIT || reloads.load(Ordering::Relaxed) < 50 {
                    admitted += e.check(&r).allowed() as usize;
                    n += 1;
                }
                admitted
            })
        })
        .collect();
    let total: usize = checkers.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    reloader.join().unwrap();
    assert_eq!(total, LIMIT);
    assert!(reloads.load(Ordering::Relaxed) >= 50);
    assert!(!e.check(&Request::new().customer(1)).allowed());
}

// ---- errors ---------------------------------------------------------------------------------

#[track_caller]
fn bad(text: &str, line: usize, column: usize, says: &str) {
    let e = Rules::parse(text, "f.toml").unwrap_err();
    assert_eq!((e.line, e.column), (line, column), "{e}");
    assert!(e.message.contains(says), "{e}");
    assert!(e
        .to_string()
        .starts_with(&format!("f.toml:{line}:{column}: ")));
}

#[test]
fn bad_files_are_refused_at_the_right_line_and_column() {
    let head = "[[rule]]\nname = \"a\"\nkey = \"customer\"\n";
    let lim = |l: &str| format!("{head}limits = [{l}]\n");
    bad("[[rule]\n", 1, 8, "expected `]`");
    bad(&format!("{head}limit = 5\n"), 4, 1, "unknown field `limit`");
    bad(
        "[[rule]]\nname = \"a\"\nlimits = []\n",
        1,
        1,
        "missing field `key`",
    );
    bad(
        &lim(r#"{ algorithm = "token-bucket", limit = 5, window = "1s" }"#),
        4,
        25,
        "unknown algorithm `token-bucket`",
    );
    bad(
        &lim(r#"{ limit = 5, window = "1 sec" }"#),
        4,
        33,
        "not a duration",
    );
    bad(
        &lim(r#"{ limit = 5, window = 60 }"#),
        4,
        33,
        "write \"60s\"",
    );
    bad(
        &lim(r#"{ algorithm = "fixed_window", limit = 99999999, window = "1s" }"#),
        4,
        49,
        "1..=16777215",
    );
    bad(&lim(r#"{ limit = -5, window = "1s" }"#), 4, 21, "");
    bad(
        &lim(r#"{ limit = 5, window = "1s", burst = 3 }"#),
        4,
        47,
        "`burst` does not apply",
    );
    bad(
        &lim(r#"{ limit = 5, capacity = 5, window = "1s" }"#),
        4,
        35,
        "give one of them",
    );
    bad(
        &lim(r#"{ algorithm = "concurrency", limit = 5, window = "1s" }"#),
        4,
        25,
        "Limiter::acquire",
    );
    bad(&format!("{head}mode = \"soft\"\nsoft_percent = 50\nlimits = [\n  {{ algorithm = \"fixed_window\", limit = 16000000, window = \"1s\" }},\n]\n"), 7, 41, "scales it to 24000000");
    bad(&format!("{head}limits = [{{ limit = 5, window = \"1s\" }}]\n[[rule]]\nname = \"a\"\nkey = \"ip\"\nlimits = [{{ limit = 1, window = \"1s\" }}]\n"), 6, 8, "already used");
    bad(&format!("{head}limits = [{{ limit = 5, window = \"1s\" }}]\n[[rule.override]]\nkey = \"bob\"\nlimits = [{{ limit = 1, window = \"1s\" }}]\n"), 6, 7, "not a customer id");
    bad("[[rule]]\nname = \"a\"\nkey = \"ip/24\"\nlimits = [{ limit = 5, window = \"1s\" }]\n[[rule.override]]\nkey = \"10.0.0.0/16\"\nlimits = [{ limit = 1, window = \"1s\" }]\n", 6, 7, "wider than the rule's /24");
    bad(
        "[[rule]]\nname = \"a\"\nkey = \"custmer\"\n",
        3,
        7,
        "unknown key part `custmer`",
    );
    bad(&format!("{head}match = {{ method = [\"GET\", \"FETCH\"] }}\nlimits = [{{ limit = 5, window = \"1s\" }}]\n"), 4, 28, "unknown method `FETCH`");
    bad(&format!("{head}mode = \"hard\"\nsoft_percent = 5\nlimits = [{{ limit = 5, window = \"1s\" }}]\n"), 5, 16, "applies to mode = \"soft\"");
    bad(head, 1, 1, "no limits");
    bad(
        "[shedding]\ntest = { on = 0.9, off = 0.8 }\nget = { on = 0.7, off = 0.6 }\n",
        3,
        14,
        "lower priorities must be shed first",
    );
    bad(
        "[shedding]\nget = { on = 0.7, off = 0.7 }\n",
        2,
        25,
        "below on",
    );
    bad("[load]\nmax_in_flight = 0\n", 2, 17, "at least 1");
    bad("[settings]\ncapacity = 0\n", 2, 12, "out of range");
}

#[test]
fn builder_matches_the_file_and_names_fields_in_errors() {
    let file = Rules::parse(
        r#"
[load]
max_in_flight = 100
[shedding]
test = { on = 0.5, off = 0.4 }
[[rule]]
name = "c"
key = "customer+route"
mode = "soft"
soft_percent = 10
match = { route_prefix = "/v1/", method = "POST", priority = ["post", "critical"] }
limits = [{ algorithm = "fixed_window", limit = 500, window = "1h" }]
[[rule.override]]
key = { customer = "241531", route = "/v1/x" }
limits = [{ limit = 5, window = "1s" }]
"#,
        "f",
    )
    .unwrap();
    let built = Rules::builder()
        .load(LoadSettings {
            max_in_flight: Some(100),
            ..Default::default()
        })
        .shedding(Shedding::default().threshold(Priority::Test, 0.5, 0.4))
        .rule(
            Rule::new("c", KeyClass::customer().and(KeyPart::Route))
                .mode(Mode::Soft { percent: 10 })
                .route_prefix("/v1/")
                .method("POST")
                .priority(Priority::Post)
                .priority(Priority::Critical)
                .limit(fw(500, Duration::from_secs(3600)))
                .override_parts(
                    &[(KeyPart::Customer, "241531"), (KeyPart::Route, "/v1/x")],
                    vec![LimitSpec::new(
                        Algorithm::SlidingWindow,
                        5,
                        Duration::from_secs(1),
                    )],
                ),
        )
        .build()
        .unwrap();
    assert_eq!(file, built);
    let err = Rules::builder()
        .rule(Rule::new("x", KeyClass::customer()).limit(fw(0, Duration::from_secs(1))))
        .build()
        .unwrap_err();
    assert_eq!((err.line, err.column), (0, 0));
    assert!(
        err.message.starts_with("rule `x`, limits[0].limit: "),
        "{err}"
    );
}

// ---- the example, the CLI, robustness, allocation --------------------------------------------

fn example() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules.toml")).unwrap()
}

#[test]
fn the_example_file_passes_and_runs() {
    let (e, _) = engine(&example());
    assert_eq!(e.rule_names().len(), 6);
    let a = Request::new()
        .customer(241_531)
        .route("/v1/balance")
        .method("GET");
    assert_eq!(admitted(&e, &a, 10), 5);
    let d = e.check(&Request::new().customer(1));
    assert_eq!((d.limit, d.remaining), (15, 14));
}

#[test]
fn a_check_allocates_nothing() {
    let (e, _) = engine(&example());
    let reqs = [
        Request::new()
            .customer(7)
            .ip(ip("10.1.2.3"))
            .route("/v1/search/x")
            .method("GET"),
        Request::new()
            .api_key("sk_live_1")
            .route("/v1/charges")
            .method("POST")
            .customer(8),
        Request::new()
            .ip(ip("2001:db8::1"))
            .route("/v1/exports")
            .method("POST"),
    ];
    for r in &reqs {
        e.check(r); // first use on this thread (arc-swap's thread-local slot)
    }
    TRACK.with(|t| t.set(true));
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        for r in &reqs {
            std::hint::black_box(e.check(r));
        }
    }
    let after = ALLOCS.load(Ordering::Relaxed);
    TRACK.with(|t| t.set(false));
    assert_eq!(after - before, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn parse_never_panics_on_mutated_examples(cut in 0usize..6000, at in 0usize..6000, b in any::<u8>()) {
        let mut bytes = example().into_bytes();
        let n = bytes.len();
        bytes[at % n] = b;
        bytes.truncate(cut.max(1) % (n + 1));
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = Rules::parse(&text, "m") {
            prop_assert!(e.line <= text.lines().count() + 1);
        }
    }

    #[test]
    fn parse_never_panics_on_noise(s in "\\PC{0,200}") {
        let _ = Rules::parse(&s, "n");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Extreme numbers in every numeric field: refused or accepted, never a panic (these
    /// tests build with overflow checks).
    #[test]
    fn parse_never_panics_on_extreme_numbers(
        alg in 0usize..7,
        mode in 0usize..4,
        limit in prop_oneof![Just(0u64), Just(1), Just(i64::MAX as u64), 0u64..5000],
        window in prop_oneof![Just("0s"), Just("1ns"), Just("36500d"), Just("1h"), Just("999999999999d")],
        burst in proptest::option::of(prop_oneof![Just(0u64), Just(i64::MAX as u64), 0u64..100]),
        extra in proptest::option::of(prop_oneof![Just(0u64), Just(i64::MAX as u64), 1u64..100]),
        percent in prop_oneof![Just(0u32), Just(1000), Just(u32::MAX), 1u32..100],
        capacity in prop_oneof![Just(0u64), Just(1), Just(i64::MAX as u64)],
        cost in prop_oneof![Just(0u64), Just(1), Just(i64::MAX as u64)],
        prefix in 0u32..200,
    ) {
        let alg = Algorithm::ALL[alg].name();
        let (mode, pct) = match mode {
            0 => ("hard", String::new()),
            1 => ("soft", format!("soft_percent = {percent}\n")),
            2 => ("elastic", format!("elastic_percent = {percent}\nelastic_below = 0.5\n")),
            _ => ("shadow", String::new()),
        };
        let mut lim = format!("algorithm = \"{alg}\", limit = {limit}, window = \"{window}\"");
        if let Some(b) = burst {
            lim.push_str(&format!(", burst = {b}"));
        }
        if let Some(x) = extra {
            let f = ["buckets", "delay"][(x % 2) as usize];
            lim.push_str(&format!(", {f} = {x}"));
        }
        let text = format!(
            "[[rule]]\nname = \"r\"\nkey = \"ip/{p4}/{prefix}\"\nmode = \"{mode}\"\n{pct}capacity = {capacity}\ncost = {cost}\nlimits = [{{ {lim} }}]\n[[rule.override]]\nkey = \"10.0.0.0/{p4}\"\nlimits = [{{ {lim} }}]\n",
            p4 = prefix % 40,
        );
        if let Ok(rules) = Rules::parse(&text, "x") {
            // Whatever validates also builds (with a small capacity, to keep the test light).
            let mut rules = rules;
            for r in &mut rules.rules {
                r.capacity = Some(r.capacity.unwrap_or(1).min(64));
            }
            let e = Engine::builder(rules).seed(1).build_with_clock(ManualClock::new(0));
            prop_assert!(e.is_ok(), "{:?}", e.err());
            let e = e.unwrap();
            let _ = e.check(&Request::new().ip(ip("10.0.0.1")).cost(cost));
        }
    }
}

#[test]
fn deeply_nested_input_is_refused_not_crashed() {
    for open in ["[", "{a=", "[[", "a.", "x = ["] {
        let text = open.repeat(20_000);
        assert!(Rules::parse(&text, "deep").is_err());
    }
}

// ---- the check's fast paths against the general path --------------------------------------

const ROUTES: [&str; 5] = [
    "/v1/",
    "/v1/charges",
    "/v2/",
    "/admin/x",
    "/v1/charges/refunds",
];
const VERBS: [&str; 5] = ["GET", "POST", "put", "PURGE", "DELETE"];
/// The methods rules name (a rule cannot name an unknown method; a request can).
const RULE_VERBS: [&str; 4] = ["GET", "POST", "PUT", "delete"];

/// One rule from generated numbers: key class, route prefixes, methods, priorities, mode,
/// limit and cost.
fn arbitrary_rule(i: usize, g: &[u8; 8]) -> Rule {
    let key = match g[0] % 4 {
        0 => KeyClass::customer(),
        1 => KeyClass::global(),
        2 => KeyClass::customer().and(KeyPart::Route),
        _ => KeyClass::ip(),
    };
    let mut r = Rule::new(format!("r{i}"), key)
        .limit(fw(1 + g[1] as u64 % 4, Duration::from_secs(60)))
        .cost(1 + g[2] as u64 % 2);
    for (b, p) in ROUTES.iter().enumerate() {
        if g[3] >> b & 1 == 1 && g[3] & 0x80 != 0 {
            r = r.route_prefix(*p);
        }
    }
    for (b, m) in RULE_VERBS.iter().enumerate() {
        if g[4] >> b & 1 == 1 && g[4] & 0x80 != 0 {
            r = r.method(*m);
        }
    }
    for p in Priority::ALL {
        if g[5] >> p.index() & 1 == 1 && g[5] & 0x80 != 0 {
            r = r.priority(p);
        }
    }
    r.mode(match g[6] % 6 {
        0 => Mode::Soft { percent: 50 },
        1 => Mode::Shadow,
        2 => Mode::Elastic {
            percent: 100,
            below: 0.5,
        },
        _ => Mode::Hard,
    })
}

/// A request from generated numbers (customer, address, route, method, priority, cost).
fn arbitrary_request(g: &[u8; 6]) -> Request<'static> {
    let mut q = Request::new().cost(g[5] as u64 % 3);
    if g[0] % 4 != 0 {
        q = q.customer(g[0] as u64 % 3);
    }
    if g[1] % 3 != 0 {
        q = q.ip(IpAddr::from([10, 0, 0, g[1] % 2]));
    }
    if let Some(r) = ROUTES.get(g[2] as usize % 7) {
        q = q.route(r);
    } else if g[2] % 7 == 5 {
        q = q.route("/other");
    }
    if let Some(m) = VERBS.get(g[3] as usize % 6) {
        q = q.method(m);
    }
    if let Some(p) = Priority::ALL.get(g[4] as usize % 5) {
        q = q.priority(*p);
    }
    q
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// `check` (pre-filtered lists, the one-rule path, no method parse where none is
    /// needed), through the engine and through a `LocalEngine`, decides every request exactly
    /// as `explain` (every candidate, each one's mask tested, the method always parsed), on
    /// four engines fed the same requests; the rules' counters agree too. `try_admit_owned`
    /// names the rule that denied as `explain` does.
    #[test]
    fn fast_paths_decide_as_the_general_path(
        rules in proptest::collection::vec(any::<[u8; 8]>(), 1..7),
        shedding in any::<bool>(),
        busy in any::<bool>(),
        reqs in proptest::collection::vec(any::<[u8; 6]>(), 1..60),
    ) {
        let mut b = Rules::builder();
        if shedding {
            b = b.shedding(Shedding::default().threshold(Priority::Test, 0.5, 0.4));
        }
        for (i, g) in rules.iter().enumerate() {
            b = b.rule(arbitrary_rule(i, g));
        }
        let rules = b.build().unwrap();
        let clock = Arc::new(ManualClock::new(1000 * S));
        let make = || {
            Engine::builder(rules.clone())
                .seed(7)
                .build_with_clock(clock.clone())
                .unwrap()
        };
        let (fast, local, general, named) = (make(), make(), make(), make());
        if busy {
            for e in [&fast, &local, &general, &named] {
                e.report_utilization(0.6);
            }
        }
        let mut l = local.local();
        for g in &reqs {
            let q = arbitrary_request(g);
            let v = general.explain(&q);
            let want = v.decision;
            prop_assert_eq!(fast.check(&q), want, "check of {:?}", q);
            prop_assert_eq!(l.check(&q), want, "LocalEngine check of {:?}", q);
            match named.try_admit_owned(&q) {
                Ok(p) => prop_assert_eq!(*p.decision(), want, "try_admit_owned of {:?}", q),
                Err(r) => {
                    prop_assert_eq!(r.decision, want, "try_admit_owned of {:?}", q);
                    prop_assert_eq!(r.rule, v.rule, "the rule that denied {:?}", q);
                }
            }
        }
        for n in general.rule_names() {
            prop_assert_eq!(fast.rule_stats(&n), general.rule_stats(&n), "rule {}", n);
            prop_assert_eq!(named.rule_stats(&n), general.rule_stats(&n), "rule {}", n);
            prop_assert_eq!(local.rule_stats(&n), general.rule_stats(&n), "rule {}", n);
        }
    }
}

/// A customer override key is a decimal id as it is counted: a tag or leading zeros are refused
/// (they would otherwise merge `user:1` and `org:1` into customer 1), with what to write.
#[test]
fn customer_override_keys_are_never_merged() {
    for key in ["\"user:1\"", "\"org:1\"", "\"01\"", "\"-1\""] {
        let text = format!(
            "[[rule]]\nname = \"c\"\nkey = \"customer\"\nlimits = [{{ limit = 1, window = \"1s\" }}]\n[[rule.override]]\nkey = {key}\nlimits = [{{ limit = 2, window = \"1s\" }}]\n"
        );
        let e = Rules::parse(&text, "f").unwrap_err().to_string();
        assert!(
            e.contains("is not a customer id") && e.contains("api_key"),
            "{key}: {e}"
        );
    }
}
