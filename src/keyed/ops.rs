//! What the store does to one key's record, as operations the table runs ([`Op`]): check,
//! evaluate, refund, settle, acquire and release a permit, export and import a record.
//!
//! Each is written once over [`Cells`], so the same code runs on a packed slot's state (one
//! word) and on an arena record's words; the table decides which, and owns the loop around it.
//! What decides a record is the store's own limits or a packed limit given with the check
//! ([`Decides`]).

use super::table::{Op, Refusal, RECLAIM_GRACE_NS};
use crate::algo::{concurrency, Cells, Limit, LimitPeek, Limits};
use crate::clock::Nanos;
use crate::decision::{Decision, Outcome};

/// What decides a record: the store's [`Limits`], or one [`Limit`] given with a check.
pub(crate) trait Decides {
    /// Decides (and records) a request of `cost` at `now`.
    fn decide<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, cost: u64) -> Decision;
    /// What `decide` would answer, recording nothing.
    fn evaluate<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, cost: u64) -> Decision;
    /// Each limit's view of the record, recording nothing ([`Limits::inspect`]).
    fn inspect<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, cost: u64) -> Vec<LimitPeek>;
    /// Gives `n` back.
    fn refund<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, n: u64);
    /// Takes `n` whatever the limits hold.
    fn charge<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, n: u64);
    /// Nanoseconds until the record is equivalent to a fresh one.
    fn idle_in<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos) -> u64;
    /// The `limit` a refusal reports.
    fn capacity(&self) -> u64;
    /// Words of a record.
    fn words(&self) -> usize;
}

impl Decides for Limits {
    #[inline]
    fn decide<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, cost: u64) -> Decision {
        Limits::decide(self, c, now, cost)
    }
    fn evaluate<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, cost: u64) -> Decision {
        Limits::evaluate(self, c, now, cost)
    }
    fn inspect<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, cost: u64) -> Vec<LimitPeek> {
        Limits::inspect(self, c, now, cost)
    }
    fn refund<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, n: u64) {
        Limits::refund(self, c, now, n)
    }
    fn charge<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, n: u64) {
        Limits::charge(self, c, now, n)
    }
    fn idle_in<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos) -> u64 {
        Limits::idle_in(self, c, now)
    }
    fn capacity(&self) -> u64 {
        self.limits()[0].capacity()
    }
    fn words(&self) -> usize {
        Limits::words(self)
    }
}

/// One limit, as [`Limits`] of that limit alone decides it.
impl Decides for Limit {
    #[inline]
    fn decide<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, cost: u64) -> Decision {
        // A packed transition's new state is written whatever it decided (a denial that
        // records nothing returns the state it was given): `step`'s tests, skipped.
        match self.decide_packed(c.get(0), now, cost) {
            Some((s, d)) => {
                c.set(0, s);
                d
            }
            None => self.step(c, now, cost, true),
        }
    }
    fn evaluate<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, cost: u64) -> Decision {
        self.counting_nothing().step(c, now, cost, false)
    }
    fn inspect<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, cost: u64) -> Vec<LimitPeek> {
        vec![Limit::inspect(self, c, now, cost)]
    }
    fn refund<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, n: u64) {
        Limit::refund(self, c, now, n)
    }
    fn charge<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos, n: u64) {
        Limit::charge(self, c, now, n)
    }
    fn idle_in<C: Cells + ?Sized>(&self, c: &mut C, now: Nanos) -> u64 {
        Limit::idle_in(self, c, now)
    }
    fn capacity(&self) -> u64 {
        Limit::capacity(self)
    }
    fn words(&self) -> usize {
        Limit::words(self)
    }
}

/// Runs `f` on a fresh (all-zero) scratch record of `words` words: what an absent key answers.
pub(crate) fn on_fresh<R>(words: usize, f: impl FnOnce(&mut [u64]) -> R) -> R {
    if words <= 64 {
        let mut w = [0u64; 64];
        f(&mut w[..words])
    } else {
        f(&mut vec![0u64; words])
    }
}

