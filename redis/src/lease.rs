//! Leases, for throughput: a node spends a key's quota locally between round trips.
//!
//! * [`LeaseMode::Reserve`]: a node takes `chunk` admissions from Redis in one call (a check of
//!   cost `chunk`) and admits locally from them until they run out or the reservation's reset
//!   time passes. Every admission was counted in Redis first: **never over-admits**. What a
//!   node holds unspent is lost to the others until it is spent or expires: at most
//!   **nodes × chunk stranded**.
//! * [`LeaseMode::Delayed`]: a node admits locally while its count since the last flush fits
//!   the remainder Redis last reported, and flushes the count every `flush` admissions (or
//!   when it runs out). Nodes do not see each other's unflushed counts: **over-admits by at
//!   most nodes × flush**.
//!
//! Denials with a retry time are remembered locally until then (no round trip). Measured in
//! `tests/leases.rs` (4 nodes, one key, 10^5 requests).

use crate::{Error, RedisStore};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use turnstile::{Decision, Limit, Outcome};

/// How a node spends a key's quota between round trips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseMode {
    /// Reserve `chunk` at a time (never over-admits; ≤ nodes × chunk stranded).
    Reserve {
        /// Admissions reserved per round trip.
        chunk: u64,
    },
    /// Count locally, flush every `flush` (over-admits ≤ nodes × flush).
    Delayed {
        /// Local admissions per flush.
        flush: u64,
    },
}

#[derive(Default)]
struct Local {
    /// Reserve: admissions reserved and unspent. Delayed: the remainder Redis last reported.
    budget: u64,
    /// Delayed: admitted locally, not yet flushed.
    pending: u64,
    /// The budget is valid until then.
    until: Option<Instant>,
    /// Denied (for costs ≥ `denied_cost`) until then.
    denied_until: Option<(Instant, u64)>,
}

/// A [`RedisStore`] spent through leases (one per node).
pub struct LeasedStore {
    store: RedisStore,
    mode: LeaseMode,
    /// For buckets, how long reserved tokens are kept (windows: until the window's end).
    keep: Option<Duration>,
    // One async lock per key: a key's local state changes across its round trip (one
    // reservation or flush in flight per key and node keeps the bound); other keys go on. The
    // map's own lock is held only to find the key's entry.
    local: std::sync::Mutex<HashMap<String, Arc<Mutex<Local>>>>,
    round_trips: std::sync::atomic::AtomicU64,
}

fn local_allow(limit: u64, remaining: u64) -> Decision {
    Decision {
        outcome: Outcome::Allowed,
        limit,
        remaining,
        reset_after_ns: 0,
        retry_after_ns: None,
        delay_ns: 0,
    }
}

impl LeasedStore {
    /// Leases over `store`, which must hold one limit: several limits' reset time is the
    /// latest of them, past the end of a shorter window.
    pub fn new(store: RedisStore, mode: LeaseMode) -> Result<Self, Error> {
        let ls = store.limits().limits();
        if ls.len() != 1 {
            return Err(Error::Config(turnstile::ConfigError::new(
                "limits",
                format!(
                    "leases take a store of one limit, got {}; lease each limit's store apart",
                    ls.len()
                ),
            )));
        }
        // Reserved admissions of a window stay valid until the window's end (an admitted
        // check's reset time); a bucket's tokens, once taken, can be spent any time: they are
        // kept for a second, then dropped (stranded).
        let bucket = matches!(ls[0], Limit::TokenBucket(_) | Limit::LeakyBucket(_));
        Ok(Self {
            store,
            mode,
            keep: bucket.then_some(Duration::from_secs(1)),
            local: std::sync::Mutex::new(HashMap::new()),
            round_trips: Default::default(),
        })
    }

    /// How long what Redis granted stays valid locally.
    fn validity(&self, d: &Decision) -> Duration {
        self.keep.unwrap_or(Duration::from_nanos(d.reset_after_ns))
    }

    /// Calls made to Redis so far.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(std::sync::atomic::Ordering::Relaxed) // Relaxed: a statistic.
    }

    async fn redis(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.round_trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed); // Relaxed: a statistic.
        self.store.try_check(key, cost).await
    }

    /// Checks a request of `cost` for `key`.
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        let entry = {
            let mut m = self.local.lock().unwrap_or_else(|p| p.into_inner());
            match m.get(key) {
                Some(e) => e.clone(),
                None => m.entry(key.to_owned()).or_default().clone(),
            }
        };
        let mut guard = entry.lock().await;
        let l = &mut *guard;
        let now = Instant::now();
        let limit = self.store.limits().limits()[0].capacity();
        if let Some((t, c)) = l.denied_until {
            if now < t && cost >= c {
                return Ok(Decision {
                    outcome: Outcome::Limited,
                    limit,
                    remaining: 0,
                    reset_after_ns: 0,
                    retry_after_ns: Some((t - now).as_nanos().max(1) as u64),
                    delay_ns: 0,
                });
            }
        }
        let valid = l.until.is_some_and(|t| now < t);
        match self.mode {
            LeaseMode::Reserve { chunk } => {
                if valid && l.budget >= cost {
                    l.budget -= cost;
                    return Ok(local_allow(limit, l.budget));
                }
                let want = chunk.max(cost);
                let mut d = self.redis(key, want).await?;
                let mut took = want;
                if !d.allowed() && want > cost {
                    took = cost;
                    d = self.redis(key, cost).await?;
                }
                if d.allowed() {
                    l.budget = took - cost;
                    l.until = Some(now + self.validity(&d));
                } else {
                    l.budget = 0;
                    remember(l, now, cost, &d);
                }
                Ok(d)
            }
            LeaseMode::Delayed { flush } => {
                if valid && l.pending + cost <= l.budget {
                    l.pending += cost;
                    let d = local_allow(limit, l.budget - l.pending);
                    if l.pending >= flush {
                        self.flush(key, l, now).await?;
                    }
                    return Ok(d);
                }
                self.flush(key, l, now).await?;
                let d = self.redis(key, cost).await?;
                if d.allowed() {
                    l.budget = d.remaining;
                    l.until = Some(now + self.validity(&d));
                } else {
                    remember(l, now, cost, &d);
                }
                Ok(d)
            }
        }
    }

    /// Records the unflushed local admissions in Redis (as much of them as still fits: the
    /// rest is the over-admission the mode allows), and refreshes the known remainder.
    async fn flush(&self, key: &str, l: &mut Local, now: Instant) -> Result<(), Error> {
        if l.pending == 0 {
            return Ok(());
        }
        let mut d = self.redis(key, l.pending).await?;
        if !d.allowed() && d.remaining > 0 {
            d = self.redis(key, d.remaining.min(l.pending)).await?;
        }
        l.pending = 0;
        l.budget = if d.allowed() { d.remaining } else { 0 };
        l.until = Some(now + self.validity(&d));
        Ok(())
    }
}

fn remember(l: &mut Local, now: Instant, cost: u64, d: &Decision) {
    if let (Outcome::Limited, Some(r)) = (d.outcome, d.retry_after_ns) {
        l.denied_until = Some((now + Duration::from_nanos(r), cost));
    }
}
