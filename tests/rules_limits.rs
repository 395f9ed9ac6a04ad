//! Keys' own limits in the rules engine (`[limits.NAME]`, `limits_from`): the precedence (the
//! key's entry, then the rule's override, then the rule's limits), plans, files (CSV and JSON
//! Lines, a bad line refused at `file:line` with the entries kept, re-read when changed and on
//! reload), live changes, a plan redefined on reload, state carried over a change of plan, a
//! source that has not cached a key, and the validation of classes and rules.

mod common;

use common::{admitted, engine, S};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use turnstile::rules::limits::{KeyLimit, LimitsSource, Lookup};
use turnstile::rules::{Engine, Request, Rules};
use turnstile::{Algorithm, Limit, LimitSpec, ManualClock, Outcome};

/// A scratch file, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("turnstile-limits-{}-{}", std::process::id(), name));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        Self(p)
    }
    fn path(&self) -> String {
        self.0.display().to_string()
    }
    fn write(&self, text: &str) {
        // A new length (or a later modified time) marks the file as changed.
        let mut f = std::fs::File::create(&self.0).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(d) = self.0.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn rules(file: Option<&str>) -> String {
    let file = file.map_or(String::new(), |f| format!("file = {f:?}\n"));
    format!(
        r#"
[limits.customers]
key = "customer"
algorithm = "fixed_window"
window = "1m"
{file}
[limits.customers.plans]
free = {{ limit = 2 }}
pro = {{ limit = 10 }}

[[rule]]
name = "api"
key = "customer"
limits_from = "customers"
limits = [{{ algorithm = "fixed_window", limit = 5, window = "1m" }}]

[[rule.override]]
key = "7"
limits = [{{ algorithm = "fixed_window", limit = 3, window = "1m" }}]

[[rule.override]]
key = "8"
limits = [{{ algorithm = "fixed_window", limit = 3, window = "1m" }}]
"#
    )
}

/// The key's own entry, then the rule's override, then the rule's limits.
#[test]
fn a_keys_own_entry_comes_first_then_the_override_then_the_rule() {
    let f = TempFile::new("a.csv", "key,plan\n1,free\n2,pro\n7,pro\n9,4/1m\n");
    let (e, _) = engine(&rules(Some(&f.path())));
    let n = |c: u64| admitted(&e, &Request::new().customer(c), 20);
    assert_eq!(n(1), 2, "plan free");
    assert_eq!(n(2), 10, "plan pro");
    assert_eq!(n(7), 10, "its own entry (pro) before its override (3)");
    assert_eq!(n(8), 3, "the override");
    assert_eq!(n(9), 4, "a limit of its own");
    assert_eq!(n(42), 5, "the rule's limits");
    let d = e.check(&Request::new().customer(2));
    assert_eq!((d.outcome, d.limit), (Outcome::Limited, 10));
}

/// Live changes through the class's source: set, read back, remove; checks follow at once,
/// and the key's count carries over (a fixed window's count against the new limit).
#[test]
fn entries_change_live_and_the_count_carries_over() {
    let (e, _) = engine(&rules(None));
    let src = e.limits("customers").unwrap();
    let id = e.limits_key_id("customers", "42").unwrap();
    let c = Request::new().customer(42);
    assert_eq!(admitted(&e, &c, 3), 3, "the rule's 5");
    src.set(id, &KeyLimit::Plan("free".into())).unwrap();
    assert_eq!(src.entry(id), Some(KeyLimit::Plan("free".into())));
    assert!(!e.check(&c).allowed(), "3 counted, free allows 2");
    src.set(id, &KeyLimit::Plan("pro".into())).unwrap();
    assert_eq!(admitted(&e, &c, 20), 7, "pro's 10 less the 3 counted");
    assert!(src.remove(id).unwrap());
    assert!(!src.remove(id).unwrap());
    assert_eq!(src.entry(id), None);
    assert!(!e.check(&c).allowed(), "the rule's 5, 10 counted");
    let err = src.set(id, &KeyLimit::Plan("gold".into())).unwrap_err();
    assert!(
        err.to_string()
            .contains("no plan `gold`; its plans: free, pro"),
        "{err}"
    );
    let spec = LimitSpec::new(Algorithm::FixedWindow, 5, Duration::from_secs(1));
    let err = src.set(id, &KeyLimit::Limit(spec)).unwrap_err();
    assert!(err.to_string().contains("counts in windows of 1m"), "{err}");
    assert!(e.limits_key_id("customers", "not a number").is_err());
    assert!(e.limits_key_id("nope", "1").is_err());
}

/// A file with a bad line is refused with `file:line`, at load (the engine is not built) and
/// on a re-read (the entries stay); a good change is picked up by `refresh_limits`.
#[test]
fn a_bad_line_is_refused_at_its_line_and_the_entries_stay() {
    let bad = TempFile::new("bad.csv", "1,free\n2,gold\n");
    let text = rules(Some(&bad.path()));
    let r = Rules::parse(&text, "test.toml").unwrap();
    let err = Engine::builder(r).build().err().unwrap().to_string();
    assert!(err.starts_with(&format!("{}:2:", bad.path())), "{err}");
    assert!(err.contains("no plan `gold`"), "{err}");

    let f = TempFile::new("b.csv", "1,free\n");
    let (e, _) = engine(&rules(Some(&f.path())));
    let c1 = Request::new().customer(1);
    let c3 = Request::new().customer(3);
    assert_eq!(admitted(&e, &c1, 10), 2);
    f.write("1,free\n3,pro\n3 4,free\n");
    let out = e.refresh_limits();
    let err = out[0].1.as_ref().unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:3:", f.path())), "{err}");
    assert_eq!(admitted(&e, &c3, 20), 5, "the old entries: none for 3");
    // Refused as it is: not read again until it changes. A good file of the same length and
    // modified time is not seen; the same refusal is answered.
    let mtime = std::fs::metadata(f.path()).unwrap().modified().unwrap();
    f.write("1,free\n3,pro\n444,free\n");
    std::fs::File::options()
        .write(true)
        .open(f.path())
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let again = e.refresh_limits()[0].1.as_ref().unwrap_err().to_string();
    assert_eq!(again, err);
    f.write("1,free\n3,pro\n");
    let out = e.refresh_limits();
    assert_eq!(out[0].1.as_ref().unwrap().as_ref().unwrap().entries, 2);
    assert_eq!(admitted(&e, &c3, 20), 5, "pro's 10 less the 5 counted");
    assert!(
        e.refresh_limits()[0].1.as_ref().unwrap().is_none(),
        "unchanged"
    );
}

/// JSON Lines, with the notes' field names.
#[test]
fn json_lines_entries() {
    let f = TempFile::new(
        "c.jsonl",
        concat!(
            "{\"key\": \"1\", \"plan\": \"pro\"}\n",
            "{\"key\": 2, \"limit\": 4}\n",
            "{\"key\": \"3\", \"capacity\": 6, \"time_window_sec\": 60}\n",
        ),
    );
    let (e, _) = engine(&rules(Some(&f.path())));
    let n = |c: u64| admitted(&e, &Request::new().customer(c), 20);
    assert_eq!((n(1), n(2), n(3)), (10, 4, 6));
    let bad = TempFile::new(
        "d.jsonl",
        "{\"key\": \"1\", \"plan\": \"pro\", \"limit\": 3}\n",
    );
    let err = Engine::builder(Rules::parse(&rules(Some(&bad.path())), "t").unwrap())
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains(":1:") && err.contains("not both"), "{err}");
}

