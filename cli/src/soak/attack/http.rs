//! The HTTP/1 attackers: tagged customer ids, slow headers, oversized bodies, requests
//! without credentials, slow or missing bodies, and big `/json` bodies.

use super::conn::Conn;
use super::{Outcome, Stats, Target, WAIT};
use crate::soak::probe::{read_response, HttpResponse, CLOSED};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::time::{sleep, timeout, timeout_at, Instant};

/// The start of a check request's body, padded to any length by the bytes that follow.
const PADDED: &[u8] = b"{\"key_class\":\"customer\",\"key\":\"1\",\"pad\":\"";

/// How the server's JSON error bodies start.
const JSON_ERROR: &str = "{\"error\":";

/// The server's answer on `c` within [`WAIT`]; none is unexpected.
pub(super) async fn answer(c: &mut Conn<'_>) -> Result<HttpResponse, Outcome> {
    match timeout(WAIT, read_response(&mut c.s, &mut c.buf)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(Outcome::Unexpected(e)),
        Err(_) => Err(Outcome::Unexpected("no answer within 5 s".into())),
    }
}

/// The server's answer on `c` within [`WAIT`], or `None` when it closed the connection
/// before answering (closed, or reset with bytes unread); no answer in time is unexpected.
pub(super) async fn answer_or_closed(c: &mut Conn<'_>) -> Result<Option<HttpResponse>, Outcome> {
    match timeout(WAIT, read_response(&mut c.s, &mut c.buf)).await {
        Ok(Ok(r)) => Ok(Some(r)),
        Ok(Err(e)) if e == CLOSED || e.contains("reset by peer") => Ok(None),
        Ok(Err(e)) => Err(Outcome::Unexpected(e)),
        Err(_) => Err(Outcome::Unexpected("no answer within 5 s".into())),
    }
}

/// Whether `r` is a `status` refusing a body because the server holds as many bodies as
/// `--body-memory` allows.
fn body_memory_full(r: &HttpResponse, status: u16) -> bool {
    r.status == status && text(r).contains("--body-memory")
}

/// An answer's body as text.
pub(super) fn text(r: &HttpResponse) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(&r.body)
}

/// An HTTP/1.1 request head.
pub(super) fn request(method: &str, path: &str, password: Option<&[u8]>, extra: &str) -> Vec<u8> {
    let mut v = format!("{method} {path} HTTP/1.1\r\nHost: soak\r\n{extra}").into_bytes();
    if let Some(p) = password {
        v.extend_from_slice(b"Authorization: Bearer ");
        v.extend_from_slice(p);
        v.extend_from_slice(b"\r\n");
    }
    v.extend_from_slice(b"\r\n");
    v
}

/// `POST /v1/check` of tagged ids with the password: each refused with the key's rule.
pub(super) async fn tagged_http(
    c: &mut Conn<'_>,
    t: &Target,
    until: Instant,
) -> Result<Outcome, Outcome> {
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let body = format!("{{\"key_class\":\"customer\",\"key\":\"org:{n}\"}}");
        let mut req = request(
            "POST",
            "/v1/check",
            t.password.as_deref(),
            &format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ),
        );
        req.extend_from_slice(body.as_bytes());
        if c.send(&req).await.is_err() {
            return Ok(Outcome::Unexpected("closed while sending".into()));
        }
        let r = answer(c).await?;
        if !((400..500).contains(&r.status) && text(&r).contains("is not a customer id")) {
            return Ok(Outcome::Unexpected(format!(
                "{} {:.120}",
                r.status,
                text(&r)
            )));
        }
    }
    Ok(Outcome::Expected("every tagged id refused"))
}

