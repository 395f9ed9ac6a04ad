//! Compiling rules into stores, and reusing the stores of unchanged rules on reload.
//!
//! Each rule compiles to its key plan, its mode, and *parts*: keyed stores, one for the rule's
//! limits, one more for an elastic rule's extra pool, and a one-key store per override. A part
//! is identified by (rule name, override key id, pool, key class, compiled limits, capacity,
//! policy); [`compile`] reuses the very same `Arc`'d part of the previous rules when that
//! identity is unchanged, so checks running on the old rules during the swap and checks on the
//! new ones update one state. When only the limits (or the policy) changed and the old records
//! read alike under the new limits (`Limits::carries_to`: same algorithms, same windows or
//! record layout), the new part is a store over the old part's very records
//! (`Store::with_limits`): every key keeps its count, TAT or log, and checks on either side of
//! the swap still update one state. Otherwise the part starts fresh. Counters are kept per rule
//! name.

pub(crate) use super::counters::{
    Counters, DENIED, ELASTIC, L_ADMITTED, L_DENIED, L_SHADOW, OVER, WOULD,
};
use super::counters::{OVERRIDE_ROW, OWN_ROW};
use super::keys::resolve;
use super::limits::{LimitsSource, Lookup};
use super::load::LoadConfig;
use super::matcher::{key_id, KeyPlan, RouteTable};
use super::model::{KeyClass, Mode, Rule, Shedding};
use super::validate::{compile_limits, effective, Loc, Of, Rf};
use super::{Rules, RulesError};
use crate::algo::{Limit, LimitPeek, Limits};
use crate::clock::{Clock, Nanos};
use crate::decision::Decision;
use crate::keyed::{FullPolicy, KeyHasher, Store};
use std::collections::HashMap;
// std's `Arc`, as in `engine` (arc-swap swaps a std `Arc`).
use std::sync::Arc;

/// What a reload did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Rules whose state was kept (same name, key class, limits, capacity).
    pub kept: Vec<String>,
    /// Rules whose limits changed and whose state was carried over to them (same name, key
    /// class, capacity; limits whose records read alike: `Limit::carries_to`).
    pub carried: Vec<String>,
    /// Rules that start from fresh state (new, or changed otherwise).
    pub fresh: Vec<String>,
    /// Rules no longer present.
    pub removed: Vec<String>,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Ident {
    pub(crate) rule: String,
    pub(crate) target: Option<u64>,
    pub(crate) pool: bool,
    pub(crate) class: KeyClass,
    pub(crate) limits: Limits,
    pub(crate) capacity: u64,
    pub(crate) policy: FullPolicy,
}

/// What identifies a part's records: its identity but for the limits and the policy.
type Records = (String, Option<u64>, bool, KeyClass, u64);

impl Ident {
    /// What the part's records mean, as text that is equal for two parts exactly when their
    /// records read alike: rule name, override key id, pool, key class, compiled limits and
    /// capacity (the full-store policy does not change a record). For snapshots.
    pub(crate) fn describe(&self) -> String {
        format!(
            "rule={:?} override={:?} pool={} key={:?} capacity={} limits={:?}",
            self.rule, self.target, self.pool, self.class, self.capacity, self.limits
        )
    }

    fn records(&self) -> Records {
        (
            self.rule.clone(),
            self.target,
            self.pool,
            self.class,
            self.capacity,
        )
    }
}

/// How a part of the new rules came by its state.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reuse {
    /// The old part itself.
    Kept,
    /// A store over the old part's records, with the new limits.
    Carried,
    /// A new store.
    Fresh,
}

pub(crate) struct Part<C: Clock> {
    pub(crate) ident: Ident,
    pub(crate) store: Store<Arc<C>>,
}

pub(crate) struct Slot<C: Clock> {
    pub(crate) main: Arc<Part<C>>,
    pub(crate) pool: Option<Arc<Part<C>>>,
    /// Soft rules: (scaled capacity, nominal capacity) per limit.
    pub(crate) nominal: Box<[(u64, u64)]>,
    /// The capacity of each limit of the rule's store, in order (what a decision's `limit`
    /// says); empty for an override's slot.
    pub(crate) marks: Box<[u64]>,
}

