//! The commands a connection cannot answer at once ([`RemoteCall`]): a rules check, a settle
//! with the counts in Redis, a `TURNSTILE.LIMITS` — awaited by the connection's driver, then
//! replied to.

use super::client::Session;
use super::limits::LimitsCall;
use super::rules::{reply, RulesCall};
use super::settle::SettleCall;
use crate::check::{Answer, Checks, Op};
use crate::metrics::Metrics;
use crate::resp::Out;

/// A command the connection cannot answer at once, which its driver awaits on a runtime
/// ([`RemoteCall::run`]): owned, so that the connection's buffers are free while it is awaited
/// (and a runtime without Redis's can send it to one that has).
pub(crate) enum RemoteCall {
    /// A rules command whose counts live in Redis.
    Rules(RulesCall),
    /// A `TURNSTILE.LIMITS`, run on a blocking thread (its source may wait for the network).
    Limits(LimitsCall),
    /// A `TURNSTILE.SETTLE` whose counts live in Redis.
    Settle(SettleCall),
}

impl RemoteCall {
    /// Awaits the answer (Redis's timeout and failure policy bound a rules call's wait).
    pub(crate) async fn run(&self, checks: &Checks, metrics: &Metrics) -> Answer {
        use tracing::Instrument;
        match self {
            RemoteCall::Rules(r) => match &r.span {
                Some(s) => r.run(checks, metrics).instrument(s.clone()).await,
                None => r.run(checks, metrics).await,
            },
            RemoteCall::Limits(l) => {
                Answer::Limits(crate::limits::run(checks.engine.clone(), l.0.clone()).await)
            }
            RemoteCall::Settle(s) => s.run(checks, metrics).await,
        }
    }

    /// Writes the answer of [`RemoteCall::run`].
    pub(crate) fn reply(&self, metrics: &Metrics, a: Answer, o: &mut Out<'_>, _s: &mut Session) {
        match (self, a) {
            (_, Answer::Limits(r)) => super::limits::reply(r, o),
            (_, Answer::Settled(r)) => super::settle::reply(metrics, r, o),
            (RemoteCall::Rules(r), a) => {
                let k = (r.class.as_str(), r.key.as_str());
                match &r.span {
                    Some(s) => s.in_scope(|| reply(metrics, r.op, k, a, o)),
                    None => reply(metrics, r.op, k, a, o),
                }
            }
            (RemoteCall::Limits(_), a) => reply(metrics, Op::Peek, ("", ""), a, o),
            (RemoteCall::Settle(_), a) => reply(metrics, Op::Check, ("", ""), a, o),
        }
    }

    /// Keeps the command's span (crate::spans) until the call is answered: the Redis calls
    /// are its children, its decision is recorded on it.
    pub(crate) fn carry(&mut self, span: tracing::Span) {
        if let RemoteCall::Rules(r) = self {
            r.span = Some(span);
        }
    }
}
