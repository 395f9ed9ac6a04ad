//! The rules engine's promises beyond one rule: a denial's `retry_after` waits for every rule
//! that would deny, and a reload that changes a rule's limits carries
//! each key's state over when its records read alike under the new limits, also
//! while other threads check.

mod common;

use common::{admitted, engine, E, S};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile::rules::Request;
use turnstile::Outcome;

/// One rule `name` for customers with the given limits (TOML inline tables).
fn rule(name: &str, limits: &str) -> String {
    format!("[[rule]]\nname = \"{name}\"\nkey = \"customer\"\nlimits = [{limits}]\n")
}

// ---- retry_after over every rule (defect 9) ------------------------------------------------

#[test]
fn retry_after_waits_for_every_rule_that_would_deny() {
    // "second": 1 per second per customer; "hour": 2 per hour for everyone. The first request
    // takes one of each. The second is denied by "second" (retry: the next second); "hour"
    // would admit it, so it does not count. The third, a second later, is admitted (the
    // peek charged nothing: "hour" still had one). The fourth is denied by "second" again,
    // and "hour", now empty, would deny it until the hour ends: that is the retry.
    let text = rule(
        "second",
        r#"{ algorithm = "fixed_window", limit = 1, window = "1s" }"#,
    ) + "[[rule]]\nname = \"hour\"\nkey = \"global\"\nlimits = [{ algorithm = \"fixed_window\", limit = 2, window = \"1h\" }]\n";
    let (e, clock) = engine(&text);
    let r = Request::new().customer(1);
    assert!(e.check(&r).allowed());
    let d = e.check(&r);
    assert_eq!(d.retry_after_ns, Some(S), "only `second` denies");
    clock.advance(Duration::from_secs(1));
    assert!(e.check(&r).allowed(), "`hour` was not charged by the peek");
    let d = e.check(&r);
    assert_eq!(d.outcome, Outcome::Limited);
    // Now 1001 s; the hour window ends at 3600 s. (It was 1 s: the first denier's.)
    let retry = d.retry_after_ns.unwrap();
    assert_eq!(retry, 2599 * S);
    assert_eq!(e.explain(&r).rule.as_deref(), Some("second"));
    // The promise: denied 1 ns before, admitted at the retry.
    clock.set(1001 * S + retry - 1);
    assert!(!e.check(&r).allowed());
    clock.set(1001 * S + retry);
    assert!(e.check(&r).allowed());
}

#[test]
fn a_later_rule_that_never_fits_makes_the_denial_never_fit() {
    // A request of cost 4: "second" admits 5 per second, "small" can never admit 4. The
    // second request is denied by "second" first, but no wait will help: NeverFits.
    let text = rule(
        "second",
        r#"{ algorithm = "fixed_window", limit = 5, window = "1s" }"#,
    ) + &rule(
        "small",
        r#"{ algorithm = "token_bucket", limit = 3, window = "1s" }"#,
    );
    let (e, _) = engine(&text);
    let r = Request::new().customer(1).cost(4);
    assert_eq!(e.check(&r).outcome, Outcome::NeverFits);
    // The first rule's charge was refunded: "second" still has 5, so the first rule admits
    // and the second never fits.
    let d = e.check(&r);
    assert_eq!((d.outcome, d.retry_after_ns), (Outcome::NeverFits, None));
    // Two requests of cost 1 leave "second" 3: cost 4 is now denied by "second" first (it
    // would fit in a second), but "small" never admits it: NeverFits, not a retry of 1 s.
    let one = Request::new().customer(1).cost(1);
    assert_eq!(admitted(&e, &one, 2), 2);
    let d = e.check(&r);
    assert_eq!(e.explain(&r).rule.as_deref(), Some("second"));
    assert_eq!(
        (d.outcome, d.retry_after_ns),
        (Outcome::NeverFits, None),
        "{d:?}"
    );
}

// ---- reload carries state over (defect 8) --------------------------------------------------

