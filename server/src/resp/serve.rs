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
use crate::metrics::C;
use crate::state::Server;
use futures_util::FutureExt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
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

/// Counts a connection for `--max-connections` while it lives.
pub(crate) struct Slot(Arc<Server>);

impl Slot {
    /// A slot, or `None` at `--max-connections` (counted as rejected).
    pub(crate) fn take(srv: &Arc<Server>) -> Option<Slot> {
        // Relaxed: a count; no other memory is published through it.
        let n = srv.connections.fetch_add(1, Ordering::Relaxed) + 1;
        let slot = Slot(srv.clone());
        if n > srv.resp.max_connections {
            srv.metrics.add(C::RejectedConnections, 1);
            return None;
        }
        srv.metrics.add(C::Connections, 1);
        Some(slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Relaxed: see `take`.
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where the connection is, for its log line and `CLIENT INFO`.
pub(crate) struct Peer {
    pub(crate) id: u64,
    pub(crate) addr: Option<SocketAddr>,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) fd: Option<i32>,
}

/// Serves one accepted TCP connection: its slot taken (or the client told the server is full),
/// its TLS handshake done if the listener speaks TLS, then [`serve`].
pub(crate) async fn accept(srv: Arc<Server>, sock: tokio::net::TcpStream, peer: Peer) {
    let Some(slot) = Slot::take(&srv) else {
        if srv.tls.is_none() {
            let mut sock = sock;
            let _ = tokio::time::timeout(
                LAST_WRITE,
                sock.write_all(b"-ERR max number of clients reached\r\n"),
            )
            .await;
        }
        return;
    };
    let _ = sock.set_nodelay(true);
    // The kernel's send queue is bounded too. Left to autotuning it grows to tcp_wmem's
    // maximum (4 MiB on Linux's defaults) for a client that stops reading, which the server
    // fills with replies computed for nobody: in the abuse soak, 150 such clients held 234 MiB
    // of kernel memory and most of the server's CPU. A pipeline's replies need far less.
    let _ = socket2::SockRef::from(&sock).set_send_buffer_size(SEND_BUFFER);
    match srv.tls.as_ref().map(|t| t.resp.clone()) {
        None => {
            let (r, w) = sock.into_split();
            serve(srv, r, w, peer, slot).await;
        }
        Some(tls) => match tokio::time::timeout(crate::tls::HANDSHAKE, tls.accept(sock)).await {
            Ok(Ok(stream)) => {
                let (r, w) = tokio::io::split(stream);
                serve(srv, r, w, peer, slot).await;
            }
            Ok(Err(e)) => tracing::debug!(conn = peer.id, error = %e, "TLS handshake failed"),
            Err(_) => tracing::debug!(conn = peer.id, "TLS handshake timed out"),
        },
    }
}

/// Serves one connection until the client leaves, an error, idleness or shutdown.
pub(crate) async fn serve<R, W>(srv: Arc<Server>, mut r: R, mut w: W, peer: Peer, _slot: Slot)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let idle = if srv.resp.idle_timeout.is_zero() {
        FOREVER
    } else {
        srv.resp.idle_timeout
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
        if !wait(&mut conn, &mut r, &mut w, &mut shutdown, idle, &mut eof).await {
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

/// Waits for the client to send (unless it closed its side: `eof`) or to read the output,
/// for the idle timeout, or for shutdown. Whether the connection goes on.
async fn wait<R, W>(
    conn: &mut Connection,
    r: &mut R,
    w: &mut W,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    idle: Duration,
    eof: &mut bool,
) -> bool
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let id = conn.id();
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
        () = tokio::time::sleep(idle) => {
            tracing::debug!(conn = id, writing, "no progress for the idle timeout; closing");
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
