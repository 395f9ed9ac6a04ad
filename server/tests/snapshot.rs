//! Snapshots of the rules engine's stores across a restart of the server in process: every
//! rule's records come back (a packed store, an arena store of two limits, an override, an
//! elastic pool), a rule changed between snapshot and restart starts empty while the others
//! keep their state, and a corrupt file restores nothing. The `redis` crate as the client.

use std::path::Path;
use std::time::Duration;
use turnstile_server::snapshot::{self, Snapshot};
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

/// A snapshot of one `CL.THROTTLE` record, for the tests of the file itself.
fn small() -> Snapshot {
    Snapshot {
        seed: 7,
        written_ns: 1,
        throttle: vec![(1, u64::MAX / 2)],
        rules_now: 0,
        rules: vec![],
    }
}

/// Symbolic links planted beside the snapshot, pointing to a victim file: at the fixed name of
/// the temporary file older builds used, and at other plausible ones. The start-up check and
/// two snapshot writes (a new file, then over it) leave the victim as it was and the links
/// where they were, and the snapshot's path holds the snapshot as a regular file.
#[test]
fn links_planted_beside_the_snapshot_are_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let victim = elsewhere.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let snap = dir.path().join("state.snap");
    let planted = [
        ".state.snap.tmp",
        "state.snap.tmp",
        ".state.snap.tmp-0000000000000000",
        ".state.snap.swp",
        "state.snap.new",
        "state.snap~",
    ];
    for name in planted {
        std::os::unix::fs::symlink(&victim, dir.path().join(name)).unwrap();
    }
    snapshot::writable(&snap).expect("the directory is writable");
    snapshot::write(&snap, &small()).expect("written");
    snapshot::write(&snap, &small()).expect("written over");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n", "victim");
    let meta = std::fs::symlink_metadata(&snap).unwrap();
    assert!(meta.file_type().is_file(), "{:?}", meta.file_type());
    assert_eq!(snapshot::read(&snap).unwrap(), Some(small()));
    for name in planted {
        let link = std::fs::read_link(dir.path().join(name)).unwrap();
        assert_eq!(link, victim, "{name}");
    }
    // Nothing else: no temporary file left behind.
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        planted.len() + 1
    );
}

/// A link made at the snapshot's path on purpose (to keep the file on another disk) is
/// followed: the server restores its target and writes there, and the link stays. A corrupt
/// target is moved aside beside itself, and the next snapshot goes to the link's target again.
#[test]
fn a_link_at_the_snapshot_path_keeps_pointing_to_the_snapshot() {
    let top = tempfile::tempdir().unwrap();
    let (etc, disk) = (top.path().join("etc"), top.path().join("disk"));
    std::fs::create_dir(&etc).unwrap();
    std::fs::create_dir(&disk).unwrap();
    let rules = etc.join("rules.toml");
    std::fs::write(&rules, RULES).unwrap();
    let (snap, real) = (etc.join("state.snap"), disk.join("state.snap"));
    std::os::unix::fs::symlink("../disk/state.snap", &snap).unwrap();
    let is_link = |p: &Path| {
        std::fs::symlink_metadata(p)
            .unwrap()
            .file_type()
            .is_symlink()
    };
    let r = server(&rules, &snap);
    for _ in 0..4 {
        call(&r, "TURNSTILE.CHECK", "customer", "1");
    }
    stop(r);
    assert!(is_link(&snap));
    assert!(
        snapshot::read(&real).unwrap().is_some(),
        "written to the target"
    );
    let r = server(&rules, &snap);
    assert_eq!(remaining(&r)[0], 6, "restored from the target");
    stop(r);

    std::fs::write(&real, b"TSNP broken").unwrap();
    let r = server(&rules, &snap);
    assert_eq!(remaining(&r)[0], 10, "a corrupt target restores nothing");
    stop(r);
    assert!(is_link(&snap));
    let names: Vec<String> = std::fs::read_dir(&disk)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("state.snap.corrupt-")),
        "{names:?}"
    );
    assert!(snapshot::read(&real).unwrap().is_some(), "a fresh snapshot");
}
