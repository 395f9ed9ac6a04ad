//! `turnstile bench --engine redis --redis-url URL [--json]`: checks per second of every
//! algorithm against one Redis at concurrency 1 and 64, beside Redis's own `INCR` from the same
//! client in the same run (the ceiling for one round trip per check), and through leases of
//! 100 (`turnstile_redis::bench::run`; figures and how to pin server and client in
//! docs/redis.md).

use serde::Serialize;

/// One row of the report.
#[derive(Serialize)]
struct Row {
    name: String,
    concurrency: usize,
    calls_per_sec: f64,
    /// calls_per_sec / INCR's at the same concurrency.
    vs_incr: f64,
}

#[derive(Serialize)]
struct Report<'a> {
    engine: &'static str,
    redis_url: &'a str,
    requests_per_row: u64,
    /// /proc/loadavg's 1-minute figure before the run (the figures are provisional above
    /// half the cores).
    load_average: Option<f64>,
    results: Vec<Row>,
}

/// Runs the Redis rows: `requests` calls per row.
pub fn run(url: &str, requests: u64, json: bool) -> crate::Result<()> {
    if requests < 64 {
        return Err(format!(
            "option --redis-requests: {requests}; give at least 64 (one per client at concurrency 64)"
        ).into());
    }
    let load = super::report::load_average();
    if !json {
        super::report::load_warning();
        super::report::progress(format!(
            "redis at {url}: {requests} calls per row, concurrency 1 and 64"
        ));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let rows = rt
        .block_on(turnstile_redis::bench::run(url, requests, &[1, 64]))
        .map_err(|e| super::redis_error(url, e))?;
    let mut out = Vec::new();
    let mut incr = f64::NAN;
    for r in rows {
        if r.name == "INCR" {
            incr = r.per_sec;
        }
        out.push(Row {
            vs_incr: (r.per_sec / incr * 1000.0).round() / 1000.0,
            calls_per_sec: r.per_sec.round(),
            concurrency: r.concurrency,
            name: r.name,
        });
    }
    super::report::progress_done();
    if json {
        let doc = Report {
            engine: "redis",
            redis_url: url,
            requests_per_row: requests,
            load_average: load,
            results: out,
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "bench --engine redis: {url}, {requests} calls per row, one multiplexed connection; load average {}",
        load.map_or("unknown".into(), |l| format!("{l:.1}"))
    );
    println!();
    println!(
        "{:<45} {:>11} {:>12} {:>9}",
        "engine", "concurrency", "calls/s", "vs INCR"
    );
    for r in &out {
        println!(
            "{:<45} {:>11} {:>12.0} {:>8.0}%",
            r.name,
            r.concurrency,
            r.calls_per_sec,
            r.vs_incr * 100.0
        );
    }
    Ok(())
}
