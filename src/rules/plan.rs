//! Plans: what a request matched, without deciding it — for a backend that keeps the rules'
//! counts somewhere else than this process's stores (Redis, crate `turnstile-redis`).
//!
//! [`Engine::plan_at`] does everything of a check that does not touch a count, exactly as
//! the check does it: shedding (by this process's load), the route's candidates, each
//! rule's method and priority conditions, key and override, the elastic pool's load
//! condition. It lists the matching rules as [`PlanStep`]s, enforcing ones in file order, then
//! shadow ones, each with its key id under the *backend's* hasher (so that every process
//! sharing the backend names a key alike) and the limits its store would apply
//! ([`Plan::limits`], [`Plan::pool_limits`]).
//!
//! The backend decides the steps (all-or-nothing across the enforcing ones, as the engine
//! does) and hands back what each step's limits answered ([`StepOutcome`]);
//! [`Plan::finish`] turns those into the [`Verdict`] the engine would give — soft rules
//! reported against their nominal limit, an elastic pool's admission, the denying rule and
//! the latest retry of every rule that would deny — and counts the rules' statistics
//! ([`Engine::rule_stats`]) as the check does. So the modes are implemented once, here.
//!
//! Plans are built outside the engine's in-memory check path: a plan allocates its list of
//! steps and holds the loaded rules (an `Arc`) until dropped.

use super::compile::{
    CRule, Compiled, Kind, Slot, DENIED, ELASTIC, L_ADMITTED, L_DENIED, L_SHADOW, WOULD,
};
use super::engine::{by_mode, merge, near, pooled, Engine, Verdict, UNLIMITED};
use super::matcher::sel;
use super::request::{method_slot, Priority, Request};
use crate::algo::Limits;
use crate::clock::{Clock, Nanos};
use crate::decision::{Decision, Outcome};
use crate::keyed::KeyHasher;
// std's `Arc`, as in `engine` (arc-swap swaps a std `Arc`).
use std::sync::Arc;

/// The rule's own limits, not an override's.
const MAIN: u32 = u32::MAX;

/// One rule a request matched (see [`Plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanStep {
    rule: u32,
    /// Index of the override whose limits apply, or `MAIN`.
    slot: u32,
    key: u64,
    cost: u64,
    /// A settle plan's actual cost × the rule's cost; else `cost`.
    actual: u64,
    shadow: bool,
    pool: bool,
}

impl PlanStep {
    /// The request's key id under the rule's key class, hashed with the hasher given to
    /// [`Engine::plan_at`] (customer ids and IPv4 groups are not hashed).
    pub fn key(&self) -> u64 {
        self.key
    }
    /// Units the request takes from this rule (`req.cost × rule.cost`).
    pub fn cost(&self) -> u64 {
        self.cost
    }
    /// A settle plan's ([`Engine::settle_plan`]) actual cost of the request × the rule's
    /// `cost`, to settle [`PlanStep::cost`] (the reserved cost) against; in other plans the
    /// same as `cost`.
    pub fn actual_cost(&self) -> u64 {
        self.actual
    }
    /// Whether the rule is a shadow rule (counted only if the enforcing rules admit; never
    /// denies).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }
    /// Whether an override's limits apply (the key has one) rather than the rule's.
    pub fn is_override(&self) -> bool {
        self.slot != MAIN
    }
    /// Elastic rules: whether the extra pool may be drawn for this request (the load was under
    /// `elastic_below` when the plan was made). Always false for other rules.
    pub fn may_draw_pool(&self) -> bool {
        self.pool
    }
    /// The rule's index in the rules the plan was made on, and its override's among the
    /// rule's (`None`: the rule's own limits): a backend keeping state per rule finds it by
    /// these, and checks that [`Plan::rule_name`] and [`Plan::limits`] are still what it
    /// kept (a reload renumbers the rules).
    pub fn slot_index(&self) -> (u32, Option<u32>) {
        (self.rule, (self.slot != MAIN).then_some(self.slot))
    }
}

