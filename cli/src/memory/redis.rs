//! `turnstile memory --backend redis --redis-url URL --users N [--json]`: bytes per user in
//! Redis per algorithm: N users filled per row, then `INFO memory`'s `used_memory` growth per
//! user and `MEMORY USAGE` of one user's keys, beside the in-memory store's accounted bytes
//! for the same users filled the same way, and the design notes' figure for the row. The
//! database is flushed (`FLUSHDB`) before each row and at the end: use a scratch server.
//!
//! Rows, at the notes' 500 per hour:
//! * each user checked once: fixed_window, sliding_window, token_bucket and leaky_bucket
//!   packed in buckets (`RedisStoreBuilder::capacity(N)`) and with a Redis key per record;
//!   sliding_log, window_ring and concurrency (a key each);
//! * users at their fullest, for the notes' own Redis arithmetic: sliding_log holding 500
//!   admissions (the notes: a sorted set, "12 KB" per user), window_ring with all 60 minute
//!   counters non-zero (the notes: counters per minute in a hash, "1.6 KB"). These hold
//!   hundreds of times more per user, so they fill at most `FULL_USERS` users.
//!
//! The notes' figure of each row is their arithmetic for its record: 8 (user id) + 4 (epoch) +
//! 2 (count) + 20 (hash-table overhead) = 34 B for a counter and its time (note 000's fixed
//! window, which the other one-record algorithms hold too), 8 + (4 + 20) × n + 20 for a sorted
//! set of n timestamps, 8 + (4 + 2 + 20) × n + 20 for n counters in a hash; none for
//! concurrency.

use serde::Serialize;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Limit, Limits};
use turnstile_redis::{Conn, Error, RedisStore};

/// Users the rows of users at their fullest fill, at most.
const FULL_USERS: u64 = 2_000;
/// Users the in-memory store is filled with for its bytes per user, at most (its records are
/// the same size for every user; a concurrency record of 500 leases is 4 KB).
const IN_MEMORY_USERS: u64 = 100_000;
const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: u64 = 60_000_000_000;
/// 2025-11-23, a plain instant inside an hour, for the explicit-time fills.
const T0: u64 = 1_763_900_000_000_000_000;

/// How a row fills each user.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// One check of cost 1 at the server's time.
    Once,
    /// 500 admissions over the hour (a log of 500).
    Log500,
    /// 8 a minute for 60 minutes (60 non-zero counters; 480 < 500 all admitted).
    PerMinute,
}

impl Fill {
    fn text(self) -> &'static str {
        match self {
            Fill::Once => "one check",
            Fill::Log500 => "500 admissions in 1 h",
            Fill::PerMinute => "8 a minute for 60 minutes",
        }
    }
}

/// A row to measure: the limit, how users are filled, packed or not, the notes' figure.
struct Case {
    limit: Limit,
    fill: Fill,
    packed: bool,
    notes: Option<(u64, &'static str)>,
}

fn cases() -> Vec<Case> {
    let counter = Some((34, "8 + 4 + 2 + 20"));
    let case = |limit, fill, packed, notes| Case {
        limit,
        fill,
        packed,
        notes,
    };
    let mut v = Vec::new();
    for l in [
        Limit::fixed_window(500, HOUR).unwrap(),
        Limit::sliding_window(500, HOUR).unwrap(),
        Limit::token_bucket(500, 500, HOUR).unwrap(),
        Limit::leaky_bucket(500, HOUR, 499, None).unwrap(),
    ] {
        v.push(case(l, Fill::Once, true, counter));
        v.push(case(l, Fill::Once, false, counter));
    }
    v.extend([
        case(
            Limit::sliding_log(500, HOUR).unwrap(),
            Fill::Once,
            false,
            Some((52, "8 + (4 + 20) x 1 + 20")),
        ),
        case(
            Limit::window_ring(500, HOUR, 60).unwrap(),
            Fill::Once,
            false,
            Some((54, "8 + (4 + 2 + 20) x 1 + 20")),
        ),
        // 256 in flight: the most a Redis store takes (turnstile_redis::max_limit).
        case(
            Limit::concurrency(256, HOUR).unwrap(),
            Fill::Once,
            false,
            None,
        ),
        case(
            Limit::sliding_log(500, HOUR).unwrap(),
            Fill::Log500,
            false,
            Some((12_028, "8 + (4 + 20) x 500 + 20")),
        ),
        case(
            Limit::window_ring(500, HOUR, 60).unwrap(),
            Fill::PerMinute,
            false,
            Some((1_588, "8 + (4 + 2 + 20) x 60 + 20")),
        ),
    ]);
    v
}

/// One row of the report.
#[derive(Serialize)]
struct Row {
    engine: &'static str,
    algorithm: String,
    /// "packed" (records as fields of hashes of 32-64 users) or "key per record".
    layout: &'static str,
    /// How each user was filled.
    fill: &'static str,
    users: u64,
    /// used_memory growth / users.
    bytes_per_user: f64,
    /// MEMORY USAGE of one user's keys (for a packed row: its buckets, whole).
    memory_usage: u64,
    encoding: String,
    /// The in-memory store's memory_bytes() / users, same limit and fill.
    in_memory_bytes_per_user: f64,
    /// The design notes' figure for this row, and their arithmetic.
    notes_bytes_per_user: Option<u64>,
    notes_arithmetic: Option<&'static str>,
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

async fn used_memory(conn: &mut Conn) -> Result<u64, Error> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Error::Reply("INFO memory without used_memory".into()))
}

