//! `cargo run --release -p turnstile-redis --example calls -- URL ROW N`: N calls of one kind
//! against the Redis at URL, for `redis/callgrind.sh` (which counts the instructions
//! redis-server executes for them). 10 000 keys; 8 tasks sending pipelines of 16 (as
//! `redis-benchmark -c 8 -P 16`), or 128 calls in flight where there is no pipelined call
//! (concurrency, the rules engine). ROW: incr, an algorithm (fixed_window, token_bucket,
//! sliding_window, leaky_bucket, sliding_log, window_ring, concurrency: an acquire and its
//! release, two calls), the four packable ones with `-packed` (capacity 10 000),
//! fixed_window-plain (plain commands, no function), fixed_window-leased (a leased store's
//! checks of keys too rarely checked to lease, 16 in flight: batched calls), rules-1 (one token_bucket rule), rules-3
//! (two rules and a shadow rule on one key).

use std::sync::Arc;
use std::time::Duration;
use turnstile::rules::{Engine, Request, Rules};
use turnstile::{Limit, Limits};
use turnstile_redis::{Conn, Leases, RedisRules, RedisStore};

const KEYS: u64 = 10_000;
const PIPE: u64 = 16;

fn key(i: u64) -> String {
    format!("u{}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS)
}

fn limit(name: &str) -> Option<Limit> {
    let s = Duration::from_secs(1);
    Some(match name {
        "fixed_window" => Limit::fixed_window(1_000_000, s).ok()?,
        "token_bucket" => Limit::token_bucket(1_000_000, 1_000_000, s).ok()?,
        "sliding_window" => Limit::sliding_window(1_000_000, s).ok()?,
        "leaky_bucket" => Limit::leaky_bucket(1_000_000, s, 1000, None).ok()?,
        "sliding_log" => Limit::sliding_log(100_000, s).ok()?,
        "window_ring" => Limit::window_ring(60_000, Duration::from_secs(60), 60).ok()?,
        "concurrency" => Limit::concurrency(60_000, Duration::from_secs(60)).ok()?,
        _ => return None,
    })
}

const RULE: &str = r#"[[rule]]
name = "a"
key = "customer"
limits = [{ algorithm = "token_bucket", limit = 1000000, window = "1s" }]
"#;
const MORE: &str = r#"[[rule]]
name = "b"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 1000000, window = "1s" }]
[[rule]]
name = "c"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "sliding_window", limit = 1000000, window = "1s" }]
"#;

/// Runs `n` of `f(i)` on `tasks` tasks (each call index once).
async fn spread<F, Fut>(tasks: u64, n: u64, f: F)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let f = Arc::new(f);
    let per = n / tasks;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let f = f.clone();
            tokio::spawn(async move {
                for i in 0..per {
                    f(t * per + i).await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("a task");
    }
}

async fn rules(url: &str, n: u64, text: &str) {
    let text = format!("[backend]\nredis = \"{url}\"\ntimeout = \"5s\"\n{text}");
    let rules = Rules::parse(&text, "calls").expect("rules");
    let engine = Arc::new(Engine::new(rules.clone()).expect("engine"));
    let redis = Arc::new(RedisRules::connect(&rules).await.expect("connect"));
    spread(128, n, move |i| {
        let (e, r) = (engine.clone(), redis.clone());
        async move {
            let req = Request::new().customer(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS);
            r.try_explain(&e, &req).await.expect("a decision");
        }
    })
    .await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, row) = match &args[..] {
        [u, r, ..] => (u.clone(), r.clone()),
        _ => {
            eprintln!("usage: calls URL ROW [N]");
            std::process::exit(2);
        }
    };
    let n: u64 = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let conn = Conn::single(&url, Duration::from_secs(2))
        .await
        .expect("connect");
    match row.as_str() {
        "incr" => {
            spread(8, n / PIPE, move |i| {
                let mut c = conn.clone();
                async move {
                    let mut p = redis::pipe();
                    for j in 0..PIPE {
                        p.cmd("INCR").arg(format!("incr:{}", key(i * PIPE + j)));
                    }
                    p.query_async::<Vec<i64>>(&mut c).await.expect("INCR");
                }
            })
            .await
        }
        "rules-1" => rules(&url, n, RULE).await,
        "rules-3" => rules(&url, n, &format!("{RULE}{MORE}")).await,
        _ => {
            let (row, leased) = match row.strip_suffix("-leased") {
                Some(n) => (n.to_string(), true),
                None => (row, false),
            };
            let (name, packed) = match row.strip_suffix("-packed") {
                Some(n) => (n, true),
                None => (row.as_str(), false),
            };
            let (name, plain) = match name.strip_suffix("-plain") {
                Some(n) => (n, true),
                None => (name, false),
            };
            let Some(l) = limit(name) else {
                eprintln!("calls: no row {row}");
                std::process::exit(2);
            };
            let mut b =
                RedisStore::builder(Limits::new(vec![l]).unwrap()).timeout(Duration::from_secs(5));
            if packed {
                b = b.capacity(KEYS);
            }
            // The library is loaded by the first call that finds it missing (the first pass):
            // a `FUNCTION LOAD` here would be counted in the measured pass (~10 M Ir).
            if leased {
                b = b.leases(Leases::auto().sweep_every(None));
            }
            let store = Arc::new(b.plain_commands(plain).build(conn).expect("a store"));
            if leased {
                // Keys checked too rarely to lease: one by one, 16 in flight, which go to
                // Redis together (a leased store's batched calls).
                spread(16, n, move |i| {
                    let s = store.clone();
                    async move {
                        s.try_check(&key(i), 1).await.expect("a call");
                    }
                })
                .await;
                return;
            }
            if matches!(l, Limit::Concurrency(_)) {
                // An acquire and its release: two calls a request.
                spread(128, n / 2, move |i| {
                    let s = store.clone();
                    async move {
                        let p = s.try_acquire_owned(&key(i), 1).await.expect("a call");
                        p.expect("admitted").release().await.expect("a release");
                    }
                })
                .await;
                return;
            }
            spread(8, n / PIPE, move |i| {
                let s = store.clone();
                async move {
                    let keys: Vec<String> = (0..PIPE).map(|j| key(i * PIPE + j)).collect();
                    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    s.try_check_many(&refs, 1).await.expect("a pipeline");
                }
            })
            .await
        }
    }
}
