//! `turnstile memory --backend redis --redis-url URL --users N [--json]`: bytes per user in
//! Redis per algorithm (`turnstile_redis::memory::measure`: `INFO memory`'s used_memory growth
//! and `MEMORY USAGE` of one user), beside the in-memory store's accounted bytes for the same
//! users, and the notes' Redis arithmetic (a sorted set of 500: "12 KB"; 60 counters a
//! minute: "1.6 KB"). The server's database is flushed: use a scratch one.

use serde::Serialize;

#[derive(Serialize)]
struct Row {
    engine: &'static str,
    algorithm: String,
    /// How each user was filled.
    fill: String,
    users: u64,
    /// used_memory growth / users.
    bytes_per_user: f64,
    /// MEMORY USAGE of one user's keys.
    memory_usage: u64,
    encoding: String,
    /// The in-memory store's memory_bytes() / users, same limit and fill.
    in_memory_bytes_per_user: f64,
    notes_bytes_per_user: Option<u64>,
    /// bytes_per_user / notes_bytes_per_user.
    ratio_to_notes: Option<f64>,
}

#[derive(Serialize)]
struct Report<'a> {
    backend: &'static str,
    redis_url: &'a str,
    users: u64,
    results: Vec<Row>,
}

/// Measures and prints the Redis rows.
pub fn run(url: &str, users: u64, json: bool) -> crate::Result<()> {
    let bar = crate::progress::bar(1, json, "memory: filling redis");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let rows = rt
        .block_on(turnstile_redis::memory::measure(url, users))
        .map_err(|e| crate::bench::redis_error(url, e))?;
    bar.finish_and_clear();
    let rows: Vec<Row> = rows
        .into_iter()
        .map(|r| Row {
            engine: "redis",
            ratio_to_notes: r
                .notes_bytes_per_user
                .map(|n| (r.bytes_per_user / n as f64 * 1000.0).round() / 1000.0),
            bytes_per_user: (r.bytes_per_user * 10.0).round() / 10.0,
            in_memory_bytes_per_user: (r.in_memory_bytes_per_user * 10.0).round() / 10.0,
            algorithm: r.name,
            fill: r.fill,
            users: r.users,
            memory_usage: r.memory_usage,
            encoding: r.encoding,
            notes_bytes_per_user: r.notes_bytes_per_user,
        })
        .collect();
    if json {
        let doc = Report {
            backend: "redis",
            redis_url: url,
            users,
            results: rows,
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("memory --backend redis: {url}, 500 requests per hour; the database was flushed");
    println!();
    println!(
        "{:<15} {:<26} {:>7} {:>9} {:>9} {:<9} {:>10} {:>7} {:>7}",
        "algorithm",
        "each user",
        "users",
        "B/user",
        "USAGE",
        "encoding",
        "in-memory",
        "notes",
        "ratio"
    );
    let dash = || "-".to_string();
    for r in &rows {
        println!(
            "{:<15} {:<26} {:>7} {:>9.1} {:>9} {:<9} {:>10.1} {:>7} {:>7}",
            r.algorithm,
            r.fill,
            r.users,
            r.bytes_per_user,
            r.memory_usage,
            r.encoding,
            r.in_memory_bytes_per_user,
            r.notes_bytes_per_user.map_or_else(dash, |n| n.to_string()),
            r.ratio_to_notes.map_or_else(dash, |x| format!("{x:.3}")),
        );
    }
    println!();
    println!("B/user: Redis used_memory growth / users. USAGE: MEMORY USAGE of one user's keys.");
    println!("in-memory: turnstile's keyed store, memory_bytes() / users, same limit and fill.");
    println!(
        "Users at their fullest (a log of 500, 60 minute counters) fill at most {} users.",
        turnstile_redis::memory::FULL_USERS
    );
    Ok(())
}
