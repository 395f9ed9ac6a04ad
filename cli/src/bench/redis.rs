//! `turnstile bench --engine redis --redis-url URL [--json]`: checks per second of every
//! algorithm against one Redis at concurrency 1 and 64, beside Redis's own `INCR` from the same
//! client in the same run (the ceiling for one round trip per check), through the rules engine
//! with its counts in Redis, and through leases (64 hot keys); and each row's calls per second of
//! redis-server CPU (`INFO cpu` before and after the row), the server's cost of a call, which
//! the client's own speed does not move. Figures and how to pin server and client in
//! docs/redis.md.

use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile::rules::{Engine, Request, Rules};
use turnstile::{Limit, Limits};
use turnstile_redis::Leases;
use turnstile_redis::{Conn, Error, RedisRules, RedisStore};

/// Keys the benchmark spreads its checks over.
const KEYS: u64 = 10_000;

fn key(i: u64) -> String {
    // A multiplicative scramble: consecutive calls hit different keys.
    format!("u{}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS)
}

/// One row of the report.
#[derive(Serialize)]
struct Row {
    name: String,
    concurrency: usize,
    calls_per_sec: f64,
    /// calls_per_sec / INCR's at the same concurrency.
    vs_incr: f64,
    /// Calls per second of redis-server CPU (user + system) during the row.
    calls_per_server_cpu_sec: f64,
    /// calls_per_server_cpu_sec / INCR's at the same concurrency.
    server_cpu_vs_incr: f64,
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

/// A row as measured: calls per second of wall time and of server CPU.
struct Measured {
    name: String,
    concurrency: usize,
    per_sec: f64,
    per_cpu_sec: f64,
}

/// The server's CPU seconds so far (`INFO cpu`: used_cpu_user + used_cpu_sys).
async fn server_cpu(conn: &mut Conn) -> Result<f64, Error> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    match (field("used_cpu_user:"), field("used_cpu_sys:")) {
        (Some(u), Some(s)) => Ok(u + s),
        _ => Err(Error::Reply(
            "INFO cpu without used_cpu_user / used_cpu_sys".into(),
        )),
    }
}

/// `requests` calls of `f` spread over `concurrency` tasks: calls per second, and calls per
/// second of server CPU.
async fn timed<F, Fut>(
    conn: &mut Conn,
    concurrency: usize,
    requests: u64,
    f: F,
) -> Result<(f64, f64), Error>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Error>> + Send,
{
    let f = Arc::new(f);
    let per = requests / concurrency as u64;
    let cpu0 = server_cpu(conn).await?;
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
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (server_cpu(conn).await? - cpu0).max(1e-6);
    let calls = (per * concurrency as u64) as f64;
    Ok((calls / secs, calls / cpu))
}

/// The limits benchmarked: each one admits far more per key than a run sends it (10 000 keys;
/// a run's calls spread over them), so the figure is the round trip and the call, not
/// denials. Concurrency's row is an acquire and its release: two calls per request.
fn limits() -> Vec<Limit> {
    let w = Duration::from_secs(1);
    vec![
        Limit::fixed_window(1_000_000, w).unwrap(),
        Limit::token_bucket(1_000_000, 1_000_000, w).unwrap(),
        Limit::sliding_window(1_000_000, w).unwrap(),
        Limit::leaky_bucket(1_000_000, w, 1000, None).unwrap(),
        Limit::sliding_log(4096, w).unwrap(),
        Limit::window_ring(60_000, Duration::from_secs(60), 60).unwrap(),
        Limit::concurrency(256, Duration::from_secs(60)).unwrap(),
    ]
}

/// The rules file of the first rules row (`URL` replaced by the server's): one rule
/// (token_bucket, as its row above). A macro, so that the second row's file can extend it.
macro_rules! one_rule {
    () => {
        r#"[backend]
redis = "URL"
timeout = "2s"
[[rule]]
name = "a"
key = "customer"
limits = [{ algorithm = "token_bucket", limit = 1000000, window = "1s" }]
"#
    };
}

/// Rules files of the rules rows (`URL` replaced by the server's): one rule (token_bucket, as
/// its row above), and that rule with another enforcing rule and a shadow rule on one key.
const RULES: [(&str, &str); 2] = [
    ("rules: 1 rule (token_bucket)", one_rule!()),
    (
        "rules: 2 rules + 1 shadow",
        concat!(
            one_rule!(),
            r#"[[rule]]
name = "b"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 1000000, window = "1s" }]
[[rule]]
name = "c"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "sliding_window", limit = 1000000, window = "1s" }]
"#
        ),
    ),
];

