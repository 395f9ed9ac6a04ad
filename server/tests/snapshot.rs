//! Snapshots of the rules engine's stores across a restart of the server in process: every
//! rule's records come back (a packed store, an arena store of two limits, an override, an
//! elastic pool), a rule changed between snapshot and restart starts empty while the others
//! keep their state, and a corrupt file restores nothing. The `redis` crate as the client.

use std::path::Path;
use std::time::Duration;
use turnstile_server::{start, Running, ServeArgs};

const RULES: &str = r#"
[[rule]]
name = "per-customer"
key = "customer"
limits = [{ algorithm = "token_bucket", limit = 10, window = "1h" }]
[[rule.override]]
key = 42
limits = [{ algorithm = "fixed_window", limit = 3, window = "1h" }]

[[rule]]
name = "per-key"
key = "api_key"
limits = [
  { algorithm = "sliding_log", limit = 8, window = "1h" },
  { algorithm = "window_ring", limit = 20, window = "1d" },
]
"#;

fn server(rules: &Path, snap: &Path) -> Running {
    let mut a = ServeArgs::new();
    a.resp = "127.0.0.1:0".parse().unwrap();
    a.http = "127.0.0.1:0".parse().unwrap();
    a.workers = Some(1);
    a.throttle_keys = 1000;
    a.rules = Some(rules.to_path_buf());
    a.snapshot = Some(snap.to_path_buf());
    a.snapshot_every = Duration::ZERO;
    start(a).expect("server starts")
}

type Reply = (i64, i64, i64, i64, i64, Option<String>);

fn call(r: &Running, cmd: &str, class: &str, key: &str) -> Reply {
    let client = redis::Client::open(format!("redis://{}/", r.resp)).unwrap();
    let mut con = client.get_connection().unwrap();
    redis::cmd(cmd).arg(class).arg(key).query(&mut con).unwrap()
}

/// Remaining for each key, by PEEK.
fn remaining(r: &Running) -> [i64; 4] {
    [
        call(r, "TURNSTILE.PEEK", "customer", "1").2,
        call(r, "TURNSTILE.PEEK", "customer", "42").2,
        call(r, "TURNSTILE.PEEK", "api_key", "a").2,
        call(r, "TURNSTILE.PEEK", "api_key", "b").2,
    ]
}

fn stop(r: Running) {
    r.stop();
    r.join().unwrap();
}

#[test]
fn rule_stores_survive_a_restart_matched_by_rule_identity() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    let snap = dir.path().join("state.snap");
    std::fs::write(&rules, RULES).unwrap();
    let r = server(&rules, &snap);
    for (class, key, n) in [
        ("customer", "1", 4),
        ("customer", "42", 2),
        ("api_key", "a", 5),
        ("api_key", "b", 9),
    ] {
        for _ in 0..n {
            call(&r, "TURNSTILE.CHECK", class, key);
        }
    }
    // The token bucket refills 10 an hour: nothing in the time of this test.
    let want = [6, 1, 3, 0];
    assert_eq!(remaining(&r), want);
    stop(r);

    // The same rules: every store's state is back.
    let r = server(&rules, &snap);
    assert_eq!(remaining(&r), want);
    stop(r);

    // The sliding log's limit changed: that rule starts empty (its records are not read
    // under other limits), the customer rule keeps its state.
    std::fs::write(&rules, RULES.replace("limit = 8,", "limit = 9,")).unwrap();
    let r = server(&rules, &snap);
    assert_eq!(remaining(&r), [6, 1, 9, 9]);
    stop(r);

    // A corrupt file restores nothing (and the server starts).
    let mut b = std::fs::read(&snap).unwrap();
    let last = b.len() - 1;
    b[last] ^= 1;
    std::fs::write(&snap, &b).unwrap();
    let r = server(&rules, &snap);
    assert_eq!(remaining(&r), [10, 3, 9, 9]);
    stop(r);
}

/// A snapshot path the server cannot write (a missing directory, a directory) is refused at
/// start, not found out at the first snapshot, minutes later.
#[test]
fn an_unwritable_snapshot_path_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [dir.path().join("missing/snap"), dir.path().to_path_buf()] {
        let mut a = ServeArgs::new();
        a.resp = "127.0.0.1:0".parse().unwrap();
        a.http = "127.0.0.1:0".parse().unwrap();
        a.workers = Some(1);
        a.snapshot = Some(bad.clone());
        match start(a) {
            Err(e) => {
                let m = e.to_string();
                assert!(
                    m.starts_with("--snapshot ") && m.contains("cannot write"),
                    "{m}"
                );
            }
            Ok(_) => panic!("{}: started", bad.display()),
        }
    }
    // A writable one starts, and leaves no temporary file behind.
    let mut a = ServeArgs::new();
    a.resp = "127.0.0.1:0".parse().unwrap();
    a.http = "127.0.0.1:0".parse().unwrap();
    a.workers = Some(1);
    a.snapshot = Some(dir.path().join("snap"));
    a.snapshot_every = Duration::ZERO;
    let r = start(a).expect("server starts");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    stop(r);
}
