//! The Lua library: one file per part under `lua/`, composed into one Redis Functions library
//! (`FUNCTION LOAD`), named by a hash of its text so that every version has its own, and the
//! limits' parameters as the library reads them (a spec string per store, [`store_spec`]).
//!
//! The library holds every algorithm; its top level (the helpers, the algorithm tables) runs
//! once, when Redis loads it, and each call runs only the registered function (with `EVAL`,
//! the whole script's chunk ran on every call). Each file's header states what it reads and
//! answers. Lua numbers are doubles: absolute times travel as decimal strings, and every
//! duration must stay below [`MAX_DURATION_NS`].

use redis::Script;
use std::fmt::Write;
use std::sync::OnceLock;
use turnstile::{ConfigError, Limit, Limits};

/// Milliseconds added to every TTL when a call passes an explicit `now` (tests): such a `now`
/// is not the server's clock, so a TTL computed from it must not expire the key under the
/// test's feet. Production calls (server `TIME`) add nothing. (The library's `SLACK_MS`.)
pub const EXPLICIT_NOW_TTL_SLACK_MS: u64 = 3_600_000;

/// The parts, in the order the library needs them (each uses only those before it).
const PARTS: [&str; 17] = [
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/record.lua"),
    include_str!("../lua/fixed_window.lua"),
    include_str!("../lua/sliding_window.lua"),
    include_str!("../lua/token_bucket.lua"),
    include_str!("../lua/leaky_bucket.lua"),
    include_str!("../lua/sliding_log.lua"),
    include_str!("../lua/window_ring.lua"),
    include_str!("../lua/concurrency.lua"),
    include_str!("../lua/limits.lua"),
    include_str!("../lua/settle.lua"),
    include_str!("../lua/spec.lua"),
    include_str!("../lua/fast.lua"),
    include_str!("../lua/lease.lua"),
    include_str!("../lua/store.lua"),
    include_str!("../lua/rules.lua"),
    include_str!("../lua/plain.lua"),
];

/// The longest window, period, τ or lease a script handles exactly: 2^52 ns (52 days). Lua's
/// doubles hold integers exactly below 2^53, and the scripts' arithmetic keeps every
/// intermediate under twice a duration.
pub const MAX_DURATION_NS: u64 = 1 << 52;

/// The longest sliding_log window and concurrency lease on Redis: 2^51 ns (26 days). A log's
/// entries and a lease's score are kept within 2^52 ns of a base that moves, so a time plus
/// a window stays below 2^53.
pub const MAX_ZSET_DURATION_NS: u64 = 1 << 51;

/// The Redis time one call may take at most, by construction: the limits whose call could
/// take longer are refused when a store is built ([`max_limit`]). Measured (tests/call_cost.rs,
/// docs/redis.md): the records that grow with their limit are a sliding_log's (an entry per
/// admission, in one string every write rewrites: about 16 ns an entry, 66 ns for each entry
/// a check adds) and a concurrency limit's (a sorted-set member per cell held: about 0.5 to 2
/// µs a cell added). A call that blocks Redis blocks every client of every application that
/// shares it.
pub const MAX_CALL_US: u64 = 1000;

/// The largest limit of `a` a Redis store accepts: every call within [`MAX_CALL_US`].
/// sliding_log: 4096 (its in-memory maximum is 2^20); concurrency: 256 (2^16 in memory); the
/// others: their in-memory maximum (their calls cost the same at any limit; window_ring's
/// grows with its sub-windows, at most 1024, about 150 µs there).
pub fn max_limit(a: turnstile::Algorithm) -> u64 {
    use turnstile::algo::{concurrency, fixed_window, sliding_window, window_ring};
    use turnstile::Algorithm as A;
    match a {
        A::SlidingLog => 4096,
        A::Concurrency => 256.min(concurrency::MAX_LIMIT),
        A::FixedWindow => fixed_window::MAX_LIMIT,
        A::SlidingWindow => sliding_window::MAX_LIMIT,
        A::WindowRing => window_ring::MAX_LIMIT,
        _ => u64::MAX,
    }
}

