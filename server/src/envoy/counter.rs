//! One limit's counter and the decision for one descriptor (upstream's limiter: its
//! `DoLimit` and `GetResponseDescriptorStatus`).
//!
//! # Counting as upstream counts
//!
//! Upstream keeps one Redis counter per descriptor and window, adds every hit (denied ones too)
//! and compares: a descriptor is over when `count after the hits > requests_per_unit`. To give
//! the same answers, the default (`fixed_window`) limit is a turnstile [`Store`] of fixed
//! windows of the limit's length whose per-window limit is the counter's maximum (2^24 − 1, so
//! every hit is counted, as a Redis INCRBY would), and the comparison with `requests_per_unit`
//! is made here on the count the store returns. That keeps upstream's exact semantics where a
//! limit-per-window store could not: hits over the limit still count, `hits_addend: 0` asks
//! whether the count is already over without adding, and `near_limit`/`over_limit` metrics
//! split a request's hits as upstream does. Windows are aligned to the Unix epoch (the clock
//! is Unix time), so a minute window is a calendar minute, as upstream's are.
//!
//! A limit with our `algorithm:` extension gets a store of that algorithm with the limit's own
//! `requests_per_unit`, and the store decides.

use super::config::{RateLimit, Unit};
use super::metrics::Counters;
use super::response::{CODE_OK, CODE_OVER_LIMIT};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use std::sync::Arc;
use turnstile::algo::fixed_window::MAX_LIMIT;
use turnstile::clock::{Clock, Nanos};
use turnstile::keyed::{FullPolicy, Store};
use turnstile::{Algorithm, Limit, LimitSpec, Limits, Outcome};

pub(crate) type DynClock = Arc<dyn Clock>;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A limit's counter.
pub(crate) enum Counter {
    /// Upstream's counter: a fixed window counting every hit; compared here.
    Upstream {
        store: Store<DynClock>,
        window_s: u64,
    },
    /// Our extension: the store's algorithm decides.
    Algorithm(Store<DynClock>),
}

/// The limit a descriptor is checked against, as the answer names it.
pub(crate) struct Applied<'a> {
    /// `rate_limit.name`.
    pub name: &'a str,
    /// Requests per window.
    pub requests_per_unit: u32,
    /// The unit (as the answer's `current_limit` gives it; always set for a counted limit).
    pub unit: Option<Unit>,
    /// Report over-limit but answer OK.
    pub shadow_mode: bool,
}

impl Counter {
    /// The counter of `limit`: `capacity` keys, on `clock`.
    pub(crate) fn new(limit: &RateLimit, capacity: u64, clock: &DynClock) -> Result<Self, String> {
        let window = limit.window();
        let build = |l: Limit| {
            Store::builder(Limits::new(vec![l]).map_err(|e| e.to_string())?)
                .capacity(capacity)
                .policy(FullPolicy::EvictStalest)
                .build_with_clock(clock.clone())
                .map_err(|e| e.to_string())
        };
        if limit.algorithm == Algorithm::FixedWindow {
            let l = Limit::fixed_window(MAX_LIMIT, window).map_err(|e| e.to_string())?;
            Ok(Counter::Upstream {
                store: build(l)?,
                window_s: window.as_secs().max(1),
            })
        } else {
            let l = LimitSpec::new(limit.algorithm, limit.requests_per_unit as u64, window)
                .build()
                .map_err(|e| e.to_string())?;
            Ok(Counter::Algorithm(build(l)?))
        }
    }

    /// A fixed window of one `unit`, for the request's own limit overrides.
    pub(crate) fn per_unit(unit: Unit, capacity: u64, clock: &DynClock) -> Result<Self, String> {
        let rl = RateLimit {
            requests_per_unit: 1,
            unit: Some(unit),
            unit_multiplier: 1,
            unlimited: false,
            name: String::new(),
            replaces: Vec::new(),
            algorithm: Algorithm::FixedWindow,
            pos: Default::default(),
        };
        Counter::new(&rl, capacity, clock)
    }

    /// Counts `hits` under `key` at `now`, records them in `stats`, and answers.
    pub(crate) fn check(
        &self,
        key: &[u8],
        hits: u64,
        now: Nanos,
        limit: &Applied<'_>,
        stats: &Counters,
        near_limit_ratio: f32,
    ) -> DescriptorStatus {
        let rpu = limit.requests_per_unit as u64;
        let c = match self {
            Counter::Upstream { store, window_s } => {
                upstream(store, *window_s, key, hits, now, rpu)
            }
            Counter::Algorithm(store) => algorithm(store, key, hits, now, rpu),
        };
        stats.record(
            hits,
            c.before,
            c.after,
            rpu,
            near_limit_ratio,
            c.over,
            limit.shadow_mode,
        );
        status(&c, limit)
    }

