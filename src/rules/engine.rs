//! The engine: compiled rules (`compile`) behind an `ArcSwap`, one `check` per request, hot
//! reload. The check's protocol (consume, then refund) is described in the [module
//! docs](super).

use super::compile::{compile, CRule, Compiled, Kind, Slot, DENIED, ELASTIC, OVER, WOULD};
pub use super::compile::{ReloadReport, RuleStats};
use super::limits::{self, LimitsClass, LimitsError, LimitsSource, LoadReport, MemoryLimits};
use super::load::Load;
use super::matcher::{sel, Cand};
use super::model::{Shedding, MAX_RULES};
use super::request::{method_slot, Priority, Request};
use super::validate::{Cf, Loc};
use super::{Rules, RulesError};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::{Decision, Outcome};
use crate::keyed::KeyHasher;
use arc_swap::cache::Cache;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::path::Path;
// arc-swap swaps a std `Arc`; loom does not model arc-swap, so this module uses std's `Arc`
// (the rules layer is not loom-checked; the stores under it are).
use std::sync::{Arc, Mutex};

/// Why a check was answered as it was (see [`Engine::explain`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The answer.
    pub decision: Decision,
    /// The rule that denied, if one did.
    pub rule: Option<Arc<str>>,
    /// Whether the request was shed (load shedding, before any rule).
    pub shed: bool,
    /// Enforcing rules that matched and admitted.
    pub matched: u32,
    /// Shadow rules that would have denied.
    pub would_deny: u32,
}

/// A request [`Engine::try_admit_owned`] refused: the decision, and the rule that denied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The decision.
    pub decision: Decision,
    /// The enforcing rule that denied; `None` when no rule did (shed by priority, before any
    /// rule).
    pub rule: Option<Arc<str>>,
}

/// What [`Engine::explain`] adds to a decision.
#[derive(Default)]
struct Why {
    rule: Option<u32>,
    shed: bool,
    matched: u32,
    would_deny: u32,
}

/// What a check notes down along the way: nothing for [`Engine::check`] ([`Quiet`], compiled
/// away), a [`Why`] for [`Engine::explain`].
trait Track {
    /// Whether the check takes the general path (every candidate of the route, filtered by
    /// its mask, the method always parsed) rather than the precomputed fast paths.
    const GENERAL: bool = false;
    fn shed(&mut self) {}
    fn matched(&mut self) {}
    fn denied(&mut self, _rule: u32) {}
    fn would_deny(&mut self) {}
}

/// Notes nothing.
struct Quiet;

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
struct Denier {
    rule: Option<u32>,
}

impl Track for Denier {
    fn denied(&mut self, rule: u32) {
        self.rule = Some(rule);
    }
}

impl Track for Why {
    const GENERAL: bool = true;
    fn shed(&mut self) {
        self.shed = true;
    }
    fn matched(&mut self) {
        self.matched += 1;
    }
    fn denied(&mut self, rule: u32) {
        self.rule = Some(rule);
    }
    fn would_deny(&mut self) {
        self.would_deny += 1;
    }
}

/// Words of the bit set of candidates whose elastic pool took the cost, when some route has
/// more than 64 enforcing candidates.
const WIDE: usize = MAX_RULES.div_ceil(64);

/// A request in flight: counted in the load until dropped. From [`Engine::admit`] or
/// [`Engine::enter`].
#[must_use = "the request counts as in flight until this guard is dropped"]
pub struct InFlight<'a> {
    load: &'a Load,
    shard: usize,
    decision: Decision,
}

impl InFlight<'_> {
    /// The decision that admitted it.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.load.exit(self.shard);
    }
}

