//! Per-limit counters in upstream's names, rendered for `/metrics`.
//!
//! Upstream counts, per configured limit (its stats key `domain.key_value.subkey`):
//! `total_hits`, `over_limit`, `near_limit`, `within_limit` and `shadow_mode`, in hits (a
//! request with `hits_addend: 5` adds 5). A dashboard built on upstream's Prometheus mapping
//! (`ratelimit_service_rate_limit_<counter>{key="..."}`) finds the same names here.
//!
//! The split follows upstream: of a request's hits, those past `requests_per_unit` are
//! `over_limit`, those between the near threshold (`floor(limit × NEAR_LIMIT_RATIO)`) and the
//! limit are `near_limit`; `within_limit` counts all hits of a request that was not over.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The counter names, in the order of [`Counters`].
pub const NAMES: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

/// One limit's counters.
#[derive(Debug, Default)]
pub struct Counters {
    c: [AtomicU64; 5],
}

impl Counters {
    fn add(&self, i: usize, n: u64) {
        if n > 0 {
            // Relaxed: independent statistics, read only for display; no other memory is
            // published through them.
            self.c[i].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The values, in [`NAMES`] order.
    pub fn values(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.c[i].load(Ordering::Relaxed))
    }

    /// Records one descriptor's check (upstream's `GetResponseDescriptorStatus` arithmetic).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        hits: u64,
        before: u64,
        after: u64,
        limit: u64,
        near_ratio: f32,
        over: bool,
        shadow: bool,
    ) {
        let near = (limit as f64 * near_ratio as f64).floor() as u64;
        self.add(0, hits);
        if over {
            if before >= limit {
                self.add(1, hits);
            } else {
                self.add(1, after.saturating_sub(limit));
                self.add(2, limit.saturating_sub(near.max(before)));
            }
            if shadow {
                self.add(4, hits);
            }
        } else {
            if after > near {
                self.add(2, after.saturating_sub(near.max(before)));
            }
            self.add(3, hits);
        }
    }
}

/// All limits' counters, by stats key; kept across reloads.
#[derive(Debug, Default)]
pub struct Metrics {
    by_key: Mutex<BTreeMap<String, Arc<Counters>>>,
    /// The configured descriptors' labels (domain, key, value), by stats key.
    labels: Mutex<BTreeMap<String, [String; 3]>>,
    global_shadow: AtomicU64,
}

/// The results of `turnstile_envoy_descriptor_hits_total`, by index in [`NAMES`].
const RESULTS: [(&str, usize); 4] = [
    ("total", 0),
    ("over_limit", 1),
    ("near_limit", 2),
    ("shadow_mode", 4),
];

impl Metrics {
    /// The counters of `key`, created on first use (at configuration load, not per request).
    pub fn counters(&self, key: &str) -> Arc<Counters> {
        let mut m = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(m.entry(key.to_string()).or_default())
    }

    /// Labels a configured descriptor's counters for `turnstile_envoy_descriptor_hits_total`:
    /// its domain, its key path and its configured value (empty: none). At configuration load.
    pub fn describe(&self, key: &str, labels: [&str; 3]) {
        let mut m = self.labels.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(key.to_string(), labels.map(str::to_string));
    }

    /// `turnstile_envoy_descriptor_hits_total{domain, key, value?, result}`: each configured
    /// descriptor's hits, four series each (`within_limit` is `total` less the others'
    /// share; see the module docs). A value is a label only where the configuration names it.
    pub fn render_descriptors(&self) -> String {
        const NAME: &str = "turnstile_envoy_descriptor_hits_total";
        let labels = self.labels.lock().unwrap_or_else(|e| e.into_inner());
        let m = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = format!("# HELP {NAME} Hits of each configured Envoy descriptor (hits_addend summed), by result: total, over_limit, near_limit (past NEAR_LIMIT_RATIO), shadow_mode.\n# TYPE {NAME} counter\n");
        for (key, [domain, k, v]) in labels.iter() {
            let Some(c) = m.get(key) else { continue };
            let value = if v.is_empty() {
                String::new()
            } else {
                format!(",value=\"{}\"", escape(v))
            };
            for (result, i) in RESULTS {
                let _ = writeln!(
                    out,
                    "{NAME}{{domain=\"{}\",key=\"{}\"{value},result=\"{result}\"}} {}",
                    escape(domain),
                    escape(k),
                    c.c[i].load(Ordering::Relaxed)
                );
            }
        }
        out
    }

    /// The values of `key`'s counters, if it has any.
    pub fn get(&self, key: &str) -> Option<[u64; 5]> {
        let m = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        m.get(key).map(|c| c.values())
    }

    /// One over-limit answer turned OK by `SHADOW_MODE`.
    pub fn global_shadow_mode(&self) {
        // Relaxed: a statistic (see `Counters::add`).
        self.global_shadow.fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text format.
    pub fn render(&self) -> String {
        let m = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for (i, name) in NAMES.iter().enumerate() {
            let _ = writeln!(out, "# TYPE ratelimit_service_rate_limit_{name} counter");
            for (key, c) in m.iter() {
                let _ = writeln!(
                    out,
                    "ratelimit_service_rate_limit_{name}{{key=\"{}\"}} {}",
                    escape(key),
                    c.c[i].load(Ordering::Relaxed)
                );
            }
        }
        let _ = writeln!(
            out,
            "# TYPE ratelimit_service_global_shadow_mode counter\nratelimit_service_global_shadow_mode {}",
            self.global_shadow.load(Ordering::Relaxed)
        );
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_split() {
        // limit 10, near threshold 8: hits 7 → 9 are within, 1 near; 9 → 12 over by 2, 1 near.
        let c = Counters::default();
        c.record(2, 7, 9, 10, 0.8, false, false);
        assert_eq!(c.values(), [2, 0, 1, 2, 0]);
        c.record(3, 9, 12, 10, 0.8, true, true);
        assert_eq!(c.values(), [5, 2, 2, 2, 3]);
        c.record(4, 12, 16, 10, 0.8, true, false);
        assert_eq!(c.values(), [9, 6, 2, 2, 3]);
    }
}
