//! The sweeper: one thread that looks at every tokio connection (HTTP, admin, gRPC) once a
//! second, advances the guard's clock, and shuts down the socket of each connection that has
//! passed a deadline ([`Limits::expired`]). Per request a connection costs two relaxed updates
//! of its own [`Conn`]; per connection, one registration (a lock, at its start and end).
//!
//! hyper could time requests' heads itself (`header_read_timeout`), but it arms a timer for
//! every request: measured under callgrind with wrk on `POST /v1/check`, +1 670 instructions
//! per request (7.5 %). It has nothing for bodies' rates or authentication.
//!
//! A connection's socket is registered by wrapping it in [`Guarded`], which deregisters it
//! before it closes the socket (its first field is dropped first): the sweeper shuts a
//! descriptor down only under the registry's lock, so it never touches a number the kernel
//! has given to another file — without holding a duplicate of every socket (which cost a
//! second descriptor per connection).

use super::conn::Conn;
use super::guard::{Guard, Ticket};
use super::Kind;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

struct Entry {
    conn: Arc<Conn>,
    fd: RawFd,
    kind: Kind,
    /// Already shut down (counted once; shut down again each second until it deregisters).
    shut: bool,
}

/// The registry of watched connections and the guard's clock.
pub(crate) struct Sweeper {
    /// Whole seconds since `start`, advanced by the sweeper.
    clock: Arc<AtomicU64>,
    start: Instant,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Entry>>,
}

impl Sweeper {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            clock: Arc::default(),
            start: Instant::now(),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        })
    }

    /// The clock connections read.
    pub(crate) fn clock(&self) -> Arc<AtomicU64> {
        self.clock.clone()
    }

    fn register(self: &Arc<Self>, t: &Ticket, fd: RawFd) -> Registration {
        // Relaxed: a unique number.
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            conn: t.conn().clone(),
            fd,
            kind: t.kind(),
            shut: false,
        };
        self.lock().insert(id, entry);
        Registration {
            sweeper: self.clone(),
            id,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connections watched now.
    #[cfg(test)]
    pub(crate) fn watched(&self) -> usize {
        self.lock().len()
    }

    /// Advances the clock to second `now` and shuts down what has expired; how many it shut
    /// down (each counted once, in `guard`).
    pub(crate) fn sweep_at(&self, now: u64, guard: &Guard) -> usize {
        // Relaxed: see `Conn`.
        self.clock.store(now, Ordering::Relaxed);
        let mut conns = self.lock();
        let mut closed = 0;
        for e in conns.values_mut() {
            if !e.shut {
                let Some(why) = guard.limits.expired(&e.conn.seen(now)) else {
                    continue;
                };
                tracing::debug!(
                    listener = e.kind.name(),
                    deadline = why.name(),
                    "connection past its deadline; closing"
                );
                guard.expired(e.kind, why);
                e.shut = true;
                closed += 1;
            }
            // Shut down, not closed: the descriptor stays the connection's until its task
            // ends and deregisters (under this lock, before it closes). Its next read sees
            // the end.
            // SAFETY: `fd` is registered, so its socket is open: it is closed only after its
            // `Registration` is dropped, which takes this lock first.
            let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(e.fd) };
            let _ = socket2::SockRef::from(&sock).shutdown(std::net::Shutdown::Both);
        }
        closed
    }

    /// Sweeps once a second until `guard` is gone or `stop` reads `true`.
    pub(crate) fn spawn(
        guard: &Arc<Guard>,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let guard: Weak<Guard> = Arc::downgrade(guard);
        std::thread::Builder::new()
            .name("turnstile-guard".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                let Some(g) = guard.upgrade() else { return };
                if *stop.borrow() {
                    return;
                }
                let now = g.sweeper.start.elapsed().as_secs();
                g.sweeper.sweep_at(now, &g);
            })
    }
}

/// A connection's place in the registry: dropping it removes the entry.
pub(crate) struct Registration {
    sweeper: Arc<Sweeper>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.sweeper.lock().remove(&self.id);
    }
}

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
        let reg = ticket.guard().sweeper.register(&ticket, io.as_raw_fd());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listen::guard::tests::limits;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    /// A connection is shut down only past a deadline, counted once; its client reads the
    /// end; one that ended leaves the registry.
    #[test]
    fn only_a_connection_past_a_deadline_is_shut_down() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let g = Guard::new(limits(10), false, 1000);
        let t = g.admit(Kind::Http).unwrap();
        let conn = t.conn().clone();
        let watched = Guarded::new(t, server);
        assert_eq!(g.sweeper.watched(), 1);
        let busy = conn.begin();
        assert_eq!(g.sweeper.sweep_at(100, &g), 0, "a request in progress");
        drop(busy); // idle since 100
        assert_eq!(g.sweeper.sweep_at(160, &g), 0, "at the timeout");
        assert_eq!(g.sweeper.sweep_at(161, &g), 1, "past it");
        assert_eq!(g.sweeper.sweep_at(162, &g), 0, "counted once");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(
            client.read(&mut buf).unwrap(),
            0,
            "the client reads the end"
        );
        let mut m = String::new();
        g.render(&mut m);
        assert!(
            m.contains("turnstile_listener_expired_total{listener=\"http\",deadline=\"idle\"} 1"),
            "{m}"
        );
        assert_eq!(g.open(Kind::Http), 1);
        drop(watched);
        assert_eq!((g.sweeper.watched(), g.open(Kind::Http)), (0, 0));
    }
}
