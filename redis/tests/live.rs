//! RedisStore against a real redis-server at the server's own time: the notes' race, the
//! library lost (FUNCTION FLUSH, restart), TTLs that leave nothing behind, pipelined
//! checks, and the failure policy (a paused, a sleeping, a killed server).

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile::{Limit, Limits, Outcome};
use turnstile_redis::{FailurePolicy, RedisStore};

fn limits(l: Limit) -> Limits {
    Limits::new(vec![l]).unwrap()
}

fn bucket(cap: u64) -> Limits {
    // A bucket that refills one token an hour: a test sees exactly `cap` admissions.
    limits(Limit::token_bucket(cap, 1, Duration::from_secs(3600)).unwrap())
}

/// The notes' read-then-write race: 16 clients (own connections) on one key admit exactly the
/// limit, on each algorithm that is exact at a test's time scale (token and leaky bucket,
/// sliding log, window ring within its window, concurrency), and all-or-nothing over two
/// limits.
#[test]
fn concurrent_clients_never_exceed_the_limit() {
    let server = common::Server::start();
    let rt = common::runtime();
    let cases = [
        bucket(100),
        limits(Limit::leaky_bucket(1, Duration::from_secs(3600), 99, None).unwrap()),
        Limits::new(vec![
            Limit::token_bucket(100, 1, Duration::from_secs(3600)).unwrap(),
            Limit::token_bucket(150, 1, Duration::from_secs(3600)).unwrap(),
        ])
        .unwrap(),
        limits(Limit::sliding_log(100, Duration::from_secs(3600)).unwrap()),
        limits(Limit::window_ring(100, Duration::from_secs(3600), 60).unwrap()),
        // A plain check takes a lease that only its expiry frees: 100 in flight.
        limits(Limit::concurrency(100, Duration::from_secs(3600)).unwrap()),
        Limits::new(vec![
            Limit::sliding_log(150, Duration::from_secs(3600)).unwrap(),
            Limit::window_ring(100, Duration::from_secs(3600), 60).unwrap(),
        ])
        .unwrap(),
    ];
    for (i, ls) in cases.into_iter().enumerate() {
        let admitted = rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..16 {
                let store = RedisStore::builder(ls.clone())
                    .timeout(Duration::from_secs(5))
                    .connect(&server.url())
                    .await
                    .unwrap();
                tasks.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    for _ in 0..40 {
                        n += store.try_check("race", 1).await.unwrap().allowed() as u64;
                    }
                    n
                }));
            }
            let mut total = 0;
            for t in tasks {
                total += t.await.unwrap();
            }
            total
        });
        assert_eq!(admitted, 100, "case {i}: 640 attempts on a limit of 100");
        server.cli(&["flushall"]);
    }
}

