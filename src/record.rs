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
//!
//! The writer bit is held by a [`WriteGuard`], which publishes the sequence when dropped,
//! unwinding included: a panic inside a section (none should be reachable; the algorithms are
//! total) leaves the record's words as the section left them, and frees the record for the
//! next writer instead of wedging it — and, through reclaim and eviction, which take the
//! writer bit of every record they judge, every insertion whose probe range holds it.

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
    let _writer = lock(seq);
    f(&mut AtomicCells(words))
}

/// The writer bit of a record, held. Dropping it (or unwinding past it) ends the section.
#[must_use = "dropping the guard releases the writer bit at once"]
pub(crate) struct WriteGuard<'a> {
    seq: &'a AtomicU64,
    /// The even sequence the section started from.
    start: u64,
}

impl Drop for WriteGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release: publishes the words written in the section to the next writer's Acquire.
        self.seq.store(self.start + 2, Ordering::Release);
    }
}

/// Takes the writer bit of `seq`; it is released when the guard drops.
#[inline]
pub(crate) fn lock(seq: &AtomicU64) -> WriteGuard<'_> {
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
                return WriteGuard { seq, start: s };
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::algo::Cells;

    /// A panic inside a section releases the writer bit (before, the record stayed odd and
    /// the next writer spun forever).
    #[test]
    fn a_panic_inside_a_section_releases_the_writer_bit() {
        let seq = AtomicU64::new(0);
        let words = [AtomicU64::new(0), AtomicU64::new(0)];
        let r = std::panic::catch_unwind(|| {
            write(&seq, &words, |c| {
                c.set(0, 7);
                panic!("a transition that panics")
            })
        });
        assert!(r.is_err());
        assert_eq!(seq.load(Ordering::Relaxed), 2, "released and published");
        // The next writer gets in and sees what the section wrote.
        assert_eq!(write(&seq, &words, |c| c.get(0)), 7);
        assert_eq!(seq.load(Ordering::Relaxed), 4);
    }
}
