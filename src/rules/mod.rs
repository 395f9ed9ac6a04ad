//! Rules: who gets which limit, how strictly, and who is shed first under overload.
//!
//! A rules file (TOML, `docs/rules.md`) or the equivalent builder API names rules. Each rule has
//! a key class (customer, IP address grouped by prefix, API key, route, method, a composite such
//! as customer + route, or one global key), conditions (route prefixes, methods, priorities),
//! one or more limits decided all-or-nothing, a mode (hard, soft, elastic, shadow) and per-key
//! overrides. An [`Engine`] compiles them and answers [`Engine::check`] for a borrowed
//! [`Request`], without allocating.
//!
//! # All-or-nothing across rules
//!
//! Inside one rule, the keyed store decides all of the rule's limits in one atomic step. Across
//! rules there is no common record to update atomically, so `check` *consumes, then refunds*:
//! it checks the matching enforcing rules in file order, each one taking the cost if it admits;
//! at the first denial it gives the cost back to the rules that took it (in reverse order, at
//! the same `now`) and answers that denial. So when any rule denies, no rule keeps a charge.
//!
//! The residual race, stated honestly: between a rule's charge and its refund (nanoseconds to
//! a few microseconds), a concurrent check of the same key sees the charge and may be denied
//! although, had the first request never been charged, it would have fit. The error is
//! one-sided: the engine never admits more than every limit allows, it can only deny a request
//! that a perfectly serial engine would have admitted, and only while a denial of the *same
//! key* elsewhere is being rolled back. A refund at the same `now` restores every algorithm's
//! count exactly, except where the algorithm's own refund is approximate (documented in
//! `docs/algorithms.md`). Putting the rule that denies most often first keeps refunds rare.
//! Limits with `count_denied` count the denial itself, in the rule that denied, by design.
//!
//! Shadow rules are evaluated after the enforcing rules admitted: a shadow rule takes the cost
//! when it would admit, counts a would-be denial when it would not, and never changes the
//! answer. An elastic rule draws from its extra pool only when its own limits deny.
//!
//! [`Engine::refund`] gives a whole admitted request back to every rule it matches (by mode:
//! see its docs), for requests that did not happen after all.
//!
//! # Reload
//!
//! [`Engine::reload`] compiles the new rules beside the old ones and swaps them in with one
//! `ArcSwap` store. A rule keeps its stores (and so its state) when its name, key class,
//! compiled limits (after soft scaling), capacity and full-store policy are unchanged; a check
//! that loaded the old rules just before the swap updates those same stores. A file that fails
//! to parse or validate is refused with `file:line:column: message` and the old rules stay.

mod compile;
mod counters;
mod engine;
mod keys;
pub mod limits;
mod load;
mod matcher;
mod model;
mod parse;
mod plan;
mod raw;
mod request;
mod validate;

pub use engine::{
    Decider, Engine, EngineBuilder, Explanation, InFlight, LimitState, LimitStats, LimitsFrom,
    LocalEngine, OwnedInFlight, Refusal, ReloadReport, RuleExplanation, RuleMode, RuleOutcome,
    RuleStats, RuleStep, Verdict, DEFAULT_NEAR_LIMIT, UNLIMITED,
};
pub use keys::{parse_customer, CustomerIdError};
pub use model::{
    redact_url, Backend, BackendLeaseMode, BackendLeases, BackendPolicy, KeyClass, KeyPart,
    LoadSettings, Match, Mode, Override, OverrideKey, RedisBackend, RedisNodes, Rule, Settings,
    Shedding, Threshold, DEFAULT_CAPACITY, DEFAULT_REDIS_SEED, DEFAULT_REDIS_TIMEOUT, MAX_CAPACITY,
    MAX_LIMITS, MAX_OVERRIDES, MAX_RULES,
};
pub use parse::{parse_duration, DurationError};
pub use plan::{Plan, PlanStep, StepOutcome};
pub use request::{Priority, Request, METHODS};

use crate::algo::Limit;
use crate::ConfigError;
use limits::LimitsClass;
use std::fmt;
use std::path::Path;
use validate::{Loc, Of, Rf};

