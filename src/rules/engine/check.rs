//! The check and `explain`: every matching enforcing rule in order, consume then refund on a
//! denial, then the shadow rules.

use super::{Engine, Verdict, UNLIMITED};
use crate::clock::{Clock, Nanos};
use crate::decision::{Decision, Outcome};
use crate::rules::compile::{
    CRule, Compiled, Kind, Slot, DENIED, ELASTIC, L_ADMITTED, L_DENIED, L_SHADOW, OVER, WOULD,
};
use crate::rules::matcher::{sel, Cand};
use crate::rules::model::{Shedding, MAX_RULES};
use crate::rules::request::{method_slot, Priority, Request};

/// What [`Engine::explain`] adds to a decision.
#[derive(Default)]
struct Why {
    rule: Option<u32>,
    shed: bool,
    matched: u32,
    would_deny: u32,
}

/// What a check notes down along the way: nothing for [`Engine::check`] ([`Quiet`], compiled
/// away), a [`Why`] for [`Engine::explain`], every rule's step for [`Engine::trace_at`].
/// Rules are named by their index in the compiled rules.
pub(super) trait Track {
    /// Whether the check takes the general path (every candidate of the route, filtered by
    /// its mask, the method always parsed) rather than the precomputed fast paths.
    const GENERAL: bool = false;
    fn shed(&mut self) {}
    /// An enforcing rule admitted (`pooled`: from its elastic pool).
    fn matched(&mut self, _rule: u32, _pooled: bool) {}
    /// An enforcing rule denied; `d` is the answer.
    fn denied(&mut self, _rule: u32, _d: &Decision) {}
    /// A shadow rule would have denied (`d`: its decision).
    fn would_deny(&mut self, _rule: u32, _d: &Decision) {}
    /// A shadow rule would have admitted.
    fn would_admit(&mut self, _rule: u32) {}
}

/// Notes nothing.
pub(super) struct Quiet;

/// What one enforcing rule did with a request ([`Engine::apply`]).
enum Step {
    /// The request lacks a part of the rule's key: the rule does not apply.
    Skipped,
    /// Admitted by the rule's limits.
    Admitted,
    /// Admitted by an elastic rule's extra pool.
    Pooled,
    /// Denied; nothing taken.
    Denied,
}

impl Track for Quiet {}

/// Notes the rule that denied, on every path, the fast ones included ([`Engine::try_admit_owned`]).
#[derive(Default)]
pub(super) struct Denier {
    pub(super) rule: Option<u32>,
}

impl Track for Denier {
    fn denied(&mut self, rule: u32, _d: &Decision) {
        self.rule = Some(rule);
    }
}

impl Track for Why {
    const GENERAL: bool = true;
    fn shed(&mut self) {
        self.shed = true;
    }
    fn matched(&mut self, _rule: u32, _pooled: bool) {
        self.matched += 1;
    }
    fn denied(&mut self, rule: u32, _d: &Decision) {
        self.rule = Some(rule);
    }
    fn would_deny(&mut self, _rule: u32, _d: &Decision) {
        self.would_deny += 1;
    }
}

/// Words of the bit set of candidates whose elastic pool took the cost, when some route has
/// more than 64 enforcing candidates.
const WIDE: usize = MAX_RULES.div_ceil(64);

pub(super) fn shed_decision(s: &Shedding) -> Decision {
    let ns = crate::clock::nanos(s.retry_after);
    Decision {
        outcome: Outcome::Limited,
        limit: 0,
        remaining: 0,
        reset_after_ns: ns,
        retry_after_ns: Some(ns),
        delay_ns: 0,
    }
}

/// A soft rule's decision `d` from its store (built on the scaled limits) as reported: against
/// the nominal limit (`nominal`: (scaled, nominal) capacity per limit), and whether it was
/// admitted inside the tolerance band.
#[inline]
pub(super) fn soft_view(nominal: &[(u64, u64)], mut d: Decision) -> (Decision, bool) {
    let mut over = false;
    if let Some(&(scaled, nominal)) = nominal.iter().find(|(s, _)| *s == d.limit) {
        let band = scaled - nominal;
        over = d.allowed() && d.remaining < band;
        d.limit = nominal;
        d.remaining = d.remaining.saturating_sub(band);
    }
    (d, over)
}

