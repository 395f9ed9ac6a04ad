//! `turnstile serve` spoken to by Redis clients nobody here wrote, as applications use them:
//! redis-py (RESP2 and RESP3; its default pipeline is a MULTI/EXEC transaction) and ioredis
//! (`multi()`, `pipeline()`). The scripts are in server/tests/clients/; their interpreters
//! come from `cargo xtask test` (TURNSTILE_TEST_PYTHON, TURNSTILE_TEST_NODE_PATH). A missing
//! client library fails the test with what to run, never skips it.

mod common;
use common::free_port;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/tests/clients")
}

/// A path from an environment variable (relative: from the workspace root), or `default`.
fn from_env(var: &str, default: &str) -> PathBuf {
    match std::env::var_os(var) {
        None => default.into(),
        Some(p) => {
            let p = PathBuf::from(p);
            if p.is_relative() && p.components().count() > 1 {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
            } else {
                p
            }
        }
    }
}

/// `turnstile serve`, killed when dropped (also on a failed assertion).
struct Server {
    _child: common::Running,
    resp: u16,
}

fn start(extra: &[&str]) -> Server {
    let resp = free_port();
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--workers", "1", "--throttle-keys", "1000"])
        .args(["--resp", &format!("127.0.0.1:{resp}")])
        .args(["--http", &format!("127.0.0.1:{}", free_port())])
        .args(extra)
        .env("RUST_LOG", "warn");
    let child = common::spawn_listening(&mut cmd, &[resp]);
    Server {
        _child: child,
        resp,
    }
}

/// Runs a client script; its one JSON line.
fn run(c: &mut Command, what: &str) -> Value {
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}; run `cargo xtask test`"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn redis_py(port: u16, proto: u8, password: Option<&str>) -> Value {
    let python = from_env("TURNSTILE_TEST_PYTHON", "python3");
    let mut c = Command::new(&python);
    c.arg(clients().join("redis_py.py"))
        .args([port.to_string(), proto.to_string()])
        .args(password);
    run(&mut c, &format!("redis-py under {}", python.display()))
}

#[test]
fn redis_py_pipelines_and_transactions() {
    let s = start(&[]);
    for proto in [2, 3] {
        let v = redis_py(s.resp, proto, None);
        assert_eq!(v["ping"], true);
        // The default (transactional) pipeline: MULTI, the commands, EXEC — as against Redis.
        assert_eq!(
            v["transaction"],
            json!([[0, 6, 5, -1, 6], [0, 6, 4, -1, 12], true]),
            "{v}"
        );
        assert_eq!(v["pipeline"], json!([[0, 6, 3, -1, 18], "hi"]), "{v}");
        // A command unknown at queue time aborts the transaction: nothing of it ran.
        let bad = v["transaction_bad"]["message"].as_str().unwrap_or_default();
        assert!(bad.contains("unknown command 'NO.SUCH.COMMAND'"), "{v}");
        assert_eq!(v["after_bad"], json!([0, 6, 6, -1, 0]), "{v}");
        // Outside a transaction each command answers on its own.
        assert_eq!(v["pipeline_bad"][0], json!([0, 6, 5, -1, 6]), "{v}");
        assert_eq!(v["pipeline_bad"][1]["error"], "ResponseError", "{v}");
        assert_eq!(v["pipeline_bad"][2], true, "{v}");
        // CLIENT INFO parses as redis-py parses Redis's; SETNAME, INFO server, AUTH default.
        assert_eq!(v["client_info"]["lib-name"], "redis-py", "{v}");
        assert_eq!(v["client_info"]["resp"], proto.to_string(), "{v}");
        assert_eq!(v["client_getname"], "app-1", "{v}");
        let server = v["info_server"].as_array().unwrap();
        assert!(server.contains(&json!("redis_version")), "{v}");
        assert!(!server.contains(&json!("connected_clients")), "{v}");
        assert_eq!(v["auth_default"], true, "{v}");
    }
}

#[test]
fn redis_py_with_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, "s3cret").unwrap();
    let s = start(&["--requirepass-file", pass.to_str().unwrap()]);
    let v = redis_py(s.resp, 3, Some("s3cret"));
    assert_eq!(
        v["transaction"],
        json!([[0, 6, 5, -1, 6], [0, 6, 4, -1, 12], true]),
        "{v}"
    );
    let v = redis_py(s.resp, 2, None);
    assert_eq!(v["ping"]["error"], "AuthenticationError", "{v}");
}

#[test]
fn ioredis_multi_and_pipeline() {
    let s = start(&[]);
    let node_path = from_env("TURNSTILE_TEST_NODE_PATH", "node_modules");
    let v = run(
        Command::new("node")
            .arg(clients().join("ioredis.js"))
            .arg(s.resp.to_string())
            .env("NODE_PATH", &node_path),
        &format!("ioredis (NODE_PATH={})", node_path.display()),
    );
    assert_eq!(
        v["multi"],
        json!([[null, [0, 6, 5, -1, 6]], [null, [0, 6, 4, -1, 12]]]),
        "{v}"
    );
    assert_eq!(
        v["pipeline"],
        json!([[null, [0, 6, 3, -1, 18]], [null, "PONG"]]),
        "{v}"
    );
    assert!(
        v["multi_bad"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("EXECABORT"),
        "{v}"
    );
    assert_eq!(v["after_bad"], json!([0, 6, 6, -1, 0]), "{v}");
}
