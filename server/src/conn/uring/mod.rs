//! The io_uring driver of RESP connections (`--runtime uring`): one pinned thread per core, each
//! with its own ring and its own `SO_REUSEPORT` listener, drives the same [`Connection`] state
//! machine as the tokio driver (`serve`), with the same bounds and the same semantics: idle
//! timeout on no progress, the shutdown drain, a client's end of input, `--max-connections`.
//!
//! # Why io_uring, and how
//!
//! One command per round trip costs a server a read and a write system call per request and the
//! event loop around them. Here one `io_uring_enter` per loop submits every reply produced since
//! the last one and collects every completion since: a multishot accept, and multishot
//! receives into [`bufring`]'s provided buffers. A loop that finds fifty connections ready
//! does one system call, not a hundred and one, and a connection's receive stays armed across
//! its round trips: the kernel ends it after [`MULTISHOT_LIMIT`] bytes (Linux 6.17; the
//! worker asks its ring at start), and the worker arms it again once the connection has
//! taken them. On an older kernel each receive is armed once.
//!
//! # Who owns which memory
//!
//! A buffer the kernel reads or writes must outlive the operation, however the connection ends:
//!
//! * receives name no buffer (the kernel picks one from [`bufring`]); the data is copied into the
//!   connection's input (what does not fit now, at most one buffer, waits in `stash`) and the
//!   buffer given back at once;
//! * a send reads the driver's own `send_buf` of its connection, a copy of the connection's
//!   output: the connection may grow or clear its output while the send is out. The copy is
//!   counted as written only when the kernel says it was;
//! * a connection's slot (its socket, `send_buf`) is freed only once no operation of it is in
//!   flight: closing one cancels its operations and waits for their completions;
//! * at the end the worker cancels everything and waits for every completion; if some never
//!   come, it leaks the buffers (and the ring) rather than free memory the kernel may use.
//!
//! # Bounds
//!
//! Those of [`Connection`], plus per connection less than [`MULTISHOT_LIMIT`] + [`BUF_SIZE`]
//! of stashed input (one receive's worth without the multishot limit) and a send copy of at
//! most [`SEND_MAX`], both counted in the server's buffer gauge; per worker [`BUFS`] ×
//! [`BUF_SIZE`] of provided buffers. A connection has a receive armed only while it wants
//! input and its stash is empty, and a receive delivers no more than its limit: a client that
//! sends without reading is held back by TCP, as on tokio.
//!
//! A rules command whose counts live in Redis ([`Step::Remote`]) is run on a tokio runtime
//! (`remote`); its answer comes back over a channel and an eventfd the ring reads.
//!
//! [`Connection`]: super::Connection
//! [`Step::Remote`]: super::Step::Remote

mod bufring;
mod conn;
mod finish;
mod probe;

pub(crate) use probe::available;

use crate::check::Answer;
use crate::cmd::remote::RemoteCall;
use crate::state::Server;
use bufring::BufRing;
use conn::{Conn, State};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Submission queue entries (the completion queue is twice as long; completions beyond it are
/// kept by the kernel, `IORING_FEAT_NODROP`).
const ENTRIES: u32 = 1024;
/// Provided receive buffers per worker, and their size.
pub(crate) const BUFS: u16 = 512;
pub(crate) const BUF_SIZE: usize = 4096;
/// The bytes a multishot receive delivers before it ends and is armed again (the last
/// receive may go past it by less than a buffer).
pub(crate) const MULTISHOT_LIMIT: u32 = BUF_SIZE as u32;
/// The most output one send carries.
pub(crate) const SEND_MAX: usize = 64 * 1024;
/// A send copy's capacity kept after a burst.
const SEND_KEEP: usize = 16 * 1024;
/// The most completions a coalescing wait asks for (`--coalesce`).
const COALESCE_MAX: usize = 64;
/// How often a quiet worker gives the pages of its receive buffers back (`BufRing::release`).
const RELEASE_EVERY: Duration = Duration::from_secs(1);
/// How often the loop looks at the shutdown signal and the idle connections when nothing
/// happens.
const TICK: Duration = Duration::from_millis(100);
/// How long the worker waits, after the shutdown signal, for its connections to finish.
const GRACE: Duration = Duration::from_secs(5);
/// How long it waits for the completions of what it cancelled at the end.
const CANCEL_WAIT: Duration = Duration::from_secs(2);

/// What an operation was for, in the top byte of its `user_data`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Accept = 1,
    Recv = 2,
    Send = 3,
    Wake = 4,
    /// A cancellation (its own completion says nothing the driver needs).
    Cancel = 5,
}

