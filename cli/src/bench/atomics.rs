//! `bench --atomics`: what one read-then-CAS update of a shared location costs, 8 bytes against
//! 16, on one thread and on two threads that update the same location (a hot key).
//!
//! A keyed check of a hot key updates its 16-byte slot with `lock cmpxchg16b`; a keyless
//! limiter (turnstile's or governor's) updates one 8-byte word with `lock cmpxchg`. Both move
//! the cache line between the cores on every update, and this mode measures the instruction
//! pair alone (no clock, no transition) so that the gap between the two rows of the main
//! table can be read against it (docs/performance.md).
//!
//! It also times random accesses into a 20 MB table of 16-byte records (a 1M-key store's
//! size): one dependent miss at a time, against reads-then-CAS at independent addresses, which
//! the core overlaps although each CAS is a locked instruction.

use super::run::thread_cpu_ns;
use super::text::{fmt_count, progress};
use portable_atomic::{AtomicU128, AtomicU64, Ordering};
use std::hint::black_box;

/// Updates per thread and round.
const UPDATES: u64 = 2_000_000;
/// Rounds; the median is reported.
const ROUNDS: usize = 7;

/// A 16-byte or 8-byte cell alone on its cache lines.
#[repr(C, align(128))]
struct Cells {
    wide: AtomicU128,
    narrow: AtomicU64,
}

/// One read-then-CAS increment of a 16-byte cell, as the store updates a slot.
#[inline(always)]
fn bump_wide(a: &AtomicU128) {
    // Acquire read, AcqRel/Acquire CAS: the orderings of the store's slot update.
    let mut v = a.load(Ordering::Acquire);
    while let Err(x) = a.compare_exchange(v, v + 1, Ordering::AcqRel, Ordering::Acquire) {
        v = x;
    }
}

/// `n` read-then-CAS increments of the 16-byte cell.
#[inline(never)]
fn wide(c: &Cells, n: u64) {
    for _ in 0..n {
        bump_wide(&c.wide);
    }
}

/// `n` read-then-CAS increments of the 8-byte cell.
#[inline(never)]
fn narrow(c: &Cells, n: u64) {
    for _ in 0..n {
        // Relaxed read validated by the CAS: the keyless limiter's orderings.
        let mut v = c.narrow.load(Ordering::Relaxed);
        loop {
            match c
                .narrow
                .compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(x) => v = x,
            }
        }
    }
}

/// Median CPU-ns per update of `f` on `threads` pinned threads sharing one cell.
fn measure(threads: usize, f: fn(&Cells, u64)) -> f64 {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let mut per_round: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let c = Cells {
                wide: AtomicU128::new(0),
                narrow: AtomicU64::new(0),
            };
            let cpu: u64 = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|i| {
                        let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
                        let c = &c;
                        s.spawn(move || {
                            if let Some(core) = core {
                                core_affinity::set_for_current(core);
                            }
                            let t0 = thread_cpu_ns();
                            f(black_box(c), UPDATES);
                            thread_cpu_ns() - t0
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().expect("atomics worker panicked"))
                    .sum()
            });
            let total = (c.wide.load(Ordering::Relaxed) as u64) + c.narrow.load(Ordering::Relaxed);
            assert_eq!(total, UPDATES * threads as u64, "an increment was lost");
            cpu as f64 / (UPDATES * threads as u64) as f64
        })
        .collect();
    per_round.sort_by(f64::total_cmp);
    per_round[ROUNDS / 2]
}

/// 16-byte records in the random-access table (20 MB, the size of a 1M-key store).
const TABLE_SLOTS: usize = 1_250_000;
/// Accesses per pattern and round.
const ACCESSES: u64 = 5_000_000;

/// Slot `i`'s place in the table: a fixed mix of `i`, reduced by multiply-shift.
#[inline(always)]
fn slot_of(i: u64) -> usize {
    let x = (i ^ (i >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (((x ^ (x >> 29)) as u128 * TABLE_SLOTS as u128) >> 64) as usize
}

/// Each address depends on the previous load: one miss at a time.
#[inline(never)]
fn dependent(t: &[AtomicU128]) -> u64 {
    let mut j = 0u64;
    for i in 0..ACCESSES {
        // Relaxed: a read of a private table.
        j = t[slot_of(i ^ j)].load(Ordering::Relaxed) as u64 & 1;
    }
    j
}

/// Independent addresses, each read then CASed: how far the core overlaps the misses of
/// consecutive locked updates.
#[inline(never)]
fn independent_cas(t: &[AtomicU128]) -> u64 {
    for i in 0..ACCESSES {
        bump_wide(&t[slot_of(i)]);
    }
    0
}

/// Median CPU-ns per access of `f` over `ROUNDS` rounds on the calling thread.
fn per_access(t: &[AtomicU128], f: fn(&[AtomicU128]) -> u64) -> f64 {
    let mut v: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t0 = thread_cpu_ns();
            black_box(f(black_box(t)));
            (thread_cpu_ns() - t0) as f64 / ACCESSES as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[ROUNDS / 2]
}

/// Runs the mode: two small tables on stdout.
pub fn run() -> crate::Result<()> {
    progress(format!(
        "atomics: {} rounds of {} read-then-CAS updates per thread",
        ROUNDS,
        fmt_count(UPDATES)
    ));
    println!("update of one shared location       1 thread   2 threads (same location)");
    for (name, f) in [
        (
            "8-byte  lock cmpxchg   (AtomicU64) ",
            narrow as fn(&Cells, u64),
        ),
        ("16-byte lock cmpxchg16b (AtomicU128)", wide),
    ] {
        let one = measure(1, f);
        let two = measure(2, f);
        println!("{name}  {one:7.1} ns  {two:9.1} ns");
    }
    println!();
    println!(
        "CPU-ns per update, median of {ROUNDS} rounds; every increment is counted (asserted)."
    );
    progress("atomics: random 16-byte accesses into a 20 MB table, 1 thread");
    let t: Vec<AtomicU128> = (0..TABLE_SLOTS)
        .map(|i| AtomicU128::new(i as u128))
        .collect();
    println!();
    println!("random access into a 20 MB table, 1 thread      CPU-ns per access");
    println!(
        "load, each address depending on the last load   {:7.1}",
        per_access(&t, dependent)
    );
    println!(
        "load + 16-byte CAS, independent addresses       {:7.1}",
        per_access(&t, independent_cas)
    );
    Ok(())
}
