//! The library's replies as decisions: a decision is six integers, space-separated (outcome
//! 0 allowed, 1 limited, 2 never fits, -1 not asked; limit; remaining; reset after; retry
//! after, -1 for none; delay), in one bulk string (prelude.lua's `reply`).

use crate::error::Error;
use redis::Value;
use turnstile::{Decision, Outcome};

/// Six integers as a decision; `None` for outcome -1 (not asked); `Err` if they are not one.
pub(crate) fn decision(f: &[i64]) -> Result<Option<Decision>, ()> {
    let outcome = match f {
        [-1, ..] => return Ok(None),
        [0, ..] => Outcome::Allowed,
        [1, ..] => Outcome::Limited,
        [2, ..] => Outcome::NeverFits,
        _ => return Err(()),
    };
    let [_, limit, remaining, reset, retry, delay] = *f else {
        return Err(());
    };
    let u = |x: i64| x.max(0) as u64;
    Ok(Some(Decision {
        outcome,
        limit: u(limit),
        remaining: u(remaining),
        reset_after_ns: u(reset),
        retry_after_ns: (retry >= 0).then(|| u(retry)),
        delay_ns: u(delay),
    }))
}

/// A reply's text: a bulk string (or a status), else the server's error or `Reply`.
pub(crate) fn text(v: &Value) -> Result<&str, Error> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).map_err(|_| bad(v)),
        Value::SimpleString(s) => Ok(s),
        Value::ServerError(e) => Err(Error::Redis(e.clone().into())),
        _ => Err(bad(v)),
    }
}

pub(crate) fn bad(v: &Value) -> Error {
    Error::Reply(format!("{v:?}"))
}

/// The integers of a reply's text; `Err` at the first word that is not one.
pub(crate) fn integers(s: &str) -> impl Iterator<Item = Result<i64, ()>> + '_ {
    s.split(' ').map(|w| w.parse::<i64>().map_err(|_| ()))
}

/// A store's check reply: the decision, and after an acquire the permit's stamp (ns, decimal).
/// Six integers, or three for an admission without delay (limit, remaining, reset), each
/// perhaps followed by a stamp.
pub(crate) fn store(v: &Value) -> Result<(Decision, Option<String>), Error> {
    let s = text(v)?;
    let words: Vec<&str> = s.split(' ').collect();
    let (fields, stamp) = match words.len() {
        3 | 6 => (&words[..], None),
        4 | 7 => (&words[..words.len() - 1], words.last().copied()),
        _ => return Err(bad(v)),
    };
    let mut f = [0i64; 6];
    let at = if fields.len() == 3 {
        // Outcome 0 (allowed), no retry, no delay.
        f[4] = -1;
        1
    } else {
        0
    };
    for (x, w) in f[at..].iter_mut().zip(fields) {
        *x = w.parse().map_err(|_| bad(v))?;
    }
    let d = decision(&f).ok().flatten().ok_or_else(|| bad(v))?;
    let stamp = match stamp {
        Some(w) if !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()) => Some(w.to_string()),
        Some(_) => return Err(bad(v)),
        None => None,
    };
    Ok((d, stamp))
}

/// A rules check reply over `steps` steps: the first denier (0: none), then each step's
/// decision of its limits and of its pool (`None`: not asked).
pub(crate) type RulesReply = (u64, Vec<(Option<Decision>, Option<Decision>)>);

/// Parses a rules check reply for `steps` steps.
pub(crate) fn rules(v: &Value, steps: usize) -> Result<RulesReply, Error> {
    let f: Vec<i64> = integers(text(v)?)
        .collect::<Result<_, ()>>()
        .map_err(|_| bad(v))?;
    if f.len() != 1 + 12 * steps || f[0] < 0 {
        return Err(bad(v));
    }
    let mut out = Vec::with_capacity(steps);
    for s in f[1..].chunks_exact(12) {
        let main = decision(&s[..6]).map_err(|_| bad(v))?;
        let pool = decision(&s[6..]).map_err(|_| bad(v))?;
        out.push((main, pool));
    }
    Ok((f[0] as u64, out))
}

