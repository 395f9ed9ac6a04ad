//! The rules engine under loom: a hot reload racing checks, and the load counters (requests
//! in flight, per rule counters) kept across it.
//!
//! The swap of compiled rules is an `arc_swap::ArcSwap`, which is not built on the crate's
//! `sync` shim: loom runs its loads and swaps as single steps, so what these models check is
//! the engine's own protocol around it — a reload hands an unchanged rule's store and
//! counters to the new rules (no admission lost or granted twice across it), and the sharded
//! in-flight counter and rule counters (loom atomics) lose no update.

#![cfg(loom)]

use loom::thread;
use std::sync::Arc;
use turnstile::rules::{Engine, Request, Rules};
use turnstile::ManualClock;

const S: u64 = 1_000_000_000;

/// Rule `steady` (limit 2 per hour, kept across reloads) and rule `churn` whose limit is `n`
/// (changed by each reload, so it gets a fresh store). Tiny capacities keep the model small.
fn text(n: u64) -> String {
    format!(
        r#"
[load]
max_in_flight = 4

[[rule]]
name = "steady"
key = "customer"
capacity = 2
limits = [{{ algorithm = "fixed_window", limit = 2, window = "1h" }}]

[[rule]]
name = "churn"
key = "customer"
match = {{ route_prefix = "/churn" }}
capacity = 2
limits = [{{ algorithm = "fixed_window", limit = {n}, window = "1h" }}]
"#
    )
}

fn engine() -> Arc<Engine<ManualClock>> {
    let rules = Rules::parse(&text(1), "loom.toml").unwrap();
    Arc::new(
        Engine::builder(rules)
            .seed(7)
            .build_with_clock(ManualClock::new(1000 * S))
            .unwrap(),
    )
}

/// Two threads admit one customer through rule `steady` (limit 2, one request already
/// counted), each holding its in-flight guard while a third thread reloads (changing `churn`
/// only). Exactly one of the two is admitted: the reload must hand `steady`'s store to the new
/// rules, not a fresh one (which would admit both) nor lose the first count. After the joins
/// nothing is in flight (every guard's exit matched its enter, on the shard it entered) and
/// `steady` counted exactly one denial.
#[test]
fn reload_keeps_an_unchanged_rules_state_and_counters() {
    loom::model(|| {
        let e = engine();
        let req = Request::new().customer(1);
        assert!(e.check(&req).allowed());
        let admit = |e: Arc<Engine<ManualClock>>| {
            move || {
                let r = Request::new().customer(1);
                match e.admit(&r) {
                    Ok(g) => {
                        assert!(e.in_flight() >= 1);
                        drop(g);
                        true
                    }
                    Err(_) => false,
                }
            }
        };
        let a = thread::spawn(admit(e.clone()));
        let b = thread::spawn(admit(e.clone()));
        let r = {
            let e = e.clone();
            thread::spawn(move || {
                let rep = e.reload_str(&text(2), "loom.toml").unwrap();
                assert_eq!(rep.kept, vec!["steady"]);
            })
        };
        let admitted = [a.join().unwrap(), b.join().unwrap()];
        r.join().unwrap();
        assert_eq!(admitted.iter().filter(|&&x| x).count(), 1, "{admitted:?}");
        assert_eq!(e.in_flight(), 0);
        assert_eq!(e.rule_stats("steady").unwrap().denied, 1);
        assert!(!e.check(&req).allowed());
        assert_eq!(e.rule_stats("steady").unwrap().denied, 2);
    });
}
