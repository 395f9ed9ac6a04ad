//! `turnstile bench fleet`: a fleet of nodes sharing limits through Redis, in one process:
//! N nodes, each a `RedisStore` with a connection of its own (or, for the INCR row, a plain
//! connection), on a redis-server or a 3-master Redis Cluster the command starts, each node
//! running closed-loop clients over a key distribution.
//!
//! Per row (path × distribution × demand × backend): checks per second per node, redis-server
//! CPU per million checks (the servers' `/proc` CPU time around the run), round trips per
//! check, latency percentiles per check, and per key and window of Redis's clock the
//! admissions against the exact limit (over-admitted must be 0 with reserve leases; the share
//! of a saturated key's limit admitted), the share answered in process, and what leases
//! stranded and gave back. Demand: a short run first measures each path's checks per second
//! with no limit in reach; the limit is then set so that the keys' expected demand is
//! `--demand` times what exact limits admit (below 1: every key under its limit).
//! `--rtt 0.5ms` puts a delaying TCP proxy (proxy.rs) between the nodes and a single server.

mod load;
mod proxy;
mod report;
mod servers;

use super::keys::Distribution;
use crate::args::parse_count;
use clap::Args;
use load::{Path, Plan};
use std::time::Duration;

/// A fleet of in-process nodes sharing limits through Redis: per-check path, leases and INCR.
#[derive(Args)]
pub struct FleetArgs {
    /// Nodes (stores with connections of their own).
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Concurrent clients per node.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Keys (accepts 10k, 1M).
    #[arg(long, value_parser = parse_count, default_value = "1M")]
    pub keys: u64,
    /// Comma-separated: uniform, zipf, zipf:S, hot.
    #[arg(long, value_name = "LIST", default_value = "zipf,hot")]
    pub distribution: String,
    /// Comma-separated demands, as multiples of what exact limits admit (2: half the
    /// requests are over the limits; 0.5: every key under its limit).
    #[arg(long, value_name = "LIST", default_value = "2")]
    pub demand: String,
    /// Comma-separated: incr, check (per-check), leases, delayed.
    #[arg(long, value_name = "LIST", default_value = "incr,check,leases")]
    pub paths: String,
    /// Comma-separated: single (one redis-server), cluster (3 masters).
    #[arg(long, value_name = "LIST", default_value = "single")]
    pub backend: String,
    /// The fixed window of the limit (e.g. 10s, 500ms).
    #[arg(long, value_name = "D", value_parser = parse_duration, default_value = "10s")]
    pub window: Duration,
    /// Measured seconds per row.
    #[arg(long, value_name = "S", default_value_t = 20.0)]
    pub seconds: f64,
    /// Seconds of the unlimited run that measures each path's rate first.
    #[arg(long, value_name = "S", default_value_t = 2.0)]
    pub calibrate: f64,
    /// A delaying TCP proxy between the nodes and Redis, this round trip (single only).
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub rtt: Option<Duration>,
    /// One JSON document on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `10s`, `500ms`, `0.5ms`, `250us`.
fn parse_duration(s: &str) -> crate::Result<Duration> {
    let (num, unit) = s
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| s.split_at(i))
        .ok_or_else(|| format!("`{s}` has no unit; write e.g. 10s, 500ms, 0.5ms or 250us"))?;
    let x: f64 = num
        .parse()
        .map_err(|_| format!("`{num}` in `{s}` is not a number"))?;
    let per = match unit {
        "s" => 1e9,
        "ms" => 1e6,
        "us" => 1e3,
        "ns" => 1.0,
        _ => return Err(format!("unknown unit `{unit}` in `{s}`; use s, ms, us or ns").into()),
    };
    if !(x.is_finite() && x > 0.0 && x * per <= 86_400e9) {
        return Err(format!("`{s}` is not a duration above 0 and at most a day").into());
    }
    Ok(Duration::from_nanos((x * per) as u64))
}

fn list<T>(s: &str, name: &str, f: impl Fn(&str) -> Option<T>) -> crate::Result<Vec<T>> {
    let v: Option<Vec<T>> = s.split(',').map(|w| f(w.trim())).collect();
    match v {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(format!("option --{name}: cannot read `{s}` (see --help)").into()),
    }
}

