//! Keys' own limits managed live: `TURNSTILE.LIMITS` over RESP (raw RESP and redis-cli) and
//! `/v1/limits/{class}/{key}` over HTTP (curl), on both RESP runtimes, and the limits file
//! re-read by the server when it changes. The server in process on loopback ports.

mod common;
use common::curl;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use turnstile_server::{start, Running, RuntimeKind, ServeArgs};

const RULES: &str = r#"
[limits.customers]
key = "customer"
algorithm = "token_bucket"
file = "limits.csv"
capacity = 4

[limits.customers.plans]
free = { limit = 1, window = "1h", burst = 2 }
pro = { limit = 100, window = "1s", burst = 200 }

[limits.ips]
key = "ip"
algorithm = "fixed_window"
window = "1m"

[[rule]]
name = "per-customer"
key = "customer"
limits_from = "customers"
limits = [{ algorithm = "token_bucket", limit = 1, window = "1h", burst = 5 }]
"#;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("turnstile-limits-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The rules and limits files in `d`, and a server on them.
fn server(d: &Path, csv: &str, f: impl FnOnce(&mut ServeArgs)) -> Running {
    std::fs::write(d.join("rules.toml"), RULES).unwrap();
    std::fs::write(d.join("limits.csv"), csv).unwrap();
    let mut a = ServeArgs::new();
    a.resp = "127.0.0.1:0".parse().unwrap();
    a.http = "127.0.0.1:0".parse().unwrap();
    a.workers = Some(2);
    a.throttle_keys = 10_000;
    a.rules = Some(d.join("rules.toml"));
    a.watch_every = Duration::from_millis(50);
    f(&mut a);
    start(a).expect("server starts")
}

fn stop(r: Running) {
    r.stop();
    r.join().unwrap();
}

fn cmd(parts: &[&str]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        v.extend_from_slice(format!("${}\r\n{p}\r\n", p.len()).as_bytes());
    }
    v
}

/// One command over a connection, its whole reply (read until `want` is seen at its end).
fn ask(s: &mut TcpStream, parts: &[&str]) -> String {
    s.write_all(&cmd(parts)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // A reply is complete when it parses; these replies are short and come in one read or
    // a few.
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        if complete(&got) {
            return String::from_utf8_lossy(&got).into_owned();
        }
    }
}

