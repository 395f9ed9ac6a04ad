//! Checks per second against one Redis, beside Redis's own `INCR` from the same client in the
//! same run (the ceiling for one round trip per check), through leases, and through the rules
//! engine with its counts in Redis (`RedisRules`). What `turnstile
//! bench --engine redis` prints (also `cargo run --release -p turnstile-redis --example bench
//! -- URL`).

use crate::lease::{LeaseMode, LeasedStore};
use crate::{Error, RedisStore};
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile::rules::{Engine, Request, Rules};
use turnstile::{Limit, Limits};

/// One measured row.
#[derive(Clone, Debug)]
pub struct Row {
    /// `INCR` or the algorithm's name.
    pub name: String,
    /// Requests in flight at once (over one multiplexed connection).
    pub concurrency: usize,
    /// Completed calls per second.
    pub per_sec: f64,
}

/// Keys the benchmark spreads its checks over.
const KEYS: u64 = 10_000;

fn key(i: u64) -> String {
    // A multiplicative scramble: consecutive calls hit different keys.
    format!("u{}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS)
}

async fn timed<F, Fut>(concurrency: usize, requests: u64, f: F) -> Result<f64, Error>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), Error>> + Send,
{
    let f = Arc::new(f);
    let per = requests / concurrency as u64;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency as u64 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per {
                f(t * per + i).await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| Error::Reply(e.to_string()))??;
    }
    Ok((per * concurrency as u64) as f64 / t0.elapsed().as_secs_f64())
}

/// The limits benchmarked: each one admits far more per key than a run sends it (10 000 keys;
/// a run's calls spread over them), so the figure is the round trip and the script, not
/// denials. concurrency's row is an acquire and its release: two calls per request.
pub fn limits() -> Vec<Limit> {
    let w = Duration::from_secs(1);
    vec![
        Limit::fixed_window(1_000_000, w).unwrap(),
        Limit::token_bucket(1_000_000, 1_000_000, w).unwrap(),
        Limit::sliding_window(1_000_000, w).unwrap(),
        Limit::leaky_bucket(1_000_000, w, 1000, None).unwrap(),
        Limit::sliding_log(100_000, w).unwrap(),
        Limit::window_ring(60_000, Duration::from_secs(60), 60).unwrap(),
        Limit::concurrency(60_000, Duration::from_secs(60)).unwrap(),
    ]
}

/// Rules files of the rules rows (`URL` replaced by the server's): one rule (token_bucket, as
/// its row above), and two enforcing rules and a shadow rule on one key.
const RULES: [(&str, &str); 2] = [
    (
        "rules: 1 rule (token_bucket)",
        r#"[backend]
redis = "URL"
timeout = "2s"
[[rule]]
name = "a"
key = "customer"
limits = [{ algorithm = "token_bucket", limit = 1000000, window = "1s" }]
"#,
    ),
    (
        "rules: 2 rules + 1 shadow",
        r#"[backend]
redis = "URL"
timeout = "2s"
[[rule]]
name = "a"
key = "customer"
limits = [{ algorithm = "token_bucket", limit = 1000000, window = "1s" }]
[[rule]]
name = "b"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 1000000, window = "1s" }]
[[rule]]
name = "c"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "sliding_window", limit = 1000000, window = "1s" }]
"#,
    ),
];

/// `requests` calls at each concurrency: `INCR`, then each algorithm's check.
pub async fn run(url: &str, requests: u64, concurrencies: &[usize]) -> Result<Vec<Row>, Error> {
    let conn = crate::conn::manager(url, Duration::from_secs(2)).await?;
    let mut rows = Vec::new();
    for &c in concurrencies {
        let cn = conn.clone();
        let per_sec = timed(c, requests, move |i| {
            let mut cn = cn.clone();
            async move {
                redis::cmd("INCR")
                    .arg(format!("incr:{}", key(i)))
                    .query_async::<i64>(&mut cn)
                    .await?;
                Ok(())
            }
        })
        .await?;
        rows.push(Row {
            name: "INCR".into(),
            concurrency: c,
            per_sec,
        });
        for l in limits() {
            let store = Arc::new(
                RedisStore::builder(Limits::new(vec![l])?)
                    .timeout(Duration::from_secs(2))
                    .build(crate::Conn::Single(conn.clone()))?,
            );
            let acquire = matches!(l, Limit::Concurrency(_));
            let per_sec = timed(c, requests, move |i| {
                let s = store.clone();
                async move {
                    if acquire {
                        if let Ok(p) = s.try_acquire_owned(&key(i), 1).await? {
                            p.release().await?;
                        }
                    } else {
                        s.try_check(&key(i), 1).await?;
                    }
                    Ok(())
                }
            })
            .await?;
            rows.push(Row {
                name: if acquire {
                    "concurrency (acquire + release)".into()
                } else {
                    l.algorithm().name().into()
                },
                concurrency: c,
                per_sec,
            });
        }
        // The rules engine with its counts in Redis: one call per request.
        for (name, text) in RULES {
            let rules = Rules::parse(&text.replace("URL", url), "bench")
                .map_err(|e| Error::Reply(e.to_string()))?;
            let engine =
                Arc::new(Engine::new(rules.clone()).map_err(|e| Error::Reply(e.to_string()))?);
            let redis = Arc::new(
                crate::RedisRules::connect(&rules)
                    .await
                    .map_err(|e| Error::Reply(e.to_string()))?,
            );
            let per_sec = timed(c, requests, move |i| {
                let (e, r) = (engine.clone(), redis.clone());
                async move {
                    let id = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS;
                    r.try_explain(&e, &Request::new().customer(id)).await?;
                    Ok(())
                }
            })
            .await?;
            rows.push(Row {
                name: (*name).into(),
                concurrency: c,
                per_sec,
            });
        }
        // token_bucket through reservations of 100 (one node), on 64 hot keys.
        let l = limits()[1];
        let store = RedisStore::builder(Limits::new(vec![l])?)
            .timeout(Duration::from_secs(2))
            .build(crate::Conn::Single(conn.clone()))?;
        let leased = Arc::new(LeasedStore::new(store, LeaseMode::Reserve { chunk: 100 })?);
        let per_sec = timed(c, requests, move |i| {
            let s = leased.clone();
            async move {
                // Leases are for hot keys: 64 of them.
                s.check(&format!("hot{}", i % 64), 1).await?;
                Ok(())
            }
        })
        .await?;
        rows.push(Row {
            name: "token_bucket, leases of 100, 64 hot keys".into(),
            concurrency: c,
            per_sec,
        });
    }
    Ok(rows)
}
