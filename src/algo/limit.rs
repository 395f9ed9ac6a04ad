//! One limit: [`LimitSpec`] in human terms, checked into a [`Limit`] with its algorithm's
//! compiled parameters.

use super::{
    concurrency, fixed_window, leaky_bucket, sliding_log, sliding_window, token_bucket,
    window_ring, with_packed, Algorithm, Cells, Packed, PackedFn,
};
use crate::clock::nanos;
use crate::decision::{ConfigError, Decision};
use std::time::Duration;

/// A limit in human terms, before validation. [`LimitSpec::build`] checks it.
///
/// | algorithm | `limit` | `window` | `burst` | other |
/// |---|---|---|---|---|
/// | fixed_window, sliding_window, sliding_log | per window | window | — | `count_denied` |
/// | window_ring | per window | window | — | `buckets` (60), `count_denied` |
/// | token_bucket | refill per window | refill period | capacity (= limit) | — |
/// | leaky_bucket | drained per window | period | nginx `burst` (0) | `delay`: shaper if set |
/// | concurrency | in flight | lease TTL | — | — |
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LimitSpec {
    /// Which algorithm.
    pub algorithm: Algorithm,
    /// See the table.
    pub limit: u64,
    /// See the table.
    pub window: Duration,
    /// Bucket capacity (token_bucket) or nginx burst (leaky_bucket).
    pub burst: Option<u64>,
    /// Sub-windows of a window_ring.
    pub buckets: Option<u64>,
    /// leaky_bucket shaper: excess requests admitted undelayed. `None`: a meter.
    pub delay: Option<u64>,
    /// Count denied requests against window counters and logs.
    pub count_denied: bool,
}

impl LimitSpec {
    /// `limit` per `window` with the algorithm's defaults.
    pub fn new(algorithm: Algorithm, limit: u64, window: Duration) -> Self {
        Self {
            algorithm,
            limit,
            window,
            burst: None,
            buckets: None,
            delay: None,
            count_denied: false,
        }
    }

    /// Validates and compiles.
    pub fn build(&self) -> Result<Limit, ConfigError> {
        let w = nanos(self.window);
        let no = |field: &'static str, what: &str| -> Result<Limit, ConfigError> {
            Err(ConfigError::new(
                field,
                format!("`{field}` does not apply to {}: {what}", self.algorithm),
            ))
        };
        if self.burst.is_some()
            && !matches!(
                self.algorithm,
                Algorithm::TokenBucket | Algorithm::LeakyBucket
            )
        {
            return no("burst", "only token_bucket and leaky_bucket have a burst");
        }
        if self.buckets.is_some() && self.algorithm != Algorithm::WindowRing {
            return no("buckets", "only window_ring splits its window into buckets");
        }
        if self.delay.is_some() && self.algorithm != Algorithm::LeakyBucket {
            return no("delay", "only a shaping leaky_bucket delays requests");
        }
        if self.count_denied
            && !matches!(
                self.algorithm,
                Algorithm::FixedWindow
                    | Algorithm::SlidingWindow
                    | Algorithm::SlidingLog
                    | Algorithm::WindowRing
            )
        {
            return no(
                "count_denied",
                "only window counters and logs count denied requests",
            );
        }
        Ok(match self.algorithm {
            Algorithm::FixedWindow => {
                Limit::FixedWindow(fixed_window::Params::new(self.limit, w, self.count_denied)?)
            }
            Algorithm::SlidingWindow => Limit::SlidingWindow(sliding_window::Params::new(
                self.limit,
                w,
                self.count_denied,
            )?),
            Algorithm::SlidingLog => {
                Limit::SlidingLog(sliding_log::Params::new(self.limit, w, self.count_denied)?)
            }
            Algorithm::WindowRing => Limit::WindowRing(window_ring::Params::new(
                self.limit,
                w,
                self.buckets.unwrap_or(60),
                self.count_denied,
            )?),
            Algorithm::TokenBucket => Limit::TokenBucket(token_bucket::Params::new(
                self.burst.unwrap_or(self.limit),
                self.limit,
                w,
            )?),
            Algorithm::LeakyBucket => {
                let mode = match self.delay {
                    None => leaky_bucket::Mode::Meter,
                    Some(delay) => leaky_bucket::Mode::Shaper { delay },
                };
                Limit::LeakyBucket(leaky_bucket::Params::new(
                    self.limit,
                    w,
                    self.burst.unwrap_or(0),
                    mode,
                )?)
            }
            Algorithm::Concurrency => Limit::Concurrency(concurrency::Params::new(self.limit, w)?),
        })
    }
}

