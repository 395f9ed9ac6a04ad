//! `CL.THROTTLE key max_burst count period [quantity]`: redis-cell's command on turnstile's
//! keyed stores.
//!
//! redis-cell is GCRA with an emission interval E = period / count (whole nanoseconds, rounded
//! down) and a tolerance τ = E × (max_burst + 1); turnstile's `token_bucket` is the same GCRA
//! (`src/algo/token_bucket.rs`) with capacity max_burst + 1 and interval E, so a decision of
//! the store carries what the reply needs: the TTL (`reset_after_ns`), and, when denied, the
//! time until the request fits (`retry_after_ns`, `None` when the quantity exceeds the burst).
//! [`reply`] turns it into redis-cell's five integers with redis-cell's own arithmetic:
//! `remaining` = (τ − TTL) in whole microseconds over E in whole microseconds, truncated;
//! times in seconds, truncated, plus one if a whole millisecond is left over.
//!
//! Every key lives in one store whose limit comes with each check (`Store::check_with`): the
//! record keeps the key's TAT only, so any parameters can decide it, and a key checked with new
//! parameters continues from its TAT as redis-cell's does (`CL.THROTTLE m 2 10 60` three times,
//! then `CL.THROTTLE m 5 10 60`, answers `[0, 6, 2, -1, 24]`). A new parameter set costs
//! nothing: no store, no budget, no allocation; `--throttle-keys` bounds the keys. A connection
//! keeps the limit of the parameters it used last, so a client that always sends the same
//! parameters computes it once.
//!
//! Where this differs from redis-cell, on inputs redis-cell does not guard: a negative
//! quantity, count or period, or a negative max_burst, is refused (`ERR value is out of range,
//! must be positive`) instead of corrupting the key; a rate over one per microsecond, where
//! redis-cell divides by a zero microsecond interval, computes `remaining` in nanoseconds.

use turnstile::algo::token_bucket;
use turnstile::keyed::{FullPolicy, Store};
use turnstile::{Clock, Decision, Limit, Limits, Nanos, Outcome};

/// `(max_burst, count, period)`: a command's limit.
pub type Params = (i64, i64, i64);

/// redis-cell's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    /// 1 if limited.
    pub limited: i64,
    /// max_burst + 1.
    pub limit: i64,
    /// Requests left.
    pub remaining: i64,
    /// Seconds until the request would fit; -1 when allowed or when it never fits.
    pub retry_after: i64,
    /// Seconds until the key is back to full.
    pub reset_after: i64,
}

impl Cell {
    /// The five integers, in reply order.
    pub fn as_array(&self) -> [i64; 5] {
        [
            self.limited,
            self.limit,
            self.remaining,
            self.retry_after,
            self.reset_after,
        ]
    }
}

/// Why a `CL.THROTTLE` was refused before it reached a store (Redis's wording).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// Negative where a count is needed.
    NotPositive,
    /// Too large to represent.
    OutOfRange,
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgError::NotPositive => f.write_str("ERR value is out of range, must be positive"),
            ArgError::OutOfRange => f.write_str("ERR value is out of range"),
        }
    }
}

/// E in ns as redis-cell computes it: `(period_ns as f64 / count as f64) as i64`.
pub fn emission_ns(count: i64, period: i64) -> Result<i64, ArgError> {
    if count <= 0 || period <= 0 {
        return Err(ArgError::NotPositive);
    }
    let period_ns = period
        .checked_mul(1_000_000_000)
        .ok_or(ArgError::OutOfRange)?;
    let e = (period_ns as f64 / count as f64) as i64;
    if e < 1 {
        return Err(ArgError::OutOfRange);
    }
    Ok(e)
}

/// The store limit for `(max_burst, count, period)`.
pub fn limit_of((max_burst, count, period): Params) -> Result<Limit, ArgError> {
    if max_burst < 0 {
        return Err(ArgError::NotPositive);
    }
    let e = emission_ns(count, period)?;
    let cap = (max_burst as u64)
        .checked_add(1)
        .ok_or(ArgError::OutOfRange)?;
    token_bucket::Params::with_interval(cap, e as u64)
        .map(Limit::TokenBucket)
        .map_err(|_| ArgError::OutOfRange)
}

/// Seconds as redis-cell rounds them: truncated, plus one if a whole millisecond is left.
fn seconds(ns: i64) -> i64 {
    ns / 1_000_000_000 + i64::from((ns % 1_000_000_000) / 1_000_000 > 0)
}

