//! The rules engine's overhead: rule lookup + check against a bare keyed-store check of the same
//! limit, the same keys and the same `now`. Goal: engine ≤ 2× the bare check.
//!
//! ```text
//! cargo bench --bench rules                  # everything, ~1 min
//! cargo bench --bench rules -- --test        # smoke run: each bench once
//!
//! # instructions per check, stable on a noisy machine (valgrind's callgrind):
//! TURNSTILE_RULES_CALLGRIND=store_check valgrind --tool=callgrind \
//!     --toggle-collect='rules::timed*' target/release/deps/rules-<hash>
//!
//! # minimum (and median) ns/check over 1000 interleaved rounds of every case, after 20
//! # untimed ones (for a shared, loaded machine):
//! TURNSTILE_RULES_INTERLEAVED=1 cargo bench --bench rules   # or =engine_1_rule,local_1_rule
//! TURNSTILE_RULES_INTERLEAVED=1 TURNSTILE_RULES_KEYS=5000 cargo bench --bench rules  # hot cache
//! TURNSTILE_RULES_INTERLEAVED=1 TURNSTILE_RULES_SERIAL=1 cargo bench --bench rules  # dependent checks
//! ```
//!
//! With `TURNSTILE_RULES_CALLGRIND=<case>` set, the binary skips Criterion and runs
//! [`CALLGRIND_CHECKS`] checks of that case inside `timed`, so that callgrind counts only them
//! (divide its `Ir` total by the number of checks).
//!
//! * `store_check`: `Store::check_at(&customer_id, 1, now)` on a sliding_window store.
//! * `engine_1_rule`: `Engine::check_at(&request, now)` with eight rules loaded, of which one
//!   (per customer, the same limit and capacity) matches: the others are filtered by route
//!   prefix, method and priority. This is the figure compared with `store_check`.
//! * `engine_2_rules`: the same request also matches a per-IP /24 rule (two stores touched).
//! * `engine_1_rule_shedding`: `engine_1_rule` with load shedding on (load re-read every check).
//! * `engine_denied_refund`: a per-customer rule admits and a global rule denies: the refund path.
//! * `local_1_rule`: `engine_1_rule` through a per-thread [`LocalEngine`] handle (the rules
//!   cached in the handle instead of an arc-swap load per check).
//!
//! One iteration is [`ITER`] checks over consecutive keys of a pre-generated sequence of
//! [`KEYS`] random customer ids (a rolling window, no RNG in the timed loop), reported as
//! `Throughput::Elements`. Results and caveats are in `docs/rules.md`.

use criterion::{criterion_group, Criterion, Throughput};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::rules::{Engine, LocalEngine, Request, Rules};
use turnstile::{Limit, Limits, ManualClock};

const ITER: usize = 1024;
const KEYS: usize = 100_000;
const NOW: u64 = 1_000_000_000_000;

fn ids() -> Vec<u64> {
    // SplitMix64: reproducible, no dependency.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..KEYS)
        .map(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % 1_000_000_000
        })
        .collect()
}

const RULES: &str = r#"
[[rule]]
name = "search"
key = "customer+route"
match = { route_prefix = ["/v1/search", "/v2/search"] }
limits = [{ algorithm = "window_ring", limit = 600, window = "1m" }]

[[rule]]
name = "exports"
key = "global"
match = { route_prefix = "/v1/exports", method = "POST" }
limits = [{ algorithm = "leaky_bucket", limit = 2, window = "1s", burst = 10 }]

[[rule]]
name = "writes"
key = "api_key"
match = { route_prefix = "/v1/", method = ["POST", "PUT", "PATCH"] }
limits = [{ algorithm = "sliding_log", limit = 100, window = "1m" }]

[[rule]]
name = "tests"
key = "customer"
match = { priority = "test" }
limits = [{ algorithm = "fixed_window", limit = 100, window = "1s" }]

[[rule]]
name = "per-customer"
key = "customer"
capacity = 200000
limits = [{ algorithm = "sliding_window", limit = 1000000, window = "1h" }]

[[rule]]
name = "admin"
key = "route"
match = { route_prefix = "/admin/" }
limits = [{ algorithm = "fixed_window", limit = 10, window = "1s" }]

[[rule]]
name = "refunds"
key = "customer"
match = { route_prefix = "/v1/refunds" }
limits = [{ algorithm = "token_bucket", limit = 10, window = "1s" }]

[[rule]]
name = "uploads"
key = "customer"
match = { route_prefix = "/v1/files", method = "POST" }
limits = [{ algorithm = "token_bucket", limit = 5, window = "1s" }]
"#;

