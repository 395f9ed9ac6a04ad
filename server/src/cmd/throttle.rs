//! `CL.THROTTLE key max_burst count period [quantity]`: redis-cell's command, on the stores of
//! [`crate::throttle`].

use super::{ArgCursor, CmdError};
use crate::cmd::client::Session;
use crate::denied::{Source, DENIED};
use crate::metrics::C;
use crate::resp::Out;
use crate::throttle::{ArgError, Params, Throttles};

/// A parsed `CL.THROTTLE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Throttle<'a> {
    pub(crate) key: &'a [u8],
    /// `(max_burst, count, period)`.
    pub(crate) params: Params,
    pub(crate) quantity: i64,
}

impl From<ArgError> for CmdError {
    fn from(e: ArgError) -> Self {
        match e {
            ArgError::NotPositive => CmdError::NotPositive,
            ArgError::OutOfRange => CmdError::OutOfRange,
        }
    }
}

impl<'a> Throttle<'a> {
    // Inline: out of line (as other code in this module changed) the parse cost about 60
    // instructions more per pipelined command (callgrind, server/callgrind.sh).
    #[inline]
    pub(crate) fn parse(c: &mut ArgCursor<'a>) -> Result<Self, CmdError> {
        let key = c.bytes()?;
        let params = (c.i64()?, c.i64()?, c.i64()?);
        let quantity = match c.next() {
            Some(q) => super::parse_i64(q)?,
            None => 1,
        };
        c.finish()?;
        Ok(Self {
            key,
            params,
            quantity,
        })
    }

    /// Runs it; `id` is the key's id if the look-ahead hashed (and prefetched) it.
    pub(crate) fn apply(&self, t: &Throttles, s: &mut Session, id: Option<u64>, o: &mut Out<'_>) {
        match s.last.throttle(t, self.key, self.params, self.quantity, id) {
            Ok((c, t0)) => {
                s.tally.add(
                    if c.limited == 1 {
                        DENIED.record(Source::Throttle, &[self.key]);
                        C::ThrottleLimited
                    } else {
                        C::ThrottleAllowed
                    },
                    1,
                );
                o.ints(&c.as_array());
                let ns = s.last.stop(t, t0);
                s.tally.latency(ns);
            }
            // Refused before reaching a store: nothing was checked, nothing timed.
            Err(e) => o.error_fmt(format_args!("{}", CmdError::from(e))),
        }
    }
}
