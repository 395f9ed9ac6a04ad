//! A key flood against each full-store policy: 10× capacity one-shot keys mixed with honest
//! users who come back and abusers who are being limited. Prints the table of
//! `docs/memory.md` ("A key flood"); reproduce with
//!
//! ```sh
//! cargo test --release --test store_flood -- --nocapture
//! ```
//!
//! Deterministic: one thread, a fixed seed, time given to every check.

use std::collections::HashMap;
use std::time::Duration;
use turnstile::keyed::{FullPolicy, Store};
use turnstile::{Limit, Limiter, Limits, ManualClock, Outcome};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;
/// The store's key capacity.
const CAP: u64 = 10_000;
/// One-shot keys: ten times the capacity, all within `FLOOD_FOR` from `FLOOD_AT`.
const FLOOD: u64 = 10 * CAP;
const FLOOD_AT: u64 = 5 * S;
const FLOOD_FOR: u64 = 10 * S;
/// Honest users: `HONEST` who were seen before the flood and come back, `HONEST` new ones who
/// arrive during it; each sends one request every `HONEST_EVERY`, well within the limit.
const HONEST: u64 = 1_000;
const HONEST_EVERY: u64 = 5 * S;
/// Abusers: `ABUSERS` from the start, `ABUSERS` more arriving during the flood, each sending
/// one request every `ABUSE_EVERY` (10 per second against 100 per minute).
const ABUSERS: u64 = 50;
const ABUSE_EVERY: u64 = 100 * MS;
/// The run, and its tick.
const END: u64 = 60 * S;
const TICK: u64 = 10 * MS;

#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Honest requests, and how many were refused (every refusal is wrong: they stay within
    /// the limit, which the reference confirms).
    honest: u64,
    honest_denied: u64,
    /// Honest users refused at least once.
    honest_users_hit: u64,
    /// Abusers' requests admitted, and admitted beyond what a limiter that never forgets them
    /// (one `Limiter` per abuser, the same limit) admits.
    abuse_admitted: u64,
    abuse_excess: u64,
    /// Abusers admitted more than the reference at least once; of them, abusers seen
    /// before the flood.
    abusers_leaked: u64,
    early_abusers_leaked: u64,
    /// What a refused new key was told to wait, at most (`StoreFull`).
    max_retry_ns: Option<u64>,
}

