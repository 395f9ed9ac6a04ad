//! `TURNSTILE.SETTLE key_class key reserved actual [priority]`: a cost known only after the
//! work (tokens an LLM call took, rows a query scanned), settled against the cost a
//! `TURNSTILE.CHECK` reserved, on every rule the request matches ([`crate::check::Checks::settle`]).
//! The key, its class and the priority are read as `TURNSTILE.CHECK` reads them: send the same
//! ones, so that the same rules are settled.
//!
//! The reply, an array of 6: rules settled (0: none applies), charged, given back (the
//! difference in the request's units; each rule takes it times its `cost`), then where the key
//! stands right after it, as `TURNSTILE.PEEK` reads it: limit (-1: no rule applies), remaining,
//! reset_after_ms. A charge past a limit is a debt: remaining stays 0 and the reset moves past
//! the window until it has been paid, and checks are denied until then.
//!
//! With the counts in Redis the settle cannot be answered at once: [`Settle::apply`] hands the
//! connection a [`SettleCall`] to await (every rule settled in one call on one node).

use super::priority;
use super::{ArgCursor, CmdError, Ctx};
use crate::check::{self, count, ms_up, Answer, Checks, SettleError, Settled};
use crate::metrics::{Metrics, C};
use crate::resp::Out;
use turnstile::rules::Priority;

/// A parsed `TURNSTILE.SETTLE`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settle<'a> {
    class: &'a str,
    key: &'a str,
    reserved: u64,
    actual: u64,
    priority: Option<Priority>,
}

/// A count argument: an integer, not negative.
fn units(c: &mut ArgCursor<'_>) -> Result<u64, CmdError> {
    match c.i64()? {
        n if n >= 0 => Ok(n as u64),
        _ => Err(CmdError::NotPositive),
    }
}

impl<'a> Settle<'a> {
    pub(crate) fn parse(c: &mut ArgCursor<'a>) -> Result<Self, CmdError> {
        let class = c.str("key class and key")?;
        let key = c.str("key class and key")?;
        let reserved = units(c)?;
        let actual = units(c)?;
        let priority = c.next().map(priority).transpose()?;
        c.finish()?;
        Ok(Self {
            class,
            key,
            reserved,
            actual,
            priority,
        })
    }

    /// Settles it with the counts in memory, or returns the call to await when they are in
    /// Redis.
    pub(crate) fn apply(&self, ctx: &Ctx<'_>, o: &mut Out<'_>) -> Option<SettleCall> {
        if ctx.checks.engine.is_none() {
            o.error_fmt(format_args!("ERR {}", check::NO_RULES));
            return None;
        }
        let mut req = match check::request(self.class, self.key) {
            Ok(r) => r,
            Err(m) => {
                o.error_fmt(format_args!("ERR {m}"));
                return None;
            }
        };
        if ctx.checks.redis().is_some() {
            return Some(SettleCall {
                class: self.class.to_owned(),
                key: self.key.to_owned(),
                reserved: self.reserved,
                actual: self.actual,
                priority: self.priority,
            });
        }
        req.cost = self.reserved;
        req.priority = self.priority;
        let t0 = ctx.metrics.now();
        let r = ctx.checks.settle(&req, self.actual);
        ctx.metrics.latency(ctx.metrics.now().saturating_sub(t0));
        reply(ctx.metrics, r, o);
        None
    }
}

/// A settle to make in Redis (owned: the connection's buffers are free while it is awaited).
pub(crate) struct SettleCall {
    class: String,
    key: String,
    reserved: u64,
    actual: u64,
    priority: Option<Priority>,
}

impl SettleCall {
    /// Awaits Redis (its timeout bounds the wait); settled in memory if the backend went back
    /// there meanwhile.
    pub(crate) async fn run(&self, checks: &Checks, metrics: &Metrics) -> Answer {
        let mut req = match check::request(&self.class, &self.key) {
            Ok(r) => r,
            Err(m) => return Answer::Failed(format!("ERR {m}")),
        };
        req.cost = self.reserved;
        req.priority = self.priority;
        let t0 = metrics.now();
        let r = match checks.redis() {
            Some(redis) => checks.settle_remote(&redis, &req, self.actual).await,
            None => checks.settle(&req, self.actual),
        };
        metrics.latency(metrics.now().saturating_sub(t0));
        Answer::Settled(r)
    }
}

/// The reply of a settle (the module's doc says its fields), or its error.
pub(crate) fn reply(metrics: &Metrics, r: Result<Settled, SettleError>, o: &mut Out<'_>) {
    match r {
        Ok(s) => {
            metrics.add(C::Settles, 1);
            fields(&s, o);
        }
        Err(e) => o.error_fmt(format_args!("ERR {e}")),
    }
}

fn fields(s: &Settled, o: &mut Out<'_>) {
    let d = &s.after.decision;
    o.array(6);
    o.int(i64::from(s.rules));
    o.int(count(s.charged));
    o.int(count(s.given_back));
    o.int(count(d.limit));
    o.int(count(d.remaining));
    o.int(ms_up(d.reset_after_ns));
}
