//! What several of the CLI's test files share.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};

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
