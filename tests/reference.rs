//! Differential tests: every algorithm against a naive reference model written from its
//! module docs (and from the design notes), not from its code.
//!
//! | algorithm | reference model |
//! |---|---|
//! | fixed_window | `HashMap<window index, count>` |
//! | sliding_window | per-window counts, ⌊prev × (W − e) / W⌋ + cur in u128 |
//! | token_bucket | the notes' tokens + last timestamp, tokens kept exactly as an i128 over T |
//! | leaky_bucket | nginx's `excess` (`max(0, excess − elapsed/T + 1)`), scaled by T |
//! | sliding_log | a log of admission ticks (⌈now / tick⌉), plus an exact-ns safety log |
//! | window_ring | per-sub-window counts; those inside (now − W, now] whole, the straddling one by its share |
//! | concurrency | a `Vec` of (stamp = expiry, cells) leases |
//!
//! Each model and the implementation are driven by the same random sequence of operations
//! (time step, cost, check / peek / refund / charge, the last a settled cost above the checked
//! one) at non-decreasing times. At every step they must
//! agree on `allowed()`, `remaining`, the outcome and (leaky bucket) the delay; a denial's
//! `retry_after_ns` r must be exact: the same request is still denied at now + r − 1 and
//! admitted at now + r. At every step a probe also checks that an earlier `now` never admits
//! what the latest one denies.
//!
//! Parameters reach the extremes (limit 1 and each MAX_LIMIT, windows from 1 ms to a day),
//! start times the encodings' edges (the halves and wraps of the window-index ranges, the
//! sliding log's u32 rebase, 2^62 ns). `Limits` (several limits, all-or-nothing) is checked
//! against the models composed. The packed algorithms are also driven with their limit changing
//! between checks (a store given the limit per check), each model carrying its state over by
//! the algorithm's stated rule. `PROPTEST_CASES=N` runs N cases per property instead of the
//! defaults (kept small for debug builds).

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::HashMap;
use std::fmt::Debug;
use turnstile::algo::{
    concurrency, fixed_window, leaky_bucket, sliding_log, sliding_window, token_bucket, window_ring,
};
use turnstile::{Decision, Outcome};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const DAY: u64 = 86_400 * S;
/// Sequences are kept below this so that now + retry never overflows.
const TIME_CEILING: u64 = (1 << 62) + (1 << 61);
const MAX_BUCKETS: u64 = window_ring::MAX_BUCKETS;

// ------------------------------------------------------------------------------------------
// What a model answers, and the two sides of the comparison.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Answer {
    allowed: bool,
    remaining: u64,
    never_fits: bool,
    delay_ns: u64,
}

impl Answer {
    fn allow(remaining: u64) -> Self {
        Self {
            allowed: true,
            remaining,
            never_fits: false,
            delay_ns: 0,
        }
    }
    fn deny(remaining: u64, never_fits: bool) -> Self {
        Self {
            allowed: false,
            remaining,
            never_fits,
            delay_ns: 0,
        }
    }
}

trait Model: Clone + Debug {
    /// A request of `cost` at `now` (0: a peek), recorded if admitted.
    fn check(&mut self, now: u64, cost: u64) -> Answer;
    /// Gives `n` back.
    fn refund(&mut self, now: u64, n: u64);
    /// Takes `n` whatever the limit holds (a settled cost above the checked one).
    fn charge(&mut self, now: u64, n: u64);
}

trait Sut: Clone + Debug {
    fn check(&mut self, now: u64, cost: u64) -> Decision;
    fn refund(&mut self, now: u64, n: u64);
    fn charge(&mut self, now: u64, n: u64);
}

// ------------------------------------------------------------------------------------------
// The implementation, packed (one u64) or over a record of words.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Packed {
    Fw(fixed_window::Params),
    Sw(sliding_window::Params),
    Tb(token_bucket::Params),
    Lb(leaky_bucket::Params),
}

impl Packed {
    fn decide(&self, s: u64, now: u64, cost: u64) -> (u64, Decision) {
        match self {
            Packed::Fw(p) => fixed_window::decide(s, now, p, cost),
            Packed::Sw(p) => sliding_window::decide(s, now, p, cost),
            Packed::Tb(p) => token_bucket::decide(s, now, p, cost),
            Packed::Lb(p) => leaky_bucket::decide(s, now, p, cost),
        }
    }
    fn refund(&self, s: u64, now: u64, n: u64) -> u64 {
        match self {
            Packed::Fw(p) => fixed_window::refund(s, now, p, n),
            Packed::Sw(p) => sliding_window::refund(s, now, p, n),
            Packed::Tb(p) => token_bucket::refund(s, now, p, n),
            Packed::Lb(p) => leaky_bucket::refund(s, now, p, n),
        }
    }
    fn charge(&self, s: u64, now: u64, n: u64) -> u64 {
        match self {
            Packed::Fw(p) => fixed_window::charge(s, now, p, n),
            Packed::Sw(p) => sliding_window::charge(s, now, p, n),
            Packed::Tb(p) => token_bucket::charge(s, now, p, n),
            Packed::Lb(p) => leaky_bucket::charge(s, now, p, n),
        }
    }
    fn counts_denied(&self) -> bool {
        match self {
            Packed::Fw(p) => p.count_denied,
            Packed::Sw(p) => p.count_denied,
            _ => false,
        }
    }
}

#[derive(Clone, Debug)]
struct PackedSut {
    p: Packed,
    s: u64,
}

impl PackedSut {
    fn new(p: Packed) -> Self {
        Self { p, s: 0 }
    }
}

impl Sut for PackedSut {
    fn check(&mut self, now: u64, cost: u64) -> Decision {
        let (s, d) = self.p.decide(self.s, now, cost);
        assert_eq!(s >> 63, 0, "bit 63 belongs to the keyed store");
        if cost == 0 {
            assert_eq!(s, self.s, "a peek changes nothing");
        }
        if !d.allowed() && !self.p.counts_denied() {
            assert_eq!(s, self.s, "a denial records nothing");
        }
        self.s = s;
        d
    }
    fn refund(&mut self, now: u64, n: u64) {
        self.s = self.p.refund(self.s, now, n);
        assert_eq!(self.s >> 63, 0);
    }
    fn charge(&mut self, now: u64, n: u64) {
        self.s = self.p.charge(self.s, now, n);
        assert_eq!(self.s >> 63, 0);
    }
}

#[derive(Clone, Copy, Debug)]
enum Var {
    Log(sliding_log::Params),
    Ring(window_ring::Params),
}

#[derive(Clone)]
struct CellsSut {
    p: Var,
    rec: Vec<u64>,
}

impl Debug for CellsSut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CellsSut({:?}, {} words)", self.p, self.rec.len())
    }
}

impl CellsSut {
    fn new(p: Var) -> Self {
        let words = match p {
            Var::Log(p) => p.words(),
            Var::Ring(p) => p.words(),
        };
        Self {
            p,
            rec: vec![0; words],
        }
    }
    fn decide(&mut self, now: u64, cost: u64, apply: bool) -> Decision {
        match self.p {
            Var::Log(p) => sliding_log::decide(&mut self.rec[..], now, &p, cost, apply),
            Var::Ring(p) => window_ring::decide(&mut self.rec[..], now, &p, cost, apply),
        }
    }
}

impl Sut for CellsSut {
    fn check(&mut self, now: u64, cost: u64) -> Decision {
        let before = self.rec.clone();
        let dry = self.decide(now, cost, false);
        assert!(self.rec == before, "apply = false must not write");
        let d = self.decide(now, cost, true);
        assert_eq!(
            dry.allowed(),
            d.allowed(),
            "evaluating and applying disagree"
        );
        if cost == 0 {
            assert!(self.rec == before, "a peek changes nothing");
        }
        d
    }
    fn refund(&mut self, now: u64, n: u64) {
        match self.p {
            Var::Log(p) => sliding_log::refund(&mut self.rec[..], &p, n),
            Var::Ring(p) => window_ring::refund(&mut self.rec[..], now, &p, n),
        }
    }
    fn charge(&mut self, now: u64, n: u64) {
        match self.p {
            Var::Log(p) => sliding_log::charge(&mut self.rec[..], now, &p, n),
            Var::Ring(p) => window_ring::charge(&mut self.rec[..], now, &p, n),
        }
    }
}

// ------------------------------------------------------------------------------------------
// Reference models.
// ------------------------------------------------------------------------------------------

/// fixed_window: a count per window index (the full index, no modulus).
#[derive(Clone, Debug)]
struct FixedWindowModel {
    limit: u64,
    window: u64,
    count_denied: bool,
    counts: HashMap<u64, u64>,
}

/// Documented: with `count_denied` the 24-bit counter saturates at 2^24 − 1.
const FW_SATURATE: u64 = (1 << 24) - 1;

impl Model for FixedWindowModel {
    fn check(&mut self, now: u64, cost: u64) -> Answer {
        let w = now / self.window;
        let c = self.counts.get(&w).copied().unwrap_or(0);
        if cost == 0 {
            return Answer::allow(self.limit.saturating_sub(c));
        }
        if c + cost <= self.limit {
            self.counts.insert(w, c + cost);
            return Answer::allow(self.limit - c - cost);
        }
        // Documented: a cost above the limit (NeverFits) is never counted.
        let c = if self.count_denied && cost <= self.limit {
            let n = (c + cost).min(FW_SATURATE);
            self.counts.insert(w, n);
            n
        } else {
            c
        };
        Answer::deny(self.limit.saturating_sub(c), cost > self.limit)
    }
    fn refund(&mut self, now: u64, n: u64) {
        let c = self.counts.entry(now / self.window).or_insert(0);
        *c -= n.min(*c);
    }
    /// Documented: the count passes the limit, saturating at 2^24 − 1.
    fn charge(&mut self, now: u64, n: u64) {
        let c = self.counts.entry(now / self.window).or_insert(0);
        *c = c.saturating_add(n).min(FW_SATURATE);
    }
}

/// sliding_window: counts per window; estimate ⌊prev × (W − e) / W⌋ + cur, exactly.
#[derive(Clone, Debug)]
struct SlidingWindowModel {
    limit: u64,
    window: u64,
    count_denied: bool,
    counts: HashMap<u64, u64>,
}

