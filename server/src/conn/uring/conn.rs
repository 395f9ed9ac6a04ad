//! One connection on the ring: its driver state ([`Conn`]) and the worker's handling of its
//! events: accepted, received, sent, run and re-armed ([`Worker::pump`]), drained at shutdown,
//! released.

use super::{token, Op, Worker, BUF_SIZE, MULTISHOT_LIMIT, SEND_KEEP, SEND_MAX};
use crate::cmd::remote::RemoteCall;
use crate::conn::serve::{DRAIN_ROUNDS, LAST_WRITE};
use crate::conn::{Connection, Step};
use crate::listen::Ticket;
use crate::state::Server;
use io_uring::{cqueue, opcode, squeue, types};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Instant;

/// One connection's driver state.
pub(super) struct Conn {
    /// Kept before `sock`: the connection's counts and buffers go before its socket.
    pub(super) conn: Connection,
    pub(super) sock: TcpStream,
    pub(super) gen: u32,
    /// Its place in the guard's count (after `sock`: uncounted once closed).
    pub(super) _ticket: Ticket,
    /// When it was accepted (the authentication deadline).
    pub(super) started: Instant,
    /// A receive is in flight.
    pub(super) recv: bool,
    /// A send of `send_buf[..n]` is in flight.
    pub(super) send: Option<usize>,
    /// The loop iteration whose submission carried the send.
    pub(super) send_round: u64,
    pub(super) send_buf: Vec<u8>,
    /// Received input the connection could not take yet: less than [`MULTISHOT_LIMIT`] and one
    /// buffer (a receive is armed only with an empty stash, and delivers no more).
    pub(super) stash: Vec<u8>,
    pub(super) stash_at: usize,
    /// The client closed its side.
    pub(super) eof: bool,
    /// A remote call is out.
    pub(super) parked: bool,
    pub(super) state: State,
    /// The last read or write that moved data.
    pub(super) progress: Instant,
    /// Shutdown: receives left before closing (each without waiting).
    pub(super) drain: u32,
    /// In the dirty list.
    pub(super) dirty: bool,
    /// Its last run stopped at [`RUN_MAX`](super::super::RUN_MAX) commands with more
    /// to run: it runs again next round, after the others.
    pub(super) more: bool,
    /// Buffer capacity reported to the server's gauge.
    pub(super) accounted: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum State {
    Open,
    /// Writing its last output until this deadline, then closed.
    Closing(Instant),
    /// Closed as soon as no operation of it is in flight (they are cancelled).
    Gone {
        cancelled: bool,
    },
}

impl Conn {
    fn stashed(&self) -> &[u8] {
        &self.stash[self.stash_at..]
    }

    /// Moves input into the connection from the stash, then from `data`; what does not fit is
    /// kept (in order: `data` goes after what is already stashed).
    fn feed(&mut self, mut data: &[u8]) {
        while !self.stashed().is_empty() {
            let Some(buf) = self.conn.read_buf() else {
                break;
            };
            let from = &self.stash[self.stash_at..];
            let n = buf.len().min(from.len());
            buf[..n].copy_from_slice(&from[..n]);
            self.conn.read(n);
            self.stash_at += n;
        }
        if self.stashed().is_empty() {
            self.stash.clear();
            self.stash_at = 0;
        }
        while !data.is_empty() {
            if !self.stashed().is_empty() {
                self.stash.extend_from_slice(data);
                return;
            }
            let Some(buf) = self.conn.read_buf() else {
                self.stash.extend_from_slice(data);
                return;
            };
            let n = buf.len().min(data.len());
            buf[..n].copy_from_slice(&data[..n]);
            self.conn.read(n);
            data = &data[n..];
        }
    }

    /// The client went away (or must be let go): nothing more is run for it.
    pub(super) fn gone(&mut self) {
        if !matches!(self.state, State::Gone { .. }) {
            tracing::debug!(conn = self.conn.id(), "client gone; closing");
            self.conn.abandon();
            self.state = State::Gone { cancelled: false };
        }
    }

    fn in_flight(&self) -> bool {
        self.recv || self.send.is_some()
    }