/// A plan redefined on reload: its keys follow, their state kept; a file changed since is
/// re-read by the reload.
#[test]
fn a_reload_redefines_plans_and_rereads_the_file() {
    let f = TempFile::new("e.csv", "1,free\n");
    let (e, _) = engine(&rules(Some(&f.path())));
    let c1 = Request::new().customer(1);
    assert_eq!(admitted(&e, &c1, 10), 2);
    let text = rules(Some(&f.path())).replace("free = { limit = 2 }", "free = { limit = 4 }");
    e.reload(Rules::parse(&text, "test.toml").unwrap()).unwrap();
    assert_eq!(admitted(&e, &c1, 10), 2, "free is 4 now, 2 counted");
    f.write("1,pro\n");
    e.reload(Rules::parse(&text, "test.toml").unwrap()).unwrap();
    assert_eq!(admitted(&e, &c1, 20), 6, "pro's 10 less the 4 counted");
}

/// A source in front of a remote store answers `Unknown` for a key it has not cached: that
/// request gets the rule's limits.
#[test]
fn a_key_not_cached_gets_the_rules_limits() {
    struct Cache;
    impl LimitsSource for Cache {
        fn get(&self, id: u64) -> Lookup {
            if id == 1 {
                Lookup::Own(Limit::fixed_window(9, Duration::from_secs(60)).unwrap())
            } else {
                Lookup::Unknown
            }
        }
        fn entry(&self, _: u64) -> Option<KeyLimit> {
            None
        }
        fn set(&self, _: u64, _: &KeyLimit) -> Result<(), turnstile::rules::limits::LimitsError> {
            Ok(())
        }
        fn remove(&self, _: u64) -> Result<bool, turnstile::rules::limits::LimitsError> {
            Ok(false)
        }
        fn len(&self) -> u64 {
            1
        }
        fn bytes(&self) -> usize {
            0
        }
        fn export(&self, _: &mut dyn FnMut(u64, &KeyLimit)) {}
        fn reclass(
            &self,
            _: &turnstile::rules::limits::LimitsClass,
        ) -> Result<(), turnstile::rules::limits::LimitsError> {
            Ok(())
        }
    }
    let r = Rules::parse(&rules(None), "test.toml").unwrap();
    let e = Engine::builder(r)
        .seed(7)
        .limits_source("customers", Arc::new(Cache))
        .build_with_clock(Arc::new(ManualClock::new(1000 * S)))
        .unwrap();
    assert_eq!(admitted(&e, &Request::new().customer(1), 20), 9);
    assert_eq!(admitted(&e, &Request::new().customer(2), 20), 5);
}

