//! The RESP attackers: frames past the bounds, the largest frame held, clients that never
//! read, unauthenticated floods, new CL.THROTTLE parameter sets, garbage, MULTI without EXEC
//! and tagged customer ids.

use super::conn::{ended, frame, Conn, End};
use super::http::closed_label;
use super::{Outcome, Rng, Stats, Target, WAIT};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::{sleep, timeout_at, Instant};

/// A frame past the bounds, then 256 KiB: answered `-ERR Protocol error` and closed.
pub(super) async fn giant(c: &mut Conn<'_>, t: &Target, attempt: u64) -> Result<Outcome, Outcome> {
    let authed = (attempt / 3) % 2 == 1;
    if authed {
        c.auth(t.password.as_deref()).await?;
    }
    let head: Vec<u8> = match attempt % 3 {
        0 => b"*128\r\n$524288\r\n".to_vec(),
        1 if authed => {
            format!("*2\r\n$4\r\nECHO\r\n${}\r\n", t.max_bulk.max(1024) * 128).into_bytes()
        }
        1 => b"*2\r\n$4\r\nAUTH\r\n$524288\r\n".to_vec(),
        _ => Vec::new(),
    };
    let rest = if head.is_empty() {
        // An inline line past every limit.
        vec![b'x'; t.max_inline.max(1024) * 4 + (256 << 10)]
    } else {
        vec![b'x'; 256 << 10]
    };
    if !head.is_empty() && c.send(&head).await.is_err() {
        return Ok(Outcome::Unexpected(
            "closed before the frame's header".into(),
        ));
    }
    c.spray(&rest, Duration::from_secs(2)).await;
    match c.line(WAIT).await {
        Ok(l) if l.starts_with("-ERR Protocol error") => match c.drain(WAIT).await {
            End::Closed | End::Error(_) => {
                Ok(Outcome::Expected("refused with a protocol error, closed"))
            }
            End::Quiet => Ok(Outcome::Unexpected(format!("{l}, then left open"))),
        },
        Ok(l) => Ok(Outcome::Unexpected(format!("answered {l:.80}"))),
        Err(End::Quiet) => Ok(Outcome::Unexpected(
            "no reply and still open 5 s after a frame past the bounds".into(),
        )),
        // Closed with the rest unread: the kernel resets the connection, and the reply may
        // be lost with it.
        Err(_) => Ok(Outcome::Expected("closed (reset; the reply not seen)")),
    }
}

/// All but the last byte of the largest frame the bounds allow, held until the end.
pub(super) async fn hold_frame(
    c: &mut Conn<'_>,
    t: &Target,
    until: Instant,
) -> Result<Outcome, Outcome> {
    c.auth(t.password.as_deref()).await?;
    let bulk = vec![b'h'; t.max_bulk];
    let parts: Vec<&[u8]> = (0..t.max_args).map(|_| &bulk[..]).collect();
    let mut f = frame(&parts);
    f.truncate(f.len() - 1);
    if c.send(&f).await.is_err() {
        return Ok(Outcome::Unexpected(
            "closed while sending an allowed frame".into(),
        ));
    }
    Ok(c.held(
        until,
        "closed by the server (idle timeout)",
        "held to the end",
    )
    .await)
}