/// Documented: with `count_denied` the 20-bit counters saturate at 2^20 − 1.
const SW_SATURATE: u64 = (1 << 20) - 1;

impl SlidingWindowModel {
    fn estimate(&self, now: u64) -> (u64, u64) {
        let i = now / self.window;
        let e = now - i * self.window;
        let prev = if i == 0 {
            0
        } else {
            self.counts.get(&(i - 1)).copied().unwrap_or(0)
        };
        let weighted = (prev as u128 * (self.window - e) as u128 / self.window as u128) as u64;
        (i, weighted + self.counts.get(&i).copied().unwrap_or(0))
    }
}

impl Model for SlidingWindowModel {
    fn check(&mut self, now: u64, cost: u64) -> Answer {
        let (i, est) = self.estimate(now);
        if cost == 0 {
            return Answer::allow(self.limit.saturating_sub(est));
        }
        if est + cost <= self.limit {
            *self.counts.entry(i).or_insert(0) += cost;
            return Answer::allow(self.limit - est - cost);
        }
        // Documented: a cost above the limit (NeverFits) is never counted.
        if self.count_denied && cost <= self.limit {
            let c = self.counts.entry(i).or_insert(0);
            *c = (*c + cost).min(SW_SATURATE);
        }
        let (_, est) = self.estimate(now);
        Answer::deny(self.limit.saturating_sub(est), cost > self.limit)
    }
    fn refund(&mut self, now: u64, n: u64) {
        let c = self.counts.entry(now / self.window).or_insert(0);
        *c -= n.min(*c);
    }
    /// Documented: the current count passes the limit, saturating at 2^20 − 1.
    fn charge(&mut self, now: u64, n: u64) {
        let c = self.counts.entry(now / self.window).or_insert(0);
        *c = c.saturating_add(n).min(SW_SATURATE);
    }
}

/// token_bucket in the notes' form: tokens and the last timestamp, refilled continuously at one
/// token per T = ⌈period / rate⌉ ns, capped at the capacity. Tokens are exact: `tokens` is
/// tokens × T (so one nanosecond refills 1/T of a token, exactly). Below zero only after the
/// limit changed to a smaller bucket ([`Relimit`]): the key then owes what the old one lent.
#[derive(Clone, Debug)]
struct TokenBucketModel {
    capacity: u64,
    interval: u64,
    tokens: i128,
    last: u64,
}

impl TokenBucketModel {
    fn new(capacity: u64, rate: u64, period: u64, start: u64) -> Self {
        let interval = period.div_ceil(rate);
        // Starts full.
        Self {
            capacity,
            interval,
            tokens: capacity as i128 * interval as i128,
            last: start,
        }
    }
    fn full(&self) -> i128 {
        self.capacity as i128 * self.interval as i128
    }
    fn refill(&mut self, now: u64) {
        if now > self.last {
            self.tokens = (self.tokens + (now - self.last) as i128).min(self.full());
            self.last = now;
        }
    }
    fn whole(&self) -> u64 {
        (self.tokens.max(0) / self.interval as i128) as u64
    }
}

impl Model for TokenBucketModel {
    fn check(&mut self, now: u64, cost: u64) -> Answer {
        self.refill(now);
        if cost == 0 {
            return Answer::allow(self.whole());
        }
        if cost > self.capacity {
            return Answer::deny(self.whole(), true);
        }
        let need = cost as i128 * self.interval as i128;
        if self.tokens >= need {
            self.tokens -= need;
            return Answer::allow(self.whole());
        }
        Answer::deny(self.whole(), false)
    }
    fn refund(&mut self, now: u64, n: u64) {
        self.refill(now);
        self.tokens = (self.tokens + n as i128 * self.interval as i128).min(self.full());
    }
    /// Below empty: the bucket owes the tokens.
    fn charge(&mut self, now: u64, n: u64) {
        self.refill(now);
        self.tokens -= n as i128 * self.interval as i128;
    }
}

/// leaky_bucket as nginx `limit_req` computes it, in integer ns (excess scaled by T):
/// `excess := max(0, excess − elapsed/T + 1)` (+ n − 1 more for a request of cost n), reject
/// if `excess > burst` (nothing recorded), else delay by `(excess − delay) / rate`.
#[derive(Clone, Debug)]
struct LeakyBucketModel {
    interval: i128,
    burst: i128,
    /// Excess requests admitted undelayed (nginx `delay`; = burst for `nodelay`).
    delay: i128,
    /// nginx's node: (excess × T, last). None: no node yet.
    node: Option<(i128, u64)>,
}

impl LeakyBucketModel {
    fn new(rate: u64, period: u64, burst: u64, delay: Option<u64>) -> Self {
        let interval = period.div_ceil(rate) as i128;
        Self {
            interval,
            burst: burst as i128,
            delay: delay.unwrap_or(burst) as i128,
            node: None,
        }
    }
    /// Requests held × T at `now`, before any arrival.
    fn queue(&self, now: u64) -> i128 {
        match self.node {
            None => 0,
            Some((excess, last)) => (excess - (now - last) as i128 + self.interval).max(0),
        }
    }
    fn remaining(&self, queue: i128) -> u64 {
        // Below zero only after the limit changed to a smaller queue ([`Relimit`]).
        (((self.burst + 1) * self.interval - queue) / self.interval).max(0) as u64
    }
}

impl Model for LeakyBucketModel {
    fn check(&mut self, now: u64, cost: u64) -> Answer {
        let t = self.interval;
        if cost == 0 {
            return Answer::allow(self.remaining(self.queue(now)));
        }
        let excess = match self.node {
            None => 0,
            Some((excess, last)) => (excess - (now - last) as i128 + t).max(0),
        } + (cost as i128 - 1) * t;
        if excess > self.burst * t {
            return Answer::deny(
                self.remaining(self.queue(now)),
                cost as i128 > self.burst + 1,
            );
        }
        self.node = Some((excess, now));
        let mut a = Answer::allow(((self.burst * t - excess) / t) as u64);
        a.delay_ns = (excess - self.delay * t).max(0) as u64;
        a
    }
    fn refund(&mut self, now: u64, n: u64) {
        if self.node.is_some() {
            let q = (self.queue(now) - n as i128 * self.interval).max(0);
            self.node = Some((q - self.interval, now));
        }
    }
    /// Past the burst: the queue holds them until they drain.
    fn charge(&mut self, now: u64, n: u64) {
        let q = self.queue(now) + n as i128 * self.interval;
        self.node = Some((q - self.interval, now));
    }
}

/// A log of admission times, run-length encoded: (time, how many), oldest first.
#[derive(Clone, Debug, Default)]
struct Log(Vec<(u64, u64)>);

impl Log {
    fn push(&mut self, t: u64, n: u64) {
        match self.0.last_mut() {
            Some(last) if last.0 == t => last.1 += n,
            _ => self.0.push((t, n)),
        }
    }
    /// Entries with `live(t)`.
    fn count(&self, live: impl Fn(u64) -> bool) -> u64 {
        self.0.iter().filter(|e| live(e.0)).map(|e| e.1).sum()
    }
    /// Keeps the `n` newest entries.
    fn keep_newest(&mut self, n: u64) {
        let mut left = n;
        let mut keep = Vec::new();
        for &(t, c) in self.0.iter().rev() {
            if left == 0 {
                break;
            }
            let k = c.min(left);
            keep.push((t, k));
            left -= k;
        }
        keep.reverse();
        self.0 = keep;
    }
    /// Drops the `n` newest.
    fn pop(&mut self, mut n: u64) {
        while n > 0 {
            let Some(last) = self.0.last_mut() else {
                return;
            };
            let take = n.min(last.1);
            last.1 -= take;
            n -= take;
            if last.1 == 0 {
                self.0.pop();
            }
        }
    }
}

/// sliding_log: a log of admission times, in ticks: an admission at `now` is recorded at
/// ⌈now / tick⌉ and is live while tick × that + W > now.
#[derive(Clone, Debug)]
struct SlidingLogModel {
    limit: u64,
    window: u64,
    tick: u64,
    count_denied: bool,
    log: Log,
}

impl SlidingLogModel {
    fn new(limit: u64, window: u64, count_denied: bool) -> Self {
        // Documented: the smallest tick with W ≤ 2^30 ticks.
        let tick = window.div_ceil(1 << 30).max(1);
        Self {
            limit,
            window,
            tick,
            count_denied,
            log: Log::default(),
        }
    }
    fn live(&self, now: u64) -> u64 {
        let (tick, window) = (self.tick as u128, self.window as u128);
        self.log.count(|t| t as u128 * tick + window > now as u128)
    }
    fn record(&mut self, now: u64, cost: u64) {
        self.log.push(now.div_ceil(self.tick), cost);
    }
}

impl Model for SlidingLogModel {
    fn check(&mut self, now: u64, cost: u64) -> Answer {
        let live = self.live(now);
        if cost == 0 {
            return Answer::allow(self.limit.saturating_sub(live));
        }
        if cost > self.limit {
            return Answer::deny(self.limit.saturating_sub(live), true);
        }
        if live + cost <= self.limit {
            self.record(now, cost);
            return Answer::allow(self.limit - live - cost);
        }
        if self.count_denied {
            self.record(now, cost);
        }
        Answer::deny(self.limit.saturating_sub(self.live(now)), false)
    }
    fn refund(&mut self, _now: u64, n: u64) {
        self.log.pop(n);
    }
    /// Documented: the log holds the newest `limit` entries, a charge past it fills the log.
    fn charge(&mut self, now: u64, n: u64) {
        self.record(now, n);
        self.log.keep_newest(self.limit);
    }
}

/// The implementation of sliding_log, watched by an exact-nanosecond log of what it recorded:
/// it must never admit a request that an exact log (same history) would deny.
#[derive(Clone, Debug)]
struct ExactWatch {
    inner: CellsSut,
    limit: u64,
    window: u64,
    count_denied: bool,
    exact: Log,
    /// The latest time seen: the exact log only judges checks in time order.
    latest: u64,
}