fn token(op: Op, slot: usize, gen: u32) -> u64 {
    (op as u64) << 56 | u64::from(gen & 0xff_ffff) << 32 | slot as u64
}

fn untoken(t: u64) -> (Option<Op>, usize, u32) {
    let op = match t >> 56 {
        1 => Some(Op::Accept),
        2 => Some(Op::Recv),
        3 => Some(Op::Send),
        4 => Some(Op::Wake),
        5 => Some(Op::Cancel),
        _ => None,
    };
    (
        op,
        (t & 0xffff_ffff) as usize,
        ((t >> 32) & 0xff_ffff) as u32,
    )
}

/// The completions the ring holds, taken off it: `(user_data, result, flags)`.
fn completions(ring: &mut IoUring) -> impl Iterator<Item = (u64, i32, u32)> + '_ {
    ring.completion()
        .map(|c| (c.user_data(), c.result(), c.flags()))
}

/// An answer from Redis for the connection in `slot` (of generation `gen`).
type Reply = (usize, u32, RemoteCall, Answer);

/// One worker: its ring, its listener, its connections.
struct Worker {
    srv: Arc<Server>,
    ring: IoUring,
    bufs: BufRing,
    listener: std::net::TcpListener,
    accepting: bool,
    /// Failed accepts (out of descriptors): the accept is armed again at this time, not at
    /// once (crate::listen::Backoff).
    accept_backoff: crate::listen::Backoff,
    accept_again: Option<Instant>,
    /// The connections' slots. A slot is a pointer: the table never shrinks (slot numbers are
    /// in the tokens of operations in flight), so after a burst it is 8 bytes per connection the
    /// worker once held at a time, not a whole `Conn` (about 1 KiB: a few hundred
    /// connections made a block of 512 KiB that stayed live, and kept the 4 MiB page of the
    /// allocator it shared with the burst's buffers resident).
    conns: Vec<Option<Box<Conn>>>,
    free: Vec<usize>,
    gens: u32,
    /// Connections to run and flush at the end of this iteration.
    dirty: Vec<usize>,
    /// Connections that yielded this round with commands left: run again next round, which
    /// then does not wait for a completion.
    later: Vec<usize>,
    /// Entries to submit.
    sqes: Vec<squeue::Entry>,
    /// Operations in flight (a multishot one counts once, until its last completion).
    in_flight: usize,
    round: u64,
    /// `--coalesce` in µs, if on and the kernel has io_uring's min_wait.
    coalesce_us: Option<u32>,
    /// Receives are multishot: the kernel ends one at [`MULTISHOT_LIMIT`] bytes.
    multishot: bool,
    /// Sends submitted in the last round.
    sent: Vec<(usize, u32)>,
    now: Instant,
    next_tick: Instant,
    /// Connections were released since the allocator was last asked to give memory back.
    trim: bool,
    /// A tick found `trim` set: the hook is tried at the end of this round.
    trim_due: bool,
    /// When the receive buffers are next looked at, and how many the kernel had taken then.
    next_release: Instant,
    taken_then: u32,
    stopping: Option<Instant>,
    /// The end: nothing is armed again.
    finishing: bool,
    /// Rules calls to Redis: run on `remote`, answered on `replies`, which wakes `wake`.
    remote: tokio::runtime::Handle,
    replies_tx: mpsc::Sender<Reply>,
    replies: mpsc::Receiver<Reply>,
    wake: Arc<OwnedFd>,
    /// The eventfd's counter, read by the ring (boxed: it must not move while a read is out).
    wake_buf: Box<[u8; 8]>,
    wake_armed: bool,
}