/// A rule's decision `d` from its own limits (or its key's override's), by its mode, before
/// any elastic pool: `Ok` with the decision it contributes, `Err` with the denial. A soft rule
/// is reported against its nominal limit, and an admission inside its tolerance band is
/// counted (in the counters' shard `shard`, asked only then).
#[inline]
pub(in crate::rules) fn by_mode<C: Clock>(
    r: &CRule<C>,
    slot: &Slot<C>,
    d: Decision,
    shard: impl FnOnce() -> usize,
) -> Result<Decision, Decision> {
    let d = match r.kind {
        Kind::Soft => {
            let (d, over) = soft_view(&slot.nominal, d);
            if over {
                r.counters.add(shard(), OVER);
            }
            d
        }
        Kind::Hard | Kind::Shadow | Kind::Elastic { .. } => d,
    };
    if d.allowed() {
        Ok(d)
    } else {
        Err(d)
    }
}

/// Whether admission `d` left less than `below` (1 − the near-limit share) of its limit.
#[inline(always)]
pub(in crate::rules) fn near(d: &Decision, below: f64) -> bool {
    (d.remaining as f64) < below * d.limit as f64
}

/// An elastic rule's admission by its extra pool: its own limits' denial `d`, the pool's
/// admission `e`.
#[inline]
pub(in crate::rules) fn pooled(d: &Decision, e: &Decision) -> Decision {
    Decision {
        outcome: e.outcome,
        limit: d.limit,
        remaining: 0,
        reset_after_ns: d.reset_after_ns.max(e.reset_after_ns),
        retry_after_ns: None,
        delay_ns: e.delay_ns,
    }
}

/// Two admitting rules' decisions as one, in place: the tighter remainder, the later reset
/// and delay.
#[inline]
pub(in crate::rules) fn merge(a: &mut Decision, d: &Decision) {
    let reset = a.reset_after_ns.max(d.reset_after_ns);
    let delay = a.delay_ns.max(d.delay_ns);
    if d.remaining < a.remaining {
        *a = *d;
    }
    a.reset_after_ns = reset;
    a.delay_ns = delay;
}

impl<C: Clock> Engine<C> {
    /// [`Engine::check`], saying which rule denied and whether the request was shed.
    pub fn explain(&self, req: &Request<'_>) -> Verdict {
        self.explain_at(req, self.clock.now())
    }

    /// [`Engine::explain`] at `now`.
    pub fn explain_at(&self, req: &Request<'_>, now: Nanos) -> Verdict {
        let c = self.current.load();
        let mut why = Why::default();
        let decision = self.eval_in(&c, req, now, &mut why);
        Verdict {
            decision,
            rule: why
                .rule
                .and_then(|i| c.rules.get(i as usize))
                .map(|r| r.name.clone()),
            shed: why.shed,
            matched: why.matched,
            would_deny: why.would_deny,
        }
    }

    #[inline]
    pub(super) fn eval(&self, req: &Request<'_>, now: Nanos) -> Decision {
        let c = self.current.load();
        self.eval_in(&c, req, now, &mut Quiet)
    }

    /// The check: the decision, and in `why` the rule that denied and the counts.
    #[inline]
    pub(super) fn eval_in<T: Track>(
        &self,
        c: &Compiled<C>,
        req: &Request<'_>,
        now: Nanos,
        why: &mut T,
    ) -> Decision {
        if c.wide {
            self.eval_n::<T, WIDE>(c, req, now, why)
        } else {
            self.eval_n::<T, 1>(c, req, now, why)
        }
    }

