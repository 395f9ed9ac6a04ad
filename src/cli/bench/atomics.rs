//! `bench --atomics`: what one read-then-CAS update of a shared location costs, 8 bytes against
//! 16, on one thread and on two threads that update the same location (a hot key).
//!
//! A keyed check of a hot key updates its 16-byte slot with `lock cmpxchg16b`; a keyless
//! limiter (turnstile's or governor's) updates one 8-byte word with `lock cmpxchg`. Both move
//! the cache line between the cores on every update, and this mode measures the instruction
//! pair alone (no clock, no transition) so that the gap between the two rows of the main
//! table can be read against it (docs/performance.md).

use super::run::thread_cpu_ns;
use super::{fmt_count, progress};
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

/// `n` read-then-CAS increments of the 16-byte cell.
#[inline(never)]
fn wide(c: &Cells, n: u64) {
    for _ in 0..n {
        // Acquire read, AcqRel/Acquire CAS: the orderings of the store's slot update.
        let mut v = c.wide.load(Ordering::Acquire);
        loop {
            match c
                .wide
                .compare_exchange(v, v + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(x) => v = x,
            }
        }
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

/// Runs the mode: a four-row table on stdout.
pub fn run() -> Result<(), String> {
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
    Ok(())
}
