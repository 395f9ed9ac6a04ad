//! The keyless [`Limiter`] under loom: every record protocol it has.
//!
//! * one packed limit: CAS on an `AtomicU64` (fixed_window, sliding_window, token_bucket,
//!   leaky_bucket);
//! * two packed limits: CAS on an `AtomicU128`, all-or-nothing;
//! * variable records (sliding_log, window_ring, concurrency): the sequence-word writer
//!   protocol of `record.rs`, including permits and their leases.
//!
//! Every limiter is built inside `loom::model` (loom atomics must be). Each thread records what
//! it was answered; after the joins the answers must be those of *some* serial order: exactly
//! the bound admitted, each admission answered with a distinct `remaining`, and a final peek
//! that agrees with the admissions.

#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;
use turnstile::{Decision, Limit, Limiter, Limits, ManualClock};

/// A time well inside a one-second window (10.5 s), so that no check meets a window edge.
const T: u64 = 10_500_000_000;
const SEC: Duration = Duration::from_secs(1);

fn limiter(limits: Vec<Limit>) -> Arc<Limiter<ManualClock>> {
    Arc::new(Limiter::with_limits(
        Limits::new(limits).unwrap(),
        ManualClock::new(T),
    ))
}

/// Consumes `pre` first, then `threads` threads each check cost 1 at `T`; asserts that the
/// answers are those of some serial order: exactly `min(capacity - pre, threads)` admitted,
/// each admission answered with its own remainder, and a final peek that agrees.
fn race(limit: Limit, pre: u64, threads: usize) {
    loom::model(move || {
        let l = limiter(vec![limit]);
        let cap = limit.capacity() - pre;
        if pre > 0 {
            assert!(l.check_at(pre, T).allowed());
        }
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let l = l.clone();
                thread::spawn(move || l.check_at(1, T))
            })
            .collect();
        let ds: Vec<Decision> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let want = cap.min(threads as u64);
        let mut rem: Vec<u64> = ds
            .iter()
            .filter(|d| d.allowed())
            .map(|d| d.remaining)
            .collect();
        assert_eq!(rem.len() as u64, want, "admissions: {ds:?}");
        rem.sort_unstable();
        let serial: Vec<u64> = (cap - want..cap).collect();
        assert_eq!(rem, serial, "each admission saw its own remainder: {ds:?}");
        assert_eq!(l.check_at(0, T).remaining, cap - want, "final peek");
    });
}

/// A packed limit of capacity 2 raced by three threads (lock-free, so loom explores all
/// three). Catches a lost update in the `AtomicU64` CAS loop (a plain store, a CAS failure
/// whose fresh value is not decided again, a denial that consumes): three admissions, or two
/// answered with the same remainder.
fn packed(limit: Limit) {
    race(limit, 0, 3)
}

/// A variable record (sequence-word writer protocol) of capacity 2 with one consumed, raced
/// by two threads: exactly one more admitted. Two threads, not three: the writer bit is a spin
/// lock, and with two spinners loom's scheduler lets them yield to each other past its branch
/// limit while the holder waits. Catches a writer bit taken without Acquire or released
/// without Release (loom hands the next writer stale words, so both are admitted) and two
/// writers inside at once.
fn words(limit: Limit) {
    race(limit, 1, 2)
}

/// fixed_window 2/s: exactly two of three concurrent checks admitted.
#[test]
fn fixed_window_cas_admits_exactly_the_limit() {
    packed(Limit::fixed_window(2, SEC).unwrap());
}

/// sliding_window 2/s (the previous window empty, so the estimate is exact): exactly two.
#[test]
fn sliding_window_cas_admits_exactly_the_limit() {
    packed(Limit::sliding_window(2, SEC).unwrap());
}

/// token_bucket of capacity 2, refilling 1/s, at one instant: exactly two.
#[test]
fn token_bucket_cas_admits_exactly_the_capacity() {
    packed(Limit::token_bucket(2, 1, SEC).unwrap());
}

/// leaky_bucket meter with burst 1 (capacity 2) at one instant: exactly two.
#[test]
fn leaky_bucket_cas_admits_exactly_the_capacity() {
    packed(Limit::leaky_bucket(1, SEC, 1, None).unwrap());
}

