//! The one path of a rules check, shared by RESP (`TURNSTILE.CHECK`, `PEEK`, `REFUND`,
//! `SETTLE`) and HTTP (`POST /v1/check`, `POST /v1/settle`): the request built from a key class
//! and a key ([`request`]), then decided by the rules engine with its counts in memory or in
//! Redis ([`Checks`]). The transports only read their own framing and write their own replies.

use crate::backend::{Backends, Remote};
use crate::snapshot::RulesEngine;
use std::net::IpAddr;
use std::sync::Arc;
use turnstile::rules::{parse_customer, Request, Verdict};
use turnstile_redis::RedisRules;

/// Which rules operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Decide and count.
    Check,
    /// Decide without counting.
    Peek,
    /// Give back what an admitted request took.
    Refund,
}

/// What an operation answered.
pub(crate) enum Answer {
    /// A check's or peek's verdict.
    Verdict(Verdict),
    /// How many limits a refund gave back to.
    Refunded(u32),
    /// Why it could not be done (the reply's text, code first).
    Failed(String),
    /// What a `TURNSTILE.LIMITS` did.
    Limits(Result<crate::limits::Done, crate::limits::Refused>),
    /// What a settle did.
    Settled(Result<Settled, SettleError>),
}

/// The rules engine and where its counts live.
pub(crate) struct Checks {
    /// Shared with the work that runs beside a check (keys' own limits, on the blocking pool).
    pub(crate) engine: Option<Arc<RulesEngine>>,
    pub(crate) backends: Backends,
}

/// The error of a rules operation on a server started without rules.
pub(crate) const NO_RULES: &str = "no rules loaded: start the server with --rules FILE";

/// What [`Checks::settle`] did, and where the key stands after it.
pub(crate) struct Settled {
    /// How many rules were settled (0: none applies to the request).
    pub(crate) rules: u32,
    /// The difference charged (the actual cost above the reserved one), in the request's units
    /// (each rule takes it times its `cost`); 0 when no rule applies.
    pub(crate) charged: u64,
    /// The difference given back (the actual cost below the reserved one), likewise.
    pub(crate) given_back: u64,
    /// What a peek (cost 0) answers right after the settle: the limit with the least left,
    /// its remaining (0 while the key owes a charge past its limit), and when every limit is
    /// idle again (a debt pushes it past the window). Its `allowed` is a cost-0 request's,
    /// always admitted: not an answer for the next request, and not sent.
    pub(crate) after: Verdict,
}

/// Why a settle was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SettleError {
    /// The server has no rules.
    NoRules,
    /// The rules' counts are in Redis, which did not take the settle (its error).
    Redis(String),
}

impl std::fmt::Display for SettleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettleError::NoRules => f.write_str(NO_RULES),
            SettleError::Redis(e) => write!(
                f,
                "the settle did not reach Redis: {e}; nothing was settled there, send it again"
            ),
        }
    }
}

impl Checks {
    /// The Redis backend, if the rules keep their counts there.
    #[inline]
    pub(crate) fn redis(&self) -> Option<Remote> {
        self.engine.as_ref()?;
        self.backends.redis()
    }

    /// `op` on `req` with the counts in memory (the caller has seen [`Checks::redis`] is
    /// `None`).
    pub(crate) fn local(&self, op: Op, req: &Request<'_>) -> Answer {
        let Some(engine) = &self.engine else {
            return Answer::Failed(format!("ERR {NO_RULES}"));
        };
        match op {
            Op::Refund => Answer::Refunded(engine.refund(req)),
            Op::Check | Op::Peek => Answer::Verdict(engine.explain(req)),
        }
    }

    /// Settles `req`, checked (and admitted) at a reserved cost of `req.cost`, at `actual`
    /// with the counts in memory (the caller has seen [`Checks::redis`] is `None`;
    /// [`turnstile::rules::Engine::settle`]: the difference charged or given back on every
    /// rule the request matches), then peeks at the key.
    pub(crate) fn settle(&self, req: &Request<'_>, actual: u64) -> Result<Settled, SettleError> {
        let engine = self.engine.as_ref().ok_or(SettleError::NoRules)?;
        let rules = engine.settle(req, actual);
        let after = engine.explain(&Request { cost: 0, ..*req });
        Ok(settled(req, actual, rules, after))
    }