/// [`InFlight`] that owns its share of the engine's load counter (an `Arc`), so it can cross
/// `.await`s, be moved into `tokio::spawn`ed tasks and outlive the borrow of the engine: a
/// server holds one until the response body has been sent or dropped. From
/// [`Engine::admit_owned`] or [`Engine::enter_owned`]. Costs one more atomic increment and
/// decrement (the `Arc`'s count) than the borrowed guard.
#[must_use = "the request counts as in flight until this guard is dropped"]
pub struct OwnedInFlight {
    load: Arc<Load>,
    shard: usize,
    decision: Decision,
}

impl OwnedInFlight {
    /// The decision that admitted it.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl Drop for OwnedInFlight {
    fn drop(&mut self) {
        self.load.exit(self.shard);
    }
}

impl std::fmt::Debug for OwnedInFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedInFlight")
            .field("shard", &self.shard)
            .field("decision", &self.decision)
            .finish()
    }
}

/// The decision when no rule applies.
pub const UNLIMITED: Decision = Decision {
    outcome: Outcome::Allowed,
    limit: u64::MAX,
    remaining: u64::MAX,
    reset_after_ns: 0,
    retry_after_ns: None,
    delay_ns: 0,
};

/// A per-thread handle on an [`Engine`] (from [`Engine::local`]): the same checks, with the
/// rules cached in the handle, so that a check costs one relaxed load to see whether they were
/// reloaded instead of arc-swap's per-load bookkeeping. For thread-per-core servers: create
/// one per worker thread. After a reload, the handle holds on to the old rules (and their
/// stores' memory) until its next check.
pub struct LocalEngine<'a, C: Clock> {
    engine: &'a Engine<C>,
    cache: Cache<&'a ArcSwap<Compiled<C>>, Arc<Compiled<C>>>,
}

impl<C: Clock> LocalEngine<'_, C> {
    /// [`Engine::check`].
    #[inline]
    pub fn check(&mut self, req: &Request<'_>) -> Decision {
        let now = self.engine.clock.now();
        self.check_at(req, now)
    }

    /// [`Engine::check_at`].
    #[inline]
    pub fn check_at(&mut self, req: &Request<'_>, now: Nanos) -> Decision {
        let c = self.cache.load();
        self.engine.eval_in(c, req, now, &mut Quiet)
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<C> {
        self.engine
    }
}

/// Builds an [`Engine`].
pub struct EngineBuilder {
    rules: Rules,
    seed: Option<u64>,
    provided: HashMap<String, Arc<dyn LimitsSource>>,
}

impl EngineBuilder {
    /// Fixed hash seed (reproducible key ids and placement); default: random per engine.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// Takes limits class `class`'s entries from `source` (a cache in front of Redis, say)
    /// instead of the built-in [`MemoryLimits`]; the rules file still defines the class (its
    /// key, algorithm and plans: [`LimitsSource::reclass`]).
    pub fn limits_source(
        mut self,
        class: impl Into<String>,
        source: Arc<dyn LimitsSource>,
    ) -> Self {
        self.provided.insert(class.into(), source);
        self
    }
    /// Builds on the default clock ([`DefaultClock`]).
    pub fn build(self) -> Result<Engine<DefaultClock>, RulesError> {
        self.build_with_clock(DefaultClock::new())
    }
    /// Builds on `clock`.
    pub fn build_with_clock<C: Clock>(self, clock: C) -> Result<Engine<C>, RulesError> {
        let clock = Arc::new(clock);
        let hasher = match self.seed {
            Some(s) => KeyHasher::with_seed(s, 64),
            None => KeyHasher::random(64),
        };
        let load = Arc::new(Load::new());
        let classes = classes(&self.rules, &HashMap::new(), &self.provided, &hasher)?;
        let (c, _) = compile(
            &self.rules,
            None,
            &clock,
            &hasher,
            self.seed,
            load.shards(),
            &sources(&classes),
        )?;
        Ok(Engine {
            clock,
            hasher,
            seed: self.seed,
            current: ArcSwap::from_pointee(c),
            load,
            reload: Mutex::new(()),
            classes: Mutex::new(classes),
            provided: self.provided,
        })
    }
}

