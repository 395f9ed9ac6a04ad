//! `turnstile serve --tls-cert --tls-key` as a user runs it: the real binary on free loopback
//! ports with a certificate made here (rcgen), spoken to by `redis-cli --tls` and `curl
//! --cacert`, with a password; a client that speaks plain text to a TLS listener gets nothing.

mod common;
use common::free_port;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_turnstile");

/// The server, killed when dropped (also on a failed assertion).
struct Server {
    _child: common::Running,
    resp: u16,
    http: u16,
}

fn start(dir: &Path, extra: &[&str]) -> Server {
    let (cert, key) = common::self_signed(dir);
    let pass = dir.join("pass");
    std::fs::write(&pass, "s3cret\n").unwrap();
    let (resp, http) = (free_port(), free_port());
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--workers", "1", "--throttle-keys", "1000"])
        .args(["--resp", &format!("127.0.0.1:{resp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .arg("--requirepass-file")
        .arg(&pass)
        .args(extra)
        .env("RUST_LOG", "warn");
    let child = common::spawn_listening(&mut cmd, &[resp, http]);
    Server {
        _child: child,
        resp,
        http,
    }
}

fn run(c: &mut Command) -> Output {
    c.output()
        .unwrap_or_else(|e| panic!("{c:?}: {e} (apt-get install redis-tools curl)"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn redis_cli_and_curl_over_tls_with_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), &[]);
    let cert = dir.path().join("cert.pem");
    let cli = |args: &[&str]| {
        run(Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&cert)
            .args(["-h", "127.0.0.1", "-p", &s.resp.to_string()])
            .args(args))
    };
    // With the password: CL.THROTTLE answers; without: NOAUTH.
    let o = cli(&[
        "-a",
        "s3cret",
        "--no-auth-warning",
        "CL.THROTTLE",
        "k",
        "1",
        "1",
        "60",
    ]);
    assert_eq!(text(&o).trim(), "0\n2\n1\n-1\n60", "{}", text(&o));
    let o = cli(&["CL.THROTTLE", "k", "1", "1", "60"]);
    assert!(text(&o).contains("NOAUTH"), "{}", text(&o));

    let url = |path: &str| format!("https://127.0.0.1:{}{path}", s.http);
    let curl = |args: &[&str]| {
        run(Command::new("curl")
            .args([
                "-s",
                "-m",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--cacert",
            ])
            .arg(&cert)
            .args(args))
    };
    let body = r#"{"key_class":"customer","key":"1"}"#;
    // No rules loaded: 503 once authenticated, 401 before; /healthz open.
    let o = curl(&["-XPOST", &url("/v1/check"), "-d", body]);
    assert_eq!(text(&o), "401");
    let o = curl(&[
        "-XPOST",
        &url("/v1/check"),
        "-H",
        "authorization: Bearer s3cret",
        "-d",
        body,
    ]);
    assert_eq!(text(&o), "503");
    assert_eq!(text(&curl(&[&url("/healthz")])), "200");
    // HTTP/2 by ALPN.
    let o = curl(&[
        "--http2",
        "-w",
        "%{http_code} %{http_version}",
        &url("/healthz"),
    ]);
    assert_eq!(text(&o), "200 2");

    // Plain text to the TLS listener: no RESP reply, closed.
    let mut plain = TcpStream::connect(("127.0.0.1", s.resp)).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    plain.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(
        !got.starts_with(b"+PONG"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}

#[test]
fn a_broken_certificate_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate\n").unwrap();
    let (resp, http) = (free_port(), free_port());
    let o = run(Command::new(BIN)
        .args(["serve", "--resp", &format!("127.0.0.1:{resp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .arg("--tls-cert")
        .arg(&bad)
        .arg("--tls-key")
        .arg(&bad));
    assert!(!o.status.success());
    let err = text(&o);
    assert!(
        err.contains("--tls-cert") && err.contains("bad.pem"),
        "{err}"
    );
    // A key without its certificate is a usage error.
    let o = run(Command::new(BIN).args(["serve", "--tls-key"]).arg(&bad));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