    /// What [`Counter::check`] would answer, counting nothing (a peek of the counter), and
    /// the counts it would see: for explanations.
    pub(crate) fn peek(
        &self,
        key: &[u8],
        hits: u64,
        now: Nanos,
        limit: &Applied<'_>,
    ) -> (DescriptorStatus, Counted) {
        let rpu = limit.requests_per_unit as u64;
        let c = match self {
            Counter::Upstream { store, window_s } => {
                let count = MAX_LIMIT - store.peek_at(key, now).remaining.min(MAX_LIMIT);
                let after = count.saturating_add(hits);
                Counted {
                    over: after > rpu,
                    remaining: rpu.saturating_sub(after),
                    reset_s: window_s - (now / NANOS_PER_SEC) % window_s,
                    before: count,
                    after,
                }
            }
            Counter::Algorithm(store) => counted(store.evaluate_at(key, hits, now), hits, rpu),
        };
        (status(&c, limit), c)
    }

    /// The key id the counter's store keeps `key` under.
    pub(crate) fn key_id(&self, key: &[u8]) -> u64 {
        use turnstile::keyed::Key;
        match self {
            Counter::Upstream { store, .. } | Counter::Algorithm(store) => {
                key.key_id(store.hasher())
            }
        }
    }
}

/// A descriptor's status from its counts.
fn status(c: &Counted, limit: &Applied<'_>) -> DescriptorStatus {
    DescriptorStatus {
        // A shadow limit that is over still answers OK, with nothing remaining.
        code: if c.over && !limit.shadow_mode {
            CODE_OVER_LIMIT
        } else {
            CODE_OK
        },
        current_limit: Some(PbRateLimit {
            name: limit.name.to_string(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit.map_or(0, Unit::proto),
        }),
        limit_remaining: if c.over {
            0
        } else {
            c.remaining.min(u32::MAX as u64) as u32
        },
        duration_until_reset: Some(PbDuration {
            seconds: c.reset_s.min(i64::MAX as u64) as i64,
            nanos: 0,
        }),
        quota: None,
    }
}

/// One check's outcome in upstream's terms.
pub(crate) struct Counted {
    pub(crate) over: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_s: u64,
    /// The count before and after this request's hits (for the metrics' split).
    pub(crate) before: u64,
    pub(crate) after: u64,
}

/// Upstream's counter: count every hit, then compare with `requests_per_unit`.
fn upstream(
    store: &Store<DynClock>,
    window_s: u64,
    key: &[u8],
    hits: u64,
    now: Nanos,
    rpu: u64,
) -> Counted {
    let cost = hits.min(MAX_LIMIT);
    let d = store.check_at(key, cost, now);
    let count = MAX_LIMIT - d.remaining.min(MAX_LIMIT);
    let (before, after) = match d.outcome {
        Outcome::Allowed => (count - cost, count),
        // The counter is full (2^24 − 1): every limit is below it, so over.
        Outcome::Untracked => (0, cost),
        // Limited, NeverFits, StoreFull, and any outcome added later (the enum is
        // non_exhaustive): a denial.
        _ => (count, count.saturating_add(hits)),
    };
    // Windows on the Unix epoch: the reset is the rest of this one, in whole seconds.
    let now_s = now / NANOS_PER_SEC;
    Counted {
        over: after > rpu,
        remaining: rpu.saturating_sub(after),
        reset_s: window_s - now_s % window_s,
        before,
        after,
    }
}

/// Our extension: the algorithm's store decides; the count is what it has used of the limit.
fn algorithm(store: &Store<DynClock>, key: &[u8], hits: u64, now: Nanos, rpu: u64) -> Counted {
    counted(store.check_at(key, hits, now), hits, rpu)
}

/// [`algorithm`]'s counts from the store's decision `d`.
fn counted(d: turnstile::Decision, hits: u64, rpu: u64) -> Counted {
    let remaining = d.remaining.min(rpu);
    let used = rpu - remaining;
    let over = !d.allowed();
    Counted {
        over,
        remaining: if over { 0 } else { remaining },
        // Whole seconds, rounded up: a client that waits this long finds the window reset.
        reset_s: d.reset_after_ns.div_ceil(NANOS_PER_SEC),
        before: if over {
            used
        } else {
            used.saturating_sub(hits)
        },
        after: if over {
            used.saturating_add(hits)
        } else {
            used
        },
    }
}