#[test]
fn a_reload_that_changes_a_limit_keeps_each_keys_count() {
    // The issue's case: after 100 of 100/h, a reload to 101/h admits 1 more, not 101.
    let fw = |n: u64| {
        rule(
            "r",
            &format!(r#"{{ algorithm = "fixed_window", limit = {n}, window = "1h" }}"#),
        )
    };
    let (e, _) = engine(&fw(100));
    let a = Request::new().customer(1);
    let b = Request::new().customer(2);
    assert_eq!(admitted(&e, &a, 100), 100);
    assert_eq!(admitted(&e, &b, 40), 40);
    let rep = e.reload_str(&fw(101), "f.toml").unwrap();
    assert_eq!(rep.carried, vec!["r"]);
    assert!(rep.fresh.is_empty() && rep.kept.is_empty());
    assert_eq!(admitted(&e, &a, 200), 1);
    assert_eq!(admitted(&e, &b, 200), 61);
    // Lowered below what a key holds: it is denied until the window ends.
    e.reload_str(&fw(50), "f.toml").unwrap();
    assert_eq!(admitted(&e, &Request::new().customer(3), 60), 50);
    assert_eq!(admitted(&e, &b, 10), 0);
}

#[test]
fn a_reload_carries_each_algorithm_whose_records_read_alike() {
    // (before, after, requests taken before, admitted after, how the state went). Every
    // rule takes its requests at one instant; the reload follows at that same instant.
    let cases: &[(&str, &str, usize, usize, &str)] = &[
        // sliding_window: same window, limit raised by one.
        (
            r#"{ algorithm = "sliding_window", limit = 10, window = "1h" }"#,
            r#"{ algorithm = "sliding_window", limit = 11, window = "1h" }"#,
            10,
            1,
            "carried",
        ),
        // token_bucket: the TAT is kept; 100 taken of 100/h leaves a backlog of an hour,
        // which at 101/h (capacity 101) is the whole bucket less 57 ns: nothing admitted.
        (
            r#"{ algorithm = "token_bucket", limit = 100, window = "1h" }"#,
            r#"{ algorithm = "token_bucket", limit = 101, window = "1h" }"#,
            100,
            0,
            "carried",
        ),
        // token_bucket: a larger burst on the same rate admits just the extra.
        (
            r#"{ algorithm = "token_bucket", limit = 10, window = "1h" }"#,
            r#"{ algorithm = "token_bucket", limit = 10, burst = 15, window = "1h" }"#,
            10,
            5,
            "carried",
        ),
        // leaky_bucket: likewise.
        (
            r#"{ algorithm = "leaky_bucket", limit = 10, burst = 4, window = "1h" }"#,
            r#"{ algorithm = "leaky_bucket", limit = 10, burst = 6, window = "1h" }"#,
            5,
            2,
            "carried",
        ),
        // window_ring: the limit changes within the counters' width (7 bits).
        (
            r#"{ algorithm = "window_ring", limit = 100, window = "1h", buckets = 60 }"#,
            r#"{ algorithm = "window_ring", limit = 101, window = "1h", buckets = 60 }"#,
            100,
            1,
            "carried",
        ),
        // sliding_log: the same ring, counting denials now.
        (
            r#"{ algorithm = "sliding_log", limit = 5, window = "1h" }"#,
            r#"{ algorithm = "sliding_log", limit = 5, window = "1h", count_denied = true }"#,
            5,
            0,
            "carried",
        ),
        // Two limits on one key, each carried.
        (
            r#"{ algorithm = "fixed_window", limit = 5, window = "1m" }, { algorithm = "token_bucket", limit = 100, window = "1h" }"#,
            r#"{ algorithm = "fixed_window", limit = 6, window = "1m" }, { algorithm = "token_bucket", limit = 100, window = "1h" }"#,
            5,
            1,
            "carried",
        ),
        // What does not carry starts fresh: another window length...
        (
            r#"{ algorithm = "fixed_window", limit = 5, window = "1h" }"#,
            r#"{ algorithm = "fixed_window", limit = 5, window = "2h" }"#,
            5,
            5,
            "fresh",
        ),
        // ...another algorithm...
        (
            r#"{ algorithm = "fixed_window", limit = 5, window = "1h" }"#,
            r#"{ algorithm = "sliding_log", limit = 5, window = "1h" }"#,
            5,
            5,
            "fresh",
        ),
        // ...a sliding_log of another length (its ring is sized by the limit)...
        (
            r#"{ algorithm = "sliding_log", limit = 5, window = "1h" }"#,
            r#"{ algorithm = "sliding_log", limit = 6, window = "1h" }"#,
            5,
            6,
            "fresh",
        ),
        // ...a window_ring whose counters change width (7 to 8 bits).
        (
            r#"{ algorithm = "window_ring", limit = 100, window = "1h", buckets = 60 }"#,
            r#"{ algorithm = "window_ring", limit = 200, window = "1h", buckets = 60 }"#,
            100,
            200,
            "fresh",
        ),
    ];
    for (i, &(before, after, taken, more, how)) in cases.iter().enumerate() {
        let (e, _) = engine(&rule("r", before));
        let a = Request::new().customer(1);
        assert_eq!(admitted(&e, &a, taken), taken, "case {i}: {before}");
        let rep = e.reload_str(&rule("r", after), "f.toml").unwrap();
        let got = if rep.carried == ["r"] {
            "carried"
        } else if rep.fresh == ["r"] {
            "fresh"
        } else {
            "kept"
        };
        assert_eq!(got, how, "case {i}: {before} -> {after}: {rep:?}");
        assert_eq!(admitted(&e, &a, 300), more, "case {i}: {before} -> {after}");
    }
}

/// Checks `threads` × at most `per_thread` requests of customer 1 at one instant while
/// `reload` runs once `trigger` of them were admitted (customer 1 is held at `hold` admitted
/// until the reload is over, but for checks already under way); returns the number admitted. Bounded
/// in count, and in time (panics after 60 s).
fn under_reload(
    e: &Arc<E>,
    threads: usize,
    per_thread: usize,
    trigger: u64,
    hold: u64,
    reload: impl FnOnce(&E) + Send + 'static,
) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reloader = {
        let (e, admitted, done) = (e.clone(), admitted.clone(), done.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while admitted.load(Ordering::Relaxed) < trigger {
                assert!(t0.elapsed() < Duration::from_secs(60), "no progress");
                std::hint::spin_loop();
            }
            reload(&e);
            done.store(true, Ordering::Relaxed);
        })
    };
    let checkers: Vec<_> = (0..threads)
        .map(|_| {
            let (e, admitted, done) = (e.clone(), admitted.clone(), done.clone());
            std::thread::spawn(move || {
                let r = Request::new().customer(1);
                let other = Request::new().customer(2);
                let t0 = Instant::now();
                // On until `after` checks past the reload, within the bounds.
                let mut after = 0;
                for _ in 0..per_thread {
                    // Customer 1 waits at `hold` admitted for the reload (customer 2 is
                    // checked meanwhile, in the same rule): the reload then finds it there.
                    if !done.load(Ordering::Relaxed) && admitted.load(Ordering::Relaxed) >= hold {
                        e.check(&other);
                        continue;
                    }
                    if e.check(&r).allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    if done.load(Ordering::Relaxed) {
                        after += 1;
                        if after == 1000 {
                            return;
                        }
                    }
                    assert!(t0.elapsed() < Duration::from_secs(60), "too slow");
                }
                panic!("the reload did not happen within {per_thread} checks");
            })
        })
        .collect();
    for c in checkers {
        c.join().unwrap();
    }
    reloader.join().unwrap();
    assert!(
        done.load(Ordering::Relaxed),
        "the reload ran during the checks"
    );
    admitted.load(Ordering::Relaxed)
}

