//! What the lease tier did, counted: the figures a server exports (`LeaseStats`).
//!
//! The counts every check makes (checks, local answers) are spread over stripes picked by the
//! key, each on its own cache lines, so that threads checking different keys do not write one
//! line; the rest are counted once per Redis call. Relaxed throughout: statistics, which
//! publish no other memory.

use std::sync::atomic::{AtomicU64, Ordering};

const STRIPES: usize = 8;

#[derive(Default)]
#[repr(align(128))]
struct Stripe {
    checks: AtomicU64,
    local: AtomicU64,
}

/// The tier's counters.
#[derive(Default)]
pub(crate) struct Counters {
    stripes: [Stripe; STRIPES],
    round_trips: AtomicU64,
    lease_calls: AtomicU64,
    granted: AtomicU64,
    returned: AtomicU64,
    lapsed: AtomicU64,
    unrecorded: AtomicU64,
}

fn add(a: &AtomicU64, n: u64) {
    if n > 0 {
        // Relaxed: a statistic (module docs).
        a.fetch_add(n, Ordering::Relaxed);
    }
}

impl Counters {
    /// A check of key id `id`, answered here or not.
    #[inline]
    pub(crate) fn check(&self, id: u64, local: bool) {
        let s = &self.stripes[id as usize % STRIPES];
        add(&s.checks, 1);
        if local {
            add(&s.local, 1);
        }
    }
    /// A call to Redis; `lease`: a lease call.
    pub(crate) fn call(&self, lease: bool) {
        add(&self.round_trips, 1);
        if lease {
            add(&self.lease_calls, 1);
        }
    }
    pub(crate) fn granted(&self, n: u64) {
        add(&self.granted, n);
    }
    pub(crate) fn returned(&self, n: u64) {
        add(&self.returned, n);
    }
    /// Held admissions whose lease ended (or whose record went) unspent, not given back.
    pub(crate) fn lapse(&self, n: u64) {
        add(&self.lapsed, n);
    }
    /// Delayed mode: admitted locally, never recorded in Redis.
    pub(crate) fn unrecorded(&self, n: u64) {
        add(&self.unrecorded, n);
    }

    pub(crate) fn snapshot(&self, leased_keys: u64) -> LeaseStats {
        // Relaxed: a statistic.
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (mut checks, mut local) = (0, 0);
        for s in &self.stripes {
            checks += l(&s.checks);
            local += l(&s.local);
        }
        LeaseStats {
            checks,
            local,
            round_trips: l(&self.round_trips),
            lease_calls: l(&self.lease_calls),
            granted: l(&self.granted),
            returned: l(&self.returned),
            stranded: l(&self.lapsed),
            unrecorded: l(&self.unrecorded),
            keys: leased_keys,
        }
    }
}

/// What a store's leases did so far (monotonic counts, but `keys`): [`crate::RedisStore::lease_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Checks decided through the lease tier (every `check` of a store with leases).
    pub checks: u64,
    /// Of them, answered in this process: spent from a lease, or denied by a denial Redis
    /// gave earlier (until its retry time).
    pub local: u64,
    /// Calls to Redis made for them: one-by-one checks, lease calls and give-backs.
    pub round_trips: u64,
    /// Of them, lease calls (reserve: each a check of the request and its lease at once).
    pub lease_calls: u64,
    /// Admissions leased beyond the requests that fetched them.
    pub granted: u64,
    /// Admissions given back to Redis unspent (idle keys, leases' ends, shutdown, reload).
    pub returned: u64,
    /// Admissions held when their lease ended (or their record was dropped for room), not
    /// given back: counted in Redis, admitted nowhere.
    pub stranded: u64,
    /// Delayed mode: admissions made here that Redis could not record (the over-admission
    /// the mode allows).
    pub unrecorded: u64,
    /// Keys in the lease table now (leased or tracked).
    pub keys: u64,
}

impl LeaseStats {
    /// Calls to Redis per check (0 before any check).
    pub fn round_trips_per_check(&self) -> f64 {
        if self.checks == 0 {
            0.0
        } else {
            self.round_trips as f64 / self.checks as f64
        }
    }
}
