//! `turnstile serve` as a user runs it: the built binary as a child process on free loopback
//! ports, spoken to with redis-cli and curl (.ci/run installs both), stopped with SIGTERM.
//! Also what a user sees for a wrong flag, a broken rules file, and `rules import-envoy`.

mod common;
use common::free_port;

use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

struct Server {
    child: common::Running,
    resp: u16,
    http: u16,
}

impl Server {
    /// Starts `turnstile serve` with `extra` flags and waits (at most 30 s) until both
    /// listeners accept.
    fn start(extra: &[&str]) -> Server {
        Self::start_logging(extra, "warn")
    }

    /// [`Server::start`] with `RUST_LOG=log`.
    fn start_logging(extra: &[&str], log: &str) -> Server {
        Self::start_env(extra, log, &[])
    }

    /// [`Server::start_logging`] with more variables in its environment.
    fn start_env(extra: &[&str], log: &str, env: &[(&str, &str)]) -> Server {
        let (resp, http) = (free_port(), free_port());
        let mut cmd = Command::new(BIN);
        cmd.envs(env.iter().copied())
            .args(["serve", "--workers", "2", "--throttle-keys", "10000"])
            .args(["--resp", &format!("127.0.0.1:{resp}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(extra)
            .env("RUST_LOG", log);
        let child = common::spawn_listening(&mut cmd, &[resp, http]);
        Server { child, resp, http }
    }

    /// CL.THROTTLE through redis-cli: the five integers of the reply.
    fn throttle(&self, key: &str, burst: u32, count: u32, period: u32) -> Vec<i64> {
        let o = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.resp.to_string()])
            .args(["CL.THROTTLE", key])
            .args([burst, count, period, 1].map(|n| n.to_string()))
            .output()
            .expect("redis-cli runs (apt-get install redis-tools)");
        assert!(o.status.success(), "{o:?}");
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                l.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("not an integer: {l:?}"))
            })
            .collect()
    }

    fn curl(&self, path: &str) -> (u16, String) {
        let o = Command::new("curl")
            .args(["-s", "-m", "10", "-w", "\n%{http_code}"])
            .arg(format!("http://127.0.0.1:{}{path}", self.http))
            .output()
            .expect("curl runs");
        let text = String::from_utf8(o.stdout).unwrap();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.parse().unwrap(), body.to_string())
    }

    /// SIGTERM, then waits (at most 30 s) for a clean exit; returns what it logged.
    fn stop(mut self) -> String {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let r = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(r, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    e.read_to_string(&mut err).unwrap();
                }
                assert!(st.success(), "exit {st} after SIGTERM: {err}");
                return err;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("still running 30 s after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A RESP connection.
    fn connect(&self) -> Resp {
        let s = TcpStream::connect(("127.0.0.1", self.resp)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Resp {
            r: std::io::BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    /// A counter of /metrics (the first sample whose line starts with `name`).
    fn metric(&self, name: &str) -> f64 {
        let (code, body) = self.curl("/metrics");
        assert_eq!(code, 200);
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }
}

/// A raw RESP client: commands out, replies read line by line (integers, arrays of integers
/// and bulk strings, errors).
struct Resp {
    r: std::io::BufReader<TcpStream>,
    w: TcpStream,
}

impl Resp {
    fn send(&mut self, parts: &[&str]) {
        let mut v = format!("*{}\r\n", parts.len()).into_bytes();
        for p in parts {
            v.extend_from_slice(format!("${}\r\n{p}\r\n", p.len()).as_bytes());
        }
        self.w.write_all(&v).unwrap();
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        assert!(self.r.read_line(&mut l).unwrap() > 0, "connection closed");
        l.trim_end().to_string()
    }

    /// One reply: integers as themselves, a null as -1, a bulk string as 0; an error panics.
    fn reply(&mut self) -> Vec<i64> {
        let l = self.line();
        match l.as_bytes()[0] {
            b':' => vec![l[1..].parse().unwrap()],
            b'*' => (0..l[1..].parse::<usize>().unwrap())
                .flat_map(|_| self.reply())
                .collect(),
            b'$' if l == "$-1" => vec![-1],
            b'$' => {
                self.line();
                vec![0]
            }
            _ => panic!("reply {l}"),
        }
    }

    fn call(&mut self, parts: &[&str]) -> Vec<i64> {
        self.send(parts);
        self.reply()
    }
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// A burst of 2 (3 at once, as redis-cell), then denied with a retry; health and metrics over
/// HTTP; SIGTERM writes the snapshot and a restart on it still denies the key: the admissions
/// made before the restart are not lost.
#[test]
fn serve_answers_redis_cli_and_curl_and_keeps_state_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("throttle.snap");
    let snap = snap.to_str().unwrap();
    let s = Server::start(&["--snapshot", snap]);
    for i in 0..3 {
        let r = s.throttle("user:1", 2, 1, 3600);
        assert_eq!(r[0], 0, "request {i} admitted: {r:?}");
        assert_eq!(r[1], 3, "limit = burst + 1: {r:?}");
        assert_eq!(r[2], 2 - i, "remaining: {r:?}");
    }
    let r = s.throttle("user:1", 2, 1, 3600);
    assert_eq!(r[0], 1, "the fourth is denied: {r:?}");
    assert!(
        r[3] > 3000 && r[3] <= 3600,
        "retry after about an hour: {r:?}"
    );
    assert_eq!(
        s.throttle("user:2", 2, 1, 3600)[0],
        0,
        "another key is apart"
    );

    let (code, _) = s.curl("/healthz");
    assert_eq!(code, 200);
    let (code, body) = s.curl("/metrics");
    assert_eq!(code, 200);
    assert!(body.contains("# TYPE"), "Prometheus text: {body}");
    let (code, body) = s.curl("/nope");
    assert_eq!(code, 404);
    assert!(body.contains("/v1/check"), "names the endpoints: {body}");
    s.stop();
    assert!(Path::new(snap).exists(), "SIGTERM wrote the snapshot");

    let s = Server::start(&["--snapshot", snap]);
    let r = s.throttle("user:1", 2, 1, 3600);
    assert_eq!(r[0], 1, "still denied after the restart: {r:?}");
    assert_eq!(
        s.throttle("user:2", 2, 1, 3600)[2],
        1,
        "user:2 spent 1 of 3"
    );
    s.stop();
}

// curl as the server's own tests run it.
#[path = "../../server/tests/common/mod.rs"]
mod web;

/// curl with a JSON body: (status, head in lower case, body).
fn post(http: u16, path: &str, body: &str) -> (u16, String, String) {
    web::curl_head(
        "POST",
        &format!("http://127.0.0.1:{http}{path}"),
        Some(body),
    )
}

/// The header `name`'s value in a lower-cased head.
fn header(head: &str, name: &str) -> Option<u64> {
    text_header(head, name)?.parse().ok()
}

/// A header's value as text (`head` lowercase, as `post` gives it).
fn text_header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines()
        .find_map(|l| Some(l.strip_prefix(name)?.strip_prefix(':')?.trim()))
}

/// The integer parameter `key` of draft-10's `RateLimit` field (`"policy";r=14;t=60`).
fn draft_param(head: &str, key: &str) -> Option<u64> {
    text_header(head, "ratelimit")?
        .split(';')
        .find_map(|p| p.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// What a pipelining client sends: many commands in one write, read back in order. The
/// server parses such a read ahead and prefetches its CL.THROTTLE keys before running them;
/// the answers must be exactly those of the commands one by one, a malformed command in the
/// middle answered with its error and the rest still run. Then POST /v1/check with curl on the
/// example rules: headers and JSON of an admission and of a denial, a key written with a JSON
/// escape being the same customer, and a bad priority refused with a message.
#[test]
fn serve_answers_a_pipeline_in_order_and_v1_check_with_its_headers() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
    let s = Server::start(&["--rules", rules]);
    let mut c = s.connect();
    let mut batch = Vec::new();
    let cmd = |parts: &[&str]| {
        let mut v = format!("*{}\r\n", parts.len()).into_bytes();
        for p in parts {
            v.extend_from_slice(format!("${}\r\n{p}\r\n", p.len()).as_bytes());
        }
        v
    };
    // Two keys interleaved, burst 2 (3 at once), then one with a bad period, then PING.
    for _ in 0..5 {
        batch.extend(cmd(&["CL.THROTTLE", "pipe:a", "2", "1", "3600"]));
        batch.extend(cmd(&["CL.THROTTLE", "pipe:b", "2", "1", "3600", "2"]));
    }
    batch.extend(cmd(&["CL.THROTTLE", "pipe:c", "2", "x", "3600"]));
    batch.extend(cmd(&["PING"]));
    c.w.write_all(&batch).unwrap();
    for i in 0..5i64 {
        let a = c.reply();
        assert_eq!(a[0], i64::from(i >= 3), "pipe:a request {i}: {a:?}");
        assert_eq!(a[2], (2 - i).max(0), "pipe:a remaining after {i}: {a:?}");
        let b = c.reply();
        // Costs of 2 against 3: admitted once, then denied (1 left, not enough).
        assert_eq!(b[0], i64::from(i >= 1), "pipe:b request {i}: {b:?}");
        assert_eq!(b[2], 1, "pipe:b remaining: {b:?}");
    }
    let err = c.line();
    assert!(err.starts_with("-ERR"), "the bad command's error: {err}");
    assert_eq!(c.line(), "+PONG", "the commands after it still run");
    // Counted per pipeline, before its replies were written: all of it is in /metrics now.
    // pipe:a 3 allowed, 2 limited; pipe:b 1 and 4; the bad command reached no store (untimed).
    assert_eq!(
        s.metric("turnstile_throttle_total{result=\"allowed\"}"),
        4.0
    );
    assert_eq!(
        s.metric("turnstile_throttle_total{result=\"limited\"}"),
        6.0
    );
    assert_eq!(s.metric("turnstile_check_seconds_count"), 10.0);
    assert_eq!(s.metric("turnstile_resp_commands_total"), 12.0);

    let check = r#"{"key_class":"customer","key":"7","route":"/v1/items","method":"GET"}"#;
    let (code, head, body) = post(s.http, "/v1/check", check);
    assert_eq!(code, 200, "{head}{body}");
    // draft-10's fields (the default of --ratelimit-headers).
    assert_eq!(
        text_header(&head, "ratelimit-policy"),
        Some("\"default\";q=15"),
        "{head}"
    );
    assert_eq!(draft_param(&head, "r"), Some(14), "{head}");
    assert_eq!(header(&head, "ratelimit-limit"), None, "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["allowed"], true, "{body}");
    assert_eq!(v["outcome"], "Allowed", "{body}");
    // An admission names no rule (a denial names the rule that denied).
    assert_eq!(v["rule"], serde_json::Value::Null, "{body}");
    assert_eq!(v["retry_after_ms"], serde_json::Value::Null, "{body}");
    // `7` written with a JSON escape is customer 7 too: spend its bucket that way.
    let escaped = r#"{"key_class":"customer","key":"\u0037"}"#;
    let denied = (0..60)
        .map(|_| post(s.http, "/v1/check", escaped))
        .find(|r| r.0 == 429)
        .expect("customer 7 denied within 60 requests");
    let (_, head, body) = denied;
    assert!(
        header(&head, "retry-after").is_some_and(|r| r >= 1),
        "{head}"
    );
    assert_eq!(draft_param(&head, "r"), Some(0), "{head}");
    assert_eq!(
        draft_param(&head, "t"),
        header(&head, "retry-after"),
        "a refusal's reset is its Retry-After: {head}"
    );
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["allowed"], false, "{body}");
    assert_eq!(v["outcome"], "Limited", "{body}");
    assert_eq!(v["rule"], "customer-hourly", "{body}");
    assert!(
        v["retry_after_ms"].as_u64().is_some_and(|r| r >= 1),
        "{body}"
    );
    let (code, _, body) = post(
        s.http,
        "/v1/check",
        r#"{"key_class":"customer","key":"8","priority":"bogus"}"#,
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("unknown priority `bogus`"), "{body}");
    s.stop();
}

/// `turnstile serve 2>&1 | head -1`: once the log's reader is gone, a line that cannot be
/// written is dropped; the server still answers (a new connection is logged)
/// and stops on SIGTERM (which is logged too).
#[test]
fn serve_keeps_answering_and_stops_when_its_log_pipe_closes() {
    let mut s = Server::start_logging(&[], "info");
    drop(s.child.stderr.take());
    assert_eq!(s.throttle("k", 5, 1, 60), [0, 6, 5, -1, 60]);
    assert_eq!(s.throttle("k", 7, 1, 60)[..2], [0, 8]);
    assert_eq!(s.curl("/healthz").0, 200);
    s.stop();
}

#[test]
fn serve_refuses_bad_input_clearly() {
    let o = run(&["serve", "--resp", "nonsense"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--resp"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[rule]]\nname = \"x\"\nlimit = \"ten per second\"\n").unwrap();
    let o = run(&["serve", "--rules", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("bad.toml:"),
        "{err}"
    );

    let o = run(&["serve", "--grpc", "127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--envoy-config"), "{err}");

    // The port is taken: said, not panicked.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = run(&["serve", "--resp", &addr, "--http", "127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
}

#[test]
fn rules_import_envoy_prints_a_valid_rules_file() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(
        &yaml,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
    )
    .unwrap();
    let o = run(&["rules", "import-envoy", yaml.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let rules = dir.path().join("edge.toml");
    std::fs::write(&rules, &o.stdout).unwrap();
    let o = run(&["rules", "check", rules.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");

    std::fs::write(&yaml, "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    let o = run(&["rules", "import-envoy", yaml.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("edge.yaml:4:"), "file:line:column: {err}");
}

const SNAP_RULES: &str = r#"
[[rule]]
name = "per-customer"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 1000000, window = "1h" }]

[[rule]]
name = "per-ip"
key = "ip"
limits = [{ algorithm = "sliding_log", limit = 50, window = "1h" }]
"#;

/// Load is running when the server is killed with SIGKILL: the restart restores the last
/// snapshot, so each count is at least what it was before that snapshot was taken and at
/// most that plus the requests sent after it (a rule store on fixed windows, one on a sliding
/// log, and a CL.THROTTLE store). Then a truncated snapshot is refused with a message and the
/// server starts empty (the file moved aside), or exits 2 with --snapshot-required.
#[test]
fn kill_9_during_load_restarts_from_the_last_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(&rules, SNAP_RULES).unwrap();
    let snap = dir.path().join("state.snap");
    let flags = [
        "--rules",
        rules.to_str().unwrap(),
        "--snapshot",
        snap.to_str().unwrap(),
        "--snapshot-every",
        "100ms",
    ];
    let s = Server::start(&flags);
    let mut c = s.connect();
    // Before: 300 checks of customer 1 (pipelined by 50), 10 of an IP, 7 CL.THROTTLE units.
    let before = 300;
    for _ in 0..before / 50 {
        for _ in 0..50 {
            c.send(&["TURNSTILE.CHECK", "customer", "1"]);
        }
        for _ in 0..50 {
            assert_eq!(c.reply()[0], 1);
        }
    }
    for _ in 0..10 {
        assert_eq!(c.call(&["TURNSTILE.CHECK", "ip", "10.0.0.1"])[0], 1);
    }
    assert_eq!(
        c.call(&["CL.THROTTLE", "user:1", "99", "1", "3600", "7"])[0],
        0
    );
    // A snapshot that started after all of that: the second one completed from now.
    let name = "turnstile_snapshots_total{result=\"ok\"}";
    let written = s.metric(name);
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.metric(name) < written + 2.0 {
        assert!(Instant::now() < deadline, "no snapshot written in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // After: a client keeps checking customer 1 until the server dies under it.
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut load = s.connect();
    let n = sent.clone();
    let t = std::thread::spawn(move || {
        // Bounded: at most 200 000 requests, or until the connection breaks.
        for _ in 0..4000 {
            let mut v = Vec::new();
            for _ in 0..50 {
                v.extend_from_slice(
                    b"*3\r\n$15\r\nTURNSTILE.CHECK\r\n$8\r\ncustomer\r\n$1\r\n1\r\n",
                );
            }
            if load.w.write_all(&v).is_err() {
                return;
            }
            n.fetch_add(50, std::sync::atomic::Ordering::Relaxed);
            for _ in 0..50 {
                let mut l = String::new();
                for _ in 0..7 {
                    l.clear();
                    if load.r.read_line(&mut l).map_or(true, |k| k == 0) {
                        return;
                    }
                }
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut s = s;
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    t.join().unwrap();
    let after = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(after > 0, "no load was running at the kill");
    drop(s);

    let s = Server::start(&flags);
    let mut c = s.connect();
    let p = c.call(&["TURNSTILE.PEEK", "customer", "1"]);
    let restored = 1_000_000 - p[2] as u64;
    eprintln!("customer 1: {before} checks before the last snapshot began, {after} sent after; {restored} restored");
    assert!(
        (before..=before + after).contains(&restored),
        "restored {restored}: {before} before the snapshot, {after} sent after"
    );
    assert_eq!(
        c.call(&["TURNSTILE.PEEK", "ip", "10.0.0.1"])[2],
        40,
        "sliding log"
    );
    assert_eq!(
        c.call(&["CL.THROTTLE", "user:1", "99", "1", "3600", "0"])[2],
        93,
        "CL.THROTTLE"
    );
    s.stop();

    // A truncated snapshot: refused with a message, moved aside (never overwritten: it is
    // the evidence), and the server starts empty...
    let bytes = std::fs::read(&snap).unwrap();
    std::fs::write(&snap, &bytes[..bytes.len() / 2]).unwrap();
    let s = Server::start(&flags);
    let mut c = s.connect();
    assert_eq!(c.call(&["TURNSTILE.PEEK", "customer", "1"])[2], 1_000_000);
    let err = s.stop();
    assert!(
        err.contains("snapshot refused and moved aside") && err.contains("truncated"),
        "{err}"
    );
    let dir = Path::new(&snap).parent().unwrap();
    let name = Path::new(&snap)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let aside: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{name}.corrupt-"))
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        err.contains(&aside[0].display().to_string()),
        "the log says where: {err}"
    );
    assert_eq!(std::fs::read(&aside[0]).unwrap(), &bytes[..bytes.len() / 2]);
    // The shutdown wrote a fresh snapshot at the old name, beside the one moved aside.
    assert!(snapshot_is_fresh(&snap, &bytes));
    std::fs::write(&snap, &bytes[..bytes.len() / 2]).unwrap();
    // ...or, with --snapshot-required, does not start: exit 2, saying why.
    let o = Command::new(BIN)
        .args(["serve", "--resp", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(flags)
        .arg("--snapshot-required")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("truncated") && err.contains("--snapshot-required"),
        "{err}"
    );
    // ...and leaves the file where it is.
    assert_eq!(std::fs::read(&snap).unwrap(), &bytes[..bytes.len() / 2]);
}

/// Whether the file at `path` is a whole snapshot other than `old`.
fn snapshot_is_fresh(path: &Path, old: &[u8]) -> bool {
    let now = std::fs::read(path).unwrap_or_default();
    now.starts_with(b"TSNP") && now != old
}

/// A protobuf length-delimited field: tag, length, bytes.
fn pb_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    out.push(field << 3 | 2);
    assert!(bytes.len() < 128, "one-byte lengths only");
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

/// Envoy's `RateLimitRequest { domain, descriptors: [{ entries: [{ key, value }] }] }`
/// (envoy.service.ratelimit.v3), encoded by hand, in a gRPC frame (uncompressed, 4-byte
/// big-endian length).
fn should_rate_limit_frame(domain: &str, key: &str, value: &str) -> Vec<u8> {
    let mut entry = Vec::new();
    pb_field(&mut entry, 1, key.as_bytes());
    pb_field(&mut entry, 2, value.as_bytes());
    let mut descriptor = Vec::new();
    pb_field(&mut descriptor, 1, &entry);
    let mut req = Vec::new();
    pb_field(&mut req, 1, domain.as_bytes());
    pb_field(&mut req, 2, &descriptor);
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(req.len() as u32).to_be_bytes());
    frame.extend_from_slice(&req);
    frame
}

/// One gRPC call with curl over HTTP/2 (prior knowledge, as Envoy speaks to a rate limit
/// service): the response body and the headers and trailers as curl prints them. An empty
/// `frame` sends no request body at all: the request's HEADERS frame ends its stream.
fn grpc_call(port: u16, method: &str, frame: &[u8]) -> (Vec<u8>, String) {
    let dir = tempfile::tempdir().unwrap();
    let head = dir.path().join("head");
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-m", "10", "--http2-prior-knowledge", "-X", "POST"])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .args(["-D", head.to_str().unwrap(), "-o", "-"]);
    if !frame.is_empty() {
        cmd.args(["--data-binary", "@-"]);
    }
    let mut child = cmd
        .arg(format!("http://127.0.0.1:{port}/{method}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("curl runs");
    if !frame.is_empty() {
        child.stdin.take().unwrap().write_all(frame).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let head = std::fs::read_to_string(head).unwrap();
    (o.stdout, head)
}

/// `RateLimitResponse.overall_code` (field 1; OK = 1, OVER_LIMIT = 2) of a one-frame gRPC
/// response body.
fn overall_code(body: &[u8]) -> u8 {
    assert!(
        body.len() >= 7 && body[0] == 0,
        "not one gRPC frame: {body:?}"
    );
    let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
    assert_eq!(body.len(), 5 + len, "{body:?}");
    assert_eq!(body[5], 1 << 3, "overall_code first: {body:?}");
    body[6]
}

/// Envoy's rate limit service as Envoy reaches it: ShouldRateLimit over gRPC (HTTP/2 without
/// TLS) to the `turnstile serve` binary started with `--envoy-config` and `--grpc`, from
/// curl: two calls within a limit of 2 per hour are OK, the third is OVER_LIMIT; an unknown
/// method is UNIMPLEMENTED.
#[test]
fn serve_answers_envoy_should_rate_limit_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("envoy.yaml");
    std::fs::write(
        &cfg,
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .unwrap();
    let grpc = free_port();
    let s = Server::start(&[
        "--envoy-config",
        cfg.to_str().unwrap(),
        "--grpc",
        &format!("127.0.0.1:{grpc}"),
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", grpc)).is_err() {
        assert!(Instant::now() < deadline, "gRPC not listening after 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    const METHOD: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let frame = should_rate_limit_frame("edge", "api_key", "k1");
    let mut codes = Vec::new();
    for _ in 0..3 {
        let (body, head) = grpc_call(grpc, METHOD, &frame);
        assert!(head.starts_with("HTTP/2 200"), "{head}");
        assert!(head.contains("grpc-status: 0"), "{head}");
        codes.push(overall_code(&body));
    }
    assert_eq!(codes, [1, 1, 2], "OK, OK, OVER_LIMIT");
    // Another key has its own count; another domain matches no rule (OK).
    let (body, _) = grpc_call(
        grpc,
        METHOD,
        &should_rate_limit_frame("edge", "api_key", "k2"),
    );
    assert_eq!(overall_code(&body), 1);
    let (body, _) = grpc_call(
        grpc,
        METHOD,
        &should_rate_limit_frame("other", "api_key", "k1"),
    );
    assert_eq!(overall_code(&body), 1);
    // Without a request body: the answer to an unknown method comes before the server reads
    // one, and a body still in flight then meets the stream's reset (RST_STREAM NO_ERROR),
    // which gRPC clients accept and curl reports as error 92, now and then.
    let (_, head) = grpc_call(
        grpc,
        "envoy.service.ratelimit.v3.RateLimitService/Nope",
        &[],
    );
    assert!(head.contains("grpc-status: 12"), "UNIMPLEMENTED: {head}");
    s.stop();
}

/// The real binary, as a user meets it: a second `turnstile serve` on the ports of a running
/// one is refused with exit 2 and a message naming the flag and the reason (per-core listeners
/// use `SO_REUSEPORT`, so without that check it would join the first server's ports and each
/// would see half the connections); and a wrong method gets a 405 with `Allow` and the JSON
/// error body of every other error.
#[test]
fn a_second_serve_on_used_ports_is_refused_and_a_wrong_method_gets_a_json_405() {
    let s = Server::start(&[]);
    for (flag, used) in [("--resp", s.resp), ("--http", s.http)] {
        let mine = format!("127.0.0.1:{used}");
        let other = if flag == "--resp" { "--http" } else { "--resp" };
        let mut second = Command::new(BIN)
            .args(["serve", "--workers", "2", flag, &mine, other, "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Bounded: a second server that starts would otherwise never exit.
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = second.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = second.kill();
                let _ = second.wait();
                panic!("{flag}: a second server started on {mine}, a port in use");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        let mut pipe = second.stderr.take().unwrap();
        pipe.read_to_string(&mut err).unwrap();
        assert_eq!(status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains(&format!("cannot listen on {mine}"))
                && err.contains("another process listens there"),
            "{flag}: {err}"
        );
    }
    // The first server still has all its connections and answers.
    assert_eq!(s.throttle("two", 5, 1, 60), [0, 6, 5, -1, 60]);

    for (method, path, allow) in [
        ("GET", "/v1/check", "allow: post"),
        ("POST", "/metrics", "allow: get,head"),
    ] {
        let (status, head, body) =
            web::curl_head(method, &format!("http://127.0.0.1:{}{path}", s.http), None);
        assert_eq!(status, 405, "{method} {path}: {head}");
        assert!(head.contains(allow), "{method} {path}: {head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
        let e = v["error"].as_str().expect("an error field");
        assert!(e.starts_with(&format!("{method} {path}: ")), "{e}");
    }
    s.stop();
}

// The harness's real redis-server, as turnstile-redis's own tests start it.
#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

/// The real binary with its counts in a real redis-server, killed mid-run: the server answers
/// by its failure policy (closed, the default: denied), says the outage on stderr as a WARN
/// once per opening of the circuit (not only in the metrics), and uses Redis again once it is
/// back.
#[test]
fn serve_says_a_redis_outage_in_its_log_and_recovers() {
    let mut redis = redis_harness::Server::start();
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        format!(
            "[backend]\nredis = \"{}\"\n\n[[rule]]\nname = \"per-customer\"\nkey = \"customer\"\n\
             limits = [{{ algorithm = \"fixed_window\", limit = 100, window = \"1h\" }}]\n",
            redis.url()
        ),
    )
    .unwrap();
    let s = Server::start(&["--rules", rules.to_str().unwrap()]);
    let mut c = s.connect();
    assert_eq!(
        c.call(&["TURNSTILE.CHECK", "customer", "1"])[..3],
        [1, 100, 99]
    );
    redis.kill();
    for _ in 0..20 {
        let r = c.call(&["TURNSTILE.CHECK", "customer", "1"]);
        assert_eq!(r[0], 0, "the closed policy denies: {r:?}");
    }
    assert!(s.metric("turnstile_backend_circuit_opened_total") >= 1.0);
    redis.restart();
    let t0 = Instant::now();
    while c.call(&["TURNSTILE.CHECK", "customer", "1"])[0] != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "Redis never used again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = s.stop();
    let opened: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("redis backend failing: circuit open"))
        .collect();
    assert!(!opened.is_empty() && opened.len() <= 30, "{log}");
    assert!(
        opened[0].contains("backend=rules") && opened[0].contains("policy=Closed"),
        "{}",
        opened[0]
    );
}

/// Long streams through one connection, as clients send them: `redis-cli --pipe` with 20 000
/// CL.THROTTLE commands (about 1 MB in large writes), each answered and counted, and 200 ECHO
/// frames of 4 000 bytes (800 KB of replies, within `--client-output-limit`) sent before the
/// replies are read, each echoed byte for byte. On io_uring a receive ends every 4 KiB and is
/// armed again and frames cross receive buffers; the replies outgrow what a send carries while
/// the client does not read (.ci/run runs this again with one receive at a time and on tokio).
#[test]
fn long_streams_through_one_connection_are_answered_whole() {
    let s = Server::start(&[]);
    let n = 20_000;
    let mut input = Vec::new();
    for i in 0..n {
        let key = format!("stream:{}", i % 1000);
        let parts = ["CL.THROTTLE", key.as_str(), "100", "1", "3600"];
        input.extend(format!("*{}\r\n", parts.len()).as_bytes());
        for p in parts {
            input.extend(format!("${}\r\n{p}\r\n", p.len()).as_bytes());
        }
    }
    let mut cli = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &s.resp.to_string(), "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli runs (apt-get install redis-tools)");
    cli.stdin.take().unwrap().write_all(&input).unwrap();
    let o = cli.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains(&format!("errors: 0, replies: {n}")), "{out}");
    assert_eq!(
        s.metric("turnstile_throttle_total{result=\"allowed\"}"),
        f64::from(n)
    );

    let c = s.connect();
    let arg = "e".repeat(4000);
    let frame = format!("*2\r\n$4\r\nECHO\r\n${}\r\n{arg}\r\n", arg.len());
    let mut w = c.w.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(frame.repeat(200).as_bytes()));
    let want = format!("${}\r\n{arg}\r\n", arg.len());
    // Not read at first: the replies fill the socket's buffers and the sends come back short.
    std::thread::sleep(Duration::from_millis(300));
    let mut r = c.r;
    for i in 0..200 {
        let mut got = vec![0; want.len()];
        r.read_exact(&mut got).unwrap();
        assert!(got == want.as_bytes(), "reply {i} differs");
    }
    writer.join().unwrap().unwrap();
    s.stop();
}

/// A client that sends half its request's headers and then nothing (slowloris) has its
/// connection closed after `--header-timeout`, as has a keep-alive connection left idle; a
/// whole request is still answered.
#[test]
fn a_client_that_trickles_its_headers_is_closed_after_the_header_timeout() {
    let s = Server::start(&["--header-timeout", "1s"]);
    let half = TcpStream::connect(("127.0.0.1", s.http)).unwrap();
    (&half)
        .write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let idle = TcpStream::connect(("127.0.0.1", s.http)).unwrap();
    (&idle)
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let t0 = Instant::now();
    for (what, mut c) in [("half headers", half), ("idle keep-alive", idle)] {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        // Bounded: the read times out after 20 s if the server keeps the connection.
        let r = c.read_to_end(&mut got);
        assert!(r.is_ok(), "{what}: still open after 20 s ({r:?})");
        let text = String::from_utf8_lossy(&got);
        if what == "idle keep-alive" {
            assert!(text.starts_with("HTTP/1.1 200 OK"), "{what}: {text}");
        } else {
            assert!(got.is_empty(), "{what}: {text}");
        }
    }
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(15),
        "closed after {waited:?}, not after about 1 s"
    );
    assert_eq!(s.curl("/healthz").0, 200);
    s.stop();
}

/// RESP is served on io_uring where the kernel allows it, and on tokio where it does not: the
/// fallback, forced with TURNSTILE_IO_URING=off, is said in one log line and answers the same;
/// a value it does not know is said to be ignored.
/// `--coalesce` (here from its environment variable) is said to be for io_uring only on tokio.
#[test]
fn serve_says_which_runtime_serves_resp_and_falls_back_to_tokio() {
    let uring = turnstile_server::io_uring_available().is_ok();
    // "onshot": a misspelt value is said to be ignored, and the server runs as with "on".
    for value in ["off", "on", "onshot"] {
        let off = value == "off";
        let env = [
            ("TURNSTILE_IO_URING", value),
            ("TURNSTILE_COALESCE", "200us"),
        ];
        let s = Server::start_env(&[], "info", &env);
        // Allowed twice (a burst of 1 and the one of the period), then refused.
        assert_eq!(s.throttle("fallback", 1, 1, 60)[..3], [0, 2, 1]);
        assert_eq!(s.throttle("fallback", 1, 1, 60)[..3], [0, 2, 0]);
        let mut c = s.connect();
        assert_eq!(c.call(&["CL.THROTTLE", "fallback", "1", "1", "60"])[0], 1);
        drop(c);
        let log = s.stop();
        let ignored = format!("TURNSTILE_IO_URING=\"{value}\" is ignored: write off");
        assert_eq!(log.contains(&ignored), value == "onshot", "{log}");
        let said = log.contains("io_uring is unavailable: RESP is served on tokio");
        let coalesce_off = log.contains("--coalesce is for the io_uring runtime only");
        assert_eq!(coalesce_off, said, "{log}");
        if off {
            assert!(said && log.contains("TURNSTILE_IO_URING=off"), "{log}");
            assert!(log.contains("runtime=PerCore"), "{log}");
        } else {
            // (Under TURNSTILE_IO_URING=off this process cannot probe: the log alone tells.)
            let env_off = std::env::var("TURNSTILE_IO_URING").is_ok_and(|v| v == "off");
            if !env_off {
                assert_eq!(said, !uring, "{log}");
            }
            let want = if !said {
                "runtime=Uring"
            } else {
                "runtime=PerCore"
            };
            assert!(log.contains(want), "{log}");
        }
    }
}

/// The resident memory of process `pid`, in KiB (Linux).
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// CL.THROTTLE keeps one state per key, as redis-cell does: a key checked with new
/// parameters continues from its state (redis-cell's answers), and ten thousand distinct
/// parameter sets cost no memory and no refusal.
#[test]
fn cl_throttle_keeps_one_state_per_key_whatever_the_parameters() {
    let s = Server::start(&[]);
    let mut c = s.connect();
    for i in 0..3 {
        assert_eq!(
            c.call(&["CL.THROTTLE", "m", "2", "10", "60"])[..3],
            [0, 3, 2 - i]
        );
    }
    // redis-cell answers [0, 6, 2, -1, 24] (24 s: the backlog of 3 emissions of 6 s, plus one).
    let r = c.call(&["CL.THROTTLE", "m", "5", "10", "60"]);
    assert_eq!(r[..4], [0, 6, 2, -1], "{r:?}");
    assert!((23..=24).contains(&r[4]), "{r:?}");
    // 10 000 parameter sets over 10 keys, pipelined by 500: every one answered; memory flat.
    let before = rss_kib(s.child.id());
    for batch in 0..20 {
        for i in 0..500 {
            let n = (batch * 500 + i + 1).to_string();
            let key = format!("p{}", i % 10);
            c.send(&["CL.THROTTLE", &key, &n, "1", "3600"]);
        }
        for _ in 0..500 {
            assert_eq!(c.reply()[0], 0, "admitted");
        }
    }
    let after = rss_kib(s.child.id());
    assert!(
        after <= before + 4 * 1024,
        "RSS {before} KiB before, {after} KiB after 10 000 parameter sets"
    );
    assert_eq!(s.metric("turnstile_store_keys{store=\"throttle\"}"), 11.0);
    s.stop();
}

/// Keys' own limits managed on the running binary: with a client and an admin password, the
/// client password reads (`TURNSTILE.LIMITS GET`) and is refused changes (NOPERM, 403); the
/// admin password sets an entry over RESP (redis-cli) and HTTP (curl) that decides the next
/// checks; an edit of the limits file is read within a few looks, and a bad edit is refused
/// with its line (in the log) while the entries stay.
#[test]
fn serve_manages_keys_own_limits_live() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[limits.customers]\nkey = \"customer\"\nalgorithm = \"token_bucket\"\nfile = \"limits.csv\"\n\
         plans.pro = { limit = 100, window = \"1s\", burst = 200 }\n\
         [[rule]]\nname = \"per-customer\"\nkey = \"customer\"\nlimits_from = \"customers\"\n\
         limits = [{ algorithm = \"token_bucket\", limit = 1, window = \"1h\", burst = 5 }]\n",
    )
    .unwrap();
    let csv = dir.path().join("limits.csv");
    std::fs::write(&csv, "key,plan\n1,pro\n").unwrap();
    let s = Server::start_logging(
        &[
            "--rules",
            rules.to_str().unwrap(),
            "--requirepass",
            "client",
            "--admin-pass",
            "boss",
            "--watch-every",
            "100ms",
            "--metrics-open",
        ],
        "info",
    );
    let cli = |user: &str, pass: &str, args: &[&str]| {
        let o = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &s.resp.to_string(),
                "--no-auth-warning",
            ])
            .args(["--user", user, "--pass", pass])
            .args(args)
            .output()
            .expect("redis-cli runs (apt-get install redis-tools)");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let get = |key: &str| {
        cli(
            "default",
            "client",
            &["TURNSTILE.LIMITS", "GET", "customers", key],
        )
    };
    assert_eq!(get("1"), "pro\n100/1s burst=200\nown");
    let out = cli(
        "default",
        "client",
        &["TURNSTILE.LIMITS", "SET", "customers", "42", "pro"],
    );
    assert!(out.starts_with("NOPERM"), "{out}");
    assert_eq!(
        cli(
            "admin",
            "boss",
            &[
                "TURNSTILE.LIMITS",
                "SET",
                "customers",
                "42",
                "1/1h",
                "burst=2"
            ]
        ),
        "OK"
    );
    let check = || cli("default", "client", &["TURNSTILE.CHECK", "customer", "42"]);
    assert!(check().starts_with("1\n2\n1\n"), "{}", check());
    assert!(check().starts_with("1\n2\n0\n"), "the bucket's second");
    assert!(check().starts_with("0\n2\n0\n"), "denied by the new limit");
    // HTTP: the client password reads and is refused changes; the admin password changes.
    let url = format!("http://127.0.0.1:{}/v1/limits/customers/42", s.http);
    let curl = |method: &str, token: &str, body: &str| {
        let o = Command::new("curl")
            .args(["-s", "-m", "10", "-w", "\n%{http_code}", "-X", method, &url])
            .args(["-H", &format!("authorization: Bearer {token}")])
            .args(["--data-binary", body])
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let (b, code) = text.rsplit_once('\n').unwrap();
        (code.parse::<u16>().unwrap(), b.to_string())
    };
    assert_eq!(curl("PUT", "client", "pro").0, 403);
    let (code, body) = curl("PUT", "boss", r#"{"plan": "pro"}"#);
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"class":"customers","entry":"pro","key":"42"}"#)
    );
    let (code, body) = curl("GET", "client", "");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""decides":"own","entry":"pro""#), "{body}");
    let (code, body) = curl("PUT", "boss", "gold");
    assert_eq!(code, 422, "{body}");
    assert!(
        body.contains("has no plan `gold`; its plans: pro"),
        "{body}"
    );
    assert_eq!(
        curl("DELETE", "boss", "").1,
        r#"{"class":"customers","key":"42","removed":true}"#
    );
    // The file, edited under the server: read within a few looks; a bad line refused.
    let wait_for = |key: &str, want: &str| {
        let t0 = Instant::now();
        while !get(key).starts_with(want) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{key}: {}",
                get(key)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    std::fs::write(&csv, "key,plan\n1,pro\n7,3/1m burst=3\n").unwrap();
    wait_for("7", "3/1m burst=3");
    std::fs::write(&csv, "key,plan\n1,pro\n7,gold\n").unwrap();
    let t0 = Instant::now();
    while s.metric("turnstile_limits_reads_total{result=\"failed\"}") < 1.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the bad edit never seen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(get("7").starts_with("3/1m burst=3"), "the entries stay");
    let log = s.stop();
    assert!(log.contains("limits file re-read"), "{log}");
    assert!(
        log.contains("limits.csv:3: class `customers` has no plan `gold`"),
        "{log}"
    );
}
