//! The race from the notes: limit 3, two requests already counted, two requests arrive at
//! once. A read-then-write limiter lets both read 2 and both pass; a correct one admits exactly
//! one. Checked on the keyless fixed window and on the keyed store, and — to show that the
//! model can tell — on the naive limiter itself, which loom must catch.

#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Limit, Limiter, Limits, ManualClock};

/// 12:00:03 in ns: inside the 12:00:00 one-minute window (note 000).
const T: u64 = (12 * 3600 + 3) * 1_000_000_000;
const KEY: u64 = 42;

fn limits() -> Limits {
    Limits::new(vec![
        Limit::fixed_window(3, Duration::from_secs(60)).unwrap()
    ])
    .unwrap()
}

/// Runs `check` on two threads at once and returns how many were admitted.
fn two_at_once<S: Send + Sync + 'static>(s: Arc<S>, check: fn(&S) -> bool) -> usize {
    let hs: Vec<_> = (0..2)
        .map(|_| {
            let s = s.clone();
            thread::spawn(move || check(&s))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap() as usize).sum()
}

/// Limit 3 with 2 already counted, two concurrent checks: exactly one admitted, on the keyless
/// fixed window (CAS on one `AtomicU64`) and on the keyed store (16-byte CAS on the key's
/// slot). Catches any read-then-write update of the count (both read 2, both pass: 4 > 3) and,
/// the other way, a CAS retry that denies both.
#[test]
fn notes_race_limit_3_count_2_two_threads_exactly_one_admitted() {
    loom::model(|| {
        let l = Arc::new(Limiter::with_limits(limits(), ManualClock::new(T)));
        assert!(l.check_at(2, T).allowed());
        let admitted = two_at_once(l.clone(), |l| l.check_at(1, T).allowed());
        assert_eq!(admitted, 1, "keyless fixed_window");
        assert_eq!(l.check_at(0, T).remaining, 0);
    });
    loom::model(|| {
        let store = Store::builder(limits())
            .capacity(1)
            .shards(1)
            .seed(1)
            .build_with_clock(ManualClock::new(T))
            .unwrap();
        let s = Arc::new(store);
        assert!(s.check_at(&KEY, 2, T).allowed());
        let admitted = two_at_once(s.clone(), |s| s.check_at(&KEY, 1, T).allowed());
        assert_eq!(admitted, 1, "keyed store");
        assert_eq!(s.peek_at(&KEY, T).remaining, 0);
        assert_eq!(s.live_ids(), vec![KEY]);
    });
}

/// The notes' naive limiter: load the count; if below the limit, store count + 1. Each access
/// is atomic, the pair is not.
struct Naive {
    count: AtomicU64,
    limit: u64,
}

impl Naive {
    fn check(&self) -> bool {
        let c = self.count.load(SeqCst);
        if c < self.limit {
            self.count.store(c + 1, SeqCst);
            true
        } else {
            false
        }
    }
}

/// Proof that the model has teeth: the same race on the naive read-then-write limiter. Loom
/// must find the interleaving where both threads read 2 and both are admitted; if this test
/// ever passes, the models above prove nothing.
#[test]
#[should_panic(expected = "naive limiter")]
fn naive_read_then_write_limiter_is_caught() {
    loom::model(|| {
        let n = Arc::new(Naive {
            count: AtomicU64::new(2),
            limit: 3,
        });
        let admitted = two_at_once(n, Naive::check);
        assert_eq!(
            admitted, 1,
            "naive limiter admitted {admitted} of 2 at count 2/3"
        );
    });
}
