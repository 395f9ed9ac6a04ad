//! The attackers on credentials: wrong passwords as fast as the server answers them (RESP
//! AUTH, HTTP Bearer tokens, gRPC `authorization` metadata), and the admin listener's
//! operations without credentials or with the client password.

use super::conn::{frame, Conn, End};
use super::http::{answer, request, text};
use super::http2::{drive, grpc_frame, grpc_head, handshake, message, ready};
use super::{Outcome, Proto, Target, WAIT};
use bytes::Bytes;
use std::time::Duration;
use tokio::time::Instant;

/// How long one connection guesses before it is closed (and another made).
const GUESS_FOR: Duration = Duration::from_secs(5);

/// Wrong passwords checked (and refused) per second on one connection above which it was not
/// slowed. A refusal without a check (the source over its attempts: 429, RESOURCE_EXHAUSTED,
/// `-ERR too many wrong passwords`) tells a guesser nothing and is counted apart.
pub const SLOWED_PER_SECOND: f64 = 10.0;

/// The answers to one connection's wrong passwords.
#[derive(Default)]
struct Count {
    /// Checked and refused.
    checked: u64,
    /// Refused without a check.
    unchecked: u64,
}

/// How a run of guesses on one connection ended.
enum Guessed {
    /// Its time was up.
    Stopped,
    /// The server closed the connection.
    Closed,
    /// The server held its answer past [`WAIT`].
    Delayed,
    /// What the server should not have said (a wrong password accepted among them).
    Wrong(String),
}

/// Wrong passwords on one connection for [`GUESS_FOR`] (or until the end): refused at more
/// than [`SLOWED_PER_SECOND`] is unexpected, and so is a wrong password accepted.
pub(super) async fn guess(
    c: &mut Conn<'_>,
    t: &Target,
    proto: Proto,
    attempt: u64,
    until: Instant,
) -> Result<Outcome, Outcome> {
    if t.password.is_none() {
        return Ok(Outcome::Expected("no password set: nothing to guess"));
    }
    let start = Instant::now();
    let stop = until.min(start + GUESS_FOR);
    let mut n = Count::default();
    let end = match proto {
        Proto::Http => http_guesses(c, attempt, stop, &mut n).await,
        Proto::Grpc => grpc_guesses(c, t, attempt, stop, &mut n).await,
        _ => resp_guesses(c, attempt, stop, &mut n).await,
    };
    c.st.did(n.checked + n.unchecked);
    let secs = start.elapsed().as_secs_f64().max(1e-3);
    let checked = n.checked;
    Ok(match end {
        Guessed::Wrong(e) => Outcome::Unexpected(e),
        Guessed::Closed => Outcome::Expected("closed by the server after wrong passwords"),
        Guessed::Delayed => Outcome::Expected("answers held past 5 s (slowed)"),
        Guessed::Stopped if checked as f64 / secs > SLOWED_PER_SECOND && secs >= 1.0 => {
            Outcome::Unexpected(format!(
                "{checked} wrong passwords checked in {secs:.1} s on one {} connection: not slowed",
                proto.name()
            ))
        }
        // Slowed by the server, or by the attackers' own thread when it is busy: the rate
        // alone cannot tell which.
        Guessed::Stopped if n.unchecked > 0 => {
            Outcome::Expected("at most 10 checked a second, the rest refused unchecked")
        }
        Guessed::Stopped => Outcome::Expected("at most 10 checked a second"),
    })
}

/// `AUTH wrong-password`, 16 at a time.
async fn resp_guesses(c: &mut Conn<'_>, attempt: u64, stop: Instant, n: &mut Count) -> Guessed {
    while Instant::now() < stop {
        let mut batch = Vec::new();
        for i in 0..16 {
            let pw = format!("soak-guess-{attempt}-{}", n.checked + n.unchecked + i);
            batch.extend(frame(&[b"AUTH", pw.as_bytes()]));
        }
        if c.send(&batch).await.is_err() {
            return Guessed::Closed;
        }
        for _ in 0..16 {
            match c.line(WAIT).await {
                Ok(l) if l.starts_with("-ERR too many wrong passwords") => n.unchecked += 1,
                Ok(l) if l.starts_with('-') => n.checked += 1,
                Ok(l) => return Guessed::Wrong(format!("a wrong AUTH answered {l:.80}")),
                Err(End::Quiet) => return Guessed::Delayed,
                Err(_) => return Guessed::Closed,
            }
        }
    }
    Guessed::Stopped
}