/// What a step's limits answered, from the backend: its own limits' decision and, for an
/// elastic rule whose limits denied (`Outcome::Limited`) while it [may draw its
/// pool](PlanStep::may_draw_pool), the pool's. As the engine's stores answer: a check that
/// recorded (its admission, or the denial of a `count_denied` limit) for the steps the engine
/// charges; an evaluation (recording nothing) for the enforcing steps after the first one
/// that denied, which the engine only asks when each would admit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepOutcome {
    /// The rule's (or override's) limits.
    pub main: Decision,
    /// The elastic pool's, if it was asked.
    pub pool: Option<Decision>,
}

impl StepOutcome {
    /// An outcome of the rule's limits alone.
    pub fn main(d: Decision) -> Self {
        Self {
            main: d,
            pool: None,
        }
    }
}

/// What a request matched, to be decided by a backend that keeps the rules' counts
/// elsewhere (Redis: crate `turnstile-redis`). From [`Engine::plan_at`] or
/// [`Engine::refund_plan`].
///
/// The plan has done everything of a check that touches no count, as the check does it:
/// shedding (by this process's load), the route's candidates, method and priority
/// conditions, keys, overrides, an elastic pool's load condition. The backend decides the
/// [steps](Plan::steps) — enforcing ones all-or-nothing, in order, then the shadow ones — and
/// hands what each step's limits answered to [`Plan::finish`], which gives the engine's
/// [`Verdict`] and counts the rules' statistics ([`Engine::rule_stats`]): the modes are
/// implemented once, in the engine. A plan holds the rules it was made on until dropped.
pub struct Plan<C: Clock> {
    compiled: Arc<Compiled<C>>,
    shed: Option<Decision>,
    steps: Vec<PlanStep>,
    shard: usize,
    /// `1 -` the engine's near-limit share, when the plan was made.
    near_below: f64,
}

impl<C: Clock> std::fmt::Debug for Plan<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("shed", &self.shed)
            .field("steps", &self.steps)
            .finish()
    }
}

impl<C: Clock> Plan<C> {
    /// The decision if the request was shed (no rule is asked then; [`Plan::finish`] answers
    /// it whatever the outcomes).
    pub fn shed(&self) -> Option<Decision> {
        self.shed
    }

    /// The matching rules: enforcing ones in file order, then shadow ones.
    pub fn steps(&self) -> &[PlanStep] {
        &self.steps
    }

    /// The rule's name.
    pub fn rule_name(&self, s: &PlanStep) -> &str {
        &self.rule(s).name
    }

    /// The limits the step's store applies (an override's, if the key has one; a soft rule's
    /// scaled by its tolerance).
    pub fn limits(&self, s: &PlanStep) -> &Limits {
        &self.slot(s).main.ident.limits
    }

    /// An elastic rule's extra pool (whether or not it may be drawn now).
    pub fn pool_limits(&self, s: &PlanStep) -> Option<&Limits> {
        self.slot(s).pool.as_ref().map(|p| &p.ident.limits)
    }

    fn rule(&self, s: &PlanStep) -> &CRule<C> {
        &self.compiled.rules[s.rule as usize]
    }

    fn slot(&self, s: &PlanStep) -> &Slot<C> {
        let r = self.rule(s);
        match r.overrides.get(s.slot as usize) {
            Some(o) => o,
            None => &r.main,
        }
    }

