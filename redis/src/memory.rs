//! Memory in Redis, measured: N users per algorithm, then `INFO memory`'s `used_memory` growth
//! per user and `MEMORY USAGE` of one user's keys, beside the in-memory store's own
//! accounting (`Store::memory_bytes`) for the same users filled the same way. What `turnstile
//! memory --backend redis` prints. The database is flushed (`FLUSHDB`) before each row and at
//! the end: use a scratch server.
//!
//! Two kinds of rows, at the notes' 500 per hour:
//! * each user checked once (every algorithm);
//! * users at their fullest, for the notes' own Redis arithmetic: sliding_log holding 500
//!   admissions (the notes: a sorted set, "12 KB" per user), window_ring with all 60 minute
//!   counters non-zero (the notes: counters per minute in a hash, "1.6 KB"). These hold
//!   hundreds of times more per user, so they fill at most [`FULL_USERS`] users.

use crate::{Conn, Error, RedisStore};
use redis::aio::ConnectionManager;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Limit, Limits};

/// Users the rows of users at their fullest fill, at most.
pub const FULL_USERS: u64 = 2_000;
/// Users the in-memory store is filled with for its bytes per user, at most (its records are
/// the same size for every user; a concurrency record of 500 leases is 4 KB).
pub const IN_MEMORY_USERS: u64 = 100_000;

/// One row.
#[derive(Clone, Debug)]
pub struct Row {
    /// The algorithm.
    pub name: String,
    /// How each user was filled.
    pub fill: String,
    /// Users filled.
    pub users: u64,
    /// `used_memory` growth per user, bytes.
    pub bytes_per_user: f64,
    /// `MEMORY USAGE` of one user's keys, bytes.
    pub memory_usage: u64,
    /// `OBJECT ENCODING` of that user's key.
    pub encoding: String,
    /// The in-memory keyed store's accounted bytes per user, same limit, same fill (of at
    /// most [`IN_MEMORY_USERS`] users).
    pub in_memory_bytes_per_user: f64,
    /// The design notes' estimate for this row, bytes per user, if they give one.
    pub notes_bytes_per_user: Option<u64>,
}

async fn used_memory(conn: &mut ConnectionManager) -> Result<u64, Error> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Error::Reply("INFO memory without used_memory".into()))
}

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

/// The rows: `(limit, fill, notes' estimate)`.
fn rows() -> Vec<(Limit, Fill, Option<u64>)> {
    let mut v: Vec<(Limit, Fill, Option<u64>)> = vec![
        (
            Limit::fixed_window(500, HOUR).unwrap(),
            Fill::Once,
            Some(34),
        ),
        (Limit::sliding_window(500, HOUR).unwrap(), Fill::Once, None),
        (
            Limit::token_bucket(500, 500, HOUR).unwrap(),
            Fill::Once,
            None,
        ),
        (
            Limit::leaky_bucket(500, HOUR, 499, None).unwrap(),
            Fill::Once,
            None,
        ),
        (Limit::sliding_log(500, HOUR).unwrap(), Fill::Once, None),
        (Limit::window_ring(500, HOUR, 60).unwrap(), Fill::Once, None),
        (Limit::concurrency(500, HOUR).unwrap(), Fill::Once, None),
    ];
    // The notes' arithmetic (cli/src/memory.rs): 8 + (4 + 20) x 500 + 20 and
    // 8 + (4 + 2 + 20) x 60 + 20.
    v.push((
        Limit::sliding_log(500, HOUR).unwrap(),
        Fill::Log500,
        Some(12_028),
    ));
    v.push((
        Limit::window_ring(500, HOUR, 60).unwrap(),
        Fill::PerMinute,
        Some(1_588),
    ));
    v
}

/// Fills `users` users per row and measures.
pub async fn measure(url: &str, users: u64) -> Result<Vec<Row>, Error> {
    let mut conn = crate::conn::manager(url, Duration::from_secs(2)).await?;
    let mut out = Vec::new();
    for (l, fill, notes) in rows() {
        let users = match fill {
            Fill::Once => users,
            _ => users.min(FULL_USERS),
        };
        redis::cmd("FLUSHDB").query_async::<()>(&mut conn).await?;
        let limits = Limits::new(vec![l])?;
        let store = RedisStore::builder(limits.clone())
            .timeout(Duration::from_secs(30))
            .build(Conn::Single(conn.clone()))?;
        let mem_users = users.min(IN_MEMORY_USERS);
        let mem = Store::builder(limits)
            .capacity(mem_users.max(1))
            .shards(1)
            .build()
            .map_err(Error::Config)?;
        let before = used_memory(&mut conn).await?;
        let ids: Vec<String> = (0..users).map(|i| format!("user{i}")).collect();
        for (c, chunk) in ids.chunks(500).enumerate() {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let local = if (c as u64) * 500 < mem_users {
                &refs[..]
            } else {
                &refs[..0]
            };
            match fill {
                Fill::Once => {
                    store.try_check_many(&refs, 1).await?;
                    for k in local {
                        mem.check_at(*k, 1, T0);
                    }
                }
                Fill::Log500 => {
                    // 5 every 36 s: 100 distinct times over the hour.
                    for m in 0..100 {
                        let t = T0 + m * 36_000_000_000;
                        store.check_many_at(&refs, 5, t).await?;
                        for k in local {
                            mem.check_at(*k, 5, t);
                        }
                    }
                }
                Fill::PerMinute => {
                    for m in 0..60 {
                        store.check_many_at(&refs, 8, T0 + m * MINUTE).await?;
                        for k in local {
                            mem.check_at(*k, 8, T0 + m * MINUTE);
                        }
                    }
                }
            }
        }
        let after = used_memory(&mut conn).await?;
        let (mut usage, mut encoding) = (0, String::new());
        for k in store.redis_keys("user0") {
            let u: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&k)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await?;
            usage += u.unwrap_or(0);
            let e: Option<String> = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(&k)
                .query_async(&mut conn)
                .await?;
            encoding = e.unwrap_or_default();
        }
        let per = |b: f64| b / users.max(1) as f64;
        out.push(Row {
            name: l.algorithm().name().into(),
            fill: match fill {
                Fill::Once => "one check".into(),
                Fill::Log500 => "500 admissions in 1 h".into(),
                Fill::PerMinute => "8 a minute for 60 minutes".into(),
            },
            users,
            bytes_per_user: per(after.saturating_sub(before) as f64),
            memory_usage: usage,
            encoding,
            in_memory_bytes_per_user: mem.memory_bytes() as f64 / mem_users.max(1) as f64,
            notes_bytes_per_user: notes,
        });
    }
    redis::cmd("FLUSHDB").query_async::<()>(&mut conn).await?;
    Ok(out)
}