/// A request head a byte a second, never finished.
pub(super) async fn slowloris(c: &mut Conn<'_>, until: Instant) -> Result<Outcome, Outcome> {
    if c.send(b"POST /v1/check HTTP/1.1\r\nHost: soak\r\nX-Slow: ")
        .await
        .is_err()
    {
        return Ok(Outcome::Unexpected("closed at once".into()));
    }
    let mut chunk = [0u8; 1024];
    loop {
        let tick = timeout_at(until, async {
            tokio::select! {
                r = c.s.read(&mut chunk) => Some(r),
                () = sleep(Duration::from_secs(1)) => None,
            }
        })
        .await;
        match tick {
            Err(_) => {
                return Ok(Outcome::Expected(
                    "held to the end (within --header-timeout)",
                ))
            }
            Ok(Some(Ok(0))) | Ok(Some(Err(_))) => {
                return Ok(Outcome::Expected("closed by the server (--header-timeout)"))
            }
            Ok(Some(Ok(_))) => {
                // An answer (408, 431): the server refused the head; it closes next.
                return Ok(Outcome::Expected("answered an error, closed"));
            }
            Ok(None) => {
                if c.send(b"x").await.is_err() {
                    return Ok(Outcome::Expected("closed by the server (--header-timeout)"));
                }
            }
        }
    }
}

/// A body of 16 MiB: with its length, chunked, or without the password.
pub(super) async fn big_body(
    c: &mut Conn<'_>,
    t: &Target,
    attempt: u64,
) -> Result<Outcome, Outcome> {
    const BODY: usize = 16 << 20;
    let variant = attempt % 3;
    let (password, extra) = match variant {
        0 => (
            t.password.as_deref(),
            format!("Content-Type: application/json\r\nContent-Length: {BODY}\r\n"),
        ),
        1 => (
            t.password.as_deref(),
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n".to_string(),
        ),
        _ => (
            None,
            format!("Content-Type: application/json\r\nContent-Length: {BODY}\r\n"),
        ),
    };
    let head = request("POST", "/v1/check", password, &extra);
    if c.send(&head).await.is_err() {
        return Ok(Outcome::Unexpected("closed at once".into()));
    }
    let mut piece = PADDED.to_vec();
    piece.resize(64 << 10, b'x');
    let piece = if variant == 1 {
        let mut v = format!("{:x}\r\n", piece.len()).into_bytes();
        v.extend_from_slice(&piece);
        v.extend_from_slice(b"\r\n");
        v
    } else {
        piece
    };
    for _ in 0..BODY / (64 << 10) {
        match c.push(&piece, Duration::from_secs(2)).await {
            Ok(n) if n == piece.len() => {}
            Ok(n) if n > 0 => c.spray(&piece[n..], Duration::from_secs(2)).await,
            _ => break,
        }
    }
    let want = if password.is_none() && t.password.is_some() {
        401
    } else {
        413
    };
    let mut extra = std::mem::take(&mut c.buf);
    Ok(
        match timeout(WAIT, read_response(&mut c.s, &mut extra)).await {
            Ok(Ok(r)) if r.status == want => Outcome::Expected(if want == 401 {
                "401 without the password"
            } else {
                "413 past --max-body"
            }),
            Ok(Ok(r)) if want == 413 && body_memory_full(&r, 503) => {
                Outcome::Expected("503 with --body-memory in use by others")
            }
            Ok(Ok(r)) => {
                Outcome::Unexpected(format!("{} {:.120} to a 16 MiB body", r.status, text(&r)))
            }
            // Refused and closed with the body unread: a reset can take the answer with it.
            Ok(Err(_)) => Outcome::Expected("closed (reset; the answer not seen)"),
            Err(_) => Outcome::Unexpected("no answer within 5 s after a 16 MiB body".into()),
        },
    )
}

