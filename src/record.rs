//! Multi-word records with exclusive writers: the sequence-word protocol.
//!
//! Variable-size records (sliding_log, window_ring, concurrency, several limits on one key)
//! are too wide for one compare-and-swap. They are words of `AtomicU64` guarded by a sequence
//! word, as in a seqlock: a writer moves the sequence from even `s` to odd `s + 1` with a CAS
//! (Acquire), updates the words, and publishes `s + 2` (Release). Every access, peeks
//! included, goes through the writer side: an optimistic reader would hand torn words to the
//! pure algorithms, which would then have to defend against impossible states.
//!
//! Writers of the *same* record therefore serialize: a writer preempted inside its few
//! hundred nanoseconds delays other writers of that key only, never other keys, and no
//! operating-system lock or syscall is involved. This is the one place in the engine where a
//! thread can wait for another; the packed algorithms never do.

use crate::algo::Cells;
use crate::sync::{spin_hint, AtomicU64, Ordering};

/// The words of a record while its writer holds it. Relaxed accesses: the sequence word's
/// Acquire (on entry) and Release (on exit) order them against other writers and readers.
pub(crate) struct AtomicCells<'a>(pub(crate) &'a [AtomicU64]);

impl Cells for AtomicCells<'_> {
    #[inline]
    fn get(&self, i: usize) -> u64 {
        // Relaxed: ordered by the sequence word (module docs).
        self.0[i].load(Ordering::Relaxed)
    }
    #[inline]
    fn set(&mut self, i: usize, v: u64) {
        // Relaxed: ordered by the sequence word (module docs).
        self.0[i].store(v, Ordering::Relaxed)
    }
}

/// Runs `f` as the exclusive writer of `words`, guarded by `seq`.
#[inline]
pub(crate) fn write<R>(
    seq: &AtomicU64,
    words: &[AtomicU64],
    f: impl FnOnce(&mut AtomicCells<'_>) -> R,
) -> R {
    let s = lock(seq);
    let r = f(&mut AtomicCells(words));
    // Release: publishes the words written above to the next writer's Acquire and to readers.
    seq.store(s + 2, Ordering::Release);
    r
}

/// Takes the writer bit; returns the even sequence it started from.
#[inline]
pub(crate) fn lock(seq: &AtomicU64) -> u64 {
    #[cfg(not(loom))]
    let mut spins = 0u32;
    loop {
        // Relaxed: only a hint; the CAS below is the synchronizing step.
        let s = seq.load(Ordering::Relaxed);
        if s & 1 == 0 {
            // Acquire: sees every word the previous writer published with its Release.
            if seq
                .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return s;
            }
        }
        spin_hint();
        // A writer preempted inside its section would keep us spinning for a whole time
        // slice on an oversubscribed machine: after a short spin, give the core away.
        #[cfg(not(loom))]
        {
            spins += 1;
            if spins % 64 == 0 {
                std::thread::yield_now();
            }
        }
    }
}
