//! The store's own unit tests (its behaviour is tested through its API in `tests/`).

use super::*;
use crate::algo::Cells;
use crate::keyed::table::{Op, Refusal};
use crate::keyed::FullPolicy;
use crate::{ManualClock, Outcome};
use std::time::Duration;

/// An operation whose transition panics (none of the store's can: the algorithms are total).
struct Panics;

impl Op for Panics {
    type Out = ();
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, _: &mut C) {
        panic!("a transition that panics")
    }
    fn absent(&mut self) {
        unreachable!("the key is live")
    }
    fn refused(&mut self, _: Refusal) {
        unreachable!("the key is live")
    }
}

const S: u64 = 1_000_000_000;

/// Runs `f` on its own thread and returns its result; fails if it has not finished within
/// 60 s (a wedged record makes its writers spin forever).
fn finishes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what}: still spinning after 60 s, the record is wedged"))
}

/// A transition that panics inside a record's writer section (run under `catch_unwind`)
/// leaves that key usable, and insertions whose probe range holds it (which take its writer
/// bit to judge it for reclaim) go on. Before the writer bit was released on unwind, both
/// spun forever.
#[test]
fn a_panic_inside_a_record_section_wedges_nothing() {
    let l = Limit::sliding_log(2, Duration::from_secs(1)).unwrap();
    let store = Arc::new(
        Store::builder(Limits::new(vec![l]).unwrap())
            .capacity(8)
            .shards(1)
            .seed(3)
            .policy(FullPolicy::Reject)
            .build_with_clock(ManualClock::new(0))
            .unwrap(),
    );
    // Fill the arena: every record live.
    let live: Vec<u64> = (0..64u64)
        .filter(|k| store.check_at(k, 1, S).outcome == Outcome::Allowed)
        .collect();
    assert_eq!(live.len() as u64, store.capacity(), "{live:?}");
    let key = live[0];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.run(key, S, false, &mut Panics)
    }));
    assert!(r.is_err());
    // The key goes on: its second request of two per second is admitted, the third not.
    let st = Arc::clone(&store);
    let (a, b) = finishes("a check of the key", move || {
        (
            st.check_at(&key, 1, S).allowed(),
            st.check_at(&key, 1, S).allowed(),
        )
    });
    assert!(a && !b);
    // The others stay busy; at 3 s only the key's record is idle. A new key's insertion
    // must judge the records of its range (the whole table here) until it finds that one.
    for &k in &live[1..] {
        assert!(store.check_at(&k, 1, 5 * S / 2).allowed());
    }
    let st = Arc::clone(&store);
    let d = finishes("an insertion probing the key", move || {
        st.check_at(&1_000u64, 1, 3 * S)
    });
    assert!(d.allowed(), "{d:?}");
    assert_eq!(store.stats().reclaimed, 1);
    assert!(
        store.peek_at(&key, 3 * S).remaining == 2,
        "the key's record was the one reclaimed"
    );
}

/// A store built with `batch_hints(false)` never writes a tag (its tag words stay zero pages),
/// one with hints tags every live key; both decide the same.
#[test]
fn a_store_without_batch_hints_sets_no_tag() {
    let limit = Limit::token_bucket(3, 1, Duration::from_secs(1)).unwrap();
    let build = |hints| {
        Store::builder(Limits::new(vec![limit]).unwrap())
            .capacity(1_000)
            .seed(5)
            .batch_hints(hints)
            .build_with_clock(ManualClock::new(0))
            .unwrap()
    };
    let (tagged, plain) = (build(true), build(false));
    for k in 0..500u64 {
        for _ in 0..2 {
            assert_eq!(tagged.check_at(&k, 1, 1_000), plain.check_at(&k, 1, 1_000));
        }
    }
    let tags = |s: &Store<ManualClock>| s.shards.iter().map(|x| x.tagged_slots()).sum::<usize>();
    assert_eq!(tags(&tagged), 500);
    assert_eq!(tags(&plain), 0);
}
