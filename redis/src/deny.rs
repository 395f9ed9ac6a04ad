//! The over-limit cache (`RedisStoreBuilder::deny_cache`): keys known to be over their limit
//! are denied locally until their retry time, for costs at least the one denied. It only
//! ever denies: what it does not cover goes to Redis.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use turnstile::{Decision, Outcome};

/// Entries held before the expired ones are dropped (then, if still full, all of them).
const MAX: usize = 65_536;

/// key → (denied until, the smallest cost denied, the decision).
#[derive(Default)]
pub(crate) struct DenyCache {
    // A lock: taken only with the cache on, beside a network round trip (tens of µs) it is
    // small; entries are per key, so a sharded map would buy little.
    map: Mutex<HashMap<String, (Instant, u64, Decision)>>,
}

impl DenyCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, u64, Decision)>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers a `Limited` decision with a retry time (nothing else).
    pub(crate) fn remember(&self, key: &str, cost: u64, d: &Decision) {
        let Some(retry) = d.retry_after_ns else {
            return;
        };
        if d.outcome != Outcome::Limited {
            return;
        }
        let until = Instant::now() + Duration::from_nanos(retry);
        let mut m = self.lock();
        if m.len() >= MAX {
            let now = Instant::now();
            m.retain(|_, e| e.0 > now);
            if m.len() >= MAX {
                m.clear();
            }
        }
        let e = m.entry(key.to_owned()).or_insert((until, cost, *d));
        if cost <= e.1 {
            *e = (until, cost, *d);
        }
    }

    /// The cached denial of `cost` for `key`, its retry counted down, if any.
    pub(crate) fn lookup(&self, key: &str, cost: u64) -> Option<Decision> {
        let mut m = self.lock();
        let &(until, min_cost, d) = m.get(key)?;
        let now = Instant::now();
        if now >= until {
            m.remove(key);
            return None;
        }
        if cost < min_cost {
            return None;
        }
        let left = (until - now).as_nanos() as u64;
        Some(Decision {
            retry_after_ns: Some(left.max(1)),
            reset_after_ns: d.reset_after_ns.max(left),
            ..d
        })
    }

    pub(crate) fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(retry: u64) -> Decision {
        Decision {
            outcome: Outcome::Limited,
            limit: 5,
            remaining: 0,
            reset_after_ns: 10,
            retry_after_ns: Some(retry),
            delay_ns: 0,
        }
    }

    #[test]
    fn denies_costs_at_least_the_one_denied_until_the_retry() {
        let c = DenyCache::default();
        c.remember("k", 2, &limited(60_000_000_000));
        assert!(c.lookup("k", 1).is_none(), "a smaller cost may fit");
        let d = c.lookup("k", 3).unwrap();
        assert_eq!(d.outcome, Outcome::Limited);
        assert!(d.retry_after_ns.unwrap() <= 60_000_000_000);
        c.forget("k");
        assert!(c.lookup("k", 3).is_none());
        c.remember("k", 1, &limited(1));
        std::thread::sleep(Duration::from_millis(1));
        assert!(c.lookup("k", 1).is_none(), "past its retry");
    }

    #[test]
    fn only_limited_answers_with_a_retry_are_kept() {
        let c = DenyCache::default();
        let mut d = limited(1_000_000_000);
        d.outcome = Outcome::NeverFits;
        c.remember("a", 1, &d);
        d.outcome = Outcome::Limited;
        d.retry_after_ns = None;
        c.remember("b", 1, &d);
        assert!(c.lookup("a", 1).is_none() && c.lookup("b", 1).is_none());
    }
}