/// redis-cell's five integers from the store's decision for a limit of capacity
/// `max_burst + 1` and interval `e` ns.
pub fn reply(d: &Decision, max_burst: i64, e: i64) -> Cell {
    let limit = max_burst + 1;
    let tau = e.saturating_mul(limit);
    let limited = !d.allowed();
    let ttl = d.reset_after_ns.min(i64::MAX as u64) as i64;
    let next = tau - ttl;
    let remaining = if next > -e {
        let (n, d) = if e >= 1000 {
            (next / 1000, e / 1000)
        } else {
            (next, e)
        };
        (n as f64 / d as f64) as i64
    } else {
        0
    };
    let retry_after = match (limited, d.retry_after_ns) {
        (true, Some(r)) if d.outcome == Outcome::Limited => seconds(r.min(i64::MAX as u64) as i64),
        _ => -1,
    };
    Cell {
        limited: i64::from(limited),
        limit,
        remaining,
        retry_after,
        reset_after: seconds(ttl),
    }
}

/// The one store of every `CL.THROTTLE` key.
pub struct Throttles {
    store: Store,
    seed: u64,
}

impl Throttles {
    /// Room for `keys` keys (the stalest evicted when full), hashed with `seed` (kept in
    /// snapshots, so that restored ids are found again).
    pub fn new(keys: u64, seed: u64) -> Result<Self, String> {
        let any = token_bucket::Params::with_interval(1, 1).map_err(|e| e.to_string())?;
        let limits = Limits::new(vec![Limit::TokenBucket(any)]).map_err(|e| e.to_string())?;
        let store = Store::builder(limits)
            .capacity(keys)
            .policy(FullPolicy::EvictStalest)
            .seed(seed)
            // Checked one key at a time: a new key writes its slot's page and its bucket
            // group's header, not a tag's page too (docs/service.md, the abuse soak).
            .batch_hints(false)
            .build()
            .map_err(|e| format!("--throttle-keys {keys}: {e}"))?;
        Ok(Self { store, seed })
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The hash seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// A connection's cache of the limit it used last, and the reading of the store's clock that
/// ended its last check.
#[derive(Default)]
pub struct LastStore {
    /// The parameters, their limit and emission interval (ns).
    last: Option<(Params, Limit, i64)>,
    /// The store's clock when its last `CL.THROTTLE` ended, if nothing else ran since: the next
    /// one starts there, so that a run of pipelined `CL.THROTTLE`s reads the clock once per
    /// command (the end of one is the start of the next, for its check and its latency)
    /// instead of three times (a latency bracket and the check's own reading; each `rdtsc`
    /// about 1 % of a pipelined command's time, docs/service.md).
    mark: Option<Nanos>,
}

impl LastStore {
    /// Prefetches `key` of a `CL.THROTTLE`: a hint for a command about to run (see
    /// [`Store::prefetch`]). Returns the key's id, for [`LastStore::throttle`] (which then
    /// does not hash the key again).
    pub fn prefetch(t: &Throttles, key: &[u8]) -> u64 {
        let id = t.store.hasher().bytes(key);
        t.store.prefetch(&id);
        id
    }

    /// Something other than a `CL.THROTTLE` ran: the next one reads the clock afresh.
    #[inline]
    pub fn unmark(&mut self) {
        self.mark = None;
    }

    /// `CL.THROTTLE key max_burst count period quantity`; `id`, if given, is the key's id as
    /// [`LastStore::prefetch`] returned it. Also returns the store's clock when the check
    /// started, for [`LastStore::stop`].
    pub fn throttle(
        &mut self,
        t: &Throttles,
        key: &[u8],
        p: Params,
        quantity: i64,
        id: Option<u64>,
    ) -> Result<(Cell, Nanos), ArgError> {
        if quantity < 0 {
            return Err(ArgError::NotPositive);
        }
        let (limit, e) = match &self.last {
            Some((lp, l, e)) if *lp == p => (*l, *e),
            _ => {
                let l = limit_of(p)?;
                let e = emission_ns(p.1, p.2)?;
                self.last = Some((p, l, e));
                (l, e)
            }
        };
        let store = &t.store;
        let id = id.unwrap_or_else(|| store.hasher().bytes(key));
        let now = self.mark.take().unwrap_or_else(|| store.clock().now());
        // A token_bucket store accepts every token_bucket limit: never refused.
        let d = store
            .check_with_at(&id, &limit, quantity as u64, now)
            .map_err(|_| ArgError::OutOfRange)?;
        Ok((reply(&d, p.0, e), now))
    }

    /// Ends the `CL.THROTTLE` that [`LastStore::throttle`] started at `start`: its time in ns
    /// (the latency histogram's), by the same store's clock, whose reading starts the next.
    #[inline]
    pub fn stop(&mut self, t: &Throttles, start: Nanos) -> u64 {
        let end = t.store.clock().now();
        self.mark = Some(end);
        end.saturating_sub(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile::ManualClock;

    /// redis-cell's own test table (`src/cell/mod.rs`, `it_rate_limits`), in ns.
    #[test]
    fn redis_cell_cases() {
        let start = 1_000_000_000_000u64;
        let clock = ManualClock::new(start);
        let p = (4, 1, 1);
        let store = Store::builder(Limits::new(vec![limit_of(p).unwrap()]).unwrap())
            .capacity(16)
            .build_with_clock(&clock)
            .unwrap();
        let e = emission_ns(1, 1).unwrap();
        let ms = 1_000_000u64;
        // (now offset ms, quantity, remaining, reset ms, retry s (redis-cell's Duration, -1), limited)
        let cases: [(u64, u64, i64, i64, i64, bool); 15] = [
            (0, 6, 5, 0, -1, true),
            (0, 1, 4, 1000, -1, false),
            (0, 1, 3, 2000, -1, false),
            (0, 1, 2, 3000, -1, false),
            (0, 1, 1, 4000, -1, false),
            (0, 1, 0, 5000, -1, false),
            (0, 1, 0, 5000, 1, true),
            (3000, 1, 2, 3000, -1, false),
            (3100, 1, 1, 3900, -1, false),
            (4000, 1, 1, 4000, -1, false),
            (8000, 1, 4, 1000, -1, false),
            (9500, 1, 4, 1000, -1, false),
            (9500, 0, 4, 1000, -1, false),
            (9500, 2, 2, 3000, -1, false),
            (9500, 5, 2, 3000, 3, true),
        ];
        for (i, (at, q, rem, reset_ms, retry_s, limited)) in cases.into_iter().enumerate() {
            clock.set(start + at * ms);
            let d = store.check("foo", q);
            assert_eq!(d.reset_after_ns, reset_ms as u64 * ms, "case {i} reset");
            let c = reply(&d, p.0, e);
            assert_eq!(c.limited, i64::from(limited), "case {i}");
            assert_eq!(c.limit, 5, "case {i}");
            assert_eq!(c.remaining, rem, "case {i} remaining");
            assert_eq!(c.retry_after, retry_s, "case {i} retry");
            assert_eq!(
                c.reset_after,
                reset_ms / 1000 + i64::from(reset_ms % 1000 > 0),
                "case {i}"
            );
        }
    }

    #[test]
    fn rounding_and_arguments() {
        assert_eq!(seconds(0), 0);
        assert_eq!(seconds(999_999), 0);
        assert_eq!(seconds(1_000_000), 1);
        assert_eq!(seconds(1_000_999_999), 1);
        assert_eq!(seconds(1_001_000_000), 2);
        assert_eq!(seconds(-1_000_000_000), -1);
        assert_eq!(emission_ns(30, 60), Ok(2_000_000_000));
        assert_eq!(emission_ns(3, 1), Ok(333_333_333));
        assert_eq!(emission_ns(0, 1), Err(ArgError::NotPositive));
        assert_eq!(emission_ns(1, i64::MAX), Err(ArgError::OutOfRange));
        assert!(limit_of((-1, 1, 1)).is_err());
        assert!(limit_of((i64::MAX, 1, 1)).is_err());
    }

    /// redis-cell's answers when a key's parameters change: the TAT carries over.
    #[test]
    fn a_change_of_parameters_continues_as_redis_cell() {
        let t = Throttles::new(1000, 1).unwrap();
        let mut c = LastStore::default();
        let mut call = |p: Params| {
            let (cell, t0) = c.throttle(&t, b"m", p, 1, None).unwrap();
            c.stop(&t, t0);
            c.unmark();
            cell.as_array()
        };
        for i in 0..3 {
            assert_eq!(call((2, 10, 60))[..3], [0, 3, 2 - i]);
        }
        let got = call((5, 10, 60));
        assert_eq!(got[..4], [0, 6, 2, -1]);
        assert!((23..=24).contains(&got[4]), "{got:?}");
        // Any number of parameter sets, one record each key.
        for n in 1..=10_000 {
            let (cell, _) = c.throttle(&t, b"k", (n, 1, 60), 1, None).unwrap();
            assert_eq!(cell.limited, 0);
        }
        assert_eq!(t.store().stats().live, 2);
    }
}
