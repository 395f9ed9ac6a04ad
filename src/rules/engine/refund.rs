//! [`Engine::refund`]: an admitted request given back to every rule it matches.

use super::Engine;
use crate::clock::{Clock, Nanos};
use crate::decision::Decision;
use crate::rules::matcher::sel;
use crate::rules::request::{method_slot, Priority, Request};

/// Whether a peek shows a charge (less than the whole limit remains).
pub(super) fn charged(d: &Decision) -> bool {
    d.remaining < d.limit
}

impl<C: Clock> Engine<C> {
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
            let Some((r, id, cost)) = self.keyed(&c, req, cand, s) else {
                continue;
            };
            let t = r.target(id);
            match &t.slot.pool {
                Some(p) if charged(&p.store.peek_at(&id, now)) => p.store.refund_at(&id, cost, now),
                _ => t.refund_at(id, cost, now),
            }
            n += 1;
        }
        n
    }
}
