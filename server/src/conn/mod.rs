//! A RESP connection as a state machine over bytes in and bytes out, apart from any runtime
//! (sans-IO, as quinn-proto and h2's codec are): a driver reads into [`Connection::read_buf`],
//! calls [`Connection::run`], writes [`Connection::output`] and reports it with
//! [`Connection::wrote`]; a rules command whose counts live in Redis comes back as
//! [`Step::Remote`], which the driver awaits and hands back with [`Connection::resume`].
//! [`serve`] drives it over a tokio socket, [`uring`] many over io_uring (Linux); the tests and the fuzz target drive it with bytes.
//!
//! # Bounds
//!
//! Everything a client can make the connection hold is bounded, whatever it sends:
//!
//! * **Input**: at most one command's frame beyond what has been answered. A frame is bounded
//!   by the listener's [`Bounds`] (at the defaults 16 arguments of 4 KiB, so
//!   [`Bounds::max_frame`] ≈ 66 KiB); the buffer starts at 4 KiB, grows to 16 KiB for a busy
//!   pipeline and to a whole frame only for a frame that long, and shrinks back once it is
//!   answered. Before authentication the bounds are [`Bounds::UNAUTHENTICATED`] and the buffer
//!   stays within 16 KiB: only `AUTH`, `HELLO`, `QUIT` and `RESET` are run, one at a time;
//!   every other command is answered `NOAUTH` without being parsed further.
//! * **Output**: replies are written as they are produced. While more than
//!   [`OUTPUT_PAUSE`] (16 KiB) waits for the client, the connection stops reading and runs no
//!   command, unless the server-wide deferred budget (`Buffers`) lends it room: so that an
//!   honest client that sends a long pipeline before it reads its replies is not stalled. A
//!   connection whose waiting output passes the listener's output limit
//!   (`--client-output-limit`) is closed, as Redis closes a client past its
//!   client-output-buffer-limit; one reply is at most a few KiB (the largest is `COMMAND`'s).
//! * **Transactions**: a `MULTI` queue holds at most [`MAX_QUEUED`] commands; beyond
//!   [`QUEUE_FREE`] bytes (arguments, and 16 bytes of bookkeeping per argument and per
//!   command) it too borrows from the deferred budget, and a command it cannot
//!   queue is refused (the transaction then aborts at `EXEC`, as Redis aborts one with a
//!   command refused at queue time).
//!
//! Commands parsed from a pipeline read at once are parsed [`AHEAD`] at a time, and the keys
//! of their `CL.THROTTLE`s fetched into the cache before any of them runs, so that their
//! misses to memory overlap (at 1M keys about 40 % of a pipelined command's time was the
//! store's table missing the cache; docs/service.md). Each command is parsed once.

use crate::check::Answer;
use crate::cmd::remote::RemoteCall;
use crate::cmd::session::Effect;
use crate::cmd::throttle::Throttle;
use crate::cmd::{self, Args, Command};
use crate::config::Access;
use crate::metrics::{Tally, C};
use crate::resp::{Bounds, Out, Proto};
use crate::state::Server;
use crate::throttle::LastStore;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

mod ahead;
#[doc(hidden)]
pub mod fuzz;
mod multi;
mod output;
pub(crate) mod serve;
mod spanned;
#[cfg(target_os = "linux")]
pub(crate) mod uring;

pub(crate) use crate::cmd::client::{BufferStats, Session};
use ahead::Ahead;
#[cfg(test)]
use multi::RANGE;
use multi::{queue, Queue};