/// The answer when the table refuses a key (see [`Refusal`]). A store that has no room answers
/// `StoreFull` or `Untracked`; a refusal of `StoreFull` carries a retry hint (it is not "never
/// fits"). A key absent before its shard's reclaim horizon is `Limited` until then.
#[cold]
pub(crate) fn refusal<D: Decides + ?Sized>(by: &D, why: Refusal, now: Nanos) -> Decision {
    let (outcome, wait) = match why {
        Refusal::NoRoom(o) => (o, None),
        Refusal::BeforeHorizon(h) => (Outcome::Limited, Some(h.saturating_sub(now).max(1))),
    };
    Decision {
        outcome,
        limit: by.capacity(),
        remaining: 0,
        reset_after_ns: wait.unwrap_or(0),
        retry_after_ns: match outcome {
            Outcome::StoreFull => Some(room_after(by, now)),
            _ => wait,
        },
        delay_ns: 0,
    }
}

/// When a full probe range should have room again: a record made now by one request (a
/// one-shot key of a flood) is reclaimable after this long, the reclaim grace included.
/// Records made earlier free sooner, so it is an upper bound for a flood of one-shot keys; a
/// range full of keys that keep coming back stays full (docs/memory.md).
fn room_after<D: Decides + ?Sized>(by: &D, now: Nanos) -> u64 {
    let idle = on_fresh(by.words(), |c| {
        by.decide(c, now, 1);
        by.idle_in(c, now)
    });
    idle.saturating_add(RECLAIM_GRACE_NS)
}

/// A check of `cost` at `now` (`cost` 0: a peek); `insert`: a new key gets a record.
pub(crate) struct Check<'a, D: ?Sized> {
    pub(crate) by: &'a D,
    pub(crate) now: Nanos,
    pub(crate) cost: u64,
    pub(crate) insert: bool,
}

impl<D: Decides + ?Sized> Op for Check<'_, D> {
    type Out = Decision;
    fn inserts(&self) -> bool {
        self.insert
    }
    #[inline]
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> Decision {
        self.by.decide(rec, self.now, self.cost)
    }
    fn absent(&mut self) -> Decision {
        on_fresh(self.by.words(), |c| self.by.decide(c, self.now, self.cost))
    }
    fn refused(&mut self, why: Refusal) -> Decision {
        refusal(self.by, why, self.now)
    }
}

/// What a check of `cost` at `now` would answer, recording nothing and inserting nothing.
pub(crate) struct Evaluate<'a, D: ?Sized> {
    pub(crate) by: &'a D,
    pub(crate) now: Nanos,
    pub(crate) cost: u64,
}

impl<D: Decides + ?Sized> Op for Evaluate<'_, D> {
    type Out = Decision;
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> Decision {
        self.by.evaluate(rec, self.now, self.cost)
    }
    fn absent(&mut self) -> Decision {
        on_fresh(self.by.words(), |c| {
            self.by.evaluate(c, self.now, self.cost)
        })
    }
    fn refused(&mut self, why: Refusal) -> Decision {
        refusal(self.by, why, self.now)
    }
}

/// [`Evaluate`] with each limit's view ([`Decides::inspect`]), for explanations: one visit
/// of the record, so that the decision and the views agree.
pub(crate) struct Inspect<'a, D: ?Sized> {
    pub(crate) by: &'a D,
    pub(crate) now: Nanos,
    pub(crate) cost: u64,
}

impl<D: Decides + ?Sized> Op for Inspect<'_, D> {
    type Out = (Decision, Vec<LimitPeek>);
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> Self::Out {
        let d = self.by.evaluate(rec, self.now, self.cost);
        (d, self.by.inspect(rec, self.now, self.cost))
    }
    fn absent(&mut self) -> Self::Out {
        on_fresh(self.by.words(), |c| self.apply(c))
    }
    fn refused(&mut self, why: Refusal) -> Self::Out {
        // No record to look at: what the table answers, as every limit's view.
        let d = refusal(self.by, why, self.now);
        let views = on_fresh(self.by.words(), |c| self.by.inspect(c, self.now, self.cost));
        let views = views
            .into_iter()
            .map(|v| LimitPeek {
                held: d,
                asked: d,
                ..v
            })
            .collect();
        (d, views)
    }
}

