//! [`Limits`]: every listener's bounds, from the flags, and the one function that says when a
//! connection has overstayed ([`Limits::expired`]).

use super::conn::Expired;
use super::Kind;
use std::time::Duration;

/// A body's first seconds are not held to `--min-body-rate` (a client's first write may wait
/// for its window, its TLS record, its user).
pub(crate) const BODY_GRACE_SECS: u64 = 5;

/// What an unauthenticated request may make the server read of its body before the refusal
/// (so that a client still sending sees the 401 rather than a reset): a fixed allowance,
/// never the shared body budget. More is not read: the stream is reset, or the connection
/// closed.
pub(crate) const PRE_AUTH_BODY: usize = 16 << 10;

/// HTTP/2 flow-control windows (per stream, per connection): what a client may send before
/// the server has read it — the bound on what hyper holds for a connection's streams whatever
/// their bodies. Small requests (a check is a few dozen bytes) never wait on them.
pub(crate) const H2_STREAM_WINDOW: u32 = 64 << 10;
/// See [`H2_STREAM_WINDOW`].
pub(crate) const H2_CONN_WINDOW: u32 = 128 << 10;
/// What HTTP/2 may buffer of one stream's response before the handler waits.
pub(crate) const H2_SEND_BUF: usize = 64 << 10;
/// HTTP/2 pings to a connection with requests in flight, and how long the answer may take.
pub(crate) const H2_KEEPALIVE: Duration = Duration::from_secs(20);
/// See [`H2_KEEPALIVE`].
pub(crate) const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Descriptors kept out of the connections' reach: the snapshot, reloads, Redis, logs, and the
/// accept that tells a client the server is full.
pub(crate) const FD_RESERVE: usize = 128;

/// Every listener's bounds.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    /// Connections at once, per [`Kind`] (`--max-connections`, `--max-http-connections`,
    /// `--max-admin-connections`, `--max-grpc-connections`).
    pub(crate) max_connections: [usize; 4],
    /// `--tls-handshake-timeout`.
    pub(crate) handshake: Duration,
    /// `--auth-timeout` (zero: never), when a password is set.
    pub(crate) auth: Duration,
    /// `--header-timeout` (zero: never): HTTP without a request in progress, and gRPC before
    /// its first request.
    pub(crate) header: Duration,
    /// `--grpc-idle-timeout` (zero: never): gRPC without a request in progress, once it has
    /// had one (Envoy keeps its connection to the rate limit service open between calls).
    pub(crate) grpc_idle: Duration,
    /// `--body-timeout` (zero: never): one request body, from its start.
    pub(crate) body: Duration,
    /// `--min-body-rate`, bytes a second (zero: none), after [`BODY_GRACE_SECS`].
    pub(crate) min_body_rate: u64,
    /// `--max-body`: one request body (and one gRPC message).
    pub(crate) max_body: usize,
    /// `--max-streams`: HTTP/2 (and gRPC) streams at once on one connection.
    pub(crate) max_streams: u32,
    /// `--body-memory`: request bodies read and not yet answered, every connection's.
    pub(crate) body_memory: usize,
}

/// What the sweeper reads of a connection (whole seconds of the guard's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Its listener.
    pub(crate) kind: Kind,
    /// Whether it has had a request.
    pub(crate) requested: bool,
    /// Seconds since it was admitted.
    pub(crate) age: u64,
    /// Whether it has shown the password (or none is needed).
    pub(crate) authed: bool,
    /// Wrong passwords it gave.
    pub(crate) auth_failures: u32,
    /// Requests in progress.
    pub(crate) busy: u32,
    /// Seconds since the last request ended (or it was admitted), when none is in progress.
    pub(crate) idle_for: u64,
    /// Bodies being received.
    pub(crate) bodies: u32,
    /// Seconds since they began (the first of them).
    pub(crate) body_for: u64,
    /// Their bytes received since then.
    pub(crate) body_bytes: u64,
}

impl Limits {
    /// The most connections of `kind`.
    pub(crate) fn max(&self, kind: Kind) -> usize {
        self.max_connections[kind as usize]
    }

    /// Whether a connection `age` old that has not authenticated must go.
    pub(crate) fn auth_expired(&self, age: Duration, authed: bool) -> bool {
        !authed && !self.auth.is_zero() && age > self.auth
    }