/// A parsed, validated set of rules.
#[derive(Clone, Debug)]
pub struct Rules {
    /// File-wide defaults.
    pub settings: Settings,
    /// How the load is measured.
    pub load: LoadSettings,
    /// Priority load shedding, if enabled.
    pub shedding: Option<Shedding>,
    /// Where the counts are kept (`[backend]`; default: memory).
    pub backend: Backend,
    /// The rules, in evaluation order.
    pub rules: Vec<Rule>,
    /// The limits classes (`[limits.NAME]`): keys' own limits, for the rules that take them.
    pub classes: Vec<LimitsClass>,
    origin: String,
    /// Positions of the fields, for errors found after parsing.
    index: Vec<(Loc, usize, usize)>,
}

impl PartialEq for Rules {
    /// The same rules, wherever they came from.
    fn eq(&self, o: &Self) -> bool {
        (
            self.settings,
            self.load,
            self.shedding,
            &self.backend,
            &self.rules,
            &self.classes,
        ) == (
            o.settings, o.load, o.shedding, &o.backend, &o.rules, &o.classes,
        )
    }
}

/// Why a rules file was refused: where, what, how to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RulesError {
    /// The file (or origin label) it came from.
    pub origin: String,
    /// 1-based line, 0 if unknown.
    pub line: usize,
    /// 1-based column, 0 if unknown.
    pub column: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An error about the whole file (it cannot be read) has no position to give.
        if self.line == 0 {
            return write!(f, "{}: {}", self.origin, self.message);
        }
        write!(
            f,
            "{}:{}:{}: {}",
            self.origin, self.line, self.column, self.message
        )
    }
}

impl std::error::Error for RulesError {}

impl Rules {
    /// Parses and validates rules from TOML text; `origin` names the source in errors.
    /// Never panics, whatever the input.
    pub fn parse(text: &str, origin: &str) -> Result<Rules, RulesError> {
        parse::parse(text, origin)
    }

