//! The keys holding a lease, for the sweep: a fixed open-addressing set of key ids, each with
//! the time it is next worth looking at, so that a sweep costs a scan of words and a look at
//! the records that are due, not a lookup of every record in the table.
//!
//! Lock-free: an id is added by CAS into the first empty slot of its probe run (a settled
//! grant, once per lease: the record's `LISTED` flag), and removed by the sweep when it is
//! due. Room: twice the table's records, and a record holds at most one lease, so
//! a run ends at an empty slot; were every slot of a run taken, the lease is not listed and
//! is given back by nothing but its end (counted then as stranded if unspent).

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots probed from an id's home.
const RUN: usize = 64;

pub(crate) struct Listed {
    ids: Box<[AtomicU64]>,
    due: Box<[AtomicU64]>,
    mask: usize,
}

/// Id 0 marks an empty slot; the id 0 is listed as 1 (the sweep looks it up by the id it
/// reads back, and both look up the same record only if they are the same key: an id is a
/// hash, and 0 and 1 colliding costs one wasted look).
fn stored(id: u64) -> u64 {
    id.max(1)
}

impl Listed {
    pub(crate) fn new(records: u64) -> Self {
        let n = (2 * records).next_power_of_two().max(RUN as u64) as usize;
        Self {
            ids: (0..n).map(|_| AtomicU64::new(0)).collect(),
            due: (0..n).map(|_| AtomicU64::new(0)).collect(),
            mask: n - 1,
        }
    }

    /// Lists `id`, due at `due` (local ns); false if its run is full.
    pub(crate) fn add(&self, id: u64, due: u64) -> bool {
        let v = stored(id);
        let home = (v.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize;
        for i in 0..RUN {
            let s = (home + i) & self.mask;
            // Relaxed: the due time is a hint for the sweep, which takes the record's writer
            // bit before it reads anything of the lease.
            self.due[s].store(due, Ordering::Relaxed);
            // AcqRel: the slot is taken by one adder only.
            match self.ids[s].compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(x) if x == v => return true,
                Err(_) => {}
            }
        }
        false
    }

    /// Calls `f(slot, id)` for every listed id due at `now` (every one with `all`).
    pub(crate) fn due(&self, now: u64, all: bool, mut f: impl FnMut(usize, u64)) {
        for (s, a) in self.ids.iter().enumerate() {
            // Acquire: pairs with the adder's CAS.
            let id = a.load(Ordering::Acquire);
            // Relaxed: a hint (above).
            if id != 0 && (all || self.due[s].load(Ordering::Relaxed) <= now) {
                f(s, id);
            }
        }
    }

    /// Empties slot `s`, which held `id`. The sweep removes a due key first, then looks at
    /// its record (under the writer bit): a lease still held is added again, a lease over
    /// clears the record's `LISTED` flag, and a grant settled after that adds the key anew;
    /// so a key holding a lease is always listed or about to be.
    pub(crate) fn remove(&self, s: usize, id: u64) {
        // AcqRel: pairs with the adder's CAS.
        let _ = self.ids[s].compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}
