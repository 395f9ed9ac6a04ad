//! Leases: a node spends a key's quota in process between round trips to Redis, for the keys
//! whose rate makes it worth it; every other key is checked in Redis one by one, as without
//! leases. Turned on by [`crate::RedisStoreBuilder::leases`]; the API stays the store's.
//!
//! * **The local tier** is a bounded, lock-free table of small records
//!   (`turnstile::keyed::Records`: the keyed store's own slots, insertion protocol and
//!   reclaim in place): per key its lease (admissions held, until when), its recent rate, a
//!   denial Redis gave (until its retry time), and the key itself (up to 56 bytes, for giving
//!   back). A check of a leased key is a lookup and a few word updates under the record's
//!   writer bit: no lock, no allocation, no round trip.
//! * **Adaptive.** Every check counts in its key's rate (cost units per period). A key whose
//!   rate fills `min_checks` requests within a lease's expected life is leased: the next
//!   check is a lease call — one function call that checks the request and reserves what the
//!   node would spend at its rate until the lease ends, at most what the key has left, all
//!   limits at once (lua/lease.lua). Other keys are checked one by one.
//! * **Reserve** ([`LeaseMode::Reserve`], the default): every admission is counted in Redis
//!   before it is spent, in the window (or at the bucket state) it is spent in: never over.
//!   A window's lease ends where its final share begins (`strand`, default 5 % of the
//!   window): admissions are never leased in that share, and a node holding unspent
//!   admissions when its lease ends gives them back there, in the same window, if the key was
//!   short of admissions at its last call. A bucket's tokens lapse as the bucket, without
//!   them, would refill (the fleet never holds more than the bucket would).
//! * **Delayed** ([`LeaseMode::Delayed`]): a node admits locally while its unrecorded count
//!   fits what Redis last said was left (at most `flush`), then records the count (as much of
//!   it as still fits): over by at most nodes × flush per window.
//! * **Given back**: unspent admissions go back to Redis (a refund, in the lease's own window)
//!   when a key goes idle, when a lease ends, and all of them on [`crate::RedisStore::return_leases`]
//!   (shutdown, reload) or when the store is dropped (in the background).
//! * **One call for many checks**: the checks that go to Redis one by one share calls on
//!   one server (batch.rs).
//! * **Redis away**: leases are spent until they end, then the failure policy answers.

mod batch;
mod check;
mod counters;
mod listed;
pub(crate) mod record;
pub(crate) mod settle;
mod sweep;
#[cfg(test)]
mod tests;

pub use counters::LeaseStats;

use counters::Counters;
use listed::Listed;
use record::{LeaseKind, Shape};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use turnstile::keyed::{FullPolicy, KeyHasher, Records};
use turnstile::{Clock, ConfigError, DefaultClock, Limit, Limits};

/// How a node spends a key's quota between round trips.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LeaseMode {
    /// Reserve admissions in Redis before spending them: never over the limit.
    #[default]
    Reserve,
    /// Admit locally, record in Redis later: over by at most nodes × `flush` per window.
    Delayed {
        /// Local admissions between two records in Redis.
        flush: u64,
    },
}

/// Leases of a [`crate::RedisStore`] ([`crate::RedisStoreBuilder::leases`]).
#[derive(Clone, Debug)]
pub struct Leases {
    pub(crate) mode: LeaseMode,
    pub(crate) strand: f64,
    pub(crate) keys: u64,
    pub(crate) min_checks: u64,
    pub(crate) idle: Duration,
    pub(crate) sweep: Option<Duration>,
    pub(crate) longest: Duration,
    pub(crate) recheck: Duration,
}

impl Default for Leases {
    fn default() -> Self {
        Self::auto()
    }
}

