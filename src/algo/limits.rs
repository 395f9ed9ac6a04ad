//! [`Limits`]: several limits on one key, decided all-or-nothing over one record.

use super::{Algorithm, Cells, Limit, Sub};
use crate::decision::{ConfigError, Decision, Outcome};

/// One limit's view of a record ([`Limits::inspect`]), recording nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitPeek {
    /// The limit's algorithm.
    pub algorithm: Algorithm,
    /// What the limit holds now (a request of cost 0): its `limit`, `remaining` and
    /// `reset_after_ns`.
    pub held: Decision,
    /// What it answers a request of the asked cost, alone (a denial not counted): whether it
    /// admits, what would remain, when it would admit.
    pub asked: Decision,
}

impl Limit {
    /// This limit's [`LimitPeek`] of record `c` for a request of `cost` at `now`.
    pub fn inspect<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64) -> LimitPeek {
        let quiet = self.counting_nothing();
        LimitPeek {
            algorithm: self.algorithm(),
            held: quiet.step(c, now, 0, false),
            asked: quiet.step(c, now, cost, false),
        }
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

    /// Each limit's own view of the record, in order, recording nothing: what it holds (a
    /// peek: cost 0) and what it answers a request of `cost` (a denial not counted). For
    /// explanations, off the check path: it allocates the list.
    pub fn inspect<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64) -> Vec<LimitPeek> {
        self.limits
            .iter()
            .zip(self.offsets.iter())
            .map(|(l, &off)| l.inspect(&mut Sub { c: &mut *c, off }, now, cost))
            .collect()
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

    /// Takes `n` on every limit whatever they hold ([`Limit::charge`]).
    pub fn charge<C: Cells + ?Sized>(&self, c: &mut C, now: u64, n: u64) {
        for (l, &off) in self.limits.iter().zip(self.offsets.iter()) {
            l.charge(&mut Sub { c: &mut *c, off }, now, n);
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
