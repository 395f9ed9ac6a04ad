//! [`Engine::settle`]: a cost known only after the work, settled against the cost a check
//! reserved, on every rule the request matches.

use super::refund::charged;
use super::Engine;
use crate::clock::{Clock, Nanos};
use crate::rules::matcher::sel;
use crate::rules::request::{method_slot, Priority, Request};

impl<C: Clock> Engine<C> {
    /// Settles a request that [`Engine::check`] admitted at a reserved cost (`req.cost`, an
    /// estimate: tokens an LLM call may take, rows a query may scan) once its actual cost is
    /// known: every rule the request matches — by the same route, method, priority and key as
    /// the check, so pass the same [`Request`] — is charged `(actual − reserved) × rule.cost`
    /// more, or given `(reserved − actual) × rule.cost` back. Returns how many rules were
    /// settled (0: none applies). Nothing is counted in the rules' statistics.
    ///
    /// * A charge is taken whatever the limits hold: past a limit the key owes it, and its
    ///   next checks are denied until it is paid (each algorithm's `charge` in
    ///   `docs/algorithms.md` says how far it can owe). Inside each rule, every limit of its
    ///   store is settled in one atomic step. A charge does not depend on what the limits
    ///   hold, so no rule refuses it and none needs to be rolled back: every matching rule is
    ///   settled (the one exception: a key evicted since its check, in a full store with the
    ///   `reject` policy, has no record to charge).
    /// * A give-back is [`Engine::refund`]'s, by mode: an elastic rule's extra pool first if
    ///   it holds a charge; shadow rules too, so that they keep counting what an enforcing
    ///   rule in their place would.
    /// * An elastic rule's charge goes to its own limits (the debt is the key's, not the
    ///   pool's).
    /// * The same amount changes nothing.
    pub fn settle(&self, req: &Request<'_>, actual: u64) -> u32 {
        self.settle_at(req, actual, self.clock.now())
    }

    /// [`Engine::settle`] at `now`.
    pub fn settle_at(&self, req: &Request<'_>, actual: u64, now: Nanos) -> u32 {
        let c = self.current.load();
        let m = method_slot(req.method);
        let prio = req.priority.unwrap_or_else(|| Priority::of_method_index(m));
        let s = sel(m, prio);
        let cands = c.routes.candidates(req.route);
        let mut n = 0;
        for cand in cands.enforce.iter().chain(cands.shadow.iter()) {
            // The rule, the key id and the reserved cost × the rule's cost.
            let Some((r, id, held)) = self.keyed(&c, req, cand, s) else {
                continue;
            };
            let actual_cost = actual.saturating_mul(r.cost);
            let t = r.target(id);
            if actual_cost < held {
                let back = held - actual_cost;
                match &t.slot.pool {
                    Some(p) if charged(&p.store.peek_at(&id, now)) => {
                        p.store.refund_at(&id, back, now)
                    }
                    _ => t.refund_at(id, back, now),
                }
            } else if actual_cost > held {
                t.settle_at(id, held, actual_cost, now);
            }
            n += 1;
        }
        n
    }
}