impl ExactWatch {
    fn new(p: sliding_log::Params) -> Self {
        let inner = CellsSut::new(Var::Log(p));
        Self {
            inner,
            limit: p.limit,
            window: p.window,
            count_denied: p.count_denied,
            exact: Log::default(),
            latest: 0,
        }
    }
}

impl Sut for ExactWatch {
    fn check(&mut self, now: u64, cost: u64) -> Decision {
        let d = self.inner.check(now, cost);
        let window = self.window as u128;
        let live = self.exact.count(|t| t as u128 + window > now as u128);
        if d.allowed() && cost > 0 && now >= self.latest {
            assert!(
                live + cost <= self.limit,
                "sliding_log admitted {cost} at {now} with {live} exact-ns admissions in the last window (limit {})",
                self.limit
            );
        }
        if cost > 0 && cost <= self.limit && (d.allowed() || self.count_denied) {
            self.exact.push(now, cost);
        }
        self.latest = self.latest.max(now);
        d
    }
    fn refund(&mut self, now: u64, n: u64) {
        self.inner.refund(now, n);
        self.exact.pop(n);
    }
    fn charge(&mut self, now: u64, n: u64) {
        self.inner.charge(now, n);
        self.exact.push(now, n);
        self.exact.keep_newest(self.limit);
    }
}

/// window_ring: requests bucketed per sub-window (sub-window j spans [j·s, (j + 1)·s)). The
/// window (now − W, now] counts every sub-window that starts inside it whole, and the one that
/// straddles its start by the share of its span inside, rounded to the nearest integer
/// (halves up). Naively: every bucket is looked at, by its span, at every check.
#[derive(Clone, Debug)]
struct WindowRingModel {
    limit: u64,
    sub: u64,
    buckets: u64,
    count_denied: bool,
    counts: HashMap<u64, u64>,
}

impl WindowRingModel {
    /// Whether sub-window j still counts at `now`, wholly or in part.
    fn inside(&self, j: u64, now: u64) -> bool {
        let (s, w) = (self.sub as u128, (self.sub * self.buckets) as u128);
        let (lo, hi) = (j as u128 * s, (j as u128 + 1) * s);
        lo <= now as u128 && hi + w > now as u128
    }
    fn count(&self, now: u64) -> u64 {
        let (s, w, now) = (
            self.sub as u128,
            (self.sub * self.buckets) as u128,
            now as u128,
        );
        let (mut whole, mut part) = (0u128, 0u128);
        for (&j, &c) in &self.counts {
            let (lo, hi) = (j as u128 * s, (j as u128 + 1) * s);
            if lo > now {
                continue;
            }
            if lo + w > now {
                // Starts after now − W: wholly inside.
                whole += c as u128;
            } else if hi + w > now {
                // Straddles now − W: (hi − (now − W)) of its s ns are inside. One sub-window
                // at most.
                part += c as u128 * (hi + w - now);
            }
        }
        // part / s rounded to nearest, halves up.
        (whole + (2 * part + s) / (2 * s)) as u64
    }
    /// A sub-window counter holds 2^w − 1 at most. Without `count_denied` w is the bit length
    /// of the limit (never reached). With it, w is the bit length of ⌈(2·limit − 1)·s / 2⌉
    /// (any count that large denies whatever its share: exact), but at most the largest w with
    /// N · (2^w − 1) < 2^26 (the running total), and at least the limit's bit length.
    fn counter_max(&self) -> u64 {
        let bits = |x: u128| 128 - x.leading_zeros();
        let mut w = bits(self.limit as u128);
        if self.count_denied {
            let exact = bits(((2 * self.limit as u128 - 1) * self.sub as u128).div_ceil(2));
            let mut fit = 0;
            while self.buckets as u128 * ((1u128 << (fit + 1)) - 1) < 1 << 26 {
                fit += 1;
            }
            w = w.max(exact.min(fit));
        }
        (1 << w) - 1
    }
}

impl Model for WindowRingModel {
    fn check(&mut self, now: u64, cost: u64) -> Answer {
        let b = now / self.sub;
        let total = self.count(now);
        if cost == 0 {
            return Answer::allow(self.limit.saturating_sub(total));
        }
        if total + cost <= self.limit {
            *self.counts.entry(b).or_insert(0) += cost;
            return Answer::allow(self.limit - total - cost);
        }
        if self.count_denied && cost <= self.limit {
            let max = self.counter_max();
            let c = self.counts.entry(b).or_insert(0);
            *c = (*c + cost).min(max);
        }
        Answer::deny(
            self.limit.saturating_sub(self.count(now)),
            cost > self.limit,
        )
    }
    /// Newest sub-windows first, the straddling one last.
    fn refund(&mut self, now: u64, n: u64) {
        let mut live: Vec<u64> = self
            .counts
            .keys()
            .copied()
            .filter(|&j| self.inside(j, now))
            .collect();
        live.sort_unstable_by(|a, b| b.cmp(a));
        let mut left = n;
        for j in live {
            let c = self.counts.get_mut(&j).unwrap();
            let take = left.min(*c);
            *c -= take;
            left -= take;
        }
    }
    /// Documented: the current sub-window's counter passes the limit, saturating at its
    /// width.
    fn charge(&mut self, now: u64, n: u64) {
        let max = self.counter_max();
        let c = self.counts.entry(now / self.sub).or_insert(0);
        *c = c.saturating_add(n).min(max);
    }
}

// ------------------------------------------------------------------------------------------
// Random operations and the driver.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct RawOp {
    step: u8,
    step_raw: u64,
    cost: u8,
    cost_raw: u64,
    act: u8,
    back_raw: u64,
    /// A fixed time step instead of the random one.
    jump: Option<u64>,
}

fn raw_op() -> impl Strategy<Value = RawOp> {
    (
        any::<u8>(),
        any::<u64>(),
        any::<u8>(),
        any::<u64>(),
        any::<u8>(),
        any::<u64>(),
    )
        .prop_map(|(step, step_raw, cost, cost_raw, act, back_raw)| RawOp {
            step,
            step_raw,
            cost,
            cost_raw,
            act,
            back_raw,
            jump: None,
        })
}

fn raw_ops(max: usize) -> impl Strategy<Value = Vec<RawOp>> {
    prop::collection::vec(raw_op(), 1..max)
}

/// A time step: 0, 1 ns, a fraction of a unit, whole units ± 1 ns, to the next unit boundary
/// ± 1 ns, or up to three units. `units` are the algorithm's natural periods (window, T, ...).
fn step(kind: u8, raw: u64, now: u64, units: &[u64]) -> u64 {
    // Capped so that a sequence stays far below 2^63 ns.
    let unit = units[(raw % units.len() as u64) as usize].clamp(1, 1 << 52);
    let r = raw >> 8;
    let jitter = |x: u64| (x + (r >> 2) % 3).saturating_sub(1);
    match kind % 10 {
        0..=2 => 0,
        3 => 1,
        4 => r % (unit / 8 + 1),
        5 => r % (unit + 1),
        6 => jitter((1 + r % 3) * unit),
        7 | 8 => jitter(unit - now % unit),
        _ => r % (3 * unit + 1),
    }
}

/// A cost: mostly 1, else small, anything that fits, exactly the capacity, or more.
fn cost_of(kind: u8, raw: u64, cap: u64) -> u64 {
    match kind % 16 {
        0..=8 => 1,
        9 | 10 => 1 + raw % cap.min(8),
        11 | 12 => 1 + raw % cap,
        13 => cap,
        14 => cap / 2 + 1,
        _ => cap + 1 + raw % 2,
    }
}

/// A start time: small, around 2^62, or shortly before one of `boundaries` (encoding wraps).
fn start_time(kind: u8, raw: u64, boundaries: &[u128], span: u64) -> u64 {
    let near: Vec<u64> = boundaries
        .iter()
        .filter(|&&b| b < 1 << 62 && b > span as u128)
        .map(|&b| b as u64)
        .collect();
    match kind % 3 {
        0 => raw % (1 << 40),
        1 => (1 << 62) + raw % (1 << 40),
        _ if near.is_empty() => raw % (1 << 40),
        _ => near[(raw % near.len() as u64) as usize] - (raw >> 8) % span.max(1),
    }
}

/// For a TAT: small, or large but with room for now + 2τ (τ ≤ 2^61) below 2^63, the
/// documented span ("a clock younger than 219 years").
fn bucket_start(kind: u8, raw: u64) -> u64 {
    match kind % 2 {
        0 => raw % (1 << 40),
        _ => (1 << 62) - (1 << 60) + raw % (1 << 40),
    }
}

#[derive(Clone, Debug)]
struct Plan {
    start: u64,
    /// Natural periods for time steps.
    units: Vec<u64>,
    /// Capacity, to scale costs.
    cap: u64,
    /// How far back a probe may go (the encodings' "behind" range).
    back_max: u64,
    /// Whether to refund (and charge).
    refunds: bool,
    /// The largest charge: a debt that the clock can hold (2^60 ns of the plan's longest
    /// period; a bucket's TAT past 2^63 ns is capped, and the key is then NeverFits, as
    /// `token_bucket::charge` says).
    charge_max: u64,
    max_ops: usize,
}

fn plan(start: u64, units: Vec<u64>, cap: u64, back_max: u64) -> Plan {
    // Records with huge limits are slow to fill in debug mode: shorter sequences.
    let max_ops = if cap > 50_000 { 8 } else { usize::MAX };
    let longest = units.iter().copied().max().unwrap_or(1).max(1);
    let charge_max = ((1u64 << 60) / longest).clamp(1, cap.saturating_add(2));
    Plan {
        start,
        units,
        cap,
        back_max,
        refunds: true,
        charge_max,
        max_ops,
    }
}

