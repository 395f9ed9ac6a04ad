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
