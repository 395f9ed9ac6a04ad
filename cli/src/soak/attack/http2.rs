//! The HTTP/2 attackers, through h2's client driven by hand on the attacker's own socket:
//! connections that open as many streams as the server allows, each with a body one byte
//! short of `--max-body` and never ended (on the HTTP listener with prior knowledge, and on
//! the gRPC listener); the h2c upgrade asked over HTTP/1; and gRPC calls whose message is
//! trickled, or the preface alone. What the gRPC guesser shares with them is here too.

use super::conn::Conn;
use super::http::{closed_label, request};
use super::{Outcome, Proto, Stats, Target, WAIT};
use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, timeout_at, Instant};

/// An HTTP/2 client connection on an attacker's socket.
pub(super) type H2Conn<'s> = h2::client::Connection<&'s mut TcpStream, Bytes>;
pub(super) type Sender = h2::client::SendRequest<Bytes>;

/// The attacker's own cap on streams per connection (the server's own limit, from its
/// SETTINGS, is lower: `--max-streams`).
const MAX_STREAMS: usize = 256;

/// The gRPC method every gRPC attacker calls.
pub(super) const SHOULD_RATE_LIMIT: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The HTTP/2 handshake on `s`, and the server's SETTINGS received (a ping's round trip: the
/// server sends them first).
pub(super) async fn handshake(s: &mut TcpStream) -> Result<(Sender, H2Conn<'_>), String> {
    let (send, mut conn) = timeout(
        WAIT,
        h2::client::Builder::new()
            .initial_max_send_streams(MAX_STREAMS)
            .handshake::<_, Bytes>(s),
    )
    .await
    .map_err(|_| "no HTTP/2 handshake within 5 s".to_string())?
    .map_err(|e| e.to_string())?;
    let mut pp = conn.ping_pong().ok_or("no ping")?;
    match drive(&mut conn, timeout(WAIT, pp.ping(h2::Ping::opaque()))).await {
        Some(Ok(Ok(_))) => Ok((send, conn)),
        Some(Ok(Err(e))) => Err(e.to_string()),
        Some(Err(_)) => Err("no PING answer within 5 s".into()),
        None => Err("closed at the handshake".into()),
    }
}

/// Awaits `f` while driving `conn` (which sends what the streams queued and reads what the
/// server sends): `None` when the connection ended first.
pub(super) async fn drive<F: Future>(conn: &mut H2Conn<'_>, f: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        v = f => Some(v),
        _ = conn => None,
    }
}

/// Waits, driving `conn`, until a new stream may be opened: `false` when none may within
/// `wait` (the server's limit reached) or the connection failed.
pub(super) async fn ready(send: &mut Sender, conn: &mut H2Conn<'_>, wait: Duration) -> bool {
    let r = drive(
        conn,
        timeout(wait, std::future::poll_fn(|cx| send.poll_ready(cx))),
    )
    .await;
    matches!(r, Some(Ok(Ok(()))))
}

/// A ShouldRateLimit request whose domain is `domain_len` bytes long, encoded.
pub(super) fn message(domain_len: usize) -> Vec<u8> {
    use prost::Message;
    RateLimitRequest {
        domain: "s".repeat(domain_len.max(1)),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "soak_attack".into(),
                value: "1".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
    .encode_to_vec()
}

/// A gRPC message frame: not compressed, its length, the message.
pub(super) fn grpc_frame(msg: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8];
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    f
}

