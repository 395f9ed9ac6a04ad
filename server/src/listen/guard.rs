//! [`Guard`]: admission (connections per listener, descriptors), the sweeper of the tokio
//! connections, the authentication throttle, the request-body budget, and their counters.

use super::budget::Bodies;
use super::conn::Conn;
use super::limits::Expired;
use super::limits::{Limits, FD_RESERVE};
use super::sweep::Sweeper;
use super::{AuthThrottle, Kind};
use crossbeam_utils::CachePadded;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Why a connection was refused at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its listener's `--max-*-connections`.
    Full,
    /// The descriptors the process may open, less the reserve.
    Descriptors,
}

/// What every listener goes through.
pub(crate) struct Guard {
    pub(crate) limits: Limits,
    /// Whether a password is set (the authentication deadline applies).
    auth_required: bool,
    /// Connections open, per kind.
    open: [CachePadded<AtomicUsize>; 4],
    /// Connections open, every kind's.
    total: AtomicUsize,
    /// The most connections the descriptors allow.
    fd_room: usize,
    pub(crate) sweeper: Arc<Sweeper>,
    /// Failed passwords per source address.
    pub(crate) throttle: AuthThrottle,
    /// Request bodies being received.
    pub(crate) bodies: Arc<Bodies>,
    counts: Counts,
}

/// The guard's counters (relaxed: counts, read by `/metrics`).
#[derive(Default)]
struct Counts {
    refused: [[AtomicU64; 2]; 4],
    expired: [[AtomicU64; 4]; 4],
    accept_errors: [AtomicU64; 4],
    auth_failed: AtomicU64,
    auth_throttled: AtomicU64,
}

impl Guard {
    /// A guard with `limits`; `nofile`: the soft descriptor limit the process runs with.
    pub(crate) fn new(limits: Limits, auth_required: bool, nofile: usize) -> Arc<Self> {
        let sweeper = Sweeper::new();
        Arc::new(Self {
            bodies: Arc::new(Bodies::new(
                limits.body_memory,
                limits.max_body,
                [Kind::Http, Kind::Admin, Kind::Grpc]
                    .iter()
                    .map(|&k| limits.max(k))
                    .sum(),
            )),
            limits,
            auth_required,
            open: Default::default(),
            total: AtomicUsize::new(0),
            fd_room: nofile.saturating_sub(FD_RESERVE).max(1),
            sweeper,
            throttle: AuthThrottle::new(),
            counts: Counts::default(),
        })
    }

    /// Admits a connection of `kind`, or says why not (counted). Called before anything is
    /// read from it.
    pub(crate) fn admit(self: &Arc<Self>, kind: Kind) -> Result<Ticket, Refusal> {
        // Relaxed: counts; no other memory is published through them. Taken first and given
        // back on refusal, so that two racing accepts cannot both pass the last place.
        let n = self.open[kind as usize].fetch_add(1, Ordering::Relaxed) + 1;
        let total = self.total.fetch_add(1, Ordering::Relaxed) + 1;
        let ticket = Ticket {
            guard: self.clone(),
            kind,
            conn: Arc::new(Conn::new(
                kind,
                self.sweeper.clock(),
                self.bodies.clone(),
                !self.auth_required,
            )),
        };
        let refused = if n > self.limits.max(kind) {
            Some(Refusal::Full)
        } else if total > self.fd_room {
            Some(Refusal::Descriptors)
        } else {
            None
        };
        match refused {
            None => Ok(ticket),
            Some(r) => {
                self.counts.refused[kind as usize][r as usize].fetch_add(1, Ordering::Relaxed);
                Err(r)
            }
        }
    }

    /// Connections of `kind` open now.
    pub(crate) fn open(&self, kind: Kind) -> usize {
        self.open[kind as usize].load(Ordering::Relaxed)
    }

    /// Advances the guard's clock to second `now` and closes the connections past a deadline;
    /// how many.
    pub(crate) fn sweep_at(&self, now: u64) -> usize {
        self.sweeper
            .sweep_at(now, &self.limits, |kind, why| self.expired(kind, why))
    }

