//! What a check answers, and the errors a limit can be refused with.

use std::fmt;
use std::time::Duration;

/// Why a check was answered the way it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Admitted (possibly after `delay_ns`, for a shaping leaky bucket).
    Allowed,
    /// Over the limit now; it fits again after `retry_after_ns`.
    Limited,
    /// The cost exceeds what the limit can ever admit at once, or it could not fit again
    /// before the end of the clock (2^64 ns; 2^63 ns for a bucket's TAT): retrying never
    /// helps. Never counted, not even with `count_denied`; it changes no state.
    NeverFits,
    /// The keyed store is full of live keys and its policy refuses new ones (fail closed).
    StoreFull,
    /// The keyed store is full of live keys and its policy admits new ones untracked (fail open).
    Untracked,
}

/// The answer to one check. `Copy`, 56 bytes (asserted at compile time), no allocation.
///
/// Times are nanoseconds; [`Decision::retry_after`] and friends give `Duration`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What happened.
    pub outcome: Outcome,
    /// The limit this decision was made against (requests per window, bucket capacity, ...).
    /// For several limits on one key, the one with the least remaining (the first such; when
    /// denied, a denying one if it ties).
    pub limit: u64,
    /// What is left after this check.
    pub remaining: u64,
    /// Nanoseconds until the limit is back to its full, idle state.
    pub reset_after_ns: u64,
    /// When denied: nanoseconds until this same request (same cost) would be admitted, rounded
    /// up; `None` when allowed or when it never fits.
    pub retry_after_ns: Option<u64>,
    /// For a shaping leaky bucket: how long the admitted request should wait before it proceeds.
    pub delay_ns: u64,
}

const NANOS_PER_SEC: u64 = 1_000_000_000;
const NANOS_PER_MS: u64 = 1_000_000;

// The size `check_batch`'s output stride and the docs quote (x86-64 and other 64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Decision>() == 56);

impl Decision {
    /// Whether the request may go on.
    #[inline]
    pub fn allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allowed | Outcome::Untracked)
    }
    /// When denied and retrying can help: how long to wait.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ns.map(Duration::from_nanos)
    }
    /// How long until the limit is idle again.
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }
    /// For a shaper: how long to hold the admitted request.
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns)
    }

    // Wire units: what protocols send (`Retry-After`, RateLimit headers, JSON, RESP). Times
    // round up, so that a client that waits what it is told is never early.

    /// `retry_after_ns` in whole seconds, rounded up and at least 1 (HTTP's `Retry-After`:
    /// a client told 0 would retry at once and be refused again).
    #[inline]
    pub fn retry_after_secs_ceil(&self) -> Option<u64> {
        self.retry_after_ns
            .map(|ns| ns.div_ceil(NANOS_PER_SEC).max(1))
    }
    /// `retry_after_ns` in whole milliseconds, rounded up.
    #[inline]
    pub fn retry_after_ms_ceil(&self) -> Option<u64> {
        self.retry_after_ns.map(|ns| ns.div_ceil(NANOS_PER_MS))
    }
    /// `reset_after_ns` in whole seconds, rounded up.
    #[inline]
    pub fn reset_after_secs_ceil(&self) -> u64 {
        self.reset_after_ns.div_ceil(NANOS_PER_SEC)
    }
    /// `reset_after_ns` in whole milliseconds, rounded up.
    #[inline]
    pub fn reset_after_ms_ceil(&self) -> u64 {
        self.reset_after_ns.div_ceil(NANOS_PER_MS)
    }
    /// Whether a limit made this decision: `false` when none applied (`limit` is `u64::MAX`,
    /// e.g. no rule matched), where there is no quota to report.
    #[inline]
    pub fn has_limit(&self) -> bool {
        self.limit != u64::MAX
    }
    /// `limit` for formats that write "no limit" as -1 (RESP integers, JSON): -1 for
    /// `u64::MAX` (and anything above `i64::MAX`).
    #[inline]
    pub fn limit_or_minus_one(&self) -> i64 {
        i64::try_from(self.limit).unwrap_or(-1)
    }
    /// `remaining` likewise: -1 for `u64::MAX` (what "no limit" leaves).
    #[inline]
    pub fn remaining_or_minus_one(&self) -> i64 {
        i64::try_from(self.remaining).unwrap_or(-1)
    }

    #[inline]
    pub(crate) fn allow(limit: u64, remaining: u64, reset_after_ns: u64) -> Self {
        Self {
            outcome: Outcome::Allowed,
            limit,
            remaining,
            reset_after_ns,
            retry_after_ns: None,
            delay_ns: 0,
        }
    }
    #[inline]
    pub(crate) fn deny(
        limit: u64,
        remaining: u64,
        reset_after_ns: u64,
        retry: Option<u64>,
    ) -> Self {
        Self {
            outcome: if retry.is_some() {
                Outcome::Limited
            } else {
                Outcome::NeverFits
            },
            limit,
            remaining,
            reset_after_ns,
            retry_after_ns: retry,
            delay_ns: 0,
        }
    }
}