fn too_costly(what: &str, limit: u64, a: turnstile::Algorithm, per: &str) -> ConfigError {
    let max = max_limit(a);
    ConfigError::new(
        "limit",
        format!(
            "{what} of {limit} is more than a Redis store takes ({max}): it keeps {per}, and one call's time grows with it; at most {max} keeps every call within {MAX_CALL_US} us of Redis time (a call blocks every client of the Redis). Use a lower limit, a sliding_window or window_ring, or the in-memory store"
        ),
    )
}

/// The composed library: its text and the names it registers.
#[derive(Debug)]
pub(crate) struct Library {
    /// `#!lua name=...` and the parts.
    pub(crate) code: String,
    /// The library's name, `turnstile_<hash>`.
    pub(crate) name: String,
    /// The store's function (store.lua).
    pub(crate) store: String,
    /// The rules engine's function (rules.lua).
    pub(crate) rules: String,
    /// A plain-commands store's refund (plain.lua).
    pub(crate) plain: String,
}

/// The library of this build (composed once).
pub(crate) fn library() -> &'static Library {
    static LIB: OnceLock<Library> = OnceLock::new();
    LIB.get_or_init(|| compose(&PARTS))
}

/// The library of `parts`: named by the SHA-1 of their text (12 hex digits), its functions
/// registered under the same suffix, so that two versions loaded on one server never replace
/// each other's functions.
fn compose(parts: &[&str]) -> Library {
    let body = parts.concat();
    let hash = Script::new(&body).get_hash()[..12].to_string();
    let (name, store, rules, plain) = (
        format!("turnstile_{hash}"),
        format!("ts_{hash}"),
        format!("tsr_{hash}"),
        format!("tsp_{hash}"),
    );
    let code = format!(
        "#!lua name={name}\n{body}\nredis.register_function('{store}', store_call)\nredis.register_function('{rules}', rules_call)\nredis.register_function('{plain}', plain_refund)\n"
    );
    Library {
        code,
        name,
        store,
        rules,
        plain,
    }
}

/// One limit as the library sees it: its algorithm's code and parameters.
#[derive(Clone, Debug)]
pub(crate) struct LimitArgs {
    pub(crate) code: &'static str,
    pub(crate) params: Vec<u64>,
}

impl LimitArgs {
    /// Whether its records may be packed in buckets (record.lua): one short value per key.
    pub(crate) fn packable(&self) -> bool {
        matches!(self.code, "fw" | "sw" | "tb" | "lb")
    }

    /// Appends `<code> <parameters...>` to a spec.
    pub(crate) fn push_to(&self, spec: &mut String) {
        spec.push(' ');
        spec.push_str(self.code);
        for p in &self.params {
            // Writing to a String cannot fail.
            let _ = write!(spec, " {p}");
        }
    }
}

fn too_long(field: &'static str, what: &str, ns: u64, max: u64) -> ConfigError {
    let (pow, days) = if max == MAX_DURATION_NS {
        (52, 52)
    } else {
        (51, 26)
    };
    ConfigError::new(
        field,
        format!(
            "{what} of {ns} ns is longer than the 2^{pow} ns ({days} days) a Redis script computes exactly; shorten it or use the in-memory store"
        ),
    )
}