/// The head of a ShouldRateLimit call to `t`'s gRPC listener, with `bearer` as its
/// `authorization` metadata if given.
pub(super) fn grpc_head(t: &Target, bearer: Option<&[u8]>) -> http::Request<()> {
    let addr = t.grpc.map_or("127.0.0.1".to_string(), |a| a.to_string());
    let mut r = http::Request::post(format!("http://{addr}{SHOULD_RATE_LIMIT}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(b) = bearer {
        let mut v = b"Bearer ".to_vec();
        v.extend_from_slice(b);
        r = r.header("authorization", v);
    }
    r.body(()).expect("a valid request head")
}

/// The head of a `POST /v1/check` of `len` bytes to the HTTP listener over HTTP/2.
fn check_head(t: &Target, len: usize, password: Option<&[u8]>) -> http::Request<()> {
    let addr = t.http.map_or("127.0.0.1".to_string(), |a| a.to_string());
    let mut r = http::Request::post(format!("http://{addr}/v1/check"))
        .header("content-type", "application/json")
        .header("content-length", len);
    if let Some(p) = password {
        let mut v = b"Bearer ".to_vec();
        v.extend_from_slice(p);
        r = r.header("authorization", v);
    }
    r.body(()).expect("a valid request head")
}

/// As many streams as the server allows on one connection, each a request whose body is one
/// byte short of `--max-body` (announced longer) and never ended; with the password in half
/// the variants. Held until the server answers or resets every stream, closes, or the end.
/// One variant in eight on the HTTP listener asks for the h2c upgrade instead. No more
/// streams are opened while the attackers' body budget is spent.
pub(super) async fn streams(
    c: &mut Conn<'_>,
    t: &Target,
    s: &Stats,
    proto: Proto,
    variant: u64,
    until: Instant,
) -> Result<Outcome, Outcome> {
    if proto == Proto::HttpH2 && (variant / 2) % 8 == 7 {
        return h2c_upgrade(c).await;
    }
    let password = if (variant / 2) % 2 == 0 {
        t.password.as_deref()
    } else {
        None
    };
    let grpc = proto == Proto::Grpc;
    let each = t.max_body.saturating_sub(1).max(6);
    let body = Bytes::from(if grpc {
        // The frame announces a message longer than what is sent.
        let mut f = grpc_frame(&vec![b'x'; each + 64]);
        f.truncate(each);
        f
    } else {
        vec![b'{'; each]
    });
    let st = c.st;
    let opened = Instant::now();
    let Ok((mut send, mut conn)) = handshake(&mut c.s).await else {
        return Ok(Outcome::Expected(
            "closed by the server at the HTTP/2 handshake",
        ));
    };
    let max = send.current_max_send_streams().min(MAX_STREAMS);
    let mut answers = FuturesUnordered::new();
    let mut open = Vec::new();
    let mut budget = s.bodies();
    while open.len() < max && Instant::now() < until && budget.more(body.len() as u64) {
        if !ready(&mut send, &mut conn, Duration::from_secs(2)).await {
            break;
        }
        let head = if grpc {
            grpc_head(t, password)
        } else {
            check_head(t, each + 1, password)
        };
        let Ok((answer, mut stream)) = send.send_request(head, false) else {
            break;
        };
        if stream.send_data(body.clone(), false).is_err() {
            break;
        }
        st.did(1);
        st.sent(body.len());
        open.push(stream);
        answers.push(answer);
    }
    let (mut answered, mut reset) = (0u64, 0u64);
    loop {
        match timeout_at(until, drive(&mut conn, answers.next())).await {
            Err(_) => return Ok(Outcome::Expected("streams held to the end")),
            Ok(None) => return Ok(Outcome::Expected(closed_label(opened))),
            Ok(Some(Some(Ok(_)))) => answered += 1,
            Ok(Some(Some(Err(_)))) => reset += 1,
            Ok(Some(None)) => break,
        }
    }
    Ok(Outcome::Expected(match (answered, reset) {
        (0, 0) => "no stream opened (the attackers' body budget in use)",
        (_, 0) => "every stream answered before its body ended",
        (0, _) => "every stream reset by the server",
        _ => "every stream answered or reset before its body ended",
    }))
}

/// HTTP/1 with `Upgrade: h2c`: what the server answers.
async fn h2c_upgrade(c: &mut Conn<'_>) -> Result<Outcome, Outcome> {
    let head = request(
        "GET",
        "/healthz",
        None,
        "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n",
    );
    if c.send(&head).await.is_err() {
        return Ok(Outcome::Unexpected("closed at once".into()));
    }
    c.st.did(1);
    Ok(match c.line(WAIT).await {
        Ok(l) if l.contains(" 101 ") => Outcome::Expected("h2c upgrade accepted (101)"),
        Ok(_) => Outcome::Expected("h2c upgrade not offered (answered over HTTP/1)"),
        Err(_) => Outcome::Expected("h2c upgrade refused (closed)"),
    })
}

/// The preface alone (one variant in three), or a ShouldRateLimit call whose message (4 KiB
/// announced) is sent one byte a second, with the password or without: held until the
/// server answers, closes, or the end.
pub(super) async fn grpc_slow(
    c: &mut Conn<'_>,
    t: &Target,
    variant: u64,
    until: Instant,
) -> Result<Outcome, Outcome> {
    let opened = Instant::now();
    if variant % 3 == 0 {
        // The client preface and an empty SETTINGS frame, then nothing.
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        if c.send(&preface).await.is_err() {
            return Ok(Outcome::Unexpected("closed at once".into()));
        }
        c.st.did(1);
        return Ok(if c.hold(until).await {
            Outcome::Expected(closed_label(opened))
        } else {
            Outcome::Expected("preface alone, held to the end")
        });
    }
    let password = if variant % 3 == 1 {
        t.password.as_deref()
    } else {
        None
    };
    let st = c.st;
    let Ok((mut send, mut conn)) = handshake(&mut c.s).await else {
        return Ok(Outcome::Expected(
            "closed by the server at the HTTP/2 handshake",
        ));
    };
    if !ready(&mut send, &mut conn, WAIT).await {
        return Ok(Outcome::Expected("no stream allowed"));
    }
    let frame = grpc_frame(&message(4096));
    let Ok((mut answer, mut stream)) = send.send_request(grpc_head(t, password), false) else {
        return Ok(Outcome::Expected("no stream allowed"));
    };
    st.did(1);
    for byte in frame.iter().take(frame.len() - 1) {
        if stream
            .send_data(Bytes::copy_from_slice(&[*byte]), false)
            .is_err()
        {
            return Ok(Outcome::Expected("call reset by the server"));
        }
        st.sent(1);
        let tick = drive(&mut conn, async {
            tokio::select! {
                r = &mut answer => Some(r),
                () = sleep(Duration::from_secs(1)) => None,
            }
        });
        match timeout_at(until, tick).await {
            Err(_) => return Ok(Outcome::Expected("message trickled, held to the end")),
            Ok(None) => return Ok(Outcome::Expected(closed_label(opened))),
            Ok(Some(Some(Ok(r)))) => {
                return Ok(Outcome::Expected(
                    if r.headers().get("grpc-status").is_some_and(|s| s == "16") {
                        "refused UNAUTHENTICATED before the message"
                    } else {
                        "answered before the message ended"
                    },
                ))
            }
            Ok(Some(Some(Err(_)))) => return Ok(Outcome::Expected("call reset by the server")),
            Ok(Some(None)) => {}
        }
    }
    Ok(Outcome::Expected("message trickled to its last byte"))
}
