//! The attackers that hold connections without doing anything the server must answer for
//! long: descriptor hogs (idle connections on every listener, as many as allowed) and
//! unauthenticated RESP holders (a PING now and then, never AUTH).

use super::conn::{frame, Conn, End};
use super::http::closed_label;
use super::stats::Stats;
use super::{note, Kind, Outcome, Proto, Target, WAIT};
use std::time::Duration;
use tokio::time::{sleep, timeout_at, Instant};

/// The descriptor hogs' own limit: idle connections held by all of them at once (and no more
/// than `--connections`).
pub const FD_HOG_LIMIT: usize = 10_000;

/// Idle connections, from `first` up to [`Target::hog_each`], spread over RESP, HTTP and gRPC
/// and opened one after another until one fails; then held, looking once a second which of
/// them the server closed, until all are closed or the end.
pub(super) async fn fd_hog<'a>(
    first: Conn<'a>,
    t: &Target,
    s: &'a Stats,
    task: usize,
    until: Instant,
) -> Result<Outcome, Outcome> {
    let st = s.of(Kind::FdHog);
    let l = t.listeners();
    let mut on = vec![Proto::Resp];
    if l.http {
        on.push(Proto::Http);
    }
    if l.grpc {
        on.push(Proto::Grpc);
    }
    let mut held = vec![first];
    while held.len() < t.hog_each && Instant::now() < until {
        let p = on[(task + held.len()) % on.len()];
        let Some(addr) = t.addr(p) else { break };
        match Conn::open(addr, Kind::FdHog, st, s.proto(p)).await {
            Ok(c) => held.push(c),
            Err(o) => {
                // As many as it could: the rest of this attempt holds those.
                note(st, o);
                break;
            }
        }
    }
    let total = held.len();
    st.did(total as u64);
    let opened = Instant::now();
    loop {
        held.retain_mut(|c| !c.closed());
        if held.is_empty() {
            return Ok(Outcome::Expected(closed_label(opened)));
        }
        if timeout_at(until, sleep(Duration::from_secs(1)))
            .await
            .is_err()
        {
            return Ok(Outcome::Expected(if held.len() == total {
                "every connection held to the end"
            } else {
                "some closed by the server, the rest held to the end"
            }));
        }
    }
}

/// Never AUTH; a PING every 2-4 s (each answered NOAUTH, which a server's idle timer counts as
/// progress), until the server closes the connection or the end.
pub(super) async fn unauth_holder(
    c: &mut Conn<'_>,
    t: &Target,
    task: usize,
    until: Instant,
) -> Result<Outcome, Outcome> {
    let opened = Instant::now();
    let ping = frame(&[b"PING"]);
    let every = Duration::from_millis(2000 + (task as u64 % 9) * 250);
    loop {
        if c.send(&ping).await.is_err() {
            return Ok(Outcome::Expected(closed_label(opened)));
        }
        c.st.did(1);
        match c.line(WAIT).await {
            Ok(l) if l.starts_with("-NOAUTH") => {}
            Ok(l) if t.password.is_none() && l == "+PONG" => {}
            Ok(l) => {
                return Ok(Outcome::Unexpected(format!(
                    "PING before AUTH answered {l:.80}"
                )))
            }
            Err(End::Quiet) => return Ok(Outcome::Expected("PING unanswered within 5 s")),
            Err(_) => return Ok(Outcome::Expected(closed_label(opened))),
        }
        let next = Instant::now() + every;
        if c.hold(next.min(until)).await {
            return Ok(Outcome::Expected(closed_label(opened)));
        }
        if Instant::now() >= until {
            return Ok(Outcome::Expected(if t.password.is_some() {
                "held to the end without AUTH, every PING answered NOAUTH"
            } else {
                "held to the end (no password set)"
            }));
        }
    }
}
