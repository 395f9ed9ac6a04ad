//! # turnstile
//!
//! A lock-free rate-limiting engine. Each algorithm is a pure transition over a packed record
//! ([`algo`]); a keyless [`Limiter`] updates one record with compare-and-swap; the keyed
//! [`keyed::Store`] keeps millions of keys in thread-per-core shards of 16-byte slots under a
//! memory budget.
//!
//! ```
//! use std::time::Duration;
//! use turnstile::{Limit, Limiter};
//!
//! // 15 requests per second for customer A, in a token bucket with a burst of 15.
//! let limiter = Limiter::new(Limit::token_bucket(15, 15, Duration::from_secs(1)).unwrap());
//! let admitted = (0..20).filter(|_| limiter.check(1).allowed()).count();
//! assert_eq!(admitted, 15);
//! let d = limiter.check(1);
//! assert!(!d.allowed());
//! assert!(d.retry_after().unwrap() <= Duration::from_millis(67));
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod algo;
pub mod clock;
mod decision;
pub mod keyed;
mod limiter;
pub(crate) mod record;
#[cfg(feature = "rules")]
pub mod rules;
pub(crate) mod sync;

pub use algo::{Algorithm, Limit, LimitSpec, Limits};
#[cfg(feature = "coarse-clock")]
pub use clock::CoarseClock;
pub use clock::{Clock, DefaultClock, ManualClock, MonotonicClock, Nanos, TscClock};
pub use decision::{ConfigError, Decision, Outcome, Verdict};
pub use limiter::{Limiter, Permit};
