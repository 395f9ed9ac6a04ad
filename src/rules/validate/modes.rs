//! The limits a rule's mode compiles to: soft scaling by its tolerance, an elastic rule's extra
//! pool.

use super::Loc;
use crate::algo::{Algorithm, LimitSpec, Limits};
use crate::rules::model::{Mode, MAX_LIMITS};

/// `percent` % of `n`, rounded down (saturating).
pub(crate) fn percent_of(n: u64, percent: u32) -> u64 {
    u64::try_from(n as u128 * percent as u128 / 100).unwrap_or(u64::MAX)
}

/// A soft limit: `n` plus `percent` % of it, rounded down (500 + 10 % = 550; 5 + 10 % = 5).
pub(crate) fn scaled(n: u64, percent: u32) -> u64 {
    n.saturating_add(percent_of(n, percent))
}

/// An elastic pool: `percent` % of `n`, rounded down but at least 1 when `n > 0`.
pub(crate) fn extra(n: u64, percent: u32) -> u64 {
    if n == 0 {
        0
    } else {
        percent_of(n, percent).max(1)
    }
}

/// The limits a store is built with for `spec` under `mode`: the enforced ones (scaled for
/// soft), and for elastic the extra pool.
pub(crate) fn effective(spec: &LimitSpec, mode: Mode) -> (LimitSpec, Option<LimitSpec>) {
    let scale = |p: u32| LimitSpec {
        limit: scaled(spec.limit, p),
        burst: spec.burst.map(|b| scaled(b, p)),
        ..spec.clone()
    };
    match mode {
        Mode::Soft { percent } => (scale(percent), None),
        Mode::Elastic { percent, .. } => {
            let pool = LimitSpec {
                limit: extra(spec.limit, percent),
                burst: spec.burst.map(|b| extra(b, percent)),
                ..spec.clone()
            };
            (spec.clone(), Some(pool))
        }
        Mode::Hard | Mode::Shadow => (spec.clone(), None),
    }
}

/// Compiled limits of a list of specs under a mode: (enforced, elastic pool).
pub(crate) fn compile_limits(
    specs: &[LimitSpec],
    mode: Mode,
    at: impl Fn(usize, &'static str) -> Loc,
    whole: Loc,
) -> Result<(Limits, Option<Limits>), (Loc, String)> {
    if specs.is_empty() {
        return Err((whole, "no limits: add at least one, e.g. limits = [{ algorithm = \"sliding_window\", limit = 100, window = \"1m\" }]".into()));
    }
    if specs.len() > MAX_LIMITS {
        return Err((
            whole,
            format!(
                "{} limits; at most {MAX_LIMITS} per rule: split the rule",
                specs.len()
            ),
        ));
    }
    let mut main = Vec::with_capacity(specs.len());
    let mut pool = Vec::new();
    for (j, s) in specs.iter().enumerate() {
        if s.algorithm == Algorithm::Concurrency {
            return Err((at(j, "algorithm"), "`concurrency` holds permits that must be released, which a rule check cannot do; use Limiter::acquire for it, or [load] max_in_flight with Engine::admit to bound requests in flight".into()));
        }
        let (m, p) = effective(s, mode);
        let scaled_note = |e: crate::ConfigError, what: &str| {
            let mut msg = e.message;
            if !what.is_empty() {
                msg.push_str(what);
            }
            (at(j, e.field), msg)
        };
        let note = match mode {
            Mode::Soft { percent } => {
                format!(" (soft_percent = {percent} scales it to {})", m.limit)
            }
            _ => String::new(),
        };
        main.push(m.build().map_err(|e| scaled_note(e, &note))?);
        if let Some(p) = p {
            let note = format!(" (the elastic pool is {} of it)", p.limit);
            pool.push(p.build().map_err(|e| scaled_note(e, &note))?);
        }
    }
    let main = Limits::new(main).map_err(|e| (whole, e.message))?;
    let pool = if pool.is_empty() {
        None
    } else {
        Some(Limits::new(pool).map_err(|e| (whole, e.message))?)
    };
    Ok((main, pool))
}
