//! `TURNSTILE.SETTLE` and `POST /v1/settle` against the server in process on loopback: the
//! `redis` crate and curl as the clients. Every answer is compared with the rules engine's own
//! (`Engine::check`, `settle`, `explain` on a manual clock, the reference the server must
//! match), over random sequences of checks and settles; a check at a reserved cost settled at
//! the actual one leaves the key as a check at the actual cost would have, wherever both are
//! admitted; a settle of the same amount changes nothing; a charge past the limit is a debt
//! the next checks are denied for. Authentication, `MULTI` and bad input too.

mod common;
use common::curl;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use turnstile::rules::{Engine, Request, Rules};
use turnstile::ManualClock;
use turnstile_server::{start, Running, ServeArgs};

/// Three rules on one request (`customer+route`): a token bucket per customer (one token per
/// 6 minutes: the counts do not move while a test runs), a fixed window per route at cost 2,
/// a sliding window per customer (in its first window: no previous count to weigh).
const RULES: &str = r#"
[[rule]]
name = "tokens"
key = "customer"
limits = [{ algorithm = "token_bucket", limit = 10, window = "1h" }]

[[rule]]
name = "route-window"
key = "route"
cost = 2
limits = [{ algorithm = "fixed_window", limit = 30, window = "1h" }]

[[rule]]
name = "sliding"
key = "customer"
limits = [{ algorithm = "sliding_window", limit = 25, window = "1h" }]
"#;