/// Gives `n` back at `now` (nothing to give back to an absent key).
pub(crate) struct Refund<'a, D: ?Sized> {
    pub(crate) by: &'a D,
    pub(crate) now: Nanos,
    pub(crate) n: u64,
}

impl<D: Decides + ?Sized> Op for Refund<'_, D> {
    type Out = ();
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) {
        self.by.refund(rec, self.now, self.n)
    }
    fn absent(&mut self) {}
    fn refused(&mut self, _: Refusal) {}
}

/// Settles a cost checked as `reserved` at `actual`: the difference charged
/// ([`Limits::charge`]) or given back ([`Limits::refund`]). A charge creates an
/// absent key's record (a key evicted since its check still owes the difference); a refund of
/// an absent key has nothing to give back. Whether the record was settled (`false`: absent
/// with nothing to charge, or refused by a full store).
pub(crate) struct Settle<'a, D: ?Sized> {
    pub(crate) by: &'a D,
    pub(crate) now: Nanos,
    pub(crate) reserved: u64,
    pub(crate) actual: u64,
}

impl<D: Decides + ?Sized> Op for Settle<'_, D> {
    type Out = bool;
    fn inserts(&self) -> bool {
        self.actual > self.reserved
    }
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> bool {
        if self.actual > self.reserved {
            self.by.charge(rec, self.now, self.actual - self.reserved);
        } else if self.actual < self.reserved {
            self.by.refund(rec, self.now, self.reserved - self.actual);
        }
        true
    }
    fn absent(&mut self) -> bool {
        false
    }
    fn refused(&mut self, _: Refusal) -> bool {
        false
    }
}

/// Takes `cost` of a concurrency limit's permits at `now`: the decision, and the lease's stamp
/// if one was taken.
pub(crate) struct Acquire<'a> {
    pub(crate) p: &'a concurrency::Params,
    pub(crate) now: Nanos,
    pub(crate) cost: u64,
}

impl Op for Acquire<'_> {
    type Out = (Decision, Option<u64>);
    fn inserts(&self) -> bool {
        self.cost > 0
    }
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> Self::Out {
        concurrency::acquire(rec, self.now, self.p, self.cost, true)
    }
    fn absent(&mut self) -> Self::Out {
        on_fresh(self.p.words(), |c| {
            concurrency::acquire(c, self.now, self.p, self.cost, false)
        })
    }
    fn refused(&mut self, why: Refusal) -> Self::Out {
        (refusal(&Limit::Concurrency(*self.p), why, self.now), None)
    }
}

/// Frees the lease `stamp` of a concurrency limit (a no-op if it expired and was reused).
pub(crate) struct Release<'a> {
    pub(crate) p: &'a concurrency::Params,
    pub(crate) stamp: u64,
}

impl Op for Release<'_> {
    type Out = ();
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) {
        concurrency::release(rec, self.p, self.stamp);
    }
    fn absent(&mut self) {}
    fn refused(&mut self, _: Refusal) {}
}

/// Copies a record's `words` words into `into`, changing nothing; whether the key has one.
pub(crate) struct Export<'a> {
    pub(crate) words: usize,
    pub(crate) into: &'a mut Vec<u64>,
}

impl Op for Export<'_> {
    type Out = bool;
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> bool {
        self.into.clear();
        self.into.extend((0..self.words).map(|i| rec.get(i)));
        true
    }
    fn absent(&mut self) -> bool {
        false
    }
    fn refused(&mut self, _: Refusal) -> bool {
        false
    }
}

/// Sets a record to `words`, inserting it if absent; whether it is stored.
pub(crate) struct Import<'a> {
    pub(crate) words: &'a [u64],
}

impl Op for Import<'_> {
    type Out = bool;
    fn inserts(&self) -> bool {
        true
    }
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> bool {
        for (i, &w) in self.words.iter().enumerate() {
            rec.set(i, w);
        }
        true
    }
    fn absent(&mut self) -> bool {
        false
    }
    fn refused(&mut self, _: Refusal) -> bool {
        false
    }
}
