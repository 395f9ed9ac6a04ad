//! The floor rows of `bench`: the memory work a keyed check cannot avoid, measured in the same
//! run as the checks it bounds, over a table of as many 16-byte slots as the store's.
//!
//! * **dependent**: one random access whose address depends on the previous load. For uniform
//!   keys it is a pointer chase through one random cycle over every slot (Sattolo's
//!   algorithm: the low half of each slot names the next); for other distributions each
//!   pre-drawn slot index is offset by a bit of the previous load that is always zero, so the
//!   access waits for it while its address keeps the row's distribution. What a single check
//!   is compared with.
//! * **load + CAS**: an independent random 16-byte load and `compare_exchange` (as the store
//!   updates a slot, portable-atomic's `AtomicU128`, `lock cmpxchg16b`).
//! * **batch**: groups of the row's batch size (32): every slot of the group prefetched first,
//!   then loaded and CASed one by one. What `check_batch` is compared with.
//!
//! Each key rank owns one slot (a fixed random injection of ranks into slots, as the store
//! gives each key its own), and the loops walk slot indices drawn before timing from the
//! row's own rank sequence: the same keys in the same order. No hashing, no clock, no
//! scan in the loops; the CPU time of each thread is read around the window, as for the rows.

use super::keys::SplitMix64;
use super::run::{phased, Phase, Step, Window, CHUNK};
use portable_atomic::{AtomicU128, Ordering};
use serde::Serialize;
use std::time::Duration;

/// One floor measurement (one JSON object of `floors`).
#[derive(Serialize, Clone, Debug)]
pub(crate) struct FloorRow {
    /// "dependent", "load_cas" or "batch".
    pub kind: &'static str,
    /// Slots per prefetched group ("batch"), 1 otherwise.
    pub batch: usize,
    pub keys: u64,
    pub distribution: String,
    pub threads: usize,
    /// 16-byte slots in the table (the store's).
    pub slots: u64,
    /// CPU-ns per access: the workers' CPU time over the window / accesses.
    pub ns_per_access: f64,
    pub accesses: u64,
    /// Fraction of the window the workers were on a CPU.
    pub on_cpu: f64,
    pub preemptions: u64,
    /// Repeats this row is the median of.
    pub runs: usize,
}

/// Which floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Dependent,
    LoadCas,
    Batch(usize),
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Dependent => "dependent",
            Kind::LoadCas => "load_cas",
            Kind::Batch(_) => "batch",
        }
    }
}

/// A random cyclic permutation of `0..n` (Sattolo's algorithm): `next[i]` is the slot after
/// `i`, and following it from any slot visits all `n` before coming back.
pub(crate) fn cycle(n: usize, rng: &mut SplitMix64) -> Vec<u32> {
    assert!(n <= u32::MAX as usize, "a floor table of {n} slots");
    let mut order: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        // j < i (not ≤ i, as Fisher-Yates would): this is what makes the result one cycle.
        let j = rng.below(i as u64) as usize;
        order.swap(i, j);
    }
    // `order` is a random cyclic order of the slots; each names its successor.
    let mut next = vec![0u32; n];
    for w in 0..n {
        next[order[w] as usize] = order[(w + 1) % n];
    }
    next
}

/// The table: the chase's successor in the low half of each slot, a counter the CAS loops
/// bump in the high half; and each key rank's slot.
pub(crate) struct Table {
    slots: Box<[AtomicU128]>,
    slot_of_rank: Vec<u32>,
}