/// Rules applied to requests. See the [module docs](super).
pub struct Engine<C: Clock = DefaultClock> {
    pub(super) clock: Arc<C>,
    pub(super) hasher: KeyHasher,
    seed: Option<u64>,
    pub(super) current: ArcSwap<Compiled<C>>,
    /// Shared with the owned in-flight guards ([`OwnedInFlight`]).
    pub(super) load: Arc<Load>,
    reload: Mutex<()>,
    /// The limits classes of the loaded rules, by name, with their sources.
    classes: Mutex<Classes>,
    /// Sources given to the builder, by class name.
    provided: HashMap<String, Arc<dyn LimitsSource>>,
}

/// Limits classes by name, with their sources.
type Classes = HashMap<String, (LimitsClass, Arc<dyn LimitsSource>)>;

/// The sources of `rules`' limits classes: those given to the builder, the old ones (their
/// plans updated and their files re-read if changed), or new ones.
fn classes(
    rules: &Rules,
    old: &Classes,
    provided: &HashMap<String, Arc<dyn LimitsSource>>,
    hasher: &KeyHasher,
) -> Result<Classes, RulesError> {
    let mut out = HashMap::new();
    for (c, class) in rules.classes.iter().enumerate() {
        let at = |m: String| rules.error_at(Loc::Class(c, Cf::Table), m);
        let in_file = |e: LimitsError| match e.origin {
            Some(origin) => RulesError {
                origin,
                line: e.line,
                column: usize::from(e.line > 0),
                message: e.message,
            },
            None => at(e.message),
        };
        let kept = provided
            .get(&class.name)
            .or_else(|| old.get(&class.name).map(|(_, s)| s))
            .filter(|s| s.reclass(class).is_ok())
            .cloned();
        let source: Arc<dyn LimitsSource> = match kept {
            Some(s) => {
                s.refresh().map_err(in_file)?;
                s
            }
            None if provided.contains_key(&class.name) => {
                let e = provided[&class.name].reclass(class).unwrap_err();
                return Err(at(e.message));
            }
            None => Arc::new(MemoryLimits::new(class, hasher.clone()).map_err(in_file)?),
        };
        out.insert(class.name.clone(), (class.clone(), source));
    }
    Ok(out)
}

/// The sources of `classes`, by name.
fn sources(classes: &Classes) -> HashMap<String, Arc<dyn LimitsSource>> {
    classes
        .iter()
        .map(|(n, (_, s))| (n.clone(), s.clone()))
        .collect()
}

impl Engine<DefaultClock> {
    /// A builder for an engine applying `rules`.
    pub fn builder(rules: Rules) -> EngineBuilder {
        EngineBuilder {
            rules,
            seed: None,
            provided: HashMap::new(),
        }
    }
    /// An engine on the monotonic clock.
    pub fn new(rules: Rules) -> Result<Self, RulesError> {
        Self::builder(rules).build()
    }
}

