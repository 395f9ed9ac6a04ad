//! The keyless ("direct") limiter: one record, updated with compare-and-swap.
//!
//! | limits | record | protocol |
//! |---|---|---|
//! | one packed (fixed_window, sliding_window, token_bucket, leaky_bucket) | 8 bytes | CAS on an `AtomicU64` |
//! | two packed | 16 bytes | CAS on an `AtomicU128` (`cmpxchg16b`), all-or-nothing |
//! | otherwise (sliding_log, window_ring, concurrency, 3+ limits) | 8 + 8 × words | sequence word (`record`) |
//!
//! Sizes of the variable records: sliding_log 16 + 4 × limit bytes, window_ring 8 + 8 ×
//! ⌈(N + 1) / ⌊64/w⌋⌉, concurrency 8 × limit.

use crate::algo::{with_packed, Cells, Limit, Limits, Packed, PackedFn};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::record::{self, AtomicCells};
use crate::sync::{AtomicU128, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

enum State {
    One(CachePadded<AtomicU64>),
    Two(CachePadded<AtomicU128>),
    Words {
        seq: CachePadded<AtomicU64>,
        words: Box<[AtomicU64]>,
    },
}

/// A rate limiter for one key (or for everything at once).
pub struct Limiter<C: Clock = DefaultClock> {
    limits: Limits,
    state: State,
    clock: C,
}

impl Limiter<DefaultClock> {
    /// One limit, on the default clock ([`DefaultClock`]).
    pub fn new(limit: Limit) -> Self {
        Self::with_limits(
            Limits::new(vec![limit]).expect("one limit is valid"),
            DefaultClock::new(),
        )
    }
}

impl<C: Clock> Limiter<C> {
    /// Any limits (all-or-nothing) on any clock.
    pub fn with_limits(limits: Limits, clock: C) -> Self {
        let packed = limits.limits().iter().all(|l| l.algorithm().is_packed());
        let state = match limits.limits().len() {
            1 if packed => State::One(CachePadded::new(AtomicU64::new(0))),
            2 if packed => State::Two(CachePadded::new(AtomicU128::new(0))),
            _ => State::Words {
                seq: CachePadded::new(AtomicU64::new(0)),
                words: (0..limits.words()).map(|_| AtomicU64::new(0)).collect(),
            },
        };
        Self {
            limits,
            state,
            clock,
        }
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Checks a request of `cost` now. Cost 0 peeks.
    #[inline]
    pub fn check(&self, cost: u64) -> Decision {
        self.check_at(cost, self.clock.now())
    }

    /// Looks without consuming.
    pub fn peek(&self) -> Decision {
        self.check(0)
    }

    /// Checks a request of `cost` at `now` (the caller's clock reading).
    #[inline]
    pub fn check_at(&self, cost: u64, now: Nanos) -> Decision {
        match &self.state {
            State::One(a) => {
                // One copy of the CAS loop per packed algorithm, its transition inlined.
                struct One<'a> {
                    a: &'a AtomicU64,
                    now: Nanos,
                    cost: u64,
                }
                impl PackedFn<Decision> for One<'_> {
                    #[inline(always)]
                    fn call<P: Packed>(self, p: &P) -> Decision {
                        // Relaxed: the CAS below validates whatever this read.
                        let mut cur = self.a.load(Ordering::Relaxed);
                        loop {
                            let (new, d) = p.decide(cur, self.now, self.cost);
                            if new == cur {
                                return d;
                            }
                            // AcqRel/Acquire: the record is the only shared datum; acquiring
                            // the previous writer's value keeps each transition applied to the
                            // latest state.
                            match self.a.compare_exchange_weak(
                                cur,
                                new,
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            ) {
                                Ok(_) => return d,
                                Err(x) => cur = x,
                            }
                        }
                    }
                }
                with_packed(&self.limits.limits()[0], One { a, now, cost })
                    .expect("a one-word record holds a packed limit")
            }
            State::Two(a) => {
                // Relaxed: validated by the CAS.
                let mut cur = a.load(Ordering::Relaxed);
                loop {
                    let mut w = [cur as u64, (cur >> 64) as u64];
                    let d = self.limits.decide(&mut w[..], now, cost);
                    let new = w[0] as u128 | (w[1] as u128) << 64;
                    if new == cur {
                        return d;
                    }
                    // AcqRel/Acquire: as for one limit.
                    match a.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => return d,
                        Err(x) => cur = x,
                    }
                }
            }
            State::Words { seq, words } => {
                record::write(seq, words, |c| self.limits.decide(c, now, cost))
            }
        }
    }

    /// Gives `n` back (after a request that did not use its quota).
    pub fn refund(&self, n: u64) {
        let now = self.clock.now();
        self.update(|c| self.limits.refund(c, now, n));
    }

    /// Back to the fresh state.
    pub fn reset(&self) {
        self.update(|c| {
            for i in 0..self.limits.words() {
                c.set(i, 0)
            }
        });
    }

    fn update(&self, f: impl Fn(&mut dyn Cells)) {
        match &self.state {
            State::One(a) => {
                let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                    let mut w = [cur];
                    f(&mut w);
                    Some(w[0])
                });
            }
            State::Two(a) => {
                // Relaxed: validated by the CAS.
                let mut cur = a.load(Ordering::Relaxed);
                loop {
                    let mut w = [cur as u64, (cur >> 64) as u64];
                    f(&mut w);
                    let new = w[0] as u128 | (w[1] as u128) << 64;
                    // AcqRel/Acquire: as in `check_at`.
                    match a.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => return,
                        Err(x) => cur = x,
                    }
                }
            }
            State::Words { seq, words } => {
                record::write(seq, words, |c: &mut AtomicCells<'_>| f(c))
            }
        }
    }

    /// For a concurrency limit: takes `cost` permits, released when the [`Permit`] drops (or
    /// when its lease expires). Any other limit answers with its decision and a permit that
    /// releases nothing.
    pub fn acquire(&self, cost: u64) -> Result<Permit<'_, C>, Decision> {
        let now = self.clock.now();
        // A concurrency limit takes a lease in its record; any other limit is a plain check.
        let (d, stamp) = match (&self.limits.limits()[0], &self.state) {
            (Limit::Concurrency(p), State::Words { seq, words }) => {
                record::write(seq, words, |c| {
                    crate::algo::concurrency::acquire(c, now, p, cost, true)
                })
            }
            _ => (self.check_at(cost, now), None),
        };
        if d.allowed() {
            Ok(Permit {
                limiter: self,
                stamp,
                decision: d,
            })
        } else {
            Err(d)
        }
    }
}

/// In-flight capacity held until dropped (see [`Limiter::acquire`]).
pub struct Permit<'a, C: Clock> {
    limiter: &'a Limiter<C>,
    stamp: Option<u64>,
    decision: Decision,
}

impl<C: Clock> Permit<'_, C> {
    /// The decision that granted it.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl<C: Clock> Drop for Permit<'_, C> {
    fn drop(&mut self) {
        if let (Some(stamp), State::Words { seq, words }, Limit::Concurrency(p)) = (
            self.stamp,
            &self.limiter.state,
            &self.limiter.limits.limits()[0],
        ) {
            record::write(seq, words, |c| {
                crate::algo::concurrency::release(c, p, stamp)
            });
        }
    }
}