fn compare(d: &Decision, m: &Answer, cost: u64, ctx: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        d.allowed(),
        m.allowed,
        "allowed() differs: {}; sut {:?}",
        ctx,
        d
    );
    prop_assert_eq!(
        d.remaining,
        m.remaining,
        "remaining differs: {}; sut {:?} model {:?}",
        ctx,
        d,
        m
    );
    prop_assert_eq!(
        d.delay_ns,
        m.delay_ns,
        "delay differs: {}; sut {:?} model {:?}",
        ctx,
        d,
        m
    );
    if d.allowed() {
        prop_assert_eq!(d.outcome, Outcome::Allowed, "{}", ctx);
        prop_assert_eq!(d.retry_after_ns, None, "{}", ctx);
    } else {
        let want = if m.never_fits {
            Outcome::NeverFits
        } else {
            Outcome::Limited
        };
        prop_assert_eq!(d.outcome, want, "outcome: {}; sut {:?}", ctx, d);
        prop_assert_eq!(d.retry_after_ns.is_none(), m.never_fits, "{}", ctx);
    }
    if cost == 0 {
        prop_assert!(d.allowed(), "a peek is always answered allowed: {}", ctx);
    }
    Ok(())
}

/// A denial's retry r: the same request is still denied at now + r − 1 and admitted at now + r
/// (nothing else happening), on the model and on the implementation.
fn check_retry<S: Sut, M: Model>(
    sut: &S,
    model: &M,
    now: u64,
    cost: u64,
    r: u64,
    ctx: &str,
) -> Result<(), TestCaseError> {
    prop_assert!(r >= 1, "retry 0 on a denial: {}", ctx);
    let at = now + r;
    prop_assert!(
        !model.clone().check(at - 1, cost).allowed,
        "model admits at now + retry - 1 (retry {}): {}",
        r,
        ctx
    );
    prop_assert!(
        !sut.clone().check(at - 1, cost).allowed(),
        "sut admits at now + retry - 1 (retry {}): {}",
        r,
        ctx
    );
    prop_assert!(
        model.clone().check(at, cost).allowed,
        "model still denies at now + retry (retry {}): {}",
        r,
        ctx
    );
    prop_assert!(
        sut.clone().check(at, cost).allowed(),
        "sut still denies at now + retry (retry {}): {}",
        r,
        ctx
    );
    Ok(())
}

/// An earlier `now` never admits what the latest one denies, and never shows more remaining.
fn probe_backwards<S: Sut>(
    sut: &S,
    now: u64,
    cost: u64,
    raw: u64,
    back_max: u64,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let span = back_max.min(now);
    if span == 0 {
        return Ok(());
    }
    let then = now - (1 + raw % span);
    let late = sut.clone().check(now, cost);
    let early = sut.clone().check(then, cost);
    if !late.allowed() {
        prop_assert!(
            !early.allowed(),
            "admitted at an earlier now {} what {} denies: {}",
            then,
            now,
            ctx
        );
    }
    let late = sut.clone().check(now, 0).remaining;
    let early = sut.clone().check(then, 0).remaining;
    prop_assert!(
        early <= late,
        "more remaining at an earlier now {} ({} > {}): {}",
        then,
        early,
        late,
        ctx
    );
    Ok(())
}

fn drive<S: Sut, M: Model>(
    sut: S,
    model: M,
    plan: &Plan,
    ops: &[RawOp],
) -> Result<(), TestCaseError> {
    drive_with(sut, model, plan, ops, |_, _, _, _| {})
}

/// [`drive`], with `between(sut, model, now, op)` run before each operation (at its time).
fn drive_with<S: Sut, M: Model>(
    mut sut: S,
    mut model: M,
    plan: &Plan,
    ops: &[RawOp],
    mut between: impl FnMut(&mut S, &mut M, u64, &RawOp),
) -> Result<(), TestCaseError> {
    let mut now = plan.start;
    for (i, op) in ops.iter().take(plan.max_ops).enumerate() {
        now += op
            .jump
            .unwrap_or_else(|| step(op.step, op.step_raw, now, &plan.units));
        prop_assert!(now < TIME_CEILING);
        between(&mut sut, &mut model, now, op);
        let cost = cost_of(op.cost, op.cost_raw, plan.cap);
        let refund = plan.refunds && op.act % 16 >= 14;
        // Half of them charges instead: a settled cost above the checked one.
        let charge = refund && op.cost_raw >> 63 == 1;
        let c = if op.act % 16 >= 12 && !refund {
            0
        } else {
            cost
        };
        let ctx = format!(
            "op {i}: now {now}, cost {c}{}",
            match (refund, charge) {
                (_, true) => " (charge)",
                (true, _) => " (refund)",
                _ => "",
            }
        );
        if charge {
            sut.charge(now, cost.min(plan.charge_max));
            model.charge(now, cost.min(plan.charge_max));
            continue;
        }
        if refund {
            sut.refund(now, cost);
            model.refund(now, cost);
            continue;
        }
        probe_backwards(&sut, now, cost, op.back_raw, plan.back_max, &ctx)?;
        let d = sut.check(now, c);
        let m = model.check(now, c);
        compare(&d, &m, c, &ctx)?;
        if let Some(r) = d.retry_after_ns {
            check_retry(&sut, &model, now, c, r, &ctx)?;
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Parameters.
// ------------------------------------------------------------------------------------------

/// `cases` per property (`PROPTEST_CASES` overrides it for a long run), no regression files
/// (a failure prints its minimal input).
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    }
}

// ------------------------------------------------------------------------------------------
// Strategies.
// ------------------------------------------------------------------------------------------

fn window() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(MS),
        Just(7 * MS + 3),
        Just(S),
        Just(60 * S),
        Just(3600 * S),
        Just(DAY),
        MS..=DAY,
    ]
}

fn limit(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![3 => Just(1u64), 6 => 2u64..=12, 2 => 13u64..=1000, 1 => Just(max)]
}

fn start_raw() -> impl Strategy<Value = (u8, u64)> {
    (any::<u8>(), any::<u64>())
}

fn boundaries(unit: u64, period_bits: u32) -> Vec<u128> {
    (1..=3u128)
        .map(|k| k * (1u128 << (period_bits - 1)) * unit as u128)
        .collect()
}

// ------------------------------------------------------------------------------------------
// The properties.
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn fixed_window_matches_reference(
        limit in limit(fixed_window::MAX_LIMIT), window in window(), count_denied in any::<bool>(),
        (sk, sr) in start_raw(), ops in raw_ops(40),
    ) {
        let p = fixed_window::Params::new(limit, window, count_denied).unwrap();
        // The index is kept mod 2^39; ahead by at most AHEAD windows is time going backwards.
        let start = start_time(sk, sr, &boundaries(window, fixed_window::INDEX_BITS), 4 * window);
        let back = (fixed_window::AHEAD - 1).saturating_mul(window);
        let model = FixedWindowModel { limit, window, count_denied, counts: HashMap::new() };
        drive(PackedSut::new(Packed::Fw(p)), model, &plan(start, vec![window], limit, back), &ops)?;
    }

    #[test]
    fn sliding_window_matches_reference(
        limit in limit(sliding_window::MAX_LIMIT), window in window(),
        count_denied in any::<bool>(),
        (sk, sr) in start_raw(), ops in raw_ops(40),
    ) {
        let p = sliding_window::Params::new(limit, window, count_denied).unwrap();
        let start = start_time(sk, sr, &boundaries(window, sliding_window::INDEX_BITS), 4 * window);
        let back = (sliding_window::AHEAD - 1).saturating_mul(window);
        let model = SlidingWindowModel { limit, window, count_denied, counts: HashMap::new() };
        drive(PackedSut::new(Packed::Sw(p)), model, &plan(start, vec![window], limit, back), &ops)?;
    }

    /// GCRA (one TAT) is the notes' tokens-and-timestamp bucket, exactly.
    #[test]
    fn token_bucket_is_tokens_and_timestamp(
        rate in prop_oneof![Just(1u64), Just(15), Just(250), 1u64..=1000], period in window(),
        cap_kind in 0u8..4, cap_raw in any::<u64>(), (sk, sr) in start_raw(), ops in raw_ops(40),
    ) {
        let interval = period.div_ceil(rate);
        let max_cap = token_bucket::MAX_TAU / interval;
        let capacity = match cap_kind {
            0 => 1,
            1 => 1 + cap_raw % 20,
            2 => 1 + cap_raw % max_cap,
            _ => max_cap,
        };
        let p = token_bucket::Params::new(capacity, rate, period).unwrap();
        let start = bucket_start(sk, sr);
        let model = TokenBucketModel::new(capacity, rate, period, start);
        let units = vec![interval, capacity * interval, period];
        drive(PackedSut::new(Packed::Tb(p)), model, &plan(start, units, capacity, u64::MAX), &ops)?;
    }

    #[test]
    fn leaky_bucket_is_nginx_excess(
        rate in prop_oneof![Just(1u64), Just(10), 1u64..=1000], period in window(),
        burst_kind in 0u8..4, burst_raw in any::<u64>(),
        delay_raw in prop::option::of(any::<u64>()), (sk, sr) in start_raw(), ops in raw_ops(40),
    ) {
        let interval = period.div_ceil(rate);
        let max_burst = token_bucket::MAX_TAU / interval - 1;
        let burst = match burst_kind {
            0 => 0,
            1 => burst_raw % 20,
            2 => burst_raw % max_burst,
            _ => max_burst,
        };
        // nginx `delay=N` (a shaper) or `nodelay` (a meter).
        let delay = delay_raw.map(|d| d % (burst + 1));
        let mode = match delay {
            None => leaky_bucket::Mode::Meter,
            Some(delay) => leaky_bucket::Mode::Shaper { delay },
        };
        let p = leaky_bucket::Params::new(rate, period, burst, mode).unwrap();
        let start = bucket_start(sk, sr);
        let model = LeakyBucketModel::new(rate, period, burst, delay);
        let units = vec![interval, (burst + 1) * interval, period];
        let plan = plan(start, units, burst + 1, u64::MAX);
        drive(PackedSut::new(Packed::Lb(p)), model, &plan, &ops)?;
    }

    #[test]
    fn sliding_log_matches_quantized_log(
        limit in limit(sliding_log::MAX_LIMIT), window in window(), count_denied in any::<bool>(),
        (sk, sr) in start_raw(), ops in raw_ops(40),
    ) {
        let p = sliding_log::Params::new(limit, window, count_denied).unwrap();
        let model = SlidingLogModel::new(limit, window, count_denied);
        prop_assert_eq!(p.tick, model.tick);
        let start = start_time(sk, sr, &[], 0);
        let sut = ExactWatch::new(p);
        let mut plan = plan(start, vec![window, model.tick, window + model.tick], limit, u64::MAX);
        // With count_denied the ring keeps the newest L entries only, denied ones included: a
        // refund then drops the newest and cannot bring back what they pushed out.
        plan.refunds = !count_denied;
        drive(sut, model, &plan, &ops)?;
    }

    /// Windows longer than 2^30 ns (tick > 1): equal to the tick-quantized model, and never
    /// more permissive than an exact-nanosecond log of the same admissions.
    #[test]
    fn sliding_log_with_ticks_never_admits_more_than_exact(
        limit in prop_oneof![Just(1u64), 2u64..=12], window in (1u64 << 30) + 1..=DAY,
        (sk, sr) in start_raw(), ops in raw_ops(60),
    ) {
        let p = sliding_log::Params::new(limit, window, false).unwrap();
        prop_assert!(p.tick > 1);
        let model = SlidingLogModel::new(limit, window, false);
        let start = start_time(sk, sr, &[], 0);
        let plan = plan(start, vec![window, p.tick, 3, window - 1], limit, u64::MAX);
        drive(ExactWatch::new(p), model, &plan, &ops)?;
    }

    /// Entries are u32 tick offsets from a base, rebased when an offset would pass 2^32 − 2:
    /// admissions, then a jump to just before the rebase point, then more across it.
    #[test]
    fn sliding_log_across_the_rebase(
        limit in prop_oneof![Just(1u64), 2u64..=12, Just(300u64)], window in window(),
        (sk, sr) in start_raw(), before in raw_ops(6), after in raw_ops(30), short in any::<u64>(),
    ) {
        let p = sliding_log::Params::new(limit, window, false).unwrap();
        let model = SlidingLogModel::new(limit, window, false);
        let start = start_time(sk, sr, &[], 0);
        let mut ops = before;
        // The first op admits 1 (a fresh log): the base is its tick. Then land within 2
        // windows of base + 2^32 ticks.
        (ops[0].act, ops[0].cost) = (0, 0);
        let span = (1u64 << 32) * p.tick;
        let mut jump = ops[0].clone();
        jump.jump = Some(span - short % (2 * window).min(span));
        ops.insert(1, jump);
        ops.extend(after);
        let sut = ExactWatch::new(p);
        drive(sut, model, &plan(start, vec![window, p.tick], limit, u64::MAX), &ops)?;
    }

    #[test]
    fn window_ring_matches_bucket_counts(
        limit in limit(window_ring::MAX_LIMIT), window in window(),
        buckets in prop_oneof![Just(1u64), Just(2), Just(60), Just(MAX_BUCKETS), 1..=MAX_BUCKETS],
        count_denied in any::<bool>(), (sk, sr) in start_raw(), ops in raw_ops(40),
    ) {
        let sub = (window / buckets).max(1);
        let window = sub * buckets;
        let p = window_ring::Params::new(limit, window, buckets, count_denied).unwrap();
        let start = start_time(sk, sr, &boundaries(sub, window_ring::INDEX_BITS), 4 * window);
        let back = (window_ring::AHEAD - 1).saturating_mul(sub);
        let model = WindowRingModel { limit, sub, buckets, count_denied, counts: HashMap::new() };
        let plan = plan(start, vec![sub, window], limit, back);
        drive(CellsSut::new(Var::Ring(p)), model, &plan, &ops)?;
    }
}