fn shed_decision(s: &Shedding) -> Decision {
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

/// Whether a peek shows a charge (less than the whole limit remains).
fn charged(d: &Decision) -> bool {
    d.remaining < d.limit
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

/// An elastic rule's admission by its extra pool: its own limits' denial `d`, the pool's
/// admission `e`.
#[inline]
pub(super) fn pooled(d: &Decision, e: &Decision) -> Decision {
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
pub(super) fn merge(a: &mut Decision, d: &Decision) {
    let reset = a.reset_after_ns.max(d.reset_after_ns);
    let delay = a.delay_ns.max(d.delay_ns);
    if d.remaining < a.remaining {
        *a = *d;
    }
    a.reset_after_ns = reset;
    a.delay_ns = delay;
}

impl<C: Clock> Engine<C> {
    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Checks `req` now: every matching rule, all-or-nothing.
    #[inline]
    pub fn check(&self, req: &Request<'_>) -> Decision {
        self.check_at(req, self.clock.now())
    }

    /// [`Engine::check`] at `now`.
    #[inline]
    pub fn check_at(&self, req: &Request<'_>, now: Nanos) -> Decision {
        self.eval(req, now)
    }

    /// A per-thread handle with cheaper checks (see [`LocalEngine`]).
    pub fn local(&self) -> LocalEngine<'_, C> {
        LocalEngine {
            engine: self,
            cache: Cache::new(&self.current),
        }
    }

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

    /// Gives back a request that [`Engine::check`] admitted and that did not happen after all
    /// (cancelled, failed upstream, not billable): `req.cost` × each rule's `cost` goes back
    /// to every rule the request matches now — by the same route, method, priority and key
    /// as the check, so pass the same [`Request`]. Returns how many rules were given it (0:
    /// no rule applies). Nothing is counted in the rules' statistics.
    ///
    /// By mode and algorithm:
    ///
    /// * hard and soft rules: their store gets the cost back (a soft rule's tolerance band is
    ///   part of its store, so the band refills first, as it was spent last);
    /// * elastic rules: the extra pool if it holds a charge (the pool is drawn only once the
    ///   rule's own limits are spent, so its charges are the newest), else the rule's own
    ///   limits;
    /// * shadow rules: given it back too, so that they keep counting what an enforcing rule in
    ///   their place would;
    /// * per algorithm, as [`Store::refund_at`](crate::keyed::Store::refund_at) does: a fixed
    ///   or sliding window gives back to its current window only (nothing once the window
    ///   that was charged has passed), a token or leaky bucket never above its capacity, a
    ///   sliding log its newest admissions, a window ring its newest sub-windows first
    ///   (rules hold no concurrency limit: a rules file refuses one, so every rule can give
    ///   back).
    ///
    /// The engine does not remember requests: a refund of a request that was denied, or
    /// refunded already, gives back units that other requests of the same key took (never
    /// more than the limit: each store caps at full). After a reload, rules whose state was
    /// kept get the cost back; rules that started fresh have nothing to give back.
    pub fn refund(&self, req: &Request<'_>) -> u32 {
        self.refund_at(req, self.clock.now())
    }

    /// [`Engine::refund`] at `now`.
    pub fn refund_at(&self, req: &Request<'_>, now: Nanos) -> u32 {
        let c = self.current.load();
        let m = method_slot(req.method);
        let prio = req.priority.unwrap_or_else(|| Priority::of_method_index(m));
        let s = sel(m, prio);
        let cands = c.routes.candidates(req.route);
        let mut n = 0;
        for cand in cands.enforce.iter().chain(cands.shadow.iter()) {
            if !cand.admits(s) {
                continue;
            }
            let r = &c.rules[cand.rule as usize];
            let Some(id) = r.plan.id(req, &self.hasher) else {
                continue;
            };
            let t = r.target(id);
            let cost = req.cost.saturating_mul(r.cost);
            match &t.slot.pool {
                Some(p) if charged(&p.store.peek_at(&id, now)) => p.store.refund_at(&id, cost, now),
                _ => t.refund_at(id, cost, now),
            }
            n += 1;
        }
        n
    }

    /// Checks `req` and, if admitted, counts it in flight until the returned guard drops
    /// (the load that shedding and elastic rules read).
    pub fn admit(&self, req: &Request<'_>) -> Result<InFlight<'_>, Decision> {
        let d = self.check(req);
        if !d.allowed() {
            return Err(d);
        }
        let shard = self.load.shard();
        self.load.enter(shard);
        Ok(InFlight {
            load: &self.load,
            shard,
            decision: d,
        })
    }

    /// Counts a request in flight until the guard drops, without checking it.
    pub fn enter(&self) -> InFlight<'_> {
        let shard = self.load.shard();
        self.load.enter(shard);
        InFlight {
            load: &self.load,
            shard,
            decision: UNLIMITED,
        }
    }

    /// [`Engine::admit`], with a guard that owns its share of the load counter
    /// ([`OwnedInFlight`]: it may outlive this borrow, cross `.await`s and move to other tasks).
    pub fn admit_owned(&self, req: &Request<'_>) -> Result<OwnedInFlight, Decision> {
        let d = self.check(req);
        if !d.allowed() {
            return Err(d);
        }
        Ok(self.owned(d))
    }

    /// [`Engine::admit_owned`], also saying which rule denied a refused request (as
    /// [`Engine::explain`] does, but on the same fast paths as [`Engine::check`]): what a
    /// server names in its refusal. An admission costs what `admit_owned`'s does; a denial,
    /// one more reference count on the rule's name.
    pub fn try_admit_owned(&self, req: &Request<'_>) -> Result<OwnedInFlight, Refusal> {
        let c = self.current.load();
        let mut why = Denier::default();
        let decision = self.eval_in(&c, req, self.clock.now(), &mut why);
        if !decision.allowed() {
            return Err(Refusal {
                decision,
                rule: why
                    .rule
                    .and_then(|i| c.rules.get(i as usize))
                    .map(|r| r.name.clone()),
            });
        }
        Ok(self.owned(decision))
    }

    /// [`Engine::enter`], with an owned guard.
    pub fn enter_owned(&self) -> OwnedInFlight {
        self.owned(UNLIMITED)
    }

    fn owned(&self, decision: Decision) -> OwnedInFlight {
        let shard = self.load.shard();
        self.load.enter(shard);
        OwnedInFlight {
            load: Arc::clone(&self.load),
            shard,
            decision,
        }
    }

    /// Reports the application's utilization (0..=1: busy workers, CPU, queue fill...). The
    /// load is the larger of this and in-flight / `max_in_flight`.
    pub fn report_utilization(&self, u: f64) {
        self.load.report(u);
        let c = self.current.load();
        self.load.refresh(&c.load, c.shedding.as_ref());
    }

    /// Measures the load now (and updates the shedding state).
    pub fn load(&self) -> f64 {
        let c = self.current.load();
        self.load.refresh(&c.load, c.shedding.as_ref())
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.load.in_flight()
    }

    /// The priorities being shed by their thresholds now.
    pub fn shedding(&self) -> Vec<Priority> {
        self.load.shedding()
    }

    /// Requests shed per priority (indexed by [`Priority::index`]).
    pub fn shed_counts(&self) -> [u64; 4] {
        self.load.shed_counts()
    }

    /// A rule's counters.
    pub fn rule_stats(&self, name: &str) -> Option<RuleStats> {
        let c = self.current.load();
        c.rules
            .iter()
            .find(|r| &*r.name == name)
            .map(|r| r.counters.get())
    }

    /// The loaded rules' names, in order.
    pub fn rule_names(&self) -> Vec<String> {
        self.current
            .load()
            .rules
            .iter()
            .map(|r| r.name.to_string())
            .collect()
    }

    /// A one-line description of the loaded rules.
    pub fn summary(&self) -> String {
        self.current.load().summary.clone()
    }

    /// Live keys in a rule's main store.
    pub fn rule_keys(&self, name: &str) -> Option<usize> {
        let c = self.current.load();
        c.rules
            .iter()
            .find(|r| &*r.name == name)
            .map(|r| r.main.main.store.len())
    }

    /// Visits every store of the loaded rules (each rule's, each override's, each elastic
    /// pool's) with a description of what its records mean: the rule's name, the override's
    /// key id, whether it is a pool, the key class, the compiled limits and the capacity. Two
    /// stores described alike hold records that read alike, in this process or another one
    /// built with the same [`EngineBuilder::seed`] (key ids are hashes under it) — snapshot
    /// support, with [`Store::export_records`](crate::keyed::Store::export_records) and
    /// [`Store::import_record`](crate::keyed::Store::import_record). A rule changed in any of
    /// these is described differently: its old records are not its new store's.
    pub fn for_each_store(&self, mut f: impl FnMut(&str, &crate::keyed::Store<Arc<C>>)) {
        let c = self.current.load();
        for r in c.rules.iter() {
            for s in std::iter::once(&r.main).chain(r.overrides.iter()) {
                for p in std::iter::once(&s.main).chain(s.pool.iter()) {
                    f(&p.ident.describe(), &p.store);
                }
            }
        }
    }

    /// Replaces the rules atomically. Stores of rules whose name, key class, limits and
    /// capacity are unchanged are kept (with their state); on error nothing changes.
    pub fn reload(&self, rules: Rules) -> Result<ReloadReport, RulesError> {
        let _g = self.reload.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current.load_full();
        let classes = classes(&rules, &self.classes(), &self.provided, &self.hasher)?;
        let (c, report) = compile(
            &rules,
            Some(&old),
            &self.clock,
            &self.hasher,
            self.seed,
            self.load.shards(),
            &sources(&classes),
        )?;
        self.current.store(Arc::new(c));
        *self.classes() = classes;
        Ok(report)
    }

    fn classes(&self) -> std::sync::MutexGuard<'_, Classes> {
        self.classes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The source of limits class `class`'s entries (to read or change them live:
    /// [`LimitsSource::set`], [`LimitsSource::remove`]).
    pub fn limits(&self, class: &str) -> Option<Arc<dyn LimitsSource>> {
        self.classes().get(class).map(|(_, s)| s.clone())
    }

    /// The loaded limits classes.
    pub fn limits_classes(&self) -> Vec<LimitsClass> {
        self.classes().values().map(|(c, _)| c.clone()).collect()
    }

    /// The id of `key` (text, as the class's key class reads it: a customer id, an address,
    /// an API key) in limits class `class`: what its source is keyed by.
    pub fn limits_key_id(&self, class: &str, key: &str) -> Result<u64, LimitsError> {
        let k = match self.classes().get(class) {
            Some((c, _)) => c.key,
            None => return Err(LimitsError::new(format!("no limits class `{class}`"))),
        };
        limits::key_id(k, key, &self.hasher).map_err(LimitsError::new)
    }

    /// Re-reads the files of the limits classes that changed since they were read, each as
    /// [`MemoryLimits::load`] does: a file with a bad line is refused (`file:line`) and its
    /// class keeps its entries. Returns, per class, what it read (`None`: nothing changed).
    /// Cheap when nothing changed (a `stat` per file): a server calls it every second or so,
    /// and on SIGHUP.
    pub fn refresh_limits(&self) -> Vec<(String, Result<Option<LoadReport>, LimitsError>)> {
        let classes: Vec<(String, Arc<dyn LimitsSource>)> = self
            .classes()
            .iter()
            .map(|(n, (_, s))| (n.clone(), s.clone()))
            .collect();
        classes.into_iter().map(|(n, s)| (n, s.refresh())).collect()
    }

    /// Parses `text` and reloads; a bad file changes nothing.
    pub fn reload_str(&self, text: &str, origin: &str) -> Result<ReloadReport, RulesError> {
        self.reload(Rules::parse(text, origin)?)
    }

    /// Reads, parses and reloads a file; a bad file changes nothing.
    pub fn reload_file(&self, path: impl AsRef<Path>) -> Result<ReloadReport, RulesError> {
        self.reload(Rules::from_file(path)?)
    }

    #[inline]
    fn eval(&self, req: &Request<'_>, now: Nanos) -> Decision {
        let c = self.current.load();
        self.eval_in(&c, req, now, &mut Quiet)
    }

    /// The check: the decision, and in `why` the rule that denied and the counts.
    #[inline]
    fn eval_in<T: Track>(
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
                Step::Admitted => why.matched(),
                Step::Pooled => {
                    pooled[k / 64] |= 1 << (k % 64);
                    why.matched();
                }
                Step::Denied => {
                    self.deny(c, req, &enforce[..k], now, &pooled, sel, cand.rule);
                    self.latest(c, req, &enforce[k + 1..], sel, now, load, &mut acc);
                    why.denied(cand.rule);
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
        let d = if matches!(r.kind, Kind::Hard) && d.allowed() {
            d
        } else {
            match self.decide(r, t.slot, d, id, cost, now, load) {
                Ok((d, _)) => d,
                Err(d) => {
                    self.deny(c, req, &[], now, &[], sel, rule);
                    why.denied(rule);
                    return d;
                }
            }
        };
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
        // The common case inline: a hard rule that admits.
        if matches!(r.kind, Kind::Hard) && d.allowed() {
            merge(acc, &d);
            return Step::Admitted;
        }
        match self.decide(r, t.slot, d, id, cost, now, load) {
            Ok((d, pool)) => {
                merge(acc, &d);
                if pool {
                    Step::Pooled
                } else {
                    Step::Admitted
                }
            }
            Err(d) => {
                *acc = d;
                Step::Denied
            }
        }
    }

    /// The load for this check, or the decision if the request is shed. Out of line: a check
    /// without shedding or elastic rules does not need it.
    #[inline(never)]
    pub(super) fn load_or_shed(
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
            if !cand.admits(sel) {
                continue;
            }
            let r = &c.rules[cand.rule as usize];
            let Some(id) = r.plan.id(req, &self.hasher) else {
                continue;
            };
            let cost = req.cost.saturating_mul(r.cost);
            if !r.target(id).check_at(id, cost, now).allowed() {
                r.counters.add(self.load.shard(), WOULD);
                why.would_deny();
            }
        }
    }

    /// Gives the cost back to the enforcing rules among `cands` that took it (all of them: the
    /// check stopped at the first denial). Re-derives each rule's key and store exactly as the
    /// check did; `pooled` says which took it from an elastic pool.
    #[cold]
    #[inline(never)]
    fn refund_taken(
        &self,
        c: &Compiled<C>,
        req: &Request<'_>,
        cands: &[Cand],
        now: Nanos,
        pooled: &[u64],
        sel: u32,
    ) {
        for (k, cand) in cands.iter().enumerate().rev() {
            if !cand.admits(sel) {
                continue;
            }
            let r = &c.rules[cand.rule as usize];
            let Some(id) = r.plan.id(req, &self.hasher) else {
                continue;
            };
            let t = r.target(id);
            let pool = pooled[k / 64] >> (k % 64) & 1 == 1;
            let cost = req.cost.saturating_mul(r.cost);
            match (&t.slot.pool, pool) {
                (Some(p), true) => p.store.refund_at(&id, cost, now),
                _ => t.refund_at(id, cost, now),
            }
        }
    }

    /// A denial by enforcing rule `rule`, after the candidates `cands` before it: their refund
    /// and the rule's counter. Out of line, so that the check path does not prepare for it.
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
        self.refund_taken(c, req, cands, now, pooled, sel);
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
    fn latest(
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
            if !cand.admits(sel) {
                continue;
            }
            let r = &c.rules[cand.rule as usize];
            let Some(id) = r.plan.id(req, &self.hasher) else {
                continue;
            };
            let cost = req.cost.saturating_mul(r.cost);
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
        match r.kind {
            Kind::Hard | Kind::Shadow => {
                if d.allowed() {
                    Ok((d, false))
                } else {
                    Err(d)
                }
            }
            Kind::Soft => {
                let (d, over) = soft_view(&slot.nominal, d);
                if !d.allowed() {
                    return Err(d);
                }
                if over {
                    r.counters.add(self.load.shard(), OVER);
                }
                Ok((d, false))
            }
            Kind::Elastic { below } => {
                if d.allowed() {
                    return Ok((d, false));
                }
                if d.outcome == Outcome::Limited && load < below {
                    if let Some(pool) = &slot.pool {
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
    }
}
