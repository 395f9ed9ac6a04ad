//! A RESP command within its request span (crate::spans): the path [`Connection::run_item`]
//! takes when the spans are on.

use super::{Args, Connection, RemoteCall};
use crate::cmd;

impl Connection {
    /// [`Self::run_item`] within the command's span, if sampled (crate::spans); a remote call
    /// carries the span on.
    #[cold]
    pub(super) fn run_item_spanned(&mut self, i: usize) -> Option<RemoteCall> {
        let item = &self.ahead.items[i];
        let args = Args {
            buf: &self.input[item.start..self.filled],
            ranges: &self.ahead.ranges[item.args.clone()],
        };
        if args.len() == 0 {
            return self.run_item_unspanned(i);
        }
        if !crate::spans::root_sampled() {
            return self.run_item_unspanned(i);
        }
        let name = cmd::lookup(args.name()).map_or("unknown", |s| s.name);
        let span = crate::spans::resp(name);
        let from = self.out.len();
        let mut call = span.in_scope(|| self.run_item_unspanned(i));
        if name == "CL.THROTTLE" {
            // Its reply says the decision (`*5`, then `:0` allowed or `:1` limited): read
            // there, so that the command itself pays nothing for its span.
            match self.out.get(from..from + 6) {
                Some(b"*5\r\n:0") => crate::spans::throttled(&span, false),
                Some(b"*5\r\n:1") => crate::spans::throttled(&span, true),
                _ => {}
            }
        }
        if let Some(c) = &mut call {
            c.carry(span);
        }
        call
    }
}