impl Table {
    /// `slots` slots (the store's count) for `keys` key ranks; `None` if the ranks do not fit.
    pub(crate) fn new(slots: u64, keys: u64, seed: u64) -> Option<Self> {
        if keys > slots || slots > u32::MAX as u64 {
            return None;
        }
        let mut rng = SplitMix64::new(seed);
        let next = cycle(slots as usize, &mut rng);
        let slots: Box<[AtomicU128]> = next.iter().map(|&n| AtomicU128::new(n as u128)).collect();
        // A random injection of ranks into slots: the first `keys` of a random permutation.
        let mut perm: Vec<u32> = (0..slots.len() as u32).collect();
        for i in 0..keys as usize {
            let j = i + rng.below((perm.len() - i) as u64) as usize;
            perm.swap(i, j);
        }
        perm.truncate(keys as usize);
        Some(Self {
            slots,
            slot_of_rank: perm,
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.slots.len() as u64
    }

    /// The slot of each rank of `ranks` (drawn before timing).
    pub(crate) fn indices(&self, ranks: &[u64]) -> Vec<u32> {
        ranks
            .iter()
            .map(|&r| self.slot_of_rank[r as usize])
            .collect()
    }
}

/// One load and one 16-byte CAS of slot `s`, with the store's orderings (Acquire load, AcqRel
/// CAS): the high half is bumped, the chase's low half kept.
#[inline(always)]
fn load_cas(s: &AtomicU128) {
    let v = s.load(Ordering::Acquire);
    let _ = s.compare_exchange(
        v,
        v.wrapping_add(1 << 64),
        Ordering::AcqRel,
        Ordering::Acquire,
    );
}

/// `steps` steps of the pointer chase from slot `j`; the slot reached.
#[inline(never)]
fn chase(t: &[AtomicU128], mut j: usize, steps: usize) -> usize {
    for _ in 0..steps {
        // Relaxed: a private table; the address of the next load is this load's value.
        j = t[j].load(Ordering::Relaxed) as u32 as usize;
    }
    j
}

/// Loads of `idx` in order, each address offset by bit 127 of the previous load (always zero:
/// the CAS loops bump the high half by one, far from it), so each waits for the last.
#[inline(never)]
fn chained(t: &[AtomicU128], idx: &[u32]) -> usize {
    let mut z = 0usize;
    for &i in idx {
        // Relaxed: a private table.
        z = (t[i as usize + z].load(Ordering::Relaxed) >> 127) as usize;
    }
    z
}

#[inline(never)]
fn independent(t: &[AtomicU128], idx: &[u32]) {
    for &i in idx {
        load_cas(&t[i as usize]);
    }
}

/// Prefetches the line of every slot of a group of `b`, then loads and CASes each.
#[inline(never)]
fn batched(t: &[AtomicU128], idx: &[u32], b: usize) {
    for g in idx.chunks_exact(b) {
        for &i in g {
            prefetch(&t[i as usize]);
        }
        for &i in g {
            load_cas(&t[i as usize]);
        }
    }
}

#[inline(always)]
fn prefetch(s: &AtomicU128) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults; `s` is a live reference.
    unsafe {
        core::arch::x86_64::_mm_prefetch(
            s as *const AtomicU128 as *const i8,
            core::arch::x86_64::_MM_HINT_T0,
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
}

/// Runs floor `kind` on `seqs.len()` pinned threads (thread i walks `seqs[i]` round and
/// round) for `warmup`, then a measured `window`. `uniform`: the dependent floor chases the
/// cycle (else it chains the pre-drawn indices).
pub(crate) fn measure(
    table: &Table,
    kind: Kind,
    uniform: bool,
    seqs: &[&[u32]],
    warmup: Duration,
    window: Duration,
) -> (f64, u64, f64, u64) {
    let t = &table.slots[..];
    let per_thread = phased(seqs.len(), warmup, window, "floor", |i, phase| {
        worker(t, kind, uniform, seqs[i], phase)
    });
    let n: u64 = per_thread.iter().map(|x| x.0).sum();
    let cpu: u64 = per_thread.iter().map(|x| x.1).sum();
    let wall: u64 = per_thread.iter().map(|x| x.2).sum();
    let pre: u64 = per_thread.iter().map(|x| x.3).sum();
    (
        cpu as f64 / n.max(1) as f64,
        n,
        cpu as f64 / wall.max(1) as f64,
        pre,
    )
}

/// One worker of [`measure`]: walks `seq` chunk by chunk until the phase says stop, and
/// gives its accesses, CPU ns, wall ns and preemptions over the measured window.
fn worker(
    t: &[AtomicU128],
    kind: Kind,
    uniform: bool,
    seq: &[u32],
    phase: &Phase,
) -> (u64, u64, u64, u64) {
    // A chunk a whole number of batches long.
    let chunk = match kind {
        Kind::Batch(b) => CHUNK / b * b,
        _ => CHUNK,
    };
    assert!(
        chunk > 0 && seq.len() >= chunk,
        "a floor sequence shorter than a chunk"
    );
    let (mut n, mut pos, mut j) = (0u64, 0usize, seq[0] as usize);
    let mut w = Window::default();
    loop {
        match w.step(phase) {
            Step::Stop => break,
            Step::Opened => n = 0,
            Step::Go => {}
        }
        let end = pos + chunk;
        let g = &seq[pos..end];
        match kind {
            Kind::Dependent if uniform => j = chase(t, j, g.len()),
            Kind::Dependent => j = chained(t, g),
            Kind::LoadCas => independent(t, g),
            Kind::Batch(b) => batched(t, g, b),
        }
        n += g.len() as u64;
        pos = if end + chunk > seq.len() { 0 } else { end };
    }
    std::hint::black_box(j);
    let spent = w.spent();
    let wall = spent.wall.as_nanos() as u64;
    (n, spent.cpu_ns, wall, spent.preemptions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chase_is_one_cycle_through_every_slot() {
        for n in [1usize, 2, 3, 10, 1000, 4099] {
            let next = cycle(n, &mut SplitMix64::new(n as u64));
            let mut seen = vec![false; n];
            let mut j = 0usize;
            for _ in 0..n {
                assert!(
                    !seen[j],
                    "n = {n}: slot {j} visited twice before the cycle closed"
                );
                seen[j] = true;
                j = next[j] as usize;
            }
            assert_eq!(j, 0, "n = {n}: the cycle does not close after {n} steps");
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn a_table_gives_each_rank_its_own_slot_and_chases_its_cycle() {
        let t = Table::new(1000, 870, 5).unwrap();
        let mut s = t.slot_of_rank.clone();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), 870);
        assert!(s.iter().all(|&i| i < 1000));
        // The table holds the cycle: 1000 steps from any slot come back to it.
        assert_eq!(chase(&t.slots, 17, 1000), 17);
        assert_ne!(chase(&t.slots, 17, 999), 17);
        // The CAS loops keep the cycle and the chained loop's zero bit.
        let idx = t.indices(&[0, 1, 2, 869, 0]);
        independent(&t.slots, &idx);
        batched(&t.slots, &t.indices(&[3; 32]), 32);
        assert_eq!(chase(&t.slots, 17, 1000), 17);
        assert_eq!(chained(&t.slots, &idx), 0);
        assert_eq!(
            t.slots[idx[0] as usize].load(Ordering::Relaxed) >> 64,
            2,
            "rank 0 was CASed twice"
        );
        assert!(Table::new(10, 11, 1).is_none());
    }
}
