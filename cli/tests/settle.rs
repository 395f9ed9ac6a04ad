//! Settling a reserved cost at the actual one against the built binary, as a user does it:
//! `turnstile serve --rules FILE` as a child process on free loopback ports, redis-cli sending
//! `TURNSTILE.CHECK` then `TURNSTILE.SETTLE`, curl sending `POST /v1/settle` — with the counts
//! in memory, and in a real redis-server (`[backend] redis`), with the same answers.

mod common;
use common::free_port;
// The one harness of the workspace's Redis tests (turnstile-redis's).
#[path = "../../redis/tests/common/mod.rs"]
mod redis_common;

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

const RULES: &str = "[[rule]]\nname = \"tokens\"\nkey = \"customer\"\nlimits = [{ algorithm = \"token_bucket\", limit = 10, window = \"1h\" }]\n";

/// redis-cli's output lines for one command.
fn cli(port: u16, args: &[&str]) -> Vec<String> {
    let o = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs (apt-get install redis-tools)");
    assert!(o.status.success(), "{o:?}");
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// curl POST with a JSON body: the status and the body.
fn post(port: u16, path: &str, body: &str) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-s", "-m", "10", "-w", "\n%{http_code}", "-X", "POST"])
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            body,
        ])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8(o.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

#[test]
fn settle_through_redis_cli_and_curl() {
    settle_scenario(RULES);
}

/// The same with the counts in Redis: every rule settled in one script call, a debt kept in
/// Redis (the next check, answered by Redis, denied), and the key's count in Redis after it.
#[test]
fn settle_with_the_redis_backend() {
    let redis = redis_common::Server::start();
    let rules = format!(
        "[backend]\nredis = \"{}\"\ntimeout = \"5s\"\nprefix = \"settle:\"\n\n{RULES}",
        redis.url()
    );
    settle_scenario(&rules);
    // The counts are Redis's: a key per rule and customer, under the prefix.
    let keys = redis.cli(&["--scan", "--pattern", "settle:*"]);
    assert!(keys.contains("settle:tokens"), "{keys}");
}

fn settle_scenario(rules_text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(&rules, rules_text).unwrap();
    let (resp, http) = (free_port(), free_port());
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--workers", "2", "--throttle-keys", "10000"])
        .args(["--resp", &format!("127.0.0.1:{resp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .arg("--rules")
        .arg(&rules)
        .env("RUST_LOG", "warn");
    let _server = common::spawn_listening(&mut cmd, &[resp, http]);

    // Reserved 4, used 1: 3 given back, 9 remaining.
    assert_eq!(
        cli(resp, &["TURNSTILE.CHECK", "customer", "5", "4"])[..3],
        ["1", "10", "6"]
    );
    let s = cli(resp, &["TURNSTILE.SETTLE", "customer", "5", "4", "1"]);
    assert_eq!(s[..5], ["1", "0", "3", "10", "9"], "{s:?}");
    // The same amount changes nothing.
    let s = cli(resp, &["TURNSTILE.SETTLE", "customer", "5", "2", "2"]);
    assert_eq!(s[..5], ["1", "0", "0", "10", "9"], "{s:?}");
    // Reserved 1, used 12: 11 charged, 2 owed past the limit, the next check denied.
    assert_eq!(cli(resp, &["TURNSTILE.CHECK", "customer", "5"])[0], "1");
    let s = cli(resp, &["TURNSTILE.SETTLE", "customer", "5", "1", "12"]);
    assert_eq!(s[..5], ["1", "11", "0", "10", "0"], "{s:?}");
    let c = cli(resp, &["TURNSTILE.CHECK", "customer", "5"]);
    assert_eq!((c[0].as_str(), c[5].as_str()), ("0", "tokens"), "{c:?}");
    let e = cli(resp, &["TURNSTILE.SETTLE", "customer", "5", "1"]);
    assert!(e[0].contains("wrong number of arguments"), "{e:?}");

    // Over HTTP: the same, as JSON.
    let (status, body) = post(
        http,
        "/v1/check",
        r#"{"key_class":"customer","key":"6","cost":5}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        http,
        "/v1/settle",
        r#"{"key_class":"customer","key":"6","reserved":5,"actual":3}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with(
            r#"{"settled":1,"charged":0,"given_back":2,"limit":10,"remaining":7,"reset_after_ms":"#
        ),
        "{body}"
    );
    let (status, body) = post(
        http,
        "/v1/settle",
        r#"{"key_class":"customer","key":"6","reserved":5}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("missing field `actual`"), "{body}");
}
