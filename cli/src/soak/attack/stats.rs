//! The attackers' counts: per kind (connections, requests, bytes, outcomes, how long the
//! server let a connection live) and per listener (attacking connections open, and their
//! peak, which the memory bound counts).

use super::Kind;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The listener an attacking connection goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Resp,
    /// HTTP/1 (and the h2c upgrade asked over it).
    Http,
    /// HTTP/2 with prior knowledge on the HTTP listener.
    HttpH2,
    Grpc,
    Admin,
}

impl Proto {
    pub const ALL: [Proto; 5] = [
        Proto::Resp,
        Proto::Http,
        Proto::HttpH2,
        Proto::Grpc,
        Proto::Admin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Proto::Resp => "resp",
            Proto::Http => "http",
            Proto::HttpH2 => "http2",
            Proto::Grpc => "grpc",
            Proto::Admin => "admin",
        }
    }
}

/// Attacking connections open on one listener now, and at most.
#[derive(Default)]
pub struct Gauge {
    open: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    // Relaxed: counts read for the report; no other memory is published through them.
    pub fn up(&self) {
        let n = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(n, Ordering::Relaxed);
    }

    pub fn down(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

/// The counts of one kind.
#[derive(Default)]
pub struct KindStats {
    /// Tasks of this kind.
    pub tasks: AtomicU64,
    /// Connections made.
    pub connections: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    pub connect_errors: AtomicU64,
    pub unexpected: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// What the kind counts as its work: requests, streams, guesses, PINGs.
    pub ops: AtomicU64,
    /// The longest a connection of this kind lived (ms), whoever closed it.
    pub longest_ms: AtomicU64,
    /// Expected outcomes by label.
    pub outcomes: Mutex<BTreeMap<&'static str, u64>>,
    /// The first unexpected outcomes and connect errors, as said.
    pub samples: Mutex<Vec<String>>,
}

impl KindStats {
    /// `n` more of the kind's work done.
    pub fn did(&self, n: u64) {
        self.ops.fetch_add(n, Ordering::Relaxed);
    }

    pub fn sent(&self, n: usize) {
        self.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Body bytes the attackers keep in flight at once, in all (HTTP/2 streams left unfinished,
/// big /json bodies): enough to show a server that holds them past its bound (256 MiB), and
/// bounded so that the soak cannot exhaust the memory of the machine it shares with the
/// server (1 000 HTTP/2 connections of 100 streams of 64 KiB would be 6.4 GB).
pub const BODY_BUDGET: u64 = 1 << 30;

/// Bytes taken from [`Stats::bodies`], given back when dropped.
pub struct Reserved<'a> {
    of: &'a AtomicU64,
    n: u64,
}

impl Reserved<'_> {
    /// `n` more bytes, if the budget has them.
    pub fn more(&mut self, n: u64) -> bool {
        // Relaxed: a count; no other memory is published through it.
        let before = self.of.fetch_add(n, Ordering::Relaxed);
        if before + n > BODY_BUDGET {
            self.of.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        self.n += n;
        true
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.of.fetch_sub(self.n, Ordering::Relaxed);
    }
}

/// The counts of every kind.
pub struct Stats {
    pub kinds: Vec<(Kind, KindStats)>,
    /// Per listener, in [`Proto::ALL`] order.
    pub protos: [Gauge; 5],
    /// CL.THROTTLE answered with an admission to the attackers that read their replies.
    pub throttle_allowed_seen: AtomicU64,
    /// CL.THROTTLE answered limited to them.
    pub throttle_limited_seen: AtomicU64,
    /// CL.THROTTLE sent by attackers that never read (each may have been counted).
    pub throttle_unread: AtomicU64,
    /// The next new parameter set.
    pub(super) next_params: AtomicU64,
    /// Body bytes in flight, within [`BODY_BUDGET`].
    bodies: AtomicU64,
}

impl Stats {
    pub fn new() -> Self {
        Self {
            kinds: Kind::MIX
                .iter()
                .map(|(k, _)| (*k, KindStats::default()))
                .collect(),
            protos: Default::default(),
            throttle_allowed_seen: AtomicU64::new(0),
            throttle_limited_seen: AtomicU64::new(0),
            throttle_unread: AtomicU64::new(0),
            next_params: AtomicU64::new(0),
            bodies: AtomicU64::new(0),
        }
    }

    /// A share of [`BODY_BUDGET`], empty at first.
    pub fn bodies(&self) -> Reserved<'_> {
        Reserved {
            of: &self.bodies,
            n: 0,
        }
    }

    pub fn of(&self, k: Kind) -> &KindStats {
        &self
            .kinds
            .iter()
            .find(|(x, _)| *x == k)
            .expect("every kind")
            .1
    }

    pub fn proto(&self, p: Proto) -> &Gauge {
        &self.protos[Proto::ALL
            .iter()
            .position(|x| *x == p)
            .expect("every listener")]
    }

    /// Attacking connections open now.
    pub fn open(&self) -> u64 {
        self.kinds
            .iter()
            .map(|(_, s)| s.open.load(Ordering::Relaxed))
            .sum()
    }
}