fn run(limit: Limit, policy: FullPolicy) -> Tally {
    let store = Store::builder(Limits::new(vec![limit]).unwrap())
        .capacity(CAP)
        .shards(1)
        .seed(11)
        .policy(policy)
        .build_with_clock(ManualClock::new(0))
        .unwrap();
    let honest_id = |i: u64| 1 << 40 | i;
    let abuser_id = |i: u64| 2 << 40 | i;
    let flood_id = |i: u64| (3 << 40 | i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut reference: HashMap<u64, Limiter<ManualClock>> = HashMap::new();
    let mut refer = |id: u64, now: u64| {
        reference
            .entry(id)
            .or_insert_with(|| {
                Limiter::with_limits(Limits::new(vec![limit]).unwrap(), ManualClock::new(0))
            })
            .check_at(1, now)
            .allowed()
    };
    let mut t = Tally::default();
    let mut hit = vec![false; 2 * HONEST as usize];
    let mut leaked = vec![false; 2 * ABUSERS as usize];
    let mut flooded = 0;
    let mut now = 0;
    while now < END {
        // Honest user i first comes at `start(i)`, then every HONEST_EVERY: the first HONEST
        // before the flood, the others spread over it.
        for i in 0..2 * HONEST {
            let start = if i < HONEST {
                i * (FLOOD_AT / HONEST)
            } else {
                FLOOD_AT + (i - HONEST) * (FLOOD_FOR / HONEST)
            };
            if now >= start && (now - start) % HONEST_EVERY < TICK {
                let d = store.check_at(&honest_id(i), 1, now);
                assert!(
                    refer(honest_id(i), now),
                    "an honest user stays within the limit"
                );
                t.honest += 1;
                if !d.allowed() {
                    t.honest_denied += 1;
                    hit[i as usize] = true;
                    if d.outcome == Outcome::StoreFull {
                        let r = d.retry_after_ns.expect("a full store gives a retry hint");
                        t.max_retry_ns = Some(t.max_retry_ns.unwrap_or(0).max(r));
                    }
                }
            }
        }
        // Abuser i: the first ABUSERS from the start, the others from the middle of the flood.
        for i in 0..2 * ABUSERS {
            let start = if i < ABUSERS {
                0
            } else {
                FLOOD_AT + FLOOD_FOR / 2
            };
            if now >= start && (now - start) % ABUSE_EVERY < TICK {
                let d = store.check_at(&abuser_id(i), 1, now);
                let ok = refer(abuser_id(i), now);
                if d.allowed() {
                    t.abuse_admitted += 1;
                    if !ok {
                        t.abuse_excess += 1;
                        leaked[i as usize] = true;
                    }
                }
            }
        }
        // The flood: one-shot keys, evenly over FLOOD_FOR.
        if (FLOOD_AT..FLOOD_AT + FLOOD_FOR).contains(&now) {
            let due = ((now - FLOOD_AT + TICK) * FLOOD / FLOOD_FOR).min(FLOOD);
            while flooded < due {
                store.check_at(&flood_id(flooded), 1, now);
                flooded += 1;
            }
        }
        now += TICK;
    }
    assert_eq!(flooded, FLOOD);
    t.honest_users_hit = hit.iter().filter(|&&h| h).count() as u64;
    t.abusers_leaked = leaked.iter().filter(|&&h| h).count() as u64;
    t.early_abusers_leaked = leaked[..ABUSERS as usize].iter().filter(|&&h| h).count() as u64;
    t
}

fn limits() -> [(&'static str, Limit); 3] {
    let min = Duration::from_secs(60);
    [
        (
            "token_bucket 100/min",
            Limit::token_bucket(100, 100, min).unwrap(),
        ),
        (
            "fixed_window 100/min",
            Limit::fixed_window(100, min).unwrap(),
        ),
        ("sliding_log 100/min", Limit::sliding_log(100, min).unwrap()),
    ]
}

const POLICIES: [FullPolicy; 3] = [
    FullPolicy::Reject,
    FullPolicy::AllowUntracked,
    FullPolicy::EvictStalest,
];

/// The table of docs/memory.md, and what it shows.
#[test]
fn key_flood_table() {
    println!(
        "| limit | policy | honest requests refused | honest users refused | abusers' admissions | beyond their limit | abusers leaking | longest retry hint |"
    );
    println!("|---|---|--:|--:|--:|--:|--:|--:|");
    let mut by = HashMap::new();
    for (name, limit) in limits() {
        for p in POLICIES {
            let t = run(limit, p);
            println!(
                "| {name} | {p:?} | {} of {} | {} of {} | {} | {} | {} of {} | {} |",
                t.honest_denied,
                t.honest,
                t.honest_users_hit,
                2 * HONEST,
                t.abuse_admitted,
                t.abuse_excess,
                t.abusers_leaked,
                2 * ABUSERS,
                t.max_retry_ns
                    .map_or("—".into(), |r| format!("{:.1} s", r as f64 / S as f64)),
            );
            by.insert((name, format!("{p:?}")), t);
        }
    }
    for (name, _) in limits() {
        let get = |p: &str| by[&(name, p.to_string())];
        let (reject, allow, evict) = (get("Reject"), get("AllowUntracked"), get("EvictStalest"));
        // Fail closed never lets an abuser past its limit, but where the flood fills the
        // store (the window limits: a one-shot key's record stays until its window ends) it
        // refuses honest users.
        assert_eq!(reject.abuse_excess, 0, "{name}: {reject:?}");
        if !name.starts_with("token_bucket") {
            assert!(reject.honest_users_hit > 0, "{name}: {reject:?}");
        }
        // Fail open and eviction refuse no honest user.
        assert_eq!(allow.honest_denied, 0, "{name}: {allow:?}");
        assert_eq!(evict.honest_denied, 0, "{name}: {evict:?}");
        // Fail open leaks only abusers that arrive while the store is full: one it tracks
        // stays limited.
        assert_eq!(allow.early_abusers_leaked, 0, "{name}: {allow:?}");
    }
}

/// The default policy is the one the table picks (docs/memory.md): no honest user refused.
#[test]
fn the_default_policy_refuses_no_honest_user() {
    for (name, limit) in limits() {
        let t = run(limit, FullPolicy::default());
        assert_eq!(t.honest_denied, 0, "{name}: {t:?}");
    }
}

/// A full store's refusal is "retry later", not "never fits": it carries a hint, no later
/// than when a one-shot key's record is reclaimable.
#[test]
fn store_full_carries_a_retry_hint() {
    let l = Limit::token_bucket(100, 100, Duration::from_secs(60)).unwrap();
    let store = Store::builder(Limits::new(vec![l]).unwrap())
        .capacity(100)
        .shards(1)
        .seed(1)
        .policy(FullPolicy::Reject)
        .build_with_clock(ManualClock::new(0))
        .unwrap();
    let (k, d) = (0..10_000u64)
        .map(|k| (k, store.check_at(&k, 1, S)))
        .find(|(_, d)| d.outcome == Outcome::StoreFull)
        .expect("a store of 100 refuses some of 10,000 keys");
    assert!(!d.allowed());
    let r = d.retry_after_ns.expect("StoreFull gives a retry hint");
    // One token of 100 per minute refills in 0.6 s; the reclaim grace is 1 ms.
    assert!((600 * MS..=602 * MS).contains(&r), "{r}");
    // And it is true: after the hint the same key is admitted.
    assert!(store.check_at(&k, 1, S + r).allowed());
}
