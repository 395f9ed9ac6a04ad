//! The algorithms, each a pure transition over a packed record.
//!
//! Every algorithm is a function `decide(state, now, params, cost) -> (new_state, Decision)`
//! with no atomics, no clock and no allocation: testable with plain values. The stores
//! ([`crate::Limiter`], [`crate::keyed::Store`]) own the compare-and-swap loop around it.
//!
//! * Packed algorithms keep their whole state in 63 bits of one `u64` (bit 63 is the keyed
//!   store's): [`fixed_window`], [`sliding_window`], [`token_bucket`], [`leaky_bucket`]. Their
//!   `decide` takes and returns the `u64`.
//! * Variable-size algorithms keep a record of several words, reached through [`Cells`]:
//!   [`sliding_log`] (a ring of timestamps), [`window_ring`] (a ring of sub-window counters),
//!   [`concurrency`] (lease cells). Their `decide` updates the record in place; the store
//!   gives it exclusive access (see `keyed::arena`).
//!
//! [`Limits`] combines several limits on one key, all-or-nothing: it evaluates every limit
//! first and records only if all admit (or, for limits that count denied requests, the denial
//! of a cost that fits). A denial reports the least remaining over all limits, the latest
//! reset and the latest retry, each from what the record holds (docs/algorithms.md).

pub mod concurrency;
pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;
pub mod window_ring;

use crate::clock::nanos;
use crate::decision::{ConfigError, Decision, Outcome};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A record of `u64` words, read and written by the variable-size algorithms.
pub trait Cells {
    /// Word `i`.
    fn get(&self, i: usize) -> u64;
    /// Sets word `i`.
    fn set(&mut self, i: usize, v: u64);
}

impl Cells for [u64] {
    #[inline]
    fn get(&self, i: usize) -> u64 {
        self[i]
    }
    #[inline]
    fn set(&mut self, i: usize, v: u64) {
        self[i] = v;
    }
}

impl<const N: usize> Cells for [u64; N] {
    #[inline]
    fn get(&self, i: usize) -> u64 {
        self[i]
    }
    #[inline]
    fn set(&mut self, i: usize, v: u64) {
        self[i] = v;
    }
}

/// The algorithms, by their stable names (used by the CLI, rules and JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Algorithm {
    /// `fixed_window`
    FixedWindow,
    /// `sliding_log`
    SlidingLog,
    /// `sliding_window`
    SlidingWindow,
    /// `window_ring`
    WindowRing,
    /// `token_bucket`
    TokenBucket,
    /// `leaky_bucket`
    LeakyBucket,
    /// `concurrency`
    Concurrency,
}

impl Algorithm {
    /// All, in documentation order.
    pub const ALL: [Algorithm; 7] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::WindowRing,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Concurrency,
    ];

    /// The stable name.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::WindowRing => "window_ring",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// Whether the whole state packs into one `u64` (lock-free 16-byte keyed slots).
    pub const fn is_packed(self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow
                | Algorithm::SlidingWindow
                | Algorithm::TokenBucket
                | Algorithm::LeakyBucket
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                format!(
                    "unknown algorithm `{s}`; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

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

/// The error for a `limit` outside `1..=max`: `holds` says what the algorithm can keep
/// (e.g. "fixed_window holds 1..=N requests per window"), `larger` where to go above its maximum.
pub(crate) fn limit_out_of_range(holds: String, limit: u64, larger: &str) -> ConfigError {
    let fix = if limit == 0 {
        "a limit admits at least 1 request"
    } else {
        larger
    };
    ConfigError::new("limit", format!("{holds}, got {limit}; {fix}"))
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

/// A packed algorithm's transition as a trait method marked `#[inline(always)]`, so that the
/// CAS loops of the store and the keyless limiter are compiled once per algorithm with the
/// transition inlined. Through [`Limit::decide_packed`] (a match over four inlined arms) the
/// compiler kept the transition out of line and returned its 56-byte result through memory:
/// ~80 instructions per check more (docs/performance.md).
pub(crate) trait Packed {
    fn decide(&self, s: u64, now: u64, cost: u64) -> (u64, Decision);
}

macro_rules! packed {
    ($($m:ident),*) => {$(
        impl Packed for $m::Params {
            #[inline(always)]
            fn decide(&self, s: u64, now: u64, cost: u64) -> (u64, Decision) {
                $m::decide(s, now, self, cost)
            }
        }
    )*};
}
packed!(token_bucket, fixed_window, sliding_window, leaky_bucket);

/// Runs `f` with the packed limit `l`'s parameters as a [`Packed`], i.e. once per algorithm;
/// `None` if `l` is not packed.
#[inline(always)]
pub(crate) fn with_packed<R>(l: &Limit, f: impl PackedFn<R>) -> Option<R> {
    Some(match l {
        Limit::TokenBucket(p) => f.call(p),
        Limit::FixedWindow(p) => f.call(p),
        Limit::SlidingWindow(p) => f.call(p),
        Limit::LeakyBucket(p) => f.call(p),
        _ => return None,
    })
}

/// A function generic over the packed algorithm (what [`with_packed`] calls).
pub(crate) trait PackedFn<R> {
    fn call<P: Packed>(self, p: &P) -> R;
}

/// A view of words `[off, off + len)` of a record.
pub(crate) struct Sub<'a, C: Cells + ?Sized> {
    pub(crate) c: &'a mut C,
    pub(crate) off: usize,
}

impl<C: Cells + ?Sized> Cells for Sub<'_, C> {
    #[inline]
    fn get(&self, i: usize) -> u64 {
        self.c.get(self.off + i)
    }
    #[inline]
    fn set(&mut self, i: usize, v: u64) {
        self.c.set(self.off + i, v)
    }
}

/// Several limits on one key, decided all-or-nothing over one record (their words laid end
/// to end).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Limits {
    limits: Box<[Limit]>,
    offsets: Box<[usize]>,
    words: usize,
}