/// The rows of one limit: its checks (key per record; packed too for the one-record
/// algorithms), or an acquire and a release for concurrency.
async fn store_rows(
    conn: &mut Conn,
    c: usize,
    requests: u64,
    l: Limit,
) -> Result<Vec<Measured>, Error> {
    let acquire = matches!(l, Limit::Concurrency(_));
    let packable = matches!(
        l,
        Limit::FixedWindow(_)
            | Limit::SlidingWindow(_)
            | Limit::TokenBucket(_)
            | Limit::LeakyBucket(_)
    );
    let mut rows = Vec::new();
    for packed in [false, true] {
        if packed && !packable {
            break;
        }
        let mut b = RedisStore::builder(Limits::new(vec![l])?).timeout(Duration::from_secs(2));
        if packed {
            b = b.capacity(KEYS);
        }
        let store = Arc::new(b.build(conn.clone())?);
        store.load().await?;
        let (per_sec, per_cpu_sec) = timed(conn, c, requests, move |i| {
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
        let name = match (acquire, packed) {
            (true, _) => "concurrency (acquire + release)".to_string(),
            (false, true) => format!("{} (packed)", l.algorithm().name()),
            (false, false) => l.algorithm().name().to_string(),
        };
        rows.push(Measured {
            name,
            concurrency: c,
            per_sec,
            per_cpu_sec,
        });
    }
    Ok(rows)
}

/// The rules engine with its counts in Redis: one call per request.
async fn rules_row(
    conn: &mut Conn,
    url: &str,
    c: usize,
    requests: u64,
    name: &str,
    text: &str,
) -> Result<Measured, Error> {
    let rules = Rules::parse(&text.replace("URL", url), "bench")
        .map_err(|e| Error::Reply(e.to_string()))?;
    let engine = Arc::new(Engine::new(rules.clone()).map_err(|e| Error::Reply(e.to_string()))?);
    let redis = Arc::new(
        RedisRules::connect(&rules)
            .await
            .map_err(|e| Error::Reply(e.to_string()))?,
    );
    let (per_sec, per_cpu_sec) = timed(conn, c, requests, move |i| {
        let (e, r) = (engine.clone(), redis.clone());
        async move {
            let id = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS;
            r.try_explain(&e, &Request::new().customer(id)).await?;
            Ok(())
        }
    })
    .await?;
    Ok(Measured {
        name: name.into(),
        concurrency: c,
        per_sec,
        per_cpu_sec,
    })
}

/// `requests` calls at each concurrency: `INCR`, each algorithm's check, the rules engine,
/// and fixed_window through leases on 64 hot keys.
async fn measure(
    url: &str,
    requests: u64,
    concurrencies: &[usize],
) -> Result<Vec<Measured>, Error> {
    let mut conn = Conn::single(url, Duration::from_secs(2)).await?;
    let mut rows = Vec::new();
    for &c in concurrencies {
        let cn = conn.clone();
        let (per_sec, per_cpu_sec) = timed(&mut conn, c, requests, move |i| {
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
        rows.push(Measured {
            name: "INCR".into(),
            concurrency: c,
            per_sec,
            per_cpu_sec,
        });
        for l in limits() {
            rows.extend(store_rows(&mut conn, c, requests, l).await?);
        }
        for (name, text) in RULES {
            rows.push(rules_row(&mut conn, url, c, requests, name, text).await?);
        }
        let leased = RedisStore::builder(Limits::new(vec![limits()[0]])?)
            .timeout(Duration::from_secs(2))
            .leases(Leases::auto())
            .build(conn.clone())?;
        let leased = Arc::new(leased);
        let (per_sec, per_cpu_sec) = timed(&mut conn, c, requests, move |i| {
            let s = leased.clone();
            // Leases are for hot keys: 64 of them.
            async move { s.try_check(&format!("hot{}", i % 64), 1).await.map(|_| ()) }
        })
        .await?;
        rows.push(Measured {
            name: "fixed_window, leases (auto), 64 hot keys".into(),
            concurrency: c,
            per_sec,
            per_cpu_sec,
        });
    }
    Ok(rows)
}

/// Runs the Redis rows: `requests` calls per row.
pub fn run(url: &str, requests: u64, json: bool) -> crate::Result<()> {
    if requests < 64 {
        return Err(format!(
            "option --redis-requests: {requests}; give at least 64 (one per client at concurrency 64)"
        ).into());
    }
    let load = super::text::load_average();
    if !json {
        super::text::load_warning();
        super::text::progress(format!(
            "redis at {url}: {requests} calls per row, concurrency 1 and 64"
        ));
    }
    let rt = super::redis_runtime()?;
    let rows = rt
        .block_on(measure(url, requests, &[1, 64]))
        .map_err(|e| super::redis_error(url, e))?;
    let mut out = Vec::new();
    let (mut incr, mut incr_cpu) = (f64::NAN, f64::NAN);
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    for r in rows {
        if r.name == "INCR" {
            (incr, incr_cpu) = (r.per_sec, r.per_cpu_sec);
        }
        out.push(Row {
            vs_incr: r3(r.per_sec / incr),
            server_cpu_vs_incr: r3(r.per_cpu_sec / incr_cpu),
            calls_per_sec: r.per_sec.round(),
            calls_per_server_cpu_sec: r.per_cpu_sec.round(),
            concurrency: r.concurrency,
            name: r.name,
        });
    }
    super::text::progress_done();
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
        "{:<45} {:>11} {:>12} {:>9} {:>14} {:>9}",
        "engine", "concurrency", "calls/s", "vs INCR", "calls/CPU-s", "vs INCR"
    );
    for r in &out {
        println!(
            "{:<45} {:>11} {:>12.0} {:>8.0}% {:>14.0} {:>8.0}%",
            r.name,
            r.concurrency,
            r.calls_per_sec,
            r.vs_incr * 100.0,
            r.calls_per_server_cpu_sec,
            r.server_cpu_vs_incr * 100.0
        );
    }
    println!();
    println!("calls/CPU-s: calls per second of redis-server CPU (INFO cpu), the server's cost.");
    Ok(())
}