    /// Reports the driver's buffers to the server's gauge.
    fn account(&mut self, srv: &Server) {
        let now = self.send_buf.capacity() + self.stash.capacity();
        if now != self.accounted {
            srv.buffers.resized(self.accounted, now);
            self.accounted = now;
        }
    }

    /// Runs the connection on the input it has, stashed input included (again while that
    /// moves something and it has room). A call to Redis it asks for is returned, the
    /// connection parked until its answer.
    fn run(&mut self, now: Instant) -> Option<RemoteCall> {
        if self.state != State::Open || self.parked {
            return None;
        }
        loop {
            let before = (self.stashed().len(), self.conn.output().len());
            self.feed(&[]);
            match self.conn.run() {
                Step::Remote(call) => {
                    self.parked = true;
                    return Some(call);
                }
                Step::Close => {
                    self.state = State::Closing(now + LAST_WRITE);
                    return None;
                }
                Step::Wait => {}
                Step::Yield => {
                    self.more = true;
                    return None;
                }
            }
            // More stashed input, and room for it: run again (while that moves something).
            if self.stashed().is_empty()
                || !self.conn.wants_read()
                || before == (self.stashed().len(), self.conn.output().len())
            {
                return None;
            }
        }
    }

    /// The send of the output of the connection in `slot`, if one can go now: a copy of the
    /// output, counted written when the kernel says so. With nothing to send, a large copy is
    /// let go.
    fn send_entry(&mut self, fd: types::Fd, slot: usize, round: u64) -> Option<squeue::Entry> {
        if self.send.is_some() {
            return None;
        }
        if matches!(self.state, State::Gone { .. }) || self.conn.output().is_empty() {
            if self.send_buf.capacity() > SEND_KEEP {
                self.send_buf = Vec::new();
            }
            return None;
        }
        let out = self.conn.output();
        let n = out.len().min(SEND_MAX);
        self.send_buf.clear();
        self.send_buf.extend_from_slice(&out[..n]);
        self.send = Some(n);
        self.send_round = round;
        let e = opcode::Send::new(fd, self.send_buf.as_ptr(), n as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(token(Op::Send, slot, self.gen));
        Some(e)
    }

    /// Starts closing a connection that is done, and shuts the write side of one that has
    /// written its last output.
    fn settle(&mut self, now: Instant, stopping: bool) {
        let idle_out = self.send.is_none() && self.conn.output().is_empty() && !self.parked;
        let drained = stopping && self.drain == 0 && !self.recv;
        if self.state == State::Open
            && (self.eof || drained)
            && self.stashed().is_empty()
            && idle_out
        {
            // The client closed its side and has every reply, or the shutdown drain is over
            // and every command it read is answered.
            self.state = State::Closing(now + LAST_WRITE);
        }
        if let State::Closing(_) = self.state {
            if idle_out {
                // SAFETY: shutdown(2) of the connection's own open socket.
                unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_WR) };
                self.state = State::Gone { cancelled: false };
            }
        }
    }

    /// The next receive of the connection in `slot` (into a buffer of `group`): only with an
    /// empty stash, while the connection reads; in the shutdown drain, one without waiting.
    /// With `multishot` (the kernel ends one at a limit) it stays armed for the next
    /// [`MULTISHOT_LIMIT`] bytes: one submission for many round trips instead of one each.
    fn recv_entry(
        &mut self,
        fd: types::Fd,
        slot: usize,
        stopping: bool,
        group: u16,
        multishot: bool,
    ) -> Option<squeue::Entry> {
        if self.state != State::Open
            || self.recv
            || self.eof
            || !self.stashed().is_empty()
            || !self.conn.wants_read()
            || (stopping && self.drain == 0)
        {
            return None;
        }
        let e = if multishot && !stopping {
            limited(opcode::RecvMulti::new(fd, group).build(), MULTISHOT_LIMIT)
        } else {
            let mut flags = 0;
            if stopping {
                // The shutdown drain reads what the socket holds, without waiting.
                flags = libc::MSG_DONTWAIT;
                self.drain -= 1;
            }
            opcode::Recv::new(fd, std::ptr::null_mut(), BUF_SIZE as u32)
                .buf_group(group)
                .flags(flags)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
        };
        self.recv = true;
        Some(e.user_data(token(Op::Recv, slot, self.gen)))
    }
}