// ------------------------------------------------------------------------------------------
// concurrency: acquire / release instead of check / refund.
// ------------------------------------------------------------------------------------------

/// Leases as a list: (stamp, cells). A lease expires at its stamp; a new stamp is now + TTL, or
/// if a live lease holds it, the value the documented search over `limit + 1` candidates from
/// it up finds
/// (`algo::concurrency`: stamps are unique, even when now + TTL saturates).
#[derive(Clone, Debug)]
struct ConcurrencyModel {
    limit: u64,
    ttl: u64,
    leases: Vec<(u64, u64)>,
}

impl ConcurrencyModel {
    fn live(&self, now: u64) -> u64 {
        self.leases.iter().filter(|l| l.0 > now).map(|l| l.1).sum()
    }
    /// (answer, stamp if granted, exact retry if limited).
    fn acquire(&mut self, now: u64, cost: u64) -> (Answer, Option<u64>, Option<u64>) {
        let live = self.live(now);
        if cost == 0 {
            return (Answer::allow(self.limit - live), None, None);
        }
        if cost > self.limit {
            return (Answer::deny(self.limit - live, true), None, None);
        }
        if live + cost > self.limit {
            let mut expiries: Vec<(u64, u64)> =
                self.leases.iter().copied().filter(|l| l.0 > now).collect();
            expiries.sort();
            let need = live + cost - self.limit;
            let mut freed = 0;
            let at = expiries.iter().find(|l| {
                freed += l.1;
                freed >= need
            });
            return (
                Answer::deny(self.limit - live, false),
                None,
                Some(at.expect("enough leases expire").0 - now),
            );
        }
        // Cells of live leases whose stamp is in lo..=hi.
        let held = |lo: u64, hi: u64| -> u64 {
            self.leases
                .iter()
                .filter(|l| l.0 > now && (lo..=hi).contains(&l.0))
                .map(|l| l.1)
                .sum()
        };
        let target = now.saturating_add(self.ttl);
        let stamp = if held(target, target) == 0 {
            target
        } else {
            // The documented search: limit + 1 candidates from the target up (the last
            // limit + 1 values where that passes u64::MAX), never at or before now, halved
            // towards the lower half while fewer cells than values are held there.
            let mut hi = target.saturating_add(self.limit);
            let mut lo = (hi - self.limit).max(now + 1);
            if held(lo, hi) > hi - lo {
                return (Answer::deny(self.limit - live, true), None, None);
            }
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if held(lo, mid) <= mid - lo {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            lo
        };
        assert!(
            stamp > now && self.leases.iter().all(|l| l.0 <= now || l.0 != stamp),
            "a stamp after now that no live lease holds"
        );
        self.leases.push((stamp, cost));
        (Answer::allow(self.limit - live - cost), Some(stamp), None)
    }
    /// Cells freed, when the lease is still live (an expired one may have been partly reused).
    fn release(&mut self, now: u64, stamp: u64) -> Option<u64> {
        match self.leases.iter().position(|l| l.0 == stamp) {
            Some(i) => {
                let (s, cells) = self.leases.remove(i);
                (s > now).then_some(cells)
            }
            None => Some(0),
        }
    }
}

fn conc_acquire(
    p: &concurrency::Params,
    rec: &mut Vec<u64>,
    now: u64,
    cost: u64,
) -> (Decision, Option<u64>) {
    let before = rec.clone();
    let (dry, none) = concurrency::acquire(&mut rec[..], now, p, cost, false);
    assert!(
        *rec == before && none.is_none(),
        "apply = false must not write"
    );
    let (d, stamp) = concurrency::acquire(&mut rec[..], now, p, cost, true);
    assert_eq!(dry.allowed(), d.allowed());
    if cost == 0 || !d.allowed() {
        assert!(*rec == before, "a peek or a denial changes nothing");
    }
    (d, stamp)
}

fn drive_concurrency(limit: u64, ttl: u64, start: u64, ops: &[RawOp]) -> Result<(), TestCaseError> {
    let p = concurrency::Params::new(limit, ttl).unwrap();
    let mut rec = vec![0u64; p.words()];
    let mut model = ConcurrencyModel {
        limit,
        ttl,
        leases: vec![],
    };
    let mut issued: Vec<u64> = vec![];
    let mut now = start;
    let max_ops = if limit > 50_000 { 10 } else { usize::MAX };
    for (i, op) in ops.iter().take(max_ops).enumerate() {
        now += step(op.step, op.step_raw, now, &[ttl, ttl / 3 + 1]);
        let cost = cost_of(op.cost, op.cost_raw, limit);
        let ctx = format!("op {i}: now {now}, cost {cost}");
        match op.act % 16 {
            12..=15 if !issued.is_empty() => {
                let stamp = issued[(op.cost_raw % issued.len() as u64) as usize];
                let freed = concurrency::release(&mut rec[..], &p, stamp);
                if let Some(m) = model.release(now, stamp) {
                    prop_assert_eq!(freed, m, "release of {}: {}", stamp, ctx);
                }
            }
            act => {
                let c = if act >= 10 { 0 } else { cost };
                // An earlier now never admits what the latest one denies.
                let then = now - (1 + op.back_raw % now.max(1)).min(now);
                let late = concurrency::acquire(&mut rec.clone()[..], now, &p, c, true).0;
                let early = concurrency::acquire(&mut rec.clone()[..], then, &p, c, true).0;
                prop_assert!(
                    late.allowed() || !early.allowed(),
                    "earlier now admits: {}",
                    ctx
                );
                let (d, stamp) = conc_acquire(&p, &mut rec, now, c);
                let (m, mstamp, mretry) = model.acquire(now, c);
                compare(&d, &m, c, &ctx)?;
                prop_assert_eq!(stamp, mstamp, "stamp: {}", ctx);
                prop_assert_eq!(d.retry_after_ns, mretry, "retry: {}", ctx);
                if let Some(r) = d.retry_after_ns {
                    prop_assert!(!model.clone().acquire(now + r - 1, c).0.allowed, "{}", ctx);
                    prop_assert!(
                        !concurrency::acquire(&mut rec.clone()[..], now + r - 1, &p, c, true)
                            .0
                            .allowed(),
                        "{}",
                        ctx
                    );
                    prop_assert!(model.clone().acquire(now + r, c).0.allowed, "{}", ctx);
                    prop_assert!(
                        concurrency::acquire(&mut rec.clone()[..], now + r, &p, c, true)
                            .0
                            .allowed(),
                        "{}",
                        ctx
                    );
                }
                issued.extend(stamp);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn concurrency_matches_lease_list(
        limit in limit(concurrency::MAX_LIMIT), ttl in window(), (sk, sr) in start_raw(),
        ops in raw_ops(40),
    ) {
        drive_concurrency(limit, ttl, start_time(sk, sr, &[], 0), &ops)?;
    }
}

// ------------------------------------------------------------------------------------------
// Time going backwards, after a whole sequence, for every algorithm.
// ------------------------------------------------------------------------------------------

/// Runs `ops` forward on the implementation only, then checks at many earlier times.
fn backwards_after<S: Sut>(
    mut sut: S,
    start: u64,
    units: &[u64],
    cap: u64,
    back_max: u64,
    ops: &[RawOp],
    probes: &[Probe],
) -> Result<(), TestCaseError> {
    let mut now = start;
    for op in ops {
        now += step(op.step, op.step_raw, now, units);
        let cost = cost_of(op.cost, op.cost_raw, cap);
        if op.act % 16 >= 14 {
            sut.refund(now, cost);
        } else {
            sut.check(now, cost);
        }
    }
    for &(raw, ck, cr) in probes {
        let cost = cost_of(ck, cr, cap);
        probe_backwards(
            &sut,
            now,
            cost,
            raw,
            back_max,
            &format!("probe at {now}, cost {cost}"),
        )?;
    }
    Ok(())
}

/// One algorithm (by number) with `limit` per `window`: a forward sequence, then probes back.
fn backwards_case(
    algo: u8,
    limit: u64,
    window: u64,
    count_denied: bool,
    start: u64,
    ops: &[RawOp],
    probes: &[Probe],
) -> Result<(), TestCaseError> {
    // How far back a probe may go: what each index takes for time going backwards.
    let behind = |ahead: u64, unit: u64| (ahead - 1).saturating_mul(unit);
    match algo {
        0 => {
            let p = fixed_window::Params::new(limit, window, count_denied).unwrap();
            let back = behind(fixed_window::AHEAD, window);
            backwards_after(
                PackedSut::new(Packed::Fw(p)),
                start,
                &[window],
                limit,
                back,
                ops,
                probes,
            )
        }
        1 => {
            let p = sliding_window::Params::new(limit, window, count_denied).unwrap();
            let back = behind(sliding_window::AHEAD, window);
            backwards_after(
                PackedSut::new(Packed::Sw(p)),
                start,
                &[window],
                limit,
                back,
                ops,
                probes,
            )
        }
        2 => {
            let p = token_bucket::Params::new(limit, 1, window).unwrap();
            backwards_after(
                PackedSut::new(Packed::Tb(p)),
                start,
                &[window],
                limit,
                u64::MAX,
                ops,
                probes,
            )
        }
        3 => {
            let shaper = leaky_bucket::Mode::Shaper {
                delay: (limit - 1) / 2,
            };
            let p = leaky_bucket::Params::new(1, window, limit - 1, shaper).unwrap();
            backwards_after(
                PackedSut::new(Packed::Lb(p)),
                start,
                &[window],
                limit,
                u64::MAX,
                ops,
                probes,
            )
        }
        4 => {
            let p = sliding_log::Params::new(limit, window, count_denied).unwrap();
            backwards_after(
                CellsSut::new(Var::Log(p)),
                start,
                &[window],
                limit,
                u64::MAX,
                ops,
                probes,
            )
        }
        5 => {
            let sub = window / 60;
            let p = window_ring::Params::new(limit, sub * 60, 60, count_denied).unwrap();
            let back = behind(window_ring::AHEAD, sub);
            backwards_after(
                CellsSut::new(Var::Ring(p)),
                start,
                &[window, sub],
                limit,
                back,
                ops,
                probes,
            )
        }
        _ => {
            let p = concurrency::Params::new(limit, window).unwrap();
            let mut rec = vec![0u64; p.words()];
            let mut now = start;
            for op in ops {
                now += step(op.step, op.step_raw, now, &[window]);
                let cost = cost_of(op.cost, op.cost_raw, limit);
                concurrency::acquire(&mut rec[..], now, &p, cost, true);
            }
            for &(raw, ck, cr) in probes {
                let cost = cost_of(ck, cr, limit);
                let then = now - (1 + raw % now.max(1)).min(now);
                let late = concurrency::acquire(&mut rec.clone()[..], now, &p, cost, true).0;
                let early = concurrency::acquire(&mut rec.clone()[..], then, &p, cost, true).0;
                prop_assert!(
                    late.allowed() || !early.allowed(),
                    "earlier now {} admits",
                    then
                );
            }
            Ok(())
        }
    }
}

/// A probe: (how far back, cost kind, cost raw).
type Probe = (u64, u8, u64);

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn time_going_backwards_never_admits_more(
        algo in 0u8..7, limit in 1u64..=12, window in window(), count_denied in any::<bool>(),
        (sk, sr) in start_raw(), ops in raw_ops(30),
        probes in prop::collection::vec((any::<u64>(), any::<u8>(), any::<u64>()), 8),
    ) {
        let start = start_time(sk, sr, &[], 0);
        backwards_case(algo, limit, window, count_denied, start, &ops, &probes)?;
    }
}

// ------------------------------------------------------------------------------------------
// Fixed cases at the extremes.
// ------------------------------------------------------------------------------------------

/// A fresh record (state 0: window index 0) at a time whose index, mod the encoding's range,
/// lies in the upper ("behind") half must still count per window and reset.
#[test]
fn fresh_record_resets_at_any_absolute_time() {
    let w = MS;
    let fw = fixed_window::Params::new(2, w, false).unwrap();
    let sw = sliding_window::Params::new(2, w, false).unwrap();
    let ring = window_ring::Params::new(2, w, 1, false).unwrap();
    // Indices in the upper half of each encoding's range (2^39, 2^23, 2^38), and one not.
    for base in [(1u64 << 38) + 5, (3u64 << 38) + 5, 1 << 40] {
        let t0 = base * w;
        let mut s = 0;
        for k in 0..4 {
            let now = t0 + k * w;
            for i in 0..2 {
                let (n, d) = fixed_window::decide(s, now, &fw, 1);
                assert!(
                    d.allowed(),
                    "fixed_window window {k} request {i} at index {}",
                    now / w
                );
                s = n;
            }
            assert!(!fixed_window::decide(s, now, &fw, 1).1.allowed());
        }
    }
    for base in [
        (1u64 << 22) + 5,
        (3u64 << 22) + 5,
        (1u64 << 38) + (1 << 22),
        1 << 40,
    ] {
        let t0 = base * w;
        // Two windows apart, nothing is weighted any more.
        let mut s = 0;
        for k in 0..4 {
            let now = t0 + 2 * k * w;
            for i in 0..2 {
                let (n, d) = sliding_window::decide(s, now, &sw, 1);
                assert!(
                    d.allowed(),
                    "sliding_window window {} request {i} at index {}",
                    2 * k,
                    now / w
                );
                s = n;
            }
            assert!(!sliding_window::decide(s, now, &sw, 1).1.allowed());
        }
    }
    for base in [(1u64 << 37) + 5, (3u64 << 37) + 5, 1 << 40] {
        let t0 = base * w;
        // One bucket: the two-window estimate; two sub-windows apart nothing is weighted.
        let mut rec = vec![0u64; ring.words()];
        for k in 0..4 {
            let now = t0 + 2 * k * w;
            for i in 0..2 {
                assert!(
                    window_ring::decide(&mut rec[..], now, &ring, 1, true).allowed(),
                    "window_ring sub-window {k} request {i} at index {}",
                    now / w
                );
            }
            assert!(!window_ring::decide(&mut rec[..], now, &ring, 1, true).allowed());
        }
    }
}

/// Whatever `now` a caller passes, nothing panics.
#[test]
fn extreme_now_never_panics() {
    let fw = fixed_window::Params::new(3, S, true).unwrap();
    let sw = sliding_window::Params::new(3, S, true).unwrap();
    let tb = token_bucket::Params::new(3, 1, S).unwrap();
    let lb = leaky_bucket::Params::new(1, S, 2, leaky_bucket::Mode::Shaper { delay: 1 }).unwrap();
    let log = sliding_log::Params::new(3, DAY, true).unwrap();
    let ring = window_ring::Params::new(3, 60 * S, 60, true).unwrap();
    let conc = concurrency::Params::new(3, S).unwrap();
    let mut times = vec![
        0,
        1,
        1 << 62,
        (1 << 63) - 1,
        1 << 63,
        u64::MAX - 1,
        u64::MAX,
    ];
    times.extend(times.clone().into_iter().rev());
    // Records carried from one cost to the next: huge costs meet non-empty records too.
    let (mut a, mut b, mut c, mut d) = (0, 0, 0, 0);
    let mut rl = vec![0u64; log.words()];
    let mut rr = vec![0u64; ring.words()];
    let mut rc = vec![0u64; conc.words()];
    for cost in [0, 1, 3, 4, u64::MAX, 1, u64::MAX - 1, 2, u64::MAX] {
        for &now in &times {
            let decisions = [
                fixed_window::decide(a, now, &fw, cost),
                sliding_window::decide(b, now, &sw, cost),
                token_bucket::decide(c, now, &tb, cost),
                leaky_bucket::decide(d, now, &lb, cost),
                (0, sliding_log::decide(&mut rl[..], now, &log, cost, true)),
                (0, window_ring::decide(&mut rr[..], now, &ring, cost, true)),
                (
                    0,
                    concurrency::acquire(&mut rc[..], now, &conc, cost, true).0,
                ),
            ];
            [a, b, c, d] = [
                decisions[0].0,
                decisions[1].0,
                decisions[2].0,
                decisions[3].0,
            ];
            for (i, (_, dec)) in decisions.iter().enumerate() {
                if cost > 3 {
                    // Every limit holds 3: a larger cost never fits, however it is summed.
                    assert_eq!(
                        dec.outcome,
                        Outcome::NeverFits,
                        "algorithm {i}, cost {cost}, now {now}"
                    );
                }
            }
            a = fixed_window::refund(a, now, &fw, 1);
            b = sliding_window::refund(b, now, &sw, 1);
            c = token_bucket::refund(c, now, &tb, 1);
            d = leaky_bucket::refund(d, now, &lb, 1);
            sliding_log::refund(&mut rl[..], &log, 1);
            window_ring::refund(&mut rr[..], now, &ring, 1);
            for s in [a, b, c, d] {
                assert_eq!(s >> 63, 0);
            }
        }
    }
}

/// With `count_denied`, a denial is recorded, and its retry must wait for the record as it is
/// after the denial (the counted denial included), not as it was before.
#[test]
fn count_denied_retry_waits_for_the_counted_denial() {
    let w = MS;
    // sliding_log, limit 1: admitted at 0, denied (and logged) at W/2: not before W/2 + W.
    let p = sliding_log::Params::new(1, w, true).unwrap();
    let mut rec = vec![0; p.words()];
    assert!(sliding_log::decide(&mut rec[..], 0, &p, 1, true).allowed());
    assert_eq!(
        sliding_log::decide(&mut rec[..], w / 2, &p, 1, true).retry_after_ns,
        Some(w)
    );

    // sliding_window, limit 4: 4 in the previous window; a request at its end is denied and
    // counted (current 1): the next needs ⌊4 × (W − e)/W⌋ + 1 + 1 ≤ 4, e > W/4.
    let p = sliding_window::Params::new(4, w, true).unwrap();
    let mut s = 0;
    for _ in 0..4 {
        s = sliding_window::decide(s, w - 1, &p, 1).0;
    }
    let (s, d) = sliding_window::decide(s, w, &p, 1);
    assert_eq!(d.retry_after_ns, Some(w / 4 + 1));
    assert!(!sliding_window::decide(s, w + w / 4, &p, 1).1.allowed());
    assert!(sliding_window::decide(s, w + w / 4 + 1, &p, 1).1.allowed());

    // window_ring, limit 1 in 2 sub-windows of W/2: admitted at 0, denied (and counted) at
    // 3W/4 in the second sub-window [W/2, W). From 3W/2 that sub-window straddles the
    // window's start, counted 1 × (2W − t)/(W/2) rounded: 1 until 7W/4, 0 after.
    let p = window_ring::Params::new(1, w, 2, true).unwrap();
    let mut rec = vec![0; p.words()];
    assert!(window_ring::decide(&mut rec[..], 0, &p, 1, true).allowed());
    assert_eq!(
        window_ring::decide(&mut rec[..], 3 * w / 4, &p, 1, true).retry_after_ns,
        Some(w + 1)
    );
}

// ------------------------------------------------------------------------------------------
// Several limits on one key: all-or-nothing, against the per-algorithm models composed.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum AnyModel {
    Fw(FixedWindowModel),
    Sw(SlidingWindowModel),
    Tb(TokenBucketModel),
    Lb(LeakyBucketModel),
    Log(SlidingLogModel),
    Ring(WindowRingModel),
}

impl AnyModel {
    fn counts_denied(&self) -> bool {
        match self {
            AnyModel::Fw(m) => m.count_denied,
            AnyModel::Sw(m) => m.count_denied,
            AnyModel::Log(m) => m.count_denied,
            AnyModel::Ring(m) => m.count_denied,
            _ => false,
        }
    }
    fn model(&mut self) -> &mut dyn ModelDyn {
        match self {
            AnyModel::Fw(m) => m,
            AnyModel::Sw(m) => m,
            AnyModel::Tb(m) => m,
            AnyModel::Lb(m) => m,
            AnyModel::Log(m) => m,
            AnyModel::Ring(m) => m,
        }
    }
}

/// `Model` without `Clone`, so that it can be a trait object.
trait ModelDyn {
    fn check(&mut self, now: u64, cost: u64) -> Answer;
    fn refund(&mut self, now: u64, n: u64);
    fn charge(&mut self, now: u64, n: u64);
}

impl<M: Model> ModelDyn for M {
    fn check(&mut self, now: u64, cost: u64) -> Answer {
        Model::check(self, now, cost)
    }
    fn refund(&mut self, now: u64, n: u64) {
        Model::refund(self, now, n)
    }
    fn charge(&mut self, now: u64, n: u64) {
        Model::charge(self, now, n)
    }
}

/// The composition: evaluate every limit; record in all of them only if all admit (and in
/// those that count denied requests whatever the outcome). A denial reports the first denying
/// limit; an admission the least remaining and the longest delay.
#[derive(Clone, Debug)]
struct AllOrNothing(Vec<AnyModel>);

impl Model for AllOrNothing {
    fn check(&mut self, now: u64, cost: u64) -> Answer {
        let mut answers: Vec<Answer> = self
            .0
            .iter()
            .map(|m| m.clone().model().check(now, cost))
            .collect();
        let all = answers.iter().all(|a| a.allowed);
        // A cost some limit can never admit changes no state, in any limit.
        let never = answers.iter().any(|a| !a.allowed && a.never_fits);
        for (m, a) in self.0.iter_mut().zip(answers.iter_mut()) {
            if all || (m.counts_denied() && !never) {
                *a = m.model().check(now, cost);
            }
        }
        if all {
            let mut out = Answer::allow(answers.iter().map(|a| a.remaining).min().unwrap());
            out.delay_ns = answers.iter().map(|a| a.delay_ns).max().unwrap();
            return out;
        }
        // A denial: the least any limit holds now.
        let remaining = self
            .0
            .iter()
            .map(|m| m.clone().model().check(now, 0).remaining)
            .min()
            .unwrap();
        Answer::deny(remaining, never)
    }
    fn refund(&mut self, now: u64, n: u64) {
        for m in &mut self.0 {
            m.model().refund(now, n);
        }
    }
    fn charge(&mut self, now: u64, n: u64) {
        for m in &mut self.0 {
            m.model().charge(now, n);
        }
    }
}

#[derive(Clone, Debug)]
struct LimitsSut {
    limits: turnstile::Limits,
    rec: Vec<u64>,
}

impl Sut for LimitsSut {
    fn check(&mut self, now: u64, cost: u64) -> Decision {
        self.limits.decide(&mut self.rec[..], now, cost)
    }
    fn refund(&mut self, now: u64, n: u64) {
        self.limits.refund(&mut self.rec[..], now, n)
    }
    fn charge(&mut self, now: u64, n: u64) {
        self.limits.charge(&mut self.rec[..], now, n)
    }
}

/// One limit of a composed set: (model, limit, capacity, natural period).
fn one_limit(
    kind: u8,
    limit: u64,
    window: u64,
    count_denied: bool,
    extra: u64,
) -> (AnyModel, turnstile::Limit, u64, u64) {
    use turnstile::{Algorithm, LimitSpec};
    let spec = |a| LimitSpec {
        count_denied,
        ..LimitSpec::new(a, limit, std::time::Duration::from_nanos(window))
    };
    match kind % 6 {
        0 => {
            let m = FixedWindowModel {
                limit,
                window,
                count_denied,
                counts: HashMap::new(),
            };
            (
                AnyModel::Fw(m),
                spec(Algorithm::FixedWindow).build().unwrap(),
                limit,
                window,
            )
        }
        1 => {
            let m = SlidingWindowModel {
                limit,
                window,
                count_denied,
                counts: HashMap::new(),
            };
            (
                AnyModel::Sw(m),
                spec(Algorithm::SlidingWindow).build().unwrap(),
                limit,
                window,
            )
        }
        2 => {
            let rate = 1 + extra % 5;
            let l = LimitSpec {
                burst: Some(limit),
                ..LimitSpec::new(
                    Algorithm::TokenBucket,
                    rate,
                    std::time::Duration::from_nanos(window),
                )
            };
            (
                AnyModel::Tb(TokenBucketModel::new(limit, rate, window, 0)),
                l.build().unwrap(),
                limit,
                window.div_ceil(rate),
            )
        }
        3 => {
            let burst = limit - 1;
            let delay = (extra % 2 == 0).then_some((extra >> 1) % limit);
            let l = LimitSpec {
                burst: Some(burst),
                delay,
                ..LimitSpec::new(
                    Algorithm::LeakyBucket,
                    1,
                    std::time::Duration::from_nanos(window),
                )
            };
            (
                AnyModel::Lb(LeakyBucketModel::new(1, window, burst, delay)),
                l.build().unwrap(),
                limit,
                window,
            )
        }
        4 => (
            AnyModel::Log(SlidingLogModel::new(limit, window, count_denied)),
            spec(Algorithm::SlidingLog).build().unwrap(),
            limit,
            window,
        ),
        _ => {
            let buckets = 1 + extra % 8;
            let sub = window / buckets;
            let m = WindowRingModel {
                limit,
                sub,
                buckets,
                count_denied,
                counts: HashMap::new(),
            };
            let l = LimitSpec {
                buckets: Some(buckets),
                ..spec(Algorithm::WindowRing)
            };
            let l = LimitSpec {
                window: std::time::Duration::from_nanos(sub * buckets),
                ..l
            };
            (AnyModel::Ring(m), l.build().unwrap(), limit, sub)
        }
    }
}

/// (algorithm, limit, window multiple, count_denied, extra parameter).
fn limit_spec() -> impl Strategy<Value = (u8, u64, u64, bool, u64)> {
    (
        any::<u8>(),
        1u64..=12,
        1u64..=8,
        any::<bool>(),
        any::<u64>(),
    )
}

proptest! {
    #![proptest_config(config(128))]

    /// Two or three limits on one key (the AtomicU128 and sequence-word records use this).
    #[test]
    fn limits_are_all_or_nothing(
        base in window(),
        specs in prop::collection::vec(limit_spec(), 2..=3),
        start in 0u64..(1 << 40), ops in raw_ops(40),
    ) {
        // Windows within a factor 8 of each other: a step of a few of the longest is then a few
        // dozen of the shortest, far from the index ranges' "behind" halves (2^22 windows for
        // sliding_window), where a long idle record is taken for time going backwards.
        let mut models = vec![];
        let mut limits = vec![];
        let mut units = vec![];
        let mut cap = u64::MAX;
        for &(kind, limit, mult, count_denied, extra) in &specs {
            let (m, l, c, unit) = one_limit(kind, limit, base * mult, count_denied, extra);
            models.push(m);
            limits.push(l);
            units.push(unit);
            cap = cap.min(c);
        }
        let limits = turnstile::Limits::new(limits).unwrap();
        let rec = vec![0; limits.words()];
        let mut plan = plan(start, units, cap, u64::MAX);
        // As for one sliding_log: no refunds when a log counts denials.
        plan.refunds = !models.iter().any(|m| matches!(m, AnyModel::Log(l) if l.count_denied));
        // The retry waits for every limit, including a denial a `count_denied` limit recorded.
        let sut = LimitsSut { limits, rec };
        drive_limits(sut, AllOrNothing(models), &plan, &ops, true)?;
    }
}

/// `drive` without the backwards probe (covered per limit) and with an optional retry check.
fn drive_limits(
    mut sut: LimitsSut,
    mut model: AllOrNothing,
    plan: &Plan,
    ops: &[RawOp],
    retry: bool,
) -> Result<(), TestCaseError> {
    let mut now = plan.start;
    for (i, op) in ops.iter().enumerate() {
        now += step(op.step, op.step_raw, now, &plan.units);
        let cost = cost_of(op.cost, op.cost_raw, plan.cap);
        let ctx = format!("op {i}: now {now}, cost {cost}");
        match op.act % 16 {
            14 | 15 if plan.refunds && op.cost_raw >> 63 == 1 => {
                let n = cost.min(plan.charge_max);
                sut.charge(now, n);
                Model::charge(&mut model, now, n);
            }
            14 | 15 if plan.refunds => {
                sut.refund(now, cost);
                Model::refund(&mut model, now, cost);
            }
            act => {
                let c = if act >= 12 { 0 } else { cost };
                let d = sut.check(now, c);
                let m = Model::check(&mut model, now, c);
                compare(&d, &m, c, &ctx)?;
                if let (true, Some(r)) = (retry, d.retry_after_ns) {
                    check_retry(&sut, &model, now, c, r, &ctx)?;
                }
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Limits changing between checks (a store given the limit with each check,
// `keyed::Store::check_with`). The implementation keeps its packed state and decides it by
// the new parameters; each model states the algorithm's carry rule in its own terms.
// ------------------------------------------------------------------------------------------

/// A model whose limit changes to `to`'s at `now`, its state carried over.
trait Relimit: Model {
    fn relimit(&mut self, now: u64, to: &Self);
}

/// The window's count is kept and compared with the new limit (the window stays: it is the
/// packed record's layout).
impl Relimit for FixedWindowModel {
    fn relimit(&mut self, _now: u64, to: &Self) {
        assert_eq!(self.window, to.window, "a window store keeps its window");
        (self.limit, self.count_denied) = (to.limit, to.count_denied);
    }
}

/// Both windows' counts are kept, weighted and compared with the new limit.
impl Relimit for SlidingWindowModel {
    fn relimit(&mut self, _now: u64, to: &Self) {
        assert_eq!(self.window, to.window, "a window store keeps its window");
        (self.limit, self.count_denied) = (to.limit, to.count_denied);
    }
}

/// The backlog (full − tokens, in ns: the time until the bucket is full, what the TAT holds)
/// is kept; the new bucket holds its capacity less that backlog, below zero if it is smaller.
impl Relimit for TokenBucketModel {
    fn relimit(&mut self, now: u64, to: &Self) {
        self.refill(now);
        let backlog = self.full() - self.tokens;
        (self.capacity, self.interval) = (to.capacity, to.interval);
        self.tokens = self.full() - backlog;
    }
}

/// The queue's drain time (the TAT) is kept: `queue(now)` ns, drained from now on at the new
/// rate (nginx keeps the queued count instead; the two agree when the rate stays).
impl Relimit for LeakyBucketModel {
    fn relimit(&mut self, now: u64, to: &Self) {
        let q = self.queue(now);
        (self.interval, self.burst, self.delay) = (to.interval, to.burst, to.delay);
        if self.node.is_some() {
            self.node = Some((q - self.interval, now));
        }
    }
}

/// Drives the implementation and the model through `ops`, the limit moving between checks to
/// a member of `family` (picked by each op's spare bits, or kept).
fn drive_changing<M: Relimit>(
    family: &[(Packed, M)],
    plan: &Plan,
    ops: &[RawOp],
) -> Result<(), TestCaseError> {
    let sut = PackedSut::new(family[0].0);
    drive_with(
        sut,
        family[0].1.clone(),
        plan,
        ops,
        |sut, model, now, op| {
            let j = (op.back_raw >> 48) as usize % (family.len() + 1);
            if let Some((p, m)) = family.get(j) {
                sut.p = *p;
                model.relimit(now, m);
            }
        },
    )
}

/// A token bucket's parameters: (capacity, rate, period).
fn bucket() -> impl Strategy<Value = (u64, u64, u64)> {
    (
        prop_oneof![Just(1u64), Just(15), Just(250), 1u64..=1000],
        window(),
        0u8..4,
        any::<u64>(),
    )
        .prop_map(|(rate, period, kind, raw)| {
            let max_cap = token_bucket::MAX_TAU / period.div_ceil(rate);
            let capacity = match kind {
                0 => 1,
                1 => 1 + raw % 20,
                2 => 1 + raw % max_cap,
                _ => max_cap,
            };
            (capacity, rate, period)
        })
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn fixed_window_keeps_its_count_across_limits(
        window in window(),
        members in prop::collection::vec((limit(fixed_window::MAX_LIMIT), any::<bool>()), 2..5),
        (sk, sr) in start_raw(), ops in raw_ops(40),
    ) {
        let family: Vec<_> = members.iter().map(|&(limit, count_denied)| {
            let p = fixed_window::Params::new(limit, window, count_denied).unwrap();
            let m = FixedWindowModel { limit, window, count_denied, counts: HashMap::new() };
            (Packed::Fw(p), m)
        }).collect();
        let cap = members.iter().map(|m| m.0).max().unwrap();
        let start = start_time(sk, sr, &boundaries(window, fixed_window::INDEX_BITS), 4 * window);
        let back = (fixed_window::AHEAD - 1).saturating_mul(window);
        drive_changing(&family, &plan(start, vec![window], cap, back), &ops)?;
    }

    #[test]
    fn sliding_window_keeps_its_counts_across_limits(
        window in window(),
        members in prop::collection::vec((limit(sliding_window::MAX_LIMIT), any::<bool>()), 2..5),
        (sk, sr) in start_raw(), ops in raw_ops(40),
    ) {
        let family: Vec<_> = members.iter().map(|&(limit, count_denied)| {
            let p = sliding_window::Params::new(limit, window, count_denied).unwrap();
            let m = SlidingWindowModel { limit, window, count_denied, counts: HashMap::new() };
            (Packed::Sw(p), m)
        }).collect();
        let cap = members.iter().map(|m| m.0).max().unwrap();
        let start = start_time(sk, sr, &boundaries(window, sliding_window::INDEX_BITS), 4 * window);
        let back = (sliding_window::AHEAD - 1).saturating_mul(window);
        drive_changing(&family, &plan(start, vec![window], cap, back), &ops)?;
    }

    /// redis-cell's rule: the TAT is kept whatever the new capacity, rate and period.
    #[test]
    fn token_bucket_keeps_its_tat_across_limits(
        members in prop::collection::vec(bucket(), 2..5), (sk, sr) in start_raw(),
        ops in raw_ops(40),
    ) {
        let start = bucket_start(sk, sr);
        let family: Vec<_> = members.iter().map(|&(capacity, rate, period)| {
            let p = token_bucket::Params::new(capacity, rate, period).unwrap();
            (Packed::Tb(p), TokenBucketModel::new(capacity, rate, period, start))
        }).collect();
        let cap = members.iter().map(|m| m.0).max().unwrap();
        let units = members.iter().flat_map(|&(c, r, p)| {
            let t = p.div_ceil(r);
            [t, c * t, p]
        }).collect();
        drive_changing(&family, &plan(start, units, cap, u64::MAX), &ops)?;
    }

    /// The TAT is kept: the queue drains from then on at the new rate, by the new burst.
    #[test]
    fn leaky_bucket_keeps_its_tat_across_limits(
        members in prop::collection::vec(
            (prop_oneof![Just(1u64), Just(10), 1u64..=1000], window(), 0u8..4, any::<u64>(),
             prop::option::of(any::<u64>())),
            2..5,
        ),
        (sk, sr) in start_raw(), ops in raw_ops(40),
    ) {
        let family: Vec<_> = members.iter().map(|&(rate, period, kind, raw, delay_raw)| {
            let max_burst = token_bucket::MAX_TAU / period.div_ceil(rate) - 1;
            let burst = match kind {
                0 => 0,
                1 => raw % 20,
                2 => raw % max_burst,
                _ => max_burst,
            };
            let delay = delay_raw.map(|d| d % (burst + 1));
            let mode = match delay {
                None => leaky_bucket::Mode::Meter,
                Some(delay) => leaky_bucket::Mode::Shaper { delay },
            };
            let p = leaky_bucket::Params::new(rate, period, burst, mode).unwrap();
            (Packed::Lb(p), LeakyBucketModel::new(rate, period, burst, delay))
        }).collect();
        let cap = family.iter().map(|(p, _)| match p {
            Packed::Lb(p) => p.capacity(),
            _ => unreachable!(),
        }).max().unwrap();
        let units = family.iter().flat_map(|(p, _)| match p {
            Packed::Lb(p) => [p.interval, p.tau],
            _ => unreachable!(),
        }).collect();
        let start = bucket_start(sk, sr);
        drive_changing(&family, &plan(start, units, cap, u64::MAX), &ops)?;
    }
}

/// redis-cell's answers, from its own sequence: `CL.THROTTLE m 2 10 60` three times, then
/// `CL.THROTTLE m 5 10 60`, answered `[0, 6, 2, -1, 24]` (remaining 2, reset in 24 s).
#[test]
fn token_bucket_answers_redis_cells_change_of_parameters() {
    let t = 60 * S / 10;
    let small = token_bucket::Params::with_interval(3, t).unwrap();
    let large = token_bucket::Params::with_interval(6, t).unwrap();
    let now = 1_000 * S;
    let mut tat = 0;
    for _ in 0..3 {
        let (s, d) = token_bucket::decide(tat, now, &small, 1);
        assert!(d.allowed());
        tat = s;
    }
    let (_, d) = token_bucket::decide(tat, now, &large, 1);
    assert!(d.allowed());
    assert_eq!((d.limit, d.remaining, d.reset_after_ns), (6, 2, 24 * S));
}