/// Fills the users of one chunk, in Redis and (the first `local` of them) in memory.
async fn fill(
    store: &RedisStore,
    mem: &Store,
    fill: Fill,
    ids: &[&str],
    local: usize,
) -> Result<(), Error> {
    let times: Vec<(u64, u64)> = match fill {
        Fill::Once => {
            store.try_check_many(ids, 1).await?;
            for k in &ids[..local] {
                mem.check_at(*k, 1, T0);
            }
            return Ok(());
        }
        // 5 every 36 s: 100 distinct times over the hour.
        Fill::Log500 => (0..100).map(|m| (T0 + m * 36_000_000_000, 5)).collect(),
        Fill::PerMinute => (0..60).map(|m| (T0 + m * MINUTE, 8)).collect(),
    };
    for (t, cost) in times {
        store.check_many_at(ids, cost, t).await?;
        for k in &ids[..local] {
            mem.check_at(*k, cost, t);
        }
    }
    Ok(())
}

/// `MEMORY USAGE` summed over `keys`, and the last one's `OBJECT ENCODING`.
async fn usage(conn: &mut Conn, keys: &[String]) -> Result<(u64, String), Error> {
    let (mut total, mut encoding) = (0, String::new());
    for k in keys {
        let u: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .arg("SAMPLES")
            .arg(0)
            .query_async(conn)
            .await?;
        total += u.unwrap_or(0);
        let e: Option<String> = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(k)
            .query_async(conn)
            .await?;
        encoding = e.unwrap_or_default();
    }
    Ok((total, encoding))
}

/// Fills `users` users for one case and measures it.
async fn measure_case(conn: &mut Conn, c: &Case, users: u64) -> Result<Row, Error> {
    let users = match c.fill {
        Fill::Once => users,
        _ => users.min(FULL_USERS),
    };
    redis::cmd("FLUSHDB").query_async::<()>(conn).await?;
    let limits = Limits::new(vec![c.limit])?;
    let mut b = RedisStore::builder(limits.clone()).timeout(Duration::from_secs(30));
    if c.packed {
        b = b.capacity(users);
    }
    let store = b.build(conn.clone())?;
    store.load().await?;
    let mem_users = users.min(IN_MEMORY_USERS);
    let mem = Store::builder(limits)
        .capacity(mem_users.max(1))
        .shards(1)
        .build()
        .map_err(Error::Config)?;
    let before = used_memory(conn).await?;
    let ids: Vec<String> = (0..users).map(|i| format!("user{i}")).collect();
    for (i, chunk) in ids.chunks(500).enumerate() {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let local = (mem_users.saturating_sub(i as u64 * 500) as usize).min(refs.len());
        fill(&store, &mem, c.fill, &refs, local).await?;
    }
    let after = used_memory(conn).await?;
    let (memory_usage, encoding) = usage(conn, &store.redis_keys("user0")).await?;
    let bytes_per_user = after.saturating_sub(before) as f64 / users.max(1) as f64;
    Ok(Row {
        engine: "redis",
        algorithm: c.limit.algorithm().name().into(),
        layout: if c.packed { "packed" } else { "key per record" },
        fill: c.fill.text(),
        users,
        ratio_to_notes: c
            .notes
            .map(|(n, _)| (bytes_per_user / n as f64 * 1000.0).round() / 1000.0),
        bytes_per_user: (bytes_per_user * 10.0).round() / 10.0,
        memory_usage,
        encoding,
        in_memory_bytes_per_user: (mem.memory_bytes() as f64 / mem_users.max(1) as f64 * 10.0)
            .round()
            / 10.0,
        notes_bytes_per_user: c.notes.map(|n| n.0),
        notes_arithmetic: c.notes.map(|n| n.1),
    })
}

/// Fills `users` users per row and measures; the database flushed before each row and at
/// the end.
async fn measure(url: &str, users: u64) -> Result<Vec<Row>, Error> {
    let mut conn = Conn::single(url, Duration::from_secs(2)).await?;
    // A first fill, not reported: the connection's buffers on the server (which used_memory
    // counts) grow to their size for the fills' pipelines here, not inside the first row.
    let cases = cases();
    measure_case(&mut conn, &cases[0], users.min(FULL_USERS)).await?;
    let mut out = Vec::new();
    for c in &cases {
        out.push(measure_case(&mut conn, c, users).await?);
    }
    redis::cmd("FLUSHDB").query_async::<()>(&mut conn).await?;
    Ok(out)
}

/// Measures and prints the Redis rows.
pub fn run(url: &str, users: u64, json: bool) -> crate::Result<()> {
    let bar = crate::progress::bar(1, json, "memory: filling redis");
    let rt = crate::bench::redis_runtime()?;
    let rows = rt
        .block_on(measure(url, users))
        .map_err(|e| crate::bench::redis_error(url, e))?;
    bar.finish_and_clear();
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
    print_table(url, &rows);
    Ok(())
}

fn print_table(url: &str, rows: &[Row]) {
    println!("memory --backend redis: {url}, 500 requests per hour; the database was flushed");
    println!();
    println!(
        "{:<15} {:<15} {:<26} {:>7} {:>9} {:>9} {:<9} {:>10} {:>7} {:>7}",
        "algorithm",
        "layout",
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
    for r in rows {
        println!(
            "{:<15} {:<15} {:<26} {:>7} {:>9.1} {:>9} {:<9} {:>10.1} {:>7} {:>7}",
            r.algorithm,
            r.layout,
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
    println!("B/user: Redis used_memory growth / users. USAGE: MEMORY USAGE of one user's keys");
    println!("(packed: the hashes holding its records, whole, shared with 32-64 other users).");
    println!("in-memory: turnstile's keyed store, memory_bytes() / users, same limit and fill.");
    println!("notes: the design notes' arithmetic for the row's record (--json shows it).");
    println!("Users at their fullest (a log of 500, 60 minute counters) fill at most {FULL_USERS} users.");
}