impl Leases {
    /// Leases where they pay: reserve mode, a 5 % final share, 65 536 keys tracked, a key
    /// leased when its rate fills 4 requests in a lease's expected life, given back after
    /// 100 ms idle (swept every 10 ms).
    pub fn auto() -> Self {
        Self {
            mode: LeaseMode::Reserve,
            strand: 0.05,
            keys: 65_536,
            min_checks: 4,
            idle: Duration::from_millis(100),
            sweep: Some(Duration::from_millis(10)),
            longest: Duration::from_secs(1),
            recheck: Duration::from_secs(1),
        }
    }
    /// The leases a rules file's `[backend]` asks for (`leases = "auto"`, `strand`, `mode`,
    /// `flush`); `None` for `leases = "off"`.
    pub fn from_rules(b: &turnstile::rules::BackendLeases) -> Option<Self> {
        use turnstile::rules::{BackendLeaseMode, BackendLeases};
        match *b {
            BackendLeases::Off => None,
            BackendLeases::Auto { strand_ppm, mode } => Some(
                Self::auto()
                    .strand(strand_ppm as f64 / 1e6)
                    .mode(match mode {
                        BackendLeaseMode::Reserve => LeaseMode::Reserve,
                        BackendLeaseMode::Delayed { flush } => LeaseMode::Delayed { flush },
                    }),
            ),
        }
    }

    /// Reserve (default) or delayed.
    pub fn mode(mut self, m: LeaseMode) -> Self {
        self.mode = m;
        self
    }
    /// The final share of every window in which nothing is leased (default 0.05; at most
    /// 0.5): a lease ends where it begins, and what a node holds then goes back to Redis.
    pub fn strand(mut self, share: f64) -> Self {
        self.strand = share;
        self
    }
    /// Keys the lease table tracks (default 65 536; about 200 bytes each). A key that finds
    /// no room takes the place of the least recently useful one.
    pub fn keys(mut self, n: u64) -> Self {
        self.keys = n;
        self
    }
    /// Requests a lease must be expected to serve (default 4).
    pub fn min_checks(mut self, n: u64) -> Self {
        self.min_checks = n.max(1);
        self
    }
    /// A key unchecked this long gives its lease back (default 100 ms).
    pub fn idle(mut self, d: Duration) -> Self {
        self.idle = d;
        self
    }
    /// The longest a lease is sized for (default 1 s): a lease call asks for what the node
    /// would spend at its rate in at most this long (and at most an eighth of a window).
    /// Longer: fewer calls for steady keys; shorter: less held by a node that stops.
    pub fn longest(mut self, d: Duration) -> Self {
        self.longest = d;
        self
    }
    /// A node denied while Redis still had admissions left (fewer than the request) and other
    /// nodes may hold leases of the key asks Redis again when their leases end (a window's
    /// final share), or after at most this long (default 1 s), to find what they gave back.
    /// A node Redis told a window is spent (a denial, or a grant of all that was left, spent)
    /// asks again at its retry time (a fixed window's end), or after at most this long; a
    /// denial in the final share holds until its retry time.
    pub fn recheck(mut self, d: Duration) -> Self {
        self.recheck = d;
        self
    }
    /// How often a background task gives back idle and ended leases (default 10 ms; `None`:
    /// no task — call [`crate::RedisStore::sweep_leases`] yourself).
    pub fn sweep_every(mut self, d: Option<Duration>) -> Self {
        self.sweep = d;
        self
    }

    /// Why `limits` cannot be leased, if they cannot.
    pub(crate) fn refusal(&self, limits: &Limits) -> Option<ConfigError> {
        if !(self.strand >= 0.0 && self.strand <= 0.5) {
            return Some(ConfigError::new(
                "strand",
                format!(
                    "a final share of {} is not in 0..=0.5 (e.g. 0.05 for 5 %)",
                    self.strand
                ),
            ));
        }
        if let LeaseMode::Delayed { flush: 0 } = self.mode {
            return Some(ConfigError::new(
                "flush",
                "delayed leases need a flush of at least 1",
            ));
        }
        let bad = limits.limits().iter().find_map(|l| match l {
            Limit::FixedWindow(p) if p.count_denied => Some("a window counting denials"),
            Limit::SlidingWindow(p) if p.count_denied => Some("a window counting denials"),
            Limit::FixedWindow(_) | Limit::SlidingWindow(_) | Limit::TokenBucket(_) => None,
            Limit::LeakyBucket(p) if p.delay < p.burst => {
                Some("a leaky_bucket shaper (its admissions wait)")
            }
            Limit::LeakyBucket(_) => None,
            Limit::SlidingLog(_) => Some("sliding_log"),
            Limit::WindowRing(_) => Some("window_ring"),
            Limit::Concurrency(_) => Some("concurrency"),
        })?;
        Some(ConfigError::new(
            "leases",
            format!("{bad} cannot be leased: leases take fixed_window, sliding_window, token_bucket and leaky_bucket (meter) limits that do not count denials; build this store without leases"),
        ))
    }

