//! Snapshot support of the rules engine: every store's records exported
//! (`Engine::for_each_store`, `Store::export_records`) and imported into the stores of an
//! engine built with the same seed whose clock continues the timeline, matched by their
//! description; the restored engine then decides as the original does. A changed rule is
//! described differently. On a manual clock.

use std::collections::HashMap;
use std::sync::Arc;
use turnstile::rules::{Engine, Request, Rules};
use turnstile::{Clock, ManualClock};

const S: u64 = 1_000_000_000;

const RULES: &str = r#"
[load]
max_in_flight = 10

[[rule]]
name = "packed"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 5, window = "1m" }]
[[rule.override]]
key = 42
limits = [{ algorithm = "token_bucket", limit = 3, window = "1m" }]

[[rule]]
name = "log"
key = "ip"
limits = [{ algorithm = "sliding_log", limit = 4, window = "1m" }]

[[rule]]
name = "two"
key = "api_key"
limits = [
  { algorithm = "window_ring", limit = 6, window = "1m" },
  { algorithm = "sliding_window", limit = 20, window = "1h" },
]

[[rule]]
name = "elastic"
key = "route"
mode = "elastic"
elastic_percent = 50
limits = [{ algorithm = "leaky_bucket", limit = 4, window = "1m" }]
"#;

type E = Engine<Arc<ManualClock>>;

fn engine(text: &str, at: u64) -> (E, Arc<ManualClock>) {
    let rules = Rules::parse(text, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    let clock = Arc::new(ManualClock::new(at));
    let e = Engine::builder(rules)
        .seed(11)
        .build_with_clock(clock.clone())
        .unwrap();
    (e, clock)
}

type Dump = HashMap<String, Vec<(u64, Vec<u64>)>>;

fn export(e: &E) -> Dump {
    let mut d = Dump::new();
    e.for_each_store(|desc, store| {
        let mut recs = Vec::new();
        store.export_records(|id, w| {
            assert_eq!(w.len(), store.record_words());
            recs.push((id, w.to_vec()));
        });
        assert!(d.insert(desc.to_string(), recs).is_none(), "{desc} twice");
    });
    d
}

fn import(e: &E, d: &Dump, now: u64) -> usize {
    let mut n = 0;
    e.for_each_store(|desc, store| {
        for (id, w) in d.get(desc).into_iter().flatten() {
            assert!(store.import_record(*id, w, now));
            n += 1;
        }
    });
    n
}

fn requests() -> Vec<Request<'static>> {
    let mut v = Vec::new();
    for c in [1, 2, 42] {
        v.push(Request::new().customer(c));
    }
    for i in 1..=3u8 {
        v.push(Request::new().ip([10, 0, 0, i]));
    }
    // Six checks: the elastic rule's own 4 and 2 from its pool.
    v.push(Request::new().route("/a"));
    v.push(Request::new().api_key("k1"));
    v.push(Request::new().api_key("k2"));
    v
}

#[test]
fn restored_engine_decides_as_the_original() {
    let t0 = 1000 * S;
    let (a, clock) = engine(RULES, t0);
    a.report_utilization(0.1);
    // Some state everywhere: 0 to 6 checks per request, spread over 30 s.
    for (i, r) in requests().iter().enumerate() {
        for k in 0..(i % 7) {
            clock.set(t0 + (i as u64 * 7 + k as u64) * S / 2);
            a.check(r);
        }
    }
    let dump = export(&a);
    // Every store is described once; the override and the pool have their own stores.
    assert_eq!(dump.len(), 6, "{:?}", dump.keys());
    let records: usize = dump.values().map(Vec::len).sum();
    // customer 2 and 42, three IPs, the route in its rule's store and pool, api key k2.
    assert_eq!(records, 8);
    let now = clock.now();
    let (b, clock_b) = engine(RULES, now);
    b.report_utilization(0.1);
    assert_eq!(import(&b, &dump, now), records);
    // From here both see the same requests at the same times and answer alike.
    for step in 0..40u64 {
        let t = now + step * S;
        clock.set(t);
        clock_b.set(t);
        for r in requests() {
            assert_eq!(a.check(&r), b.check(&r), "step {step}, {r:?}");
        }
    }
}

#[test]
fn a_changed_rule_is_described_differently() {
    let (a, _) = engine(RULES, S);
    let (b, _) = engine(&RULES.replace("limit = 4, window", "limit = 5, window"), S);
    let descs = |e: &E| {
        let mut v = Vec::new();
        e.for_each_store(|d, _| v.push(d.to_string()));
        v
    };
    let (x, y) = (descs(&a), descs(&b));
    let changed: Vec<_> = x.iter().filter(|d| !y.contains(d)).collect();
    // The sliding log's rule and the elastic rule's own store changed (limit 4 in both; the
    // pool is 50 % of 4 or of 5, 2 either way); the others are the same.
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert!(changed
        .iter()
        .all(|d| d.contains("rule=\"log\"") || d.contains("rule=\"elastic\"")));
    // A store of other limits refuses records of the wrong length.
    let (c, _) = engine(RULES, S);
    c.for_each_store(|_, s| assert!(!s.import_record(1, &vec![0; s.record_words() + 1], S)));
}
