//! The Lua scripts: one file per algorithm under `lua/`, composed per store into one script
//! (a value: its SHA is computed once; `EVALSHA`, reloaded on `NOSCRIPT`).
//!
//! A store's script is `fast.lua` (one fixed_window / token_bucket limit's check, before any
//! helper is built), `prelude.lua`, the files of the algorithms its limits use,
//! `limits.lua` (several limits all-or-nothing) and `driver.lua` (one key's call). The rules
//! engine's script ([`compose_rules`]) is the prelude, every algorithm a rule may use,
//! `limits.lua` and `rules.lua` (one request's matching rules in one call). Each file's header
//! states its KEYS, ARGV and reply. Lua numbers are doubles, so absolute times travel as
//! decimal strings and every duration must stay below [`MAX_DURATION_NS`].

use redis::Script;
use turnstile::{ConfigError, Limit, Limits};

const PRELUDE: &str = include_str!("../lua/prelude.lua");
const DRIVER: &str = include_str!("../lua/driver.lua");
const FAST: &str = include_str!("../lua/fast.lua");
const LIMITS: &str = include_str!("../lua/limits.lua");
const RULES: &str = include_str!("../lua/rules.lua");
const FIXED_WINDOW: &str = include_str!("../lua/fixed_window.lua");
const SLIDING_WINDOW: &str = include_str!("../lua/sliding_window.lua");
const TOKEN_BUCKET: &str = include_str!("../lua/token_bucket.lua");
const LEAKY_BUCKET: &str = include_str!("../lua/leaky_bucket.lua");
const ZSET: &str = include_str!("../lua/zset.lua");
const SLIDING_LOG: &str = include_str!("../lua/sliding_log.lua");
const CONCURRENCY: &str = include_str!("../lua/concurrency.lua");
const WINDOW_RING: &str = include_str!("../lua/window_ring.lua");

/// The longest window, period, τ or lease a script handles exactly: 2^52 ns (52 days). Lua's
/// doubles hold integers exactly below 2^53, and the scripts' arithmetic keeps every
/// intermediate under twice a duration.
pub const MAX_DURATION_NS: u64 = 1 << 52;

/// The longest sliding_log window and concurrency lease on Redis: 2^51 ns (26 days). Their
/// sorted sets score times after a base that moves up once a score passes 2^51
/// (`lua/zset.lua`), so a score plus a window stays below 2^53.
pub const MAX_ZSET_DURATION_NS: u64 = 1 << 51;

/// One limit as the script sees it: algorithm code, keys it takes, parameters.
#[derive(Clone, Debug)]
pub(crate) struct LimitArgs {
    pub(crate) code: &'static str,
    pub(crate) params: Vec<u64>,
}

fn too_long(field: &'static str, what: &str, ns: u64) -> ConfigError {
    ConfigError::new(
        field,
        format!(
            "{what} of {ns} ns is longer than the 2^52 ns (52 days) a Redis script computes exactly; shorten it or use the in-memory store"
        ),
    )
}

/// The script's parameters for `l`, or why Redis cannot run it.
pub(crate) fn limit_args(l: &Limit) -> Result<LimitArgs, ConfigError> {
    let check = |field, what, ns: u64| {
        if ns > MAX_DURATION_NS {
            Err(too_long(field, what, ns))
        } else {
            Ok(())
        }
    };
    Ok(match l {
        Limit::FixedWindow(p) => {
            check("window", "a window", p.window)?;
            LimitArgs {
                code: "fw",
                params: vec![p.limit, p.window, p.count_denied as u64],
            }
        }
        Limit::SlidingWindow(p) => {
            check("window", "a window", p.window)?;
            LimitArgs {
                code: "sw",
                params: vec![p.limit, p.window, p.count_denied as u64],
            }
        }
        Limit::TokenBucket(p) => {
            check("burst", "a bucket span (capacity x interval)", p.tau)?;
            LimitArgs {
                code: "tb",
                params: vec![p.capacity, p.interval, p.tau],
            }
        }
        Limit::LeakyBucket(p) => {
            check("burst", "a bucket span ((burst + 1) x interval)", p.tau)?;
            LimitArgs {
                code: "lb",
                params: vec![p.capacity(), p.interval, p.tau, p.free],
            }
        }
        Limit::SlidingLog(p) => {
            if p.window > MAX_ZSET_DURATION_NS {
                return Err(ConfigError::new(
                    "window",
                    format!("a sliding_log window of {} ns is longer than the 2^51 ns (26 days) a Redis sorted set scores exactly; shorten it or use the in-memory store", p.window),
                ));
            }
            LimitArgs {
                code: "sl",
                params: vec![p.limit, p.window, p.count_denied as u64, p.tick],
            }
        }
        Limit::WindowRing(p) => {
            // The ring spans N + 1 sub-windows; the script's arithmetic keeps that span exact.
            check(
                "window",
                "a ring of N + 1 sub-windows",
                p.sub.saturating_mul(p.buckets + 1),
            )?;
            LimitArgs {
                code: "wr",
                params: vec![
                    p.limit,
                    p.window,
                    p.count_denied as u64,
                    p.sub,
                    p.buckets,
                    p.max_count(),
                    (p.width as u64).div_ceil(8),
                ],
            }
        }
        Limit::Concurrency(p) => {
            if p.lease > MAX_ZSET_DURATION_NS {
                return Err(ConfigError::new(
                    "window",
                    format!("a concurrency lease of {} ns is longer than the 2^51 ns (26 days) a Redis sorted set scores exactly; shorten it or use the in-memory store", p.lease),
                ));
            }
            LimitArgs {
                code: "cc",
                params: vec![p.limit, p.lease],
            }
        }
    })
}

/// The script for `limits`: the prelude, each algorithm used (once), the driver.
pub(crate) fn compose(limits: &Limits) -> Result<(Script, Vec<LimitArgs>), ConfigError> {
    let args = limits
        .limits()
        .iter()
        .map(limit_args)
        .collect::<Result<Vec<_>, _>>()?;
    // fast.lua first: its check of one fixed_window / token_bucket limit returns before the
    // prelude's helpers are built; it declares the time driver.lua reuses.
    let mut src = String::from(FAST);
    src.push_str(PRELUDE);
    let mut add = |code: &str, text: &str| {
        if args.iter().any(|a| a.code == code) && !src.contains(text) {
            src.push_str(text);
        }
    };
    add("fw", FIXED_WINDOW);
    add("sw", SLIDING_WINDOW);
    // leaky_bucket reuses token_bucket's GCRA helpers.
    add("tb", TOKEN_BUCKET);
    add("lb", TOKEN_BUCKET);
    add("lb", LEAKY_BUCKET);
    add("sl", ZSET);
    add("cc", ZSET);
    add("sl", SLIDING_LOG);
    add("cc", CONCURRENCY);
    add("wr", WINDOW_RING);
    src.push_str(LIMITS);
    src.push_str(DRIVER);
    Ok((Script::new(&src), args))
}

/// The rules engine's script: every algorithm a rule may use (all but concurrency, which
/// rules refuse), `limits.lua` and `rules.lua`.
pub(crate) fn compose_rules() -> Script {
    let src = [
        PRELUDE,
        FIXED_WINDOW,
        SLIDING_WINDOW,
        TOKEN_BUCKET,
        LEAKY_BUCKET,
        ZSET,
        SLIDING_LOG,
        WINDOW_RING,
        LIMITS,
        RULES,
    ]
    .concat();
    Script::new(&src)
}
