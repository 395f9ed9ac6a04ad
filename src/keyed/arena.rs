//! Per-shard arena of variable-size records (sliding_log, window_ring, concurrency, and any
//! key with several limits).
//!
//! A record is one sequence word (see `record`: its writer bit serializes writers of that
//! record) and `words` state words, all in one flat `Box<[AtomicU64]>` of
//! `capacity × (1 + words)`. A slot refers to its record by index (`LIVE | index` in the slot's
//! state word). The arena holds exactly the store's key capacity, so its memory is paid per
//! key, not per slot.
//!
//! Free records: never-used ones are handed out by a bump counter; released ones go on a
//! Treiber stack threaded through `next`, whose head carries a 32-bit tag against ABA
//! (`tag << 32 | index + 1`; 0 = empty).
//!
//! Reuse safety: a record is released only by the thread that emptied the slot pointing to it,
//! while holding the record's writer bit, and a checker re-reads the slot after taking the
//! writer bit. So a checker either sees its key still mapped to the record (and the record is
//! its key's), or retries from the table.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

pub(crate) struct Arena {
    words: usize,
    capacity: u32,
    cells: Box<[AtomicU64]>,
    next: Box<[AtomicU32]>,
    bump: AtomicU32,
    head: AtomicU64,
}

impl Arena {
    /// `None` if the memory cannot be allocated.
    pub(crate) fn new(capacity: u32, words: usize) -> Option<Self> {
        let n = (capacity as usize).checked_mul(words.checked_add(1)?)?;
        Some(Self {
            words,
            capacity,
            cells: super::alloc::zeroed_u64(n)?,
            next: super::alloc::zeroed_u32(capacity as usize)?,
            bump: AtomicU32::new(0),
            head: AtomicU64::new(0),
        })
    }

    pub(crate) fn bytes(&self) -> usize {
        self.cells.len() * 8 + self.next.len() * 4
    }

    /// What [`Arena::bytes`] will be for an arena of `capacity` records of `words` words.
    pub(crate) fn bytes_for(capacity: u32, words: usize) -> usize {
        capacity as usize * (1 + words) * 8 + capacity as usize * 4
    }

    /// The sequence word and state words of record `i`.
    #[inline]
    pub(crate) fn record(&self, i: u32) -> (&AtomicU64, &[AtomicU64]) {
        let base = i as usize * (1 + self.words);
        (
            &self.cells[base],
            &self.cells[base + 1..base + 1 + self.words],
        )
    }

    /// A free record, or `None` when all are in use.
    pub(crate) fn alloc(&self) -> Option<u32> {
        loop {
            // Acquire: pairs with `free`'s Release so `next[i]` read below is the one it wrote.
            let h = self.head.load(Ordering::Acquire);
            let idx = (h & 0xffff_ffff) as u32;
            if idx == 0 {
                break;
            }
            // Relaxed: published by the Release CAS that pushed `idx` (acquired above).
            let nxt = self.next[(idx - 1) as usize].load(Ordering::Relaxed);
            let tag = (h >> 32).wrapping_add(1);
            // Acquire: the popped record's words were published by the releasing writer.
            if self
                .head
                .compare_exchange(
                    h,
                    tag << 32 | nxt as u64,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return Some(idx - 1);
            }
        }
        // Relaxed: the counter only hands out distinct never-used indices.
        let b = self.bump.fetch_add(1, Ordering::Relaxed);
        if b < self.capacity {
            Some(b)
        } else {
            // Relaxed: as above; keeps the counter from wrapping under a flood.
            self.bump.store(self.capacity, Ordering::Relaxed);
            None
        }
    }

    /// Returns record `i` to the free stack.
    pub(crate) fn free(&self, i: u32) {
        loop {
            // Relaxed: validated by the CAS.
            let h = self.head.load(Ordering::Relaxed);
            // Relaxed: published by the Release CAS below.
            self.next[i as usize].store((h & 0xffff_ffff) as u32, Ordering::Relaxed);
            let tag = (h >> 32).wrapping_add(1);
            // Release: publishes `next[i]` and the record's words to the next `alloc`.
            if self
                .head
                .compare_exchange(
                    h,
                    tag << 32 | (i as u64 + 1),
                    Ordering::Release,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return;
            }
        }
    }
}
