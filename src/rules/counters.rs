//! The rules' counters: per rule (denied, would-deny, elastic, over-nominal) and per limit
//! of each rule (admitted, denied, shadow-denied, near the limit), sharded per thread and kept
//! across reloads by rule name.

use super::model::MAX_LIMITS;
use crate::sync::{AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

/// What one rule has done since it was first loaded (kept across reloads by name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleStats {
    /// Requests it denied.
    pub denied: u64,
    /// Requests a shadow rule would have denied (they were allowed).
    pub would_deny: u64,
    /// Requests an elastic rule admitted from its extra pool.
    pub elastic: u64,
    /// Requests a soft rule admitted over the nominal limit.
    pub over_nominal: u64,
}

pub(crate) const DENIED: usize = 0;
pub(crate) const WOULD: usize = 1;
pub(crate) const ELASTIC: usize = 2;
pub(crate) const OVER: usize = 3;

/// Per-limit events: admitted (a shadow rule's would-be admission included), denied by an
/// enforcing rule, would have been denied by a shadow rule, admitted near the limit.
pub(crate) const L_ADMITTED: usize = 0;
pub(crate) const L_DENIED: usize = 1;
pub(crate) const L_SHADOW: usize = 2;
pub(crate) const L_NEAR: usize = 3;

/// Per-limit rows of a rule: one per limit of the rule ([`MAX_LIMITS`]), then one for the
/// keys with an override, then one for a key's own limit (a limits class).
pub(crate) const OVERRIDE_ROW: usize = MAX_LIMITS;
pub(crate) const OWN_ROW: usize = MAX_LIMITS + 1;
const ROWS: usize = MAX_LIMITS + 2;

/// What one limit of a rule has decided since the rule was first loaded (kept across reloads
/// by name, by the limit's position in the rule's `limits`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitStats {
    /// Which limit: its position in the rule's `limits` ("0", "1", ...), `override` for the
    /// keys with an override of the rule, `own` for keys with their own limit (`limits_from`).
    pub limit: String,
    /// Checks this limit decided for the rule (the binding one: the limit with the least
    /// left, or the one that denied): `admitted + denied + shadow_denied`.
    pub checks: u64,
    /// Admitted (for a shadow rule: would have admitted).
    pub admitted: u64,
    /// Denied by the rule (an enforcing rule).
    pub denied: u64,
    /// Would have been denied by the rule (a shadow rule; the request went on).
    pub shadow_denied: u64,
    /// Admitted with less than `1 - share` of the limit left ([`Engine::set_near_limit`](super::Engine::set_near_limit)).
    pub near_limit: u64,
}

/// One shard of a rule's counters: the rule's events, and each limit row's.
struct Shard {
    rule: [AtomicU64; 4],
    limit: [[AtomicU64; 4]; ROWS],
}

/// Per-rule counters, sharded like the in-flight counter (a denied flood hits them from
/// every core).
pub(crate) struct Counters(Box<[CachePadded<Shard>]>);

impl Counters {
    /// `shards` (a power of two: a shard is picked by a mask, not a division).
    pub(crate) fn new(shards: usize) -> Self {
        let shards = shards.max(1).next_power_of_two();
        Self(
            (0..shards)
                .map(|_| {
                    CachePadded::new(Shard {
                        rule: std::array::from_fn(|_| AtomicU64::new(0)),
                        limit: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
                    })
                })
                .collect(),
        )
    }
    #[inline]
    pub(crate) fn add(&self, shard: usize, what: usize) {
        // Relaxed: statistics; nothing is published through them.
        self.0[shard & (self.0.len() - 1)].rule[what].fetch_add(1, Ordering::Relaxed);
    }
    /// A limit row's event (`row`: from `Slot::row`); `near`: an admission near the limit,
    /// counted too.
    #[inline]
    pub(crate) fn limit(&self, shard: usize, row: usize, what: usize, near: bool) {
        let l = &self.0[shard & (self.0.len() - 1)].limit[row];
        // Relaxed: statistics; nothing is published through them.
        l[what].fetch_add(1, Ordering::Relaxed);
        if near {
            // Relaxed: as above.
            l[L_NEAR].fetch_add(1, Ordering::Relaxed);
        }
    }
    pub(crate) fn get(&self) -> RuleStats {
        // Relaxed: statistics.
        let sum = |w: usize| {
            self.0
                .iter()
                .map(|c| c.rule[w].load(Ordering::Relaxed))
                .sum()
        };
        RuleStats {
            denied: sum(DENIED),
            would_deny: sum(WOULD),
            elastic: sum(ELASTIC),
            over_nominal: sum(OVER),
        }
    }
    /// Row `row`'s counts, summed over the shards.
    fn row(&self, row: usize, limit: String) -> LimitStats {
        // Relaxed: statistics.
        let sum = |w: usize| -> u64 {
            self.0
                .iter()
                .map(|c| c.limit[row][w].load(Ordering::Relaxed))
                .sum()
        };
        let (admitted, denied, shadow_denied) = (sum(L_ADMITTED), sum(L_DENIED), sum(L_SHADOW));
        LimitStats {
            limit,
            checks: admitted + denied + shadow_denied,
            admitted,
            denied,
            shadow_denied,
            near_limit: sum(L_NEAR),
        }
    }
}