/// The library's parameters for `l`, or why Redis cannot run it.
pub(crate) fn limit_args(l: &Limit) -> Result<LimitArgs, ConfigError> {
    let check = |field, what, ns: u64, max: u64| {
        if ns > max {
            Err(too_long(field, what, ns, max))
        } else {
            Ok(())
        }
    };
    let (code, params) = match l {
        Limit::FixedWindow(p) => {
            check("window", "a window", p.window, MAX_DURATION_NS)?;
            ("fw", vec![p.limit, p.window, p.count_denied as u64])
        }
        Limit::SlidingWindow(p) => {
            check("window", "a window", p.window, MAX_DURATION_NS)?;
            ("sw", vec![p.limit, p.window, p.count_denied as u64])
        }
        Limit::TokenBucket(p) => {
            let what = "a bucket span (capacity x interval)";
            check("burst", what, p.tau, MAX_DURATION_NS)?;
            ("tb", vec![p.capacity, p.interval, p.tau])
        }
        Limit::LeakyBucket(p) => {
            let what = "a bucket span ((burst + 1) x interval)";
            check("burst", what, p.tau, MAX_DURATION_NS)?;
            ("lb", vec![p.capacity(), p.interval, p.tau, p.free])
        }
        Limit::SlidingLog(p) => {
            let what = "a sliding_log window";
            check("window", what, p.window, MAX_ZSET_DURATION_NS)?;
            if p.limit > max_limit(turnstile::Algorithm::SlidingLog) {
                let per = "an entry per admission in one string every write rewrites";
                return Err(too_costly(
                    "a sliding_log limit",
                    p.limit,
                    turnstile::Algorithm::SlidingLog,
                    per,
                ));
            }
            let params = vec![p.limit, p.window, p.count_denied as u64, p.tick];
            ("sl", params)
        }
        Limit::WindowRing(p) => {
            // The ring spans N + 1 sub-windows; the script's arithmetic keeps that span exact.
            let span = p.sub.saturating_mul(p.buckets + 1);
            check(
                "window",
                "a ring of N + 1 sub-windows",
                span,
                MAX_DURATION_NS,
            )?;
            let bytes = (p.width as u64).div_ceil(8);
            let (cd, max) = (p.count_denied as u64, p.max_count());
            (
                "wr",
                vec![p.limit, p.window, cd, p.sub, p.buckets, max, bytes],
            )
        }
        Limit::Concurrency(p) => {
            check(
                "window",
                "a concurrency lease",
                p.lease,
                MAX_ZSET_DURATION_NS,
            )?;
            if p.limit > max_limit(turnstile::Algorithm::Concurrency) {
                let per = "a sorted-set member per request in flight";
                return Err(too_costly(
                    "a concurrency limit",
                    p.limit,
                    turnstile::Algorithm::Concurrency,
                    per,
                ));
            }
            ("cc", vec![p.limit, p.lease])
        }
    };
    Ok(LimitArgs { code, params })
}

/// A store's spec (spec.lua): its layout ("b": records packed in buckets where the algorithm
/// allows it; "k": a plain key per record), then the limits ([`push_limits`]).
pub(crate) fn store_spec(packed: bool, limits: &Limits, args: &[LimitArgs]) -> String {
    let mut s = String::from(if packed { "b" } else { "k" });
    push_limits(&mut s, limits, args);
    s
}

/// Appends limits to a spec: their count (with "+" when their record takes more than 64 words
/// in memory: limits.lua keeps a counted denial then, as `Limits::count_denial` does), then
/// each one's code and parameters.
pub(crate) fn push_limits(spec: &mut String, limits: &Limits, args: &[LimitArgs]) {
    let big = if limits.words() > 64 { "+" } else { "" };
    // Writing to a String cannot fail.
    let _ = write!(spec, " {}{big}", args.len());
    for a in args {
        a.push_to(spec);
    }
}

/// A hash of what a limit's record means, when more than its algorithm says (what
/// `Limit::carries_to` compares): records read alike exactly when these are equal.
pub(crate) fn record_layout(l: &Limit) -> Option<u32> {
    Some(fnv(&match l {
        Limit::FixedWindow(p) => vec![p.window],
        Limit::SlidingWindow(p) => vec![p.window],
        Limit::WindowRing(p) => vec![p.window, p.buckets, p.width as u64],
        Limit::SlidingLog(p) => vec![p.limit, p.window, p.tick],
        Limit::TokenBucket(_) | Limit::LeakyBucket(_) | Limit::Concurrency(_) => return None,
    }))
}

