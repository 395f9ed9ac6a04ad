//! The rules engine on Redis: a rules file's `[backend] redis = "..."` (or `redis_cluster`)
//! keeps every rule's counts in Redis, shared by every process that reads the same file.
//!
//! The engine stays in memory and decides what does not touch a count — shedding (by this
//! process's load), which rules match, keys, overrides, an elastic pool's load condition —
//! as a [`Plan`]; [`RedisRules`] executes the plan in Redis and hands the outcomes back to
//! [`Plan::finish`], which applies the modes and counts the rules' statistics exactly as the
//! in-memory check does.
//!
//! **One script per request.** On one Redis node, all of a request's rules are decided in one
//! atomic call (`lua/rules.lua`): enforcing rules asked in order, all-or-nothing, then the
//! shadow rules — the engine's consume-then-refund protocol without its residual race, since
//! nothing else runs in between. In a Redis Cluster, a call's keys must share a slot: every
//! Redis key carries the request's key id as its `{hash tag}`, so the rules of one key id (all
//! rules keyed by customer, say) share a slot and still go in one call; rules whose ids differ
//! (a customer rule and an IP rule) are decided per id, concurrently, and consume then refund
//! across ids as the engine does (a denial in one gives back the others' charges, one more
//! call each), then the shadow rules. See docs/redis.md.
//!
//! **Leases** (`[backend] leases = "auto"`): the rules whose own limits can be leased are
//! decided by lease tiers of their own, on the same records (leased.rs); a request mixing
//! leased and other rules consumes from both and gives back if one denies.
//!
//! **Keys:** `<prefix><rule>[:o][:p]:{<key id, hex>}:<limit index><algorithm>[.<layout>]`:
//! `:o` an override's limits, `:p` an elastic rule's pool; the rule name with `%`, `:`, `{`
//! and `}` percent-encoded; `<layout>` a hash of what a limit's record means (a window's
//! length, a ring's shape, a log's length), so that a reload keeps a rule's counts in Redis
//! exactly when the in-memory engine would carry them (`Limit::carries_to`) and starts fresh
//! otherwise. Key ids are hashed under `[backend] seed`, the same in every process.

use crate::call::{fcall, Caller};
use crate::conn::Conn;
use crate::error::Error;
use crate::policy::{blind, FailureGate, FailurePolicy, FailureStats};
use crate::reply;
use crate::script::{self, limit_args, record_layout};
use std::fmt::Write;
use std::time::Duration;
use turnstile::keyed::KeyHasher;
use turnstile::rules::{
    Backend, BackendPolicy, Engine, Plan, PlanStep, RedisBackend, RedisNodes, Request, Rules,
    RulesError, StepOutcome, Verdict, UNLIMITED,
};
use turnstile::{Clock, ConfigError, Decision, Limit, Limits, Outcome};

mod exec;
mod leased;
mod settle;
mod unconnected;
use leased::{Leased, LeasedRules};
pub use unconnected::UnconnectedRules;

/// How long connecting to Redis may take before the rules are refused.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A rules file's Redis backend: executes the engine's [`Plan`]s in Redis (see the [module
/// docs](self)). One per `[backend]` table; [`RedisRules::reload`] follows a reload that keeps
/// the table as it is.
pub struct RedisRules {
    caller: Caller,
    backend: RedisBackend,
    keys: KeyHasher,
    gate: FailureGate,
    /// Policy `insurance`: the same rules in memory, every limit ÷ expected nodes.
    insurance: Option<Engine>,
    /// `[backend] leases = "auto"`: the leased rules' tiers (leased.rs).
    leases: Option<LeasedRules>,
}

impl std::fmt::Debug for RedisRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRules")
            .field("backend", &self.backend)
            .finish()
    }
}

/// The failure policy's answer to `req` (counted as a fallback): the insurance rules', or
/// `open`'s admission, or `closed`'s denial.
fn by_policy(gate: &FailureGate, insurance: Option<&Engine>, req: &Request<'_>) -> Verdict {
    gate.fell_back(1);
    let decision = match (insurance, gate.policy) {
        (Some(e), _) => return e.explain(req),
        (None, FailurePolicy::Open) => Decision {
            outcome: Outcome::Untracked,
            ..UNLIMITED
        },
        (None, p) => blind(p, 0),
    };
    Verdict {
        decision,
        rule: None,
        shed: false,
        matched: 0,
        would_deny: 0,
    }
}