/// Output waiting for the client past which the connection stops reading and running
/// commands (unless the deferred budget lends it room).
pub(crate) const OUTPUT_PAUSE: usize = 16 * 1024;
/// Bytes of queued `MULTI` commands a connection holds without borrowing from the budget.
pub(crate) const QUEUE_FREE: usize = 16 * 1024;
/// The most commands one `MULTI` queues.
pub(crate) const MAX_QUEUED: usize = 10_000;
/// Commands parsed ahead of running them.
pub(crate) const AHEAD: usize = 32;
/// Commands one run answers before the driver gives other connections a turn: a client that
/// sends 16 KiB of `PING`s (2 700 commands) must not hold a worker while an honest client's
/// one command waits behind it. At about 0.1 µs a command, a turn is some 6 µs; a pipeline of
/// 16 runs in one.
pub(crate) const RUN_MAX: usize = 64;
/// The input buffer's first size.
const INPUT_START: usize = 4096;
/// The input buffer's size for a busy pipeline; beyond it only for a longer frame.
const INPUT_BUSY: usize = 16 * 1024;
/// The deferred budget is borrowed in steps of this.
const BUDGET_STEP: usize = 64 * 1024;
/// The longest reply of one command but `ECHO`/`PING` (which echo an argument): `COMMAND`
/// and `COMMAND DOCS` of every command are the longest (a test holds them to it).
pub(crate) const MAX_REPLY: usize = 16 * 1024;
/// What a connection holds besides its buffers: its state, the commands parsed ahead, its
/// task (TLS adds rustls's buffers: see docs/service.md).
const FIXED: usize = 16 * 1024;

/// The most bytes one connection of a listener with `bounds` holds without borrowing from the
/// deferred budget: its input buffer (a whole frame), its output ([`OUTPUT_PAUSE`] and one
/// reply), a `MULTI` queue's own allowance, and its fixed part.
pub(crate) fn max_bytes(bounds: &Bounds) -> usize {
    INPUT_BUSY.max(bounds.max_frame())
        + OUTPUT_PAUSE
        + MAX_REPLY.max(bounds.max_bulk + 32)
        + QUEUE_FREE
        + FIXED
}

/// What the driver does next.
pub(crate) enum Step {
    /// Write the output, then read (if [`Connection::wants_read`]) or wait for the output to
    /// drain, and run again.
    Wait,
    /// Await this call ([`RemoteCall::run`]), then [`Connection::resume`] with its answer.
    Remote(RemoteCall),
    /// Write the output that is left (bounded in time), then close.
    Close,
    /// [`RUN_MAX`] commands were answered and more wait: write the output, give the other
    /// connections a turn, then run again (without waiting for input).
    Yield,
}

/// A RESP connection (module docs).
pub(crate) struct Connection {
    srv: Arc<Server>,
    /// Input; `input[start..filled]` is not yet answered; `input.len()` is its capacity (all
    /// initialized, so that a driver can read into it as a slice).
    input: Vec<u8>,
    start: usize,
    filled: usize,
    /// Output; `output[written..]` waits for the client.
    out: Vec<u8>,
    written: usize,
    /// Bytes of the deferred budget the output holds.
    out_reserved: usize,
    /// The driver could not write all the output: the client is not reading as fast as the
    /// connection answers (only then does it borrow from the deferred budget).
    blocked: bool,
    scratch: Vec<Range<usize>>,
    ahead: Ahead,
    session: Session,
    queue: Option<Queue>,
    /// An `EXEC` in progress: the next queued command to run.
    exec: Option<usize>,
    /// A remote call is out: nothing else runs until [`Connection::resume`].
    parked: bool,
    /// Close once the output is written.
    closing: bool,
    /// Buffer capacity reported to the server's gauge.
    accounted: usize,
    /// The longest reply of one command here ([`Connection::reply_max`]).
    reply: usize,
}

impl Connection {
    /// A new connection of the RESP listener of `srv`.
    pub(crate) fn new(
        srv: Arc<Server>,
        id: u64,
        peer: Option<SocketAddr>,
        local: Option<SocketAddr>,
    ) -> Self {
        let access = srv.resp.auth.initial(srv.resp.trusted);
        let mut c = Self {
            input: vec![0; INPUT_START],
            start: 0,
            filled: 0,
            out: Vec::new(),
            written: 0,
            out_reserved: 0,
            blocked: false,
            scratch: Vec::new(),
            ahead: Ahead::default(),
            session: Session {
                proto: Proto::Resp2,
                access,
                id,
                name: Vec::new(),
                lib_name: Vec::new(),
                lib_ver: Vec::new(),
                peer,
                local,
                since: Instant::now(),
                last: LastStore::default(),
                tally: Tally::default(),
                in_multi: false,
                fd: None,
                buffers: BufferStats::default(),
                auth_failures: 0,
            },
            queue: None,
            exec: None,
            parked: false,
            closing: false,
            accounted: 0,
            reply: Self::reply_for(srv.resp.bounds.max_bulk),
            srv,
        };
        c.account();
        c
    }