/// What a rules file may not say about classes, each refused where it is written.
#[test]
fn classes_and_rules_that_cannot_work_are_refused() {
    let base = rules(None);
    let err = |text: &str| Rules::parse(text, "t.toml").unwrap_err().to_string();
    let e = err(&base.replace("limits_from = \"customers\"", "limits_from = \"clients\""));
    assert!(e.contains("no limits class `clients`"), "{e}");
    let e = err(&base.replace(
        "key = \"customer\"\nlimits_from",
        "key = \"ip\"\nlimits_from",
    ));
    assert!(e.contains("holds customer keys"), "{e}");
    let e = err(&base.replace("name = \"api\"", "name = \"api\"\nmode = \"soft\""));
    assert!(e.contains("hard and shadow rules"), "{e}");
    let e = err(&base.replace("window = \"1m\"\n\n", "\n"));
    assert!(e.contains("window = "), "{e}");
    let e = err(&base.replace(
        "free = { limit = 2 }",
        "free = { limit = 2, window = \"1s\" }",
    ));
    assert!(
        e.contains("plan `free`") && e.contains("windows of 1m"),
        "{e}"
    );
    let e = err(&base.replace(
        "limits = [{ algorithm = \"fixed_window\", limit = 5, window = \"1m\" }]",
        "limits = [{ algorithm = \"sliding_window\", limit = 5, window = \"1m\" }]",
    ));
    assert!(e.contains("default of class `customers`"), "{e}");
    let e = err(&base.replace(
        "algorithm = \"fixed_window\"\nwindow",
        "algorithm = \"sliding_log\"\nwindow",
    ));
    assert!(e.contains("packed"), "{e}");
}

/// `redis = "URL"`: read as text (the server gives the class its source); refused with a file,
/// a key other than customer, or something that is not a Redis URL, at the `redis` line.
#[test]
fn a_class_in_redis() {
    let with = |extra: &str| {
        rules(None).replace(
            "window = \"1m\"\n\n",
            &format!("window = \"1m\"\n{extra}\n"),
        )
    };
    let r = Rules::parse(&with("redis = \"redis://127.0.0.1:6379\""), "t.toml").unwrap();
    assert_eq!(
        r.classes[0].redis.as_deref(),
        Some("redis://127.0.0.1:6379")
    );
    let err = |text: &str| Rules::parse(text, "t.toml").unwrap_err().to_string();
    let e = err(&with("redis = \"127.0.0.1:6379\""));
    assert!(
        e.contains("not a Redis URL") && e.starts_with("t.toml:6:"),
        "{e}"
    );
    let e = err(&with("redis = \"redis://h\"\nfile = \"x.csv\""));
    assert!(e.contains("in a file or in Redis, not both"), "{e}");
    let e = err(&with("redis = \"redis://h\"").replace(
        "key = \"customer\"\nalgorithm",
        "key = \"api_key\"\nalgorithm",
    ));
    assert!(e.contains("keyed by customer ids"), "{e}");
}

/// A token bucket class: a key upgraded keeps its TAT (redis-cell's rule).
#[test]
fn a_bucket_keeps_its_tat_across_plans() {
    let (e, _) = engine(
        r#"
[limits.keys]
key = "api_key"
algorithm = "token_bucket"
plans.small = { limit = 10, window = "60s", burst = 3 }
plans.large = { limit = 10, window = "60s", burst = 6 }

[[rule]]
name = "throttle"
key = "api_key"
limits_from = "keys"
limits = [{ algorithm = "token_bucket", limit = 1, window = "1s" }]
"#,
    );
    let src = e.limits("keys").unwrap();
    let id = e.limits_key_id("keys", "m").unwrap();
    src.set(id, &KeyLimit::Plan("small".into())).unwrap();
    let m = Request::new().api_key("m");
    assert_eq!(admitted(&e, &m, 10), 3);
    src.set(id, &KeyLimit::Plan("large".into())).unwrap();
    let d = e.check(&m);
    assert!(d.allowed());
    assert_eq!((d.limit, d.remaining, d.reset_after_ns), (6, 2, 24 * S));
}

