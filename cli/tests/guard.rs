//! The one guard every listener of `turnstile serve` goes through (server/src/listen), tried
//! as an attacker would, on each listener: the admin listener without credentials, request
//! bodies that never end, silent gRPC connections, a process out of descriptors, connections
//! that never authenticate, password guessing, bodies past `--max-body` on every route. The
//! built binary as a child on free loopback ports; raw TCP, redis-cli and curl; short
//! deadlines given by flags, so that each test waits seconds. Every wait is bounded.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::free_port;
use common::serve::{self, Listeners, Served as Server, RULES};

/// The binary under test: the one this build made, or `TURNSTILE_TEST_BIN` (to run the same
/// attacks against another build, e.g. an older release).
fn bin() -> String {
    std::env::var("TURNSTILE_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_turnstile").into())
}

const PASSWORD: &str = "guard-client-pw";
const ADMIN: &str = "guard-admin-pw";

/// What a test's server has.
#[derive(Default)]
struct Opts {
    /// `--requirepass-file`.
    password: bool,
    /// `--admin` on loopback, with `--admin-pass-file`.
    admin: bool,
    /// `--grpc` with the example Envoy configuration.
    grpc: bool,
}

impl Server {
    fn start(o: Opts, extra: &[&str]) -> Server {
        let l = Listeners {
            password: o.password.then_some(PASSWORD),
            admin: o.admin.then_some(ADMIN),
            grpc: o.grpc,
            log: false,
        };
        serve::start(&bin(), l, extra)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// curl at `port`: status and body.
    fn curl(
        &self,
        port: u16,
        method: &str,
        path: &str,
        bearer: Option<&str>,
        body: Option<&str>,
    ) -> (u16, String) {
        serve::curl(port, method, path, bearer, body, false)
    }

    /// A sample of /metrics (with the password if the server has one).
    fn metric(&self, name: &str) -> f64 {
        let (code, body) = self.curl(self.http, "GET", "/metrics", Some(PASSWORD), None);
        assert_eq!(code, 200, "{body}");
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }

    /// The server's CPU time so far (user + system), from /proc/PID/stat.
    fn cpu(&self) -> Duration {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let after = &s[s.rfind(')').unwrap() + 2..];
        let f: Vec<u64> = after
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
        let ticks = f[11] + f[12];
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// The numbers of the descriptors the server has open.
    fn fd_numbers(&self) -> std::collections::BTreeSet<u32> {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// What the server logged (after stopping it).
    fn stop_and_log(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

/// Whether the server closes `s` within `limit` (reading and discarding what it sends).
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while t0.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return Some(t0.elapsed()),
        }
    }
    None
}

fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).unwrap()
}

/// The admin listener asks for the admin password when one is set — nothing, or the client
/// password, is refused 403 on what changes the server — and a non-loopback --admin without
/// one is refused at start.
#[test]
fn the_admin_listener_needs_the_admin_password() {
    let s = Server::start(
        Opts {
            admin: true,
            ..Opts::default()
        },
        &[],
    );
    let admin = s.admin.unwrap();
    let (code, body) = s.curl(admin, "POST", "/v1/reload", None, None);
    assert_eq!(code, 403, "{body}");
    let (code, body) = s.curl(
        admin,
        "PUT",
        "/v1/limits/customer/42",
        None,
        Some("1000000/1s"),
    );
    assert_eq!(code, 403, "{body}");
    let (code, body) = s.curl(admin, "POST", "/v1/reload", Some(ADMIN), None);
    assert_eq!(code, 200, "{body}");
    drop(s);

    let with_client = Server::start(
        Opts {
            admin: true,
            password: true,
            ..Opts::default()
        },
        &[],
    );
    let admin = with_client.admin.unwrap();
    let (code, body) = with_client.curl(admin, "POST", "/v1/reload", Some(PASSWORD), None);
    assert_eq!(code, 403, "the client password is not the admin's: {body}");
    drop(with_client);

    let o = Command::new(bin())
        .args(["serve", "--resp", &format!("127.0.0.1:{}", free_port())])
        .args(["--http", &format!("127.0.0.1:{}", free_port())])
        .args(["--admin", &format!("0.0.0.0:{}", free_port())])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--admin 0.0.0.0"));
}

