//! What a check answers when Redis is slow or down: a per-call timeout, then the policy the
//! user picked, behind a circuit breaker; every fallback counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use turnstile::keyed::Store;
use turnstile::{Decision, Limit, LimitSpec, Limits, Outcome};

/// What to answer when Redis does not (timeout, error, circuit open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Admit: [`Outcome::Untracked`] (availability over consistency, the notes' choice).
    Open,
    /// Deny: [`Outcome::StoreFull`] with no retry time (strict).
    Closed,
    /// Decide in memory at each limit ÷ `expected_nodes`, so that the nodes together stay near
    /// the limit while Redis is away.
    Insurance {
        /// How many nodes share the limit.
        expected_nodes: u64,
    },
}

/// Counts of what the failure path did (monotonic, read with [`crate::RedisStore::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureStats {
    /// Checks answered by Redis.
    pub redis: u64,
    /// Calls that hit the per-call timeout.
    pub timeouts: u64,
    /// Calls that failed with an error (connection refused or dropped, server error).
    pub errors: u64,
    /// Checks answered without calling Redis because the circuit was open.
    pub short_circuited: u64,
    /// Checks answered by the policy (each timeout, error and short circuit is one).
    pub fallbacks: u64,
    /// Times the circuit opened.
    pub opened: u64,
    /// Denials answered from the local over-limit cache.
    pub cached_denials: u64,
}

#[derive(Default)]
struct Counters {
    redis: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    short_circuited: AtomicU64,
    fallbacks: AtomicU64,
    opened: AtomicU64,
    cached_denials: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> FailureStats {
        // Relaxed: statistics, no other memory depends on them.
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FailureStats {
            redis: l(&self.redis),
            timeouts: l(&self.timeouts),
            errors: l(&self.errors),
            short_circuited: l(&self.short_circuited),
            fallbacks: l(&self.fallbacks),
            opened: l(&self.opened),
            cached_denials: l(&self.cached_denials),
        }
    }
}

/// A circuit breaker: after `threshold` consecutive failures it opens for `cooldown`, then lets
/// one probe call through (half-open); a success closes it, a failure reopens it.
struct Breaker {
    threshold: u64,
    cooldown: Duration,
    epoch: Instant,
    failures: AtomicU64,
    /// ns since `epoch` until which the circuit is open (0: closed).
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    fn new(threshold: u64, cooldown: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            epoch: Instant::now(),
            failures: AtomicU64::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Whether a call may go to Redis now.
    fn allow(&self) -> bool {
        // Relaxed throughout: the breaker is advisory; a race lets one call more or fewer
        // through, and no other memory is published through these words.
        let until = self.open_until.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        if self.now() < until {
            return false;
        }
        // Half-open: one probe at a time.
        !self.probing.swap(true, Ordering::Relaxed)
    }

    fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if self.open_until.load(Ordering::Relaxed) != 0 {
            self.open_until.store(0, Ordering::Relaxed);
            self.probing.store(false, Ordering::Relaxed);
        }
    }

    /// Records a failure; true if this one opened (or reopened) the circuit.
    fn failure(&self) -> bool {
        let f = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let half_open = self.probing.swap(false, Ordering::Relaxed);
        if f >= self.threshold || half_open {
            let until = self.now() + self.cooldown.as_nanos() as u64;
            self.open_until.store(until.max(1), Ordering::Relaxed);
            return true;
        }
        false
    }

    fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Relaxed) != 0
    }
}

/// The failure path of one backend (a store, a rules backend): its policy, its circuit
/// breaker and its counters. The backend asks [`FailureGate::admit`] before a call and reports
/// [`FailureGate::succeeded`] or [`FailureGate::failed`] after it; what the policy answers is
/// the backend's own (an insurance store or engine), counted with [`FailureGate::fell_back`].
pub(crate) struct FailureGate {
    pub(crate) policy: FailurePolicy,
    breaker: Breaker,
    counters: Counters,
    /// Names the backend in the log.
    backend: String,
}

impl FailureGate {
    pub(crate) fn new(
        policy: FailurePolicy,
        threshold: u64,
        cooldown: Duration,
        backend: String,
    ) -> Self {
        Self {
            policy,
            breaker: Breaker::new(threshold, cooldown),
            counters: Counters::default(),
            backend,
        }
    }

    /// Whether a call for `n` checks may go to Redis now; if not they are counted as short
    /// circuited (the caller answers them by the policy).
    pub(crate) fn admit(&self, n: u64) -> bool {
        if self.breaker.allow() {
            return true;
        }
        // Relaxed: statistics.
        self.counters
            .short_circuited
            .fetch_add(n, Ordering::Relaxed);
        false
    }

    /// `n` checks answered without a call because Redis was never reached (counted as short
    /// circuited; the caller answers them by the policy).
    pub(crate) fn unconnected(&self, n: u64) {
        // Relaxed: statistics.
        self.counters
            .short_circuited
            .fetch_add(n, Ordering::Relaxed);
    }

