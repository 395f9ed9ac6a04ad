//! Settling a request's reserved cost at its actual cost with the rules' counts in Redis
//! ([`RedisRules::settle`]): the engine's settle plan, every step's difference charged or
//! given back in one call on one node (lua/settle.lua, lua/rules.lua), per key id in a
//! Cluster, through their lease tiers for leased rules.

use super::RedisRules;
use crate::error::Error;
use turnstile::rules::{Engine, Plan, Request};
use turnstile::Clock;

impl RedisRules {
    /// [`Engine::settle`] with the counts in Redis: `req` was checked (and admitted) at a
    /// reserved cost of `req.cost`; every rule it matches is charged `(actual − reserved) ×
    /// rule.cost` more, whatever its limits hold (past a limit the key owes it), or given
    /// `(reserved − actual) × rule.cost` back as [`RedisRules::refund`] gives it. Returns how
    /// many rules were settled (0: none applies).
    ///
    /// On one Redis node every rule is settled in one function call: all or nothing. In a
    /// Cluster, one call per key id (the rules of one key id all or nothing), concurrently.
    /// Leased rules settle through their tiers: a give-back into the lease first, a charge
    /// from the lease when it holds all of it (its admissions were counted in Redis when
    /// granted), else in Redis — never over. When Redis does not answer, the insurance rules
    /// (if any) are settled and the error is returned (Redis was not).
    pub async fn settle<C: Clock>(
        &self,
        engine: &Engine<C>,
        req: &Request<'_>,
        actual: u64,
    ) -> Result<u32, Error> {
        self.settle_inner(engine, req, actual, None).await
    }

    /// [`RedisRules::settle`] at an explicit `now` (ns).
    pub async fn settle_at<C: Clock>(
        &self,
        engine: &Engine<C>,
        req: &Request<'_>,
        actual: u64,
        now: u64,
    ) -> Result<u32, Error> {
        self.settle_inner(engine, req, actual, Some(now)).await
    }

    async fn settle_inner<C: Clock>(
        &self,
        engine: &Engine<C>,
        req: &Request<'_>,
        actual: u64,
        now: Option<u64>,
    ) -> Result<u32, Error> {
        let plan = engine.settle_plan(req, actual, &self.keys);
        let n = plan.steps().len() as u32;
        let (rest, leased) = match self.leased(&plan) {
            Some(l) => self.settle_leased(&plan, now, &l).await,
            None => (changed(&plan), Ok(())),
        };
        let r = if rest.is_empty() {
            leased
        } else if self.caller.conn().is_cluster() {
            let all: Vec<(usize, char)> = rest.iter().map(|&i| (i, 'a')).collect();
            let calls = super::groups(&plan, &all)
                .into_values()
                .map(|g| self.settle_call(&plan, g, now));
            futures_util::future::join_all(calls)
                .await
                .into_iter()
                .collect::<Result<Vec<()>, Error>>()
                .and(leased)
        } else {
            let all = rest.iter().map(|&i| (i, 'a')).collect();
            self.settle_call(&plan, all, now).await.and(leased)
        };
        if let Err(e) = r {
            self.gate.failed(&e);
            if let Some(ins) = &self.insurance {
                ins.settle(req, actual);
            }
            return Err(e);
        }
        Ok(n)
    }

    /// The settle call over `steps` (whose keys share a slot).
    async fn settle_call<C: Clock>(
        &self,
        plan: &Plan<C>,
        steps: Vec<(usize, char)>,
        now: Option<u64>,
    ) -> Result<(), Error> {
        let cmd = self.invocation(plan, &steps, now, 's')?;
        crate::reply::integer(&self.caller.call(&cmd).await?).map(|_| ())
    }
}

/// The steps of a settle plan whose actual cost differs from the reserved one.
fn changed<C: Clock>(plan: &Plan<C>) -> Vec<usize> {
    let steps = plan.steps();
    (0..steps.len())
        .filter(|&i| steps[i].cost() != steps[i].actual_cost())
        .collect()
}
