//! Requests in flight (the guards [`Engine::admit`] and [`Engine::enter`] return) and the load
//! they make, which shedding and elastic rules read.

use super::check::Denier;
use super::{Engine, Refusal, UNLIMITED};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::rules::load::Load;
use crate::rules::request::{Priority, Request};
// std's `Arc`, as in `engine` (arc-swap swaps a std `Arc`).
use std::sync::Arc;

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

impl<C: Clock> Engine<C> {
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
}