/// The compact answer to one check of a batch ([`crate::keyed::Store::check_batch_verdicts`]):
/// 8 bytes, the outcome and one time — for a denial, when to retry; for an admission, a
/// shaper's delay. What a batch of requests needs to answer them, without the `remaining` and
/// `reset_after` a [`Decision`] also carries (which cost a division per check, and whose
/// 56 bytes the store writes per key).
///
/// Times of 2^61 − 1 ns (73 years) or more read as 2^61 − 1 ns.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Verdict(u64);

impl Verdict {
    const TIME_BITS: u32 = 61;
    const TIME_MAX: u64 = (1 << Self::TIME_BITS) - 1;

    /// Admitted, no delay: the all-zero word.
    pub const ALLOWED: Verdict = Verdict(0);

    #[inline]
    fn code(o: Outcome) -> u64 {
        match o {
            Outcome::Allowed => 0,
            Outcome::Limited => 1,
            Outcome::NeverFits => 2,
            Outcome::StoreFull => 3,
            Outcome::Untracked => 4,
        }
    }

    /// What happened.
    #[inline]
    pub fn outcome(self) -> Outcome {
        match self.0 >> Self::TIME_BITS {
            0 => Outcome::Allowed,
            1 => Outcome::Limited,
            2 => Outcome::NeverFits,
            3 => Outcome::StoreFull,
            _ => Outcome::Untracked,
        }
    }

    /// Whether the request may go on (as [`Decision::allowed`]).
    #[inline]
    pub fn allowed(self) -> bool {
        matches!(self.outcome(), Outcome::Allowed | Outcome::Untracked)
    }

    /// When denied and retrying can help: nanoseconds to wait (as [`Decision::retry_after_ns`]).
    #[inline]
    pub fn retry_after_ns(self) -> Option<u64> {
        (!self.allowed() && self.0 & Self::TIME_MAX != 0).then(|| (self.0 & Self::TIME_MAX) - 1)
    }

    /// For a shaping leaky bucket: how long the admitted request should wait (as
    /// [`Decision::delay_ns`]); 0 otherwise.
    #[inline]
    pub fn delay_ns(self) -> u64 {
        if self.allowed() {
            self.0 & Self::TIME_MAX
        } else {
            0
        }
    }
}

impl From<&Decision> for Verdict {
    /// The outcome and its time: `retry_after_ns` of a denial, `delay_ns` of an admission.
    #[inline]
    fn from(d: &Decision) -> Self {
        Verdict::of_parts(d.outcome, d.retry_after_ns, d.delay_ns)
    }
}

impl Verdict {
    /// The verdict of a decision given by the only fields it keeps (so that a caller need not
    /// build the rest: `remaining`, `reset_after`).
    #[inline]
    pub(crate) fn of_parts(outcome: Outcome, retry_after_ns: Option<u64>, delay_ns: u64) -> Self {
        let allowed = matches!(outcome, Outcome::Allowed | Outcome::Untracked);
        let time = if allowed {
            delay_ns.min(Self::TIME_MAX)
        } else {
            // 0 is "no retry": a retry time is stored plus one.
            retry_after_ns.map_or(0, |r| r.saturating_add(1).min(Self::TIME_MAX))
        };
        Verdict(Self::code(outcome) << Self::TIME_BITS | time)
    }
}

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verdict")
            .field("outcome", &self.outcome())
            .field("retry_after_ns", &self.retry_after_ns())
            .field("delay_ns", &self.delay_ns())
            .finish()
    }
}