impl Limits {
    /// Combines `limits` (at least one; a concurrency limit stands alone).
    pub fn new(limits: Vec<Limit>) -> Result<Self, ConfigError> {
        if limits.is_empty() {
            return Err(ConfigError::new("limits", "give at least one limit"));
        }
        if limits.len() > 1
            && limits
                .iter()
                .any(|l| l.algorithm() == Algorithm::Concurrency)
        {
            return Err(ConfigError::new("limits", "a concurrency limit takes permits and stands alone; give it its own limiter or rule"));
        }
        let mut offsets = Vec::with_capacity(limits.len());
        let mut words = 0;
        for l in &limits {
            offsets.push(words);
            words += l.words();
        }
        Ok(Self {
            limits: limits.into(),
            offsets: offsets.into(),
            words,
        })
    }

    /// The limits.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// Words of the combined record.
    pub fn words(&self) -> usize {
        self.words
    }

    /// Whether this is one packed limit (lock-free `u64` state).
    pub fn single_packed(&self) -> Option<&Limit> {
        match &*self.limits {
            [l] if l.algorithm().is_packed() => Some(l),
            _ => None,
        }
    }

    /// All-or-nothing decision over the combined record.
    ///
    /// Every limit is evaluated on the record as it is. If all admit, all record the request
    /// and the answer is the least remaining, the latest reset and the longest delay. If any
    /// denies, only the limits that count denied requests record it (none, if some limit can
    /// never fit the cost: a never-fitting request changes nothing), and the answer describes
    /// the record as it then is.
    pub fn decide<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64) -> Decision {
        if let [l] = &*self.limits {
            return l.step(c, now, cost, true);
        }
        self.run(c, now, cost, true)
    }

    /// What [`Limits::decide`] would answer, recording nothing (a denial is described without
    /// the count a `count_denied` limit would add).
    pub fn evaluate<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64) -> Decision {
        if let [l] = &*self.limits {
            return l.counting_nothing().step(c, now, cost, false);
        }
        self.run(c, now, cost, false)
    }

    fn run<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64, apply: bool) -> Decision {
        let (mut all, mut fits) = (true, true);
        for (l, &off) in self.limits.iter().zip(self.offsets.iter()) {
            let d = l.step(&mut Sub { c: &mut *c, off }, now, cost, false);
            if !d.allowed() {
                all = false;
                fits &= d.outcome != Outcome::NeverFits;
            }
        }
        if all {
            let mut out: Option<Decision> = None;
            for (l, &off) in self.limits.iter().zip(self.offsets.iter()) {
                let d = l.step(&mut Sub { c: &mut *c, off }, now, cost, apply);
                out = Some(match out {
                    None => d,
                    Some(o) => admitted(o, d),
                });
            }
            return out.expect("at least one limit");
        }
        if apply && fits && self.limits.iter().any(|l| l.counts_denied()) {
            return self.count_denial(c, now, cost);
        }
        self.denial(c, now, cost)
    }

    /// A denial the `count_denied` limits record. Recorded on a copy first: if, recorded, the
    /// request turns out never to fit (its retry past the end of some limit's clock), nothing
    /// is recorded, as for any never-fitting request. A record of more than 64 words is
    /// recorded in place (no copy on the stack; it then keeps that denial).
    #[cold]
    fn count_denial<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64) -> Decision {
        if self.words > 64 {
            self.record_denial(c, now, cost);
            return self.denial(c, now, cost);
        }
        let mut w = [0u64; 64];
        for (i, v) in w.iter_mut().enumerate().take(self.words) {
            *v = c.get(i);
        }
        self.record_denial(&mut w[..self.words], now, cost);
        let d = self.denial(&mut w[..self.words], now, cost);
        if d.outcome != Outcome::NeverFits {
            for (i, &v) in w.iter().enumerate().take(self.words) {
                c.set(i, v);
            }
            return d;
        }
        self.denial(c, now, cost)
    }

    /// Records a denial in the limits that count them.
    fn record_denial<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64) {
        for (l, &off) in self.limits.iter().zip(self.offsets.iter()) {
            if l.counts_denied() {
                l.step(&mut Sub { c: &mut *c, off }, now, cost, true);
            }
        }
    }

    /// A denial of `cost` at `now`, described from the record as it is (after any denial was
    /// counted), each limit by what it holds now rather than by what it would hold had it
    /// recorded the request:
    /// * `remaining`: the least any limit has left (so a request of that cost is admitted at
    ///   once, and one more is not), with that limit's `limit`;
    /// * `reset_after`: the latest time at which a limit is idle;
    /// * `retry_after`: the latest time at which a limit that denies this cost now admits it
    ///   (admission only grows with time when nothing else happens); `None`, and
    ///   [`Outcome::NeverFits`], if some limit can never admit it.
    #[cold]
    fn denial<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64) -> Decision {
        let mut out = Decision::deny(u64::MAX, u64::MAX, 0, Some(0));
        let mut denier_least = false;
        for (l, &off) in self.limits.iter().zip(self.offsets.iter()) {
            let mut sub = Sub { c: &mut *c, off };
            // What the limit holds (a peek), and whether and when it admits the cost, judged
            // without counting this denial again (a `count_denied` limit's own denial
            // describes the record with the denial counted once more).
            let held = l.step(&mut sub, now, 0, false);
            let d = l.counting_nothing().step(&mut sub, now, cost, false);
            let denies = !d.allowed();
            out.reset_after_ns = out.reset_after_ns.max(held.reset_after_ns);
            // The least remainder; on a tie, a denying limit's (it is the one that binds).
            if held.remaining < out.remaining
                || (held.remaining == out.remaining && denies && !denier_least)
            {
                out.remaining = held.remaining;
                out.limit = held.limit;
                denier_least = denies;
            }
            if denies {
                out.retry_after_ns = match (out.retry_after_ns, d.retry_after_ns) {
                    (Some(x), Some(y)) => Some(x.max(y)),
                    _ => None,
                };
            }
        }
        // Each limit admits at its own retry and, nothing else happening, later too; but not
        // past the end of its clock (a bucket's TAT ends at 2^63 ns): if the latest retry is
        // such a time for some limit, no wait helps.
        if let Some(r) = out.retry_after_ns {
            let at = now.checked_add(r);
            let admits_then = |at: u64| {
                self.limits
                    .iter()
                    .zip(self.offsets.iter())
                    .all(|(l, &off)| {
                        l.counting_nothing()
                            .step(&mut Sub { c: &mut *c, off }, at, cost, false)
                            .allowed()
                    })
            };
            if !at.is_some_and(admits_then) {
                out.retry_after_ns = None;
            }
        }
        if out.retry_after_ns.is_none() {
            out.outcome = Outcome::NeverFits;
        }
        out
    }

    /// Whether records of these limits read as the same state under `to`: as many limits,
    /// each carrying to its counterpart ([`Limit::carries_to`]), so the layout is the same.
    pub fn carries_to(&self, to: &Limits) -> bool {
        self.limits.len() == to.limits.len()
            && self
                .limits
                .iter()
                .zip(to.limits.iter())
                .all(|(a, b)| a.carries_to(b))
    }

    /// Gives `n` back to every limit.
    pub fn refund<C: Cells + ?Sized>(&self, c: &mut C, now: u64, n: u64) {
        for (l, &off) in self.limits.iter().zip(self.offsets.iter()) {
            l.refund(&mut Sub { c: &mut *c, off }, now, n);
        }
    }

    /// Nanoseconds until every limit is idle.
    pub fn idle_in<C: Cells + ?Sized>(&self, c: &mut C, now: u64) -> u64 {
        let mut m = 0;
        for (l, &off) in self.limits.iter().zip(self.offsets.iter()) {
            m = m.max(l.idle_in(&Sub { c: &mut *c, off }, now));
        }
        m
    }
}

/// Two admitting limits' decisions as one: the tighter remainder (the first on a tie), the
/// later reset, the longer delay.
fn admitted(a: Decision, b: Decision) -> Decision {
    let mut d = if b.remaining < a.remaining { b } else { a };
    d.reset_after_ns = a.reset_after_ns.max(b.reset_after_ns);
    d.delay_ns = a.delay_ns.max(b.delay_ns);
    d
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
