//! # turnstile
//!
//! A lock-free rate-limiting engine: "15 requests per second for customer A", "500 per hour",
//! "10 per minute and 2 s apart", decided in nanoseconds for millions of keys, on every core at
//! once. Each algorithm is a pure transition over a packed record ([`algo`]); a keyless
//! [`Limiter`] updates one record with compare-and-swap; the keyed [`keyed::Store`] keeps
//! millions of keys in thread-per-core shards of 16-byte slots under a fixed memory budget.
//!
//! ```
//! use std::time::Duration;
//! use turnstile::keyed::Store;
//! use turnstile::{Limit, Limiter, Outcome};
//!
//! // One global limit: 15 requests per second, a burst of 15.
//! let limiter = Limiter::new(Limit::token_bucket(15, 15, Duration::from_secs(1)).unwrap());
//! let admitted = (0..20).filter(|_| limiter.check(1).allowed()).count();
//! assert_eq!(admitted, 15);
//! let d = limiter.check(1);
//! assert_eq!(d.outcome, Outcome::Limited);
//! assert!(d.retry_after().unwrap() <= Duration::from_millis(67)); // HTTP 429, Retry-After
//!
//! // The same limit per customer, IP address or API key: room for 100 000 keys.
//! let store = Store::with_capacity(Limit::token_bucket(15, 15, Duration::from_secs(1)).unwrap(), 100_000)
//!     .unwrap();
//! assert!(store.check(&241_531u64, 1).allowed());
//! assert!(store.check("api-key-6f1d", 15).allowed());
//! assert!(!store.check("api-key-6f1d", 1).allowed()); // its burst is spent; 241531's is not
//! assert_eq!(store.check(&241_531u64, 1).remaining, 13);
//! ```
//!
//! Where to go next: [`Limits`] (several limits on one key, all-or-nothing), [`keyed`] (the
//! store, its memory and its full-store policy), `rules` (a TOML rules file per customer,
//! IP, API key, route and priority, hot-reloaded; feature `rules`, on by default), [`clock`].
//! The tower/axum layer is the crate `turnstile-tower`, the service `turnstile-server`, the
//! same algorithms on Redis `turnstile-redis`.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod algo;
pub mod clock;
mod decision;
pub mod keyed;
mod limiter;
mod name;
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
pub use name::UnknownName;
