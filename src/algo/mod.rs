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

mod limit;
mod limits;

pub(crate) use limit::{limit_in, window_at_least_1ns};
pub use limit::{Limit, LimitSpec};
pub use limits::{LimitPeek, Limits};

use crate::decision::Decision;
use std::fmt;
use std::str::FromStr;

/// A record of `u64` words, read and written by the variable-size algorithms.
pub trait Cells {
    /// Word `i`.
    fn get(&self, i: usize) -> u64;
    /// Sets word `i`.
    fn set(&mut self, i: usize, v: u64);
}

/// A slice or an array of words is a record (`$n`: an array's length).
macro_rules! words {
    ($($t:ty $(, $n:ident)?);*) => {$(
        impl$(<const $n: usize>)? Cells for $t {
            #[inline]
            fn get(&self, i: usize) -> u64 {
                self[i]
            }
            #[inline]
            fn set(&mut self, i: usize, v: u64) {
                self[i] = v;
            }
        }
    )*};
}
words!([u64]; [u64; N], N);

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
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Self, crate::UnknownName> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                crate::UnknownName::new("algorithm", s, format!("one of {}", names.join(", ")))
            })
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

#[cfg(test)]
mod lists;