    /// The answer the engine gives for these outcomes (`outcomes[i]` for `steps()[i]`;
    /// `None` for a step the backend did not ask: shadow steps after a denial), and the rules'
    /// statistics counted as a check counts them. Outcomes the backend got inconsistently
    /// (missing for an enforcing step) are skipped.
    pub fn finish(&self, outcomes: &[Option<StepOutcome>]) -> Verdict {
        if let Some(d) = self.shed {
            return Verdict {
                decision: d,
                rule: None,
                shed: true,
                matched: 0,
                would_deny: 0,
            };
        }
        let mut acc = UNLIMITED;
        let mut denier: Option<u32> = None;
        let (mut matched, mut would_deny) = (0, 0);
        let paired = self.steps.iter().zip(outcomes);
        for (s, o) in paired.clone().filter(|(s, _)| !s.shadow) {
            let Some(o) = o else { continue };
            let r = self.rule(s);
            if denier.is_some() {
                // After the denial: the latest retry of every rule that would deny too
                // (`Engine::latest`).
                if acc.outcome != Outcome::Limited {
                    break;
                }
                let by_pool = matches!(r.kind, Kind::Elastic { .. })
                    && s.pool
                    && o.main.outcome == Outcome::Limited
                    && o.pool.is_some_and(|e| e.allowed());
                if o.main.allowed() || by_pool {
                    continue;
                }
                match (acc.retry_after_ns, o.main.retry_after_ns) {
                    (Some(x), Some(y)) => acc.retry_after_ns = Some(x.max(y)),
                    _ => {
                        acc.retry_after_ns = None;
                        acc.outcome = Outcome::NeverFits;
                    }
                }
                continue;
            }
            match self.mode(r, self.slot(s), o, s.pool) {
                Ok(d) => {
                    self.count(s, o, L_ADMITTED, near(&d, self.near_below));
                    merge(&mut acc, &d);
                    matched += 1;
                }
                Err(d) => {
                    self.count(s, o, L_DENIED, false);
                    acc = d;
                    denier = Some(s.rule);
                    r.counters.add(self.shard, DENIED);
                }
            }
        }
        if denier.is_none() {
            for (s, o) in paired.filter(|(s, _)| s.shadow) {
                if let Some(o) = o {
                    if !o.main.allowed() {
                        self.count(s, o, L_SHADOW, false);
                        self.rule(s).counters.add(self.shard, WOULD);
                        would_deny += 1;
                    } else {
                        self.count(s, o, L_ADMITTED, near(&o.main, self.near_below));
                    }
                }
            }
        }
        Verdict {
            decision: acc,
            rule: denier.map(|i| self.compiled.rules[i as usize].name.clone()),
            shed: false,
            matched,
            would_deny,
        }
    }

    /// Counts event `what` of step `s`'s limit row (as the check does: by the `limit` of its
    /// limits' answer; a peek, cost 0, is not counted).
    fn count(&self, s: &PlanStep, o: &StepOutcome, what: usize, near: bool) {
        if s.cost != 0 {
            let row = self.slot(s).row(o.main.limit);
            self.rule(s).counters.limit(self.shard, row, what, near);
        }
    }

    /// One enforcing rule's answer by its mode, as `Engine::decide`: `Ok` with the decision
    /// it contributes, `Err` with its denial.
    fn mode(
        &self,
        r: &CRule<C>,
        slot: &Slot<C>,
        o: &StepOutcome,
        may_pool: bool,
    ) -> Result<Decision, Decision> {
        let d = match by_mode(r, slot, o.main, || self.shard) {
            Ok(d) => return Ok(d),
            Err(d) => d,
        };
        if let (Kind::Elastic { .. }, true, Outcome::Limited, Some(e)) =
            (r.kind, may_pool, d.outcome, o.pool)
        {
            if e.allowed() {
                r.counters.add(self.shard, ELASTIC);
                return Ok(pooled(&d, &e));
            }
        }
        Err(d)
    }
}

impl<C: Clock> Engine<C> {
    /// The [`Plan`] of a check of `req` now (see [`Engine::plan_at`]).
    pub fn plan(&self, req: &Request<'_>, keys: &KeyHasher) -> Plan<C> {
        self.plan_at(req, self.clock.now(), keys)
    }