    fn bounds(&self) -> &Bounds {
        if self.session.access == Access::None {
            &self.srv.resp.unauthenticated
        } else {
            &self.srv.resp.bounds
        }
    }

    /// The input buffer's largest size now.
    fn max_input(&self) -> usize {
        if self.session.access == Access::None {
            INPUT_BUSY
        } else {
            INPUT_BUSY.max(self.srv.resp.bounds.max_frame())
        }
    }

    /// Bytes waiting for the client.
    pub(crate) fn pending(&self) -> usize {
        self.out.len() - self.written
    }

    /// Whether the connection would read now: not closing, not awaiting Redis, and not paused
    /// by output its client has not read.
    pub(crate) fn wants_read(&self) -> bool {
        !self.closing
            && !self.parked
            && (self.pending() < OUTPUT_PAUSE
                || (self.blocked && self.out.len() + self.reply_max() <= self.out.capacity()))
    }

    /// The driver could not write all of [`Connection::output`] now (the client's receive
    /// window or the kernel's send buffer is full).
    /// Returns whether it is news (the driver then runs the connection again, which may now
    /// borrow from the budget, before it waits).
    pub(crate) fn blocked(&mut self) -> bool {
        !std::mem::replace(&mut self.blocked, true)
    }

    /// Where to read into, or `None` when the connection does not read now.
    pub(crate) fn read_buf(&mut self) -> Option<&mut [u8]> {
        if !self.wants_read() {
            return None;
        }
        if self.filled == self.input.len() {
            if self.start > 0 {
                self.compact();
            } else if self.input.len() < self.max_input() {
                let n = (self.input.len() * 2).min(self.max_input());
                self.input.resize(n, 0);
                self.account();
            } else {
                // A whole frame always fits (`max_input` ≥ `max_frame`): a full buffer has a
                // command to run first.
                return None;
            }
        }
        Some(&mut self.input[self.filled..])
    }

    /// [`Connection::read_buf`] and [`Connection::output`] at once, for a driver that waits on
    /// both.
    pub(crate) fn io(&mut self) -> (Option<&mut [u8]>, &[u8]) {
        let readable = self.read_buf().is_some();
        let (filled, written) = (self.filled, self.written);
        let (input, out) = (&mut self.input, &self.out);
        (readable.then(move || &mut input[filled..]), &out[written..])
    }

    /// `n` bytes were read into [`Connection::read_buf`].
    pub(crate) fn read(&mut self, n: usize) {
        self.filled = (self.filled + n).min(self.input.len());
    }

    /// The output waiting for the client.
    pub(crate) fn output(&self) -> &[u8] {
        &self.out[self.written..]
    }

    /// The socket's descriptor, for `CLIENT INFO`.
    pub(crate) fn set_fd(&mut self, fd: i32) {
        self.session.fd = Some(fd);
    }

    /// Whether the client has shown the password (or none is needed): the authentication
    /// deadline no longer applies, and its output may borrow from the shared budget.
    pub(crate) fn authenticated(&self) -> bool {
        self.session.access > Access::None
    }

    /// The driver closes it for `why` (counted with every listener's).
    pub(crate) fn expired(&self, why: crate::listen::Expired) {
        self.srv.guard.expired(crate::listen::Kind::Resp, why);
    }

    /// The session (for the driver's log lines).
    pub(crate) fn id(&self) -> u64 {
        self.session.id
    }

