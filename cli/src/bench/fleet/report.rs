//! The fleet benchmark's figures per row, as a table or JSON.

use super::load::{Outcome, Path, Plan};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// One row's figures.
#[derive(Serialize)]
pub(crate) struct Row {
    pub backend: &'static str,
    pub rtt_ms: Option<f64>,
    pub path: &'static str,
    pub distribution: String,
    pub demand: f64,
    pub limit: u64,
    pub window_s: f64,
    pub nodes: usize,
    pub checks: u64,
    /// Checks per second per node (mean over nodes).
    pub checks_per_node_s: f64,
    /// redis-server CPU seconds per million checks (all servers).
    pub redis_cpu_s_per_m: f64,
    pub round_trips_per_check: f64,
    /// Round trips per node per window of the limit.
    pub round_trips_per_node_window: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Of the checks answered in process.
    pub local_p50_us: f64,
    pub local_p99_us: f64,
    pub local_p999_us: f64,
    /// Checks answered in process (leases only).
    pub local: f64,
    /// Key-windows whose demand passed the limit, and the share of their limit admitted.
    pub saturated: u64,
    /// (INCR admits everything: not counted.)
    pub saturated_admitted: Option<f64>,
    /// Key-windows admitted past the limit, and by how much in all.
    pub over_keys: Option<u64>,
    pub over: Option<u64>,
    /// Admissions answered across a window's boundary (not counted in a window).
    pub ambiguous: u32,
    /// Leases: admissions granted beyond requests, given back, stranded.
    pub granted: u64,
    pub returned: u64,
    pub stranded: u64,
    /// Checks the failure policy answered.
    pub fallbacks: u64,
}

impl Row {
    pub(crate) fn of(
        p: &Plan,
        cluster: bool,
        rtt: Option<Duration>,
        demand: f64,
        o: &Outcome,
        cpu_s: f64,
    ) -> Self {
        let checks: u64 = o.checks.iter().sum();
        let c = &o.counts;
        let (mut saturated, mut admitted_sat, mut over_keys, mut over) = (0, 0, 0, 0);
        for w in o.complete.clone() {
            for k in 0..c.track {
                let i = w * c.track + k;
                // Relaxed: every client has ended.
                let d = c.demand[i].load(Ordering::Relaxed) as u64;
                let a = c.admitted[i].load(Ordering::Relaxed) as u64;
                if d > p.limit {
                    saturated += 1;
                    admitted_sat += a.min(p.limit);
                }
                if a > p.limit {
                    over_keys += 1;
                    over += a - p.limit;
                }
            }
        }
        let l = &o.leases;
        let trips = match p.path {
            Path::Incr | Path::Check => checks as f64,
            Path::Leases | Path::Delayed => l.round_trips as f64,
        };
        let windows = o.secs / p.window.as_secs_f64();
        let q = |x: f64| o.latency.value_at_quantile(x) as f64 / 1000.0;
        let lq = |x: f64| o.local_latency.value_at_quantile(x) as f64 / 1000.0;
        Row {
            backend: if cluster { "cluster" } else { "single" },
            rtt_ms: rtt.map(|d| d.as_secs_f64() * 1000.0),
            path: p.path.name(),
            distribution: p.dist.to_string(),
            demand,
            limit: p.limit,
            window_s: p.window.as_secs_f64(),
            nodes: p.nodes,
            checks,
            checks_per_node_s: checks as f64 / o.secs / p.nodes as f64,
            redis_cpu_s_per_m: cpu_s / checks.max(1) as f64 * 1e6,
            round_trips_per_check: trips / checks.max(1) as f64,
            round_trips_per_node_window: trips / p.nodes as f64 / windows.max(1e-9),
            p50_us: q(0.5),
            p99_us: q(0.99),
            p999_us: q(0.999),
            local_p50_us: lq(0.5),
            local_p99_us: lq(0.99),
            local_p999_us: lq(0.999),
            local: if l.checks > 0 {
                l.local as f64 / l.checks as f64
            } else {
                0.0
            },
            saturated,
            saturated_admitted: (saturated > 0 && p.path != Path::Incr)
                .then(|| admitted_sat as f64 / (saturated * p.limit) as f64),
            over_keys: (p.path != Path::Incr).then_some(over_keys),
            over: (p.path != Path::Incr).then_some(over),
            // Relaxed: every client has ended.
            ambiguous: c.ambiguous.load(Ordering::Relaxed),
            granted: l.granted,
            returned: l.returned,
            stranded: l.stranded,
            fallbacks: o.fallbacks,
        }
    }
}

/// A progress line (stderr).
pub(crate) fn progress(s: &str) {
    eprintln!("{s}");
}

/// The rows, as a table (with each path's Redis CPU against the per-check path's of the same
/// backend, distribution and demand) or as JSON.
pub(crate) fn print(rows: &[Row], json: bool) {
    if json {
        match serde_json::to_string_pretty(rows) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("cannot write JSON: {e}"),
        }
        return;
    }
    println!(
        "{:<8} {:<9} {:<8} {:>6} {:>8} {:>11} {:>10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>6} {:>7} {:>8} {:>10} {:>9} {:>9}",
        "backend", "path", "dist", "demand", "limit", "checks/s/n", "cpu s/M", "vs chk",
        "trips/chk", "trips/n/w", "p50 us", "p99 us", "p99.9", "local", "loc p99", "sat adm", "over", "stranded"
    );
    for r in rows {
        let per_check = rows.iter().find(|x| {
            x.path == "per-check"
                && x.backend == r.backend
                && x.distribution == r.distribution
                && x.demand == r.demand
        });
        let vs = per_check
            .map(|x| {
                format!(
                    "1/{:.0}",
                    x.redis_cpu_s_per_m / r.redis_cpu_s_per_m.max(1e-12)
                )
            })
            .unwrap_or_default();
        println!(
            "{:<8} {:<9} {:<8} {:>6} {:>8} {:>11.0} {:>10.3} {:>7} {:>9.4} {:>9.2} {:>9.1} {:>9.1} {:>6.0} {:>6.1}% {:>8.2} {:>10} {:>9} {:>9}",
            r.backend,
            r.path,
            r.distribution,
            r.demand,
            r.limit,
            r.checks_per_node_s,
            r.redis_cpu_s_per_m,
            vs,
            r.round_trips_per_check,
            r.round_trips_per_node_window,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.local * 100.0,
            r.local_p99_us,
            r.saturated_admitted.map_or("-".into(), |x| format!("{:.1}%", x * 100.0)),
            match (r.over_keys, r.over) {
                (Some(k), Some(o)) => format!("{k}/{o}"),
                _ => "-".into(),
            },
            r.stranded,
        );
    }
    for r in rows.iter().filter(|r| r.fallbacks > 0) {
        println!(
            "warning: {} {} {} {}: {} checks answered by the failure policy (Redis slow or failing: a timeout of 500 ms, then the circuit breaker); its figures are not all Redis's",
            r.backend, r.path, r.distribution, r.demand, r.fallbacks
        );
    }
    println!(
        "cpu s/M: redis-server CPU seconds per million checks (vs chk: against the per-check path's); \
         trips/n/w: round trips per node per window; loc p99: of the checks answered in process (us); sat adm: share of the limit admitted in \
         key-windows whose demand passed it; over: key-windows over the limit / admissions over it."
    );
}
