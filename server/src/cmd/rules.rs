//! `TURNSTILE.CHECK key_class key [cost] [priority]`, `TURNSTILE.PEEK key_class key
//! [priority]`, `TURNSTILE.REFUND key_class key [cost] [priority]`: the rules engine, through
//! the one check path of [`crate::check`]. With the counts in Redis the command cannot be
//! answered at once: [`RulesCommand::apply`] then hands the connection a [`RulesCall`] to
//! await (as a [`RemoteCall`](super::remote::RemoteCall)), whose reply [`reply`] writes.

use super::{ArgCursor, CmdError, Kind};
use crate::check::Checks;
use crate::check::{self, count, ms_up, Answer, Op};
use crate::metrics::Metrics;
use crate::metrics::C;
use crate::resp::Out;
use turnstile::rules::{Priority, Request};
use turnstile::Decision;

/// A parsed rules command.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RulesCommand<'a> {
    pub(crate) op: Op,
    pub(crate) class: &'a str,
    pub(crate) key: &'a str,
    pub(crate) cost: u64,
    pub(crate) priority: Option<Priority>,
}

impl<'a> RulesCommand<'a> {
    pub(crate) fn parse(kind: Kind, c: &mut ArgCursor<'a>) -> Result<Self, CmdError> {
        let op = match kind {
            Kind::Peek => Op::Peek,
            Kind::Refund => Op::Refund,
            _ => Op::Check,
        };
        let class = c.str("key class and key")?;
        let key = c.str("key class and key")?;
        let mut cost = if op == Op::Peek { 0 } else { 1 };
        if op != Op::Peek && c.has_more() {
            cost = match c.i64()? {
                n if n >= 0 => n as u64,
                _ => return Err(CmdError::NotPositive),
            };
        }
        let priority = c.next().map(super::priority).transpose()?;
        c.finish()?;
        Ok(Self {
            op,
            class,
            key,
            cost,
            priority,
        })
    }

    /// The engine's request.
    fn request(&self) -> Result<Request<'a>, CmdError> {
        let mut req = check::request(self.class, self.key).map_err(CmdError::Syntax)?;
        req.cost = self.cost;
        req.priority = self.priority;
        Ok(req)
    }

    /// Answers it with the counts in memory, or returns the call to await when they are in
    /// Redis.
    pub(crate) fn apply(&self, ctx: &super::Ctx<'_>, o: &mut Out<'_>) -> Option<RulesCall> {
        if ctx.checks.engine.is_none() {
            o.error_fmt(format_args!("ERR {}", check::NO_RULES));
            return None;
        }
        let req = match self.request() {
            Ok(r) => r,
            Err(e) => {
                o.error_fmt(format_args!("{e}"));
                return None;
            }
        };
        if ctx.checks.redis().is_some() {
            return Some(RulesCall {
                op: self.op,
                class: self.class.to_owned(),
                key: self.key.to_owned(),
                cost: self.cost,
                priority: self.priority,
                span: None,
            });
        }
        let t0 = ctx.metrics.now();
        let a = ctx.checks.local(self.op, &req);
        ctx.metrics.latency(ctx.metrics.now().saturating_sub(t0));
        reply(ctx.metrics, self.op, (self.class, self.key), a, o);
        None
    }
}

/// A rules command to decide in Redis.
pub(crate) struct RulesCall {
    pub(super) op: Op,
    pub(super) class: String,
    pub(super) key: String,
    cost: u64,
    priority: Option<Priority>,
    /// The command's span, when the spans are on.
    pub(super) span: Option<tracing::Span>,
}

impl RulesCall {
    /// Awaits Redis (its timeout and failure policy bound the wait).
    pub(super) async fn run(&self, checks: &Checks, metrics: &Metrics) -> Answer {
        let Some(redis) = checks.redis() else {
            // The backend went back to memory while this waited: answered there.
            return match check::request(&self.class, &self.key) {
                Ok(mut req) => {
                    req.cost = self.cost;
                    req.priority = self.priority;
                    checks.local(self.op, &req)
                }
                Err(m) => Answer::Failed(format!("ERR {m}")),
            };
        };
        let mut req = match check::request(&self.class, &self.key) {
            Ok(r) => r,
            Err(m) => return Answer::Failed(format!("ERR {m}")),
        };
        req.cost = self.cost;
        req.priority = self.priority;
        let t0 = metrics.now();
        let a = checks.remote(&redis, self.op, &req).await;
        metrics.latency(metrics.now().saturating_sub(t0));
        a
    }
}

/// An answer's reply: `[allowed, limit, remaining, retry_after_ms, reset_after_ms, rule]`
/// for a check or peek, the number of limits refunded for a refund. A denied check's key
/// (`(class, key)`, as sent) is recorded among the most denied.
pub(super) fn reply(
    metrics: &Metrics,
    op: Op,
    (class, key): (&str, &str),
    a: Answer,
    o: &mut Out<'_>,
) {
    match a {
        Answer::Failed(m) => o.error(&m),
        Answer::Limits(r) => super::limits::reply(r, o),
        Answer::Settled(r) => super::settle::reply(metrics, r, o),
        Answer::Refunded(n) => {
            metrics.add(C::Refunds, 1);
            o.int(i64::from(n));
        }
        Answer::Verdict(v) => {
            let d: &Decision = &v.decision;
            if crate::spans::on() {
                crate::spans::verdict(d.allowed(), class, v.rule.as_deref());
            }
            if op != Op::Peek {
                if !d.allowed() {
                    crate::denied::record_rules(v.rule.as_deref(), class, key);
                }
                metrics.add(
                    if d.allowed() {
                        C::CheckAllowed
                    } else {
                        C::CheckDenied
                    },
                    1,
                );
            }
            o.array(6);
            o.int(i64::from(d.allowed()));
            o.int(count(d.limit));
            o.int(count(d.remaining));
            o.int(d.retry_after_ns.map_or(-1, ms_up));
            o.int(ms_up(d.reset_after_ns));
            match &v.rule {
                Some(r) => o.bulk(r.as_bytes()),
                None => o.null(),
            }
        }
    }
}
