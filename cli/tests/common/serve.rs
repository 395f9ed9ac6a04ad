//! `turnstile serve` as a child on free loopback ports with the example rules, one worker and
//! the listeners a test asks for, and curl against it: the server the attack tests (guard,
//! hardening) start.

use super::{free_port, spawn_listening, spawn_listening_logged, Running};
use std::process::Command;

/// The example rules.
pub const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
/// The example Envoy configuration.
pub const ENVOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/envoy/");

/// What a test's server has beyond RESP and HTTP.
#[derive(Default, Clone, Copy)]
pub struct Listeners<'a> {
    /// The client password, in a `--requirepass-file`.
    pub password: Option<&'a str>,
    /// An `--admin` listener on loopback, with this password in an `--admin-pass-file`.
    pub admin: Option<&'a str>,
    /// A `--grpc` listener with the example Envoy configuration.
    pub grpc: bool,
    /// The server's standard error in `server.log` of its directory rather than a pipe (a
    /// server that logs much under attack must not block on a pipe no one reads).
    pub log: bool,
}

/// A server for one test, killed when dropped (also when the test fails).
pub struct Served {
    pub child: Running,
    pub resp: u16,
    pub http: u16,
    pub admin: Option<u16>,
    pub grpc: Option<u16>,
    pub dir: tempfile::TempDir,
}

/// Starts `bin serve` with `l` and `extra` flags; waits (at most 30 s) until its listeners
/// accept.
pub fn start(bin: &str, l: Listeners<'_>, extra: &[&str]) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let (resp, http) = (free_port(), free_port());
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--workers", "1", "--throttle-keys", "10000"])
        .args(["--rules", RULES])
        .args(["--resp", &format!("127.0.0.1:{resp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(extra)
        .env("RUST_LOG", "warn");
    if let Some(pw) = l.password {
        let f = dir.path().join("password");
        std::fs::write(&f, format!("{pw}\n")).unwrap();
        cmd.arg("--requirepass-file").arg(f);
    }
    let admin = l.admin.map(|pw| {
        let (p, f) = (free_port(), dir.path().join("admin-password"));
        std::fs::write(&f, pw).unwrap();
        cmd.arg("--admin-pass-file")
            .arg(f)
            .args(["--admin", &format!("127.0.0.1:{p}")]);
        p
    });
    let grpc = l.grpc.then(|| {
        let p = free_port();
        cmd.args(["--grpc", &format!("127.0.0.1:{p}")])
            .args(["--envoy-config", ENVOY]);
        p
    });
    let ports: Vec<u16> = [Some(resp), Some(http), admin, grpc]
        .into_iter()
        .flatten()
        .collect();
    let child = if l.log {
        spawn_listening_logged(&mut cmd, &ports, &dir.path().join("server.log"))
    } else {
        spawn_listening(&mut cmd, &ports)
    };
    Served {
        child,
        resp,
        http,
        admin,
        grpc,
        dir,
    }
}

/// `bin serve` with `args` on free RESP and HTTP ports, once those and, given
/// `--grpc 127.0.0.1:PORT` in `args`, that port accept (at most 30 s): (process, RESP port,
/// HTTP port). The tests that need more than [`start`]'s example rules and one worker.
pub fn with_args(bin: &str, args: &[&str]) -> (Running, u16, u16) {
    let (resp, http) = (free_port(), free_port());
    let grpc = args
        .iter()
        .position(|a| *a == "--grpc")
        .and_then(|i| args.get(i + 1))
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse::<u16>().ok());
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .args(["--resp", &format!("127.0.0.1:{resp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(args)
        .env("RUST_LOG", "warn");
    let ports: Vec<u16> = [resp, http].into_iter().chain(grpc).collect();
    (spawn_listening(&mut cmd, &ports), resp, http)
}

/// curl at 127.0.0.1:`port` (at most 10 s), with a bearer token and a body (sent as JSON if
/// `json`): the status (0 if none came) and the body.
pub fn curl(
    port: u16,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&str>,
    json: bool,
) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-s", "-m", "10", "-w", "\n%{http_code}", "-X", method]);
    if let Some(b) = bearer {
        c.args(["-H", &format!("Authorization: Bearer {b}")]);
    }
    if json {
        c.args(["-H", "content-type: application/json"]);
    }
    if let Some(b) = body {
        c.args(["--data-binary", b]);
    }
    let o = c
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl runs (cargo xtask test installs it)");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}
