//! The Lua scripts: one file per algorithm under `lua/`, composed per store into one script
//! (a value: its SHA is computed once; `EVALSHA`, reloaded on `NOSCRIPT`).
//!
//! A store's script is `prelude.lua`, the files of the algorithms its limits use, and
//! `driver.lua`, which decides several limits all-or-nothing in one call. Each file's header
//! states its KEYS, ARGV and reply. Lua numbers are doubles, so absolute times travel as
//! decimal strings and every duration must stay below [`MAX_DURATION_NS`].

use redis::Script;
use turnstile::{ConfigError, Limit, Limits};

const PRELUDE: &str = include_str!("../lua/prelude.lua");
const DRIVER: &str = include_str!("../lua/driver.lua");
const FIXED_WINDOW: &str = include_str!("../lua/fixed_window.lua");
const SLIDING_WINDOW: &str = include_str!("../lua/sliding_window.lua");
const TOKEN_BUCKET: &str = include_str!("../lua/token_bucket.lua");
const LEAKY_BUCKET: &str = include_str!("../lua/leaky_bucket.lua");

/// The longest window, period, τ or lease a script handles exactly: 2^52 ns (52 days). Lua's
/// doubles hold integers exactly below 2^53, and the scripts' arithmetic keeps every
/// intermediate under twice a duration.
pub const MAX_DURATION_NS: u64 = 1 << 52;

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

fn unsupported(l: &Limit) -> ConfigError {
    ConfigError::new(
        "algorithm",
        format!(
            "{} is not available on Redis yet; use fixed_window, sliding_window, token_bucket or leaky_bucket",
            l.algorithm()
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
        _ => return Err(unsupported(l)),
    })
}

/// The script for `limits`: the prelude, each algorithm used (once), the driver.
pub(crate) fn compose(limits: &Limits) -> Result<(Script, Vec<LimitArgs>), ConfigError> {
    let args = limits
        .limits()
        .iter()
        .map(limit_args)
        .collect::<Result<Vec<_>, _>>()?;
    let mut src = String::from(PRELUDE);
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
    src.push_str(DRIVER);
    Ok((Script::new(&src), args))
}