/// Pipelines commands and never reads: `auth` first or not (an unauthenticated flood).
pub(super) async fn never_read(
    c: &mut Conn<'_>,
    t: &Target,
    s: &Stats,
    task: usize,
    until: Instant,
    auth: bool,
) -> Result<Outcome, Outcome> {
    if auth {
        c.auth(t.password.as_deref()).await?;
    }
    let key = format!("soak-attack:{task}");
    let mut batch = Vec::new();
    let mut throttles = 0u64;
    for i in 0..256 {
        match i % 3 {
            0 => batch.extend_from_slice(b"COMMAND\r\n"),
            1 => batch.extend_from_slice(&frame(&[b"INFO"])),
            _ => {
                batch.extend_from_slice(&frame(&[
                    b"CL.THROTTLE",
                    key.as_bytes(),
                    b"5",
                    b"10",
                    b"60",
                ]));
                throttles += 1;
            }
        }
    }
    let counted = auth || t.password.is_none();
    let mut at = 0;
    let mut blocked_since: Option<Instant> = None;
    loop {
        if Instant::now() >= until {
            return Ok(Outcome::Expected(if blocked_since.is_some() {
                "paused by the server, held to the end"
            } else {
                "still sending at the end"
            }));
        }
        match c.push(&batch[at..], Duration::from_secs(1)).await {
            Err(_) => {
                return Ok(Outcome::Expected(if auth {
                    "closed by the server (output limit or idle)"
                } else {
                    "closed by the server"
                }))
            }
            Ok(0) => {
                blocked_since.get_or_insert_with(Instant::now);
                // Blocked: the server stopped reading. Try again a little later.
                let _ = timeout_at(until, sleep(Duration::from_secs(1))).await;
            }
            Ok(n) => {
                blocked_since = None;
                at += n;
                if at == batch.len() {
                    at = 0;
                    if counted {
                        s.throttle_unread.fetch_add(throttles, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// Unauthenticated pipelines of CL.THROTTLE, reading every reply: each must be NOAUTH.
pub(super) async fn unauth_flood(
    c: &mut Conn<'_>,
    t: &Target,
    until: Instant,
) -> Result<Outcome, Outcome> {
    let one = frame(&[b"CL.THROTTLE", b"k", b"1", b"1", b"1"]);
    let batch = one.repeat(64);
    let opened = Instant::now();
    let mut answered = false;
    // Closed once answered: the server's authentication deadline (or its output bound).
    let closed = |answered: bool, e: String| {
        if answered {
            Outcome::Expected(closed_label(opened))
        } else {
            Outcome::Unexpected(format!("flood: {e} before the first answer"))
        }
    };
    while Instant::now() < until {
        if let Err(e) = c.send(&batch).await {
            return Ok(closed(answered, e.to_string()));
        }
        for _ in 0..64 {
            match c.reply(WAIT).await {
                Ok(l) if t.password.is_none() || l.starts_with("-NOAUTH") => answered = true,
                Ok(l) => return Ok(Outcome::Unexpected(format!("answered {l:.80} before AUTH"))),
                Err(e @ (End::Closed | End::Error(_))) => return Ok(closed(answered, ended(&e))),
                Err(e) => return Ok(Outcome::Unexpected(format!("flood: {}", ended(&e)))),
            }
        }
    }
    Ok(Outcome::Expected("every command answered NOAUTH"))
}

/// CL.THROTTLE with a parameter set never used before, one at a time.
pub(super) async fn new_params(
    c: &mut Conn<'_>,
    t: &Target,
    s: &Stats,
    task: usize,
    until: Instant,
) -> Result<Outcome, Outcome> {
    c.auth(t.password.as_deref()).await?;
    let mut made = 0u64;
    let mut refused = 0u64;
    while Instant::now() < until {
        let n = s.next_params.fetch_add(1, Ordering::Relaxed);
        let key = format!("soak-params:{task}");
        let burst = (1000 + n).to_string();
        if c.send(&frame(&[
            b"CL.THROTTLE",
            key.as_bytes(),
            burst.as_bytes(),
            b"1",
            b"60",
        ]))
        .await
        .is_err()
        {
            return Ok(Outcome::Unexpected("closed while sending".into()));
        }
        match c.line(WAIT).await {
            Ok(l) if l == "*5" => {
                // Its first element says whether it was admitted (a key whose parameters
                // change keeps its state: some are limited).
                let mut first = String::new();
                for i in 0..5 {
                    match c.line(WAIT).await {
                        Ok(x) if i == 0 => first = x,
                        Ok(_) => {}
                        Err(e) => {
                            return Ok(Outcome::Unexpected(format!("no reply: {}", ended(&e))))
                        }
                    }
                }
                made += 1;
                match first.as_str() {
                    ":0" => s.throttle_allowed_seen.fetch_add(1, Ordering::Relaxed),
                    ":1" => s.throttle_limited_seen.fetch_add(1, Ordering::Relaxed),
                    x => return Ok(Outcome::Unexpected(format!("answered *5, then {x:.40}"))),
                };
            }
            Ok(l) if l.starts_with("-ERR no room for another CL.THROTTLE store") => refused += 1,
            Ok(l) => return Ok(Outcome::Unexpected(format!("answered {l:.120}"))),
            Err(e) => return Ok(Outcome::Unexpected(format!("no reply: {}", ended(&e)))),
        }
    }
    Ok(Outcome::Expected(match (made, refused) {
        (_, 0) => "every new parameter set answered",
        (0, _) => "refused: no room for another store",
        _ => "answered, then refused: no room for another store",
    }))
}

/// Bytes no RESP client sends.
pub(super) async fn garbage(
    c: &mut Conn<'_>,
    attempt: u64,
    task: usize,
) -> Result<Outcome, Outcome> {
    let mut rng = Rng(0xDEAD_BEEF ^ (attempt << 20) ^ task as u64);
    let bytes: Vec<u8> = match (attempt + task as u64) % 8 {
        0 => (0..4096).map(|_| rng.next() as u8).collect(),
        1 => b"*3\r\n$3\r\nfoo\r\n:12\r\n+x\r\n".to_vec(),
        2 => b"*-5\r\n*1\r\n$-7\r\n".to_vec(),
        3 => b"$abc\r\n*x\r\n".to_vec(),
        4 => b"*2\r\n$99999999999999999999\r\n".to_vec(),
        5 => vec![0u8; 1024],
        6 => b"\r\n".repeat(2000),
        _ => b"*1\r\n$4\r\nPINGxx*1\r\n".to_vec(),
    };
    c.spray(&bytes, Duration::from_secs(2)).await;
    Ok(match c.drain(Duration::from_secs(2)).await {
        End::Closed | End::Error(_) if c.buf.starts_with(b"-ERR Protocol error") => {
            Outcome::Expected("refused with a protocol error, closed")
        }
        End::Closed | End::Error(_) => Outcome::Expected("closed"),
        End::Quiet if c.buf.is_empty() => Outcome::Expected("no reply, left open (incomplete)"),
        End::Quiet => Outcome::Expected("answered with errors, left open"),
    })
}

/// MULTI, then more commands than a transaction may queue, then nothing until the end.
pub(super) async fn multi(
    c: &mut Conn<'_>,
    t: &Target,
    until: Instant,
) -> Result<Outcome, Outcome> {
    c.auth(t.password.as_deref()).await?;
    let ping = frame(&[b"PING"]);
    let mut queued = 0u64;
    let mut refused = 0u64;
    c.send(&frame(&[b"MULTI"]))
        .await
        .map_err(|e| Outcome::Unexpected(e.to_string()))?;
    match c.line(WAIT).await {
        Ok(l) if l == "+OK" => {}
        Ok(l) => return Ok(Outcome::Unexpected(format!("MULTI answered {l}"))),
        Err(e) => return Ok(Outcome::Unexpected(format!("MULTI: {}", ended(&e)))),
    }
    for _ in 0..12 {
        if c.send(&ping.repeat(1000)).await.is_err() {
            return Ok(Outcome::Unexpected("closed while queueing".into()));
        }
        for _ in 0..1000 {
            match c.line(WAIT).await {
                Ok(l) if l == "+QUEUED" => queued += 1,
                Ok(l) if l.starts_with("-ERR the transaction is too large") => refused += 1,
                Ok(l) => return Ok(Outcome::Unexpected(format!("queueing answered {l:.80}"))),
                Err(e) => return Ok(Outcome::Unexpected(format!("queueing: {}", ended(&e)))),
            }
        }
    }
    if refused == 0 {
        return Ok(Outcome::Unexpected(format!(
            "{queued} commands queued in one MULTI, none refused"
        )));
    }
    Ok(c.held(
        until,
        "queue bounded, then closed by the server",
        "queue bounded, held to the end without EXEC",
    )
    .await)
}

/// `TURNSTILE.CHECK customer user:N`, 16 at a time: each refused.
pub(super) async fn tagged_resp(
    c: &mut Conn<'_>,
    t: &Target,
    attempt: u64,
    until: Instant,
) -> Result<Outcome, Outcome> {
    c.auth(t.password.as_deref()).await?;
    let mut n = attempt * 1_000_000;
    while Instant::now() < until {
        let mut batch = Vec::new();
        for _ in 0..16 {
            n += 1;
            let id = format!("user:{n}");
            batch.extend(frame(&[b"TURNSTILE.CHECK", b"customer", id.as_bytes()]));
        }
        if c.send(&batch).await.is_err() {
            return Ok(Outcome::Unexpected("closed while sending".into()));
        }
        for _ in 0..16 {
            match c.reply(WAIT).await {
                Ok(l) if l.contains("is not a customer id") => {}
                Ok(l) => return Ok(Outcome::Unexpected(format!("answered {l:.120}"))),
                Err(e) => return Ok(Outcome::Unexpected(format!("no reply: {}", ended(&e)))),
            }
        }
    }
    Ok(Outcome::Expected("every tagged id refused"))
}
