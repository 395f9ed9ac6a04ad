//! The runnable example as a user runs it: `tower/examples/axum.rs` started as its own process
//! on a free loopback port with `tower/examples/rules.toml`, driven by a real HTTP client:
//! ten requests a minute per client IP, the 11th a 429 naming the rule that denied it, a 503
//! while the server sheds load, and clear errors for a wrong flag or a broken rules file.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The example's binary, built beside this test (`cargo test` builds the package's
/// examples); built here when this test runs alone (`cargo test --test example`).
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/example-HASH -> target/<profile>/examples/axum
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("examples").join("axum");
    if !bin.exists() {
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-q", "-p", "turnstile-tower", "--example", "axum"]);
        if dir.ends_with("release") {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success(), "building the example");
    }
    bin
}

/// The example server; stopped when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the example on a free loopback port and waits (at most 30 s) for its
/// "listening on" line.
fn start() -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(example())
        .args(["--addr", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("listening on") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the example says it is listening");
    assert!(line.contains(&addr), "{line}");
    (server, format!("http://{addr}"))
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn the_example_limits_ten_a_minute_and_names_the_rule() {
    let (_server, url) = start();
    let c = reqwest::Client::new();
    for i in 0..10 {
        let r = c.get(format!("{url}/")).send().await.unwrap();
        assert_eq!(r.status(), 200, "request {}", i + 1);
        assert_eq!(header(&r, "ratelimit-policy"), "\"per-ip\";q=10;w=60");
        let limit = header(&r, "ratelimit");
        assert!(
            limit.starts_with(&format!("\"per-ip\";r={};t=", 9 - i)),
            "request {}: {limit}",
            i + 1
        );
    }
    let r = c.get(format!("{url}/")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(header(&r, "content-type"), "application/problem+json");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["per-ip"]));
    assert_eq!(body["retry_after"], retry);
}

#[tokio::test]
async fn the_example_sheds_gets_at_full_load() {
    let (_server, url) = start();
    let c = reqwest::Client::new();
    // Two requests in flight (`/slow`, 10 s) make a load of 1.0: GETs are shed with 503 and
    // the rules file's Retry-After, before any rule is asked. The two are dropped unanswered
    // (bounded: the client gives up after 5 s).
    let slow = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let s1 = tokio::spawn(slow.get(format!("{url}/slow")).send());
    let s2 = tokio::spawn(slow.get(format!("{url}/slow")).send());
    let deadline = Instant::now() + Duration::from_secs(4);
    let shed = loop {
        let r = c.get(format!("{url}/")).send().await.unwrap();
        if r.status() == 503 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(shed.status(), 503, "shed while two requests are in flight");
    assert_eq!(header(&shed, "retry-after"), "5");
    s1.abort();
    s2.abort();
}

#[test]
fn a_wrong_flag_or_a_broken_rules_file_is_a_clear_error() {
    let out = Command::new(example()).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "--help is no error");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("[default: 127.0.0.1:3000]"), "{help}");

    let out = Command::new(example()).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown argument `--bogus`; try --help"),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("turnstile-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.toml");
    std::fs::write(
        &file,
        "[[rule]]\nname = \"per-ip\"\nkey = \"ip\"\nlimits = [{ algorithm = \"token-bucket\", limit = 10, window = \"1m\" }]\n",
    )
    .unwrap();
    let out = Command::new(example())
        .args(["--addr", "127.0.0.1:0", "--rules"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rules.toml:4:"), "where: {err}");
    assert!(
        err.contains("unknown algorithm `token-bucket`"),
        "what: {err}"
    );
    assert!(err.contains("token_bucket"), "how to fix: {err}");
}