/// `Ok` if `limit` is in `1..=max`; else the error with the fix that applies: `holds` says
/// what the algorithm can keep (e.g. "fixed_window holds 1..=N requests per window"), `larger`
/// where to go above its maximum.
pub(crate) fn limit_in(
    limit: u64,
    max: u64,
    holds: impl FnOnce() -> String,
    larger: &str,
) -> Result<(), ConfigError> {
    if limit != 0 && limit <= max {
        return Ok(());
    }
    let fix = if limit == 0 {
        "a limit admits at least 1 request"
    } else {
        larger
    };
    let holds = holds();
    Err(ConfigError::new(
        "limit",
        format!("{holds}, got {limit}; {fix}"),
    ))
}

/// `Ok` if a window of `window` ns is at least 1 ns.
pub(crate) fn window_at_least_1ns(window: u64) -> Result<(), ConfigError> {
    if window == 0 {
        return Err(ConfigError::new(
            "window",
            "the window must be at least 1 ns",
        ));
    }
    Ok(())
}

/// A validated limit: an algorithm with its compiled parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// See [`fixed_window`].
    FixedWindow(fixed_window::Params),
    /// See [`sliding_window`].
    SlidingWindow(sliding_window::Params),
    /// See [`token_bucket`].
    TokenBucket(token_bucket::Params),
    /// See [`leaky_bucket`].
    LeakyBucket(leaky_bucket::Params),
    /// See [`sliding_log`].
    SlidingLog(sliding_log::Params),
    /// See [`window_ring`].
    WindowRing(window_ring::Params),
    /// See [`concurrency`].
    Concurrency(concurrency::Params),
}