impl<C: Clock> Slot<C> {
    /// The per-limit row of a decision of this slot's store whose `limit` is `cap`: the
    /// limit's position, `override` for an override's slot, `own` for a capacity that is none
    /// of the rule's (a key's own limit).
    #[inline]
    pub(crate) fn row(&self, cap: u64) -> usize {
        if self.marks.is_empty() {
            return OVERRIDE_ROW;
        }
        match self.marks.iter().position(|&m| m == cap) {
            Some(i) => i,
            None => OWN_ROW,
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Hard,
    Soft,
    Elastic { below: f64 },
    Shadow,
}

pub(crate) struct CRule<C: Clock> {
    pub(crate) name: Arc<str>,
    pub(crate) plan: KeyPlan,
    pub(crate) cost: u64,
    pub(crate) kind: Kind,
    pub(crate) main: Slot<C>,
    pub(crate) override_ids: Box<[u64]>,
    pub(crate) overrides: Box<[Slot<C>]>,
    pub(crate) counters: Arc<Counters>,
    /// The limits class its keys' own limits come from (`limits_from`).
    pub(crate) own: Option<Arc<dyn LimitsSource>>,
}

impl<C: Clock> CRule<C> {
    /// The rule's per-limit counts ([`Counters::limit_stats`]).
    pub(crate) fn limit_stats(&self) -> Vec<super::counters::LimitStats> {
        let c = &self.counters;
        c.limit_stats(
            self.main.marks.len(),
            !self.overrides.is_empty(),
            self.own.is_some(),
        )
    }

    /// The override's slot for key `id`, else the rule's.
    #[inline]
    pub(crate) fn slot(&self, id: u64) -> &Slot<C> {
        if self.override_ids.is_empty() {
            return &self.main;
        }
        match self.override_ids.binary_search(&id) {
            Ok(i) => &self.overrides[i],
            Err(_) => &self.main,
        }
    }

    /// Where a check of key `id` goes, by precedence: its own limit (its entry in the rule's
    /// limits class) over the rule's store, else the override's store, else the rule's. The
    /// entry's line and the store's buckets are fetched together, so that their misses to
    /// memory overlap.
    #[inline]
    pub(crate) fn target(&self, id: u64) -> Target<'_, C> {
        if let Some(src) = &self.own {
            let store = &self.main.main.store;
            if let Lookup::Own(limit) = src.get_fetching(id, &|| store.prefetch(&id)) {
                return Target {
                    slot: &self.main,
                    own: Some(limit),
                };
            }
        }
        Target {
            slot: self.slot(id),
            own: None,
        }
    }
}

/// A key's store and, if it has one, its own limit ([`CRule::target`]).
pub(crate) struct Target<'a, C: Clock> {
    pub(crate) slot: &'a Slot<C>,
    pub(crate) own: Option<Limit>,
}

impl<C: Clock> Target<'_, C> {
    fn store(&self) -> &Store<Arc<C>> {
        &self.slot.main.store
    }

    /// The store's check, by the key's own limit if it has one. (A limit the store cannot
    /// read, which validation rules out, is checked by the store's own.)
    #[inline]
    pub(crate) fn check_at(&self, id: u64, cost: u64, now: Nanos) -> Decision {
        match &self.own {
            None => self.store().check_at(&id, cost, now),
            Some(l) => self
                .store()
                .check_with_at(&id, l, cost, now)
                .unwrap_or_else(|_| self.store().check_at(&id, cost, now)),
        }
    }

    /// [`Target::check_at`] recording nothing.
    pub(crate) fn evaluate_at(&self, id: u64, cost: u64, now: Nanos) -> Decision {
        match &self.own {
            None => self.store().evaluate_at(&id, cost, now),
            Some(l) => self
                .store()
                .evaluate_with_at(&id, l, cost, now)
                .unwrap_or_else(|_| self.store().evaluate_at(&id, cost, now)),
        }
    }

    /// [`Target::evaluate_at`] with each limit's view (`Store::inspect_at`).
    pub(crate) fn inspect_at(&self, id: u64, cost: u64, now: Nanos) -> (Decision, Vec<LimitPeek>) {
        match &self.own {
            None => self.store().inspect_at(&id, cost, now),
            Some(l) => self
                .store()
                .inspect_with_at(&id, l, cost, now)
                .unwrap_or_else(|_| self.store().inspect_at(&id, cost, now)),
        }
    }

    /// Gives `n` back, as the key's limit counts them.
    pub(crate) fn refund_at(&self, id: u64, n: u64, now: Nanos) {
        match &self.own {
            None => self.store().refund_at(&id, n, now),
            Some(l) => {
                if self.store().refund_with_at(&id, l, n, now).is_err() {
                    self.store().refund_at(&id, n, now)
                }
            }
        }
    }

    /// The store's settle, by the key's own limit if it has one.
    pub(crate) fn settle_at(&self, id: u64, reserved: u64, actual: u64, now: Nanos) -> bool {
        match &self.own {
            None => self.store().settle_at(&id, reserved, actual, now),
            Some(l) => self
                .store()
                .settle_with_at(&id, l, reserved, actual, now)
                .unwrap_or_else(|_| self.store().settle_at(&id, reserved, actual, now)),
        }
    }
}

