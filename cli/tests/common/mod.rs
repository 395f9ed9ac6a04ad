//! What several of the CLI's test files share.
#![allow(dead_code)]

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