    /// The records' shape for `limits` (already accepted), with calls timing out after
    /// `timeout`.
    fn shape(&self, limits: &Limits, timeout: Duration) -> Shape {
        let ls = limits.limits();
        let span = |l: &Limit| match l {
            Limit::FixedWindow(p) => (p.window, 0, p.window),
            Limit::SlidingWindow(p) => (p.window, 0, p.window),
            Limit::TokenBucket(p) => (p.tau, p.interval, p.tau),
            Limit::LeakyBucket(p) => (p.tau, p.interval, p.tau),
            _ => (1, 0, 1),
        };
        let mut horizon = u64::MAX;
        let mut shortest = u64::MAX;
        let mut bucket_t = Vec::with_capacity(ls.len());
        // As lease.lua computes a window's final share: window × ppm / 10^6, rounded down.
        let ppm = (self.strand * 1e6) as u64;
        let finals = ls
            .iter()
            .map(|l| match l {
                Limit::FixedWindow(p) => Some((p.window as u128 * ppm as u128 / 1_000_000) as u64),
                _ => None,
            })
            .collect();
        for l in ls {
            let (len, t, _) = span(l);
            shortest = shortest.min(len);
            bucket_t.push(t);
            // A window's lease is sized for at most an eighth of it (lease.lua).
            horizon = horizon.min(if t == 0 { len / 8 } else { len });
            horizon = horizon.min(self.longest.as_nanos() as u64);
        }
        Shape {
            mode: self.mode,
            bucket_t,
            period: (shortest / 8).clamp(1_000_000, 1_000_000_000),
            horizon: horizon.max(1),
            min_checks: self.min_checks,
            stale: (2 * timeout.as_nanos() as u64).saturating_add(1_000_000),
            longest: (self.longest.as_nanos() as u64).clamp(1, 1 << 52),
            recheck: (self.recheck.as_nanos() as u64).max(1),
            finals,
        }
    }
}

/// A store's lease tier: the table, the waiters of fetches in flight, the clock.
pub(crate) struct Tier {
    pub(crate) table: Records<LeaseKind>,
    /// The keys holding leases, for the sweep.
    pub(crate) listed: Listed,
    /// Callers waiting for another caller's fetch of the same key wait on the key's stripe.
    notify: Box<[Notify]>,
    hasher: KeyHasher,
    clock: DefaultClock,
    pub(crate) cfg: Leases,
    /// The store was dropped: the sweeper gives everything back and stops.
    pub(crate) closed: AtomicBool,
    /// One-by-one checks gathered into one call.
    pub(crate) batch: batch::Batch,
}

impl Tier {
    pub(crate) fn new(
        cfg: Leases,
        limits: &Limits,
        timeout: Duration,
    ) -> Result<Self, ConfigError> {
        if let Some(e) = cfg.refusal(limits) {
            return Err(e);
        }
        let kind = LeaseKind {
            shape: cfg.shape(limits, timeout),
            counters: Counters::default(),
        };
        let table = Records::new(kind, cfg.keys.max(1), FullPolicy::EvictStalest)?;
        Ok(Self {
            listed: Listed::new(table.capacity()),
            table,
            notify: (0..64).map(|_| Notify::new()).collect(),
            hasher: KeyHasher::random(64),
            clock: DefaultClock::new(),
            cfg,
            closed: AtomicBool::new(false),
            batch: batch::Batch::default(),
        })
    }

    /// The node's time (ns, monotonic), or an explicit one.
    #[inline]
    pub(crate) fn now(&self, explicit: Option<u64>) -> u64 {
        explicit.unwrap_or_else(|| self.clock.now())
    }

    /// The key's id in the table.
    #[inline]
    pub(crate) fn id(&self, key: &str) -> u64 {
        self.hasher.bytes(key.as_bytes())
    }

    pub(crate) fn shape(&self) -> &Shape {
        &self.table.kind().shape
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.table.kind().counters
    }

    /// The waiters of key `id`'s fetch.
    pub(crate) fn waiters(&self, id: u64) -> &Notify {
        &self.notify[id as usize % self.notify.len()]
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        self.counters().snapshot(self.table.stats().live)
    }

    pub(crate) fn is_closed(&self) -> bool {
        // Acquire: pairs with the store's Release when dropped.
        self.closed.load(Ordering::Acquire)
    }
}