/// Requests without credentials on one keep-alive connection until the end.
pub(super) async fn no_creds(
    c: &mut Conn<'_>,
    t: &Target,
    until: Instant,
) -> Result<Outcome, Outcome> {
    let protected = t.password.is_some();
    let body = b"{\"key_class\":\"customer\",\"key\":\"1\"}";
    let opened = Instant::now();
    let mut i = 0u64;
    while Instant::now() < until {
        i += 1;
        let (req, want) = match (i % 4, protected) {
            (0, true) => {
                let mut r = request(
                    "POST",
                    "/v1/check",
                    None,
                    &format!(
                        "Content-Type: application/json\r\nContent-Length: {}\r\n",
                        body.len()
                    ),
                );
                r.extend_from_slice(body);
                (r, 401)
            }
            (1, true) => (
                request("GET", "/metrics", None, ""),
                if t.metrics_open { 200 } else { 401 },
            ),
            (2, true) => (
                request("POST", "/v1/reload", None, "Content-Length: 0\r\n"),
                401,
            ),
            (1, false) => (request("GET", "/metrics", None, ""), 200),
            _ => (request("GET", "/healthz", None, ""), 200),
        };
        // A connection that never authenticates is closed by the server's authentication
        // deadline: expected once it has answered.
        let closed = if i > 1 {
            Outcome::Expected(closed_label(opened))
        } else {
            Outcome::Unexpected("closed before the first answer".into())
        };
        if c.send(&req).await.is_err() {
            return Ok(closed);
        }
        let Some(r) = answer_or_closed(c).await? else {
            return Ok(closed);
        };
        if r.status != want {
            return Ok(Outcome::Unexpected(format!(
                "{} (wanted {want}) {:.120}",
                r.status,
                text(&r)
            )));
        }
        if want == 401 && !text(&r).starts_with(JSON_ERROR) {
            return Ok(Outcome::Unexpected(format!(
                "401 without the JSON error body: {:.120}",
                text(&r)
            )));
        }
    }
    Ok(Outcome::Expected(if protected {
        "every request refused (401), /healthz open"
    } else {
        "answered (no password set)"
    }))
}

/// "Closed by the server", with how long after `opened` (each span its own label).
pub(super) fn closed_label(opened: Instant) -> &'static str {
    match opened.elapsed().as_secs() {
        0..=1 => "closed by the server within 2 s",
        2..=9 => "closed by the server after 2-10 s",
        10..=29 => "closed by the server after 10-30 s",
        30..=59 => "closed by the server after 30-60 s",
        _ => "closed by the server after a minute or more",
    }
}

/// `POST /v1/check` with its whole head (a body of 1 KiB announced), with the password or
/// without, then the body one byte a second, or nothing: held until the server answers or
/// closes, or the end.
pub(super) async fn slow_body(
    c: &mut Conn<'_>,
    t: &Target,
    variant: u64,
    until: Instant,
) -> Result<Outcome, Outcome> {
    const LEN: usize = 1024;
    let creds = variant % 2 == 0;
    let trickle = (variant / 2) % 2 == 0;
    let password = if creds { t.password.as_deref() } else { None };
    let head = request(
        "POST",
        "/v1/check",
        password,
        &format!("Content-Type: application/json\r\nContent-Length: {LEN}\r\n"),
    );
    if c.send(&head).await.is_err() {
        return Ok(Outcome::Unexpected("closed at once".into()));
    }
    c.st.did(1);
    let opened = Instant::now();
    let mut body = PADDED.to_vec();
    body.resize(LEN, b'x');
    let mut at = 0;
    let mut chunk = [0u8; 1024];
    loop {
        let tick = timeout_at(until, async {
            tokio::select! {
                r = c.s.read(&mut chunk) => Some(r),
                () = sleep(Duration::from_secs(1)) => None,
            }
        })
        .await;
        match tick {
            Err(_) => return Ok(Outcome::Expected(held_label(trickle))),
            Ok(Some(Ok(0)) | Some(Err(_))) => {
                return Ok(Outcome::Expected(closed_label(opened)));
            }
            Ok(Some(Ok(n))) => {
                c.buf.extend_from_slice(&chunk[..n]);
                return Ok(Outcome::Expected(answered_label(&c.buf, opened)));
            }
            Ok(None) if trickle && at < LEN - 1 => {
                // One byte short of the length at most: the request never completes.
                if c.send(&body[at..at + 1]).await.is_err() {
                    return Ok(Outcome::Expected(closed_label(opened)));
                }
                at += 1;
            }
            Ok(None) => {}
        }
    }
}

fn held_label(trickle: bool) -> &'static str {
    if trickle {
        "body trickled, held to the end"
    } else {
        "body never sent, held to the end"
    }
}

