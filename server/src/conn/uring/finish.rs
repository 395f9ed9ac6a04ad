//! The worker's end: every operation still out cancelled and its completion awaited before
//! any buffer is freed.

use super::{completions, token, Op, State, Worker, CANCEL_WAIT};
use io_uring::{opcode, types};
use std::time::Instant;

impl Worker {
    /// The end: every operation still out is cancelled and its completion awaited, so that no
    /// buffer is freed while the kernel may use it; then the buffer ring is unregistered. If
    /// completions do not all come, the memory is leaked instead.
    pub(super) fn finish(&mut self) {
        self.finishing = true;
        for c in self.conns.iter_mut().flatten() {
            c.conn.abandon();
            c.state = State::Gone { cancelled: true };
        }
        self.stopping.get_or_insert(self.now);
        if self.in_flight > 0 {
            let e = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(token(Op::Cancel, 0, 0));
            self.push(e);
        }
        let deadline = Instant::now() + CANCEL_WAIT;
        while self.in_flight > 0 && Instant::now() < deadline {
            if self.submit(true, 0).is_err() {
                break;
            }
            for (t, res, flags) in completions(&mut self.ring).collect::<Vec<_>>() {
                self.complete(t, res, flags);
            }
            self.sqes.clear();
        }
        if self.in_flight > 0 {
            tracing::warn!(
                in_flight = self.in_flight,
                "io_uring operations did not complete at shutdown; their buffers are leaked"
            );
            for c in self.conns.iter_mut().flatten() {
                std::mem::forget(std::mem::take(&mut c.send_buf));
            }
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new([0; 8])));
            return;
        }
        for i in 0..self.conns.len() {
            self.release(i);
        }
        self.srv.buffers.resized(self.bufs.bytes(), 0);
        self.bufs.unregister(&self.ring.submitter());
    }
}
