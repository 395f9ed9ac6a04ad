//! The tokio driver of a RESP [`Connection`]: reads into it, runs it, writes its output, awaits
//! its calls to Redis, over the two halves of any byte stream (TCP, or TLS over TCP). It holds
//! no state of its own but the socket: every bound is the connection's.
//!
//! Output is written as soon as it is produced; while some waits for the client, the driver
//! waits for the client to read or to send, whichever comes first (the connection decides
//! whether it reads: see its bounds). A wait with no progress either way for `--idle-timeout`
//! closes the connection: a client that neither sends nor reads holds nothing for longer. At
//! shutdown, what the socket already holds is read without waiting and answered (at most
//! [`DRAIN_ROUNDS`] reads), then the connection closes.

use super::connection::{Connection, Step};
use crate::listen::Ticket;
use crate::metrics::C;
use crate::state::Server;
use futures_util::FutureExt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Reads of already-buffered input at shutdown, at most.
pub(crate) const DRAIN_ROUNDS: u32 = 64;

/// How long a closing connection may take to write its last replies.
pub(crate) const LAST_WRITE: Duration = Duration::from_secs(2);

/// `SO_SNDBUF` of a RESP connection (the kernel doubles it for its bookkeeping: at most
/// 256 KiB of replies wait in the kernel, beyond `--client-output-limit` in the server).
pub(crate) const SEND_BUFFER: usize = 128 << 10;

/// No idle timeout: a wait this long is forever.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Where the connection is, for its log line and `CLIENT INFO`.
pub(crate) struct Peer {
    pub(crate) id: u64,
    pub(crate) addr: Option<SocketAddr>,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) fd: Option<i32>,
}

/// Serves one admitted TCP connection (its `ticket` held until it ends): its TLS handshake
/// done if the listener speaks TLS (within `--tls-handshake-timeout`), then [`serve`].
pub(crate) async fn accept(
    srv: Arc<Server>,
    sock: tokio::net::TcpStream,
    peer: Peer,
    ticket: Ticket,
) {
    srv.metrics.add(C::Connections, 1);
    let _ = sock.set_nodelay(true);
    // The kernel's send queue is bounded too. Left to autotuning it grows to tcp_wmem's
    // maximum (4 MiB on Linux's defaults) for a client that stops reading, which the server
    // fills with replies computed for nobody: in the abuse soak, 150 such clients held 234 MiB
    // of kernel memory and most of the server's CPU. A pipeline's replies need far less.
    let _ = socket2::SockRef::from(&sock).set_send_buffer_size(SEND_BUFFER);
    match srv.tls.as_ref().map(|t| t.resp.clone()) {
        None => {
            let (r, w) = sock.into_split();
            serve(srv, r, w, peer, ticket).await;
        }
        Some(tls) => {
            let handshake = srv.guard.limits.handshake;
            match tokio::time::timeout(handshake, tls.accept(sock)).await {
                Ok(Ok(stream)) => {
                    let (r, w) = tokio::io::split(stream);
                    serve(srv, r, w, peer, ticket).await;
                }
                Ok(Err(e)) => tracing::debug!(conn = peer.id, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(conn = peer.id, "TLS handshake timed out"),
            }
        }
    }
}

/// Serves one connection until the client leaves, an error, idleness or shutdown.
pub(crate) async fn serve<R, W>(srv: Arc<Server>, mut r: R, mut w: W, peer: Peer, _ticket: Ticket)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let idle = if srv.resp.idle_timeout.is_zero() {
        FOREVER
    } else {
        srv.resp.idle_timeout
    };
    let deadlines = Deadlines {
        idle,
        auth: srv.guard.limits.auth,
        started: tokio::time::Instant::now(),
    };
    let mut shutdown = srv.shutdown.subscribe();
    let mut conn = Connection::new(srv.clone(), peer.id, peer.addr, peer.local);
    if let Some(fd) = peer.fd {
        conn.set_fd(fd);
    }
    let mut draining = 0u32;
    // The client closed its side: what it sent is answered, then the connection closes.
    let mut eof = false;
    loop {
        match conn.run() {
            Step::Remote(call) => {
                let answer = call.run(&srv).await;
                conn.resume(call, answer);
                continue;
            }
            Step::Close => return close(&mut conn, &mut w).await,
            Step::Wait => {}
            Step::Yield => {
                // Others' turn (on a per-core worker, the other connections of its thread).
                if let Flow::End = write_now(&mut conn, &mut w).await {
                    return;
                }
                tokio::task::yield_now().await;
                continue;
            }
        }
        match write_now(&mut conn, &mut w).await {
            Flow::Run => continue,
            Flow::End => return,
            Flow::On => {}
        }
        if eof && conn.output().is_empty() {
            return;
        }
        if !eof && (draining > 0 || *shutdown.borrow()) {
            draining += 1;
            if drain_read(&mut conn, &mut r, draining) {
                continue;
            }
            return close(&mut conn, &mut w).await;
        }
        if !wait(
            &mut conn,
            &mut r,
            &mut w,
            &mut shutdown,
            &deadlines,
            &mut eof,
        )
        .await
        {
            return;
        }
    }
}

