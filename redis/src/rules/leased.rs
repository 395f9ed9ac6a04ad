//! Leases for the rules on Redis (`[backend] leases = "auto"`): the steps of a rule whose
//! limits can be leased are decided by a lease tier of the rule's own — a [`RedisStore`] with
//! leases (crate::lease: the same table, lease calls, give-backs and bounds), on the rules'
//! connection, naming its records exactly as the rules do, so that every process sharing the
//! Redis shares the rule's counts whether it leases or not. Other steps are decided in Redis
//! as without leases.
//!
//! **Which rules.** A rule's own limits (not an override's: an override is one key's, and a
//! tier per key would cost a table and a sweeper each), when they can be leased (window and
//! bucket limits that do not count denials) and the rule has no elastic pool. The others are
//! checked per request, as without leases.
//!
//! **A request** with no leased step is decided as without leases. Otherwise its enforcing
//! steps are asked at once, each leased one of its tier and the others in Redis (one call, or
//! one per key id in a Cluster); if one denies, what the others took is given back — the
//! consume-then-refund protocol the Cluster path uses for steps of different key ids, whose
//! residual race it shares (a request may be denied while another's charge is on its way
//! back; never admitted over). Then, if all admitted, the shadow steps.
//!
//! **Bounds.** Each leased rule's table holds at most `min(keys, RULE_KEYS)` keys (about
//! 200 bytes each) and runs one sweeper; the tiers are made on a rule's first leasable step
//! and found by the rule's index (a lookup in an `ArcSwap`ped map: no lock), checked against
//! the plan's rule name and limits — a reload that changes them makes a new tier, and the old
//! one gives back what it holds when dropped.

use super::groups;
use super::RedisRules;
use crate::conn::Conn;
use crate::lease::{LeaseStats, Leases};
use crate::store::{Error, RedisStore};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use turnstile::rules::{Plan, PlanStep, StepOutcome};
use turnstile::{Clock, Limits};

/// Keys a leased rule's table tracks, at most.
pub(crate) const RULE_KEYS: u64 = 16_384;

/// One rule's tier, or the note that the rule is not leased.
pub(super) struct RuleTier {
    name: Arc<str>,
    limits: Limits,
    store: Option<RedisStore>,
}

impl RuleTier {
    fn is_for<C: Clock>(&self, plan: &Plan<C>, s: &PlanStep) -> bool {
        *self.name == *plan.rule_name(s) && self.limits == *plan.limits(s)
    }
}

/// The rules' lease tiers.
pub(super) struct LeasedRules {
    leases: Leases,
    conn: Conn,
    timeout: Duration,
    /// The rules' key prefix.
    prefix: String,
    tiers: ArcSwap<HashMap<u32, Arc<RuleTier>>>,
    /// The runtime the rules were connected on: the tiers' sweepers run there, whichever
    /// runtime the check that made them ran on.
    runtime: Option<tokio::runtime::Handle>,
    /// Serializes the making of tiers (a rule's first leasable step; not on the path of a
    /// check that finds its tier).
    making: Mutex<()>,
}

/// Per step of a plan, its rule's tier if the step is leased.
pub(super) type Leased = Vec<Option<Arc<RuleTier>>>;

impl LeasedRules {
    pub(super) fn new(leases: Leases, conn: Conn, timeout: Duration, prefix: String) -> Self {
        Self {
            leases,
            conn,
            timeout,
            prefix,
            tiers: ArcSwap::from_pointee(HashMap::new()),
            runtime: tokio::runtime::Handle::try_current().ok(),
            making: Mutex::new(()),
        }
    }