/// The status of the response whose start is `buf`, with when it came.
fn answered_label(buf: &[u8], opened: Instant) -> &'static str {
    let status = std::str::from_utf8(buf)
        .ok()
        .and_then(|s| s.split_whitespace().nth(1))
        .unwrap_or("?");
    let soon = opened.elapsed() < Duration::from_secs(2);
    match (status, soon) {
        ("401", true) => "answered 401 at once",
        ("401", false) => "answered 401 later",
        ("408", _) => "answered 408 (body too slow)",
        ("400", _) => "answered 400",
        (_, true) => "answered at once",
        (_, false) => "answered later",
    }
}

/// The JSON request `POST /json` reads, padded to `len` bytes (an unknown field: a server
/// that reads it all answers 400).
fn json_body(len: usize) -> Vec<u8> {
    let mut b = b"{\"domain\":\"soak\",\"descriptors\":[{\"entries\":[{\"key\":\"k\",\"value\":\"v\"}]}],\"pad\":\"".to_vec();
    b.resize(len.saturating_sub(2), b'x');
    b.extend_from_slice(b"\"}");
    b
}

/// `POST /json` of several MiB: 3 MiB (under the route's own 4 MiB) or 6 MiB with the
/// password, 3 MiB without it. Past `--max-body` the server must refuse it (413, or 401
/// without credentials) rather than read it: a body past `--max-body` read whole and answered
/// is unexpected. Not sent while the attackers' body budget is spent.
pub(super) async fn json_big(
    c: &mut Conn<'_>,
    t: &Target,
    s: &Stats,
    variant: u64,
) -> Result<Outcome, Outcome> {
    let (len, creds) = match variant % 3 {
        0 => (3 << 20, true),
        1 => (6 << 20, true),
        _ => (3 << 20, false),
    };
    let mut budget = s.bodies();
    if !budget.more(len as u64) {
        return Ok(Outcome::Expected(
            "not sent: the attackers' body budget in use",
        ));
    }
    let password = if creds { t.password.as_deref() } else { None };
    let head = request(
        "POST",
        "/json",
        password,
        &format!("Content-Type: application/json\r\nContent-Length: {len}\r\n"),
    );
    if c.send(&head).await.is_err() {
        return Ok(Outcome::Unexpected("closed at once".into()));
    }
    c.st.did(1);
    let body = json_body(len);
    for piece in body.chunks(64 << 10) {
        match c.push(piece, Duration::from_secs(2)).await {
            Ok(n) if n == piece.len() => {}
            Ok(n) if n > 0 => c.spray(&piece[n..], Duration::from_secs(2)).await,
            _ => break,
        }
    }
    let refused_without = password.is_none() && t.password.is_some();
    let mut extra = std::mem::take(&mut c.buf);
    let r = match timeout(WAIT, read_response(&mut c.s, &mut extra)).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => return Ok(Outcome::Expected("closed (reset; the answer not seen)")),
        Err(_) => {
            return Ok(Outcome::Unexpected(format!(
                "no answer within 5 s after a {} MiB /json body",
                len >> 20
            )))
        }
    };
    Ok(match r.status {
        401 if refused_without => Outcome::Expected("401 without the password"),
        413 => Outcome::Expected("413 past --max-body"),
        404 => Outcome::Expected("404: no /json (the server has no --envoy-config)"),
        503 if body_memory_full(&r, 503) => {
            Outcome::Expected("503 with --body-memory in use by others")
        }
        400 if body_memory_full(&r, 400) => Outcome::Unexpected(format!(
            "400 (a client error; 503 expected) to a {} MiB /json body refused for --body-memory: {:.100}",
            len >> 20,
            text(&r)
        )),
        s if len <= t.max_body => Outcome::Expected(if s == 400 {
            "read whole (within --max-body), 400"
        } else {
            "read whole (within --max-body)"
        }),
        s => Outcome::Unexpected(format!(
            "{s} to a {} MiB /json body{}: read past --max-body ({} KiB) {:.80}",
            len >> 20,
            if password.is_some() {
                " with the password"
            } else {
                ""
            },
            t.max_body >> 10,
            text(&r)
        )),
    })
}
