//! Closes HTTP connections that hold the server without a request in progress: a client that
//! sends its headers a byte at a time (slowloris), or leaves a keep-alive connection idle,
//! for longer than `--header-timeout`.
//!
//! hyper can do this itself (`header_read_timeout`), but it arms a timer for every request:
//! measured under callgrind with wrk on `POST /v1/check`, +1 670 instructions per request
//! (22 117 → 23 785, 7.5 %). Here a request costs two uncontended atomic updates on its own
//! connection's state; one sweeper task per HTTP listener looks at every connection once a
//! second, and shuts down the socket of one that has been without a request for the timeout.
//! The clock is whole seconds, so a connection is closed between `timeout` and `timeout` + 2 s
//! after its last response (or its start).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One connection's state, shared by its requests and the sweeper.
pub(crate) struct ConnState {
    /// Requests whose headers have arrived and whose response is not yet made.
    busy: AtomicU32,
    /// The sweeper's second at which `busy` last went to 0 (or the connection started).
    idle_since: AtomicU64,
    /// The watchdog's clock: whole seconds, advanced by the sweeper.
    clock: Arc<AtomicU64>,
}

/// A request in progress on its connection: made when its headers have arrived, dropped when
/// its response is made or the request is dropped (a client gone, an HTTP/2 stream reset).
pub(crate) struct Busy(Arc<ConnState>);

impl ConnState {
    /// A request's headers have arrived.
    #[inline]
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        // Relaxed: advisory; a race closes a connection a second late or early at worst,
        // and publishes no other memory.
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }
}

impl Drop for Busy {
    #[inline]
    fn drop(&mut self) {
        let c = &self.0;
        // Relaxed: as in `begin`. The second is stored before the count drops, so that the
        // sweeper does not find the connection idle since an earlier second.
        c.idle_since
            .store(c.clock.load(Ordering::Relaxed), Ordering::Relaxed);
        c.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connections of one HTTP listener and the sweeper's clock.
pub(crate) struct Watchdog {
    timeout: u64,
    start: Instant,
    /// Whole seconds since `start`, advanced by the sweeper.
    now: Arc<AtomicU64>,
    next_id: AtomicU64,
    /// Each connection's state and a duplicate of its socket's descriptor: shutting that one
    /// down ends the connection (its next read sees the end), and because the registry owns
    /// it, the socket cannot be closed and its number reused while the sweeper looks at it.
    /// Locked per connection (start, end) and per sweep, never per request.
    conns: Mutex<HashMap<u64, (Arc<ConnState>, OwnedFd)>>,
}

/// A connection's place in the registry: dropping it removes the entry (and closes the
/// duplicate descriptor).
pub(crate) struct Registered {
    dog: Arc<Watchdog>,
    id: u64,
    pub(crate) state: Arc<ConnState>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut conns = self.dog.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.remove(&self.id);
    }
}

impl Watchdog {
    /// A watchdog closing connections idle for `timeout` (at least 1 s).
    pub(crate) fn new(timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            timeout: timeout.as_secs_f64().ceil().max(1.0) as u64,
            start: Instant::now(),
            now: Arc::default(),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        })
    }

    /// Registers a connection on `sock`; `None` if its descriptor cannot be duplicated (out
    /// of descriptors: the connection is then served without a watchdog).
    pub(crate) fn register(self: &Arc<Self>, sock: &impl AsFd) -> Option<Registered> {
        let fd = sock.as_fd().try_clone_to_owned().ok()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState {
            busy: AtomicU32::new(0),
            idle_since: AtomicU64::new(self.now.load(Ordering::Relaxed)),
            clock: self.now.clone(),
        });
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.insert(id, (state.clone(), fd));
        drop(conns);
        Some(Registered {
            dog: self.clone(),
            id,
            state,
        })
    }

    /// Advances the clock and shuts down the connections idle for the timeout; returns how
    /// many it shut down.
    pub(crate) fn sweep(&self) -> usize {
        self.sweep_at(self.start.elapsed().as_secs())
    }

    /// [`Watchdog::sweep`] at second `now`.
    fn sweep_at(&self, now: u64) -> usize {
        self.now.store(now, Ordering::Relaxed);
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let mut closed = 0;
        for (state, fd) in conns.values() {
            let idle = state.busy.load(Ordering::Relaxed) == 0
                // `idle_since` is a whole second: the connection went idle before its end.
                && now.saturating_sub(state.idle_since.load(Ordering::Relaxed)) > self.timeout;
            if idle {
                // Shut down, not closed: the descriptor stays the registry's until the
                // connection's task ends and drops its entry. Repeated each second until then
                // (an error for an already shut down socket is nothing to report).
                let _ = socket2::SockRef::from(fd).shutdown(std::net::Shutdown::Both);
                closed += 1;
            }
        }
        closed
    }

    /// Sweeps once a second until `stop`.
    pub(crate) async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.sweep();
                }
                () = crate::state::stopped(&mut stop) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    /// A connection is shut down only once it has been without a request for more than the
    /// timeout: not while a request is in progress, not at the timeout itself; then its
    /// client reads the end. A connection that ended leaves the registry.
    #[test]
    fn only_a_connection_idle_past_the_timeout_is_shut_down() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let dog = Watchdog::new(Duration::from_secs(5));
        let reg = dog.register(&server).expect("registered");
        let busy = reg.state.begin();
        assert_eq!(dog.sweep_at(100), 0, "a request in progress");
        drop(busy); // idle since second 100
        assert_eq!(dog.sweep_at(105), 0, "at the timeout");
        let busy = reg.state.begin();
        assert_eq!(dog.sweep_at(200), 0, "busy again");
        drop(busy); // idle since 200
        assert_eq!(dog.sweep_at(205), 0);
        assert_eq!(dog.sweep_at(206), 1, "past the timeout");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(
            client.read(&mut buf).unwrap(),
            0,
            "the client reads the end"
        );
        drop(reg);
        assert_eq!(dog.sweep_at(300), 0, "an ended connection is not looked at");
        assert!(dog.conns.lock().unwrap().is_empty());
    }
}
