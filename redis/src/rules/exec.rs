//! Executing a plan in Redis: all its steps in one call on one node (or when they share a
//! key id); in a Redis Cluster, the enforcing steps one call per key id, concurrently,
//! consuming then refunding across them, then the shadow steps. A plan with leased steps
//! goes to leased.rs.

use super::leased::Leased;
use super::RedisRules;
use crate::error::Error;
use turnstile::rules::{Plan, StepOutcome};
use turnstile::Clock;

impl RedisRules {
    /// The outcome of every step: one call on one node (or when every step has the same key
    /// id); in a cluster, one call per key id, consuming then refunding across them.
    pub(super) async fn run<C: Clock>(
        &self,
        plan: &Plan<C>,
        now: Option<u64>,
        leased: Option<&Leased>,
    ) -> Result<Vec<Option<StepOutcome>>, Error> {
        if let Some(l) = leased {
            return self.run_leased(plan, now, l).await;
        }
        let steps = plan.steps();
        let mut out = vec![None; steps.len()];
        if steps.is_empty() {
            return Ok(out);
        }
        let one_slot = steps.iter().all(|s| s.key() == steps[0].key());
        if !self.caller.conn().is_cluster() || one_slot {
            let all: Vec<usize> = (0..steps.len()).collect();
            self.check_call(plan, &all, now, &mut out).await?;
            return Ok(out);
        }
        // Several slots: the enforcing steps of each key id, concurrently.
        if self.enforce_by_slot(plan, now, &mut out).await? {
            // Every slot admitted: the shadow steps, per key id.
            self.shadow_by_slot(plan, now, &mut out).await?;
        }
        Ok(out)
    }

    /// The enforcing steps of each key id, one call per key id, concurrently; their outcomes
    /// into `out`. If one denies or fails, refunds what the admitting ones took; `Ok(true)`
    /// when every key id admitted.
    async fn enforce_by_slot<C: Clock>(
        &self,
        plan: &Plan<C>,
        now: Option<u64>,
        out: &mut [Option<StepOutcome>],
    ) -> Result<bool, Error> {
        let n = plan.steps().len();
        let slots = slot_groups(plan, false);
        let calls = slots.iter().map(|g| async move {
            let mut o = vec![None; n];
            let denier = self.check_call(plan, g, now, &mut o).await?;
            Ok::<_, Error>((denier, o))
        });
        let results = futures_util::future::join_all(calls).await;
        let mut denied = false;
        let mut admitted_groups = Vec::new();
        let mut first_err = None;
        for (g, r) in slots.iter().zip(results) {
            match r {
                Ok((denier, o)) => {
                    for &i in g {
                        out[i] = o[i];
                    }
                    if denier {
                        denied = true;
                    } else {
                        admitted_groups.push(g);
                    }
                }
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        if first_err.is_none() && !denied {
            return Ok(true);
        }
        // Give back what the admitting slots took: to the pool where the pool admitted.
        let undo = admitted_groups.iter().map(|g| {
            let targets = g
                .iter()
                .map(|&i| {
                    let by_pool = out[i].is_some_and(|o: StepOutcome| !o.main.allowed());
                    (i, if by_pool { 'p' } else { 'm' })
                })
                .collect();
            self.refund_call(plan, targets, now)
        });
        // A refund that fails leaves a charge: never more admitted than the limits allow.
        let _ = futures_util::future::join_all(undo).await;
        match first_err {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }

    /// The shadow steps, one call per key id, concurrently; their outcomes into `out`.
    async fn shadow_by_slot<C: Clock>(
        &self,
        plan: &Plan<C>,
        now: Option<u64>,
        out: &mut [Option<StepOutcome>],
    ) -> Result<(), Error> {
        let n = plan.steps().len();
        let slots = slot_groups(plan, true);
        let calls = slots.iter().map(|g| async move {
            let mut o = vec![None; n];
            self.check_call(plan, g, now, &mut o).await?;
            Ok::<_, Error>(o)
        });
        for (g, r) in slots
            .iter()
            .zip(futures_util::future::join_all(calls).await)
        {
            let o = r?;
            for &i in g {
                out[i] = o[i];
            }
        }
        Ok(())
    }
}

/// The indices of the shadow (`shadow`) or enforcing steps of `plan`, one group per key id.
fn slot_groups<C: Clock>(plan: &Plan<C>, shadow: bool) -> Vec<Vec<usize>> {
    let steps = plan.steps();
    let picked: Vec<(usize, char)> = (0..steps.len())
        .filter(|&i| steps[i].is_shadow() == shadow)
        .map(|i| (i, 'a'))
        .collect();
    super::groups(plan, &picked)
        .into_values()
        .map(|g| g.into_iter().map(|(i, _)| i).collect())
        .collect()
}
