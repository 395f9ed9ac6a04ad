//! `turnstile soak --kinds K`: each kind of attacker on HTTP/2, gRPC, the admin listener,
//! descriptors and credentials run alone for a few seconds against the built binary's
//! `turnstile serve` (a child process on free loopback ports, with every listener: RESP,
//! HTTP, gRPC with the example Envoy configuration, admin; a client and an admin password),
//! honest clients on RESP, HTTP and gRPC beside it. Checked: the soak completes and reports,
//! and the attack ran (its connections and its work counted). What the server did to it is
//! the soak's report, not asserted here.

use std::process::Command;
use std::time::Duration;

mod common;
use common::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
const ENVOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/envoy/");

/// The kinds, with the least work each must have counted in its 3 s (requests, streams,
/// guesses, PINGs, idle connections).
const KINDS: [(&str, u64); 9] = [
    ("slow-body", 4),
    // Streams: up to the server's 100 per connection.
    ("h2-streams", 50),
    ("json-big", 4),
    // Silent connections do nothing; their count is their connections.
    ("grpc-silent", 0),
    ("grpc-slow", 4),
    ("fd-hog", 8),
    ("unauth-holder", 4),
    ("auth-guess", 20),
    ("admin-nocreds", 8),
];

/// A server with every listener, killed when dropped.
struct Server {
    child: common::Running,
    ports: [u16; 4],
    dir: tempfile::TempDir,
}

fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("password"), "s3cret-client\n").unwrap();
    std::fs::write(dir.path().join("admin-password"), "s3cret-admin").unwrap();
    let ports = [free_port(), free_port(), free_port(), free_port()];
    let at = |p: u16| format!("127.0.0.1:{p}");
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--workers", "1", "--throttle-keys", "10000"])
        .args(["--rules", RULES, "--envoy-config", ENVOY])
        .arg("--requirepass-file")
        .arg(dir.path().join("password"))
        .arg("--admin-pass-file")
        .arg(dir.path().join("admin-password"))
        .args(["--resp", &at(ports[0]), "--http", &at(ports[1])])
        .args(["--grpc", &at(ports[2]), "--admin", &at(ports[3])])
        .env("RUST_LOG", "warn");
    let child = common::spawn_listening_logged(&mut cmd, &ports, &dir.path().join("server.log"));
    Server { child, ports, dir }
}

/// `turnstile soak --kinds kind` for 3 s (1 s quiet, 1 s settle): its JSON report, or what
/// went wrong.
fn soak(s: &Server, kind: &str) -> Result<serde_json::Value, String> {
    let at = |p: u16| format!("127.0.0.1:{p}");
    let d = s.dir.path();
    let (out, err) = (
        d.join(format!("{kind}.json")),
        d.join(format!("{kind}.err")),
    );
    let mut c = Command::new(BIN)
        .args(["soak", "--json", "--kinds", kind, "--connections", "12"])
        .args(["--seconds", "3", "--quiet", "1", "--settle", "1"])
        .args([
            "--honest-resp",
            "1",
            "--honest-http",
            "1",
            "--honest-grpc",
            "1",
        ])
        .args(["--target", &at(s.ports[0]), "--http", &at(s.ports[1])])
        .args(["--grpc", &at(s.ports[2]), "--admin", &at(s.ports[3])])
        .arg("--password-file")
        .arg(d.join("password"))
        .arg("--server-log")
        .arg(d.join("server.log"))
        .args(["--pid", &s.child.id().to_string()])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let status = common::wait_bounded(&mut c, Duration::from_secs(60))
        .ok_or("not done within 60 s (killed)")?;
    let said = std::fs::read_to_string(&err).unwrap_or_default();
    if !status.success() {
        return Err(format!("{status}: {said}"));
    }
    serde_json::from_slice(&std::fs::read(&out).unwrap())
        .map_err(|e| format!("not a JSON report ({e}): {said}"))
}

/// What is wrong with `kind`'s report `r` (nothing: `None`).
fn wrong(kind: &str, least: u64, r: &serde_json::Value) -> Option<String> {
    let attacks = r["attacks"].as_array()?;
    let [a] = &attacks[..] else {
        return Some(format!("{} kinds ran: {attacks:?}", attacks.len()));
    };
    let n = |k: &str| a[k].as_u64().unwrap_or(0);
    if a["flag"] != kind || n("tasks") != 12 {
        return Some(format!("not the 12 attackers asked for: {a}"));
    }
    if n("connections") == 0 || n("ops") < least {
        return Some(format!("did not run (at least {least} ops wanted): {a}"));
    }
    let targets: Vec<&str> = r["targets"]
        .as_array()?
        .iter()
        .filter_map(|t| t["target"].as_str())
        .collect();
    for t in [
        "honest gRPC ShouldRateLimit p99 under attack <= 10 ms",
        "server descriptors back to idle after the settle",
        "server log lines per second per kind of message <= 10",
        "no honest errors",
    ] {
        if !targets.contains(&t) {
            return Some(format!("no target `{t}` in {targets:?}"));
        }
    }
    None
}

/// Each kind alone: the soak completes, and the attack ran.
#[test]
fn each_new_kind_of_attacker_runs_alone_against_the_real_server() {
    let s = start();
    let mut failed = Vec::new();
    for (kind, least) in KINDS {
        match soak(&s, kind) {
            Err(e) => failed.push(format!("{kind}: {e}")),
            Ok(r) => {
                if let Some(e) = wrong(kind, least, &r) {
                    failed.push(format!("{kind}: {e}"));
                }
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
