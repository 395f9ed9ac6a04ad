//! `turnstile serve` as a user runs it: the built binary as a child process on free loopback
//! ports, spoken to with redis-cli and curl (.ci/run installs both), stopped with SIGTERM.
//! Also what a user sees for a wrong flag, a broken rules file, and `rules import-envoy`.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

/// A port free at the time of asking (the OS may hand it out again; the start would then fail
/// with a clear `cannot listen` and the test says so).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Server {
    child: Child,
    resp: u16,
    http: u16,
}

impl Server {
    /// Starts `turnstile serve` with `extra` flags and waits (at most 30 s) until both
    /// listeners accept.
    fn start(extra: &[&str]) -> Server {
        let (resp, http) = (free_port(), free_port());
        let child = Command::new(BIN)
            .args(["serve", "--workers", "2", "--throttle-keys", "10000"])
            .args(["--resp", &format!("127.0.0.1:{resp}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("turnstile serve starts");
        let mut s = Server { child, resp, http };
        let deadline = Instant::now() + Duration::from_secs(30);
        for port in [resp, http] {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                if let Some(st) = s.child.try_wait().unwrap() {
                    let mut err = String::new();
                    s.child
                        .stderr
                        .take()
                        .unwrap()
                        .read_to_string(&mut err)
                        .unwrap();
                    panic!("turnstile serve exited ({st}) before listening: {err}");
                }
                assert!(
                    Instant::now() < deadline,
                    "not listening on {port} after 30 s"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        s
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

    /// SIGTERM, then waits (at most 30 s) for a clean exit.
    fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let r = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(r, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                self.child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                assert!(st.success(), "exit {st} after SIGTERM: {err}");
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("still running 30 s after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A failed assertion must not leave the server running.
        let _ = self.child.kill();
        let _ = self.child.wait();
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
