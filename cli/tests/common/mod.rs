//! What several of the CLI's test files share.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};

pub mod serve;

/// A self-signed certificate for `localhost` and 127.0.0.1, and its key, written as PEM files
/// into `dir`: (certificate, key).
pub fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let c =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("rcgen makes a certificate");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

/// Waits for `child` at most `limit`: its exit status, or `None` once it has been killed for
/// running past it.
pub fn wait_bounded(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A loopback port free at the time of asking (the OS may hand it out again; a server started
/// on it would then fail with a clear `cannot listen`, and the test says so).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server process, killed when dropped (also on a failed assertion). Derefs to its
/// [`std::process::Child`].
pub struct Running(pub std::process::Child);

impl std::ops::Deref for Running {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `cmd` (standard output discarded, standard error kept for the message of a failed
/// start) and waits, at most 30 s in all, until each of `ports` accepts on 127.0.0.1. Panics
/// with what the server wrote if it exits first.
pub fn spawn_listening(cmd: &mut std::process::Command, ports: &[u16]) -> Running {
    spawn_listening_to(cmd, ports, std::process::Stdio::piped(), None)
}

/// [`spawn_listening`] with the server's standard error written to `log` (a server that logs
/// much under attack must not block on a pipe no one reads; the soak reads the file).
pub fn spawn_listening_logged(
    cmd: &mut std::process::Command,
    ports: &[u16],
    log: &Path,
) -> Running {
    let f = std::fs::File::create(log).expect("the server's log file");
    spawn_listening_to(cmd, ports, std::process::Stdio::from(f), Some(log))
}

fn spawn_listening_to(
    cmd: &mut std::process::Command,
    ports: &[u16],
    stderr: std::process::Stdio,
    log: Option<&Path>,
) -> Running {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("turnstile serve starts");
    let mut s = Running(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    for &port in ports {
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(st) = s.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = s.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                if let Some(l) = log {
                    err = std::fs::read_to_string(l).unwrap_or_default();
                }
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