#[test]
fn a_lost_library_is_reloaded() {
    let mut server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let store = RedisStore::builder(bucket(10))
            .timeout(Duration::from_secs(5))
            .connect(&server.url())
            .await
            .unwrap();
        assert!(store.try_check("k", 1).await.unwrap().allowed());
        let lib = store.library_name().to_string();
        let listed = |server: &common::Server| {
            server
                .cli(&["function", "list", "libraryname", &lib])
                .contains(&lib)
        };
        assert!(listed(&server));
        server.cli(&["function", "flush"]);
        assert!(!listed(&server));
        let d = store.try_check("k", 1).await.unwrap();
        assert_eq!(d.remaining, 8, "the state survived, the library came back");
        assert!(listed(&server));
        server.cli(&["function", "flush"]);
        let many = store.try_check_many(&["k", "a", "b"], 1).await.unwrap();
        let rem: Vec<u64> = many.iter().map(|d| d.remaining).collect();
        assert_eq!(rem, vec![7, 9, 9], "pipelined after a flush");
        // A restart: empty data, no library, same port; the connection comes back.
        server.restart();
        let t0 = Instant::now();
        let d = loop {
            match store.try_check("k", 1).await {
                Ok(d) => break d,
                Err(e) => {
                    assert!(t0.elapsed() < Duration::from_secs(10), "no reconnect: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        assert_eq!(d.remaining, 9, "a fresh server, the library reloaded");
    });
}

#[test]
fn keys_expire_when_idle_and_nothing_leaks() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let ms = Duration::from_millis;
        let ls = Limits::new(vec![
            Limit::fixed_window(5, ms(50)).unwrap(),
            Limit::sliding_window(5, ms(50)).unwrap(),
            Limit::token_bucket(5, 5, ms(50)).unwrap(),
            Limit::sliding_log(5, ms(50)).unwrap(),
            Limit::window_ring(5, ms(50), 5).unwrap(),
        ])
        .unwrap();
        let store = RedisStore::builder(ls)
            .timeout(Duration::from_secs(5))
            .connect(&server.url())
            .await
            .unwrap();
        let leases = Arc::new(
            RedisStore::builder(limits(Limit::concurrency(5, ms(50)).unwrap()))
                .timeout(Duration::from_secs(5))
                .connect(&server.url())
                .await
                .unwrap(),
        );
        let keys: Vec<String> = (0..50).map(|i| format!("user{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        for _ in 0..3 {
            store.try_check_many(&refs, 1).await.unwrap();
        }
        let mut permits = Vec::new();
        for k in &refs[..10] {
            // Held, never released: only the lease's expiry frees them.
            permits.push(leases.try_acquire_owned(k, 1).await.unwrap().unwrap());
        }
        // Fixed windows may already have ended; each key lives at most two windows.
        let n: u64 = server.cli(&["dbsize"]).parse().unwrap();
        assert!((1..=260).contains(&n), "{n} keys");
        for k in store
            .redis_keys("user49")
            .into_iter()
            .chain(leases.redis_keys("user9"))
        {
            let ttl: i64 = server.cli(&["pttl", &k]).parse().unwrap();
            // 0: under a millisecond left (PTTL rounds down).
            assert!(ttl == -2 || (0..=100).contains(&ttl), "{k}: ttl {ttl} ms");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        // SCAN expires the keys it meets (DBSIZE counts expired keys that Redis's sampling
        // has not reclaimed yet).
        assert_eq!(server.cli(&["--scan"]), "", "every key expired once idle");
        assert_eq!(server.cli(&["dbsize"]), "0");
        // The leases expired: releasing them now frees nothing, and adds no key.
        for p in permits {
            assert_eq!(p.release().await.unwrap(), 0);
        }
        assert_eq!(server.cli(&["dbsize"]), "0");
    });
}

/// A store of one fixed_window or token_bucket limit is answered by the script's fast path;
/// at the server's time, a write to an open window keeps the TTL its first write set
/// (`SET ... KEEPTTL`). Every key must still expire when its window ends (when the bucket is
/// full again), to the millisecond: its PTTL is read with the server's clock and its value in
/// one atomic call, and the expiry they give is compared with the window's end (the TAT):
/// from 1 ms before (PTTL rounds down) to 2 ms after (the server's ms clock may have moved on
/// between the script's TIME and its SET).
#[test]
fn single_limit_keys_expire_when_their_window_ends() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        // The key's absolute expiry in ms (the server's clock + PTTL) and its value.
        let expiry = redis::Script::new(
            "local p = redis.call('PTTL', KEYS[1]) local t = redis.call('TIME') \
             return {p, t[1] * 1000 + math.floor(t[2] / 1000), redis.call('GET', KEYS[1])}",
        );
        async fn read(
            s: &redis::Script,
            conn: &mut redis::aio::MultiplexedConnection,
            k: &str,
        ) -> Option<(i64, i64, String)> {
            let (pttl, now_ms, v): (i64, i64, Option<String>) =
                s.key(k).invoke_async(conn).await.unwrap();
            // -2: the key expired between the check and this read (a loaded machine can take
            // longer than what was left of the window); -1 would be a key without expiry.
            if pttl == -2 {
                return None;
            }
            assert!(pttl >= 0, "{k}: PTTL {pttl}: no expiry");
            Some((now_ms + pttl, now_ms, v.expect("a key with a TTL has a value")))
        }
        // 250 ms divides a second: the fast path's window (300 ms would take the generic one).
        let fixed = RedisStore::builder(limits(
            Limit::fixed_window(1000, Duration::from_millis(250)).unwrap(),
        ))
        .timeout(Duration::from_secs(5))
        .connect(&server.url())
        .await
        .unwrap();
        // 10 tokens, one per 30 ms.
        let tb = RedisStore::builder(limits(
            Limit::token_bucket(10, 10, Duration::from_millis(300)).unwrap(),
        ))
        .timeout(Duration::from_secs(5))
        .connect(&server.url())
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        let (mut checks, mut gone) = (0, 0);
        while Instant::now() < deadline {
            checks += 1;
            let d = fixed.try_check("k", 1).await.unwrap();
            assert_eq!(d.outcome, Outcome::Allowed);
            let Some((at, now_ms, v)) = read(&expiry, &mut conn, &fixed.redis_keys("k")[0]).await
            else {
                gone += 1;
                continue;
            };
            // The value is "<window start ns> <count>": the window ends 250 ms after it.
            let start: i64 = v.split(' ').next().unwrap().parse().unwrap();
            let end_ms = start / 1_000_000 + 250;
            assert!(
                (end_ms - 1..=end_ms + 2).contains(&at) && end_ms >= now_ms,
                "fixed_window after {checks} checks: expires at {at} ms, its window ends at {end_ms} (now {now_ms})"
            );
            if tb.try_check("k", 1).await.unwrap().outcome == Outcome::Allowed {
                // The value is the TAT in ns: the bucket is full then.
                let Some((at, now_ms, v)) = read(&expiry, &mut conn, &tb.redis_keys("k")[0]).await
                else {
                    gone += 1;
                    continue;
                };
                let tat_ms = (v.parse::<i64>().unwrap() + 999_999) / 1_000_000;
                assert!(
                    (tat_ms - 1..=tat_ms + 2).contains(&at),
                    "token_bucket: expires at {at} ms, full at {tat_ms} (now {now_ms})"
                );
            }
            tokio::time::sleep(Duration::from_millis(7)).await;
        }
        assert!(checks > 20, "{checks} checks in 2 s");
        assert!(gone * 4 <= checks, "{gone} of {checks} keys gone before they were read");
    });
}