/// A multishot receive `e` that ends once `bytes` have come (Linux 6.17: the limit is the
/// entry's `optlen`, which the `io-uring` crate has no setter for; [`super::multishot_limit`]
/// asks whether the kernel keeps it). The last receive may go past it by less than a buffer.
pub(super) fn limited(e: squeue::Entry, bytes: u32) -> squeue::Entry {
    /// `optlen` in the kernel's `struct io_uring_sqe` (the union with `file_index`).
    const OPTLEN: usize = 44;
    // SAFETY: `Entry` is `repr(C)` over the kernel's 64-byte `io_uring_sqe` (transmute checks
    // the size); any bytes are a valid entry to hold, and the kernel checks what it reads.
    let mut raw: [u8; 64] = unsafe { std::mem::transmute(e) };
    raw[OPTLEN..OPTLEN + 4].copy_from_slice(&bytes.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute(raw) }
}

impl Worker {
    pub(super) fn accepted(&mut self, sock: TcpStream) {
        let ticket = match self.srv.guard.admit(crate::listen::Kind::Resp) {
            Ok(t) => t,
            Err(_) => return crate::conn::refuse(&self.srv, &sock),
        };
        self.srv.metrics.add(crate::metrics::C::Connections, 1);
        let _ = sock.set_nodelay(true);
        // The kernel's queue of unread replies bounded as on tokio (conn::serve).
        let _ = socket2::SockRef::from(&sock).set_send_buffer_size(crate::conn::serve::SEND_BUFFER);
        let id = crate::state::next_conn_id();
        let mut conn = Connection::new(
            self.srv.clone(),
            id,
            sock.peer_addr().ok(),
            sock.local_addr().ok(),
        );
        conn.set_fd(sock.as_raw_fd());
        self.gens = self.gens.wrapping_add(1);
        let c = Box::new(Conn {
            conn,
            sock,
            gen: self.gens & 0xff_ffff,
            _ticket: ticket,
            started: self.now,
            recv: false,
            send: None,
            send_round: 0,
            send_buf: Vec::new(),
            stash: Vec::new(),
            stash_at: 0,
            eof: false,
            parked: false,
            state: State::Open,
            progress: self.now,
            drain: 0,
            dirty: false,
            more: false,
            accounted: 0,
        });
        let i = match self.free.pop() {
            Some(i) => {
                self.conns[i] = Some(c);
                i
            }
            None => {
                self.conns.push(Some(c));
                self.conns.len() - 1
            }
        };
        if self.stopping.is_some() {
            self.start_drain(i);
        }
        self.mark(i);
    }

    pub(super) fn received(&mut self, i: usize, gen: u32, res: i32, flags: u32) {
        let bid = cqueue::buffer_select(flags);
        let now = self.now;
        let Some(c) = self.conns.get_mut(i).and_then(|c| c.as_deref_mut()) else {
            if let Some(b) = bid {
                self.bufs.recycle(b);
            }
            return;
        };
        debug_assert_eq!(c.gen, gen);
        // A multishot receive stays armed until a completion without `MORE`.
        c.recv = cqueue::more(flags);
        if res > 0 {
            let n = res as usize;
            if let Some(b) = bid {
                if c.state == State::Open {
                    c.feed(self.bufs.data(b, n));
                }
                self.bufs.recycle(b);
            }
            c.progress = now;
        } else if res == 0 {
            c.eof = true;
        } else if res == -libc::EAGAIN || res == -libc::EWOULDBLOCK {
            // A receive of the shutdown drain found nothing: done reading.
            c.drain = 0;
        } else if res == -libc::ENOBUFS || res == -libc::ECANCELED || res == -libc::EINTR {
            // Re-armed below, if it still reads.
        } else {
            c.gone();
        }
        self.mark(i);
    }