/// `--coalesce` in µs for a ring whose kernel has min_wait (`supported`); `None` if off, or
/// if the kernel cannot (said once per worker).
fn coalescing(srv: &Server, supported: bool) -> Option<u32> {
    let d = srv.resp.coalesce;
    if d.is_zero() {
        return None;
    }
    if !supported {
        tracing::warn!(
            "--coalesce {d:?} is off: this kernel's io_uring has no min_wait (Linux 6.12 or later)"
        );
        return None;
    }
    Some(d.as_micros().clamp(1, u128::from(u32::MAX)) as u32)
}

/// Serves RESP on `listener` until shutdown (the worker's thread; `remote` runs calls to
/// Redis). Returns once every connection has closed, or the grace period has passed.
pub(crate) fn serve(
    srv: Arc<Server>,
    listener: std::net::TcpListener,
    remote: tokio::runtime::Handle,
) -> io::Result<()> {
    let ring = {
        let mut b = IoUring::builder();
        b.setup_single_issuer().setup_defer_taskrun();
        match b.setup_cqsize(2 * ENTRIES).build(ENTRIES) {
            Ok(r) => r,
            // A kernel before 6.1 has no deferred task runs: the plain ring works as well.
            Err(_) => IoUring::builder()
                .setup_cqsize(2 * ENTRIES)
                .build(ENTRIES)?,
        }
    };
    let bufs = BufRing::new(&ring.submitter(), BUFS, BUF_SIZE, 0)?;
    srv.buffers.resized(0, bufs.bytes());
    // A blocking eventfd: the ring's read of it waits (one that does not would come back
    // EAGAIN at once). The tasks' writes never block: they add 1 to a 64-bit counter.
    // SAFETY: eventfd(2) with valid flags; its result is checked before it is owned.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });
    let coalesce_us = coalescing(&srv, ring.params().is_feature_min_timeout());
    let (replies_tx, replies) = mpsc::channel();
    let now = Instant::now();
    let mut w = Worker {
        srv,
        ring,
        bufs,
        listener,
        accepting: false,
        accept_backoff: crate::listen::Backoff::new(crate::listen::Kind::Resp),
        accept_again: None,
        conns: Vec::new(),
        free: Vec::new(),
        gens: 0,
        dirty: Vec::new(),
        later: Vec::new(),
        sqes: Vec::new(),
        in_flight: 0,
        round: 0,
        coalesce_us,
        multishot: false,
        sent: Vec::new(),
        now,
        next_tick: now + TICK,
        trim: false,
        trim_due: false,
        next_release: now + RELEASE_EVERY,
        taken_then: 0,
        stopping: None,
        finishing: false,
        remote,
        replies_tx,
        replies,
        wake,
        wake_buf: Box::new([0; 8]),
        wake_armed: false,
    };
    // `TURNSTILE_IO_URING=oneshot`: one receive armed at a time, as on a kernel without the
    // multishot limit (the tests run that path on a newer one).
    let oneshot =
        std::env::var("TURNSTILE_IO_URING").is_ok_and(|v| v.eq_ignore_ascii_case("oneshot"));
    w.multishot = !oneshot && probe::multishot_limit(&mut w.ring, &mut w.bufs);
    tracing::debug!(multishot = w.multishot, "io_uring receives");
    let r = w.run();
    w.finish();
    r
}