const PER_IP: &str = r#"
[[rule]]
name = "per-ip"
key = "ip/24"
capacity = 200000
limits = [{ algorithm = "sliding_window", limit = 1000000, window = "1h" }]
"#;

const SHEDDING: &str = r#"
[load]
max_in_flight = 1000
sample = "0s"
[shedding]
critical_reserve = 0.1
test = { on = 0.6, off = 0.5 }
get = { on = 0.8, off = 0.7 }
"#;

const DENY: &str = r#"
[[rule]]
name = "per-customer"
key = "customer"
capacity = 200000
limits = [{ algorithm = "sliding_window", limit = 1000000, window = "1h" }]
[[rule]]
name = "closed"
key = "global"
limits = [{ algorithm = "fixed_window", limit = 1, window = "100d" }]
"#;

fn engine(text: &str) -> Engine<ManualClock> {
    let rules = Rules::parse(text, "bench").unwrap();
    Engine::builder(rules)
        .seed(1)
        .build_with_clock(ManualClock::new(NOW))
        .unwrap()
}

fn store() -> Store<ManualClock> {
    Store::builder(
        Limits::new(vec![Limit::sliding_window(
            1_000_000,
            Duration::from_secs(3600),
        )
        .unwrap()])
        .unwrap(),
    )
    .capacity(200_000)
    .seed(1)
    .build_with_clock(ManualClock::new(NOW))
    .unwrap()
}

fn req(id: u64) -> Request<'static> {
    Request::new()
        .customer(id)
        .ip(IpAddr::V4(Ipv4Addr::from(id as u32)))
        .route("/v1/charges")
        .method("GET")
}

fn cases() -> [(&'static str, String); 5] {
    [
        ("engine_1_rule", RULES.to_string()),
        ("local_1_rule", RULES.to_string()),
        ("engine_2_rules", format!("{RULES}{PER_IP}")),
        ("engine_1_rule_shedding", format!("{SHEDDING}{RULES}")),
        ("engine_denied_refund", DENY.to_string()),
    ]
}

/// Checks through the shared engine, or through a [`LocalEngine`] for the `local_` cases.
fn checker<'a>(
    name: &str,
    e: &'a Engine<ManualClock>,
) -> impl FnMut(u64) -> turnstile::Decision + 'a {
    let mut local: Option<LocalEngine<'a, ManualClock>> =
        name.starts_with("local_").then(|| e.local());
    move |id| match &mut local {
        Some(l) => l.check_at(&req(id), NOW),
        None => e.check_at(&req(id), NOW),
    }
}

fn bench(c: &mut Criterion) {
    let ids = ids();
    let mut g = c.benchmark_group("rules");
    g.throughput(Throughput::Elements(ITER as u64));
    g.measurement_time(Duration::from_secs(4));

    let store = store();
    let mut at = 0;
    g.bench_function("store_check", |b| {
        b.iter(|| {
            for _ in 0..ITER {
                at = (at + 1) % KEYS;
                black_box(store.check_at(&ids[at], 1, NOW));
            }
        })
    });

    for (name, text) in cases() {
        let e = engine(&text);
        if name == "engine_denied_refund" {
            assert!(e.check_at(&req(0), NOW).allowed());
        }
        let mut check = checker(name, &e);
        let mut at = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                for _ in 0..ITER {
                    at = (at + 1) % KEYS;
                    black_box(check(ids[at]));
                }
            })
        });
    }
    g.finish();
}

/// Checks counted by callgrind.
const CALLGRIND_CHECKS: usize = 1_000_000;

#[inline(never)]
fn timed(f: &mut dyn FnMut(u64), ids: &[u64]) {
    let t = std::time::Instant::now();
    for i in 0..CALLGRIND_CHECKS {
        f(ids[i % KEYS]);
    }
    let ns = t.elapsed().as_nanos() as f64 / CALLGRIND_CHECKS as f64;
    eprintln!("{ns:.1} ns/check (wall clock; under callgrind, count instructions instead)");
}

fn callgrind(case: &str) {
    let ids = ids();
    // Warm-up pass (outside `timed`): every key inserted, as in the steady state Criterion sees.
    if case == "store_check" {
        let s = store();
        let mut f = |id: u64| {
            black_box(s.check_at(&id, 1, NOW));
        };
        ids.iter().for_each(|&id| f(id));
        timed(&mut f, &ids);
        return;
    }
    let (_, text) = cases()
        .into_iter()
        .find(|(n, _)| *n == case)
        .unwrap_or_else(|| panic!("unknown case `{case}`"));
    let e = engine(&text);
    let mut check = checker(case, &e);
    let mut f = |id: u64| {
        black_box(check(id));
    };
    ids.iter().for_each(|&id| f(id));
    timed(&mut f, &ids);
}