    /// A call that Redis answered, for `n` checks.
    pub(crate) fn succeeded(&self, n: u64) {
        self.breaker.success();
        self.counters.redis.fetch_add(n, Ordering::Relaxed);
    }

    /// A call that failed: counted, and the breaker told; an opening of the circuit (at most
    /// one per cooldown) is also said in the log, so that an outage is not only in the
    /// counters.
    pub(crate) fn failed(&self, e: &crate::Error) {
        match e {
            crate::Error::Timeout(_) => &self.counters.timeouts,
            _ => &self.counters.errors,
        }
        .fetch_add(1, Ordering::Relaxed);
        if self.breaker.failure() {
            self.counters.opened.fetch_add(1, Ordering::Relaxed);
            log_opened(e, &self.backend, self.policy);
        }
    }

    /// `n` checks answered by the policy.
    pub(crate) fn fell_back(&self, n: u64) {
        self.counters.fallbacks.fetch_add(n, Ordering::Relaxed);
    }

    /// A denial answered from a local cache.
    pub(crate) fn cached_denial(&self) {
        self.counters.cached_denials.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> FailureStats {
        self.counters.snapshot()
    }

    pub(crate) fn is_open(&self) -> bool {
        self.breaker.is_open()
    }
}

/// The log line of an opening. Out of line and cold: it runs once per cooldown at most, and
/// its formatting code stays out of the callers' instructions (code placed among them once
/// moved the `turnstile` binary's keyed batch loop and slowed it; docs/performance.md).
#[cold]
#[inline(never)]
fn log_opened(e: &crate::Error, backend: &str, policy: FailurePolicy) {
    tracing::warn!(
        error = %e,
        backend = %backend,
        policy = ?policy,
        "redis backend failing: circuit open, answering by the failure policy until a probe succeeds"
    );
}

/// `l` with its admissions divided among `nodes` (at least 1 each).
pub(crate) fn scaled(l: &Limit, nodes: u64) -> Limit {
    use turnstile::algo::{leaky_bucket, token_bucket};
    let n = nodes.max(1);
    let div = |x: u64| (x / n).max(1);
    let spec = |alg, limit, window, cd| LimitSpec {
        count_denied: cd,
        ..LimitSpec::new(alg, limit, Duration::from_nanos(window))
    };
    use turnstile::Algorithm as A;
    let built = match l {
        Limit::FixedWindow(p) => {
            spec(A::FixedWindow, div(p.limit), p.window, p.count_denied).build()
        }
        Limit::SlidingWindow(p) => {
            spec(A::SlidingWindow, div(p.limit), p.window, p.count_denied).build()
        }
        Limit::SlidingLog(p) => spec(A::SlidingLog, div(p.limit), p.window, p.count_denied).build(),
        Limit::WindowRing(p) => LimitSpec {
            buckets: Some(p.buckets),
            ..spec(A::WindowRing, div(p.limit), p.window, p.count_denied)
        }
        .build(),
        Limit::TokenBucket(p) => {
            token_bucket::Params::with_interval(div(p.capacity), p.interval.saturating_mul(n))
                .map(Limit::TokenBucket)
        }
        Limit::LeakyBucket(p) => leaky_bucket::Params::new(
            1,
            p.interval.saturating_mul(n),
            div(p.burst + 1) - 1,
            match p.mode {
                leaky_bucket::Mode::Meter => leaky_bucket::Mode::Meter,
                leaky_bucket::Mode::Shaper { delay } => leaky_bucket::Mode::Shaper {
                    delay: delay.min(div(p.burst + 1) - 1),
                },
            },
        )
        .map(Limit::LeakyBucket),
        Limit::Concurrency(p) => spec(A::Concurrency, div(p.limit), p.lease, false).build(),
    };
    // A scaled limit that no longer builds (it cannot: every field only shrank or its period
    // grew within the checked bounds) keeps the original.
    built.unwrap_or(*l)
}

/// The in-memory insurance store for `limits` shared by `nodes`.
pub(crate) fn insurance(limits: &Limits, nodes: u64, keys: u64) -> Option<Store> {
    let scaled = limits.limits().iter().map(|l| scaled(l, nodes)).collect();
    Store::builder(Limits::new(scaled).ok()?)
        .capacity(keys)
        .policy(turnstile::keyed::FullPolicy::EvictStalest)
        .build()
        .ok()
}

/// The decision a policy without memory gives.
pub(crate) fn blind(policy: FailurePolicy, limit: u64) -> Decision {
    let outcome = match policy {
        FailurePolicy::Open => Outcome::Untracked,
        _ => Outcome::StoreFull,
    };
    Decision {
        outcome,
        limit,
        remaining: 0,
        reset_after_ns: 0,
        retry_after_ns: None,
        delay_ns: 0,
    }
}