fn rules_file(name: &str, text: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("turnstile-settle-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("rules.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn server(rules: Option<PathBuf>, f: impl FnOnce(&mut ServeArgs)) -> Running {
    let mut a = ServeArgs::new();
    a.resp = "127.0.0.1:0".parse().unwrap();
    a.http = "127.0.0.1:0".parse().unwrap();
    a.workers = Some(2);
    a.throttle_keys = 10_000;
    a.rules = rules;
    a.watch_every = Duration::ZERO;
    f(&mut a);
    start(a).expect("server starts")
}

fn stop(r: Running) {
    r.stop();
    r.join().unwrap();
}

fn resp(r: &Running) -> redis::Connection {
    let c = redis::Client::open(format!("redis://{}/", r.resp)).unwrap();
    let con = c.get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    con
}

/// A check's or peek's reply: allowed, limit, remaining, retry_after_ms, reset_after_ms, rule.
type Check = (i64, i64, i64, i64, i64, Option<String>);
/// A settle's reply: rules settled, charged, given back, then a peek's limit, remaining and
/// reset_after_ms.
type Settle = (i64, i64, i64, i64, i64, i64);

fn call<T: redis::FromRedisValue>(con: &mut redis::Connection, name: &str, args: &[&str]) -> T {
    let mut c = redis::cmd(name);
    for a in args {
        c.arg(*a);
    }
    c.query(con)
        .unwrap_or_else(|e| panic!("{name} {args:?}: {e}"))
}

fn error(con: &mut redis::Connection, name: &str, args: &[&str]) -> String {
    let mut c = redis::cmd(name);
    for a in args {
        c.arg(*a);
    }
    match c.query::<redis::Value>(con) {
        Ok(v) => panic!("{name} {args:?} answered {v:?}"),
        Err(e) => e.to_string(),
    }
}

/// What the clients compare of an answer: allowed, limit, remaining, the denying rule
/// (retry and reset depend on when it is asked).
type Seen = (i64, i64, i64, Option<String>);

fn seen_check(c: &Check) -> Seen {
    (c.0, c.1, c.2, c.5.clone())
}

/// Of a settle: what was settled, then limit and remaining.
fn seen_settle(s: &Settle) -> ((i64, i64, i64), (i64, i64)) {
    ((s.0, s.1, s.2), (s.3, s.4))
}

/// The rules engine in process, the reference: a manual clock that does not move.
struct Reference(Engine<Arc<ManualClock>>);

impl Reference {
    fn new() -> Self {
        let rules = Rules::parse(RULES, "rules.toml").unwrap();
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        Self(Engine::builder(rules).build_with_clock(clock).unwrap())
    }
    fn seen(v: &turnstile::rules::Verdict) -> Seen {
        let d = &v.decision;
        let count = |n: u64| if n > i64::MAX as u64 { -1 } else { n as i64 };
        (
            i64::from(d.allowed()),
            count(d.limit),
            count(d.remaining),
            v.rule.as_deref().map(str::to_string),
        )
    }
    fn check(&self, cust: u64, route: &str, cost: u64) -> Seen {
        let req = Request::new().customer(cust).route(route).cost(cost);
        Self::seen(&self.0.explain(&req))
    }
    fn settle(
        &self,
        cust: u64,
        route: &str,
        reserved: u64,
        actual: u64,
    ) -> ((i64, i64, i64), (i64, i64)) {
        let req = Request::new().customer(cust).route(route).cost(reserved);
        let n = self.0.settle(&req, actual);
        let diff = match n {
            0 => (0, 0),
            _ => (
                actual.saturating_sub(reserved) as i64,
                reserved.saturating_sub(actual) as i64,
            ),
        };
        let after = Self::seen(&self.0.explain(&req.cost(0)));
        ((i64::from(n), diff.0, diff.1), (after.1, after.2))
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// A check of (customer, route) at a cost; settled at `actual` right away, or at the
    /// next step (`later`), if admitted.
    Check {
        cust: u64,
        route: usize,
        cost: u64,
        actual: u64,
        later: bool,
    },
    /// A peek.
    Peek { cust: u64, route: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..3, 0usize..2, 0u64..7, 0u64..13, any::<bool>()).prop_map(
            |(cust, route, cost, actual, later)| Op::Check { cust, route, cost, actual, later }
        ),
        1 => (0u64..3, 0usize..2).prop_map(|(cust, route)| Op::Peek { cust, route }),
    ]
}

/// Over random sequences of checks, settles (at once or a step later, of more, less or the
/// same) and peeks, the server answers every one as the rules engine does.
#[test]
fn settles_over_resp_answer_as_the_engine() {
    let r = server(Some(rules_file("diff", RULES)), |_| {});
    let con = std::cell::RefCell::new(resp(&r));
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    // Fresh keys per case: customers and routes of their own.
    let case = std::cell::Cell::new(0u64);
    runner
        .run(&proptest::collection::vec(op(), 1..40), |ops| {
            let mut con = con.borrow_mut();
            let reference = Reference::new();
            case.set(case.get() + 1);
            let base = case.get() * 10;
            let routes = [format!("/a{}", case.get()), format!("/b{}", case.get())];
            let key = |cust: u64, route: usize| format!("{}|{}", base + cust, routes[route]);
            let mut pending: Option<(u64, usize, u64, u64)> = None;
            let settle = |con: &mut redis::Connection,
                          (cust, route, res, act): (u64, usize, u64, u64),
                          i: usize| {
                let (res_s, act_s) = (res.to_string(), act.to_string());
                let got: Settle = call(
                    con,
                    "TURNSTILE.SETTLE",
                    &["customer+route", &key(cust, route), &res_s, &act_s],
                );
                let want = reference.settle(base + cust, &routes[route], res, act);
                prop_assert_eq!(seen_settle(&got), want, "settle at step {}", i);
                Ok(())
            };
            for (i, op) in ops.iter().enumerate() {
                match *op {
                    Op::Check {
                        cust,
                        route,
                        cost,
                        actual,
                        later,
                    } => {
                        let c = cost.to_string();
                        let got: Check = call(
                            &mut con,
                            "TURNSTILE.CHECK",
                            &["customer+route", &key(cust, route), &c],
                        );
                        let want = reference.check(base + cust, &routes[route], cost);
                        prop_assert_eq!(&seen_check(&got), &want, "step {}: {:?}", i, op);
                        if let Some(p) = pending.take() {
                            settle(&mut con, p, i)?;
                        }
                        if got.0 == 1 {
                            if later {
                                pending = Some((cust, route, cost, actual));
                            } else {
                                settle(&mut con, (cust, route, cost, actual), i)?;
                            }
                        }
                    }
                    Op::Peek { cust, route } => {
                        let got: Check = call(
                            &mut con,
                            "TURNSTILE.PEEK",
                            &["customer+route", &key(cust, route)],
                        );
                        let want = reference.check(base + cust, &routes[route], 0);
                        prop_assert_eq!(&seen_check(&got), &want, "step {}: {:?}", i, op);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    stop(r);
}

/// A check at a reserved cost then a settle at the actual cost leaves the key as a check at
/// the actual cost would have (the same peek), wherever both checks are admitted; a charge
/// past the limit leaves a debt instead: denied, nothing remaining, a retry. One customer per
/// world, fresh per case; one rule (a token bucket of 10).
#[test]
fn reserve_then_settle_is_a_check_of_the_actual_cost() {
    let one = "[[rule]]\nname = \"tokens\"\nkey = \"customer\"\nlimits = [{ algorithm = \"token_bucket\", limit = 10, window = \"1h\" }]\n";
    let r = server(Some(rules_file("same", one)), |_| {});
    let con = std::cell::RefCell::new(resp(&r));
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let next = std::cell::Cell::new(1000u64);
    runner
        .run(
            &(0u64..=10, 0u64..=12, 0u64..=14),
            |(pre, reserved, actual)| {
                let mut con = con.borrow_mut();
                let (a, b) = (next.get(), next.get() + 1);
                next.set(b + 1);
                let (a, b) = (a.to_string(), b.to_string());
                let n = |v: u64| v.to_string();
                // Both worlds spend `pre` first.
                for k in [&a, &b] {
                    let c: Check = call(&mut con, "TURNSTILE.CHECK", &["customer", k, &n(pre)]);
                    prop_assert_eq!(c.0, 1);
                }
                let ca: Check = call(&mut con, "TURNSTILE.CHECK", &["customer", &a, &n(reserved)]);
                prop_assert_eq!(ca.0 == 1, pre + reserved <= 10);
                let cb: Check = call(&mut con, "TURNSTILE.CHECK", &["customer", &b, &n(actual)]);
                prop_assert_eq!(cb.0 == 1, pre + actual <= 10);
                if ca.0 == 0 {
                    return Ok(());
                }
                let s: Settle = call(
                    &mut con,
                    "TURNSTILE.SETTLE",
                    &["customer", &a, &n(reserved), &n(actual)],
                );
                prop_assert_eq!(
                    (s.0, s.1, s.2),
                    (
                        1,
                        actual.saturating_sub(reserved) as i64,
                        reserved.saturating_sub(actual) as i64
                    )
                );
                let pa: Check = call(&mut con, "TURNSTILE.PEEK", &["customer", &a]);
                // The settle's own peek is the next one's.
                prop_assert_eq!((s.3, s.4), (pa.1, pa.2));
                // The bucket is full again once pre + actual tokens have come back, 6 minutes
                // each (less the milliseconds since the first check), debt or not.
                let full = (pre + actual) as i64 * 360_000;
                prop_assert!(s.5 > full - 60_000 && s.5 <= full, "{:?}", s);
                if cb.0 == 1 {
                    let pb: Check = call(&mut con, "TURNSTILE.PEEK", &["customer", &b]);
                    prop_assert_eq!(seen_check(&pa), seen_check(&pb));
                    prop_assert_eq!(pa.2, (10 - pre - actual) as i64);
                } else {
                    // Over the limit: a debt of pre + actual − 10 tokens; nothing remains and
                    // the next check is denied.
                    prop_assert_eq!((pa.1, pa.2), (10, 0));
                    let c: Check = call(&mut con, "TURNSTILE.CHECK", &["customer", &a, "1"]);
                    prop_assert_eq!((c.0, c.5.as_deref()), (0, Some("tokens")));
                    let owed = (pre + actual - 10) as i64 * 360_000;
                    prop_assert!(c.3 > owed - 60_000 && c.3 <= owed + 360_000, "{:?}", c);
                }
                Ok(())
            },
        )
        .unwrap();
    stop(r);
}

/// The reply's fields, a settle of the same amount as a no-op, no rule, each bad argument's
/// error, inside MULTI, without rules, and before AUTH.
#[test]
fn settle_over_resp() {
    let one = "[[rule]]\nname = \"tokens\"\nkey = \"customer\"\nlimits = [{ algorithm = \"token_bucket\", limit = 10, window = \"1h\" }]\n";
    let r = server(Some(rules_file("resp", one)), |a| {
        a.requirepass = Some("s3cret".into())
    });
    let mut con = resp(&r);
    let e = error(&mut con, "TURNSTILE.SETTLE", &["customer", "5", "1", "2"]);
    assert!(e.contains("NOAUTH"), "{e}");
    let _: String = call(&mut con, "AUTH", &["s3cret"]);
    let c: Check = call(&mut con, "TURNSTILE.CHECK", &["customer", "5", "4"]);
    assert_eq!((c.0, c.2), (1, 6));
    // 4 reserved, 1 used: 3 given back.
    let s: Settle = call(&mut con, "TURNSTILE.SETTLE", &["customer", "5", "4", "1"]);
    assert_eq!((s.0, s.1, s.2, s.3, s.4), (1, 0, 3, 10, 9));
    assert!(
        s.5 > 300_000 && s.5 <= 360_000,
        "one token to refill: {s:?}"
    );
    // The same amount: nothing moves.
    let same: Settle = call(
        &mut con,
        "TURNSTILE.SETTLE",
        &["customer", "5", "3", "3", "get"],
    );
    assert_eq!((same.0, same.1, same.2, same.3, same.4), (1, 0, 0, 10, 9));
    // 2 reserved, 12 used: 10 charged, 3 past the limit, owed for 3 × 6 minutes.
    let _: Check = call(&mut con, "TURNSTILE.CHECK", &["customer", "5", "2"]);
    let s: Settle = call(&mut con, "TURNSTILE.SETTLE", &["customer", "5", "2", "12"]);
    assert_eq!((s.0, s.1, s.2, s.3, s.4), (1, 10, 0, 10, 0));
    // 13 tokens to come back, the last 3 owed: full in 13 × 6 minutes.
    assert!(s.5 > 4_680_000 - 60_000 && s.5 <= 4_680_000, "{s:?}");
    let c: Check = call(&mut con, "TURNSTILE.CHECK", &["customer", "5"]);
    assert_eq!((c.0, c.5.as_deref()), (0, Some("tokens")));
    // The debt and the check's token: 4 × 6 minutes before the next is admitted.
    assert!(c.3 > 1_440_000 - 60_000 && c.3 <= 1_440_000, "{c:?}");
    // No rule for the key: nothing settled, no limit.
    let s: Settle = call(&mut con, "TURNSTILE.SETTLE", &["api_key", "k", "1", "5"]);
    assert_eq!(s, (0, 0, 0, -1, -1, 0));
    // In a transaction, queued then run.
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("TURNSTILE.CHECK")
        .arg("customer")
        .arg("6")
        .arg("5")
        .cmd("TURNSTILE.SETTLE")
        .arg("customer")
        .arg("6")
        .arg("5")
        .arg("2");
    let (c, s): (Check, Settle) = pipe.query(&mut con).unwrap();
    assert_eq!((c.0, c.2), (1, 5));
    assert_eq!((s.0, s.2, s.4), (1, 3, 8));
    for (args, want) in [
        (
            &["customer", "5", "1"][..],
            "wrong number of arguments for 'turnstile.settle' command",
        ),
        (
            &["customer", "5", "1", "2", "get", "x"][..],
            "wrong number of arguments",
        ),
        (&["customer", "5", "-1", "2"][..], "must be positive"),
        (&["customer", "5", "1", "-2"][..], "must be positive"),
        (&["customer", "5", "1", "x"][..], "not an integer"),
        (
            &["customer", "5", "1", "2", "urgent"][..],
            "unknown priority",
        ),
        (&["planet", "5", "1", "2"][..], "unknown key class `planet`"),
        (
            &["customer", "user:5", "1", "2"][..],
            "is not a customer id",
        ),
    ] {
        let e = error(&mut con, "TURNSTILE.SETTLE", args);
        assert!(e.contains(want), "{args:?}: {e}");
    }
    // COMMAND knows it (redis-cli's hints).
    let info: redis::Value = call(&mut con, "COMMAND", &["INFO", "TURNSTILE.SETTLE"]);
    assert!(format!("{info:?}").contains("turnstile.settle"), "{info:?}");
    stop(r);
    let r = server(None, |_| {});
    let e = error(
        &mut resp(&r),
        "TURNSTILE.SETTLE",
        &["customer", "1", "1", "2"],
    );
    assert!(e.contains("no rules loaded"), "{e}");
    stop(r);
}

/// `POST /v1/settle`: the same answers as RESP's, as JSON; 400 with what is wrong for a body
/// that is not a settle; the debt seen by `POST /v1/check`; 503 without rules.
#[test]
fn settle_over_http() {
    let one = "[[rule]]\nname = \"tokens\"\nkey = \"customer\"\nlimits = [{ algorithm = \"token_bucket\", limit = 10, window = \"1h\" }]\n";
    let r = server(Some(rules_file("http", one)), |_| {});
    let url = |p: &str| format!("http://{}{p}", r.http);
    let (status, body) = curl(
        "POST",
        &url("/v1/check"),
        Some(r#"{"key_class":"customer","key":"7","cost":4}"#),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = curl(
        "POST",
        &url("/v1/settle"),
        Some(r#"{"key_class":"customer","key":"7","reserved":4,"actual":1}"#),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"settled": 1, "charged": 0, "given_back": 3,
            "limit": 10, "remaining": 9, "reset_after_ms": v["reset_after_ms"]})
    );
    let reset = v["reset_after_ms"].as_i64().unwrap();
    assert!(reset > 300_000 && reset <= 360_000, "{body}");
    // Charged past the limit: a debt that the next check is denied for.
    let (status, body) = curl(
        "POST",
        &url("/v1/settle"),
        Some(
            r#"{"key_class":"customer","key":"7","reserved":1,"actual":12,"route":"/x","method":"GET","priority":"get"}"#,
        ),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&v["charged"], &v["remaining"]),
        (&serde_json::json!(11), &serde_json::json!(0)),
        "{body}"
    );
    let (status, body) = curl(
        "POST",
        &url("/v1/check"),
        Some(r#"{"key_class":"customer","key":"7"}"#),
    );
    assert_eq!(status, 429, "{body}");
    for (bad, want) in [
        ("not json", "invalid JSON body"),
        (
            r#"{"key_class":"customer","key":"7","reserved":1}"#,
            "missing field `actual`",
        ),
        (
            r#"{"key_class":"customer","key":"7","reserved":-1,"actual":1}"#,
            "invalid value",
        ),
        (
            r#"{"key_class":"customer","key":"7","cost":1,"reserved":1,"actual":1}"#,
            "unknown field `cost`",
        ),
        (
            r#"{"key_class":"planet","key":"7","reserved":1,"actual":1}"#,
            "unknown key class `planet`",
        ),
        (
            r#"{"key_class":"customer","key":"7","reserved":1,"actual":1,"priority":"urgent"}"#,
            "priority",
        ),
    ] {
        let (status, body) = curl("POST", &url("/v1/settle"), Some(bad));
        assert_eq!(status, 400, "{bad}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let e = v["error"].as_str().unwrap();
        assert!(e.contains(want), "{bad}: {e}");
    }
    let (status, _) = curl("GET", &url("/v1/settle"), None);
    assert_eq!(status, 405);
    let (_, body) = curl("GET", &url("/metrics"), None);
    assert!(body.contains("turnstile_settles_total 2"), "{body}");
    stop(r);
    let r = server(None, |_| {});
    let (status, body) = curl(
        "POST",
        &format!("http://{}/v1/settle", r.http),
        Some(r#"{"key_class":"customer","key":"7","reserved":1,"actual":2}"#),
    );
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no rules loaded"), "{body}");
    stop(r);
}