    pub(super) fn sent_done(&mut self, i: usize, gen: u32, res: i32) {
        let now = self.now;
        let Some(c) = self.conns.get_mut(i).and_then(|c| c.as_deref_mut()) else {
            return;
        };
        debug_assert_eq!(c.gen, gen);
        let len = c.send.take().unwrap_or(0);
        if res > 0 && matches!(c.state, State::Open | State::Closing(_)) {
            let n = res as usize;
            c.conn.wrote(n);
            c.progress = now;
            if n < len {
                c.conn.blocked();
            }
        } else if res < 0 && res != -libc::ECANCELED && res != -libc::EINTR {
            c.gone();
        }
        // The usual case, one reply per round trip: all written, a receive armed, nothing more
        // to run until it completes. Otherwise the connection may have more to send, room to
        // read or run again, or an end to reach.
        let settled = c.state == State::Open && c.recv && !c.eof && c.conn.output().is_empty();
        if !settled {
            self.mark(i);
        }
    }

    /// Runs the connection on what it has, then queues its send and its next receive, or
    /// closes it.
    pub(super) fn pump(&mut self, i: usize) {
        let Some(c) = self.conns[i].as_deref_mut() else {
            return;
        };
        if let Some(call) = c.run(self.now) {
            let gen = c.gen;
            self.call_remote(i, gen, call);
        }
        let c = self.conns[i].as_deref_mut().expect("checked");
        if std::mem::take(&mut c.more) {
            self.later.push(i);
        }
        let fd = types::Fd(c.sock.as_raw_fd());
        if let Some(e) = c.send_entry(fd, i, self.round) {
            self.sqes.push(e);
            self.in_flight += 1;
            self.sent.push((i, c.gen));
        }
        let stopping = self.stopping.is_some();
        c.settle(self.now, stopping);
        if let Some(e) = c.recv_entry(fd, i, stopping, self.bufs.group(), self.multishot) {
            self.sqes.push(e);
            self.in_flight += 1;
        }
        c.account(&self.srv);
        if let State::Gone { cancelled } = c.state {
            if !c.in_flight() {
                self.release(i);
            } else if !cancelled {
                c.state = State::Gone { cancelled: true };
                let e = opcode::AsyncCancel2::new(types::CancelBuilder::fd(fd).all())
                    .build()
                    .user_data(token(Op::Cancel, i, c.gen));
                self.sqes.push(e);
            }
        }
    }

    /// Runs `call` to Redis on the remote runtime; its answer comes back on `replies`, and the
    /// eventfd wakes the ring.
    fn call_remote(&self, i: usize, gen: u32, call: RemoteCall) {
        let (tx, srv, wake) = (self.replies_tx.clone(), self.srv.clone(), self.wake.clone());
        self.remote.spawn(async move {
            let answer = call.run(&srv.checks, &srv.metrics).await;
            let _ = tx.send((i, gen, call, answer));
            let one = 1u64.to_ne_bytes();
            // SAFETY: an 8-byte write from a live buffer to the eventfd, which the Arc keeps
            // open.
            unsafe { libc::write(wake.as_raw_fd(), one.as_ptr().cast(), 8) };
        });
    }

    /// Frees the slot of a connection with nothing in flight: closes its socket.
    pub(super) fn release(&mut self, i: usize) {
        if let Some(mut c) = self.conns[i].take() {
            debug_assert!(!c.in_flight());
            c.send_buf = Vec::new();
            c.stash = Vec::new();
            c.account(&self.srv);
            self.free.push(i);
            self.trim = true;
        }
    }

    /// Shutdown: what the client sent before it is answered too — what the socket already
    /// holds is read without waiting (at most [`DRAIN_ROUNDS`] receives), then it closes.
    pub(super) fn start_drain(&mut self, i: usize) {
        let Some(c) = self.conns[i].as_deref_mut() else {
            return;
        };
        if c.state != State::Open || c.eof {
            return;
        }
        c.drain = DRAIN_ROUNDS;
        if c.recv {
            // The receive out waits for data: cancelled, then re-armed without waiting.
            let e = opcode::AsyncCancel2::new(types::CancelBuilder::user_data(token(
                Op::Recv,
                i,
                c.gen,
            )))
            .build()
            .user_data(token(Op::Cancel, i, c.gen));
            self.push(e);
        }
    }
}

#[cfg(test)]
mod tests;
