//! [`Engine::explanation_at`]: why a check of a request would be answered as it would — every
//! rule it matches, each limit's counter, remaining and reset, the key as the engine hashes
//! it, the rule's mode and which rule and limit decide — computed from peeks, consuming
//! nothing and counting nothing. A separate path from the check: it walks the route's full
//! candidate lists (as `explain` does) and allocates its report.

use super::check::{shed_decision, soft_view};
use super::{merge, pooled, Engine, Verdict, UNLIMITED};
use crate::algo::{Algorithm, LimitPeek};
use crate::clock::{Clock, Nanos};
use crate::decision::{Decision, Outcome};
use crate::rules::compile::{CRule, Kind};
use crate::rules::matcher::sel;
use crate::rules::request::{method_slot, Priority, Request};
use std::sync::Arc;

/// How a rule enforces its limits (the rules file's `mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleMode {
    /// Denies at the limit.
    Hard,
    /// Admits up to a tolerance over the limit; reported against the nominal limit.
    Soft,
    /// Past the limit, draws from an extra pool while the load is low.
    Elastic,
    /// Never denies; counts what it would have denied.
    Shadow,
}

impl RuleMode {
    /// The mode as the rules file writes it.
    pub fn name(self) -> &'static str {
        match self {
            RuleMode::Hard => "hard",
            RuleMode::Soft => "soft",
            RuleMode::Elastic => "elastic",
            RuleMode::Shadow => "shadow",
        }
    }
}

/// Whose limits a rule applies to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitsFrom {
    /// The rule's own limits.
    Rule,
    /// An override's (the key is named in the rule's `overrides`).
    Override,
    /// The key's own limit, from the rule's limits class (`limits_from`).
    Own,
}

impl LimitsFrom {
    /// As the explanation names it.
    pub fn name(self) -> &'static str {
        match self {
            LimitsFrom::Rule => "rule",
            LimitsFrom::Override => "override",
            LimitsFrom::Own => "own",
        }
    }
}

/// What a rule does with the request, as the check would do it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleStep {
    /// An enforcing rule admits it from its limits.
    Admits,
    /// An elastic rule admits it from its extra pool.
    AdmitsFromPool,
    /// An enforcing rule denies it (the first to deny decides).
    Denies,
    /// A shadow rule would admit it.
    WouldAdmit,
    /// A shadow rule would deny it (the request is not denied for it).
    WouldDeny,
    /// Not charged: an enforcing rule after the one that denies (asked only for the retry),
    /// or a shadow rule when an enforcing rule denies.
    NotReached,
}

impl RuleStep {
    /// As the explanation names it.
    pub fn name(self) -> &'static str {
        match self {
            RuleStep::Admits => "admits",
            RuleStep::AdmitsFromPool => "admits_from_pool",
            RuleStep::Denies => "denies",
            RuleStep::WouldAdmit => "would_admit",
            RuleStep::WouldDeny => "would_deny",
            RuleStep::NotReached => "not_reached",
        }
    }
}

/// One limit of a rule, as it stands for the key before the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitState {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The limit (a soft rule's nominal limit).
    pub limit: u64,
    /// The counter: units taken and not yet recovered (limit − remaining of the store's
    /// limit; a soft rule's counter can pass its nominal limit inside its tolerance).
    pub used: u64,
    /// What is left now.
    pub remaining: u64,
    /// Nanoseconds until the limit is idle again.
    pub reset_after_ns: u64,
    /// Whether this limit alone admits the request's cost.
    pub admits: bool,
    /// What would be left after the request, if this limit admits it (else `remaining`).
    pub remaining_after: u64,
    /// When this limit alone would admit the request (`None`: it admits now, or never).
    pub retry_after_ns: Option<u64>,
}

/// One rule the request matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleExplanation {
    /// The rule's name.
    pub rule: Arc<str>,
    /// Its mode.
    pub mode: RuleMode,
    /// The request's key under the rule's key class, as the engine hashes it (customer ids
    /// and IPv4 groups are not hashed): what its store is keyed by.
    pub key: u64,
    /// Units the request takes from the rule (the request's cost × the rule's `cost`).
    pub cost: u64,
    /// Whose limits apply.
    pub limits_from: LimitsFrom,
    /// Each limit, in the rule's order.
    pub limits: Vec<LimitState>,
    /// An elastic rule's extra pool, per limit (empty for other rules).
    pub pool: Vec<LimitState>,
    /// An elastic rule: whether the load lets the pool be drawn now.
    pub pool_open: bool,
    /// What the rule does with the request.
    pub step: RuleStep,
    /// The rule's own decision, by its mode (a soft rule's against its nominal limit).
    pub decision: Decision,
}