impl Worker {
    fn run(&mut self) -> io::Result<()> {
        self.arm_accept();
        self.arm_wake();
        let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(256);
        let mut last = 0;
        loop {
            self.submit(self.dirty.is_empty(), last)?;
            self.round += 1;
            self.now = Instant::now();
            cqes.clear();
            cqes.extend(completions(&mut self.ring));
            last = cqes.len();
            for &(t, res, flags) in &cqes {
                self.complete(t, res, flags);
            }
            // Sends of the last round still out: the client is not reading as fast as the
            // connection answers (tokio's driver sees a write that would block).
            let round = self.round;
            for (i, gen) in std::mem::take(&mut self.sent) {
                if let Some(c) = self.conn(i, gen) {
                    if c.send.is_some() && c.send_round < round && c.conn.blocked() {
                        self.mark(i);
                    }
                }
            }
            if self.now >= self.next_tick {
                self.next_tick = self.now + TICK;
                self.tick();
            }
            let dirty = std::mem::take(&mut self.dirty);
            for &i in &dirty {
                if let Some(c) = self.conns[i].as_deref_mut() {
                    c.dirty = false;
                }
                self.pump(i);
            }
            self.dirty = dirty;
            self.dirty.clear();
            let later = std::mem::take(&mut self.later);
            for &i in &later {
                self.mark(i);
            }
            self.later = later;
            self.later.clear();
            if std::mem::take(&mut self.trim_due) {
                // Not only when a round found nothing to do: with honest clients sending every
                // few milliseconds a tick almost never comes with an empty round, and the
                // memory of a burst stayed for as long as they did. The round's replies go out
                // first; a request that comes meanwhile waits for the hook (at most once a
                // second, and only after connections closed).
                self.submit(false, 0)?;
                if crate::trim::idle() {
                    self.trim = false;
                }
            }
            if let Some(since) = self.stopping {
                let live = self.conns.iter().flatten().count();
                if (live == 0 && !self.accepting) || self.now >= since + GRACE {
                    return Ok(());
                }
            }
        }
    }

    /// Pushes the entries queued and enters the kernel: waits (at most a tick) for a
    /// completion if `wait`. With `--coalesce` and `last` (the completions the last loop found)
    /// at least 2, it waits for as many again (at most [`COALESCE_MAX`]), but no longer than
    /// the coalescing time once one has come.
    fn submit(&mut self, wait: bool, last: usize) -> io::Result<()> {
        let mut at = 0;
        while at < self.sqes.len() {
            {
                let mut sq = self.ring.submission();
                while at < self.sqes.len() {
                    // SAFETY: every entry's buffers are owned by the worker until its
                    // completion (module docs: a connection's slot, the provided buffers and
                    // `wake_buf` are freed only once nothing refers to them).
                    if unsafe { sq.push(&self.sqes[at]) }.is_err() {
                        break;
                    }
                    at += 1;
                }
            }
            if at < self.sqes.len() {
                self.ring.submit()?;
            }
        }
        self.sqes.clear();
        let r = if wait {
            let ts = types::Timespec::new().nsec(TICK.as_nanos() as u32);
            let (want, min_wait) = match self.coalesce_us {
                Some(us) if last >= 2 => (last.min(COALESCE_MAX), us),
                _ => (1, 0),
            };
            let args = types::SubmitArgs::new()
                .timespec(&ts)
                .min_wait_usec(min_wait);
            self.ring.submitter().submit_with_args(want, &args)
        } else {
            self.ring.submit()
        };
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn push(&mut self, e: squeue::Entry) {
        self.sqes.push(e);
    }

    fn conn(&mut self, i: usize, gen: u32) -> Option<&mut Conn> {
        self.conns
            .get_mut(i)?
            .as_deref_mut()
            .filter(|c| c.gen & 0xff_ffff == gen)
    }

    fn mark(&mut self, i: usize) {
        if let Some(c) = self.conns[i].as_deref_mut() {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(i);
            }
        }
    }

    /// Arms the accept again if it ended, unless a failure asked to wait ([`Worker::tick`]
    /// arms it then), or the worker is stopping.
    fn rearm_accept(&mut self) {
        let waiting = self.accept_again.is_some_and(|at| self.now < at);
        if !self.accepting && !waiting && self.stopping.is_none() && !self.finishing {
            self.accept_again = None;
            self.arm_accept();
        }
    }

    fn arm_accept(&mut self) {
        let fd = types::Fd(self.listener.as_raw_fd());
        let e = opcode::AcceptMulti::new(fd)
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(token(Op::Accept, 0, 0));
        self.push(e);
        self.accepting = true;
        self.in_flight += 1;
    }