    /// [`Checks::settle`] with the counts in Redis ([`RedisRules::settle`]: every rule in one
    /// call on one node), then a peek through Redis. An error if Redis did not take it, or
    /// has not been reached since the start.
    pub(crate) async fn settle_remote(
        &self,
        redis: &Remote,
        req: &Request<'_>,
        actual: u64,
    ) -> Result<Settled, SettleError> {
        let engine = self.engine.as_ref().ok_or(SettleError::NoRules)?;
        let redis: &RedisRules = match redis {
            Remote::Connected(r) => r,
            Remote::Connecting(_) => {
                return Err(SettleError::Redis(
                    "Redis has not been reached since the start (connecting in the background)"
                        .into(),
                ))
            }
        };
        let rules = redis
            .settle(engine, req, actual)
            .await
            .map_err(|e| SettleError::Redis(e.to_string()))?;
        let after = redis.explain(engine, &Request { cost: 0, ..*req }).await;
        Ok(settled(req, actual, rules, after))
    }

    /// `op` on `req` with the counts in Redis: the check awaits Redis (the backend's timeout,
    /// then its failure policy answers); a refund Redis does not take is an error.
    /// While the backend is still connecting, its failure policy answers a check, and a
    /// refund is an error.
    pub(crate) async fn remote(&self, redis: &Remote, op: Op, req: &Request<'_>) -> Answer {
        let Some(engine) = &self.engine else {
            return Answer::Failed(format!("ERR {NO_RULES}"));
        };
        match op {
            Op::Refund => match redis.refund(engine, req).await {
                Ok(n) => Answer::Refunded(n),
                Err(e) => Answer::Failed(format!("ERR the refund did not reach Redis: {e}")),
            },
            Op::Check | Op::Peek => Answer::Verdict(redis.explain(engine, req).await),
        }
    }
}

/// What a settle of `req` at `actual` did to `rules` rules, and the peek after it.
fn settled(req: &Request<'_>, actual: u64, rules: u32, after: Verdict) -> Settled {
    let (charged, given_back) = match rules {
        0 => (0, 0),
        _ => (
            actual.saturating_sub(req.cost),
            req.cost.saturating_sub(actual),
        ),
    };
    Settled {
        rules,
        charged,
        given_back,
        after,
    }
}

/// A count for a reply: -1 for "no limit" (`u64::MAX`).
pub(crate) fn count(v: u64) -> i64 {
    if v > i64::MAX as u64 {
        -1
    } else {
        v as i64
    }
}

/// A decision's milliseconds, rounded up.
pub(crate) fn ms_up(ns: u64) -> i64 {
    ns.div_ceil(1_000_000).min(i64::MAX as u64) as i64
}

/// A request from a key class (`customer`, `ip`, `api_key`, `route`, `method`, or parts joined
/// by `+`) and a key (parts joined by `|`). Errors say what is wrong. Allocates nothing unless
/// the request is wrong.
pub(crate) fn request<'a>(class: &str, key: &'a str) -> Result<Request<'a>, String> {
    let n = class.split('+').count();
    let k = if n == 1 { 1 } else { key.split('|').count() };
    if n != k {
        return Err(format!(
            "key class `{class}` has {n} parts but the key `{key}` has {k} (separate them with `|`)"
        ));
    }
    let mut r = Request::new();
    let mut keys = key.split('|');
    for p in class.split('+') {
        let k = if n == 1 {
            key
        } else {
            keys.next().unwrap_or_default()
        };
        match p {
            "customer" => r.customer = Some(parse_customer(k).map_err(|e| e.to_string())?),
            "ip" => {
                r.ip = Some(k.parse::<IpAddr>().map_err(|_| format!("`{k}` is not an IP address"))?)
            }
            "api_key" => r.api_key = Some(k),
            "route" => r.route = Some(k),
            "method" => r.method = Some(k),
            _ => {
                return Err(format!(
                    "unknown key class `{p}`; expected customer, ip, api_key, route, method, or parts joined by `+`"
                ))
            }
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn customers_are_never_merged() {
        assert_eq!(parse_customer("241531"), Ok(241531));
        assert_eq!(parse_customer("0"), Ok(0));
        assert_eq!(parse_customer("18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "user:1",
            "org:1",
            "01",
            "00",
            "",
            "-1",
            "+1",
            "1.0",
            " 1",
            "18446744073709551616",
        ] {
            let e = parse_customer(bad).unwrap_err().to_string();
            assert!(e.contains("api_key"), "{bad}: {e}");
        }
    }

    #[test]
    fn requests() {
        let r = request("customer+route", "42|/v1/x").unwrap();
        assert_eq!((r.customer, r.route), (Some(42), Some("/v1/x")));
        assert!(request("customer+route", "42").is_err());
        assert!(request("ip", "nope").is_err());
        assert!(request("planet", "x")
            .unwrap_err()
            .contains("unknown key class"));
        assert_eq!(
            request("api_key", "user:1").unwrap().api_key,
            Some("user:1")
        );
    }
}