/// What the driver does after writing.
enum Flow {
    /// Run the connection again.
    Run,
    /// Go on: read, or wait.
    On,
    /// The connection is done.
    End,
}

/// The usual case: the kernel takes the replies at once.
async fn write_now<W: AsyncWrite + Unpin>(conn: &mut Connection, w: &mut W) -> Flow {
    if conn.output().is_empty() {
        return Flow::On;
    }
    match w.write(conn.output()).now_or_never() {
        Some(Ok(n)) if n > 0 => {
            conn.wrote(n);
            if conn.output().is_empty() && w.flush().await.is_err() {
                gone(conn);
                return Flow::End;
            }
            Flow::Run
        }
        Some(_) => {
            gone(conn);
            Flow::End
        }
        // The connection may borrow room to go on answering now.
        None if conn.blocked() => Flow::Run,
        None => Flow::On,
    }
}

/// Shutdown: what the client sent before it is answered too — what the socket already holds
/// is read without waiting (the `round`th read, at most [`DRAIN_ROUNDS`]). Whether it read.
fn drain_read<R: AsyncRead + Unpin>(conn: &mut Connection, r: &mut R, round: u32) -> bool {
    let read = match conn.read_buf() {
        Some(buf) if round <= DRAIN_ROUNDS => r.read(buf).now_or_never(),
        _ => None,
    };
    match read {
        Some(Ok(n)) if n > 0 => {
            conn.read(n);
            true
        }
        _ => false,
    }
}

/// A connection's deadlines: no progress for `idle`; not authenticated `auth` after it
/// started (zero: never), as the guard says for every listener ([`crate::listen::Limits`]).
struct Deadlines {
    idle: Duration,
    auth: Duration,
    started: tokio::time::Instant,
}

impl Deadlines {
    /// How long the next wait may last, and whether its end is the authentication deadline.
    fn next(&self, authenticated: bool) -> (Duration, bool) {
        if authenticated || self.auth.is_zero() {
            return (self.idle, false);
        }
        let left =
            (self.started + self.auth).saturating_duration_since(tokio::time::Instant::now());
        if left < self.idle {
            (left, true)
        } else {
            (self.idle, false)
        }
    }
}

/// Waits for the client to send (unless it closed its side: `eof`) or to read the output,
/// for the idle timeout (or what is left of the authentication deadline), or for shutdown.
/// Whether the connection goes on.
async fn wait<R, W>(
    conn: &mut Connection,
    r: &mut R,
    w: &mut W,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    deadlines: &Deadlines,
    eof: &mut bool,
) -> bool
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let id = conn.id();
    let (timeout, for_auth) = deadlines.next(conn.authenticated());
    let (buf, out) = conn.io();
    let (reading, writing) = (buf.is_some() && !*eof, !out.is_empty());
    let out_len = out.len();
    tokio::select! {
        res = async { r.read(buf.expect("checked")).await }, if reading => match res {
            Ok(0) => *eof = true,
            Err(_) => {
                gone(conn);
                return false;
            }
            Ok(n) => conn.read(n),
        },
        res = w.write(out), if writing => match res {
            Ok(n) if n > 0 => {
                let all = n == out_len;
                conn.wrote(n);
                if !all {
                    conn.blocked();
                }
            }
            _ => {
                gone(conn);
                return false;
            }
        },
        () = tokio::time::sleep(timeout) => {
            if for_auth {
                tracing::debug!(conn = id, "not authenticated within --auth-timeout; closing");
                conn.expired(crate::listen::Expired::Auth);
            } else {
                tracing::debug!(conn = id, writing, "no progress for the idle timeout; closing");
            }
            conn.abandon();
            return false;
        }
        // Shutdown: stop waiting; what is buffered is answered above.
        _ = shutdown.changed(), if !*eof => {}
    }
    true
}

/// The client went away: nothing more is run for it.
fn gone(conn: &mut Connection) {
    tracing::debug!(conn = conn.id(), "client gone; closing");
    conn.abandon();
}

/// Writes the output that is left, bounded in time, then closes.
async fn close<W: AsyncWrite + Unpin>(conn: &mut Connection, w: &mut W) {
    let _ = tokio::time::timeout(LAST_WRITE, write_out(conn, w)).await;
}

/// Writes all the pending output, then closes the write side.
async fn write_out<W: AsyncWrite + Unpin>(conn: &mut Connection, w: &mut W) -> std::io::Result<()> {
    while !conn.output().is_empty() {
        let n = w.write(conn.output()).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        conn.wrote(n);
    }
    w.flush().await?;
    let _ = w.shutdown().await;
    Ok(())
}