    fn arm_wake(&mut self) {
        let e = opcode::Read::new(
            types::Fd(self.wake.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            8,
        )
        .build()
        .user_data(token(Op::Wake, 0, 0));
        self.push(e);
        self.wake_armed = true;
        self.in_flight += 1;
    }

    fn complete(&mut self, t: u64, res: i32, flags: u32) {
        let (op, i, gen) = untoken(t);
        let more = cqueue::more(flags);
        if !more && op != Some(Op::Cancel) {
            self.in_flight -= 1;
        }
        match op {
            Some(Op::Accept) => {
                if !more {
                    self.accepting = false;
                }
                if res >= 0 {
                    // SAFETY: a new descriptor the kernel just made for this worker.
                    let fd = unsafe { OwnedFd::from_raw_fd(res) };
                    self.accept_backoff.ok();
                    self.accepted(TcpStream::from(fd));
                } else if res != -libc::ECANCELED {
                    let e = io::Error::from_raw_os_error(-res);
                    let wait = self.accept_backoff.failed(&e, self.now, &self.srv.guard);
                    self.accept_again = Some(self.now + wait);
                }
                self.rearm_accept();
            }
            Some(Op::Recv) => self.received(i, gen, res, flags),
            Some(Op::Send) => self.sent_done(i, gen, res),
            Some(Op::Wake) => {
                self.wake_armed = false;
                while let Ok((i, gen, call, answer)) = self.replies.try_recv() {
                    if let Some(c) = self.conn(i, gen) {
                        c.parked = false;
                        c.conn.resume(call, answer);
                        self.mark(i);
                    }
                }
                if !self.finishing {
                    self.arm_wake();
                }
            }
            Some(Op::Cancel) | None => {}
        }
    }

    /// Every tick: the shutdown signal, idle connections, closing deadlines, and memory given
    /// back once connections have gone (`trim`: at most once a second).
    fn tick(&mut self) {
        self.trim_due = self.trim;
        if self.now >= self.next_release && self.dirty.is_empty() {
            self.release_buffers();
        }
        if self.stopping.is_none() && *self.srv.shutdown.borrow() {
            self.stopping = Some(self.now);
            if self.accepting {
                let fd = types::Fd(self.listener.as_raw_fd());
                let e = opcode::AsyncCancel2::new(types::CancelBuilder::fd(fd).all())
                    .build()
                    .user_data(token(Op::Cancel, 0, 0));
                self.push(e);
            }
            for i in 0..self.conns.len() {
                if self.conns[i].is_some() {
                    self.start_drain(i);
                    self.mark(i);
                }
            }
        }
        if self.accept_again.is_some() {
            self.rearm_accept();
        }
        let idle = self.srv.resp.idle_timeout;
        let srv = self.srv.clone();
        let limits = &srv.guard.limits;
        for i in 0..self.conns.len() {
            let Some(c) = self.conns[i].as_deref_mut() else {
                continue;
            };
            let (over, why) = match c.state {
                State::Open => {
                    let age = self.now.duration_since(c.started);
                    if limits.auth_expired(age, c.conn.authenticated()) {
                        c.conn.expired(crate::listen::Expired::Auth);
                        (true, "not authenticated within --auth-timeout; closing")
                    } else {
                        let stalled = self.now.duration_since(c.progress) >= idle;
                        let over = !idle.is_zero() && !c.parked && stalled;
                        (over, "no progress for the idle timeout; closing")
                    }
                }
                State::Closing(deadline) => (self.now >= deadline, "closing deadline"),
                State::Gone { .. } => (false, ""),
            };
            if over {
                tracing::debug!(conn = c.conn.id(), "{why}");
                c.gone();
                self.mark(i);
            }
        }
    }

    /// Once a [`RELEASE_EVERY`]: the pages of the receive buffers used since the last time go
    /// back to the system, if fewer than [`BUFS`] were used in the last interval (a busy worker
    /// would only fault them in again). After a burst the worker is back to the pages its
    /// current traffic uses within a second or two.
    fn release_buffers(&mut self) {
        self.next_release = self.now + RELEASE_EVERY;
        let taken = self.bufs.taken();
        if taken == 0 {
            return;
        }
        if taken - self.taken_then >= u32::from(BUFS) {
            self.taken_then = taken;
            return;
        }
        let receiving = self.conns.iter().flatten().filter(|c| c.recv).count();
        self.bufs.release(receiving);
        self.taken_then = 0;
    }
}
