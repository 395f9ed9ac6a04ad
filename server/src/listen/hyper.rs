//! hyper's side of the guard: the connection builders of HTTP (HTTP/1 and HTTP/2, the API and
//! the admin listener) and of gRPC (HTTP/2 only), with every setting that bounds a connection
//! in one place, and the one [`spawn_conn`] all of them use: the socket watched by the
//! sweeper, the TLS handshake bounded in time, the connection drained on shutdown.
//!
//! HTTP/2: at most `--max-streams` streams at once; flow-control windows of
//! [`H2_STREAM_WINDOW`] per stream and [`H2_CONN_WINDOW`] per connection (what a client can
//! make hyper hold before the server reads it), [`H2_SEND_BUF`] of response per stream; the
//! request head within `--max-header-bytes`; pings every [`H2_KEEPALIVE`] while requests are in
//! flight, a connection that does not answer one within [`H2_KEEPALIVE_TIMEOUT`] closed. HTTP/1:
//! the head within `--max-header-bytes` and `--max-headers`; no per-request timer (the
//! sweeper's deadlines instead, see [`super::sweep`]).

use super::limits::{
    Limits, H2_CONN_WINDOW, H2_KEEPALIVE, H2_KEEPALIVE_TIMEOUT, H2_SEND_BUF, H2_STREAM_WINDOW,
};
use super::sweep::Guarded;
use super::Ticket;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// The HTTP listeners' builder (HTTP/1 and HTTP/2 by prior knowledge or upgrade).
pub(crate) fn http_builder(
    limits: &Limits,
    max_header_bytes: usize,
    max_headers: usize,
) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .max_buf_size(max_header_bytes.max(8192))
        .max_headers(max_headers);
    let mut h2 = b.http2();
    h2.max_header_list_size(max_header_bytes as u32);
    h2_limits(&mut h2, limits);
    b
}

/// The settings HTTP/2 shares on every listener (`auto`'s and gRPC's builders have the same
/// methods, not a common trait).
macro_rules! h2_settings {
    ($b:expr, $limits:expr) => {
        $b.max_concurrent_streams($limits.max_streams)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONN_WINDOW)
            .max_send_buf_size(H2_SEND_BUF)
            // Only HTTP/2 gets the timer: its pings are per connection. HTTP/1 would arm one
            // per request (see super::sweep).
            .timer(TokioTimer::new())
            .keep_alive_interval(H2_KEEPALIVE)
            .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT)
    };
}

fn h2_limits(b: &mut auto::Http2Builder<'_, TokioExecutor>, limits: &Limits) {
    h2_settings!(b, limits);
}

/// The gRPC listener's builder (HTTP/2 only, as tonic's server).
pub(crate) fn grpc_builder(
    limits: &Limits,
    max_header_bytes: usize,
) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.max_header_list_size(max_header_bytes as u32);
    h2_settings!(b, limits);
    b
}

/// A connection's byte stream: its socket, or TLS over it — watched by the sweeper either way.
pub(crate) enum Stream {
    Plain(Guarded<TcpStream>),
    Tls(Box<TlsStream<Guarded<TcpStream>>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// What serves a connection's stream: a builder and the connection's service.
pub(crate) trait Serve: Send + 'static {
    /// hyper's connection future.
    type Conn: GracefulConnection + Send + 'static;
    fn serve(self, io: TokioIo<Stream>) -> Self::Conn;
}

/// Serves one admitted connection in a task of its own, watched by `graceful`: its socket
/// registered with the sweeper under `ticket`; with TLS, the handshake first, within
/// `handshake`. `listener` names it in the debug line of how it ended.
pub(crate) fn spawn_conn<S: Serve>(
    serve: S,
    graceful: &GracefulShutdown,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshake: Duration,
    sock: TcpStream,
    ticket: Ticket,
    listener: &'static str,
) where
    <S::Conn as GracefulConnection>::Error: std::fmt::Display + Send,
{
    let watched = Guarded::new(ticket, sock);
    let Some(tls) = tls else {
        let conn = graceful.watch(serve.serve(TokioIo::new(Stream::Plain(watched))));
        tokio::spawn(ended(conn, listener));
        return;
    };
    let watcher = graceful.watcher();
    tokio::spawn(async move {
        let stream = match tokio::time::timeout(handshake, tls.accept(watched)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return tracing::debug!(error = %e, "{listener}: TLS handshake failed"),
            Err(_) => return tracing::debug!("{listener}: TLS handshake timed out"),
        };
        let conn = watcher.watch(serve.serve(TokioIo::new(Stream::Tls(Box::new(stream)))));
        ended(conn, listener).await;
    });
}

/// Awaits a served connection and logs how it ended, at debug level.
async fn ended<F, E>(conn: F, listener: &'static str)
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "{listener} connection ended");
    }
}