criterion_group!(benches, bench);

/// Interleaved timing for a loaded machine: every case runs `ROUND` checks in turn, many
/// rounds; the minimum per case estimates its unloaded cost (load only ever adds time), the
/// median is printed beside it.
///
/// The first [`WARM_ROUNDS`] rounds are not timed: a case checked right after a full pass over
/// its keys finds them all in cache, so its first round would be its minimum (a hot cache)
/// while every other case's minimum is a steady-state one. `TURNSTILE_RULES_KEYS=<n>` checks
/// only the first `n` ids (e.g. 5000: every case's keys stay in cache).
fn interleaved(only: &str) {
    const ROUND: usize = 5_000;
    const ROUNDS: usize = 1_000;
    const WARM_ROUNDS: usize = 20;
    let keys = std::env::var("TURNSTILE_RULES_KEYS")
        .ok()
        .and_then(|k| k.parse::<usize>().ok())
        .map_or(KEYS, |k| k.clamp(1, KEYS));
    let ids = &ids()[..keys];
    let store = store();
    let engines: Vec<(&str, Engine<ManualClock>)> = cases()
        .iter()
        .filter(|(n, _)| only == "1" || only.split(',').any(|o| o == *n))
        .map(|(n, t)| (*n, engine(t)))
        .collect();
    let mut checks: Vec<_> = engines.iter().map(|(n, e)| checker(n, e)).collect();
    for ((n, _), check) in engines.iter().zip(checks.iter_mut()) {
        if *n == "engine_denied_refund" {
            check(0);
        }
        ids.iter().for_each(|&id| {
            black_box(check(id));
        });
    }
    ids.iter().for_each(|&id| {
        black_box(store.check_at(&id, 1, NOW));
    });
    // `serial`: the next key depends on the last decision (`remaining >> 63` is always 0, but
    // the CPU cannot know), so one check's cache misses cannot overlap the next one's, as in
    // a server where each check sits between other work. Otherwise consecutive checks are
    // independent and the out-of-order core overlaps the misses of several short checks.
    let serial = std::env::var_os("TURNSTILE_RULES_SERIAL").is_some();
    let step = |at: usize, d: turnstile::Decision| {
        (at + 1
            + if serial {
                (d.remaining >> 63) as usize
            } else {
                0
            })
            % keys
    };
    let mut times = vec![Vec::with_capacity(ROUNDS); engines.len() + 1];
    let mut at = 0;
    for round in 0..WARM_ROUNDS + ROUNDS {
        let mut record = |case: usize, t: std::time::Instant| {
            if round >= WARM_ROUNDS {
                times[case].push(t.elapsed().as_nanos() as f64 / ROUND as f64);
            }
        };
        let t = std::time::Instant::now();
        for _ in 0..ROUND {
            at = step(at, black_box(store.check_at(&ids[at], 1, NOW)));
        }
        record(0, t);
        for (i, check) in checks.iter_mut().enumerate() {
            let t = std::time::Instant::now();
            for _ in 0..ROUND {
                at = step(at, black_box(check(ids[at])));
            }
            record(i + 1, t);
        }
    }
    let stats: Vec<(f64, f64)> = times
        .iter_mut()
        .map(|t| {
            t.sort_by(f64::total_cmp);
            (t[0], t[t.len() / 2])
        })
        .collect();
    println!(
        "{:<24} {:>8} {:>7} {:>8} {:>7}   ({keys} keys)",
        "case", "min ns", "ratio", "median", "ratio"
    );
    let names = std::iter::once("store_check").chain(engines.iter().map(|(n, _)| *n));
    for (n, &(min, med)) in names.zip(&stats) {
        println!(
            "{:<24} {:>8.1} {:>7.2} {:>8.1} {:>7.2}",
            n,
            min,
            min / stats[0].0,
            med,
            med / stats[0].1
        );
    }
}

fn main() {
    if let Ok(case) = std::env::var("TURNSTILE_RULES_CALLGRIND") {
        callgrind(&case);
        return;
    }
    if let Ok(only) = std::env::var("TURNSTILE_RULES_INTERLEAVED") {
        interleaved(&only);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