/// A request whose headers are whole and whose body never ends is closed past
/// `--body-timeout`; one whose body trickles, past `--min-body-rate` after its grace — with
/// credentials or without, and the server counts why.
#[test]
fn an_unfinished_or_trickled_http_body_is_closed() {
    let s = Server::start(Opts::default(), &["--body-timeout", "2s"]);
    let mut c = connect(s.http);
    c.write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"key")
        .unwrap();
    let took = closed_within(&mut c, Duration::from_secs(8)).expect("closed");
    assert!(took >= Duration::from_secs(2), "closed early: {took:?}");
    assert_eq!(
        s.metric("turnstile_listener_expired_total{listener=\"http\",deadline=\"body\"}"),
        1.0
    );
    drop(s);

    // 100 bytes a second, below 1 KiB/s: closed after the 5 s grace, within the next seconds.
    let s = Server::start(Opts::default(), &["--body-timeout", "60s"]);
    let mut c = connect(s.http);
    c.write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    let t0 = Instant::now();
    let mut closed = false;
    while t0.elapsed() < Duration::from_secs(15) {
        if c.write_all(&[b' '; 10]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        c.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        if matches!(c.read(&mut [0u8; 64]), Ok(0)) {
            closed = true;
            break;
        }
    }
    assert!(closed, "a trickled body still open after 15 s");
    assert!(t0.elapsed() >= Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(
        s.metric("turnstile_listener_expired_total{listener=\"http\",deadline=\"body_rate\"}"),
        1.0
    );
}

/// gRPC: a connection that sends nothing is closed past `--header-timeout`, as an HTTP one is.
#[test]
fn a_silent_grpc_connection_is_closed() {
    let s = Server::start(
        Opts {
            grpc: true,
            ..Opts::default()
        },
        &["--header-timeout", "2s"],
    );
    let mut silent = connect(s.grpc.unwrap());
    let took = closed_within(&mut silent, Duration::from_secs(8)).expect("closed");
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert_eq!(
        s.metric("turnstile_listener_expired_total{listener=\"grpc\",deadline=\"idle\"}"),
        1.0
    );
}

/// A connection that never authenticates is closed past `--auth-timeout` on every listener,
/// however busy it keeps itself (a NOAUTH reply is progress for an idle timer, not for this).
#[test]
fn a_connection_that_never_authenticates_is_closed() {
    for runtime in ["uring", "per-core"] {
        let s = Server::start(
            Opts {
                password: true,
                grpc: true,
                ..Opts::default()
            },
            &["--auth-timeout", "2s", "--runtime", runtime],
        );
        let mut resp = connect(s.resp);
        let mut http = connect(s.http);
        let mut grpc = connect(s.grpc.unwrap());
        let t0 = Instant::now();
        let mut open = [true; 3];
        while t0.elapsed() < Duration::from_secs(8) && open.iter().any(|o| *o) {
            if open[0] && (resp.write_all(b"PING\r\n").is_err() || gone(&mut resp)) {
                open[0] = false;
            }
            if open[1]
                && (http
                    .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    .is_err()
                    || gone(&mut http))
            {
                open[1] = false;
            }
            if open[2] && gone(&mut grpc) {
                open[2] = false;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        assert_eq!(open, [false; 3], "{runtime}: still open after 8 s");
        assert!(t0.elapsed() >= Duration::from_secs(2));
        for l in ["resp", "http", "grpc"] {
            let v = s.metric(&format!(
                "turnstile_listener_expired_total{{listener=\"{l}\",deadline=\"auth\"}}"
            ));
            assert_eq!(v, 1.0, "{runtime}: {l}");
        }
    }
}

/// Whether the peer closed `s` (without waiting).
fn gone(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Before authentication a RESP client's unread NOAUTH replies are held within its own
/// allowance: it borrows nothing from the server-wide output budget.
#[test]
fn an_unauthenticated_flood_borrows_no_budget() {
    let s = Server::start(
        Opts {
            password: true,
            ..Opts::default()
        },
        &["--auth-timeout", "30s"],
    );
    let mut c = connect(s.resp);
    c.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let burst = b"PING\r\n".repeat(10_000);
    // Never read: the replies pile up until the server stops reading.
    for _ in 0..200 {
        if c.write_all(&burst).is_err() {
            break;
        }
    }
    assert_eq!(s.metric("turnstile_resp_deferred_bytes"), 0.0);
}

/// Wrong passwords: ten on one connection close it; a source's burst spent, the next attempt
/// is refused without being checked (the right password too), on RESP and HTTP alike.
#[test]
fn wrong_passwords_are_slowed_per_source_and_close_the_connection() {
    let s = Server::start(
        Opts {
            password: true,
            ..Opts::default()
        },
        &[],
    );
    // A keep-alive HTTP connection that showed the password before the guessing.
    let mut kept = connect(s.http);
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(keep_alive_get(&mut kept, "/metrics", PASSWORD), 200);
    let mut c = connect(s.resp);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut replies = String::new();
    for i in 0..10 {
        c.write_all(format!("AUTH wrong{i}\r\n").as_bytes())
            .unwrap();
        let mut buf = [0u8; 256];
        let n = c.read(&mut buf).unwrap_or(0);
        replies.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert_eq!(replies.matches("WRONGPASS").count(), 10, "{replies}");
    assert!(
        closed_within(&mut c, Duration::from_secs(3)).is_some(),
        "closed after 10"
    );

    // Ten more from the same address (20: the burst), then even the right one waits.
    for i in 0..10 {
        let (code, _) = s.curl(s.http, "GET", "/metrics", Some(&format!("bad{i}")), None);
        assert_eq!(code, 401);
    }
    let (code, body) = s.curl(s.http, "GET", "/metrics", Some(PASSWORD), None);
    assert_eq!(code, 429, "{body}");
    assert!(body.contains("too many wrong passwords"), "{body}");
    // The password a connection had accepted is not a guess: the guesser behind the same
    // address does not lock it out.
    assert_eq!(keep_alive_get(&mut kept, "/metrics", PASSWORD), 200);
    let o = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &s.resp.to_string()])
        .args(["--no-auth-warning", "-a", PASSWORD, "PING"])
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("too many wrong passwords"), "{out}");
    // A second later (2 a second), a password is checked again.
    std::thread::sleep(Duration::from_millis(1100));
    let (code, body) = s.curl(s.http, "GET", "/healthz", None, None);
    assert_eq!(code, 200, "{body}");
    let (code, _) = s.curl(s.http, "GET", "/metrics", Some(PASSWORD), None);
    assert_eq!(code, 200);
    assert!(s.metric("turnstile_auth_failures_total{result=\"wrong\"}") >= 20.0);
    assert!(s.metric("turnstile_auth_failures_total{result=\"throttled\"}") >= 2.0);
}

/// A GET on a keep-alive HTTP/1.1 connection with `token` as its bearer: the status, the
/// body read whole (by its Content-Length) so the connection can be used again.
fn keep_alive_get(c: &mut TcpStream, path: &str, token: &str) -> u16 {
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\r\n");
    c.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            c.read(&mut byte).unwrap(),
            1,
            "the connection ended: {head:?}"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    c.read_exact(&mut body).unwrap();
    head.split(' ').nth(1).unwrap().parse().unwrap()
}

/// Every route's body and every gRPC message stay within `--max-body` (Envoy's `POST /json`
/// took 4 MiB whatever the flag said).
#[test]
fn json_and_grpc_bodies_are_bounded_by_max_body() {
    let s = Server::start(
        Opts {
            grpc: true,
            ..Opts::default()
        },
        &["--max-body", "16kb"],
    );
    let big = format!(
        "{{\"domain\":\"edge\",\"descriptors\":[],\"pad\":\"{}\"}}",
        "x".repeat(100_000)
    );
    let (code, body) = s.curl(s.http, "POST", "/json", None, Some(&big));
    assert_eq!(code, 413, "{body}");
    // A gRPC message of 20 000 bytes (prior-knowledge HTTP/2 through curl; within one
    // HTTP/2 window, so that the whole message is sent before the answer).
    let dir = tempfile::tempdir().unwrap();
    let msg = dir.path().join("msg");
    let mut framed = vec![0u8];
    framed.extend_from_slice(&20_000u32.to_be_bytes());
    framed.extend(std::iter::repeat_n(0u8, 20_000));
    std::fs::write(&msg, framed).unwrap();
    let o = Command::new("curl")
        .args(["-s", "-m", "10", "--http2-prior-knowledge", "-D", "-"])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg("--data-binary")
        .arg(format!("@{}", msg.display()))
        .arg(format!(
            "http://127.0.0.1:{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            s.grpc.unwrap()
        ))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&o.stdout).to_lowercase();
    // tonic answers a message over its limit OUT_OF_RANGE.
    assert!(
        head.contains("grpc-status: 11"),
        "OUT_OF_RANGE expected: {head}"
    );
}

/// Out of descriptors: a failed accept waits (10 ms doubling to 1 s) instead of being tried
/// again at once, says so at most once every 10 s, and the listener serves again once
/// descriptors are free — on io_uring and on tokio. The server runs with room for exactly one
/// connection beyond what it holds idle (measured first), so that the second accept fails.
#[test]
fn out_of_descriptors_the_accept_backs_off() {
    // The same server under a descriptor limit of `nofile`.
    let limited = |runtime: &str, nofile: usize| {
        let (resp, http) = (free_port(), free_port());
        let mut cmd = Command::new("bash");
        cmd.args([
            "-c",
            &format!(
                "ulimit -n {nofile} && exec {bin} serve --workers 1 --runtime {runtime} \
                 --rules {RULES} --resp 127.0.0.1:{resp} --http 127.0.0.1:{http}",
                bin = bin()
            ),
        ])
        .env("RUST_LOG", "warn");
        let s = Server {
            child: common::spawn_listening(&mut cmd, &[resp, http]),
            resp,
            http,
            admin: None,
            grpc: None,
            dir: tempfile::tempdir().unwrap(),
        };
        // spawn_listening's probes were accepted and closed: back to idle.
        std::thread::sleep(Duration::from_millis(500));
        s
    };
    for runtime in ["uring", "per-core"] {
        // A descriptor limit bounds the numbers, and a new descriptor takes the lowest free
        // one: the limit that leaves exactly one free is the second free number at idle.
        let used = limited(runtime, 4096).fd_numbers();
        let mut free = (0..).filter(|n| !used.contains(n));
        let _one = free.next();
        let s = limited(runtime, free.next().unwrap() as usize);
        let cpu0 = s.cpu();
        let mut first = connect(s.resp);
        first.write_all(b"PING\r\n").unwrap();
        first
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 16];
        let n = first.read(&mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            b"+PONG\r\n",
            "{runtime}: the one connection is served"
        );
        // Every further accept fails while it is open.
        let held: Vec<TcpStream> = (0..40).map(|_| connect(s.resp)).collect();
        std::thread::sleep(Duration::from_secs(3));
        let spent = s.cpu() - cpu0;
        assert!(
            spent < Duration::from_millis(600),
            "{runtime}: {spent:?} of CPU in 3 s out of descriptors: a spin"
        );
        drop(held);
        drop(first);
        // Served again once the descriptors are back (the 40 queued ones drained first).
        let t0 = Instant::now();
        let answered = loop {
            let mut c = connect(s.resp);
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = c.write_all(b"PING\r\n");
            if matches!(c.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG")) {
                break true;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                break false;
            }
        };
        assert!(
            answered,
            "{runtime}: not serving after descriptors came back"
        );
        let errors = s.metric("turnstile_accept_errors_total{listener=\"resp\"}");
        assert!(errors >= 1.0, "{runtime}: {errors}");
        let log = s.stop_and_log();
        let lines = log.lines().filter(|l| l.contains("accept failed")).count();
        assert!(
            (1..=2).contains(&lines),
            "{runtime}: {lines} log lines: {log}"
        );
    }
}