    /// Why a connection must go, if it must: the first deadline it has passed. A whole-second
    /// clock: each is passed strictly (`> timeout`), so a connection goes between its timeout
    /// and one tick of the sweeper after.
    pub(crate) fn expired(&self, s: &Seen) -> Option<Expired> {
        if self.auth_expired(Duration::from_secs(s.age), s.authed)
            || s.auth_failures >= super::auth::MAX_FAILURES
        {
            return Some(Expired::Auth);
        }
        if s.bodies > 0 {
            if !self.body.is_zero() && s.body_for > self.body.as_secs().max(1) {
                return Some(Expired::Body);
            }
            if self.min_body_rate > 0 && s.body_for > BODY_GRACE_SECS {
                // Apache's mod_reqtimeout: the grace, then one more second for every
                // `min_body_rate` bytes received.
                let earned = s.body_bytes / self.min_body_rate;
                if s.body_for > BODY_GRACE_SECS + earned {
                    return Some(Expired::BodyRate);
                }
            }
            return None;
        }
        let idle = match s.kind {
            Kind::Grpc if s.requested => self.grpc_idle,
            _ => self.header,
        };
        if s.busy == 0 && !idle.is_zero() && s.idle_for > idle.as_secs().max(1) {
            return Some(Expired::Idle);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_connections: [10; 4],
            handshake: Duration::from_secs(10),
            auth: Duration::from_secs(10),
            header: Duration::from_secs(60),
            grpc_idle: Duration::from_secs(3600),
            body: Duration::from_secs(30),
            min_body_rate: 1024,
            max_body: 64 << 10,
            max_streams: 32,
            body_memory: 64 << 20,
        }
    }

    impl Default for Seen {
        fn default() -> Self {
            Seen {
                kind: Kind::Http,
                requested: false,
                age: 0,
                authed: false,
                auth_failures: 0,
                busy: 0,
                idle_for: 0,
                bodies: 0,
                body_for: 0,
                body_bytes: 0,
            }
        }
    }

    #[test]
    fn each_deadline_is_passed_strictly_and_only_its_own() {
        let l = limits();
        let fresh = Seen {
            authed: true,
            ..Seen::default()
        };
        assert_eq!(l.expired(&fresh), None);
        // Authentication: 10 s, whatever else the connection does.
        let unauth = Seen {
            age: 10,
            busy: 1,
            ..Seen::default()
        };
        assert_eq!(l.expired(&unauth), None);
        assert_eq!(l.expired(&Seen { age: 11, ..unauth }), Some(Expired::Auth));
        // Or too many wrong passwords, authenticated since or not.
        let guessing = Seen {
            auth_failures: super::super::auth::MAX_FAILURES,
            ..fresh
        };
        assert_eq!(l.expired(&guessing), Some(Expired::Auth));
        // Idle without a request: 60 s; a request in progress is never idle.
        let idle = Seen {
            age: 1000,
            idle_for: 60,
            ..fresh
        };
        assert_eq!(l.expired(&idle), None);
        assert_eq!(
            l.expired(&Seen {
                idle_for: 61,
                ..idle
            }),
            Some(Expired::Idle)
        );
        assert_eq!(
            l.expired(&Seen {
                idle_for: 61,
                busy: 1,
                ..idle
            }),
            None
        );
        // A body: 5 s of grace, then a second per KiB, and 30 s at most.
        let body = Seen {
            age: 100,
            busy: 1,
            bodies: 1,
            ..fresh
        };
        assert_eq!(
            l.expired(&Seen {
                body_for: 5,
                ..body
            }),
            None
        );
        assert_eq!(
            l.expired(&Seen {
                body_for: 6,
                ..body
            }),
            Some(Expired::BodyRate)
        );
        let fed = Seen {
            body_for: 20,
            body_bytes: 15 * 1024,
            ..body
        };
        assert_eq!(l.expired(&fed), None);
        assert_eq!(
            l.expired(&Seen {
                body_for: 21,
                ..fed
            }),
            Some(Expired::BodyRate)
        );
        let fast = Seen {
            body_for: 30,
            body_bytes: 1 << 30,
            ..body
        };
        assert_eq!(l.expired(&fast), None);
        assert_eq!(
            l.expired(&Seen {
                body_for: 31,
                ..fast
            }),
            Some(Expired::Body)
        );
        // gRPC: the header timeout until its first request, then its own idle timeout.
        let grpc = Seen {
            kind: Kind::Grpc,
            idle_for: 61,
            ..fresh
        };
        assert_eq!(l.expired(&grpc), Some(Expired::Idle));
        let served = Seen {
            requested: true,
            ..grpc
        };
        assert_eq!(l.expired(&served), None);
        assert_eq!(
            l.expired(&Seen {
                idle_for: 3601,
                ..served
            }),
            Some(Expired::Idle)
        );
        // A body in progress is not an idle connection, however long the last one ended.
        assert_eq!(
            l.expired(&Seen {
                idle_for: 1000,
                body_for: 1,
                ..body
            }),
            None
        );
    }

    #[test]
    fn zero_turns_a_deadline_off() {
        let l = Limits {
            auth: Duration::ZERO,
            header: Duration::ZERO,
            grpc_idle: Duration::ZERO,
            body: Duration::ZERO,
            min_body_rate: 0,
            ..limits()
        };
        let s = Seen {
            age: u64::MAX,
            idle_for: u64::MAX,
            ..Seen::default()
        };
        assert_eq!(l.expired(&s), None);
        assert_eq!(
            l.expired(&Seen {
                bodies: 1,
                body_for: u64::MAX,
                ..s
            }),
            None
        );
    }
}