/// An integer reply (a refund's 0, a release's cells freed).
pub(crate) fn integer(v: &Value) -> Result<u64, Error> {
    match v {
        Value::Int(n) if *n >= 0 => Ok(*n as u64),
        Value::ServerError(e) => Err(Error::Redis(e.clone().into())),
        _ => Err(bad(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_store_reply_is_a_decision_and_perhaps_a_stamp() {
        let (d, st) = store(&bulk("5 4 937466324000")).unwrap();
        assert_eq!(d, store(&bulk("0 5 4 937466324000 -1 0")).unwrap().0);
        assert_eq!(d.outcome, Outcome::Allowed);
        assert_eq!(
            (d.limit, d.remaining, d.reset_after_ns),
            (5, 4, 937_466_324_000)
        );
        assert_eq!((d.retry_after_ns, d.delay_ns, st), (None, 0, None));
        let (d, st) = store(&bulk("1 3 0 10 7 0")).unwrap();
        assert_eq!((d.outcome, d.retry_after_ns), (Outcome::Limited, Some(7)));
        assert_eq!(st, None);
        let (d, _) = store(&bulk("2 3 0 10 -1 0")).unwrap();
        assert_eq!((d.outcome, d.retry_after_ns), (Outcome::NeverFits, None));
        let (_, st) = store(&bulk("0 10 9 86400 -1 0 1763986400000000000")).unwrap();
        assert_eq!(st.as_deref(), Some("1763986400000000000"));
        let (d, st) = store(&bulk("10 9 86400 1763986400000000000")).unwrap();
        assert_eq!(
            (d.remaining, st.as_deref()),
            (9, Some("1763986400000000000"))
        );
    }

    #[test]
    fn anything_else_is_an_error_naming_the_reply() {
        for bad in [
            "",
            "0 5",
            "0 5 4 9 -1",
            "0 5 4 9 -1 0 x",
            "0 5 4 9 -1 0 1 2",
            "7 5 4 9 -1 0",
            "-1 0 0 0 -1 0",
            "0 5 4 9.5 -1 0",
        ] {
            let e = store(&bulk(bad)).unwrap_err();
            assert!(matches!(e, Error::Reply(_)), "{bad:?}: {e}");
        }
        assert!(matches!(store(&Value::Int(0)), Err(Error::Reply(_))));
        let err = redis::parse_redis_value(b"-ERR boom\r\n").unwrap();
        assert!(matches!(store(&err), Err(Error::Redis(_))));
    }

    #[test]
    fn a_rules_reply_is_the_denier_and_two_decisions_a_step() {
        let v = bulk("2 0 5 4 9 -1 0 -1 0 0 0 -1 0 1 3 0 9 4 0 0 10 9 1 -1 0");
        let (denier, steps) = rules(&v, 2).unwrap();
        assert_eq!(denier, 2);
        assert_eq!(steps[0].0.unwrap().remaining, 4);
        assert!(steps[0].1.is_none());
        assert_eq!(steps[1].0.unwrap().retry_after_ns, Some(4));
        assert_eq!(steps[1].1.unwrap().remaining, 9);
        assert!(rules(&v, 1).is_err(), "a step count that does not match");
        assert!(rules(&bulk("-1"), 0).is_err());
    }

    #[test]
    fn decisions_clamp_nothing_but_negative_fields() {
        assert_eq!(decision(&[-1, 0, 0, 0, -1, 0]), Ok(None));
        assert_eq!(decision(&[3, 0, 0, 0, -1, 0]), Err(()));
        assert_eq!(decision(&[0, 1, 2]), Err(()));
        let d = decision(&[0, 5, -3, 7, -1, 2]).unwrap().unwrap();
        assert_eq!((d.remaining, d.reset_after_ns, d.delay_ns), (0, 7, 2));
    }
}