    /// What a check of `req` at `now` would ask, without asking it: shedding is decided (and
    /// counted) here by this process's load; every matching rule becomes a [`PlanStep`] whose
    /// key id is hashed with `keys` (give every process sharing a backend the same seed). A
    /// backend decides the steps and calls [`Plan::finish`].
    pub fn plan_at(&self, req: &Request<'_>, now: Nanos, keys: &KeyHasher) -> Plan<C> {
        let c = self.current.load_full();
        let m = method_slot(req.method);
        let prio = req.priority.unwrap_or_else(|| Priority::of_method_index(m));
        let shard = self.load.shard();
        let mut load = 0.0;
        if c.needs_load {
            match self.load_or_shed(&c, prio, now) {
                Ok(l) => load = l,
                Err(d) => {
                    return Plan {
                        compiled: c,
                        shed: Some(d),
                        steps: Vec::new(),
                        shard,
                        near_below: self.near_below(),
                    }
                }
            }
        }
        let steps = self.steps(&c, req, sel(m, prio), keys, |r| match r.kind {
            Kind::Elastic { below } => load < below,
            _ => false,
        });
        Plan {
            compiled: c,
            shed: None,
            steps,
            shard,
            near_below: self.near_below(),
        }
    }

    /// The [`Plan`] of a refund of `req` ([`Engine::refund`]): every rule the request matches,
    /// enforcing and shadow, never shed. A backend gives each step's cost back to its limits,
    /// or to its [pool](Plan::pool_limits) if the pool holds a charge (as the engine does).
    pub fn refund_plan(&self, req: &Request<'_>, keys: &KeyHasher) -> Plan<C> {
        let c = self.current.load_full();
        let m = method_slot(req.method);
        let prio = req.priority.unwrap_or_else(|| Priority::of_method_index(m));
        let steps = self.steps(&c, req, sel(m, prio), keys, |_| false);
        Plan {
            compiled: c,
            shed: None,
            steps,
            shard: self.load.shard(),
            near_below: self.near_below(),
        }
    }

    /// The [`Plan`] of a settle of `req` ([`Engine::settle`]): the refund plan's steps (every
    /// rule the request matches, enforcing and shadow, never shed), each step's
    /// [cost](PlanStep::cost) the reserved `req.cost` × the rule's cost and its
    /// [actual cost](PlanStep::actual_cost) `actual` × the rule's cost. A backend charges the
    /// difference to the step's own limits when the actual cost is above, or gives it back as a
    /// refund does (to the pool if it holds a charge) when below.
    pub fn settle_plan(&self, req: &Request<'_>, actual: u64, keys: &KeyHasher) -> Plan<C> {
        let mut p = self.refund_plan(req, keys);
        let c = Arc::clone(&p.compiled);
        for s in &mut p.steps {
            s.actual = actual.saturating_mul(c.rules[s.rule as usize].cost);
        }
        p
    }

    /// The steps of `req`: the route's candidates (enforcing, then shadow) whose method and
    /// priority conditions `sel` meets and whose key the request has.
    fn steps(
        &self,
        c: &Compiled<C>,
        req: &Request<'_>,
        sel: u32,
        keys: &KeyHasher,
        pool: impl Fn(&CRule<C>) -> bool,
    ) -> Vec<PlanStep> {
        let cands = c.routes.candidates(req.route);
        let mut steps = Vec::new();
        for (shadow, list) in [(false, &cands.enforce), (true, &cands.shadow)] {
            for cand in list.iter().filter(|x| x.admits(sel)) {
                let r = &c.rules[cand.rule as usize];
                let (Some(id), Some(key)) = (r.plan.id(req, &self.hasher), r.plan.id(req, keys))
                else {
                    continue;
                };
                let slot = match r.override_ids.binary_search(&id) {
                    Ok(i) => i as u32,
                    Err(_) => MAIN,
                };
                steps.push(PlanStep {
                    rule: cand.rule,
                    slot,
                    key,
                    cost: req.cost.saturating_mul(r.cost),
                    actual: req.cost.saturating_mul(r.cost),
                    shadow,
                    pool: pool(r),
                });
            }
        }
        steps
    }
}