pub(crate) struct Compiled<C: Clock> {
    pub(crate) rules: Box<[CRule<C>]>,
    pub(crate) routes: RouteTable,
    pub(crate) needs_load: bool,
    /// Some route has more than 64 enforcing candidates (see `Engine::eval_n`).
    pub(crate) wide: bool,
    pub(crate) load: LoadConfig,
    pub(crate) shedding: Option<Shedding>,
    pub(crate) summary: String,
}

pub(crate) type Parts<C> = HashMap<Ident, Arc<Part<C>>>;

#[allow(clippy::too_many_arguments)]
fn part<C: Clock>(
    old: &Parts<C>,
    by_records: &HashMap<Records, Arc<Part<C>>>,
    ident: Ident,
    clock: &Arc<C>,
    seed: Option<u64>,
    one_key: bool,
    err: impl Fn(String) -> RulesError,
) -> Result<(Arc<Part<C>>, Reuse), RulesError> {
    if let Some(p) = old.get(&ident) {
        return Ok((p.clone(), Reuse::Kept));
    }
    let carried = by_records
        .get(&ident.records())
        .and_then(|p| p.store.with_limits(ident.limits.clone(), ident.policy));
    if let Some(store) = carried {
        return Ok((Arc::new(Part { ident, store }), Reuse::Carried));
    }
    let mut b = Store::builder(ident.limits.clone())
        .capacity(ident.capacity)
        .policy(ident.policy);
    if one_key {
        b = b.shards(1);
    }
    if let Some(s) = seed {
        b = b.seed(s);
    }
    let store = b
        .build_with_clock(clock.clone())
        .map_err(|e| err(e.to_string()))?;
    Ok((Arc::new(Part { ident, store }), Reuse::Fresh))
}

/// What compiling one rules file needs of the previous one: its parts, by their identity and
/// by their records (a part whose records can carry over under new limits).
struct Compiler<'a, C: Clock> {
    rules: &'a Rules,
    parts: Parts<C>,
    by_records: HashMap<Records, Arc<Part<C>>>,
    clock: &'a Arc<C>,
    seed: Option<u64>,
}

impl<C: Clock> Compiler<'_, C> {
    /// The slot of rule `i` (`r`) for `target` (an override's key id, or `None` for the
    /// rule's own limits): its part, its elastic pool's, and a soft rule's nominal limits.
    fn slot(
        &self,
        i: usize,
        r: &Rule,
        target: Option<u64>,
        specs: &[crate::LimitSpec],
        lim: &dyn Fn(usize, &'static str) -> Loc,
        whole: Loc,
    ) -> Result<(Slot<C>, Reuse), RulesError> {
        let rules = self.rules;
        let capacity = r.capacity.unwrap_or(rules.settings.capacity);
        let policy = r.when_full.unwrap_or(rules.settings.when_full);
        let (main, pool) =
            compile_limits(specs, r.mode, lim, whole).map_err(|(l, m)| rules.error_at(l, m))?;
        let cap = if target.is_some() { 1 } else { capacity };
        let ident = |limits: Limits, pool: bool| Ident {
            rule: r.name.clone(),
            target,
            pool,
            class: r.key,
            limits,
            capacity: cap,
            policy,
        };
        let err = |m: String| rules.error_at(Loc::Rule(i, Rf::Capacity), m);
        let part = |ident: Ident| {
            part(
                &self.parts,
                &self.by_records,
                ident,
                self.clock,
                self.seed,
                target.is_some(),
                err,
            )
        };
        let (main, kept) = part(ident(main, false))?;
        let marks = match target {
            Some(_) => Box::default(),
            None => main
                .ident
                .limits
                .limits()
                .iter()
                .map(|l| l.capacity())
                .collect(),
        };
        let pool = match pool {
            Some(l) => Some(part(ident(l, true))?.0),
            None => None,
        };
        let nominal = match r.mode {
            Mode::Soft { .. } => specs
                .iter()
                .filter_map(|s| {
                    let n = s.build().ok()?.capacity();
                    Some((effective(s, r.mode).0.build().ok()?.capacity(), n))
                })
                .collect(),
            _ => Box::default(),
        };
        let slot = Slot {
            main,
            pool,
            nominal,
            marks,
        };
        Ok((slot, kept))
    }

    /// Rule `i`'s overrides, by key id (sorted; a key overridden twice after grouping keeps
    /// its first).
    fn overrides(
        &self,
        i: usize,
        r: &Rule,
        hasher: &KeyHasher,
    ) -> Result<(Vec<u64>, Vec<Slot<C>>), RulesError> {
        let at = |f: Rf| Loc::Rule(i, f);
        let mut ov: Vec<(u64, Slot<C>)> = Vec::with_capacity(r.overrides.len());
        for (o, x) in r.overrides.iter().enumerate() {
            let v = resolve(r.key, &x.key)
                .map_err(|m| self.rules.error_at(at(Rf::Override(o, Of::Key)), m))?;
            let Some(id) = key_id(r.key, &v.request(), hasher) else {
                return Err(self.rules.error_at(
                    at(Rf::Override(o, Of::Key)),
                    "this key lacks a part of the rule's key class".into(),
                ));
            };
            if ov.iter().any(|(k, _)| *k == id) {
                continue;
            }
            let lim = |j: usize, f: &'static str| at(Rf::Override(o, Of::Limit(j, f)));
            let whole = at(Rf::Override(o, Of::Limits));
            ov.push((id, self.slot(i, r, Some(id), &x.limits, &lim, whole)?.0));
        }
        ov.sort_by_key(|(k, _)| *k);
        Ok(ov.into_iter().unzip())
    }
}

