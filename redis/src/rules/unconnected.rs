//! [`UnconnectedRules`]: a rules file's `[backend]` Redis that has not been reached yet. A
//! server that starts while its Redis is down answers with it until [`RedisRules::connect`]
//! succeeds: every request that needs a count is decided by the backend's failure policy, as
//! a connected backend decides while Redis does not answer (`closed` denies, `open` admits,
//! `insurance` decides in memory at each limit ÷ `expected_nodes`).

use super::{by_policy, policy_of, RedisRules};
use crate::policy::{FailureGate, FailureStats};
use std::time::Duration;
use turnstile::keyed::KeyHasher;
use turnstile::rules::{Engine, RedisBackend, Request, Rules, RulesError, Verdict};
use turnstile::Clock;

/// A `[backend]` Redis not reached yet: its checks answered by the failure policy.
pub struct UnconnectedRules {
    backend: RedisBackend,
    keys: KeyHasher,
    gate: FailureGate,
    insurance: Option<Engine>,
}

impl std::fmt::Debug for UnconnectedRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnconnectedRules")
            .field("backend", &self.backend)
            .finish()
    }
}

impl UnconnectedRules {
    /// The backend of `rules`, checked as [`RedisRules::connect`] checks it (every limit runs
    /// on Redis; policy `insurance` builds its in-memory rules), without connecting: what
    /// `connect` would refuse for the rules themselves is refused here.
    pub fn new(rules: &Rules) -> Result<Self, RulesError> {
        let b = RedisRules::check(rules)?.clone();
        let insurance = RedisRules::insurance(rules, &b)?;
        Ok(Self {
            keys: KeyHasher::with_seed(b.seed, 64),
            gate: FailureGate::new(policy_of(&b), 5, Duration::from_secs(1), "rules".into()),
            insurance,
            backend: b,
        })
    }

    /// The `[backend]` table it stands for.
    pub fn backend(&self) -> &RedisBackend {
        &self.backend
    }

    /// What the policy answered so far: each check that needed a count is one
    /// `short_circuited` and one `fallbacks`.
    pub fn stats(&self) -> FailureStats {
        self.gate.stats()
    }

    /// [`Engine::explain`] as the failure policy answers it. A request shed by this
    /// process's load, or matching no rule, is answered as a connected backend answers it
    /// (no count needed).
    pub fn explain<C: Clock>(&self, engine: &Engine<C>, req: &Request<'_>) -> Verdict {
        let plan = engine.plan(req, &self.keys);
        if plan.shed().is_some() || plan.steps().is_empty() {
            return plan.finish(&[]);
        }
        self.gate.unconnected(1);
        by_policy(&self.gate, self.insurance.as_ref(), req)
    }

    /// A refund while Redis is not reached: the insurance rules (if any) get the cost back;
    /// Redis does not, so the caller answers an error all the same.
    pub fn refund(&self, req: &Request<'_>) {
        if let Some(ins) = &self.insurance {
            ins.refund(req);
        }
    }

    /// Follows a reload that keeps the `[backend]` table: checks the limits and reloads the
    /// insurance rules, as [`RedisRules::reload`] does.
    pub fn reload(&self, rules: &Rules) -> Result<(), RulesError> {
        let b = RedisRules::check(rules)?;
        if *b != self.backend {
            return Err(
                rules.backend_error("the [backend] table changed: connect a new backend for it")
            );
        }
        if let (Some(e), turnstile::rules::BackendPolicy::Insurance { expected_nodes }) =
            (&self.insurance, b.policy)
        {
            e.reload(super::insurance_rules(rules, expected_nodes))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(policy: &str) -> Rules {
        Rules::parse(
            &format!(
                "[backend]\nredis = \"redis://127.0.0.1:1\"\n{policy}\n[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{{ algorithm = \"fixed_window\", limit = 4, window = \"1h\" }}]\n"
            ),
            "r.toml",
        )
        .unwrap()
    }

    /// Each policy's answer, without Redis: `closed` denies, `open` admits untracked,
    /// `insurance` admits limit ÷ expected nodes; a key no rule matches needs no count.
    #[test]
    fn checks_are_answered_by_the_failure_policy() {
        let req = Request {
            customer: Some(7),
            ..Request::new()
        };
        let admitted = |policy: &str| {
            let r = rules(policy);
            let u = UnconnectedRules::new(&r).unwrap();
            let e = Engine::new(r).unwrap();
            let n = (0..6)
                .filter(|_| u.explain(&e, &req).decision.allowed())
                .count();
            (n, u.stats())
        };
        let (n, s) = admitted("policy = \"closed\"");
        assert_eq!(n, 0);
        assert_eq!((s.short_circuited, s.fallbacks, s.redis), (6, 6, 0));
        assert_eq!(admitted("policy = \"open\"").0, 6);
        assert_eq!(admitted("policy = \"insurance\"\nexpected_nodes = 2").0, 2);
        let r = rules("policy = \"closed\"");
        let u = UnconnectedRules::new(&r).unwrap();
        let e = Engine::new(r).unwrap();
        let none = Request {
            ip: Some("10.0.0.1".parse().unwrap()),
            ..Request::new()
        };
        assert!(u.explain(&e, &none).decision.allowed(), "no rule matches");
        assert_eq!(u.stats().fallbacks, 0);
        // What connect would refuse for the rules is refused here too: a window longer than
        // Redis's scripts compute exactly.
        let long = Rules::parse(
            "[backend]\nredis = \"redis://127.0.0.1:1\"\n[[rule]]\nname = \"r\"\nkey = \"customer\"\nlimits = [{ algorithm = \"fixed_window\", limit = 4, window = \"1440h\" }]\n",
            "r.toml",
        )
        .unwrap();
        let e = UnconnectedRules::new(&long).unwrap_err().to_string();
        assert!(e.contains("52 days"), "{e}");
    }
}