/// Which rule and limit decide an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decider {
    /// Index in [`Explanation::rules`].
    pub rule: usize,
    /// Index in that rule's [`RuleExplanation::limits`], when one limit does.
    pub limit: Option<usize>,
}

/// Why a check of a request now would be answered as it would ([`Engine::explanation`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// What the check would answer: the decision, the denying rule, whether the request is
    /// shed, the counts. Equal to [`Engine::explain`]'s on the same state.
    pub verdict: Verdict,
    /// The request's cost.
    pub cost: u64,
    /// The priority it is checked at (given, or from its method).
    pub priority: Priority,
    /// Every rule the request matches: the enforcing ones in file order, then the shadow ones.
    pub rules: Vec<RuleExplanation>,
    /// The rule and limit whose numbers the answer reports: the denying rule's denying limit,
    /// or the admitting limit with the least left. `None` when no rule limits the request or
    /// it is shed.
    pub decided_by: Option<Decider>,
}

impl Explanation {
    /// The deciding rule's explanation, if one decides.
    pub fn decider(&self) -> Option<&RuleExplanation> {
        self.decided_by.map(|d| &self.rules[d.rule])
    }
}

/// A limit's view, a soft rule's mapped to its nominal limit (`nominal`: (scaled, nominal)
/// capacity per limit; empty for other rules).
fn state(p: &LimitPeek, nominal: &[(u64, u64)]) -> LimitState {
    let used = p.held.limit.saturating_sub(p.held.remaining);
    let (held, asked) = (soft_view(nominal, p.held).0, soft_view(nominal, p.asked).0);
    let admits = asked.allowed();
    LimitState {
        algorithm: p.algorithm,
        limit: held.limit,
        used,
        remaining: held.remaining,
        reset_after_ns: held.reset_after_ns,
        admits,
        remaining_after: if admits {
            asked.remaining
        } else {
            held.remaining
        },
        retry_after_ns: asked.retry_after_ns,
    }
}

impl<C: Clock> Engine<C> {
    /// Explains a check of `req` now, consuming nothing ([`Engine::explanation_at`]).
    pub fn explanation(&self, req: &Request<'_>) -> Explanation {
        self.explanation_at(req, self.clock.now())
    }

    /// What a check of `req` at `now` would answer and why, from peeks: no store, counter or
    /// load-shedding statistic changes (the load itself is measured, as a check measures
    /// it). Its verdict is what [`Engine::explain_at`] answers on the same state — but for
    /// a denial by a limit with `count_denied`, which the check describes with that denial
    /// counted. Allocates the report: not for the hot path.
    pub fn explanation_at(&self, req: &Request<'_>, now: Nanos) -> Explanation {
        let c = self.current.load();
        let m = method_slot(req.method);
        let priority = req.priority.unwrap_or_else(|| Priority::of_method_index(m));
        let sel = sel(m, priority);
        let mut x = Explanation {
            verdict: Verdict {
                decision: UNLIMITED,
                rule: None,
                shed: false,
                matched: 0,
                would_deny: 0,
            },
            cost: req.cost,
            priority,
            rules: Vec::new(),
            decided_by: None,
        };
        let mut load = 0.0;
        if c.needs_load {
            load = self.load.current(&c.load, c.shedding.as_ref(), now);
            if let Some(s) = c
                .shedding
                .as_ref()
                .filter(|s| self.load.sheds(priority, load, s))
            {
                x.verdict.decision = shed_decision(s);
                x.verdict.shed = true;
                return x;
            }
        }
        let cands = c.routes.candidates(req.route);
        let mut acc = UNLIMITED;
        let mut denier: Option<(usize, usize)> = None;
        for (k, cand) in cands.enforce.iter().enumerate() {
            let Some((r, id, cost)) = self.keyed(&c, req, cand, sel) else {
                continue;
            };
            let mut e = self.rule_view(r, id, cost, now, load);
            match e.step {
                _ if denier.is_some() => e.step = RuleStep::NotReached,
                RuleStep::Denies => {
                    acc = e.decision;
                    denier = Some((k, x.rules.len()));
                }
                _ => {
                    merge(&mut acc, &e.decision);
                    x.verdict.matched += 1;
                }
            }
            x.rules.push(e);
        }
        for cand in cands.shadow.iter() {
            let Some((r, id, cost)) = self.keyed(&c, req, cand, sel) else {
                continue;
            };
            let mut e = self.rule_view(r, id, cost, now, load);
            if denier.is_some() {
                e.step = RuleStep::NotReached;
            } else if e.step == RuleStep::WouldDeny {
                x.verdict.would_deny += 1;
            }
            x.rules.push(e);
        }
        if let Some((k, i)) = denier {
            self.latest(&c, req, &cands.enforce[k + 1..], sel, now, load, &mut acc);
            x.verdict.rule = Some(x.rules[i].rule.clone());
            x.decided_by = Some(limit_of(&x.rules, i, &acc));
        } else if acc.remaining < u64::MAX {
            x.decided_by = admitting(&x.rules, &acc);
        }
        x.verdict.decision = acc;
        x
    }