/// The failure policy `[backend] policy` names.
fn policy_of(b: &RedisBackend) -> FailurePolicy {
    match b.policy {
        BackendPolicy::Open => FailurePolicy::Open,
        BackendPolicy::Closed => FailurePolicy::Closed,
        BackendPolicy::Insurance { expected_nodes } => FailurePolicy::Insurance { expected_nodes },
    }
}

/// Why Redis cannot run `l`, if it cannot: a duration beyond what its scripts compute exactly.
fn runs_on_redis(l: &Limit) -> Result<(), ConfigError> {
    limit_args(l).map(|_| ()).map_err(|mut e| {
        e.message.push_str(" ([backend] redis)");
        e
    })
}

/// `rules` with every limit and burst divided by `nodes` (at least 1), in memory: the
/// insurance policy's rules.
fn insurance_rules(rules: &Rules, nodes: u64) -> Rules {
    let mut r = rules.clone();
    r.backend = Backend::Memory;
    let n = nodes.max(1);
    for rule in &mut r.rules {
        let overrides = rule.overrides.iter_mut().flat_map(|o| o.limits.iter_mut());
        for spec in rule.limits.iter_mut().chain(overrides) {
            spec.limit = (spec.limit / n).max(1);
            spec.burst = spec.burst.map(|b| (b / n).max(1));
            if let (Some(d), Some(b)) = (spec.delay, spec.burst) {
                spec.delay = Some(d.min(b));
            }
        }
    }
    r
}

impl RedisRules {
    /// The Redis backend `rules` ask for, after checking that Redis can run every one of their
    /// limits (errors at the limit's `file:line:column`). An error if the rules keep their
    /// counts in memory.
    pub fn check(rules: &Rules) -> Result<&RedisBackend, RulesError> {
        let Backend::Redis(b) = &rules.backend else {
            return Err(rules.backend_error(
                "these rules keep their counts in memory: add [backend] redis = \"redis://HOST:PORT\" to keep them in Redis",
            ));
        };
        rules.check_limits(|_, l| runs_on_redis(l))?;
        Ok(b)
    }