impl Limit {
    /// `limit` per `window` in fixed windows.
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        LimitSpec::new(Algorithm::FixedWindow, limit, window).build()
    }
    /// `limit` per `window`, two-window weighted estimate.
    pub fn sliding_window(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        LimitSpec::new(Algorithm::SlidingWindow, limit, window).build()
    }
    /// `limit` per `window`, exact log.
    pub fn sliding_log(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        LimitSpec::new(Algorithm::SlidingLog, limit, window).build()
    }
    /// `limit` per `window` counted in `buckets` sub-windows.
    pub fn window_ring(limit: u64, window: Duration, buckets: u64) -> Result<Self, ConfigError> {
        LimitSpec {
            buckets: Some(buckets),
            ..LimitSpec::new(Algorithm::WindowRing, limit, window)
        }
        .build()
    }
    /// Refill `rate` per `period`, holding at most `capacity`.
    pub fn token_bucket(capacity: u64, rate: u64, period: Duration) -> Result<Self, ConfigError> {
        LimitSpec {
            burst: Some(capacity),
            ..LimitSpec::new(Algorithm::TokenBucket, rate, period)
        }
        .build()
    }
    /// Drain `rate` per `period` with nginx `burst`; `delay: None` is a meter.
    pub fn leaky_bucket(
        rate: u64,
        period: Duration,
        burst: u64,
        delay: Option<u64>,
    ) -> Result<Self, ConfigError> {
        LimitSpec {
            burst: Some(burst),
            delay,
            ..LimitSpec::new(Algorithm::LeakyBucket, rate, period)
        }
        .build()
    }
    /// At most `limit` in flight, leases expiring after `lease`.
    pub fn concurrency(limit: u64, lease: Duration) -> Result<Self, ConfigError> {
        LimitSpec::new(Algorithm::Concurrency, limit, lease).build()
    }

    /// Which algorithm.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Limit::FixedWindow(_) => Algorithm::FixedWindow,
            Limit::SlidingWindow(_) => Algorithm::SlidingWindow,
            Limit::TokenBucket(_) => Algorithm::TokenBucket,
            Limit::LeakyBucket(_) => Algorithm::LeakyBucket,
            Limit::SlidingLog(_) => Algorithm::SlidingLog,
            Limit::WindowRing(_) => Algorithm::WindowRing,
            Limit::Concurrency(_) => Algorithm::Concurrency,
        }
    }

    /// The headline number: requests per window, bucket capacity, or in-flight maximum.
    pub fn capacity(&self) -> u64 {
        match self {
            Limit::FixedWindow(p) => p.limit,
            Limit::SlidingWindow(p) => p.limit,
            Limit::TokenBucket(p) => p.capacity,
            Limit::LeakyBucket(p) => p.capacity(),
            Limit::SlidingLog(p) => p.limit,
            Limit::WindowRing(p) => p.limit,
            Limit::Concurrency(p) => p.limit,
        }
    }

    /// Words of record this limit needs (1 for packed algorithms).
    pub fn words(&self) -> usize {
        match self {
            Limit::SlidingLog(p) => p.words(),
            Limit::WindowRing(p) => p.words(),
            Limit::Concurrency(p) => p.words(),
            _ => 1,
        }
    }

    /// Whether a record written under this limit reads, under `to`, as the same state: a
    /// counter keeps its count, a bucket its TAT, a log its entries. True for the same
    /// algorithm when the record's layout and time base are unchanged: token_bucket and
    /// leaky_bucket always (the TAT is a time; the new rate and burst apply to it);
    /// fixed_window and sliding_window with the same window (the limit and `count_denied` may
    /// change); window_ring with the same window, sub-windows and counter width (the limit
    /// may change within the same bit length); sliding_log with the same limit (its ring
    /// length) and window; concurrency only unchanged. Otherwise the state starts fresh.
    pub fn carries_to(&self, to: &Limit) -> bool {
        match (self, to) {
            (Limit::FixedWindow(a), Limit::FixedWindow(b)) => a.window == b.window,
            (Limit::SlidingWindow(a), Limit::SlidingWindow(b)) => a.window == b.window,
            (Limit::TokenBucket(_), Limit::TokenBucket(_)) => true,
            (Limit::LeakyBucket(_), Limit::LeakyBucket(_)) => true,
            (Limit::WindowRing(a), Limit::WindowRing(b)) => {
                (a.window, a.buckets, a.width) == (b.window, b.buckets, b.width)
            }
            (Limit::SlidingLog(a), Limit::SlidingLog(b)) => {
                (a.limit, a.window, a.tick) == (b.limit, b.window, b.tick)
            }
            (Limit::Concurrency(a), Limit::Concurrency(b)) => a == b,
            _ => false,
        }
    }

    /// The same limit with `count_denied` off: what it answers without recording a denial.
    pub fn counting_nothing(&self) -> Limit {
        let mut l = *self;
        match &mut l {
            Limit::FixedWindow(p) => p.count_denied = false,
            Limit::SlidingWindow(p) => p.count_denied = false,
            Limit::SlidingLog(p) => p.count_denied = false,
            Limit::WindowRing(p) => p.count_denied = false,
            _ => {}
        }
        l
    }

    /// Whether denied requests count against this limit.
    pub fn counts_denied(&self) -> bool {
        match self {
            Limit::FixedWindow(p) => p.count_denied,
            Limit::SlidingWindow(p) => p.count_denied,
            Limit::SlidingLog(p) => p.count_denied,
            Limit::WindowRing(p) => p.count_denied,
            _ => false,
        }
    }

    /// The packed transition; `None` for a variable-size algorithm.
    #[inline]
    pub fn decide_packed(&self, s: u64, now: u64, cost: u64) -> Option<(u64, Decision)> {
        struct Decide {
            s: u64,
            now: u64,
            cost: u64,
        }
        impl PackedFn<(u64, Decision)> for Decide {
            #[inline(always)]
            fn call<P: Packed>(self, p: &P) -> (u64, Decision) {
                p.decide(self.s, self.now, self.cost)
            }
        }
        with_packed(self, Decide { s, now, cost })
    }

    /// One limit's step over its words `c` (at offset 0). `apply = false` evaluates only.
    #[inline]
    pub fn step<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64, apply: bool) -> Decision {
        match self {
            Limit::SlidingLog(p) => sliding_log::decide(c, now, p, cost, apply),
            Limit::WindowRing(p) => window_ring::decide(c, now, p, cost, apply),
            Limit::Concurrency(p) => concurrency::acquire(c, now, p, cost, apply).0,
            packed => {
                let (s, d) = packed.decide_packed(c.get(0), now, cost).expect("packed");
                if apply && (d.allowed() || packed.counts_denied()) {
                    c.set(0, s);
                }
                d
            }
        }
    }

    /// Gives `n` back.
    pub fn refund<C: Cells + ?Sized>(&self, c: &mut C, now: u64, n: u64) {
        match self {
            Limit::FixedWindow(p) => c.set(0, fixed_window::refund(c.get(0), now, p, n)),
            Limit::SlidingWindow(p) => c.set(0, sliding_window::refund(c.get(0), now, p, n)),
            Limit::TokenBucket(p) => c.set(0, token_bucket::refund(c.get(0), now, p, n)),
            Limit::LeakyBucket(p) => c.set(0, leaky_bucket::refund(c.get(0), now, p, n)),
            Limit::SlidingLog(p) => sliding_log::refund(c, p, n),
            Limit::WindowRing(p) => window_ring::refund(c, now, p, n),
            Limit::Concurrency(_) => {}
        }
    }

    /// Takes `n` whatever the limit holds (a settled cost above the one checked): each
    /// algorithm's `charge` says how far past its limit it can owe. A concurrency limit counts
    /// permits, not costs: nothing.
    pub fn charge<C: Cells + ?Sized>(&self, c: &mut C, now: u64, n: u64) {
        match self {
            Limit::FixedWindow(p) => c.set(0, fixed_window::charge(c.get(0), now, p, n)),
            Limit::SlidingWindow(p) => c.set(0, sliding_window::charge(c.get(0), now, p, n)),
            Limit::TokenBucket(p) => c.set(0, token_bucket::charge(c.get(0), now, p, n)),
            Limit::LeakyBucket(p) => c.set(0, leaky_bucket::charge(c.get(0), now, p, n)),
            Limit::SlidingLog(p) => sliding_log::charge(c, now, p, n),
            Limit::WindowRing(p) => window_ring::charge(c, now, p, n),
            Limit::Concurrency(_) => {}
        }
    }

    /// Nanoseconds until this limit's record is equivalent to a fresh one.
    pub fn idle_in<C: Cells + ?Sized>(&self, c: &C, now: u64) -> u64 {
        match self {
            Limit::FixedWindow(p) => fixed_window::idle_in(c.get(0), now, p),
            Limit::SlidingWindow(p) => sliding_window::idle_in(c.get(0), now, p),
            Limit::TokenBucket(p) => token_bucket::idle_in(c.get(0), now, p),
            Limit::LeakyBucket(p) => leaky_bucket::idle_in(c.get(0), now, p),
            Limit::SlidingLog(p) => sliding_log::idle_in(c, now, p),
            Limit::WindowRing(p) => window_ring::idle_in(c, now, p),
            Limit::Concurrency(p) => concurrency::idle_in(c, now, p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit of 0 and a limit past an algorithm's counter each get the fix that applies to
    /// them: 0 is told to admit at least 1, a large limit where to go for more.
    #[test]
    fn a_limit_out_of_range_names_its_own_fix() {
        let w = Duration::from_secs(1);
        type Make = fn(u64, Duration) -> Result<Limit, ConfigError>;
        let cases: [(Make, u64, &str); 3] = [
            (
                Limit::fixed_window,
                fixed_window::MAX_LIMIT,
                "use token_bucket",
            ),
            (
                Limit::sliding_window,
                sliding_window::MAX_LIMIT,
                "use token_bucket",
            ),
            (
                Limit::sliding_log,
                sliding_log::MAX_LIMIT,
                "use window_ring",
            ),
        ];
        for (make, max, larger) in cases {
            let zero = make(0, w).unwrap_err().to_string();
            assert!(
                zero.contains("got 0; a limit admits at least 1 request"),
                "{zero}"
            );
            assert!(!zero.contains(larger), "{zero}");
            let big = make(max + 1, w).unwrap_err().to_string();
            assert!(big.contains(&format!("got {}; {larger}", max + 1)), "{big}");
            assert!(big.starts_with("invalid `limit`: "), "{big}");
            assert!(make(max, w).is_ok());
        }
    }
}
