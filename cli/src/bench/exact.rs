//! The hot-key exactness checks the default suite ends with: every thread on one key, and
//! the admitted count compared with what the limit allows — exactly with a frozen clock (no
//! lost update, no double admission, including the race to insert the key), at most with the
//! real one.

use super::keys;
use super::text::progress;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Clock, Limit, Limiter, Limits, ManualClock};

/// One hot-key exactness check.
#[derive(Serialize, Debug)]
pub(crate) struct Exactness {
    pub limiter: &'static str,
    pub algorithm: &'static str,
    pub clock: &'static str,
    pub threads: usize,
    pub attempts: u64,
    pub admitted: u64,
    /// The most the limit may admit over the run (exact for the frozen clock).
    pub bound: u64,
    /// admitted == bound (frozen clock), admitted ≤ bound (real clock: when the threads are
    /// descheduled the bucket overflows and tokens lapse, so only the upper bound is exact).
    pub ok: bool,
}

impl Exactness {
    /// The check as one line of the table's footer.
    pub(crate) fn line(&self) -> String {
        format!(
            "{:<8} {:<13} {:<6} clock: admitted {} of {} attempts, bound {} ({}) → {}",
            self.limiter,
            self.algorithm,
            self.clock,
            self.admitted,
            self.attempts,
            self.bound,
            if self.clock == "frozen" {
                "exact"
            } else {
                "at most"
            },
            match (self.ok, self.clock) {
                (true, "frozen") => "ok, no lost or doubled update",
                (true, _) => "ok, never over the limit",
                _ => "MISMATCH",
            }
        )
    }

    /// A frozen-clock check: exactly `bound` admitted.
    fn frozen(
        limiter: &'static str,
        algorithm: &'static str,
        threads: usize,
        attempts: u64,
        admitted: u64,
        bound: u64,
    ) -> Self {
        Exactness {
            limiter,
            algorithm,
            clock: "frozen",
            threads,
            attempts,
            admitted,
            bound,
            ok: admitted == bound,
        }
    }
}

/// `threads` pinned threads each make `per_thread` checks through `f`; admitted in total.
fn hammer(threads: usize, per_thread: u64, f: &(dyn Fn() -> bool + Sync)) -> u64 {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let total = AtomicU64::new(0);
    std::thread::scope(|s| {
        for i in 0..threads {
            let (total, cores) = (&total, &cores);
            s.spawn(move || {
                if !cores.is_empty() {
                    core_affinity::set_for_current(cores[i % cores.len()]);
                }
                let n = (0..per_thread).filter(|_| f()).count() as u64;
                // Relaxed: summed after the scope joins every thread.
                total.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    total.load(Ordering::Relaxed)
}

/// Every thread on one key: a frozen clock must admit exactly the limit (no lost update, no
/// double admission, including the race to insert the key); the real clock at most
/// capacity + elapsed / T.
pub(crate) fn hot_key_checks(threads: usize) -> crate::Result<Vec<Exactness>> {
    const B: u64 = 300_000;
    let per = B * 2 / threads as u64;
    let attempts = per * threads as u64;
    let hot = keys::key_id(0);
    let mut v = Vec::new();
    let hour = Duration::from_secs(3600);
    let cfgs: [(&'static str, Limit); 2] = [
        ("token_bucket", Limit::token_bucket(B, 1, hour)?),
        ("fixed_window", Limit::fixed_window(B, hour)?),
    ];
    for (name, l) in cfgs {
        let limits = Limits::new(vec![l])?;
        let store = Store::builder(limits.clone())
            .capacity(1024)
            .build_with_clock(ManualClock::new(1_000))?;
        let admitted = hammer(threads, per, &|| store.check(&hot, 1).allowed());
        v.push(Exactness::frozen(
            "store", name, threads, attempts, admitted, B,
        ));
        let lim = Limiter::with_limits(limits, ManualClock::new(1_000));
        let admitted = hammer(threads, per, &|| lim.check(1).allowed());
        v.push(Exactness::frozen(
            "limiter", name, threads, attempts, admitted, B,
        ));
    }
    // Real clock: capacity 1000, one token per µs; saturated by every thread for ~0.3 s.
    let cap = 1_000u64;
    let interval = 1_000u64;
    let limits = Limits::new(vec![Limit::token_bucket(
        cap,
        1_000_000,
        Duration::from_secs(1),
    )?])?;
    let store = Store::builder(limits).capacity(1024).build()?;
    let t0 = store.clock().now();
    let per = 4_000_000 / threads as u64;
    let admitted = hammer(threads, per, &|| store.check(&hot, 1).allowed());
    let t1 = store.clock().now();
    let bound = cap + (t1 - t0) / interval;
    v.push(Exactness {
        limiter: "store",
        algorithm: "token_bucket",
        clock: "real",
        threads,
        attempts: per * threads as u64,
        admitted,
        bound,
        ok: admitted <= bound,
    });
    progress("hot-key exactness checks done");
    Ok(v)
}