/// A hash of what a packed record's value means (fixed_window.lua's and sliding_window.lua's
/// encodings: one integer when the counts fit below the window, sliding_window's counts
/// split by the limit's K): the records of one bucket are all read (and swept) alike exactly
/// when these are equal.
pub(crate) fn packed_layout(l: &Limit) -> Option<u32> {
    use turnstile::algo::{fixed_window, sliding_window};
    Some(fnv(&match l {
        Limit::FixedWindow(p) => {
            let cap = if p.count_denied {
                fixed_window::MAX_LIMIT
            } else {
                p.limit
            };
            vec![p.window, (cap < p.window) as u64]
        }
        Limit::SlidingWindow(p) => {
            let cap = if p.count_denied {
                sliding_window::MAX_LIMIT
            } else {
                p.limit
            };
            let k = cap + 1;
            vec![p.window, if k * k <= p.window { k } else { 0 }]
        }
        _ => return record_layout(l),
    }))
}

/// FNV-1a over the words' bytes: stable across processes and versions, as the names it makes
/// must be for every process to name a key alike.
fn fnv(words: &[u64]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in words.iter().flat_map(|w| w.to_le_bytes()) {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What the compiler cannot check when an algorithm is added: every algorithm of
    /// `Algorithm::ALL` has a Lua transition registered under the code its arguments name,
    /// and a largest accepted limit.
    #[test]
    fn every_algorithm_runs_in_the_library() {
        let lib = library();
        for a in turnstile::Algorithm::ALL {
            let spec = turnstile::LimitSpec::new(a, 10, Duration::from_secs(60));
            let limit = spec.build().unwrap_or_else(|e| panic!("{a}: {e}"));
            let args = limit_args(&limit).unwrap_or_else(|e| panic!("{a}: {e}"));
            let code = args.code;
            assert!(
                lib.code.contains(&format!("ALG.{code} = {{")),
                "{a}: no `ALG.{code}` in redis/lua/"
            );
            assert!(max_limit(a) >= 10, "{a}: max_limit");
        }
    }

    #[test]
    fn the_library_registers_both_functions_under_its_hash() {
        let lib = library();
        assert!(lib.code.starts_with(&format!("#!lua name={}\n", lib.name)));
        let hash = lib.name.strip_prefix("turnstile_").unwrap();
        assert_eq!(hash.len(), 12);
        assert_eq!(lib.store, format!("ts_{hash}"));
        assert_eq!(lib.rules, format!("tsr_{hash}"));
        assert!(lib.code.contains(&format!(
            "redis.register_function('{}', store_call)",
            lib.store
        )));
        assert!(lib.code.contains(&format!(
            "redis.register_function('{}', rules_call)",
            lib.rules
        )));
        // Another text, another name.
        let other = compose(&["-- x\n"]);
        assert_ne!(other.name, lib.name);
    }

    #[test]
    fn every_loop_of_the_library_is_a_numeric_for_or_bounded_by_one() {
        // A `while` or `repeat` loop's end depends on its body; every loop of the library is
        // a numeric `for` (bounds fixed before it starts) or a generic `for` over a finite
        // string or table.
        for part in PARTS {
            for (i, line) in part.lines().enumerate() {
                let code = line.split("--").next().unwrap_or("");
                assert!(
                    !code.contains("while ") && !code.contains("repeat"),
                    "line {}: {line}",
                    i + 1
                );
            }
        }
    }

    #[test]
    fn specs_list_each_limit_with_its_parameters() {
        let h = Duration::from_secs(3600);
        let fw = limit_args(&Limit::fixed_window(500, h).unwrap()).unwrap();
        let tb = limit_args(&Limit::token_bucket(10, 10, h).unwrap()).unwrap();
        let l = |v: Vec<Limit>| Limits::new(v).unwrap();
        let both = l(vec![
            Limit::fixed_window(500, h).unwrap(),
            Limit::token_bucket(10, 10, h).unwrap(),
        ]);
        assert_eq!(
            store_spec(true, &both, &[fw.clone(), tb.clone()]),
            "b 2 fw 500 3600000000000 0 tb 10 360000000000 3600000000000"
        );
        let one = l(vec![Limit::fixed_window(500, h).unwrap()]);
        assert_eq!(
            store_spec(false, &one, std::slice::from_ref(&fw)),
            "k 1 fw 500 3600000000000 0"
        );
        let big = l(vec![Limit::sliding_log(500, h).unwrap()]);
        let a = limit_args(&big.limits()[0]).unwrap();
        assert!(store_spec(false, &big, &[a]).starts_with("k 1+ sl 500 "));
        assert!(fw.packable() && tb.packable());
        let sl = limit_args(&Limit::sliding_log(500, h).unwrap()).unwrap();
        assert!(!sl.packable());
        assert_eq!(sl.params[3], 3600000000000u64.div_ceil(1 << 30));
    }

    #[test]
    fn durations_past_what_doubles_hold_are_refused() {
        let l = Limit::token_bucket(10_000, 1, Duration::from_secs(3600)).unwrap();
        let e = limit_args(&l).unwrap_err();
        assert!(e.message.contains("2^52"), "{e}");
        let day = Duration::from_secs(86_400);
        let l = Limit::sliding_log(10, day * 27).unwrap();
        assert!(limit_args(&l).unwrap_err().message.contains("2^51"));
        let l = Limit::concurrency(10, day * 26).unwrap();
        assert!(limit_args(&l).is_ok());
    }

    #[test]
    fn limits_whose_calls_grow_past_the_budget_are_refused() {
        let h = Duration::from_secs(3600);
        assert!(limit_args(&Limit::sliding_log(4096, h).unwrap()).is_ok());
        let e = limit_args(&Limit::sliding_log(4097, h).unwrap()).unwrap_err();
        assert!(
            e.message.contains("4096") && e.message.contains("us of Redis time"),
            "{e}"
        );
        assert!(limit_args(&Limit::concurrency(256, h).unwrap()).is_ok());
        let e = limit_args(&Limit::concurrency(257, h).unwrap()).unwrap_err();
        assert!(e.message.contains("256"), "{e}");
    }

    #[test]
    fn layouts_differ_exactly_when_records_read_differently() {
        let m = Duration::from_secs(60);
        let a = Limit::fixed_window(5, m).unwrap();
        let b = Limit::fixed_window(7, m).unwrap();
        let c = Limit::fixed_window(5, m * 2).unwrap();
        assert_eq!(record_layout(&a), record_layout(&b));
        assert_ne!(record_layout(&a), record_layout(&c));
        assert_eq!(record_layout(&Limit::token_bucket(5, 5, m).unwrap()), None);
        // Packed: the encoding too (one integer when the counts fit below the window).
        assert_eq!(packed_layout(&a), packed_layout(&b));
        let cd = |l: Limit| match l {
            Limit::FixedWindow(mut p) => {
                p.count_denied = true;
                Limit::FixedWindow(p)
            }
            l => l,
        };
        let tiny = Duration::from_millis(7);
        let (x, y) = (
            Limit::fixed_window(1, tiny).unwrap(),
            cd(Limit::fixed_window(1, tiny).unwrap()),
        );
        assert_eq!(record_layout(&x), record_layout(&y));
        assert_ne!(
            packed_layout(&x),
            packed_layout(&y),
            "2^24 - 1 counts do not fit below 7 ms"
        );
        let sw = |n| Limit::sliding_window(n, m).unwrap();
        assert_ne!(packed_layout(&sw(5)), packed_layout(&sw(7)));
    }
}
