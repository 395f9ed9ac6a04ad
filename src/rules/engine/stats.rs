//! What the loaded rules hold: their names, counters, live keys and stores.

use super::Engine;
use crate::clock::Clock;
use crate::rules::counters::{LimitStats, RuleStats};
// std's `Arc`, as in `engine` (arc-swap swaps a std `Arc`).
use std::sync::Arc;

impl<C: Clock> Engine<C> {
    /// A rule's counters.
    pub fn rule_stats(&self, name: &str) -> Option<RuleStats> {
        let c = self.current.load();
        c.rules
            .iter()
            .find(|r| &*r.name == name)
            .map(|r| r.counters.get())
    }

    /// A rule's counters per limit ([`LimitStats`]): one per limit of the rule, in its order,
    /// then `override` (if it has overrides) and `own` (if its keys may have their own limit).
    /// Each check of the rule counts once, under the limit that bound it: the one with the
    /// least left when admitted, the one that denied otherwise; peeks (cost 0) are not counted.
    pub fn limit_stats(&self, name: &str) -> Option<Vec<LimitStats>> {
        let c = self.current.load();
        c.rules
            .iter()
            .find(|r| &*r.name == name)
            .map(|r| r.limit_stats())
    }

    /// The loaded rules' names, in order.
    pub fn rule_names(&self) -> Vec<String> {
        self.current
            .load()
            .rules
            .iter()
            .map(|r| r.name.to_string())
            .collect()
    }

    /// A one-line description of the loaded rules.
    pub fn summary(&self) -> String {
        self.current.load().summary.clone()
    }

    /// Live keys in a rule's main store.
    pub fn rule_keys(&self, name: &str) -> Option<usize> {
        let c = self.current.load();
        c.rules
            .iter()
            .find(|r| &*r.name == name)
            .map(|r| r.main.main.store.len())
    }

    /// Visits every store of the loaded rules (each rule's, each override's, each elastic
    /// pool's) with a description of what its records mean: the rule's name, the override's
    /// key id, whether it is a pool, the key class, the compiled limits and the capacity. Two
    /// stores described alike hold records that read alike, in this process or another one
    /// built with the same [`EngineBuilder::seed`](super::EngineBuilder::seed) (key ids are hashes under it) — snapshot
    /// support, with [`Store::export_records`](crate::keyed::Store::export_records) and
    /// [`Store::import_record`](crate::keyed::Store::import_record). A rule changed in any of
    /// these is described differently: its old records are not its new store's.
    pub fn for_each_store(&self, mut f: impl FnMut(&str, &crate::keyed::Store<Arc<C>>)) {
        let c = self.current.load();
        for r in c.rules.iter() {
            for s in std::iter::once(&r.main).chain(r.overrides.iter()) {
                for p in std::iter::once(&s.main).chain(s.pool.iter()) {
                    f(&p.ident.describe(), &p.store);
                }
            }
        }
    }
}