    /// One matching rule's explanation: its limits' views and its decision by its mode, as
    /// the check would decide it (`Engine::decide`), without counting anything.
    fn rule_view(
        &self,
        r: &CRule<C>,
        id: u64,
        cost: u64,
        now: Nanos,
        load: f64,
    ) -> RuleExplanation {
        let t = r.target(id);
        let limits_from = match (&t.own, std::ptr::eq(t.slot, &r.main)) {
            (Some(_), _) => LimitsFrom::Own,
            (None, true) => LimitsFrom::Rule,
            (None, false) => LimitsFrom::Override,
        };
        let nominal: &[(u64, u64)] = match r.kind {
            Kind::Soft => &t.slot.nominal,
            _ => &[],
        };
        let (raw, peeks) = t.inspect_at(id, cost, now);
        let mut decision = soft_view(nominal, raw).0;
        let mut e = RuleExplanation {
            rule: r.name.clone(),
            mode: match r.kind {
                Kind::Hard => RuleMode::Hard,
                Kind::Soft => RuleMode::Soft,
                Kind::Elastic { .. } => RuleMode::Elastic,
                Kind::Shadow => RuleMode::Shadow,
            },
            key: id,
            cost,
            limits_from,
            limits: peeks.iter().map(|p| state(p, nominal)).collect(),
            pool: Vec::new(),
            pool_open: false,
            step: RuleStep::Admits,
            decision,
        };
        let mut from_pool = false;
        if let (Kind::Elastic { below }, Some(pool)) = (r.kind, &t.slot.pool) {
            e.pool_open = load < below;
            let (p, views) = pool.store.inspect_at(&id, cost, now);
            e.pool = views.iter().map(|v| state(v, &[])).collect();
            if !decision.allowed()
                && decision.outcome == Outcome::Limited
                && e.pool_open
                && p.allowed()
            {
                decision = pooled(&decision, &p);
                from_pool = true;
            }
        }
        e.decision = decision;
        e.step = match (e.mode, decision.allowed(), from_pool) {
            (RuleMode::Shadow, true, _) => RuleStep::WouldAdmit,
            (RuleMode::Shadow, false, _) => RuleStep::WouldDeny,
            (_, true, true) => RuleStep::AdmitsFromPool,
            (_, true, false) => RuleStep::Admits,
            (_, false, _) => RuleStep::Denies,
        };
        e
    }
}

/// The admitting rule and limit whose numbers the admission `d` reports: the first rule with
/// its remainder (as `merge` keeps it).
fn admitting(rules: &[RuleExplanation], d: &Decision) -> Option<Decider> {
    rules
        .iter()
        .position(|e| {
            matches!(e.step, RuleStep::Admits | RuleStep::AdmitsFromPool)
                && e.decision.remaining == d.remaining
        })
        .map(|i| limit_of(rules, i, d))
}

/// The limit of rule `i` whose numbers the answer `d` reports: the first of its limit (`d`'s
/// limit) that denies, or that admits with `d`'s remainder.
fn limit_of(rules: &[RuleExplanation], i: usize, d: &Decision) -> Decider {
    let ls = &rules[i].limits;
    let denies = rules[i].step == RuleStep::Denies || rules[i].step == RuleStep::AdmitsFromPool;
    let limit = ls
        .iter()
        .position(|l| {
            l.limit == d.limit
                && if denies {
                    !l.admits
                } else {
                    l.remaining_after == d.remaining
                }
        })
        .or_else(|| {
            ls.iter()
                .position(|l| l.limit == d.limit && l.admits != denies)
        })
        .or_else(|| ls.iter().position(|l| l.admits != denies));
    Decider { rule: i, limit }
}

#[cfg(test)]
mod tests;