/// After a concurrent test: raising the limit to `big` admits exactly `big − total` more, so
/// the stored count is the number admitted (no update lost across the swap).
fn count_is(e: &E, algo: &str, total: u64) {
    // Within window_ring's counter width for 3000 (12 bits), so that it carries too.
    let big = 4095u64;
    let rep = e
        .reload_str(
            &rule(
                "r",
                &format!(r#"{{ algorithm = "{algo}", limit = {big}, window = "1h" }}"#),
            ),
            "f.toml",
        )
        .unwrap();
    assert_eq!(rep.carried, vec!["r"], "{algo}");
    let r = Request::new().customer(1);
    assert_eq!(
        admitted(e, &r, (big - total) as usize + 100) as u64,
        big - total,
        "{algo}: the stored count is what was admitted"
    );
}

#[test]
fn a_raised_limit_under_concurrent_checks_admits_exactly_the_new_limit() {
    // 4 threads check one key at one instant; at 200 admitted the limit goes from 400 to
    // 800. Carried over, the key admits exactly 800 in all (checks that loaded the old rules
    // can only deny more). Fresh state would admit 200..400 + 800.
    for algo in ["fixed_window", "sliding_window"] {
        let text = |n: u64| {
            rule(
                "r",
                &format!(r#"{{ algorithm = "{algo}", limit = {n}, window = "1h" }}"#),
            )
        };
        let (e, _) = engine(&text(400));
        let e = Arc::new(e);
        let next = text(800);
        let total = under_reload(&e, 4, 10_000_000, 200, u64::MAX, move |e| {
            assert_eq!(e.reload_str(&next, "f.toml").unwrap().carried, vec!["r"]);
        });
        assert_eq!(total, 800, "{algo}");
        count_is(&e, algo, total);
    }
}

#[test]
fn a_lowered_limit_under_concurrent_checks_admits_at_most_one_more_per_thread() {
    // From 800 to 300 at 100 admitted (customer 1 held at 250 until the reload is over): the
    // new limit holds, but for checks that loaded the old rules before the swap and decide
    // after it (at most one per thread). Fresh state would admit 250.. + 300.
    let threads = 4;
    let text = |n: u64| {
        rule(
            "r",
            &format!(r#"{{ algorithm = "fixed_window", limit = {n}, window = "1h" }}"#),
        )
    };
    let (e, _) = engine(&text(800));
    let e = Arc::new(e);
    let next = text(300);
    let total = under_reload(&e, threads, 10_000_000, 100, 250, move |e| {
        e.reload_str(&next, "f.toml").unwrap();
    });
    assert!(
        (300..=300 + threads as u64).contains(&total),
        "admitted {total}"
    );
    count_is(&e, "fixed_window", total);
}

#[test]
fn reloads_back_and_forth_under_concurrent_checks_lose_no_count() {
    // The limit alternates between 3000 and 3001 at every reload (each one carried), at
    // least 50 times while two threads check; packed (fixed_window) and arena (window_ring)
    // records. In all, at most 3001 are admitted and the stored count is what was admitted.
    for algo in ["fixed_window", "window_ring"] {
        let text = |n: u64| {
            rule(
                "r",
                &format!(r#"{{ algorithm = "{algo}", limit = {n}, window = "1h" }}"#),
            )
        };
        let (e, _) = engine(&text(3000));
        let e = Arc::new(e);
        let stop = Arc::new(AtomicBool::new(false));
        let reloads = Arc::new(AtomicU64::new(0));
        let reloader = {
            let (e, stop, reloads) = (e.clone(), stop.clone(), reloads.clone());
            let texts = [text(3000), text(3001)];
            std::thread::spawn(move || {
                let mut n = 1;
                while !stop.load(Ordering::Relaxed) && n < 100_000 {
                    let rep = e.reload_str(&texts[n % 2], "f.toml").unwrap();
                    assert_eq!(rep.carried, vec!["r"]);
                    n += 1;
                    reloads.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let checkers: Vec<_> = (0..2)
            .map(|_| {
                let (e, reloads) = (e.clone(), reloads.clone());
                std::thread::spawn(move || {
                    let r = Request::new().customer(1);
                    let t0 = Instant::now();
                    let (mut n, mut admitted) = (0u64, 0u64);
                    while n < 4000 || reloads.load(Ordering::Relaxed) < 50 {
                        admitted += e.check(&r).allowed() as u64;
                        n += 1;
                        assert!(t0.elapsed() < Duration::from_secs(60), "too slow");
                    }
                    admitted
                })
            })
            .collect();
        let total: u64 = checkers.into_iter().map(|h| h.join().unwrap()).sum();
        stop.store(true, Ordering::Relaxed);
        reloader.join().unwrap();
        assert!(reloads.load(Ordering::Relaxed) >= 50);
        assert!((3000..=3001).contains(&total), "{algo}: admitted {total}");
        count_is(&e, algo, total);
    }
}