/// The compact map: at most 24 bytes per key with an entry.
#[test]
fn a_plan_entry_costs_at_most_24_bytes() {
    let n = 200_000u64;
    let text = rules(None).replace(
        "window = \"1m\"\n\n",
        &format!("window = \"1m\"\ncapacity = {n}\n\n"),
    );
    let (e, _) = engine(&text);
    let src = e.limits("customers").unwrap();
    for k in 0..n {
        let plan = if k % 2 == 0 { "free" } else { "pro" };
        src.set(k, &KeyLimit::Plan(plan.into())).unwrap();
    }
    let per = src.bytes() as f64 / n as f64;
    assert!(per <= 24.0, "{per} bytes per entry");
    assert_eq!(src.len(), n);
    let err = src.set(n, &KeyLimit::Plan("free".into())).unwrap_err();
    assert!(err.to_string().contains("raise `capacity`"), "{err}");
}

/// examples/rules-limits.toml and its examples/limits.csv (read from the rules file's
/// directory) load, and answer as their comments say.
#[test]
fn the_example_loads() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules-limits.toml");
    let r = Rules::from_file(path).unwrap_or_else(|e| panic!("{e}"));
    let e = Engine::builder(r)
        .seed(7)
        .build_with_clock(Arc::new(ManualClock::new(1000 * S)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(e.limits("customers").unwrap().len(), 4);
    let n = |c: u64, max: usize| admitted(&e, &Request::new().customer(c), max);
    assert_eq!(n(241_531, 300), 200, "pro: a burst of 200");
    assert_eq!(n(241_532, 300), 20, "free");
    assert_eq!(n(42, 300), 10, "its own 5/1s burst=10");
    assert_eq!(n(1, 3000), 2000, "its entry before its override");
    assert_eq!(n(7, 300), 5, "the rule's own");
}

/// One step of [`live_changes_match_the_model`].
#[derive(Clone, Debug)]
enum Step {
    /// Key `k` on a plan (`free` 2, `pro` 10) or a limit of its own.
    Set(u64, Option<&'static str>, u64),
    Remove(u64),
    Check(u64),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        (
            0..4u64,
            prop_oneof![Just(Some("free")), Just(Some("pro")), Just(None)],
            1..8u64
        )
            .prop_map(|(k, p, n)| Step::Set(k, p, n)),
        (0..4u64).prop_map(Step::Remove),
        (0..4u64).prop_map(Step::Check),
        (0..4u64).prop_map(Step::Check),
    ]
}

proptest::proptest! {
    /// Differential, against a model of one fixed window per key: entries set and removed
    /// live decide the very next check of their key (the key's entry, else override 3 for
    /// keys 7 and 8 — not drawn here — else the rule's 5), and the count carries over.
    #[test]
    fn live_changes_match_the_model(steps in proptest::collection::vec(step(), 1..60)) {
        let (e, _) = engine(&rules(None));
        let src = e.limits("customers").unwrap();
        let mut entry = [None::<u64>; 4];
        let mut count = [0u64; 4];
        for s in steps {
            match s {
                Step::Set(k, plan, n) => {
                    let id = e.limits_key_id("customers", &k.to_string()).unwrap();
                    let (l, limit) = match plan {
                        Some(p) => (KeyLimit::Plan(p.into()), if p == "free" { 2 } else { 10 }),
                        None => {
                            let w = Duration::from_secs(60);
                            (KeyLimit::Limit(LimitSpec::new(Algorithm::FixedWindow, n, w)), n)
                        }
                    };
                    src.set(id, &l).unwrap();
                    entry[k as usize] = Some(limit);
                }
                Step::Remove(k) => {
                    let id = e.limits_key_id("customers", &k.to_string()).unwrap();
                    let had = src.remove(id).unwrap();
                    proptest::prop_assert_eq!(had, entry[k as usize].is_some());
                    entry[k as usize] = None;
                }
                Step::Check(k) => {
                    let limit = entry[k as usize].unwrap_or(5);
                    let d = e.check(&Request::new().customer(k));
                    let fits = count[k as usize] < limit;
                    proptest::prop_assert_eq!(d.allowed(), fits, "key {} limit {}", k, limit);
                    proptest::prop_assert_eq!(d.limit, limit);
                    if fits {
                        count[k as usize] += 1;
                    }
                }
            }
        }
    }
}
