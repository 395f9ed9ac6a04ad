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

use super::rules::priority;
use super::{ArgCursor, CmdError, Ctx};
use crate::check::{self, count, ms_up, Settled};
use crate::metrics::C;
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

    /// Settles it, with the counts in memory (with the counts in Redis: refused, nothing
    /// settled).
    pub(crate) fn apply(&self, ctx: &Ctx<'_>, o: &mut Out<'_>) {
        if ctx.checks.engine.is_none() {
            return o.error_fmt(format_args!("ERR {}", check::NO_RULES));
        }
        let mut req = match check::request(self.class, self.key) {
            Ok(r) => r,
            Err(m) => return o.error_fmt(format_args!("ERR {m}")),
        };
        req.cost = self.reserved;
        req.priority = self.priority;
        let t0 = ctx.metrics.now();
        let r = ctx.checks.settle(&req, self.actual);
        ctx.metrics.latency(ctx.metrics.now().saturating_sub(t0));
        match r {
            Ok(s) => {
                ctx.metrics.add(C::Settles, 1);
                reply(&s, o);
            }
            Err(e) => o.error_fmt(format_args!("ERR {e}")),
        }
    }
}

/// The reply of a settle (the module's doc says its fields).
fn reply(s: &Settled, o: &mut Out<'_>) {
    let d = &s.after.decision;
    o.array(6);
    o.int(i64::from(s.rules));
    o.int(count(s.charged));
    o.int(count(s.given_back));
    o.int(count(d.limit));
    o.int(count(d.remaining));
    o.int(ms_up(d.reset_after_ns));
}
