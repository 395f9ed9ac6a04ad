//! A connection's output: written as it is produced, let go once written, and its memory past
//! the connection's own allowance borrowed from the server-wide deferred budget (module docs
//! of [`super`], "Output").

use super::{Connection, BUDGET_STEP, MAX_REPLY, OUTPUT_PAUSE};

impl Connection {
    /// The longest reply one command writes (`ECHO` and `PING` echo an argument).
    pub(super) fn reply_max(&self) -> usize {
        self.reply
    }

    /// [`Connection::reply_max`] for a listener with `max_bulk` (kept in the connection: it
    /// is read before every command).
    pub(super) fn reply_for(max_bulk: usize) -> usize {
        MAX_REPLY.max(max_bulk + 32)
    }

    /// Output capacity a connection holds of its own: [`OUTPUT_PAUSE`] and one reply. Beyond
    /// it every byte of capacity is borrowed from the deferred budget (`out_reserved`).
    pub(super) fn out_base(&self) -> usize {
        OUTPUT_PAUSE + self.reply_max()
    }

    /// Gives back the budget the output's capacity no longer uses.
    pub(super) fn settle_reserved(&mut self) {
        let used = self.out.capacity().saturating_sub(self.out_base());
        if used < self.out_reserved {
            self.srv.buffers.release(self.out_reserved - used);
            self.out_reserved = used;
        }
    }

    /// `n` bytes of [`Connection::output`] were written.
    pub(crate) fn wrote(&mut self, n: usize) {
        self.written = (self.written + n).min(self.out.len());
        let cap = self.out.capacity();
        if self.written == self.out.len() {
            self.out.clear();
            self.written = 0;
            // Its own allowance is kept: a pipeline's next batch grows nothing.
            if cap > self.out_base() {
                self.out.shrink_to(self.out_base());
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
        if self.out.capacity() != cap || self.out_reserved > 0 {
            self.settle_reserved();
            self.account();
        }
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
    pub(super) fn room(&mut self) -> bool {
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
        // Before authentication, nothing is lent: the client's own allowance is all it may
        // make the server hold (a flood of NOAUTH replies cannot take the budget).
        if !self.authenticated() {
            return false;
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
}
