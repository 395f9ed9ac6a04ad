//! What the server's tests share: curl against the real HTTP listener.
#![allow(dead_code)]

use std::process::Command;

/// curl (at most 10 s): the status, the head (lower case) and the body.
pub fn curl_head(method: &str, url: &str, body: Option<&str>) -> (u16, String, String) {
    let mut c = Command::new("curl");
    c.args(["-s", "-i", "-m", "10", "-X", method, url]);
    if let Some(b) = body {
        c.args(["-H", "content-type: application/json", "--data-binary", b]);
    }
    let o = c.output().expect("curl runs (apt-get install curl)");
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// curl: the status and the body.
pub fn curl(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let (status, _, body) = curl_head(method, url, body);
    (status, body)
}