    /// Runs every command it can (module docs), then tells the driver what to do.
    pub(crate) fn run(&mut self) -> Step {
        // Time has passed since the last run: its last clock reading is not this one's.
        self.session.last.unmark();
        let step = self.run_commands();
        if self.ahead.next >= self.ahead.items.len() {
            self.ahead.items.clear();
            self.ahead.ranges.clear();
            self.ahead.next = 0;
            if self.start == self.filled {
                self.start = 0;
                self.filled = 0;
                if self.input.len() > INPUT_BUSY {
                    // A long frame was answered: back to the busy size.
                    self.input.truncate(INPUT_BUSY);
                    self.input.shrink_to_fit();
                }
            }
        }
        // A write that [`Connection::room`] did not size (an error reply, a remote answer) may
        // have grown the output: what it holds past its allowance is counted as borrowed
        // even past the budget, so that the gauge and the budget stay true.
        let over = self.out.capacity().saturating_sub(self.out_base());
        if over > self.out_reserved {
            self.srv.buffers.force(over - self.out_reserved);
            self.out_reserved = over;
        }
        self.account();
        // Counted before the replies go out: a client that read one sees it counted.
        self.srv.metrics.flush(&mut self.session.tally);
        step
    }

    fn run_commands(&mut self) -> Step {
        let mut ran = 0;
        loop {
            if ran == RUN_MAX {
                return Step::Yield;
            }
            if self.closing {
                return Step::Close;
            }
            if self.parked {
                return Step::Wait;
            }
            if self.pending() > self.srv.resp.output_limit {
                return self.over_limit();
            }
            if !self.room() {
                return Step::Wait;
            }
            if let Some(next) = self.exec {
                if let Some(call) = self.exec_one(next) {
                    self.parked = true;
                    return Step::Remote(call);
                }
                ran += 1;
                continue;
            }
            if self.ahead.next >= self.ahead.items.len() && !self.parse_ahead() {
                return if self.closing {
                    Step::Close
                } else {
                    Step::Wait
                };
            }
            let i = self.ahead.next;
            self.ahead.next += 1;
            if let Some(call) = self.run_item(i) {
                self.parked = true;
                return Step::Remote(call);
            }
            ran += 1;
        }
    }

    /// The client is past its output limit: closed, its output dropped.
    fn over_limit(&mut self) -> Step {
        self.srv.metrics.add(C::OutputLimitClosed, 1);
        tracing::debug!(
            conn = self.session.id,
            pending = self.pending(),
            "client output limit passed; closing"
        );
        self.abandon();
        Step::Close
    }

    /// Runs the parsed command `i`; a remote call if it needs Redis.
    #[inline]
    fn run_item(&mut self, i: usize) -> Option<RemoteCall> {
        if crate::spans::on() {
            return self.run_item_spanned(i);
        }
        self.run_item_unspanned(i)
    }

