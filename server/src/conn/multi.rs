//! Transactions: an open `MULTI`'s queue, bounded, and `EXEC` running it one command at a
//! time.

use super::{Connection, BUDGET_STEP, MAX_QUEUED, QUEUE_FREE};
use crate::cmd::remote::RemoteCall;
use crate::cmd::session::Effect;
use crate::cmd::{self, Args, CmdError, Command};
use crate::resp::Out;
use crate::state::Server;
use std::ops::Range;

/// An open `MULTI`: the queued commands' arguments, copied out of the input buffer.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) bytes: Vec<u8>,
    pub(super) ranges: Vec<Range<usize>>,
    /// Per command, its arguments in `ranges`.
    pub(super) commands: Vec<Range<usize>>,
    /// A command was refused at queue time: `EXEC` aborts.
    pub(super) dirty: bool,
    /// Bytes of the deferred budget it holds.
    pub(super) reserved: usize,
}

/// What a queued command holds beyond its arguments' bytes: a range per argument, and one.
pub(super) const RANGE: usize = std::mem::size_of::<Range<usize>>();

impl Queue {
    /// Bytes the queued commands hold: their arguments, and a range per argument and per
    /// command (16 bytes each: 8 times the bytes of a `PING`).
    pub(super) fn size(&self) -> usize {
        self.bytes.len() + (self.ranges.len() + self.commands.len()) * RANGE
    }

    /// What its vectors have allocated.
    pub(super) fn capacity(&self) -> usize {
        self.bytes.capacity() + (self.ranges.capacity() + self.commands.capacity()) * RANGE
    }
}

impl Connection {
    /// `MULTI`: opens a transaction (not within one).
    pub(super) fn multi(&mut self) -> Option<RemoteCall> {
        let mut o = Out {
            buf: &mut self.out,
            proto: self.session.proto,
        };
        if self.queue.is_some() {
            o.error("ERR MULTI calls can not be nested");
        } else {
            self.queue = Some(Queue::default());
            self.session.in_multi = true;
            o.simple("OK");
        }
        None
    }

    /// `EXEC`: runs the transaction's commands from the next turn on, or discards it if one
    /// of them was refused.
    pub(super) fn start_exec(&mut self) -> Option<RemoteCall> {
        let mut o = Out {
            buf: &mut self.out,
            proto: self.session.proto,
        };
        match self.queue.take() {
            None => o.error("ERR EXEC without MULTI"),
            Some(q) if q.dirty => {
                self.srv.buffers.release(q.reserved);
                self.session.in_multi = false;
                o.error("EXECABORT Transaction discarded because of previous errors.");
            }
            Some(q) => {
                o.array(q.commands.len());
                self.queue = Some(q);
                self.exec = Some(0);
            }
        }
        None
    }

    /// `DISCARD`: drops the transaction.
    pub(super) fn discard(&mut self) -> Option<RemoteCall> {
        let mut o = Out {
            buf: &mut self.out,
            proto: self.session.proto,
        };
        match self.queue.take() {
            None => o.error("ERR DISCARD without MULTI"),
            Some(q) => {
                self.srv.buffers.release(q.reserved);
                self.session.in_multi = false;
                o.simple("OK");
            }
        }
        None
    }

    /// An `EXEC` that could not be parsed: as Redis, it discards the transaction (if one is
    /// open).
    pub(super) fn abort_exec(&mut self) {
        if let Some(q) = self.queue.take() {
            self.srv.buffers.release(q.reserved);
        }
        self.session.in_multi = false;
        Out {
            buf: &mut self.out,
            proto: self.session.proto,
        }
        .error("EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command");
    }

    /// Runs queued command `next` of an `EXEC`; a remote call if it needs Redis.
    pub(super) fn exec_one(&mut self, next: usize) -> Option<RemoteCall> {
        let Some(q) = &self.queue else {
            self.exec = None;
            return None;
        };
        let Some(cmd) = q.commands.get(next).cloned() else {
            // Done: the transaction is over.
            let q = self.queue.take().expect("checked above");
            self.srv.buffers.release(q.reserved);
            self.session.in_multi = false;
            self.exec = None;
            self.account();
            return None;
        };
        self.exec = Some(next + 1);
        let args = Args {
            buf: &q.bytes,
            ranges: &q.ranges[cmd],
        };
        let srv = &*self.srv;
        let s = &mut self.session;
        s.last.unmark();
        let mut o = Out {
            buf: &mut self.out,
            proto: s.proto,
        };
        match Command::parse(args) {
            Err(e) => {
                e.write(args, &mut o);
                None
            }
            Ok(c) => {
                let (call, effect) = c.apply(&srv.ctx(), s, &mut o);
                // QUIT and RESET run at once, never queued; nothing else has an effect.
                debug_assert_eq!(effect, Effect::None);
                call
            }
        }
    }
}

/// Queues a command of an open `MULTI`, or refuses it (and dirties the transaction) as Redis
/// refuses one at queue time: an unknown command, a wrong number of arguments by the command's
/// arity, an unknown subcommand or a subcommand's wrong number of arguments (Redis looks
/// subcommands up as commands); or a queue that is full. Any other error is the command's
/// own, answered by `EXEC` (`PING a b` is queued: its arity is "at least one").
pub(super) fn queue(srv: &Server, q: &mut Queue, args: Args<'_>, o: &mut Out<'_>) {
    let refused = match cmd::lookup(args.name()) {
        None => Some(CmdError::Unknown),
        Some(spec) if !spec.arity_fits(args.len()) => Some(CmdError::WrongArgs),
        Some(spec) => match Command::parse_as(spec, args) {
            Err(e @ (CmdError::UnknownSubcommand | CmdError::SubcommandArgs(_))) => Some(e),
            _ => None,
        },
    };
    if let Some(e) = refused {
        q.dirty = true;
        e.write(args, o);
        return;
    }
    let size = (0..args.len()).map(|i| args.get(i).len()).sum::<usize>() + (args.len() + 1) * RANGE;
    let after = q.size() + size;
    let over = after.saturating_sub(QUEUE_FREE);
    let fits = q.commands.len() < MAX_QUEUED
        && after <= srv.resp.output_limit
        && (over <= q.reserved || {
            let more = (over - q.reserved).div_ceil(BUDGET_STEP) * BUDGET_STEP;
            srv.buffers.reserve(more) && {
                q.reserved += more;
                true
            }
        });
    if !fits {
        q.dirty = true;
        o.error_fmt(format_args!(
            "ERR the transaction is too large: at most {MAX_QUEUED} commands and {} bytes queued (arguments, and 16 per argument and per command) between MULTI and EXEC (--client-output-limit); send it in parts",
            srv.resp.output_limit
        ));
        return;
    }
    let from = q.ranges.len();
    for i in 0..args.len() {
        let s = q.bytes.len();
        q.bytes.extend_from_slice(args.get(i));
        q.ranges.push(s..q.bytes.len());
    }
    q.commands.push(from..q.ranges.len());
    o.simple("QUEUED");
}
