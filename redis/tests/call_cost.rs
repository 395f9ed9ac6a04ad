//! Every call within `MAX_CALL_US` of Redis time at the largest limits a store accepts
//! (`turnstile_redis::max_limit`). For each algorithm whose record grows with its limit or
//! shape — sliding_log (an entry per admission), concurrency (a member per cell), window_ring
//! (a counter per sub-window) — its worst calls at the largest accepted limit are timed by
//! Redis itself (`SLOWLOG`: every call logged with its duration in µs), five times each on
//! keys of their own; the median of each kind must be within the budget (a median: the
//! durations are wall time inside Redis, and a 2-core machine shared with other work
//! preempts it now and then).

mod common;

use std::sync::Arc;
use std::time::Duration;
use turnstile::algo::window_ring;
use turnstile::{Algorithm, Limit, LimitSpec, Limits};
use turnstile_redis::{max_limit, RedisStore, MAX_CALL_US};

const S: u64 = 1_000_000_000;
const REPEAT: u64 = 5;

/// The slowest `FCALL` Redis logged since the last reset, in µs.
fn slowest(server: &common::Server) -> u64 {
    let out = server.cli(&["slowlog", "get", "100000"]);
    // redis-cli prints each entry's fields one per line: id, time, duration (µs), command...
    let lines: Vec<&str> = out.lines().collect();
    let mut max = 0;
    for i in 0..lines.len().saturating_sub(3) {
        let call = lines[i + 3].eq_ignore_ascii_case("fcall");
        if let (true, Ok(_), Ok(d)) = (call, lines[i + 1].parse::<u64>(), lines[i + 2].parse()) {
            max = max.max(d);
        }
    }
    max
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// A run of calls.
type Job = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

struct Bench {
    server: common::Server,
    rt: tokio::runtime::Runtime,
    report: Vec<(String, u64)>,
}

impl Bench {
    fn store(&self, limit: Limit) -> Arc<RedisStore> {
        let url = self.server.url();
        let b = RedisStore::builder(Limits::new(vec![limit]).unwrap())
            .timeout(Duration::from_secs(10))
            .connect(&url);
        Arc::new(self.rt.block_on(b).unwrap())
    }

    /// Runs `setup` then `worst` for keys 0..REPEAT, and keeps the median of the slowest call
    /// `worst` made each time.
    fn kind<F, G>(&mut self, what: &str, setup: F, worst: G)
    where
        F: Fn(u64) -> Job,
        G: Fn(u64) -> Job,
    {
        let mut took = Vec::new();
        for k in 0..REPEAT {
            self.rt.block_on(setup(k));
            self.server.cli(&["slowlog", "reset"]);
            self.rt.block_on(worst(k));
            took.push(slowest(&self.server));
        }
        self.report.push((what.to_string(), median(took)));
    }
}

#[test]
fn the_worst_calls_at_the_largest_accepted_limits_are_within_the_budget() {
    let server = common::Server::start();
    server.cli(&["config", "set", "slowlog-log-slower-than", "0"]);
    server.cli(&["config", "set", "slowlog-max-len", "100000"]);
    let mut b = Bench {
        server,
        rt: common::runtime(),
        report: Vec::new(),
    };
    let t0 = 1_000 * S;

    let max = max_limit(Algorithm::SlidingLog);
    let s = b.store(Limit::sliding_log(max, Duration::from_secs(10)).unwrap());
    b.kind(
        &format!("sliding_log {max}: a check of all of it"),
        |_| Box::pin(async {}),
        |k| {
            Box::pin({
                let s = s.clone();
                async move {
                    s.check_at(&format!("whole{k}"), max, t0).await.unwrap();
                }
            })
        },
    );
    b.kind(
        &format!("sliding_log {max}: a check of a full log"),
        |k| {
            Box::pin({
                let s = s.clone();
                async move {
                    for i in 0..max {
                        s.check_at(&format!("log{k}"), 1, t0 + i * 1000)
                            .await
                            .unwrap();
                    }
                }
            })
        },
        |k| {
            Box::pin({
                let s = s.clone();
                async move {
                    for i in 0..20 {
                        s.check_at(&format!("log{k}"), 1, t0 + 10 * S + i * 1000)
                            .await
                            .unwrap();
                    }
                }
            })
        },
    );

    let max = max_limit(Algorithm::Concurrency);
    let s = b.store(Limit::concurrency(max, Duration::from_secs(60)).unwrap());
    b.kind(
        &format!("concurrency {max}: an acquire of every cell and its release"),
        |_| Box::pin(async {}),
        |k| {
            Box::pin({
                let s = s.clone();
                async move {
                    let p = s
                        .acquire_owned_at(&format!("all{k}"), max, t0)
                        .await
                        .unwrap();
                    p.unwrap().release_at(t0 + 1000).await.unwrap();
                }
            })
        },
    );
    b.kind(
        &format!("concurrency {max}: a rebase of a full set"),
        |k| {
            Box::pin({
                let s = s.clone();
                async move {
                    for i in 0..max {
                        let p = s
                            .acquire_owned_at(&format!("full{k}"), 1, t0 + i)
                            .await
                            .unwrap();
                        // Held until its lease ends: not released by a drop.
                        std::mem::forget(p);
                    }
                }
            })
        },
        |k| {
            Box::pin({
                let s = s.clone();
                async move {
                    // Past 2^51 ns after the base: the base moves, every cell rescored.
                    let p = s
                        .acquire_owned_at(&format!("full{k}"), 1, t0 + (1 << 51) + 1)
                        .await;
                    std::mem::forget(p);
                }
            })
        },
    );

    let n = window_ring::MAX_BUCKETS;
    let l = LimitSpec {
        buckets: Some(n),
        ..LimitSpec::new(
            Algorithm::WindowRing,
            max_limit(Algorithm::WindowRing),
            Duration::from_nanos(n * 1_000_000),
        )
    }
    .build()
    .unwrap();
    let s = b.store(l);
    b.kind(
        &format!("window_ring of {n} sub-windows: a check after the ring's span"),
        |k| {
            Box::pin({
                let s = s.clone();
                async move {
                    for i in 0..n {
                        s.check_at(&format!("ring{k}"), 60, t0 + i * 1_000_000)
                            .await
                            .unwrap();
                    }
                }
            })
        },
        |k| {
            Box::pin({
                let s = s.clone();
                async move {
                    s.check_at(&format!("ring{k}"), 1, t0 + 10 * n * 1_000_000)
                        .await
                        .unwrap();
                }
            })
        },
    );

    for (what, us) in &b.report {
        eprintln!("{what}: {us} us of Redis time (median of {REPEAT}; budget {MAX_CALL_US} us)");
    }
    for (what, us) in &b.report {
        assert!(*us <= MAX_CALL_US, "{what}: {us} us of Redis time");
    }
}