    /// Reads and parses a file. A limits class's relative `file` is read from the rules
    /// file's directory.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Rules, RulesError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let mut rules = Self::parse(&text, &origin)?;
                let dir = path.parent().unwrap_or(Path::new(""));
                for c in &mut rules.classes {
                    if let Some(f) = c.file.as_mut().filter(|f| f.is_relative()) {
                        *f = dir.join(&*f);
                    }
                }
                Ok(rules)
            }
            Err(e) => Err(RulesError {
                origin,
                line: 0,
                column: 0,
                message: format!("cannot read the rules file: {e}"),
            }),
        }
    }

    /// An empty set of rules to add to, validated by [`RulesBuilder::build`].
    pub fn builder() -> RulesBuilder {
        RulesBuilder {
            rules: Rules::default(),
        }
    }

    /// Where the rules came from (a file name, or `builder`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// An error about `loc`: at its line and column if the rules came from a file, else with
    /// the field's path in the message.
    pub(crate) fn error_at(&self, loc: Loc, message: String) -> RulesError {
        match parse::lookup(&self.index, loc) {
            Some((line, column)) => RulesError {
                origin: self.origin.clone(),
                line,
                column,
                message,
            },
            None => RulesError {
                origin: self.origin.clone(),
                line: 0,
                column: 0,
                message: format!("{}: {message}", loc.describe(&self.rules)),
            },
        }
    }

    /// An error about the `[backend]` table's Redis (`redis` or `redis_cluster`): at its line
    /// and column, for a backend that cannot reach it.
    pub fn backend_error(&self, message: impl Into<String>) -> RulesError {
        self.error_at(Loc::Backend("redis"), message.into())
    }

    /// Lets a backend refuse limits it cannot run, where they are written: `f` sees every
    /// limit of every rule, override and elastic pool as the engine compiles it (a soft
    /// rule's scaled, an elastic pool sized), with its rule; an error it returns is reported
    /// at the limit's field (its `ConfigError::field`, else the limit) as
    /// `file:line:column: message`.
    pub fn check_limits(
        &self,
        mut f: impl FnMut(&Rule, &Limit) -> Result<(), ConfigError>,
    ) -> Result<(), RulesError> {
        for (i, r) in self.rules.iter().enumerate() {
            let lists = std::iter::once((None, &r.limits)).chain(
                r.overrides
                    .iter()
                    .enumerate()
                    .map(|(o, x)| (Some(o), &x.limits)),
            );
            for (o, specs) in lists {
                let at = |j: usize, field: &'static str| match o {
                    None => Loc::Rule(i, Rf::Limit(j, field)),
                    Some(o) => Loc::Rule(i, Rf::Override(o, Of::Limit(j, field))),
                };
                let whole = match o {
                    None => Loc::Rule(i, Rf::Limits),
                    Some(o) => Loc::Rule(i, Rf::Override(o, Of::Limits)),
                };
                let (main, pool) = validate::compile_limits(specs, r.mode, at, whole)
                    .map_err(|(l, m)| self.error_at(l, m))?;
                for (k, limits) in std::iter::once(Some(&main))
                    .chain([pool.as_ref()])
                    .enumerate()
                {
                    let Some(limits) = limits else { continue };
                    for (j, l) in limits.limits().iter().enumerate() {
                        if let Err(e) = f(r, l) {
                            let what = if k == 1 { " (the elastic pool)" } else { "" };
                            return Err(
                                self.error_at(at(j, e.field), format!("{}{what}", e.message))
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A one-line description: rule counts by mode, overrides, limits, load and shedding.
    pub fn summary(&self) -> String {
        let n = |m: &str| self.rules.iter().filter(|r| r.mode.name() == m).count();
        let overrides: usize = self.rules.iter().map(|r| r.overrides.len()).sum();
        let limits: usize = self
            .rules
            .iter()
            .map(|r| r.limits.len() + r.overrides.iter().map(|o| o.limits.len()).sum::<usize>())
            .sum();
        let mut s = format!(
            "{} rules ({} hard, {} soft, {} elastic, {} shadow), {overrides} overrides, {limits} limits",
            self.rules.len(),
            n("hard"),
            n("soft"),
            n("elastic"),
            n("shadow")
        );
        if let Some(m) = self.load.max_in_flight {
            s.push_str(&format!("; max_in_flight {m}"));
        }
        match &self.shedding {
            None => s.push_str("; no shedding"),
            Some(sh) => {
                let t: Vec<String> = Priority::ALL
                    .iter()
                    .rev()
                    .filter_map(|p| sh.thresholds[p.index()].map(|t| format!("{p} at {}", t.on)))
                    .collect();
                s.push_str(&format!(
                    "; shedding {}, critical reserve {}%",
                    if t.is_empty() {
                        "by reserve only".into()
                    } else {
                        t.join(", ")
                    },
                    (sh.critical_reserve * 100.0).round()
                ));
            }
        }
        if !self.classes.is_empty() {
            let names: Vec<&str> = self.classes.iter().map(|c| c.name.as_str()).collect();
            s.push_str(&format!("; limits classes {}", names.join(", ")));
        }
        match &self.backend {
            Backend::Memory => {}
            Backend::Redis(b) => {
                match &b.nodes {
                    RedisNodes::Single(u) => {
                        s.push_str(&format!("; backend redis {}", redact_url(u)))
                    }
                    RedisNodes::Cluster(v) => {
                        s.push_str(&format!("; backend redis cluster ({} URLs)", v.len()))
                    }
                }
                if b.leases != BackendLeases::Off {
                    s.push_str(&format!("; {}", b.leases.bound()));
                }
            }
        }
        s
    }
}

/// Builds [`Rules`] in code; [`RulesBuilder::build`] runs the same validation as a file.
#[derive(Clone, Debug)]
pub struct RulesBuilder {
    rules: Rules,
}

impl RulesBuilder {
    /// Adds a rule (evaluated in the order added).
    pub fn rule(mut self, r: Rule) -> Self {
        self.rules.rules.push(r);
        self
    }
    /// Sets the file-wide defaults.
    pub fn settings(mut self, s: Settings) -> Self {
        self.rules.settings = s;
        self
    }
    /// Sets how the load is measured.
    pub fn load(mut self, l: LoadSettings) -> Self {
        self.rules.load = l;
        self
    }
    /// Enables priority shedding.
    pub fn shedding(mut self, s: Shedding) -> Self {
        self.rules.shedding = Some(s);
        self
    }
    /// Adds a limits class (keys' own limits, for rules with `limits_from`).
    pub fn class(mut self, c: LimitsClass) -> Self {
        self.rules.classes.push(c);
        self
    }
    /// Sets where the counts are kept.
    pub fn backend(mut self, b: Backend) -> Self {
        self.rules.backend = b;
        self
    }
    /// Names the origin used in errors (default `builder`).
    pub fn origin(mut self, origin: impl Into<String>) -> Self {
        self.rules.origin = origin.into();
        self
    }
    /// Validates.
    pub fn build(self) -> Result<Rules, RulesError> {
        let r = self.rules;
        validate::validate(&r).map_err(|(loc, m)| r.error_at(loc, m))?;
        Ok(r)
    }
}