/// `POST /v1/check` with a wrong Bearer token, one after another on one connection.
async fn http_guesses(c: &mut Conn<'_>, attempt: u64, stop: Instant, n: &mut Count) -> Guessed {
    let body = b"{\"key_class\":\"customer\",\"key\":\"1\"}";
    while Instant::now() < stop {
        let pw = format!("soak-guess-{attempt}-{}", n.checked + n.unchecked);
        let mut req = request(
            "POST",
            "/v1/check",
            Some(pw.as_bytes()),
            &format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ),
        );
        req.extend_from_slice(body);
        if c.send(&req).await.is_err() {
            return Guessed::Closed;
        }
        match answer(c).await {
            Ok(r) if matches!(r.status, 429 | 503) => n.unchecked += 1,
            Ok(r) if matches!(r.status, 401 | 403) => n.checked += 1,
            Ok(r) => {
                return Guessed::Wrong(format!(
                    "a wrong Bearer token answered {} {:.80}",
                    r.status,
                    text(&r)
                ))
            }
            Err(_) => return Guessed::Closed,
        }
    }
    Guessed::Stopped
}

/// ShouldRateLimit calls with wrong `authorization` metadata, one after another on one
/// HTTP/2 connection.
async fn grpc_guesses(
    c: &mut Conn<'_>,
    t: &Target,
    attempt: u64,
    stop: Instant,
    n: &mut Count,
) -> Guessed {
    let Ok((mut send, mut conn)) = handshake(&mut c.s).await else {
        return Guessed::Closed;
    };
    let frame = Bytes::from(grpc_frame(&message(4)));
    while Instant::now() < stop {
        if !ready(&mut send, &mut conn, WAIT).await {
            return Guessed::Delayed;
        }
        let pw = format!("soak-guess-{attempt}-{}", n.checked + n.unchecked);
        let Ok((answer, mut stream)) = send.send_request(grpc_head(t, Some(pw.as_bytes())), false)
        else {
            return Guessed::Closed;
        };
        if stream.send_data(frame.clone(), true).is_err() {
            return Guessed::Closed;
        }
        match drive(&mut conn, tokio::time::timeout(WAIT, answer)).await {
            None | Some(Ok(Err(_))) => return Guessed::Closed,
            Some(Err(_)) => return Guessed::Delayed,
            Some(Ok(Ok(r))) => match r.headers().get("grpc-status").map(|s| s.as_bytes()) {
                Some(b"0") | None => {
                    return Guessed::Wrong(format!(
                        "a wrong authorization answered {} grpc-status {:?}",
                        r.status(),
                        r.headers().get("grpc-status")
                    ))
                }
                // RESOURCE_EXHAUSTED: refused unchecked.
                Some(b"8") => n.unchecked += 1,
                Some(_) => n.checked += 1,
            },
        }
    }
    Guessed::Stopped
}

/// The admin listener's operations that change the server: a key's limit set and a reload,
/// without credentials and with the client password, one after another on one connection.
/// Passing the credentials check (anything but 401 or 403) is unexpected when the server has
/// a password: without credentials, and with the client password, which never grants admin.
pub(super) async fn admin(c: &mut Conn<'_>, t: &Target, task: usize) -> Result<Outcome, Outcome> {
    let open = t.password.is_none() && t.admin_password != Some(true);
    let limit = format!("/v1/limits/customer/{}", 9_000_000_000_000u64 + task as u64);
    let spec = "1000000/1s";
    let mut ops: Vec<(&str, &str, Option<&[u8]>, &str)> = vec![
        ("PUT", &limit, None, spec),
        ("POST", "/v1/reload", None, ""),
    ];
    if let Some(p) = t.password.as_deref() {
        ops.push(("PUT", &limit, Some(p), spec));
        ops.push(("POST", "/v1/reload", Some(p), ""));
    }
    for (method, path, pw, body) in ops {
        let mut req = request(
            method,
            path,
            pw,
            &format!(
                "Content-Type: text/plain\r\nContent-Length: {}\r\n",
                body.len()
            ),
        );
        req.extend_from_slice(body.as_bytes());
        if c.send(&req).await.is_err() {
            return Ok(Outcome::Expected("closed by the server"));
        }
        c.st.did(1);
        let r = answer(c).await?;
        if matches!(r.status, 401 | 403) || open {
            continue;
        }
        return Ok(Outcome::Unexpected(format!(
            "{method} {path} answered {} {} on --admin: {:.80}",
            r.status,
            if pw.is_some() {
                "with the client password"
            } else {
                "without credentials"
            },
            text(&r)
        )));
    }
    Ok(Outcome::Expected(if open {
        "answered (no password set: the admin listener is open)"
    } else {
        "every admin operation refused (401/403)"
    }))
}