/// The descriptors the server may open: raised to the hard limit at start, and said.
#[test]
fn the_soft_descriptor_limit_is_raised_and_logged() {
    let (resp, http) = (free_port(), free_port());
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        &format!(
            "ulimit -S -n 512 && exec {bin} serve --workers 1 --resp 127.0.0.1:{resp} --http 127.0.0.1:{http}",
            bin = bin()
        ),
    ])
    .env("RUST_LOG", "info");
    let s = common::spawn_listening(&mut cmd, &[resp, http]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", s.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_string();
    let nums: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(nums[0], nums[1], "soft raised to hard: {line}");
    let server = Server {
        child: s,
        resp,
        http,
        admin: None,
        grpc: None,
        dir: tempfile::tempdir().unwrap(),
    };
    let log = server.stop_and_log();
    assert!(
        log.contains("open files limit") && log.contains("soft_before=512"),
        "{log}"
    );
}

/// `--body-memory` is shared: connections holding unfinished bodies — without credentials,
/// or with them and as much as the budget takes — leave every other connection its own
/// allowance, so that an honest check's body still gets in. Without credentials a connection
/// holds nothing of the budget.
#[test]
fn bodies_held_by_some_connections_leave_others_their_own_allowance() {
    let s = Server::start(
        Opts {
            password: true,
            ..Opts::default()
        },
        &[
            "--body-memory",
            "1mb",
            "--max-body",
            "64kb",
            "--max-http-connections",
            "200",
            "--max-grpc-connections",
            "1",
            "--max-admin-connections",
            "1",
            "--auth-timeout",
            "60s",
        ],
    );
    let held = r#"turnstile_body_bytes{state="held"}"#;
    let budget = r#"turnstile_body_bytes{state="budget"}"#;
    // An unfinished body: the head announces 60 000 bytes, `sent` of them come.
    let hold = |auth: bool, sent: usize| {
        let mut c = connect(s.http);
        let bearer = if auth {
            format!("Authorization: Bearer {PASSWORD}\r\n")
        } else {
            String::new()
        };
        let head =
            format!("POST /v1/check HTTP/1.1\r\nHost: x\r\n{bearer}Content-Length: 60000\r\n\r\n");
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(&vec![b' '; sent]).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        c
    };
    // 40 connections without credentials, 15 000 bytes each (600 000 in all).
    let unauth: Vec<_> = (0..40).map(|_| hold(false, 15_000)).collect();
    assert_eq!(
        s.metric(held),
        0.0,
        "bodies before authentication hold nothing of --body-memory"
    );
    // With the password: bodies until the budget is spent to the byte (or takes no more).
    let mut authed = Vec::new();
    for _ in 0..60 {
        let before = s.metric(held);
        let rest = s.metric(budget) - before;
        if rest <= 0.0 {
            break;
        }
        authed.push(hold(true, (rest as usize).min(59_000)));
        if s.metric(held) == before {
            break;
        }
    }
    let check = r#"{"key_class":"customer","key":"7"}"#;
    for _ in 0..3 {
        let (code, body) = s.curl(s.http, "POST", "/v1/check", Some(PASSWORD), Some(check));
        assert_eq!(
            code, 200,
            "an honest check with the budget held by others: {body}"
        );
    }
    drop((unauth, authed));
}