/// sliding_log 2/s on the sequence-word record: one of two racing checks admitted.
#[test]
fn sliding_log_record_admits_exactly_the_limit() {
    words(Limit::sliding_log(2, SEC).unwrap());
}

/// window_ring 2 per 1 s in 4 sub-windows on the sequence-word record: one of two admitted.
#[test]
fn window_ring_record_admits_exactly_the_limit() {
    words(Limit::window_ring(2, SEC, 4).unwrap());
}

/// Two packed limits on the `AtomicU128` path: fixed_window 3/s and token_bucket 4 (refill
/// 1/h). Two threads check cost 2: the first fits both; the second breaks the window but fits
/// the bucket, so it must consume *neither*. Catches a partial apply (the bucket charged for
/// a denied request) and a lost update of the 16-byte record.
#[test]
fn two_limits_all_or_nothing_on_the_u128_cas() {
    loom::model(|| {
        let l = limiter(vec![
            Limit::fixed_window(3, SEC).unwrap(),
            Limit::token_bucket(4, 1, Duration::from_secs(3600)).unwrap(),
        ]);
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let l = l.clone();
                thread::spawn(move || l.check_at(2, T))
            })
            .collect();
        let ds: Vec<Decision> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(ds.iter().filter(|d| d.allowed()).count(), 1, "{ds:?}");
        // Now: window 2 of 3 used (remaining 1), bucket 2 of 4 (remaining 2): the peek shows
        // the tighter one, the window.
        let now = l.check_at(0, T);
        assert_eq!((now.limit, now.remaining), (3, 1), "{now:?}");
        // One window later the window is fresh: the peek shows the bucket, which the denied
        // request must not have touched.
        let later = l.check_at(0, T + 1_000_000_000);
        assert_eq!((later.limit, later.remaining), (4, 2), "{later:?}");
    });
}

/// Concurrency limit 1: two threads acquire, hold, and drop. Catches two permits held at once
/// (a lost update in the lease cells) and a drop that does not free the lease (the main
/// thread's acquire after the joins would fail).
#[test]
fn concurrency_permit_never_two_at_once_and_drop_frees() {
    loom::model(|| {
        let l = limiter(vec![Limit::concurrency(1, SEC).unwrap()]);
        let held = Arc::new(AtomicUsize::new(0));
        let granted = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (l, held, granted) = (l.clone(), held.clone(), granted.clone());
                thread::spawn(move || {
                    if let Ok(p) = l.acquire(1) {
                        assert_eq!(p.decision().remaining, 0);
                        assert_eq!(held.fetch_add(1, SeqCst), 0, "two permits at once");
                        granted.fetch_add(1, SeqCst);
                        held.fetch_sub(1, SeqCst);
                        drop(p);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(granted.load(SeqCst) >= 1);
        assert_eq!(l.check_at(0, T).remaining, 1, "every permit released");
        let p = l.acquire(1).expect("a dropped permit frees its capacity");
        assert!(l.acquire(1).is_err());
        drop(p);
    });
}

/// Concurrency limit 1 with a 1 s lease: a permit leaked with `mem::forget` holds the slot
/// until its lease expires, then exactly one of two racing acquirers (both leaking) gets it.
/// Catches a lease that never expires, and an expired lease handed to two acquirers.
#[test]
fn concurrency_leaked_permit_frees_after_the_lease() {
    loom::model(|| {
        let l = limiter(vec![Limit::concurrency(1, SEC).unwrap()]);
        std::mem::forget(l.acquire(1).expect("the first permit"));
        assert!(l.acquire(1).is_err(), "held by the leaked permit");
        l.clock().advance(2 * SEC);
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let l = l.clone();
                thread::spawn(move || match l.acquire(1) {
                    Ok(p) => {
                        std::mem::forget(p);
                        true
                    }
                    Err(_) => false,
                })
            })
            .collect();
        let got: usize = hs.into_iter().map(|h| h.join().unwrap() as usize).sum();
        assert_eq!(got, 1, "the expired lease frees exactly one permit");
    });
}