    /// [`Engine::eval_in`] with a `W`-word bit set of the candidates whose elastic pool took
    /// the cost (to refund the right store): one word unless some route has more than 64
    /// enforcing candidates.
    #[inline]
    fn eval_n<T: Track, const W: usize>(
        &self,
        c: &Compiled<C>,
        req: &Request<'_>,
        now: Nanos,
        why: &mut T,
    ) -> Decision {
        let mut load = 0.0;
        let (cands, sel) = if c.needs_load || T::GENERAL {
            let m = method_slot(req.method);
            let prio = match req.priority {
                Some(p) => p,
                None => Priority::of_method_index(m),
            };
            if c.needs_load {
                match self.load_or_shed(c, prio, now) {
                    Ok(l) => load = l,
                    Err(d) => {
                        why.shed();
                        return d;
                    }
                }
            }
            (c.routes.candidates(req.route), sel(m, prio))
        } else {
            let cands = c.routes.candidates(req.route);
            // No shedding, and every candidate of the route admits every method and
            // priority: neither needs to be known (any `sel` picks the same list).
            if cands.uniform {
                (cands, 0)
            } else {
                let m = method_slot(req.method);
                let prio = match req.priority {
                    Some(p) => p,
                    None => Priority::of_method_index(m),
                };
                (cands, sel(m, prio))
            }
        };
        // `explain` walks the full candidate lists, testing each one's mask: the reference
        // the filtered lists and the single-rule path are tested against.
        let (enforce, shadow) = if T::GENERAL {
            (&*cands.enforce, &*cands.shadow)
        } else {
            // One rule: its index straight from the route's entry (no list to reach).
            if let Some(rule) = cands.single(sel) {
                return self.single(c, rule, req, now, load, sel, why);
            }
            let p = cands.picked(sel);
            (&*p.enforce, &*p.shadow)
        };
        let mut acc = UNLIMITED;
        let mut pooled = [0u64; W];
        for (k, cand) in enforce.iter().enumerate() {
            if !cand.admits(sel) {
                continue;
            }
            match self.apply(&c.rules[cand.rule as usize], req, now, load, &mut acc) {
                Step::Skipped => {}
                Step::Admitted => why.matched(cand.rule, false),
                Step::Pooled => {
                    pooled[k / 64] |= 1 << (k % 64);
                    why.matched(cand.rule, true);
                }
                Step::Denied => {
                    self.deny(c, req, &enforce[..k], now, &pooled, sel, cand.rule);
                    self.latest(c, req, &enforce[k + 1..], sel, now, load, &mut acc);
                    why.denied(cand.rule, &acc);
                    // `apply` left the denial in `acc`.
                    return acc;
                }
            }
        }
        if !shadow.is_empty() {
            self.shadow(c, req, shadow, sel, now, why);
        }
        acc
    }

