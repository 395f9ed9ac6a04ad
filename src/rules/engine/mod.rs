//! The engine: compiled rules (`compile`) behind an `ArcSwap`, one `check` per request, hot
//! reload. The check's protocol (consume, then refund) is described in the [module
//! docs](super); it is in `check` (with `explain`), the refund of an admitted request in
//! `refund`, a cost settled after the work in `settle`, the in-flight guards and the load in
//! `inflight`, the rules' counters in `stats`, the per-rule report of a check in `trace`, the explanation of a check from peeks in
//! `explain`.

mod check;
mod explain;
mod inflight;
mod refund;
mod settle;
mod stats;
mod trace;

use check::Quiet;
pub(super) use check::{by_mode, merge, near, pooled};
pub use explain::{
    Decider, Explanation, LimitState, LimitsFrom, RuleExplanation, RuleMode, RuleStep,
};
pub use inflight::{InFlight, OwnedInFlight};
pub use trace::RuleOutcome;

pub use super::compile::ReloadReport;
use super::compile::{compile, Compiled};
pub use super::counters::{LimitStats, RuleStats};
use super::limits::{self, LimitsClass, LimitsError, LimitsSource, LoadReport, MemoryLimits};
use super::load::Load;
use super::request::Request;
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
use std::sync::atomic::{AtomicU64, Ordering};
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
            near_below: AtomicU64::new((1.0 - DEFAULT_NEAR_LIMIT).to_bits()),
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
    /// `1 - share` of [`Engine::set_near_limit`], as `f64` bits.
    near_below: AtomicU64,
}

/// The share of a limit past which an admission is counted as near the limit, by default.
pub const DEFAULT_NEAR_LIMIT: f64 = 0.8;

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

    /// Sets the share of a limit past which an admission counts as near the limit in
    /// [`Engine::limit_stats`] (admitted with less than `1 - share` of the limit left); `share`
    /// in `0.0..=1.0`, [`DEFAULT_NEAR_LIMIT`] until set. Values outside are clamped.
    pub fn set_near_limit(&self, share: f64) {
        let share = if share.is_nan() {
            DEFAULT_NEAR_LIMIT
        } else {
            share.clamp(0.0, 1.0)
        };
        // Relaxed: a setting read by the statistics; nothing else is published through it.
        self.near_below
            .store((1.0 - share).to_bits(), Ordering::Relaxed);
    }

    /// The near-limit share (see [`Engine::set_near_limit`]).
    pub fn near_limit(&self) -> f64 {
        1.0 - self.near_below()
    }

    /// `1 - ` the near-limit share.
    #[inline(always)]
    pub(crate) fn near_below(&self) -> f64 {
        // Relaxed: as in `set_near_limit`.
        f64::from_bits(self.near_below.load(Ordering::Relaxed))
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
        limits::key_id(k, key, &self.hasher)
    }

    /// Re-reads the files of the limits classes that changed since they were read, each as
    /// [`MemoryLimits::load`] does: a file with a bad line is refused (`file:line`) and its
    /// class keeps its entries; until that file changes again, each call answers the same
    /// refusal without reading it. Returns, per class, what it read (`None`: nothing changed).
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
}
