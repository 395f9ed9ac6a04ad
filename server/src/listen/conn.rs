//! [`Conn`]: what the guard knows of one connection, written by the connection (a request
//! begins or ends, a body's bytes arrive, the password is shown) and read by the sweeper.
//! Every field is an uncontended atomic of the connection's own: a request costs two relaxed
//! updates, a body frame one.

use super::limits::Seen;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One connection's state, shared by the connection and the sweeper.
pub(crate) struct Conn {
    /// Its listener.
    kind: super::Kind,
    /// Whether it has had a request.
    requested: AtomicBool,
    /// The guard's clock (whole seconds, advanced by the sweeper).
    clock: Arc<AtomicU64>,
    /// The server-wide budget its request bodies are held against.
    pub(crate) budget: Arc<super::budget::Bodies>,
    /// The second it was admitted.
    started: u64,
    authed: AtomicBool,
    /// Wrong passwords it gave.
    auth_failures: AtomicU32,
    /// Requests whose head has arrived and whose response is not yet made.
    busy: AtomicU32,
    /// The second `busy` last went to 0 (or it was admitted).
    idle_since: AtomicU64,
    /// Bodies being received.
    bodies: AtomicU32,
    /// The second `bodies` last went from 0 to 1.
    body_since: AtomicU64,
    /// Bytes of bodies received since `body_since`.
    body_bytes: AtomicU64,
    /// Bytes of bodies it holds now (read, not yet answered).
    held: AtomicUsize,
    /// The password this connection last had accepted: a keyed hash of it (the top 56
    /// bits) and the grant's tag (the low byte, never 0); 0 if none. See [`Conn::accepted`].
    accepted: AtomicU64,
}

/// The process's key of [`Conn::accepted`]'s hashes (random per process).
fn token_hash(token: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    KEY.get_or_init(std::hash::RandomState::new).hash_one(token) & !0xff
}

// Relaxed throughout: advisory state read by the sweeper once a second; a race closes a
// connection a second early or late at worst, and publishes no other memory.
impl Conn {
    pub(crate) fn new(
        kind: super::Kind,
        clock: Arc<AtomicU64>,
        budget: Arc<super::budget::Bodies>,
        authed: bool,
    ) -> Self {
        let now = clock.load(Ordering::Relaxed);
        Self {
            kind,
            requested: AtomicBool::new(false),
            clock,
            budget,
            started: now,
            authed: AtomicBool::new(authed),
            auth_failures: AtomicU32::new(0),
            busy: AtomicU32::new(0),
            idle_since: AtomicU64::new(now),
            bodies: AtomicU32::new(0),
            body_since: AtomicU64::new(now),
            body_bytes: AtomicU64::new(0),
            held: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
        }
    }

    /// The grant's tag if `token` is the password this connection last had accepted: a
    /// request that shows it again is not a guess, and is neither slowed nor refused for its
    /// address's wrong attempts (an HTTP/2 or keep-alive connection shows its password with
    /// every request). Another password is checked as any guess is. A collision of the
    /// keyed 56-bit hashes would take about 2^55 requests on one connection.
    pub(crate) fn accepted(&self, token: &[u8]) -> Option<u8> {
        let v = self.accepted.load(Ordering::Relaxed);
        let tag = (v & 0xff) as u8;
        (tag != 0 && v & !0xff == token_hash(token)).then_some(tag)
    }

    /// Remembers `token` as accepted with grant `tag` (not 0).
    pub(crate) fn accept(&self, token: &[u8], tag: u8) {
        debug_assert!(tag != 0);
        self.accepted
            .store(token_hash(token) | u64::from(tag), Ordering::Relaxed);
    }

