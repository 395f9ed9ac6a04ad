//! [`Guarded`]: a connection's socket watched by the guard's sweeper and counted by its
//! ticket, as long as it lives (see `sweep` for why it deregisters before it closes).

use super::guard::Ticket;
use super::sweep::Registration;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection's socket (or its TLS stream), watched by the sweeper and counted by its
/// ticket until it is dropped: deregistered first, then closed, then uncounted.
pub(crate) struct Guarded<S> {
    // Field order is drop order: see the module doc.
    _reg: Registration,
    io: S,
    _ticket: Ticket,
}

impl<S: AsRawFd> Guarded<S> {
    /// `io` watched under `ticket`.
    pub(crate) fn new(ticket: Ticket, io: S) -> Self {
        let reg =
            ticket
                .guard()
                .sweeper
                .register(ticket.conn().clone(), ticket.kind(), io.as_raw_fd());
        Self {
            _reg: reg,
            io,
            _ticket: ticket,
        }
    }
}

impl<S: AsRawFd> AsRawFd for Guarded<S> {
    fn as_raw_fd(&self) -> RawFd {
        self.io.as_raw_fd()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