    /// Per step of `plan`, its tier if leased; `None` if no step is.
    pub(super) fn of<C: Clock>(&self, plan: &Plan<C>) -> Option<Leased> {
        let steps = plan.steps();
        let mut v: Leased = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            let t = self.tier(plan, s);
            if t.is_some() && v.is_empty() {
                v.resize(steps.len(), None);
            }
            if !v.is_empty() {
                v[i] = t;
            }
        }
        (!v.is_empty()).then_some(v)
    }

    /// The tier of step `s`, if it is leased.
    fn tier<C: Clock>(&self, plan: &Plan<C>, s: &PlanStep) -> Option<Arc<RuleTier>> {
        let (rule, over) = s.slot_index();
        if over.is_some() || plan.pool_limits(s).is_some() {
            return None;
        }
        let found = self.tiers.load().get(&rule).cloned();
        let t = match found {
            Some(t) if t.is_for(plan, s) => t,
            _ => self.make(plan, s, rule),
        };
        t.store.is_some().then_some(t)
    }

    /// Makes (or finds, if another caller made it) the tier of step `s`'s rule.
    fn make<C: Clock>(&self, plan: &Plan<C>, s: &PlanStep, rule: u32) -> Arc<RuleTier> {
        // A poisoned lock only means another maker panicked; the map is still whole.
        let _g = self.making.lock().unwrap_or_else(|e| e.into_inner());
        let map = self.tiers.load_full();
        if let Some(t) = map.get(&rule).filter(|t| t.is_for(plan, s)) {
            return Arc::clone(t);
        }
        let limits = plan.limits(s).clone();
        let mut prefix = self.prefix.clone();
        super::escape(plan.rule_name(s), &mut prefix);
        prefix.push(':');
        let mut b = RedisStore::builder(limits.clone())
            .prefix(prefix)
            .timeout(self.timeout)
            .leases(self.leases.clone().keys(self.leases.keys.min(RULE_KEYS)));
        b.rules_names = true;
        // Limits that cannot be leased (or a store that cannot be built): checked per request.
        let _rt = self.runtime.as_ref().map(|h| h.enter());
        let store = b.build(self.conn.clone()).ok();
        let t = Arc::new(RuleTier {
            name: plan.rule_name(s).into(),
            limits,
            store,
        });
        let mut next = HashMap::clone(&map);
        next.insert(rule, Arc::clone(&t));
        self.tiers.store(Arc::new(next));
        t
    }

    /// Every leased rule's figures, by rule name.
    pub(super) fn stats(&self) -> Vec<(String, LeaseStats)> {
        let map = self.tiers.load();
        let mut v: Vec<(String, LeaseStats)> = map
            .values()
            .filter_map(|t| Some((t.name.to_string(), t.store.as_ref()?.lease_stats()?)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Every tier, for giving back.
    fn stores(&self) -> Vec<Arc<RuleTier>> {
        self.tiers.load().values().cloned().collect()
    }
}

/// A key id as the rules write it in a Redis key (lowercase hex), without allocating.
fn hex(mut v: u64, buf: &mut [u8; 16]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(v & 15) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    // Hex digits are ASCII.
    std::str::from_utf8(&buf[i..]).unwrap_or("0")
}

/// What a plan's steps are decided by: a leased step's tier, or a group of steps decided in
/// one Redis call.
enum Unit {
    Lease(usize),
    Group(Vec<usize>),
}

impl RedisRules {
    /// Gives back what every leased rule holds (shutdown, or before dropping the rules).
    pub async fn return_leases(&self) {
        let Some(l) = &self.leases else { return };
        for t in l.stores() {
            if let Some(s) = &t.store {
                s.return_leases().await;
            }
        }
    }

    /// [`RedisRules::return_leases`] at an explicit `now` (ns).
    pub async fn return_leases_at(&self, now: u64) {
        let Some(l) = &self.leases else { return };
        for t in l.stores() {
            if let Some(s) = &t.store {
                s.return_leases_at(now).await;
            }
        }
    }

    /// Gives back what idle keys and ended leases hold, at an explicit `now` (ns) (the
    /// background sweepers do it at the node's time).
    pub async fn sweep_leases_at(&self, now: u64) {
        let Some(l) = &self.leases else { return };
        for t in l.stores() {
            if let Some(s) = &t.store {
                s.sweep_leases_at(now).await;
            }
        }
    }

    /// What each leased rule's leases did so far, by rule name (empty without leases, or
    /// before a leased rule was asked). A reload that changes a rule's limits gives it a new
    /// tier, whose figures start from 0.
    pub fn lease_stats(&self) -> Vec<(String, LeaseStats)> {
        self.leases.as_ref().map_or_else(Vec::new, |l| l.stats())
    }

    /// The outcome of every step when some are `leased`: enforcing units concurrently,
    /// consuming then refunding if one denies; then, if all admitted, the shadow units.
    pub(super) async fn run_leased<C: Clock>(
        &self,
        plan: &Plan<C>,
        now: Option<u64>,
        leased: &Leased,
    ) -> Result<Vec<Option<StepOutcome>>, Error> {
        let mut out = vec![None; plan.steps().len()];
        let enforce = self.units(plan, leased, false);
        let results = futures_util::future::join_all(
            enforce.iter().map(|u| self.decide(plan, now, leased, u)),
        )
        .await;
        let (mut denied, mut first_err, mut admitted) = (false, None, Vec::new());
        for (u, r) in enforce.iter().zip(results) {
            match r {
                Ok((d, o)) => {
                    for (i, x) in o {
                        out[i] = Some(x);
                    }
                    if d {
                        denied = true;
                    } else {
                        admitted.push(u);
                    }
                }
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        if first_err.is_some() || denied {
            // A refund that fails leaves a charge: never more admitted than the limits allow.
            let undo = admitted
                .iter()
                .map(|u| self.undo(plan, now, leased, u, &out));
            futures_util::future::join_all(undo).await;
            return match first_err {
                Some(e) => Err(e),
                None => Ok(out),
            };
        }
        let shadow = self.units(plan, leased, true);
        let results = futures_util::future::join_all(
            shadow.iter().map(|u| self.decide(plan, now, leased, u)),
        )
        .await;
        for r in results {
            for (i, x) in r?.1 {
                out[i] = Some(x);
            }
        }
        Ok(out)
    }

    /// The units of the enforcing (or `shadow`) steps: each leased step alone; the others in
    /// one group on one node, one per key id in a Cluster.
    fn units<C: Clock>(&self, plan: &Plan<C>, leased: &Leased, shadow: bool) -> Vec<Unit> {
        let steps = plan.steps();
        let picked = (0..steps.len()).filter(|&i| steps[i].is_shadow() == shadow);
        let mut units: Vec<Unit> = Vec::new();
        let mut rest: Vec<(usize, char)> = Vec::new();
        for i in picked {
            match leased[i] {
                Some(_) => units.push(Unit::Lease(i)),
                None => rest.push((i, 'a')),
            }
        }
        if rest.is_empty() {
            return units;
        }
        if self.caller.conn().is_cluster() {
            let g = groups(plan, &rest).into_values();
            units.extend(g.map(|g| Unit::Group(g.into_iter().map(|(i, _)| i).collect())));
        } else {
            units.push(Unit::Group(rest.into_iter().map(|(i, _)| i).collect()));
        }
        units
    }

    /// A unit's outcomes, and whether it denied.
    async fn decide<C: Clock>(
        &self,
        plan: &Plan<C>,
        now: Option<u64>,
        leased: &Leased,
        u: &Unit,
    ) -> Result<(bool, Vec<(usize, StepOutcome)>), Error> {
        match u {
            Unit::Lease(i) => {
                let s = &plan.steps()[*i];
                let Some(store) = leased[*i].as_ref().and_then(|t| t.store.as_ref()) else {
                    return Err(Error::Reply("a leased step without its tier".into()));
                };
                let mut buf = [0u8; 16];
                let key = hex(s.key(), &mut buf);
                // Cost 0 is a peek: what Redis has left and what this process holds.
                let d = match (s.cost(), now) {
                    (0, None) => store.peek(key).await?,
                    (0, Some(n)) => store.peek_at(key, n).await?,
                    (c, _) => store.checked(key, now, c).await?,
                };
                Ok((!d.allowed(), vec![(*i, StepOutcome::main(d))]))
            }
            Unit::Group(g) => {
                let mut o = vec![None; plan.steps().len()];
                let denied = self.check_call(plan, g, now, &mut o).await?;
                Ok((denied, g.iter().filter_map(|&i| Some((i, o[i]?))).collect()))
            }
        }
    }

    /// Gives back what an admitting unit took (to the pool where the pool admitted).
    async fn undo<C: Clock>(
        &self,
        plan: &Plan<C>,
        now: Option<u64>,
        leased: &Leased,
        u: &Unit,
        out: &[Option<StepOutcome>],
    ) {
        match u {
            Unit::Lease(i) => {
                let s = &plan.steps()[*i];
                if let Some(store) = leased[*i].as_ref().and_then(|t| t.store.as_ref()) {
                    let mut buf = [0u8; 16];
                    let _ = store
                        .refund_inner(hex(s.key(), &mut buf), s.cost(), now)
                        .await;
                }
            }
            Unit::Group(g) => {
                let targets = g
                    .iter()
                    .map(|&i| {
                        let by_pool = out[i].is_some_and(|o| !o.main.allowed());
                        (i, if by_pool { 'p' } else { 'm' })
                    })
                    .collect();
                let _ = self.refund_call(plan, targets, now).await;
            }
        }
    }

    /// Refunds the `leased` steps of a refund plan through their tiers (what a lease spent
    /// goes back into it); the other steps' indices are returned for Redis.
    pub(super) async fn refund_leased<C: Clock>(
        &self,
        plan: &Plan<C>,
        now: Option<u64>,
        leased: &Leased,
    ) -> (Vec<(usize, char)>, Result<(), Error>) {
        let steps = plan.steps();
        let mut rest = Vec::new();
        let mut calls = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            match leased[i].as_ref().and_then(|t| t.store.as_ref()) {
                Some(store) => calls.push(async move {
                    let mut buf = [0u8; 16];
                    store
                        .refund_inner(hex(s.key(), &mut buf), s.cost(), now)
                        .await
                }),
                None => rest.push((i, 'a')),
            }
        }
        let r = futures_util::future::join_all(calls)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, Error>>()
            .map(|_| ());
        (rest, r)
    }
}

impl RedisRules {
    /// Settles the `leased` steps of a settle plan through their tiers (a give-back into the
    /// lease first, a charge from it when it holds all of it: `RedisStore::settle`); the other
    /// steps' indices are returned for Redis. Steps whose actual cost is the reserved one are
    /// left out: nothing to do.
    pub(super) async fn settle_leased<C: Clock>(
        &self,
        plan: &Plan<C>,
        now: Option<u64>,
        leased: &Leased,
    ) -> (Vec<usize>, Result<(), Error>) {
        let steps = plan.steps();
        let mut rest = Vec::new();
        let mut calls = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            if s.cost() == s.actual_cost() {
                continue;
            }
            match leased[i].as_ref().and_then(|t| t.store.as_ref()) {
                Some(store) => calls.push(async move {
                    let mut buf = [0u8; 16];
                    let key = hex(s.key(), &mut buf);
                    store
                        .settle_inner(key, s.cost(), s.actual_cost(), now)
                        .await
                }),
                None => rest.push(i),
            }
        }
        let r = futures_util::future::join_all(calls)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, Error>>()
            .map(|_| ());
        (rest, r)
    }
}

#[cfg(test)]
mod tests {
    use super::hex;

    #[test]
    fn key_ids_are_written_as_the_rules_write_them() {
        for v in [0u64, 1, 15, 16, 0xabc, u64::MAX, 0x0123_4567_89ab_cdef] {
            let mut b = [0u8; 16];
            assert_eq!(hex(v, &mut b), format!("{v:x}"));
        }
    }
}