/// Whether `b` holds one whole RESP2 reply (the kinds these tests get).
fn complete(b: &[u8]) -> bool {
    fn one(b: &[u8]) -> Option<usize> {
        let end = b.windows(2).position(|w| w == b"\r\n")?;
        let head = std::str::from_utf8(&b[1..end]).ok()?;
        match b[0] {
            b'+' | b'-' | b':' => Some(end + 2),
            b'$' => {
                let n: i64 = head.parse().ok()?;
                if n < 0 {
                    return Some(end + 2);
                }
                let total = end + 2 + n as usize + 2;
                (b.len() >= total).then_some(total)
            }
            b'*' => {
                let n: usize = head.parse().ok()?;
                let mut at = end + 2;
                for _ in 0..n {
                    at += one(&b[at..])?;
                }
                Some(at)
            }
            _ => None,
        }
    }
    one(b) == Some(b.len())
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A check of customer `key`: whether it was allowed, and the limit that decided.
fn check(s: &mut TcpStream, key: &str) -> (bool, String) {
    let r = ask(s, &["TURNSTILE.CHECK", "customer", key]);
    let lines: Vec<&str> = r.split("\r\n").collect();
    (lines[1] == ":1", lines[2].to_string())
}

fn resp_set_get_del_decide_checks(runtime: RuntimeKind) {
    let d = tmpdir(&format!("{runtime:?}"));
    let r = server(&d, "key,plan\n241531,pro\n", |a| a.runtime = runtime);
    let mut s = connect(r.resp);
    // A file's entry decides: pro's burst 200.
    assert_eq!(check(&mut s, "241531"), (true, ":200".into()));
    assert_eq!(
        ask(&mut s, &["TURNSTILE.LIMITS", "GET", "customers", "241531"]),
        "*3\r\n$3\r\npro\r\n$16\r\n100/1s burst=200\r\n$3\r\nown\r\n"
    );
    // Without an entry the rule's limit (burst 5) decides.
    assert_eq!(check(&mut s, "7"), (true, ":5".into()));
    assert_eq!(
        ask(&mut s, &["TURNSTILE.LIMITS", "GET", "customers", "7"]),
        "*3\r\n$-1\r\n$-1\r\n$7\r\ndefault\r\n"
    );
    // SET (a limit given in words, as redis-cli splits it), then the next check is decided
    // by it: a bucket of 2, of which the check above took 1.
    assert_eq!(
        ask(
            &mut s,
            &[
                "TURNSTILE.LIMITS",
                "SET",
                "customers",
                "7",
                "1/1h",
                "burst=2"
            ]
        ),
        "+OK\r\n"
    );
    assert_eq!(check(&mut s, "7"), (true, ":2".into()));
    assert_eq!(check(&mut s, "7"), (false, ":2".into()));
    assert_eq!(
        ask(&mut s, &["TURNSTILE.LIMITS", "GET", "customers", "7"]),
        "*3\r\n$12\r\n1/1h burst=2\r\n$12\r\n1/1h burst=2\r\n$3\r\nown\r\n"
    );
    // A plan by name.
    assert_eq!(
        ask(
            &mut s,
            &["TURNSTILE.LIMITS", "SET", "customers", "7", "pro"]
        ),
        "+OK\r\n"
    );
    assert_eq!(check(&mut s, "7").1, ":200");
    // DEL says whether it had one; the rule's limit decides again.
    assert_eq!(
        ask(&mut s, &["TURNSTILE.LIMITS", "DEL", "customers", "7"]),
        ":1\r\n"
    );
    assert_eq!(
        ask(&mut s, &["TURNSTILE.LIMITS", "DEL", "customers", "7"]),
        ":0\r\n"
    );
    assert_eq!(check(&mut s, "7").1, ":5");
    // Errors, in words.
    let err = |s: &mut TcpStream, parts: &[&str]| {
        let r = ask(s, parts);
        assert!(r.starts_with('-'), "{r}");
        r
    };
    let e = err(&mut s, &["TURNSTILE.LIMITS", "SET", "nope", "7", "pro"]);
    assert!(
        e.contains("no limits class `nope`; the classes: customers, ips"),
        "{e}"
    );
    let e = err(
        &mut s,
        &["TURNSTILE.LIMITS", "SET", "customers", "07", "pro"],
    );
    assert!(e.contains("07"), "{e}");
    let e = err(
        &mut s,
        &["TURNSTILE.LIMITS", "SET", "customers", "7", "gold"],
    );
    assert!(
        e.contains("has no plan `gold`; its plans: free, pro"),
        "{e}"
    );
    let e = err(
        &mut s,
        &["TURNSTILE.LIMITS", "SET", "ips", "10.0.0.1", "5/1s"],
    );
    assert!(e.contains("counts in windows of 1m, not 1s"), "{e}");
    let e = err(
        &mut s,
        &["TURNSTILE.LIMITS", "SET", "customers", "7", "5/1q"],
    );
    assert!(e.contains("not a duration"), "{e}");
    let e = err(&mut s, &["TURNSTILE.LIMITS", "PUT", "customers", "7"]);
    assert!(e.contains("unknown subcommand 'PUT'"), "{e}");
    // A full class says what to raise: capacity 4, one file entry, 7 (removed, its slot kept
    // until the entries are rebuilt) and 2 more.
    for k in ["1", "2"] {
        assert_eq!(
            ask(&mut s, &["TURNSTILE.LIMITS", "SET", "customers", k, "free"]),
            "+OK\r\n"
        );
    }
    let e = err(
        &mut s,
        &["TURNSTILE.LIMITS", "SET", "customers", "3", "free"],
    );
    assert!(e.contains("raise `capacity`"), "{e}");
    stop(r);
}

#[test]
fn resp_set_get_del_on_io_uring() {
    resp_set_get_del_decide_checks(RuntimeKind::Uring);
}

#[test]
fn resp_set_get_del_on_per_core_tokio() {
    resp_set_get_del_decide_checks(RuntimeKind::PerCore);
}

#[test]
fn changes_need_the_admin_password() {
    let d = tmpdir("admin");
    let r = server(&d, "", |a| {
        a.requirepass = Some("client".into());
        a.admin_pass = Some("boss".into());
    });
    let mut s = connect(r.resp);
    assert_eq!(ask(&mut s, &["AUTH", "client"]), "+OK\r\n");
    let e = ask(
        &mut s,
        &["TURNSTILE.LIMITS", "SET", "customers", "7", "pro"],
    );
    assert!(e.starts_with("-NOPERM"), "{e}");
    assert!(ask(&mut s, &["TURNSTILE.LIMITS", "DEL", "customers", "7"]).starts_with("-NOPERM"));
    // GET needs what a check needs.
    assert!(ask(&mut s, &["TURNSTILE.LIMITS", "GET", "customers", "7"]).starts_with("*3"));
    assert_eq!(ask(&mut s, &["AUTH", "admin", "boss"]), "+OK\r\n");
    assert_eq!(
        ask(
            &mut s,
            &["TURNSTILE.LIMITS", "SET", "customers", "7", "pro"]
        ),
        "+OK\r\n"
    );
    // HTTP: the client password reads, only the admin password changes.
    let url = format!("http://{}/v1/limits/customers/7", r.http);
    let (status, body) = curl_auth("PUT", &url, "client", "free");
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("PUT /v1/limits/customers/7 changes the server"),
        "{body}"
    );
    let (status, body) = curl_auth("DELETE", &url, "client", "");
    assert_eq!(status, 403, "{body}");
    let (status, body) = curl_auth("GET", &url, "client", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""entry":"pro""#), "{body}");
    let (status, _) = curl("GET", &url, None);
    assert_eq!(status, 401);
    let (status, body) = curl_auth("PUT", &url, "boss", "free");
    assert_eq!(status, 200, "{body}");
    stop(r);
}

/// curl with a bearer token (none if empty) and a text body.
fn curl_auth(method: &str, url: &str, token: &str, body: &str) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-s", "-m", "10", "-w", "\n%{http_code}", "-X", method, url]);
    if !token.is_empty() {
        c.args(["-H", &format!("authorization: Bearer {token}")]);
    }
    let o = c.args(["--data-binary", body]).output().expect("curl runs");
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.trim().parse().unwrap(), body.to_string())
}

