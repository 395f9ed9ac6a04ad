//! The compact map under a limits class: key id → a 32-bit entry, in one array of 16-byte
//! slots, read without a lock while one writer at a time changes it.
//!
//! ```text
//!  127 126            96 95            64 63                       0
//! +---+----------------+----------------+--------------------------+
//! | T |      0         | entry + 1 (32) |  key id (64 bits)         |
//! +---+----------------+----------------+--------------------------+
//! all zero : empty (the end of a probe)
//! T = 1    : the slot is the key's; entry + 1 = 0 when the key has no entry (removed)
//! ```
//!
//! Linear probing from a home slot that a keyed mix of the id picks (multiply-shift over any
//! slot count, so a map is sized to its load, not to a power of two). A key keeps its slot
//! once placed: removal only clears the entry, so a reader that probes while the writer works
//! meets each key in one slot and never past an empty one it should have crossed. Every slot
//! is one 16-byte atomic: a reader sees a key with its old entry or its new one, never a mix.
//! Keys removed keep their slots until the map is rebuilt (a reload); `used` counts them.
//!
//! At the load factor [`LOAD`] a slot costs 16 / 0.8 = 20 bytes per key, and a lookup of a
//! key that has an entry reads 1.5 slots on average (within one or two cache lines); one of a
//! key without an entry reads about 13 slots (three or four lines, in sequence).

use crate::sync::{AtomicU128, AtomicU64, Ordering};

/// Keys per slot at capacity.
pub(crate) const LOAD: f64 = 0.8;
const TAKEN: u64 = 1 << 63;
const ENTRY: u64 = 0xffff_ffff;

/// A slot's value, from its two halves.
#[inline]
fn join(id: u64, state: u64) -> u128 {
    (state as u128) << 64 | id as u128
}

/// Key id → entry. See the module docs.
pub(crate) struct IdMap {
    slots: Box<[AtomicU128]>,
    /// Slots a key holds (with or without an entry); at most `max`.
    used: AtomicU64,
    /// Keys with an entry.
    len: AtomicU64,
    max: u64,
    seed: u64,
}

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Put {
    /// The key had no entry.
    Added,
    /// The key's entry was replaced (the old one).
    Replaced(u32),
    /// No slot left for a new key.
    Full,
}