impl Kind {
    fn of(mode: Mode) -> Self {
        match mode {
            Mode::Hard => Kind::Hard,
            Mode::Soft { .. } => Kind::Soft,
            Mode::Elastic { below, .. } => Kind::Elastic { below },
            Mode::Shadow => Kind::Shadow,
        }
    }
}

/// The parts and the counters of `old`, to be kept or carried over.
type Previous<'a, C> = (Parts<C>, HashMap<&'a str, &'a Arc<Counters>>);

fn previous<C: Clock>(old: Option<&Compiled<C>>) -> Previous<'_, C> {
    let mut parts: Parts<C> = HashMap::new();
    let mut counters: HashMap<&str, &Arc<Counters>> = HashMap::new();
    if let Some(o) = old {
        for r in o.rules.iter() {
            counters.insert(&r.name, &r.counters);
            for s in std::iter::once(&r.main).chain(r.overrides.iter()) {
                for p in std::iter::once(&s.main).chain(s.pool.iter()) {
                    parts.insert(p.ident.clone(), p.clone());
                }
            }
        }
    }
    (parts, counters)
}

pub(crate) fn compile<C: Clock>(
    rules: &Rules,
    old: Option<&Compiled<C>>,
    clock: &Arc<C>,
    hasher: &KeyHasher,
    seed: Option<u64>,
    shards: usize,
    sources: &HashMap<String, Arc<dyn LimitsSource>>,
) -> Result<(Compiled<C>, ReloadReport), RulesError> {
    super::validate::validate(rules).map_err(|(loc, m)| rules.error_at(loc, m))?;
    let (parts, counters) = previous(old);
    let by_records = parts
        .values()
        .map(|p| (p.ident.records(), p.clone()))
        .collect();
    let cx = Compiler {
        rules,
        parts,
        by_records,
        clock,
        seed,
    };
    let mut report = ReloadReport::default();
    let mut out = Vec::with_capacity(rules.rules.len());
    for (i, r) in rules.rules.iter().enumerate() {
        let at = |f: Rf| Loc::Rule(i, f);
        let lim = |j: usize, f: &'static str| at(Rf::Limit(j, f));
        let (main, kept) = cx.slot(i, r, None, &r.limits, &lim, at(Rf::Limits))?;
        match kept {
            Reuse::Kept => report.kept.push(r.name.clone()),
            Reuse::Carried => report.carried.push(r.name.clone()),
            Reuse::Fresh => report.fresh.push(r.name.clone()),
        }
        let (override_ids, overrides) = cx.overrides(i, r, hasher)?;
        out.push(CRule {
            name: r.name.as_str().into(),
            plan: KeyPlan::new(r.key),
            cost: r.cost,
            kind: Kind::of(r.mode),
            main,
            override_ids: override_ids.into(),
            overrides: overrides.into(),
            counters: counters
                .get(r.name.as_str())
                .map_or_else(|| Arc::new(Counters::new(shards)), |c| (*c).clone()),
            own: r
                .limits_from
                .as_ref()
                .and_then(|c| sources.get(c.as_str()).cloned()),
        });
    }
    if let Some(o) = old {
        for r in o.rules.iter() {
            if !rules.rules.iter().any(|n| *n.name == *r.name) {
                report.removed.push(r.name.to_string());
            }
        }
    }
    let needs_load = rules.shedding.is_some()
        || rules
            .rules
            .iter()
            .any(|r| matches!(r.mode, Mode::Elastic { .. }));
    let routes = RouteTable::build(&rules.rules);
    Ok((
        Compiled {
            wide: routes.max_enforcing() > 64,
            routes,
            rules: out.into(),
            needs_load,
            load: LoadConfig::new(&rules.load),
            shedding: rules.shedding,
            summary: rules.summary(),
        },
        report,
    ))
}