    fn now(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// The connection has shown the password: the authentication deadline no longer applies.
    pub(crate) fn authenticated(&self) {
        if !self.authed.load(Ordering::Relaxed) {
            self.authed.store(true, Ordering::Relaxed);
        }
    }

    /// Whether it has.
    #[cfg(test)]
    pub(crate) fn is_authenticated(&self) -> bool {
        self.authed.load(Ordering::Relaxed)
    }

    /// It gave a wrong password; how many it has given.
    pub(crate) fn auth_failed(&self) -> u32 {
        self.auth_failures.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A request's head has arrived.
    #[inline]
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        if !self.requested.load(Ordering::Relaxed) {
            self.requested.store(true, Ordering::Relaxed);
        }
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// A body begins to be received.
    pub(crate) fn body_begins(&self) {
        if self.bodies.fetch_add(1, Ordering::Relaxed) == 0 {
            self.body_bytes.store(0, Ordering::Relaxed);
            self.body_since.store(self.now(), Ordering::Relaxed);
        }
    }

    /// `n` bytes of a body arrived.
    #[inline]
    pub(crate) fn body_bytes(&self, n: usize) {
        self.body_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Holds `n` more bytes of a body (see [`Bodies`](super::budget::Bodies)): how many of
    /// them it drew on the shared budget, or `None` (counted as a refusal): past this
    /// connection's share, the shared budget spent, or, before authentication, past
    /// [`PRE_AUTH_BODY`](super::PRE_AUTH_BODY). Give them back with [`Conn::unhold`].
    pub(crate) fn hold(&self, n: usize) -> Option<usize> {
        let b = &*self.budget;
        let before = self.held.fetch_add(n, Ordering::Relaxed);
        let after = before + n;
        let drawn = if !self.authed.load(Ordering::Relaxed) {
            // A fixed allowance, never the shared budget.
            (after <= super::PRE_AUTH_BODY).then_some(0)
        } else if after > b.share {
            None
        } else {
            // The part of [before, after) past the connection's own allowance. A body gives
            // back what it drew: what the connection holds undrawn never exceeds `own`.
            let drawn = after.saturating_sub(b.own) - before.saturating_sub(b.own);
            (drawn == 0 || b.budget.reserve(drawn)).then_some(drawn)
        };
        if drawn.is_none() {
            self.held.fetch_sub(n, Ordering::Relaxed);
            b.refuse();
        }
        drawn
    }

    /// Gives back `n` bytes held, `drawn` of them on the shared budget.
    pub(crate) fn unhold(&self, n: usize, drawn: usize) {
        if n > 0 {
            self.held.fetch_sub(n, Ordering::Relaxed);
            self.budget.budget.release(drawn);
        }
    }

    /// A body ended (received whole, refused or dropped).
    pub(crate) fn body_ends(&self) {
        self.bodies.fetch_sub(1, Ordering::Relaxed);
    }

    /// What the sweeper judges, at its second `now`.
    pub(crate) fn seen(&self, now: u64) -> Seen {
        Seen {
            kind: self.kind,
            requested: self.requested.load(Ordering::Relaxed),
            age: now.saturating_sub(self.started),
            authed: self.authed.load(Ordering::Relaxed),
            auth_failures: self.auth_failures.load(Ordering::Relaxed),
            busy: self.busy.load(Ordering::Relaxed),
            idle_for: now.saturating_sub(self.idle_since.load(Ordering::Relaxed)),
            bodies: self.bodies.load(Ordering::Relaxed),
            body_for: now.saturating_sub(self.body_since.load(Ordering::Relaxed)),
            body_bytes: self.body_bytes.load(Ordering::Relaxed),
        }
    }
}

/// A request in progress on its connection: made when its head has arrived, dropped when its
/// response is made or the request is dropped (a client gone, an HTTP/2 stream reset).
pub(crate) struct Busy(Arc<Conn>);

impl Drop for Busy {
    #[inline]
    fn drop(&mut self) {
        let c = &self.0;
        // The second is stored before the count drops, so that the sweeper does not find
        // the connection idle since an earlier second.
        c.idle_since.store(c.now(), Ordering::Relaxed);
        c.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_bodies_are_seen_as_they_happen() {
        let clock = Arc::new(AtomicU64::new(100));
        let bodies = Arc::new(super::super::budget::Bodies::new(1 << 20, 64 << 10, 8));
        let c = Arc::new(Conn::new(
            super::super::Kind::Http,
            clock.clone(),
            bodies,
            false,
        ));
        clock.store(103, Ordering::Relaxed);
        let s = c.seen(103);
        assert_eq!((s.age, s.authed, s.busy, s.idle_for), (3, false, 0, 3));
        let busy = c.begin();
        c.body_begins();
        c.body_bytes(10);
        clock.store(110, Ordering::Relaxed);
        c.body_begins(); // a second stream's body: the run goes on
        c.body_bytes(5);
        let s = c.seen(110);
        assert_eq!((s.busy, s.bodies, s.body_for, s.body_bytes), (1, 2, 7, 15));
        c.body_ends();
        c.body_ends();
        drop(busy);
        c.authenticated();
        let s = c.seen(112);
        assert_eq!((s.busy, s.bodies, s.idle_for, s.authed), (0, 0, 2, true));
        // The next body starts a new run.
        clock.store(112, Ordering::Relaxed);
        c.body_begins();
        let s = c.seen(112);
        assert_eq!((s.body_for, s.body_bytes), (0, 0));
    }
}
