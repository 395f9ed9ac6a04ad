//! A RESP connection as a state machine over bytes in and bytes out, apart from any runtime
//! (sans-IO, as quinn-proto and h2's codec are): a driver reads into [`Connection::read_buf`],
//! calls [`Connection::run`], writes [`Connection::output`] and reports it with
//! [`Connection::wrote`]; a rules command whose counts live in Redis comes back as
//! [`Step::Remote`], which the driver awaits and hands back with [`Connection::resume`].
//! `tokio_conn` drives it over a socket; the tests and the fuzz target drive it with bytes.
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
use crate::cmd::rules::RemoteCall;
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
mod multi;
mod session;

use ahead::Ahead;
#[cfg(test)]
use multi::RANGE;
use multi::{queue, runs_in_multi, Queue};
pub(crate) use session::{BufferStats, Session};

/// Output waiting for the client past which the connection stops reading and running
/// commands (unless the deferred budget lends it room).
pub(crate) const OUTPUT_PAUSE: usize = 16 * 1024;
/// Bytes of queued `MULTI` commands a connection holds without borrowing from the budget.
pub(crate) const QUEUE_FREE: usize = 16 * 1024;
/// The most commands one `MULTI` queues.
pub(crate) const MAX_QUEUED: usize = 10_000;
/// Commands parsed ahead of running them.
pub(crate) const AHEAD: usize = 32;
/// The input buffer's first size.
const INPUT_START: usize = 4096;
/// The input buffer's size for a busy pipeline; beyond it only for a longer frame.
const INPUT_BUSY: usize = 16 * 1024;
/// Output capacity kept after a burst.
const OUTPUT_KEEP: usize = 16 * 1024;
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
            },
            queue: None,
            exec: None,
            parked: false,
            closing: false,
            accounted: 0,
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

    /// The longest reply one command writes (`ECHO` and `PING` echo an argument).
    fn reply_max(&self) -> usize {
        MAX_REPLY.max(self.srv.resp.bounds.max_bulk + 32)
    }

    /// Output capacity a connection holds of its own: [`OUTPUT_PAUSE`] and one reply. Beyond
    /// it every byte of capacity is borrowed from the deferred budget (`out_reserved`).
    fn out_base(&self) -> usize {
        OUTPUT_PAUSE + self.reply_max()
    }

    /// Gives back the budget the output's capacity no longer uses.
    fn settle_reserved(&mut self) {
        let used = self.out.capacity().saturating_sub(self.out_base());
        if used < self.out_reserved {
            self.srv.buffers.release(self.out_reserved - used);
            self.out_reserved = used;
        }
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

    /// `n` bytes of [`Connection::output`] were written.
    pub(crate) fn wrote(&mut self, n: usize) {
        self.written = (self.written + n).min(self.out.len());
        if self.written == self.out.len() {
            self.out.clear();
            self.written = 0;
            if self.out.capacity() > OUTPUT_KEEP {
                self.out.shrink_to(OUTPUT_KEEP);
            }
        } else if self.written >= self.pending() || self.pending() <= self.out_base() {
            // Part of it written while more was produced (the io_uring driver answers while
            // its copy is being sent; a slow reader): what was written goes, or the buffer
            // would hold everything ever sent to a client that reads a little at a time.
            // Moving at most as much as was written (or a small rest) keeps the cost linear
            // in the bytes sent.
            self.out.drain(..self.written);
            self.written = 0;
        }
        if self.pending() <= OUTPUT_PAUSE {
            self.blocked = false;
            // Back within its own allowance: the borrowed capacity goes back.
            if self.out.capacity() > self.out_base() {
                self.out.shrink_to(self.out_base());
            }
        } else if self.out.capacity() > 4 * self.out.len().max(self.out_base()) {
            self.out.shrink_to(2 * self.out.len().max(self.out_base()));
        }
        self.settle_reserved();
        self.account();
    }

    /// The socket's descriptor, for `CLIENT INFO`.
    pub(crate) fn set_fd(&mut self, fd: i32) {
        self.session.fd = Some(fd);
    }

    /// The session (for the driver's log lines).
    pub(crate) fn id(&self) -> u64 {
        self.session.id
    }

    /// Drops the unsent output (the client is gone or past its output limit): nothing more is
    /// run for it.
    pub(crate) fn abandon(&mut self) {
        self.closing = true;
        // Freed, not just cleared: the budget it borrowed is lent to others at once.
        self.out = Vec::new();
        self.written = 0;
        self.settle_reserved();
        self.account();
    }

    /// Whether another command may run: its output does not wait past [`OUTPUT_PAUSE`], or
    /// (once the driver found the client slower than the answers) the deferred budget lends
    /// it room. Past [`OUTPUT_PAUSE`] the driver is given the output to write first.
    ///
    /// The output's capacity is grown here, before the command, to hold one more reply: the
    /// command's writes never grow it, and every byte of it past [`Connection::out_base`] is
    /// borrowed from the budget — the bound is on memory held, not on bytes waiting (a
    /// growing buffer may hold twice what waits).
    fn room(&mut self) -> bool {
        if self.pending() > OUTPUT_PAUSE && !self.blocked {
            return false;
        }
        let need = self.out.len() + self.reply_max();
        if need <= self.out.capacity() {
            return true;
        }
        let base = self.out_base();
        if need <= base {
            // Within its own allowance: grown as a vector grows, up to it.
            let to = need.next_power_of_two().min(base);
            self.out.reserve_exact(to - self.out.len());
            return true;
        }
        // Borrowed, doubling (so that the copies stay linear in the bytes answered), or just
        // enough when the budget cannot lend that much.
        let step = |n: usize| n.div_ceil(BUDGET_STEP) * BUDGET_STEP;
        let have = base + self.out_reserved;
        for to in [step(need.max(2 * self.out.capacity())), step(need)] {
            let more = to.saturating_sub(have);
            if self.srv.buffers.reserve(more) {
                self.out_reserved += more;
                self.out.reserve_exact(to - self.out.len());
                return true;
            }
        }
        false
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
        loop {
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
    fn run_item(&mut self, i: usize) -> Option<RemoteCall> {
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
        if s.access == Access::None && !allowed_unauthenticated(args.name()) {
            o.error("NOAUTH Authentication required.");
            return None;
        }
        if let Some(q) = &mut self.queue {
            if !runs_in_multi(args.name()) {
                queue(srv, q, args, &mut o);
                return None;
            }
        }
        let command = match Command::parse(args) {
            Ok(c) => c,
            Err(e) => {
                e.write(args, &mut o);
                return None;
            }
        };
        match command {
            Command::Multi => {
                if self.queue.is_some() {
                    o.error("ERR MULTI calls can not be nested");
                } else {
                    self.queue = Some(Queue::default());
                    s.in_multi = true;
                    o.simple("OK");
                }
                None
            }
            Command::Exec => {
                match self.queue.take() {
                    None => o.error("ERR EXEC without MULTI"),
                    Some(q) if q.dirty => {
                        srv.buffers.release(q.reserved);
                        s.in_multi = false;
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
            Command::Discard => {
                match self.queue.take() {
                    None => o.error("ERR DISCARD without MULTI"),
                    Some(q) => {
                        srv.buffers.release(q.reserved);
                        s.in_multi = false;
                        o.simple("OK");
                    }
                }
                None
            }
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
                let (call, effect) = apply(srv, s, other, &mut o);
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
        call.reply(&self.srv, answer, &mut o, &mut self.session);
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
            }
        }
    }

    /// Moves what is not yet answered to the front of the input buffer.
    fn compact(&mut self) {
        debug_assert!(self.ahead.next >= self.ahead.items.len());
        self.input.copy_within(self.start..self.filled, 0);
        self.filled -= self.start;
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

/// Commands a client may send before it has authenticated.
fn allowed_unauthenticated(name: &[u8]) -> bool {
    ["AUTH", "HELLO", "QUIT", "RESET"]
        .iter()
        .any(|n| cmd::named(name, n))
}

/// Runs a parsed command (not `MULTI`, `EXEC`, `DISCARD`).
fn apply(
    srv: &Server,
    s: &mut crate::resp::connection::Session,
    c: Command<'_>,
    o: &mut Out<'_>,
) -> (Option<RemoteCall>, Effect) {
    match c {
        Command::Throttle(t) => {
            t.apply(&srv.throttles, s, None, o);
        }
        Command::Rules(r) => return (r.apply(srv, o), Effect::None),
        Command::Session(sc) => {
            let e = sc.apply(&srv.resp.auth, srv.resp.trusted, s, o);
            return (None, e);
        }
        Command::Introspect(i) => i.apply(srv, o),
        Command::Watch => o.error(
            "ERR WATCH is not supported: there are no keys to watch; each command is atomic on its own (docs/service.md)",
        ),
        Command::Unwatch => o.simple("OK"),
        Command::Multi | Command::Exec | Command::Discard => {
            debug_assert!(false, "handled by the connection");
        }
    }
    (None, Effect::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(parts: &[&[u8]]) -> Vec<u8> {
        let mut v = format!("*{}\r\n", parts.len()).into_bytes();
        for p in parts {
            v.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
            v.extend_from_slice(p);
            v.extend_from_slice(b"\r\n");
        }
        v
    }

    /// Feeds `input` as a client that reads everything would, in reads of `chunk` bytes;
    /// returns what the server wrote and whether it closed.
    fn talk(c: &mut Connection, input: &[u8], chunk: usize) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let step = c.run();
            out.extend_from_slice(c.output());
            let n = c.output().len();
            c.wrote(n);
            match step {
                Step::Close => return (out, true),
                Step::Remote(_) => panic!("no Redis here"),
                Step::Wait => {}
            }
            if n > 0 {
                continue;
            }
            if at >= input.len() {
                return (out, false);
            }
            let buf = c.read_buf().expect("reads when its output is read");
            let n = buf.len().min(chunk).min(input.len() - at);
            buf[..n].copy_from_slice(&input[at..at + n]);
            c.read(n);
            at += n;
        }
    }

    fn conn(edit: impl FnOnce(&mut crate::ServeArgs)) -> Connection {
        Connection::new(Server::detached(edit), 1, None, None)
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    #[test]
    fn pipelines_answer_in_order_whatever_the_reads() {
        let mut input = Vec::new();
        for i in 0..100 {
            input.extend(cmd(&[
                b"CL.THROTTLE",
                format!("k{}", i % 3).as_bytes(),
                b"5",
                b"1",
                b"60",
            ]));
            input.extend(cmd(&[b"PING"]));
        }
        input.extend(cmd(&[b"ECHO", b"end"]));
        let want = talk(&mut conn(|_| {}), &input, usize::MAX).0;
        for chunk in [1, 7, 100, 4096] {
            assert_eq!(
                talk(&mut conn(|_| {}), &input, chunk).0,
                want,
                "chunk {chunk}"
            );
        }
        assert!(text(&want).ends_with("$3\r\nend\r\n"));
        assert_eq!(text(&want).matches("+PONG").count(), 100);
    }

    #[test]
    fn nothing_but_a_small_frame_before_auth() {
        // 128 arguments of 512 KiB: refused at the array's header, before any of it is held.
        let mut c = conn(|a| a.requirepass = Some("pw".into()));
        let (out, closed) = talk(&mut c, b"*128\r\n$524288\r\n", usize::MAX);
        assert_eq!(
            text(&out),
            "-ERR Protocol error: unauthenticated multibulk length\r\n"
        );
        assert!(closed);
        let mut c = conn(|a| a.requirepass = Some("pw".into()));
        let (out, closed) = talk(&mut c, b"*2\r\n$4\r\nAUTH\r\n$524288\r\n", usize::MAX);
        assert_eq!(
            text(&out),
            "-ERR Protocol error: unauthenticated bulk length\r\n"
        );
        assert!(closed);
        // Every other command is answered NOAUTH; the buffer stays small.
        let mut c = conn(|a| a.requirepass = Some("pw".into()));
        let flood = cmd(&[b"CL.THROTTLE", b"k", b"1", b"1", b"1"]).repeat(10_000);
        let (out, closed) = talk(&mut c, &flood, 65536);
        assert!(!closed);
        assert_eq!(text(&out).matches("-NOAUTH").count(), 10_000);
        assert!(c.input.len() <= INPUT_BUSY, "{}", c.input.len());
        // Then AUTH: commands run.
        let mut input = cmd(&[b"AUTH", b"wrong"]);
        input.extend(cmd(&[b"AUTH", b"pw"]));
        input.extend(cmd(&[b"CL.THROTTLE", b"k", b"1", b"1", b"1"]));
        let (out, _) = talk(&mut c, &input, usize::MAX);
        assert_eq!(
            text(&out),
            "-WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n*5\r\n:0\r\n:2\r\n:1\r\n:-1\r\n:1\r\n"
        );
    }

    #[test]
    fn frames_are_bounded_by_what_commands_take() {
        let mut c = conn(|_| {});
        let (out, closed) = talk(&mut c, b"*17\r\n", usize::MAX);
        assert_eq!(
            text(&out),
            "-ERR Protocol error: invalid multibulk length\r\n"
        );
        assert!(closed);
        let mut c = conn(|_| {});
        let (out, closed) = talk(&mut c, b"*2\r\n$4\r\nECHO\r\n$4097\r\n", usize::MAX);
        assert_eq!(text(&out), "-ERR Protocol error: invalid bulk length\r\n");
        assert!(closed);
        // The longest frame allowed is held, answered, and the buffer shrinks back.
        let mut c = conn(|_| {});
        let arg = vec![b'x'; 4096];
        let mut parts: Vec<&[u8]> = vec![b"COMMAND", b"INFO"];
        parts.extend(std::iter::repeat_n(&arg[..], 14));
        let (out, closed) = talk(&mut c, &cmd(&parts), 1000);
        assert!(!closed);
        assert!(text(&out).starts_with("*14\r\n"), "{}", &text(&out)[..20]);
        assert!(c.input.len() <= INPUT_BUSY);
    }

    /// A client that never reads: the connection stops running its commands once 16 KiB wait
    /// (and the budget is spent), and is closed past its output limit.
    #[test]
    fn a_client_that_never_reads_holds_a_bounded_output() {
        let mut c = conn(|a| a.client_output_limit = 64 << 10);
        let input = b"COMMAND\r\n".repeat(100_000);
        let mut at = 0;
        let mut closed = false;
        for _ in 0..100_000 {
            // Every write would block: the client reads nothing.
            c.blocked();
            match c.run() {
                Step::Close => {
                    closed = true;
                    break;
                }
                Step::Remote(_) => unreachable!(),
                Step::Wait => {}
            }
            assert!(c.pending() <= (64 << 10) + 8192, "{}", c.pending());
            // The memory it holds past its own allowance is what it borrowed, no more.
            assert!(
                c.out.capacity() <= c.out_base() + c.out_reserved,
                "capacity {} borrowed {}",
                c.out.capacity(),
                c.out_reserved
            );
            let Some(buf) = c.read_buf() else { break };
            let n = buf.len().min(input.len() - at);
            buf[..n].copy_from_slice(&input[at..at + n]);
            c.read(n);
            at += n;
        }
        // The server-wide budget (1 MiB here) lends more than the output limit: closed.
        assert!(closed, "pending {}", c.pending());
        assert_eq!(c.pending(), 0, "its output is dropped");
        assert_eq!(c.out.capacity(), 0, "and freed");
        assert_eq!(
            c.srv
                .buffers
                .deferred
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }

    #[test]
    fn output_written_while_more_is_answered_is_let_go() {
        // The io_uring driver's pattern: a copy of the output is out while the connection
        // answers more; the copy completes, and the connection is never all written. What was
        // written must not stay in the buffer (it once grew by everything ever sent).
        let mut c = conn(|_| {});
        let input = b"PING\r\n".repeat(400_000);
        let (mut at, mut sent) = (0, 0);
        while at < input.len() {
            let _ = c.run();
            let out = c.output().len().min(64 << 10);
            // The client's commands come in pieces (a round trip each).
            if let Some(buf) = c.read_buf() {
                let n = buf.len().min(input.len() - at).min(1200);
                buf[..n].copy_from_slice(&input[at..at + n]);
                c.read(n);
                at += n;
            }
            let _ = c.run();
            c.wrote(out);
            sent += out;
            assert!(
                c.out.capacity() <= 4 * (OUTPUT_PAUSE + MAX_REPLY),
                "{} bytes held after {sent} sent",
                c.out.capacity()
            );
        }
        assert!(sent > 2 << 20, "{sent}");
    }

    #[test]
    fn with_the_budget_spent_a_connection_pauses() {
        let srv = Server::detached(|_| {});
        // Another connection holds the whole budget.
        assert!(srv.buffers.reserve(srv.buffers.deferred_max));
        let mut c = Connection::new(srv.clone(), 1, None, None);
        let input = b"COMMAND\r\n".repeat(1000);
        let buf = c.read_buf().unwrap();
        let n = buf.len();
        buf.copy_from_slice(&input[..n]);
        c.read(n);
        assert!(matches!(c.run(), Step::Wait));
        assert!(c.pending() >= OUTPUT_PAUSE && c.pending() < OUTPUT_PAUSE + 8192);
        // Given to the driver first; the client does not read it: paused.
        c.blocked();
        assert!(matches!(c.run(), Step::Wait));
        assert!(c.pending() < OUTPUT_PAUSE + 8192);
        assert!(!c.wants_read() && c.read_buf().is_none());
        // The client reads: it goes on.
        let p = c.pending();
        c.wrote(p);
        assert!(c.wants_read());
        assert!(matches!(c.run(), Step::Wait));
        assert!(c.pending() > 0);
    }

    #[test]
    fn transactions_as_redis_answers_them() {
        let mut input = Vec::new();
        for p in [
            &[&b"MULTI"[..]][..],
            &[b"CL.THROTTLE", b"m", b"2", b"10", b"60"],
            &[b"CL.THROTTLE", b"m", b"x", b"10", b"60"],
            &[b"PING"],
            &[b"EXEC"],
            &[b"EXEC"],
            &[b"MULTI"],
            &[b"NOPE"],
            &[b"PING", b"a", b"b"],
            &[b"PING"],
            &[b"EXEC"],
            &[b"MULTI"],
            &[b"MULTI"],
            &[b"DISCARD"],
            &[b"DISCARD"],
            &[b"WATCH", b"k"],
        ] {
            input.extend(cmd(p));
        }
        let (out, _) = talk(&mut conn(|_| {}), &input, 5);
        assert_eq!(
            text(&out),
            "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n*5\r\n:0\r\n:3\r\n:2\r\n:-1\r\n:6\r\n-ERR value is not an integer or out of range\r\n+PONG\r\n\
             -ERR EXEC without MULTI\r\n\
             +OK\r\n-ERR unknown command 'NOPE', with args beginning with: \r\n-ERR wrong number of arguments for 'ping' command\r\n+QUEUED\r\n-EXECABORT Transaction discarded because of previous errors.\r\n\
             +OK\r\n-ERR MULTI calls can not be nested\r\n+OK\r\n-ERR DISCARD without MULTI\r\n\
             -ERR WATCH is not supported: there are no keys to watch; each command is atomic on its own (docs/service.md)\r\n"
        );
    }

    #[test]
    fn a_transaction_is_bounded() {
        let mut c = conn(|a| a.client_output_limit = 64 << 10);
        let mut input = cmd(&[b"MULTI"]);
        let arg = vec![b'k'; 4000];
        for _ in 0..20 {
            input.extend(cmd(&[b"ECHO", &arg]));
        }
        input.extend(cmd(&[b"EXEC"]));
        let (out, _) = talk(&mut c, &input, usize::MAX);
        let t = text(&out);
        assert_eq!(t.matches("+QUEUED").count(), 16, "{}", &t[..200]);
        assert!(t.contains("-ERR the transaction is too large"));
        assert!(t.ends_with("-EXECABORT Transaction discarded because of previous errors.\r\n"));
        assert_eq!(
            c.srv
                .buffers
                .deferred
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }

    /// A queue's bookkeeping counts against its bounds and in the buffers' gauge, not only
    /// its arguments: 10 000 PINGs are 40 KB of arguments and 320 KB of ranges.
    #[test]
    fn a_transaction_counts_its_bookkeeping() {
        let mut c = conn(|_| {});
        let mut input = cmd(&[b"MULTI"]);
        for _ in 0..10_000 {
            input.extend(cmd(&[b"PING"]));
        }
        let (out, _) = talk(&mut c, &input, usize::MAX);
        assert_eq!(text(&out).matches("+QUEUED").count(), 10_000);
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        let held = c.srv.buffers.bytes.load(relaxed);
        assert!(held >= 10_000 * (4 + 2 * RANGE), "{held}");
        let lent = c.srv.buffers.deferred.load(relaxed);
        assert!(lent >= 10_000 * (4 + 2 * RANGE) - QUEUE_FREE, "{lent}");
        // Past the output limit it is refused, bookkeeping included.
        let mut c = conn(|a| a.client_output_limit = 64 << 10);
        let (out, _) = talk(&mut c, &input, usize::MAX);
        let queued = text(&out).matches("+QUEUED").count();
        assert_eq!(queued, (64 << 10) / (4 + 2 * RANGE), "{queued}");
    }

    #[test]
    fn exec_streams_its_replies_within_the_output_bound() {
        let mut c = conn(|_| {});
        let mut input = cmd(&[b"MULTI"]);
        for _ in 0..2000 {
            input.extend(cmd(&[b"COMMAND"]));
        }
        input.extend(cmd(&[b"EXEC"]));
        let (out, closed) = talk(&mut c, &input, usize::MAX);
        let t = text(&out);
        assert!(!closed, "{}", &t[t.len().saturating_sub(300)..]);
        assert!(text(&out).contains("*2000\r\n"));
        assert_eq!(text(&out).matches("cl.throttle").count(), 2000);
    }

    #[test]
    fn the_longest_replies_fit_max_reply() {
        for p in [
            &[&b"COMMAND"[..]][..],
            &[b"COMMAND", b"DOCS"],
            &[b"COMMAND", b"INFO"],
            &[b"INFO"],
            &[b"CLIENT", b"INFO"],
        ] {
            let (out, _) = talk(&mut conn(|_| {}), &cmd(p), usize::MAX);
            assert!(out.len() <= MAX_REPLY, "{p:?}: {} bytes", out.len());
        }
        // At the defaults: ~66 KiB of input, 16 + 16 KiB of output, 16 KiB of queue, 16 fixed.
        let b = Bounds::default();
        assert_eq!(max_bytes(&b), b.max_frame() + 64 * 1024);
        assert!(max_bytes(&b) < 132 * 1024);
    }

    #[test]
    fn session_commands_answer_as_redis() {
        let mut input = Vec::new();
        for p in [
            &[&b"AUTH"[..], b"default", b"anything"][..],
            &[b"AUTH", b"x"],
            &[b"HELLO", b"3", b"AUTH", b"default", b"x", b"SETNAME", b"me"],
            &[b"CLIENT", b"GETNAME"],
            &[b"CLIENT", b"SETINFO", b"LIB-NAME", b"redis-py"],
            &[b"CLIENT", b"NOPE"],
            &[b"SELECT", b"1"],
            &[b"RESET"],
            &[b"CLIENT", b"GETNAME"],
        ] {
            input.extend(cmd(p));
        }
        let (out, _) = talk(&mut conn(|_| {}), &input, usize::MAX);
        let t = text(&out);
        assert!(
            t.starts_with("+OK\r\n-ERR AUTH <password> called without any password configured"),
            "{t}"
        );
        assert!(t.contains("%7\r\n$6\r\nserver\r\n"), "{t}");
        assert!(t.contains("$2\r\nme\r\n+OK\r\n-ERR unknown subcommand 'NOPE'. Try CLIENT HELP.\r\n-ERR DB index is out of range\r\n+RESET\r\n$-1\r\n"), "{t}");
        // CLIENT INFO names what the connection was told.
        let mut input = cmd(&[b"CLIENT", b"SETNAME", b"worker-1"]);
        input.extend(cmd(&[b"CLIENT", b"INFO"]));
        let (out, _) = talk(&mut conn(|_| {}), &input, usize::MAX);
        assert!(
            text(&out).contains("id=1 addr= laddr= fd=-1 name=worker-1 "),
            "{}",
            text(&out)
        );
    }
}