/// A limit that cannot be built as asked. Says what, the value, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The parameter at fault (`limit`, `window`, `burst`, ...).
    pub field: &'static str,
    /// The whole message: what is wrong and how to fix it.
    pub message: String,
}

impl ConfigError {
    /// An error about `field`; `message` says what is wrong and how to fix it (for backends
    /// and services that check limits further, e.g. the ranges a Redis script computes).
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(outcome: Outcome, retry: Option<u64>, delay: u64) -> Decision {
        Decision {
            outcome,
            limit: 10,
            remaining: 3,
            reset_after_ns: 7,
            retry_after_ns: retry,
            delay_ns: delay,
        }
    }

    #[test]
    fn a_verdict_keeps_the_outcome_and_its_time() {
        let max = (1u64 << 61) - 1;
        for (o, retry, delay) in [
            (Outcome::Allowed, None, 0),
            (Outcome::Allowed, None, 12_345),
            (Outcome::Allowed, None, u64::MAX),
            (Outcome::Untracked, None, 0),
            (Outcome::Limited, Some(0), 0),
            (Outcome::Limited, Some(1), 0),
            (Outcome::Limited, Some(max - 1), 0),
            (Outcome::Limited, Some(u64::MAX), 0),
            (Outcome::NeverFits, None, 0),
            (Outcome::StoreFull, Some(1_000_000), 0),
            (Outcome::StoreFull, None, 0),
        ] {
            let d = decision(o, retry, delay);
            let v = Verdict::from(&d);
            assert_eq!(v.outcome(), o, "{d:?}");
            assert_eq!(v.allowed(), d.allowed());
            assert_eq!(v.retry_after_ns(), retry.map(|r| r.min(max - 1)), "{d:?}");
            assert_eq!(v.delay_ns(), delay.min(max), "{d:?}");
        }
        assert_eq!(
            Verdict::from(&decision(Outcome::Allowed, None, 0)),
            Verdict::ALLOWED
        );
        assert_eq!(std::mem::size_of::<Verdict>(), 8);
    }

    #[test]
    fn wire_units_round_up() {
        let d = |retry: Option<u64>, reset: u64| Decision {
            reset_after_ns: reset,
            ..decision(Outcome::Limited, retry, 0)
        };
        for (ns, secs, ms) in [
            (0, 1, 0),
            (1, 1, 1),
            (999_999, 1, 1),
            (1_000_000, 1, 1),
            (1_000_000_001, 2, 1001),
            (60_000_000_000, 60, 60_000),
            (
                u64::MAX,
                u64::MAX.div_ceil(1_000_000_000),
                u64::MAX.div_ceil(1_000_000),
            ),
        ] {
            let x = d(Some(ns), ns);
            assert_eq!(x.retry_after_secs_ceil(), Some(secs), "{ns}");
            assert_eq!(x.retry_after_ms_ceil(), Some(ms), "{ns}");
            assert_eq!(
                x.reset_after_secs_ceil(),
                if ns == 0 { 0 } else { secs },
                "{ns}"
            );
            assert_eq!(x.reset_after_ms_ceil(), ms, "{ns}");
        }
        assert_eq!(d(None, 0).retry_after_secs_ceil(), None);
        assert_eq!(d(None, 0).retry_after_ms_ceil(), None);
        let mut unlimited = d(None, 0);
        (unlimited.limit, unlimited.remaining) = (u64::MAX, u64::MAX);
        assert!(!unlimited.has_limit());
        assert_eq!(unlimited.limit_or_minus_one(), -1);
        assert_eq!(unlimited.remaining_or_minus_one(), -1);
        let limited = d(None, 0);
        assert!(limited.has_limit());
        assert_eq!(
            (
                limited.limit_or_minus_one(),
                limited.remaining_or_minus_one()
            ),
            (10, 3)
        );
    }
}