impl Counters {
    /// A rule's per-limit counts: one per limit of the rule (`limits` of them), then
    /// `override` if the rule has overrides, `own` if its keys may have their own limit (or
    /// it counted some).
    pub(crate) fn limit_stats(&self, limits: usize, overrides: bool, own: bool) -> Vec<LimitStats> {
        let mut out: Vec<LimitStats> = (0..limits.min(MAX_LIMITS))
            .map(|i| self.row(i, i.to_string()))
            .collect();
        if overrides {
            out.push(self.row(OVERRIDE_ROW, "override".into()));
        }
        let own_row = self.row(OWN_ROW, "own".into());
        if own || own_row.checks > 0 {
            out.push(own_row);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::rules::{Engine, Request, Rules};

    const RULES: &str = r#"
[[rule]]
name = "two"
key = "customer"
limits = [
  { algorithm = "fixed_window", limit = 4, window = "1h" },
  { algorithm = "fixed_window", limit = 5, window = "1h", count_denied = true },
]
[[rule.override]]
key = "9"
limits = [{ algorithm = "fixed_window", limit = 1, window = "1h" }]

[[rule]]
name = "watch"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 2, window = "1h" }]
"#;

    /// (checks, admitted, denied, shadow_denied, near_limit) of each row of `rule`.
    fn rows(e: &Engine, rule: &str) -> Vec<(String, [u64; 5])> {
        e.limit_stats(rule)
            .unwrap()
            .into_iter()
            .map(|l| {
                let v = [
                    l.checks,
                    l.admitted,
                    l.denied,
                    l.shadow_denied,
                    l.near_limit,
                ];
                (l.limit, v)
            })
            .collect()
    }

    #[test]
    fn each_check_counts_under_its_binding_limit() {
        let e = Engine::new(Rules::parse(RULES, "t").unwrap()).unwrap();
        e.set_near_limit(0.5);
        let check = |customer: u64, cost: u64| {
            let req = Request {
                cost,
                ..Request::new().customer(customer)
            };
            e.check(&req).allowed()
        };
        // Binding: the 1st limit (3 left of 4, not near; then 1 left: near), the 2nd once it
        // has counted a denial (0 left).
        assert!(check(1, 1));
        assert!(check(1, 2));
        assert!(!check(1, 2));
        assert!(!check(1, 1));
        // A peek is not counted; an override's key counts under `override`.
        check(1, 0);
        assert!(check(9, 1));
        assert!(!check(9, 1));
        let want = |r: &str, v: [u64; 5]| (r.to_string(), v);
        assert_eq!(
            rows(&e, "two"),
            vec![
                want("0", [2, 2, 0, 0, 1]),
                want("1", [2, 0, 2, 0, 0]),
                want("override", [2, 1, 1, 0, 1]),
            ]
        );
        // The shadow rule: asked after the enforcing ones admitted (checks 1, 2, and 9's first).
        assert_eq!(rows(&e, "watch"), vec![want("0", [3, 2, 0, 1, 0])]);
        assert_eq!(e.near_limit(), 0.5);
        // Kept across a reload by the rule's name.
        e.reload(Rules::parse(RULES, "t").unwrap()).unwrap();
        assert_eq!(rows(&e, "watch"), vec![want("0", [3, 2, 0, 1, 0])]);
    }
}