/// Runs `redis-cli` in the background (a command that blocks the server).
fn background(port: u16, args: &[&str]) -> std::process::Child {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_slow_server_is_answered_by_the_policy_within_the_timeout() {
    let server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        for (policy, outcome) in [
            (FailurePolicy::Closed, Outcome::StoreFull),
            (FailurePolicy::Open, Outcome::Untracked),
        ] {
            let store = RedisStore::builder(bucket(10))
                .policy(policy)
                .connect(&server.url())
                .await
                .unwrap();
            assert_eq!(store.check("k", 1).await.outcome, Outcome::Allowed);
            for block in [
                &["debug", "sleep", "0.4"][..],
                &["client", "pause", "400", "all"],
            ] {
                let mut c = background(server.port, block);
                tokio::time::sleep(Duration::from_millis(100)).await;
                let t0 = Instant::now();
                let d = store.check("k", 1).await;
                let took = t0.elapsed();
                assert_eq!(d.outcome, outcome, "{block:?}");
                // 20 ms and a margin for a machine loaded by other builds: the timer fires at
                // 20 ms, the rest is scheduling (figures in docs/redis.md).
                eprintln!("{policy:?} {block:?}: answered in {took:?}");
                assert!(took < Duration::from_millis(20 + 50), "{block:?}: {took:?}");
                c.wait().unwrap();
                tokio::time::sleep(Duration::from_millis(350)).await;
            }
            let s = store.stats();
            assert_eq!((s.timeouts, s.fallbacks), (2, 2), "{s:?}");
        }
    });
}

