//! `TURNSTILE.EXPLAIN key_class key [cost] [priority]`: why `TURNSTILE.CHECK` with the same
//! arguments would be answered as it would, counting nothing ([`crate::explain`]). The reply is
//! a map (a flat array of names and values in RESP2): the check's fields (allowed, outcome,
//! limit, remaining, retry_after_ms, reset_after_ms, rule, shed), the cost and priority, who
//! decides (`decided_by`: rule and limit index), and `rules`, one map per matching rule.

use super::priority;
use super::{ArgCursor, CmdError, Ctx};
use crate::check;
use crate::explain::tree;
use crate::metrics::C;
use crate::resp::Out;
use turnstile::rules::Priority;

/// A parsed `TURNSTILE.EXPLAIN`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Explain<'a> {
    class: &'a str,
    key: &'a str,
    cost: u64,
    priority: Option<Priority>,
}

impl<'a> Explain<'a> {
    /// The arguments of `TURNSTILE.CHECK`.
    pub(crate) fn parse(c: &mut ArgCursor<'a>) -> Result<Self, CmdError> {
        let class = c.str("key class and key")?;
        let key = c.str("key class and key")?;
        let cost = match c.next() {
            None => 1,
            Some(b) => match super::parse_i64(b)? {
                n if n >= 0 => n as u64,
                _ => return Err(CmdError::NotPositive),
            },
        };
        let priority = c.next().map(priority).transpose()?;
        c.finish()?;
        Ok(Self {
            class,
            key,
            cost,
            priority,
        })
    }

    /// Explains it (with the counts in memory; refused with them in Redis).
    pub(crate) fn apply(&self, ctx: &Ctx<'_>, o: &mut Out<'_>) {
        let mut req = match check::request(self.class, self.key) {
            Ok(r) => r,
            Err(m) => return o.error_fmt(format_args!("ERR {m}")),
        };
        req.cost = self.cost;
        req.priority = self.priority;
        match ctx.checks.explanation(&req) {
            Ok(x) => {
                ctx.metrics.add(C::Explains, 1);
                tree(&x).resp(o);
            }
            Err(e) => o.error_fmt(format_args!("ERR {e}")),
        }
    }
}