    /// The check when exactly one enforcing rule, and no shadow rule, can apply to the
    /// request (`Picked::single`): no loop, no refund, no pool bookkeeping.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn single<T: Track>(
        &self,
        c: &Compiled<C>,
        rule: u32,
        req: &Request<'_>,
        now: Nanos,
        load: f64,
        sel: u32,
        why: &mut T,
    ) -> Decision {
        let r = &c.rules[rule as usize];
        let Some(id) = r.plan.id(req, &self.hasher) else {
            return UNLIMITED;
        };
        let cost = req.cost.saturating_mul(r.cost);
        let t = r.target(id);
        let d = t.check_at(id, cost, now);
        let raw = d.limit;
        let d = if matches!(r.kind, Kind::Hard) && d.allowed() {
            d
        } else {
            match self.decide(r, t.slot, d, id, cost, now, load) {
                Ok((d, _)) => d,
                Err(d) => {
                    self.count(r, t.slot, raw, cost, L_DENIED, false);
                    self.deny(c, req, &[], now, &[], sel, rule);
                    why.denied(rule, &d);
                    return d;
                }
            }
        };
        self.admitted(r, t.slot, raw, cost, &d);
        // `d` merged into `UNLIMITED` (as `apply` would): `d` itself, unless its remainder
        // is not below `UNLIMITED`'s.
        if d.remaining < u64::MAX {
            d
        } else {
            Decision {
                reset_after_ns: d.reset_after_ns,
                delay_ns: d.delay_ns,
                ..UNLIMITED
            }
        }
    }

    /// One enforcing rule that the request's route, method and priority select: its key, its
    /// store, its limits, its mode. An admission is merged into `acc`; a denial replaces it.
    #[inline(always)]
    fn apply(
        &self,
        r: &CRule<C>,
        req: &Request<'_>,
        now: Nanos,
        load: f64,
        acc: &mut Decision,
    ) -> Step {
        let Some(id) = r.plan.id(req, &self.hasher) else {
            return Step::Skipped;
        };
        let cost = req.cost.saturating_mul(r.cost);
        let t = r.target(id);
        let d = t.check_at(id, cost, now);
        let raw = d.limit;
        // The common case inline: a hard rule that admits.
        if matches!(r.kind, Kind::Hard) && d.allowed() {
            self.admitted(r, t.slot, raw, cost, &d);
            merge(acc, &d);
            return Step::Admitted;
        }
        match self.decide(r, t.slot, d, id, cost, now, load) {
            Ok((d, pool)) => {
                self.admitted(r, t.slot, raw, cost, &d);
                merge(acc, &d);
                if pool {
                    Step::Pooled
                } else {
                    Step::Admitted
                }
            }
            Err(d) => {
                self.count(r, t.slot, raw, cost, L_DENIED, false);
                *acc = d;
                Step::Denied
            }
        }
    }

    /// Counts an admission by rule `r` in the row of its slot's limit `raw` (the `limit` of
    /// its store's decision), near the limit if `d` (as reported) has less than the
    /// near-limit share left ([`Engine::set_near_limit`]).
    #[inline(always)]
    fn admitted(&self, r: &CRule<C>, slot: &Slot<C>, raw: u64, cost: u64, d: &Decision) {
        let near = near(d, self.near_below());
        self.count(r, slot, raw, cost, L_ADMITTED, near);
    }

    /// Counts event `what` of rule `r`'s limit row for `raw` (see `Engine::admitted`); a
    /// peek (cost 0) is not counted. Two relaxed adds at most, in this thread's shard.
    #[inline(always)]
    fn count(&self, r: &CRule<C>, slot: &Slot<C>, raw: u64, cost: u64, what: usize, near: bool) {
        if cost != 0 {
            r.counters
                .limit(self.load.shard(), slot.row(raw), what, near);
        }
    }

    /// Candidate `cand` of the request, if `sel` selects it and the request has its key: its
    /// rule, the key id and the cost (`req.cost` × the rule's).
    #[inline(always)]
    pub(super) fn keyed<'c>(
        &self,
        c: &'c Compiled<C>,
        req: &Request<'_>,
        cand: &Cand,
        sel: u32,
    ) -> Option<(&'c CRule<C>, u64, u64)> {
        if !cand.admits(sel) {
            return None;
        }
        let r = &c.rules[cand.rule as usize];
        let id = r.plan.id(req, &self.hasher)?;
        Some((r, id, req.cost.saturating_mul(r.cost)))
    }

    /// The load for this check, or the decision if the request is shed. Out of line: a check
    /// without shedding or elastic rules does not need it.
    #[inline(never)]
    pub(in crate::rules) fn load_or_shed(
        &self,
        c: &Compiled<C>,
        prio: Priority,
        now: Nanos,
    ) -> Result<f64, Decision> {
        let load = self.load.current(&c.load, c.shedding.as_ref(), now);
        if let Some(s) = &c.shedding {
            if self.load.sheds(prio, load, s) {
                self.load.count_shed(prio);
                return Err(shed_decision(s));
            }
        }
        Ok(load)
    }

    /// The shadow rules among `cands`, after the enforcing rules admitted: each takes the cost
    /// if it would admit, and counts a would-be denial if not.
    #[inline(never)]
    fn shadow<T: Track>(
        &self,
        c: &Compiled<C>,
        req: &Request<'_>,
        cands: &[Cand],
        sel: u32,
        now: Nanos,
        why: &mut T,
    ) {
        for cand in cands {
            let Some((r, id, cost)) = self.keyed(c, req, cand, sel) else {
                continue;
            };
            let t = r.target(id);
            let d = t.check_at(id, cost, now);
            if d.allowed() {
                self.admitted(r, t.slot, d.limit, cost, &d);
                why.would_admit(cand.rule);
            } else {
                self.count(r, t.slot, d.limit, cost, L_SHADOW, false);
                r.counters.add(self.load.shard(), WOULD);
                why.would_deny(cand.rule, &d);
            }
        }
    }

    /// A denial by enforcing rule `rule`, after the candidates `cands` before it: the rule's
    /// counter, and the cost given back to the rules among `cands` that took it (all of them:
    /// the check stopped at the first denial), each rule's key and store re-derived exactly as
    /// the check did; `pooled` says which took it from an elastic pool. Out of line, so that
    /// the check path does not prepare for it.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn deny(
        &self,
        c: &Compiled<C>,
        req: &Request<'_>,
        cands: &[Cand],
        now: Nanos,
        pooled: &[u64],
        sel: u32,
        rule: u32,
    ) {
        for (k, cand) in cands.iter().enumerate().rev() {
            let Some((r, id, cost)) = self.keyed(c, req, cand, sel) else {
                continue;
            };
            let t = r.target(id);
            let pool = pooled[k / 64] >> (k % 64) & 1 == 1;
            match (&t.slot.pool, pool) {
                (Some(p), true) => p.store.refund_at(&id, cost, now),
                _ => t.refund_at(id, cost, now),
            }
        }
        c.rules[rule as usize]
            .counters
            .add(self.load.shard(), DENIED);
    }

    /// After enforcing rule denial `d`: the enforcing rules among `cands` (those after the
    /// denier) are asked, without charging them, whether they would deny too, and `d`'s
    /// retry becomes the latest of theirs (NeverFits if one can never admit the request). The
    /// client is told when every rule admits, not only the first that denied.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn latest(
        &self,
        c: &Compiled<C>,
        req: &Request<'_>,
        cands: &[Cand],
        sel: u32,
        now: Nanos,
        load: f64,
        d: &mut Decision,
    ) {
        for cand in cands {
            if d.outcome != Outcome::Limited {
                return;
            }
            let Some((r, id, cost)) = self.keyed(c, req, cand, sel) else {
                continue;
            };
            let t = r.target(id);
            let slot = t.slot;
            let e = t.evaluate_at(id, cost, now);
            if e.allowed() {
                continue;
            }
            // An elastic rule admits from its pool what its limits deny (as in `decide`).
            if let (Kind::Elastic { below }, Some(pool)) = (r.kind, &slot.pool) {
                if e.outcome == Outcome::Limited
                    && load < below
                    && pool.store.evaluate_at(&id, cost, now).allowed()
                {
                    continue;
                }
            }
            match (d.retry_after_ns, e.retry_after_ns) {
                (Some(x), Some(y)) => d.retry_after_ns = Some(x.max(y)),
                _ => {
                    d.retry_after_ns = None;
                    d.outcome = Outcome::NeverFits;
                }
            }
        }
    }

    /// One enforcing rule's decision `d` from its main store, by its mode: `Ok` with the
    /// decision and whether the elastic pool took the cost, or `Err` with the denial (nothing
    /// taken). Out of line: a hard rule that admits does not come here.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        r: &CRule<C>,
        slot: &Slot<C>,
        d: Decision,
        id: u64,
        cost: u64,
        now: Nanos,
        load: f64,
    ) -> Result<(Decision, bool), Decision> {
        let d = match by_mode(r, slot, d, || self.load.shard()) {
            Ok(d) => return Ok((d, false)),
            Err(d) => d,
        };
        if let (Kind::Elastic { below }, Some(pool)) = (r.kind, &slot.pool) {
            if d.outcome == Outcome::Limited && load < below {
                let e = pool.store.check_at(&id, cost, now);
                if e.allowed() {
                    r.counters.add(self.load.shard(), ELASTIC);
                    return Ok((pooled(&d, &e), true));
                }
            }
        }
        Err(d)
    }
}