    /// Runs the parsed command `i` (no span); a remote call if it needs Redis. Inlined into
    /// [`Self::run_item`]: the command loop's hot path, as it was before spans.
    #[inline(always)]
    fn run_item_unspanned(&mut self, i: usize) -> Option<RemoteCall> {
        let item = &self.ahead.items[i];
        let args = Args {
            buf: &self.input[item.start..self.filled],
            ranges: &self.ahead.ranges[item.args.clone()],
        };
        self.start = item.end;
        if args.len() == 0 {
            return None;
        }
        self.session.tally.add(C::Commands, 1);
        let srv = &*self.srv;
        let s = &mut self.session;
        let mut o = Out {
            buf: &mut self.out,
            proto: s.proto,
        };
        // A CL.THROTTLE parsed ahead: run without parsing again.
        if let (Some((params, quantity, id)), None) = (item.throttle, &self.queue) {
            let t = Throttle {
                key: args.get(1),
                params,
                quantity,
            };
            t.apply(&srv.throttles, s, id, &mut o);
            return None;
        }
        s.last.unmark();
        if s.access == Access::None && !cmd::lookup(args.name()).is_some_and(cmd::Spec::noauth) {
            o.error("NOAUTH Authentication required.");
            return None;
        }
        if let Some(q) = &mut self.queue {
            if !cmd::lookup(args.name()).is_some_and(cmd::Spec::runs_in_multi) {
                queue(srv, q, args, &mut o);
                return None;
            }
        }
        let command = match Command::parse(args) {
            Ok(c) => c,
            // As Redis: a refused `EXEC` discards the transaction (if one is open); another
            // refused command dirties it.
            Err(_) if cmd::named(args.name(), "EXEC") => {
                self.abort_exec();
                return None;
            }
            Err(e) => {
                if let Some(q) = &mut self.queue {
                    q.dirty = true;
                }
                e.write(args, &mut o);
                return None;
            }
        };
        if self.queue.is_some() && matches!(command, Command::Watch) {
            o.error("ERR WATCH inside MULTI is not allowed");
            return None;
        }
        match command {
            Command::Multi => self.multi(),
            Command::Exec => self.start_exec(),
            Command::Discard => self.discard(),
            other => {
                if let Command::Session(_) = other {
                    s.buffers = BufferStats {
                        qbuf: self.filled - self.start,
                        qbuf_free: self.input.len() - self.filled,
                        multi_mem: self.queue.as_ref().map_or(0, |q| q.bytes.len()),
                        rbs: self.input.len(),
                        obl: o.buf.len() - self.written,
                        omem: o.buf.capacity(),
                    };
                }
                let (call, effect) = other.apply(&srv.ctx(), s, &mut o);
                self.effect(effect);
                call
            }
        }
    }

    /// The answer of the [`Step::Remote`] call, which the driver awaited.
    pub(crate) fn resume(&mut self, call: RemoteCall, answer: Answer) {
        let mut o = Out {
            buf: &mut self.out,
            proto: self.session.proto,
        };
        call.reply(&self.srv.metrics, answer, &mut o, &mut self.session);
        self.parked = false;
    }

    fn effect(&mut self, e: Effect) {
        match e {
            Effect::None => {}
            Effect::Close => self.closing = true,
            Effect::Reset => {
                if let Some(q) = self.queue.take() {
                    self.srv.buffers.release(q.reserved);
                }
                self.exec = None;
                // The commands parsed ahead were parsed for the session before it (its bounds,
                // its `CL.THROTTLE`s let through without a look at its access): parsed again.
                self.ahead.next = self.ahead.items.len();
            }
        }
    }

    /// Moves what is not yet answered to the front of the input buffer, and the commands
    /// parsed ahead that wait (the output paused them, or the turn ended) with it.
    fn compact(&mut self) {
        let shift = self.start;
        for item in &mut self.ahead.items[self.ahead.next..] {
            item.start -= shift;
            item.end -= shift;
        }
        self.input.copy_within(shift..self.filled, 0);
        self.filled -= shift;
        self.start = 0;
    }

    /// Reports the buffers' size to the server's gauge.
    fn account(&mut self) {
        let now =
            self.input.len() + self.out.capacity() + self.queue.as_ref().map_or(0, Queue::capacity);
        if now != self.accounted {
            self.srv.buffers.resized(self.accounted, now);
            self.accounted = now;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.srv.buffers.resized(self.accounted, 0);
        self.srv.buffers.release(self.out_reserved);
        if let Some(q) = &self.queue {
            self.srv.buffers.release(q.reserved);
        }
        self.srv.metrics.flush(&mut self.session.tally);
    }
}

/// Tells a refused RESP client why, as Redis does: one write to a new socket, whose send
/// buffer is empty (plaintext only: a TLS client would read it as a broken handshake).
pub(crate) fn refuse(srv: &Server, s: &impl std::os::fd::AsFd) {
    srv.metrics.add(crate::metrics::C::RejectedConnections, 1);
    if srv.tls.is_none() {
        let _ = socket2::SockRef::from(s).send(b"-ERR max number of clients reached\r\n");
    }
}

#[cfg(test)]
mod tests;