#[test]
fn http_put_get_delete() {
    let d = tmpdir("http");
    let r = server(&d, "", |_| {});
    let url = format!("http://{}/v1/limits/customers/42", r.http);
    let check = || {
        let (status, body) = curl(
            "POST",
            &format!("http://{}/v1/check", r.http),
            Some(r#"{"key_class":"customer","key":"42"}"#),
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        (status, v["limit"].as_u64().unwrap())
    };
    assert_eq!(check(), (200, 5));
    // Text, as a CSV value.
    let (status, body) = curl_auth("PUT", &url, "", "1/1h burst=2");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        r#"{"class":"customers","entry":"1/1h burst=2","key":"42"}"#
    );
    assert_eq!(check(), (200, 2));
    assert_eq!(check(), (429, 2));
    // JSON, as a JSON Lines entry (its key left out).
    let (status, body) = curl("PUT", &url, Some(r#"{"plan": "pro"}"#));
    assert_eq!(status, 200, "{body}");
    assert_eq!(check().1, 200);
    let (status, body) = curl("PUT", &url, Some(r#"{"limit": 3, "window": "1m"}"#));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""entry":"3/1m""#), "{body}");
    let (status, body) = curl("GET", &url, None);
    assert_eq!(status, 200);
    assert_eq!(
        body,
        r#"{"class":"customers","decides":"own","entry":"3/1m","key":"42","limit":"3/1m"}"#
    );
    let (status, body) = curl("DELETE", &url, None);
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"class":"customers","key":"42","removed":true}"#)
    );
    let (status, body) = curl("DELETE", &url, None);
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"class":"customers","key":"42","removed":false}"#)
    );
    let (_, body) = curl("GET", &url, None);
    assert!(
        body.contains(r#""decides":"default","entry":null"#),
        "{body}"
    );
    // Errors are JSON, 4xx.
    let err = |status: u16, body: &str, want: &str| {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(
            v["error"].as_str().unwrap().contains(want),
            "{status} {body}"
        );
        status
    };
    let (s, b) = curl("GET", &format!("http://{}/v1/limits/nope/42", r.http), None);
    assert_eq!(err(s, &b, "the classes: customers, ips"), 404);
    let (s, b) = curl_auth("PUT", &url, "", "gold");
    assert_eq!(err(s, &b, "has no plan `gold`"), 422);
    let (s, b) = curl_auth("PUT", &url, "", "5/1x");
    assert_eq!(err(s, &b, "not a duration"), 400);
    let (s, b) = curl("PUT", &url, Some(r#"{"key": "43", "plan": "pro"}"#));
    assert_eq!(err(s, &b, "is not the path's `42`"), 400);
    let (s, b) = curl("PUT", &url, Some(r#"{"plan": "pro", "limit": 3}"#));
    assert_eq!(err(s, &b, "not both"), 400);
    let (s, b) = curl(
        "GET",
        &format!("http://{}/v1/limits/customers/abc", r.http),
        None,
    );
    assert_eq!(err(s, &b, "abc"), 400);
    stop(r);
}

/// Waits (at most 10 s) until `f` holds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_edited_limits_file_is_re_read_and_a_bad_edit_refused() {
    let d = tmpdir("refresh");
    let r = server(&d, "key,plan\n9,free\n", |_| {});
    let mut s = connect(r.resp);
    let get = |s: &mut TcpStream| ask(s, &["TURNSTILE.LIMITS", "GET", "customers", "9"]);
    assert!(get(&mut s).contains("free"));
    // mtime resolution: a change within the same tick is told by the length.
    replace_file(&d.join("limits.csv"), "key,plan\n9,pro\n10,pro\n");
    eventually("the new entry", || get(&mut s).contains("pro"));
    let metric = |name: &str| {
        let (_, body) = curl("GET", &format!("http://{}/metrics", r.http), None);
        body.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(metric("turnstile_limits_reads_total{result=\"ok\"}") >= 1.0);
    // A bad line: refused, the entries stay, counted.
    replace_file(&d.join("limits.csv"), "key,plan\n9,gold\n");
    eventually("the refusal counted", || {
        metric("turnstile_limits_reads_total{result=\"failed\"}") >= 1.0
    });
    assert!(get(&mut s).contains("pro"));
    // Logged and counted once, however many looks see it.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        metric("turnstile_limits_reads_total{result=\"failed\"}"),
        1.0
    );
    // POST /v1/reload reports the refused file with its line.
    let (status, body) = curl("POST", &format!("http://{}/v1/reload", r.http), None);
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("limits.csv:2: class `customers` has no plan `gold`"),
        "{body}"
    );
    replace_file(&d.join("limits.csv"), "key,plan\n9,free\n");
    eventually("the fixed file", || get(&mut s).contains("free"));
    stop(r);
}

#[test]
fn redis_cli_sets_and_reads() {
    if Command::new("redis-cli").arg("--version").output().is_err() {
        eprintln!("redis-cli not installed (apt-get install redis-tools): skipped");
        return;
    }
    let d = tmpdir("cli");
    let r = server(&d, "", |_| {});
    let port = r.resp.port().to_string();
    let cli = |args: &[&str]| {
        let o = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(
        cli(&[
            "TURNSTILE.LIMITS",
            "SET",
            "customers",
            "42",
            "5/1s",
            "burst=10"
        ]),
        "OK"
    );
    assert_eq!(
        cli(&["TURNSTILE.LIMITS", "GET", "customers", "42"]),
        "5/1s burst=10\n5/1s burst=10\nown"
    );
    assert_eq!(
        cli(&["TURNSTILE.CHECK", "customer", "42"]),
        "1\n10\n9\n-1\n200"
    );
    assert_eq!(cli(&["TURNSTILE.LIMITS", "DEL", "customers", "42"]), "1");
    stop(r);
}

/// Pipelined and in a transaction, the operations (run off the worker) answer in order, and
/// each sees the one before.
#[test]
fn pipelined_and_in_multi_in_order() {
    for runtime in [RuntimeKind::Uring, RuntimeKind::PerCore] {
        let d = tmpdir(&format!("pipe-{runtime:?}"));
        let r = server(&d, "", |a| a.runtime = runtime);
        let mut s = connect(r.resp);
        let mut req = Vec::new();
        for parts in [
            &["TURNSTILE.LIMITS", "SET", "customers", "5", "pro"][..],
            &["TURNSTILE.LIMITS", "GET", "customers", "5"],
            &["TURNSTILE.CHECK", "customer", "5"],
            &["TURNSTILE.LIMITS", "DEL", "customers", "5"],
            &["PING"],
        ] {
            req.extend(cmd(parts));
        }
        s.write_all(&req).unwrap();
        let want = "+OK\r\n*3\r\n$3\r\npro\r\n$16\r\n100/1s burst=200\r\n$3\r\nown\r\n\
                    *6\r\n:1\r\n:200\r\n:199\r\n:-1\r\n:10\r\n$-1\r\n:1\r\n+PONG\r\n";
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while got.len() < want.len() {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(String::from_utf8_lossy(&got), want, "{runtime:?}");
        assert_eq!(ask(&mut s, &["MULTI"]), "+OK\r\n");
        assert_eq!(
            ask(
                &mut s,
                &["TURNSTILE.LIMITS", "SET", "customers", "6", "free"]
            ),
            "+QUEUED\r\n"
        );
        assert_eq!(
            ask(&mut s, &["TURNSTILE.LIMITS", "GET", "customers", "6"]),
            "+QUEUED\r\n"
        );
        assert_eq!(
            ask(&mut s, &["EXEC"]),
            "*2\r\n+OK\r\n*3\r\n$4\r\nfree\r\n$12\r\n1/1h burst=2\r\n$3\r\nown\r\n",
            "{runtime:?}"
        );
        stop(r);
    }
}

/// Writes `path` anew as an editor that saves safely does (a new file renamed over it): the
/// server's poll never sees it half written (`std::fs::write` truncates first, and a poll in
/// between reads a file of no entries, which is valid).
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