impl IdMap {
    /// A map with room for `keys` keys at [`LOAD`], its placement mixed by `seed`.
    pub(crate) fn new(keys: u64, seed: u64) -> Self {
        let n = ((keys.max(1) as f64 / LOAD).ceil() as usize).max(keys as usize + 1);
        Self {
            // Zeroed pages, touched as keys land (a class sized for growth costs its
            // entries' pages, not its capacity's). An allocation that fails aborts, as
            // `Vec` does: the class's capacity is bounded by `MAX_CAPACITY`.
            slots: crate::keyed::alloc::zeroed_u128(n).unwrap_or_else(|| {
                std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u128; 1]>())
            }),
            used: AtomicU64::new(0),
            len: AtomicU64::new(0),
            max: keys,
            seed,
        }
    }

    /// Keys with an entry.
    pub(crate) fn len(&self) -> u64 {
        // Relaxed: a count for reports.
        self.len.load(Ordering::Relaxed)
    }

    /// Keys the map holds at most (those removed since it was built included).
    pub(crate) fn capacity(&self) -> u64 {
        self.max
    }

    /// Bytes the map allocated.
    pub(crate) fn bytes(&self) -> usize {
        self.slots.len() * 16 + std::mem::size_of::<Self>()
    }

    /// The home slot of `id`.
    #[inline]
    fn home(&self, id: u64) -> usize {
        // The murmur3 finalizer over id ^ seed (numeric ids are not spread), then
        // multiply-shift onto the slot count.
        let mut x = id ^ self.seed;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        ((x as u128 * self.slots.len() as u128) >> 64) as usize
    }

    /// Fetches the line of `id`'s home slot (a hint).
    #[inline]
    pub(crate) fn prefetch(&self, id: u64) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        // SAFETY: prefetch is a hint that never faults; the address is in the slice.
        unsafe {
            let p = self.slots.as_ptr().add(self.home(id)) as *const i8;
            core::arch::x86_64::_mm_prefetch(p, core::arch::x86_64::_MM_HINT_T0);
        }
        #[cfg(not(all(target_arch = "x86_64", not(loom))))]
        let _ = id;
    }

    /// The slot index holding `id` and its state, or `None` at the first empty slot.
    #[inline]
    fn find(&self, id: u64) -> Option<(usize, u64)> {
        let n = self.slots.len();
        let mut i = self.home(id);
        // At most `max` < n slots are taken: a probe meets an empty slot within n steps.
        for _ in 0..n {
            // Acquire: pairs with the writer's Release store, so the entry read is the one
            // it published (and the value table's entry it names, written before).
            let v = self.slots[i].load(Ordering::Acquire);
            let st = (v >> 64) as u64;
            if st & TAKEN == 0 {
                return None;
            }
            if v as u64 == id {
                return Some((i, st));
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
        None
    }

    /// `id`'s entry, if it has one.
    #[inline]
    pub(crate) fn get(&self, id: u64) -> Option<u32> {
        let (_, st) = self.find(id)?;
        (st & ENTRY).checked_sub(1).map(|e| e as u32)
    }

    /// Sets `id`'s entry. One writer at a time (the caller holds the writer lock).
    pub(crate) fn put(&self, id: u64, entry: u32) -> Put {
        let new = join(id, TAKEN | (entry as u64 + 1));
        if let Some((i, st)) = self.find(id) {
            // Release: publishes the entry (and what it names) to readers' Acquire loads.
            self.slots[i].store(new, Ordering::Release);
            return match (st & ENTRY).checked_sub(1) {
                Some(old) => Put::Replaced(old as u32),
                None => {
                    // Relaxed: counts.
                    self.len.fetch_add(1, Ordering::Relaxed);
                    Put::Added
                }
            };
        }
        // Relaxed: only this writer changes it.
        if self.used.load(Ordering::Relaxed) >= self.max {
            return Put::Full;
        }
        let n = self.slots.len();
        let mut i = self.home(id);
        // Relaxed: the writer's own earlier stores (one writer at a time).
        while self.slots[i].load(Ordering::Relaxed) != 0 {
            i += 1;
            if i == n {
                i = 0;
            }
        }
        // Release: as above.
        self.slots[i].store(new, Ordering::Release);
        // Relaxed: counts.
        self.used.fetch_add(1, Ordering::Relaxed);
        self.len.fetch_add(1, Ordering::Relaxed);
        Put::Added
    }

    /// Removes `id`'s entry (its slot stays the key's); the entry it had.
    pub(crate) fn remove(&self, id: u64) -> Option<u32> {
        let (i, st) = self.find(id)?;
        let old = (st & ENTRY).checked_sub(1)? as u32;
        // Release: as in `put`.
        self.slots[i].store(join(id, TAKEN), Ordering::Release);
        // Relaxed: counts.
        self.len.fetch_sub(1, Ordering::Relaxed);
        Some(old)
    }

    /// Visits every key with an entry (a scan, not linearizable).
    pub(crate) fn for_each(&self, mut f: impl FnMut(u64, u32)) {
        for s in self.slots.iter() {
            // Acquire: as in `find`.
            let v = s.load(Ordering::Acquire);
            let st = (v >> 64) as u64;
            if let Some(e) = (st & ENTRY).checked_sub(1) {
                f(v as u64, e as u32);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn entries_are_set_replaced_removed_and_kept_in_their_slot() {
        let m = IdMap::new(100, 7);
        assert_eq!(m.get(5), None);
        assert_eq!(m.put(5, 1), Put::Added);
        assert_eq!(m.put(5, 2), Put::Replaced(1));
        assert_eq!(m.get(5), Some(2));
        assert_eq!(m.put(0, 9), Put::Added, "id 0 is a key like any other");
        assert_eq!(m.get(0), Some(9));
        assert_eq!(m.remove(5), Some(2));
        assert_eq!((m.get(5), m.remove(5), m.len()), (None, None, 1));
        assert_eq!(m.put(5, 3), Put::Added, "back in its own slot");
        let mut seen = Vec::new();
        m.for_each(|id, e| seen.push((id, e)));
        seen.sort_unstable();
        assert_eq!(seen, vec![(0, 9), (5, 3)]);
    }

    #[test]
    fn a_full_map_refuses_new_keys_only() {
        let m = IdMap::new(10, 1);
        for id in 0..10 {
            assert_eq!(m.put(id * 7919, id as u32), Put::Added);
        }
        assert_eq!(m.put(1, 0), Put::Full);
        assert_eq!(m.put(0, 5), Put::Replaced(0));
        m.remove(7919);
        assert_eq!(m.put(1, 0), Put::Full, "a removed key keeps its slot");
        for id in 0..10u64 {
            assert_eq!(
                m.get(id * 7919),
                (id != 1).then_some(if id == 0 { 5 } else { id as u32 })
            );
        }
    }

    /// Readers never see another key's entry, nor lose a key that stays, while the writer
    /// adds, replaces and removes entries of others around it.
    #[test]
    fn readers_see_each_key_whole_while_the_writer_works() {
        let m = IdMap::new(4096, 3);
        for id in 0..1000u64 {
            m.put(id, (id as u32) << 4);
        }
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (m, stop) = (&m, &stop);
                s.spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) || n < 10_000 {
                        let id = (n * 37 + t) % 1000;
                        let e = m.get(id).expect("a key that stays is always found");
                        assert_eq!(e >> 4, id as u32, "key {id} read {e:#x}");
                        let other = 1000 + n % 3000;
                        if let Some(e) = m.get(other) {
                            assert_eq!(e >> 4, other as u32);
                        }
                        n += 1;
                    }
                });
            }
            for round in 0..20u32 {
                for id in 0..1000u64 {
                    m.put(id, ((id as u32) << 4) | (round % 16));
                }
                for id in 1000..4000u64 {
                    if (id as u32 + round) % 3 == 0 {
                        m.remove(id);
                    } else {
                        m.put(id, (id as u32) << 4);
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}
