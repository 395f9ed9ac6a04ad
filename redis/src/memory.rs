//! Memory in Redis, measured: N users per algorithm, each checked once, then `INFO memory`'s
//! `used_memory` growth and `MEMORY USAGE` of one user's keys. What `turnstile memory
//! --backend redis` will call; until then `cargo run --release -p turnstile-redis --example
//! memory -- URL N`. The server is flushed (`FLUSHDB`) before each algorithm: use a scratch one.

use crate::{Conn, Error, RedisStore};
use redis::aio::ConnectionManager;
use std::time::Duration;
use turnstile::{Limit, Limits};

/// One algorithm's row.
#[derive(Clone, Debug)]
pub struct Row {
    /// The algorithm.
    pub name: String,
    /// Users filled.
    pub users: u64,
    /// `used_memory` growth per user, bytes.
    pub bytes_per_user: f64,
    /// `MEMORY USAGE` of one user's keys, bytes.
    pub memory_usage: u64,
}

async fn used_memory(conn: &mut ConnectionManager) -> Result<u64, Error> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Error::Reply("INFO memory without used_memory".into()))
}

/// The notes' example: 500 per hour (window_ring's 60 minutes is not on Redis yet).
pub fn limits() -> Vec<Limit> {
    let h = Duration::from_secs(3600);
    vec![
        Limit::fixed_window(500, h).unwrap(),
        Limit::sliding_window(500, h).unwrap(),
        Limit::token_bucket(500, 500, h).unwrap(),
        Limit::leaky_bucket(500, h, 499, None).unwrap(),
    ]
}

/// Fills `users` users per algorithm and measures.
pub async fn measure(url: &str, users: u64) -> Result<Vec<Row>, Error> {
    let mut conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    let mut rows = Vec::new();
    for l in limits() {
        redis::cmd("FLUSHDB").query_async::<()>(&mut conn).await?;
        let store = RedisStore::builder(Limits::new(vec![l])?)
            .timeout(Duration::from_secs(10))
            .build(Conn::Single(conn.clone()))?;
        let before = used_memory(&mut conn).await?;
        let ids: Vec<String> = (0..users).map(|i| format!("user{i}")).collect();
        for chunk in ids.chunks(1000) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            store.try_check_many(&refs, 1).await?;
        }
        let after = used_memory(&mut conn).await?;
        let mut usage = 0;
        for k in store.redis_keys("user0") {
            let u: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&k)
                .query_async(&mut conn)
                .await?;
            usage += u.unwrap_or(0);
        }
        rows.push(Row {
            name: l.algorithm().name().into(),
            users,
            bytes_per_user: after.saturating_sub(before) as f64 / users.max(1) as f64,
            memory_usage: usage,
        });
    }
    redis::cmd("FLUSHDB").query_async::<()>(&mut conn).await?;
    Ok(rows)
}