    /// Sweeps once a second, on a thread of its own, until the guard is gone or `stop` reads
    /// `true`.
    pub(crate) fn spawn_sweeper(
        self: &Arc<Self>,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let guard: std::sync::Weak<Guard> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("turnstile-guard".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                let Some(g) = guard.upgrade() else { return };
                if *stop.borrow() {
                    return;
                }
                g.sweep_at(g.sweeper.now());
            })
    }

    /// A connection of `kind` closed for `why`.
    pub(crate) fn expired(&self, kind: Kind, why: Expired) {
        self.counts.expired[kind as usize][why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A failed accept on a listener of `kind`.
    pub(crate) fn accept_error(&self, kind: Kind) {
        self.counts.accept_errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A wrong password (`throttled`: refused unchecked, its source over its attempts).
    pub(crate) fn auth_failed(&self, throttled: bool) {
        let c = if throttled {
            &self.counts.auth_throttled
        } else {
            &self.counts.auth_failed
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The guard's lines of `/metrics`.
    pub(crate) fn render(&self, out: &mut String) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP turnstile_listener_connections Connections open, per listener.\n# TYPE turnstile_listener_connections gauge"
        );
        for k in Kind::ALL {
            let _ = writeln!(
                out,
                "turnstile_listener_connections{{listener=\"{}\"}} {}",
                k.name(),
                self.open(k)
            );
        }
        let _ = writeln!(
            out,
            "# HELP turnstile_listener_refused_total Connections refused at accept, per listener and reason.\n# TYPE turnstile_listener_refused_total counter"
        );
        for k in Kind::ALL {
            for (r, name) in [
                (Refusal::Full, "full"),
                (Refusal::Descriptors, "descriptors"),
            ] {
                let _ = writeln!(
                    out,
                    "turnstile_listener_refused_total{{listener=\"{}\",reason=\"{name}\"}} {}",
                    k.name(),
                    load(&self.counts.refused[k as usize][r as usize])
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP turnstile_listener_expired_total Connections closed by a deadline, per listener and deadline.\n# TYPE turnstile_listener_expired_total counter"
        );
        for k in Kind::ALL {
            for e in Expired::ALL {
                let _ = writeln!(
                    out,
                    "turnstile_listener_expired_total{{listener=\"{}\",deadline=\"{}\"}} {}",
                    k.name(),
                    e.name(),
                    load(&self.counts.expired[k as usize][e as usize])
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP turnstile_accept_errors_total Failed accepts (out of descriptors, ...), per listener.\n# TYPE turnstile_accept_errors_total counter"
        );
        for k in Kind::ALL {
            let _ = writeln!(
                out,
                "turnstile_accept_errors_total{{listener=\"{}\"}} {}",
                k.name(),
                load(&self.counts.accept_errors[k as usize])
            );
        }
        let _ = writeln!(
            out,
            "# HELP turnstile_auth_failures_total Wrong passwords, and attempts refused unchecked (their source over its allowance).\n# TYPE turnstile_auth_failures_total counter\nturnstile_auth_failures_total{{result=\"wrong\"}} {}\nturnstile_auth_failures_total{{result=\"throttled\"}} {}",
            load(&self.counts.auth_failed),
            load(&self.counts.auth_throttled)
        );
        let _ = writeln!(
            out,
            "# HELP turnstile_body_bytes Request bodies held (read, not yet answered) past each connection's own allowance, and the budget they share (half of --body-memory).\n# TYPE turnstile_body_bytes gauge\nturnstile_body_bytes{{state=\"held\"}} {}\nturnstile_body_bytes{{state=\"budget\"}} {}\n# HELP turnstile_bodies_refused_total Request bodies refused for the budget (503).\n# TYPE turnstile_bodies_refused_total counter\nturnstile_bodies_refused_total {}",
            self.bodies.budget.used(),
            self.bodies.budget.max(),
            self.bodies.refused()
        );
    }
}

/// A connection's place: counted for its listener's bound and the descriptors until dropped.
pub(crate) struct Ticket {
    guard: Arc<Guard>,
    kind: Kind,
    conn: Arc<Conn>,
}

impl Ticket {
    /// The connection's state.
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// Its listener.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// The guard.
    pub(crate) fn guard(&self) -> &Arc<Guard> {
        &self.guard
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Relaxed: see `admit`.
        self.guard.open[self.kind as usize].fetch_sub(1, Ordering::Relaxed);
        self.guard.total.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    pub(crate) fn limits(max: usize) -> Limits {
        Limits {
            max_connections: [max; 4],
            handshake: Duration::from_secs(10),
            auth: Duration::from_secs(10),
            header: Duration::from_secs(60),
            grpc_idle: Duration::from_secs(3600),
            body: Duration::from_secs(30),
            min_body_rate: 1024,
            max_body: 64 << 10,
            max_streams: 32,
            body_memory: 1 << 20,
        }
    }

    #[test]
    fn each_listener_has_its_own_bound_and_all_share_the_descriptors() {
        let g = Guard::new(limits(2), true, FD_RESERVE + 3);
        let a = g.admit(Kind::Http).unwrap();
        let _b = g.admit(Kind::Http).unwrap();
        assert_eq!(g.admit(Kind::Http).err(), Some(Refusal::Full));
        // Another listener is not locked out by the first one's flood...
        let c = g.admit(Kind::Admin).unwrap();
        // ... but every connection holds a descriptor.
        assert_eq!(g.admit(Kind::Resp).err(), Some(Refusal::Descriptors));
        assert_eq!((g.open(Kind::Http), g.open(Kind::Resp)), (2, 0));
        drop(a);
        drop(c);
        assert!(g.admit(Kind::Resp).is_ok());
        assert!(!g.admit(Kind::Grpc).unwrap().conn().is_authenticated());
        let mut m = String::new();
        g.render(&mut m);
        assert!(m.contains("turnstile_listener_refused_total{listener=\"http\",reason=\"full\"} 1"));
        assert!(m.contains(
            "turnstile_listener_refused_total{listener=\"resp\",reason=\"descriptors\"} 1"
        ));
        let open = Guard::new(limits(2), false, 1000);
        assert!(open.admit(Kind::Http).unwrap().conn().is_authenticated());
    }
}
