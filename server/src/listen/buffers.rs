//! [`Buffers`]: what RESP connections hold beyond their fixed part, and the server-wide budget
//! of what they may defer — the RESP side of the guard's bytes (request bodies are
//! [`super::body`]'s).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Memory the RESP connections hold beyond their fixed part, and the budget of what they may
/// defer (output their clients have not read, beyond `OUTPUT_PAUSE`,
/// and queued `MULTI` commands, beyond `QUEUE_FREE`).
pub(crate) struct Buffers {
    /// Bytes of every RESP connection's buffers (their capacities), now.
    pub(crate) bytes: AtomicUsize,
    /// Bytes of the deferred budget in use.
    pub(crate) deferred: AtomicUsize,
    /// The deferred budget.
    pub(crate) deferred_max: usize,
}

impl Buffers {
    /// Takes `n` bytes of the deferred budget, if there are.
    pub(crate) fn reserve(&self, n: usize) -> bool {
        // Relaxed: a counter of bytes; no other memory is published through it.
        let before = self.deferred.fetch_add(n, Ordering::Relaxed);
        if before + n <= self.deferred_max {
            return true;
        }
        self.deferred.fetch_sub(n, Ordering::Relaxed);
        false
    }

    /// Counts `n` bytes as borrowed whether or not the budget has them (memory already
    /// held: the next [`Buffers::reserve`] is refused until it is given back).
    pub(crate) fn force(&self, n: usize) {
        // Relaxed: see `reserve`.
        self.deferred.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives back `n` bytes of the deferred budget.
    pub(crate) fn release(&self, n: usize) {
        if n > 0 {
            // Relaxed: see `reserve`.
            self.deferred.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// A change of a connection's buffer capacities, from `old` to `new` bytes.
    pub(crate) fn resized(&self, old: usize, new: usize) {
        // Relaxed: a gauge.
        if new > old {
            self.bytes.fetch_add(new - old, Ordering::Relaxed);
        } else if old > new {
            self.bytes.fetch_sub(old - new, Ordering::Relaxed);
        }
    }
}
