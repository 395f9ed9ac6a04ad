//! Limits classes whose entries are in Redis (`redis = "redis://..."` in `[limits.NAME]`):
//! each gets a turnstile-redis `RedisLimits` (a bounded cache in front of the Redis the fleet
//! shares, invalidated by Redis on every change) as its source when the engine is built.
//! Connected before anything listens: a Redis that cannot be reached refuses the start, as a
//! `[backend]` Redis does. A reload keeps each class's source (its plans updated); a class
//! put in Redis, or moved to another Redis, by a reload takes effect at the next start.

use std::sync::{Arc, Mutex, Weak};
use turnstile::rules::limits::LimitsSource;
use turnstile::rules::Rules;
use turnstile_redis::{RedisLimits, RedisLimitsStats};

/// The sources this process connected, by class, for the metrics (dropped ones skipped).
static CONNECTED: Mutex<Vec<(String, Weak<RedisLimits>)>> = Mutex::new(Vec::new());

/// The counters of each class in Redis still in use.
pub(crate) fn stats() -> Vec<(String, RedisLimitsStats)> {
    let mut c = CONNECTED.lock().unwrap_or_else(|e| e.into_inner());
    c.retain(|(_, w)| w.strong_count() > 0);
    c.iter()
        .filter_map(|(n, w)| Some((n.clone(), w.upgrade()?.stats())))
        .collect()
}

/// A class's name and its source.
pub(crate) type Source = (String, Arc<dyn LimitsSource>);

/// A connected source for every class of `rules` in Redis, by class name.
pub(crate) fn sources(rules: &Rules, origin: &str) -> Result<Vec<Source>, String> {
    let mut out = Vec::new();
    for c in &rules.classes {
        let Some(url) = &c.redis else { continue };
        let src = RedisLimits::builder(c).connect(url).map_err(|e| {
            format!(
                "{origin}: limits class `{}`: {e}; check that Redis is up and reachable",
                c.name
            )
        })?;
        tracing::info!(class = %c.name, redis = %url, buckets = src.buckets(), "limits class in Redis");
        let src = Arc::new(src);
        CONNECTED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((c.name.clone(), Arc::downgrade(&src)));
        out.push((c.name.clone(), src as Arc<dyn LimitsSource>));
    }
    Ok(out)
}