/// The limit per window that makes the expected demand `demand` times what it admits:
/// `sum_k min(d_k, L) = sum_k d_k / demand`, `d_k` each key's expected requests per window at
/// `rate` checks per second; below a demand of 1, the hottest key's demand over it.
pub(crate) fn limit_for(
    dist: Distribution,
    keys: u64,
    rate: f64,
    window: Duration,
    demand: f64,
) -> u64 {
    let total = rate * window.as_secs_f64();
    let n = match dist {
        Distribution::Hot => 1,
        _ => keys,
    };
    let p: Vec<f64> = match dist {
        Distribution::Zipf(s) => {
            let h: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
            (1..=n).map(|k| (k as f64).powf(-s) / h).collect()
        }
        Distribution::Uniform => vec![1.0 / n as f64; n as usize],
        Distribution::Hot => vec![1.0],
    };
    let top = total * p[0];
    if demand <= 1.0 {
        return ((top / demand).ceil() as u64).max(1);
    }
    let admitted = |l: f64| p.iter().map(|&q| (total * q).min(l)).sum::<f64>();
    let (mut lo, mut hi) = (0.0, top);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if admitted(mid) * demand < total {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (hi.round() as u64).clamp(1, turnstile::algo::fixed_window::MAX_LIMIT)
}

impl Path {
    /// A `--paths` word.
    fn parse(w: &str) -> Option<Self> {
        match w {
            "incr" => Some(Path::Incr),
            "check" | "per-check" => Some(Path::Check),
            "leases" => Some(Path::Leases),
            "delayed" => Some(Path::Delayed),
            _ => None,
        }
    }
}

/// The options' ranges, each refused with what it accepts.
fn check_ranges(a: &FleetArgs, backends: &[bool]) -> crate::Result<()> {
    if !(1..=64).contains(&a.nodes) || !(1..=1024).contains(&a.clients) {
        return Err("option --nodes: 1 to 64; --clients: 1 to 1024".into());
    }
    if a.keys == 0 || a.keys > 100_000_000 {
        return Err(format!("option --keys: {}; give 1 to 1e8", a.keys).into());
    }
    if !(a.seconds > 0.0 && a.seconds <= 3600.0 && a.calibrate > 0.0 && a.calibrate <= 60.0) {
        return Err(
            "option --seconds: above 0, at most 3600; --calibrate: above 0, at most 60".into(),
        );
    }
    if a.rtt.is_some() && backends.contains(&true) {
        return Err("option --rtt: the proxy goes in front of one redis-server; drop `cluster` from --backend".into());
    }
    Ok(())
}

/// Runs the command.
pub fn run(a: FleetArgs) -> crate::Result<()> {
    let dists = list(&a.distribution, "distribution", |w| w.parse().ok())?;
    let demands = list(&a.demand, "demand", |w| {
        w.parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0)
    })?;
    let paths = list(&a.paths, "paths", Path::parse)?;
    let backends = list(&a.backend, "backend", |w| match w {
        "single" => Some(false),
        "cluster" => Some(true),
        _ => None,
    })?;
    check_ranges(&a, &backends)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let mut rows = Vec::new();
    for &cluster in &backends {
        let redis = if cluster {
            servers::Redis::cluster()?
        } else {
            servers::Redis::single()?
        };
        let cpu = || redis.cpu_secs();
        let proxy = match a.rtt {
            Some(rtt) => {
                let up = std::net::SocketAddr::from(([127, 0, 0, 1], redis.ports[0]));
                Some(rt.block_on(proxy::Proxy::start(up, rtt))?)
            }
            None => None,
        };
        let urls = match &proxy {
            Some(p) => vec![format!("redis://{}/", p.addr)],
            None => redis.urls(),
        };
        for &dist in &dists {
            for &demand in &demands {
                for (i, &path) in paths.iter().enumerate() {
                    let mut plan = Plan {
                        path,
                        nodes: a.nodes,
                        tasks: a.clients,
                        dist,
                        keys: a.keys,
                        limit: turnstile::algo::fixed_window::MAX_LIMIT,
                        window: a.window,
                        run: Duration::from_secs_f64(a.calibrate),
                        prefix: format!("cal{i}:"),
                        urls: urls.clone(),
                        cluster: redis.is_cluster(),
                        track: 1 << 18,
                    };
                    report::progress(&format!(
                        "{} {} {dist} demand {demand}: measuring the rate",
                        if cluster { "cluster" } else { "single" },
                        path.name()
                    ));
                    let (cal, _) = rt.block_on(load::run(&plan, &cpu))?;
                    let rate = cal.checks.iter().sum::<u64>() as f64 / cal.secs;
                    plan.limit = limit_for(dist, a.keys, rate, a.window, demand);
                    plan.run = Duration::from_secs_f64(a.seconds);
                    plan.prefix = format!("run{i}:{}:", rows.len());
                    report::progress(&format!(
                        "  {:.0} checks/s unlimited: limit {} per {:?}; running {} s",
                        rate, plan.limit, a.window, a.seconds
                    ));
                    let (out, cpu_s) = rt.block_on(load::run(&plan, &cpu))?;
                    rows.push(report::Row::of(&plan, cluster, a.rtt, demand, &out, cpu_s));
                }
            }
        }
        drop(proxy);
    }
    report::print(&rows, a.json);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_makes_the_demand_what_was_asked() {
        let w = Duration::from_secs(1);
        // One key at 50x: the limit is its demand over 50.
        assert_eq!(limit_for(Distribution::Hot, 1, 5000.0, w, 50.0), 100);
        // Uniform: every key at twice its limit.
        assert_eq!(limit_for(Distribution::Uniform, 100, 20_000.0, w, 2.0), 100);
        // Below 1: the hottest key under its limit.
        assert_eq!(limit_for(Distribution::Uniform, 100, 20_000.0, w, 0.5), 400);
        // Zipf: exact limits admit half the requests.
        let (n, rate) = (10_000u64, 1e6);
        let l = limit_for(Distribution::Zipf(1.0), n, rate, w, 2.0) as f64;
        let h: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
        let admitted: f64 = (1..=n).map(|k| (rate / (k as f64 * h)).min(l)).sum();
        assert!((admitted / rate - 0.5).abs() < 0.01, "{}", admitted / rate);
    }

    #[test]
    fn durations_read_with_their_unit() {
        assert_eq!(
            parse_duration("0.5ms").ok(),
            Some(Duration::from_micros(500))
        );
        assert_eq!(parse_duration("10s").ok(), Some(Duration::from_secs(10)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("3h").is_err());
    }
}
