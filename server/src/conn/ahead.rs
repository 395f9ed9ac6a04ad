//! Commands parsed ahead of running them: up to [`AHEAD`] of a pipeline at once, the keys of
//! their `CL.THROTTLE`s fetched into the cache before any of them runs.

use super::{Connection, AHEAD};
use crate::cmd::{self, Args, Command};
use crate::config::Access;
use crate::metrics::C;
use crate::resp::{parse_command, Out, Parsed};
use crate::throttle::LastStore;
use std::ops::Range;

/// A command parsed ahead: where its frame starts in the input buffer, its arguments' ranges
/// (relative to that start) in `Ahead::ranges`, and for a `CL.THROTTLE` its parsed arguments
/// and the key's id if it was prefetched.
pub(super) struct Item {
    pub(super) start: usize,
    /// Where its frame ends in the input buffer.
    pub(super) end: usize,
    pub(super) args: Range<usize>,
    pub(super) throttle: Option<(crate::throttle::Params, i64, Option<u64>)>,
}

#[derive(Default)]
pub(super) struct Ahead {
    pub(super) items: Vec<Item>,
    pub(super) next: usize,
    pub(super) ranges: Vec<Range<usize>>,
}

impl Connection {
    /// Parses the next commands of the input (up to [`AHEAD`] once authenticated, one
    /// before), prefetching the keys of `CL.THROTTLE`s. False when there is no whole command.
    pub(super) fn parse_ahead(&mut self) -> bool {
        self.ahead.items.clear();
        self.ahead.ranges.clear();
        self.ahead.next = 0;
        let most = if self.session.access == Access::None {
            1
        } else {
            AHEAD
        };
        let bounds = *self.bounds();
        let mut at = self.start;
        while self.ahead.items.len() < most && at < self.filled {
            let buf = &self.input[at..self.filled];
            match parse_command(buf, &bounds, &mut self.scratch) {
                Ok(Parsed::Incomplete) => break,
                Ok(Parsed::Command { consumed }) => {
                    let from = self.ahead.ranges.len();
                    self.ahead.ranges.extend_from_slice(&self.scratch);
                    let args = Args {
                        buf,
                        ranges: &self.scratch,
                    };
                    // A CL.THROTTLE outside a transaction: its arguments parsed now, its key
                    // prefetched (a malformed one is parsed again when it runs, to answer
                    // its error).
                    let throttle = (self.queue.is_none()
                        && self.session.access != Access::None
                        && args.len() >= 5
                        && cmd::named(args.name(), "CL.THROTTLE"))
                    .then(|| Command::parse(args).ok())
                    .flatten()
                    .and_then(|c| match c {
                        Command::Throttle(t) => Some((
                            t.params,
                            t.quantity,
                            Some(LastStore::prefetch(&self.srv.throttles, t.key)),
                        )),
                        _ => None,
                    });
                    self.ahead.items.push(Item {
                        start: at,
                        end: at + consumed,
                        args: from..self.ahead.ranges.len(),
                        throttle,
                    });
                    at += consumed;
                }
                Err(e) => {
                    if !self.ahead.items.is_empty() {
                        // Run what came before; the error is met again next time.
                        break;
                    }
                    self.srv.metrics.add(C::ProtocolErrors, 1);
                    tracing::debug!(conn = self.session.id, error = %e, "protocol error; closing");
                    let mut o = Out {
                        buf: &mut self.out,
                        proto: self.session.proto,
                    };
                    o.error_fmt(format_args!("ERR {e}"));
                    self.closing = true;
                    return false;
                }
            }
        }
        !self.ahead.items.is_empty()
    }
}