    /// Connects to the Redis of `rules`' `[backend]` (failing after 2 s: the error names the
    /// `[backend]` line). With policy `insurance`, also builds the in-memory rules at each
    /// limit ÷ expected nodes.
    pub async fn connect(rules: &Rules) -> Result<Self, RulesError> {
        let b = Self::check(rules)?.clone();
        let insurance = Self::insurance(rules, &b)?;
        let shown = || {
            b.nodes
                .urls()
                .into_iter()
                .map(turnstile::rules::redact_url)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let conn = match &b.nodes {
            RedisNodes::Single(u) => Conn::single(u, CONNECT_TIMEOUT).await,
            RedisNodes::Cluster(v) => {
                let urls: Vec<&str> = v.iter().map(String::as_str).collect();
                Conn::cluster(&urls, CONNECT_TIMEOUT).await
            }
        }
        .map_err(|e| {
            rules.backend_error(format!(
                "cannot connect to Redis at {}: {e}; start it, or fix the address",
                shown()
            ))
        })?;
        let policy = policy_of(&b);
        let caller = Caller::new(conn, b.timeout);
        let mut load_conn = caller.conn().clone();
        caller.load(&mut load_conn, None).await.map_err(|e| {
            rules.backend_error(format!(
                "cannot load turnstile's library into Redis at {}: {e}",
                shown()
            ))
        })?;
        let leases = crate::Leases::from_rules(&b.leases)
            .map(|l| LeasedRules::new(l, caller.conn().clone(), b.timeout, b.prefix.clone()));
        Ok(Self {
            leases,
            caller,
            keys: KeyHasher::with_seed(b.seed, 64),
            gate: FailureGate::new(policy, 5, Duration::from_secs(1), "rules".into()),
            insurance,
            backend: b,
        })
    }

    fn insurance(rules: &Rules, b: &RedisBackend) -> Result<Option<Engine>, RulesError> {
        let BackendPolicy::Insurance { expected_nodes } = b.policy else {
            return Ok(None);
        };
        Engine::new(insurance_rules(rules, expected_nodes))
            .map(Some)
            .map_err(|mut e| {
                e.message.push_str(&format!(
                    " (in the insurance rules: every limit / {expected_nodes} expected nodes)"
                ));
                e
            })
    }

    /// Follows a reload of the engine to `rules`, whose `[backend]` must be this one's (a
    /// changed table needs a new [`RedisRules::connect`]): checks their limits and reloads the
    /// insurance rules. On error nothing changes.
    pub fn reload(&self, rules: &Rules) -> Result<(), RulesError> {
        let b = Self::check(rules)?;
        if *b != self.backend {
            return Err(
                rules.backend_error("the [backend] table changed: connect a new backend for it")
            );
        }
        if let Some(e) = &self.insurance {
            let BackendPolicy::Insurance { expected_nodes } = b.policy else {
                return Ok(());
            };
            e.reload(insurance_rules(rules, expected_nodes))?;
        }
        Ok(())
    }

    /// The `[backend]` table it was connected for.
    pub fn backend(&self) -> &RedisBackend {
        &self.backend
    }

    /// What the failure path did so far (`redis` counts requests Redis answered; those of
    /// leased rules only are in [`RedisRules::lease_stats`]).
    pub fn stats(&self) -> FailureStats {
        self.gate.stats()
    }

    /// Whether Redis answers a `PING` within the backend's timeout (what a readiness probe
    /// asks; the failure path and its counts are not involved).
    pub async fn ping(&self) -> Result<(), Error> {
        let mut p = redis::pipe();
        p.cmd("PING");
        self.caller.plain(&p).await.map(|_| ())
    }

    /// Whether the circuit breaker is open (Redis is being left alone).
    pub fn circuit_open(&self) -> bool {
        self.gate.is_open()
    }

    /// The hasher of the key ids (under `[backend] seed`).
    pub fn key_hasher(&self) -> &KeyHasher {
        &self.keys
    }

    /// [`Engine::explain`] with the counts in Redis: Redis if it answers within the timeout,
    /// else the failure policy (counted in [`RedisRules::stats`]). Never fails. A request shed
    /// by this process's load, or matching no rule, makes no call.
    pub async fn explain<C: Clock>(&self, engine: &Engine<C>, req: &Request<'_>) -> Verdict {
        let plan = engine.plan(req, &self.keys);
        if plan.shed().is_some() || plan.steps().is_empty() {
            return plan.finish(&[]);
        }
        // Steps all leased are guarded by their tiers' own breakers: a lease held is spent
        // whatever Redis does.
        let leased = self.leased(&plan);
        let all = leased
            .as_ref()
            .is_some_and(|v| v.iter().all(Option::is_some));
        if !all && !self.gate.admit(1) {
            return self.fallback(req);
        }
        match self.run(&plan, None, leased.as_ref()).await {
            Ok(o) => {
                // Requests of leased rules only are counted in the tiers' figures
                // (`lease_stats`), not as answered by Redis.
                if !all {
                    self.gate.succeeded(1);
                }
                plan.finish(&o)
            }
            Err(e) => {
                if !all {
                    self.gate.failed(&e);
                }
                self.fallback(req)
            }
        }
    }

    /// [`RedisRules::explain`] without the failure policy: Redis's answer or the error.
    pub async fn try_explain<C: Clock>(
        &self,
        engine: &Engine<C>,
        req: &Request<'_>,
    ) -> Result<Verdict, Error> {
        let plan = engine.plan(req, &self.keys);
        let leased = self.leased(&plan);
        let o = self.run(&plan, None, leased.as_ref()).await?;
        Ok(plan.finish(&o))
    }

    /// [`RedisRules::try_explain`] at an explicit `now` (ns): the engine plans at `now` and the
    /// script decides at `now` instead of the server's `TIME` (tests: the same trace through
    /// Redis and through the in-memory engine). Keys written this way live
    /// [`EXPLICIT_NOW_TTL_SLACK_MS`] longer.
    pub async fn explain_at<C: Clock>(
        &self,
        engine: &Engine<C>,
        req: &Request<'_>,
        now: u64,
    ) -> Result<Verdict, Error> {
        let plan = engine.plan_at(req, now, &self.keys);
        let leased = self.leased(&plan);
        let o = self.run(&plan, Some(now), leased.as_ref()).await?;
        Ok(plan.finish(&o))
    }

    /// [`Engine::refund`] with the counts in Redis: the number of rules given the cost back.
    /// When Redis does not answer, the insurance rules (if any) get it back and the error is
    /// returned all the same (Redis did not).
    pub async fn refund<C: Clock>(
        &self,
        engine: &Engine<C>,
        req: &Request<'_>,
    ) -> Result<u32, Error> {
        self.refund_inner(engine, req, None).await
    }

    /// [`RedisRules::refund`] at an explicit `now` (ns).
    pub async fn refund_at<C: Clock>(
        &self,
        engine: &Engine<C>,
        req: &Request<'_>,
        now: u64,
    ) -> Result<u32, Error> {
        self.refund_inner(engine, req, Some(now)).await
    }

    async fn refund_inner<C: Clock>(
        &self,
        engine: &Engine<C>,
        req: &Request<'_>,
        now: Option<u64>,
    ) -> Result<u32, Error> {
        let plan = engine.refund_plan(req, &self.keys);
        let n = plan.steps().len() as u32;
        if n == 0 {
            return Ok(0);
        }
        let (all, leased_refund) = match self.leased(&plan) {
            Some(l) => self.refund_leased(&plan, now, &l).await,
            None => ((0..plan.steps().len()).map(|i| (i, 'a')).collect(), Ok(())),
        };
        let r = if all.is_empty() {
            leased_refund
        } else if self.caller.conn().is_cluster() {
            let calls = groups(&plan, &all)
                .into_values()
                .map(|g| self.refund_call(&plan, g, now));
            futures_util::future::join_all(calls)
                .await
                .into_iter()
                .collect::<Result<Vec<()>, Error>>()
                .and(leased_refund)
        } else {
            self.refund_call(&plan, all, now).await.and(leased_refund)
        };
        if let Err(e) = r {
            self.gate.failed(&e);
            if let Some(ins) = &self.insurance {
                ins.refund(req);
            }
            return Err(e);
        }
        Ok(n)
    }

    /// Per step of `plan`, its rule's lease tier if the step is leased (`None`: no step is).
    fn leased<C: Clock>(&self, plan: &Plan<C>) -> Option<Leased> {
        self.leases.as_ref()?.of(plan)
    }

    /// The Redis keys of a step: its limits', then its pool's (for tests and tools).
    pub fn redis_keys<C: Clock>(&self, plan: &Plan<C>, s: &PlanStep) -> Vec<String> {
        let mut v = self.names(plan, s, false);
        v.extend(self.names(plan, s, true));
        v
    }

    /// The policy's answer to `req`.
    fn fallback(&self, req: &Request<'_>) -> Verdict {
        by_policy(&self.gate, self.insurance.as_ref(), req)
    }

    /// The names of a step's keys: its limits' or its pool's.
    fn names<C: Clock>(&self, plan: &Plan<C>, s: &PlanStep, pool: bool) -> Vec<String> {
        let limits = if pool {
            match plan.pool_limits(s) {
                Some(l) => l,
                None => return Vec::new(),
            }
        } else {
            plan.limits(s)
        };
        let mut base = self.backend.prefix.clone();
        escape(plan.rule_name(s), &mut base);
        if s.is_override() {
            base.push_str(":o");
        }
        if pool {
            base.push_str(":p");
        }
        base.push_str(&format!(":{{{:x}}}:", s.key()));
        limits
            .limits()
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let code = limit_args(l).map_or("?", |a| a.code);
                match record_layout(l) {
                    Some(h) => format!("{base}{i}{code}.{h:08x}"),
                    None => format!("{base}{i}{code}"),
                }
            })
            .collect()
    }

    /// The call over the steps `idx` (whose keys share a slot): the outcomes go to `out`;
    /// true if an enforcing step denied.
    async fn check_call<C: Clock>(
        &self,
        plan: &Plan<C>,
        idx: &[usize],
        now: Option<u64>,
        out: &mut [Option<StepOutcome>],
    ) -> Result<bool, Error> {
        let steps: Vec<(usize, char)> = idx.iter().map(|&i| (i, 'a')).collect();
        let cmd = self.invocation(plan, &steps, now, 'c')?;
        let v = self.caller.call(&cmd).await?;
        let (denier, got) = reply::rules(&v, idx.len())?;
        for (&i, (main, pool)) in idx.iter().zip(got) {
            out[i] = main.map(|main| StepOutcome { main, pool });
        }
        Ok(denier != 0)
    }

    /// The refund call over `steps` (index and target: `a` as the engine, `m` the limits, `p`
    /// the pool), whose keys share a slot.
    async fn refund_call<C: Clock>(
        &self,
        plan: &Plan<C>,
        steps: Vec<(usize, char)>,
        now: Option<u64>,
    ) -> Result<(), Error> {
        let cmd = self.invocation(plan, &steps, now, 'r')?;
        reply::integer(&self.caller.call(&cmd).await?).map(|_| ())
    }

    /// The call of `op` ("c" check, "r" refund, "s" settle) over `steps`: their keys, the
    /// plan's spec (rules.lua), their costs and (refunds) their targets or (settles) their
    /// actual costs.
    fn invocation<C: Clock>(
        &self,
        plan: &Plan<C>,
        steps: &[(usize, char)],
        now: Option<u64>,
        op: char,
    ) -> Result<redis::Cmd, Error> {
        let all = plan.steps();
        let mut keys = Vec::new();
        let mut spec = steps.len().to_string();
        let mut costs = String::new();
        let mut fourth = String::new();
        for &(i, target) in steps {
            let s = &all[i];
            keys.extend(self.names(plan, s, false));
            keys.extend(self.names(plan, s, true));
            spec.push(' ');
            match (s.is_shadow(), s.may_draw_pool()) {
                (true, true) => spec.push_str("se"),
                (true, false) => spec.push('s'),
                (false, true) => spec.push('e'),
                (false, false) => spec.push('-'),
            }
            push_limits(&mut spec, Some(plan.limits(s)))?;
            push_limits(&mut spec, plan.pool_limits(s))?;
            if !costs.is_empty() {
                costs.push(' ');
            }
            // Writing to a String cannot fail.
            let _ = write!(costs, "{}", s.cost());
            if op == 's' {
                if !fourth.is_empty() {
                    fourth.push(' ');
                }
                let _ = write!(fourth, "{}", s.actual_cost());
            } else {
                fourth.push(target);
            }
        }
        let op = match now {
            Some(n) => format!("{op}{n}"),
            None => op.to_string(),
        };
        let f = self.caller.rules_fn();
        Ok(if op.starts_with('c') {
            fcall(f, &keys, (op, spec, costs))
        } else {
            fcall(f, &keys, (op, spec, costs, fourth))
        })
    }
}

/// `name` with `%`, `:`, `{` and `}` percent-encoded, appended to `out`: a rule's name
/// cannot end its part of a key or make a hash tag.
fn escape(name: &str, out: &mut String) {
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// Appends `limits` (none: a count of 0) to a plan's spec.
fn push_limits(spec: &mut String, limits: Option<&Limits>) -> Result<(), Error> {
    let Some(limits) = limits else {
        spec.push_str(" 0");
        return Ok(());
    };
    let args = limits
        .limits()
        .iter()
        .map(limit_args)
        .collect::<Result<Vec<_>, _>>()?;
    script::push_limits(spec, limits, &args);
    Ok(())
}

/// `steps` grouped by key id (one Cluster slot each), in plan order within a group.
fn groups<C: Clock>(
    plan: &Plan<C>,
    steps: &[(usize, char)],
) -> std::collections::BTreeMap<u64, Vec<(usize, char)>> {
    let mut m: std::collections::BTreeMap<u64, Vec<(usize, char)>> = Default::default();
    for &(i, t) in steps {
        m.entry(plan.steps()[i].key()).or_default().push((i, t));
    }
    m
}