#[test]
fn a_dead_server_opens_the_circuit_and_a_restart_closes_it() {
    let mut server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let store = Arc::new(
            RedisStore::builder(bucket(100))
                .policy(FailurePolicy::Insurance { expected_nodes: 4 })
                .breaker(3, Duration::from_millis(200))
                .connect(&server.url())
                .await
                .unwrap(),
        );
        assert_eq!(store.check("k", 1).await.outcome, Outcome::Allowed);
        server.kill();
        // The insurance limiter: 100 / 4 nodes = 25 admitted while Redis is away.
        let mut admitted = 0;
        for _ in 0..60 {
            let t0 = Instant::now();
            admitted += store.check("k", 1).await.allowed() as u64;
            assert!(
                t0.elapsed() < Duration::from_millis(200),
                "{:?}",
                t0.elapsed()
            );
        }
        assert_eq!(admitted, 25);
        assert!(store.circuit_open());
        let s = store.stats();
        assert_eq!(s.fallbacks, 60, "{s:?}");
        assert_eq!(s.opened, 1, "{s:?}");
        assert!(
            s.short_circuited >= 50,
            "the dead server was left alone: {s:?}"
        );
        assert_eq!(s.errors + s.timeouts + s.short_circuited, 60, "{s:?}");
        server.restart();
        let t0 = Instant::now();
        loop {
            let d = store.check("k", 1).await;
            if d.outcome == Outcome::Allowed && !store.circuit_open() {
                assert_eq!(d.remaining, 99, "Redis again, fresh after the restart");
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "circuit never closed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[test]
fn known_over_limit_keys_are_denied_locally_until_their_retry() {
    let mut server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let store = RedisStore::builder(bucket(2))
            .deny_cache(true)
            .connect(&server.url())
            .await
            .unwrap();
        assert!(store.check("k", 1).await.allowed());
        assert!(store.check("k", 1).await.allowed());
        assert_eq!(store.check("k", 1).await.outcome, Outcome::Limited);
        server.kill();
        let d = store.check("k", 1).await;
        assert_eq!(d.outcome, Outcome::Limited, "answered from the cache");
        assert!(d.retry_after_ns.unwrap() > 3_000_000_000_000);
        let s = store.stats();
        assert_eq!((s.cached_denials, s.fallbacks), (1, 0), "{s:?}");
        // Another key is not covered: it goes to Redis (down: the policy answers, closed).
        assert_eq!(store.check("other", 1).await.outcome, Outcome::StoreFull);
    });
}

/// Concurrency permits at the server's time: a release frees its own lease at once, a dropped
/// permit is released in the background, and while Redis is away the insurance store's
/// permits (limit ÷ nodes) are taken and given back with the permit.
#[test]
fn permits_are_released_by_release_drop_or_expiry() {
    let mut server = common::Server::start();
    let rt = common::runtime();
    rt.block_on(async {
        let store = Arc::new(
            RedisStore::builder(limits(
                Limit::concurrency(4, Duration::from_secs(3600)).unwrap(),
            ))
            .timeout(Duration::from_secs(5))
            .policy(FailurePolicy::Insurance { expected_nodes: 2 })
            .breaker(1, Duration::from_secs(3600))
            .connect(&server.url())
            .await
            .unwrap(),
        );
        let a = store.acquire_owned("k", 1).await.unwrap();
        let b = store.acquire_owned("k", 3).await.unwrap();
        assert_eq!(b.decision().remaining, 0);
        assert_ne!(a.stamp(), b.stamp(), "each permit its own stamp");
        let d = store.acquire_owned("k", 1).await.unwrap_err();
        assert_eq!(d.outcome, Outcome::Limited);
        assert!(d.retry_after_ns.unwrap() > 3_000_000_000_000);
        assert_eq!(b.release().await.unwrap(), 3, "three cells freed");
        assert_eq!(store.peek("k").await.unwrap().remaining, 3);
        drop(a);
        let t0 = Instant::now();
        while store.peek("k").await.unwrap().remaining != 4 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "drop never released"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(server.cli(&["dbsize"]), "0", "no lease left, no key left");
        // Redis away: the insurance store, 4 / 2 nodes = 2 in flight.
        server.kill();
        let x = store.acquire_owned("k", 1).await.unwrap();
        let y = store.acquire_owned("k", 1).await.unwrap();
        assert_eq!(x.stamp(), None, "a local permit holds nothing in Redis");
        assert!(store.acquire_owned("k", 1).await.is_err());
        drop(y);
        assert!(
            store.acquire_owned("k", 1).await.is_ok(),
            "given back on drop"
        );
        drop(x);
        let s = store.stats();
        assert_eq!(s.fallbacks, 4, "{s:?}");
    });
}

/// The race on plain commands (`plain_commands`, a fixed_window or sliding_window limit): 16
/// clients on one key never admit more than the limit, and every refused cost is given back
/// (the count left is the admissions); with `count_denied`, every attempt that could fit is
/// counted.
#[test]
fn plain_commands_never_exceed_the_limit_in_a_race() {
    let server = common::Server::start();
    let rt = common::runtime();
    let algs = [
        turnstile::Algorithm::FixedWindow,
        turnstile::Algorithm::SlidingWindow,
    ];
    for (alg, cd) in algs.into_iter().flat_map(|a| [(a, false), (a, true)]) {
        let ls = Limits::new(vec![turnstile::LimitSpec {
            count_denied: cd,
            ..turnstile::LimitSpec::new(alg, 100, Duration::from_secs(3600))
        }
        .build()
        .unwrap()])
        .unwrap();
        // One explicit time: every call in one window, whatever the clock does meanwhile.
        let now = 1_763_900_000_000_000_000 + u64::from(cd);
        let (admitted, peek) = rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..16 {
                let store = RedisStore::builder(ls.clone())
                    .timeout(Duration::from_secs(5))
                    .plain_commands(true)
                    .connect(&server.url())
                    .await
                    .unwrap();
                tasks.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    for _ in 0..40 {
                        n += store.check_at("race", 1, now).await.unwrap().allowed() as u64;
                    }
                    n
                }));
            }
            let mut total = 0;
            for t in tasks {
                total += t.await.unwrap();
            }
            let store = RedisStore::builder(ls.clone())
                .plain_commands(true)
                .connect(&server.url())
                .await
                .unwrap();
            (total, store.peek_at("race", now).await.unwrap())
        });
        assert!(
            (1..=100).contains(&admitted),
            "{alg:?} count_denied {cd}: {admitted} admitted of 640 attempts on a limit of 100"
        );
        // The count left: the admissions (denials given back), or every attempt (counted).
        let count = if cd { 640 } else { admitted };
        assert_eq!(
            peek.remaining,
            100u64.saturating_sub(count),
            "count_denied {cd}"
        );
        let keys = server.cli(&["keys", "*race*"]);
        let ttl = server.cli(&["pttl", keys.trim()]);
        assert!(ttl.trim().parse::<i64>().unwrap() > 0, "{keys}: pttl {ttl}");
        server.cli(&["flushall"]);
    }
}
