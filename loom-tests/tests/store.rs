//! The keyed [`Store`] under loom: insertion through the bucket header (with helping), slot
//! reclaim and reuse, eviction, the full-store policies, arena records behind their writer
//! bit, and the arena's free list.
//!
//! The invariant from `src/keyed/table.rs`: **a key is never live twice**. Every model checks
//! it after the joins (`live_ids()` without duplicates, and the live counter equal to the live
//! slots), along with the admissions each key got.
//!
//! Stores are one shard with a fixed seed, and tiny: under `cfg(loom)` a bucket is two slots
//! and a key's two ranges are one bucket each (`table.rs`), so capacity 1 is one bucket (every
//! key's two homes coincide) and capacity 2 is two buckets.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use std::time::Duration;
use turnstile::keyed::{FullPolicy, KeyHasher, Store};
use turnstile::{Decision, Limit, Limits, ManualClock, Outcome};

const MS: u64 = 1_000_000;
const SEC: Duration = Duration::from_secs(1);
/// A time well inside a one-second window.
const T: u64 = 10_500 * MS;
const SEED: u64 = 1;

fn store(limits: Vec<Limit>, capacity: u64, policy: FullPolicy) -> Arc<Store<ManualClock>> {
    Arc::new(
        Store::builder(Limits::new(limits).unwrap())
            .capacity(capacity)
            .shards(1)
            .seed(SEED)
            .policy(policy)
            .build_with_clock(ManualClock::new(T))
            .unwrap(),
    )
}

fn fixed(limit: u64) -> Vec<Limit> {
    vec![Limit::fixed_window(limit, SEC).unwrap()]
}

fn log(limit: u64) -> Vec<Limit> {
    vec![Limit::sliding_log(limit, SEC).unwrap()]
}

/// Runs each closure on its own thread and returns their answers in order.
fn spawn_all<R: Send + 'static>(fs: Vec<Box<dyn FnOnce() -> R + Send>>) -> Vec<R> {
    let hs: Vec<_> = fs.into_iter().map(thread::spawn).collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// A check of `key` at `now` with `cost`, to run on another thread.
fn check_n(s: &Arc<Store<ManualClock>>, key: u64, cost: u64, now: u64) -> Job {
    let s = s.clone();
    Box::new(move || s.check_at(&key, cost, now))
}

/// A check of `key` at `now` with cost 1, to run on another thread.
fn check(s: &Arc<Store<ManualClock>>, key: u64, now: u64) -> Job {
    check_n(s, key, 1, now)
}

type Job = Box<dyn FnOnce() -> Decision + Send>;

/// The invariant: no key live twice, and the live counter agrees with the live slots.
/// Returns the live keys, sorted.
fn live_once(s: &Store<ManualClock>) -> Vec<u64> {
    let mut ids = s.live_ids();
    ids.sort_unstable();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "a key is live twice: {:?}", s.live_ids());
    assert_eq!(s.len(), n, "live counter vs live slots: {:?}", s.stats());
    ids
}

/// Every record created is live, reclaimed or evicted (for models without `reset`).
fn accounted(s: &Store<ManualClock>) {
    let st = s.stats();
    assert_eq!(st.inserted, st.live + st.reclaimed + st.evicted, "{st:?}");
}

fn fresh_admission(d: &Decision, limit: u64) {
    assert!(d.allowed(), "{d:?}");
    assert_eq!(
        d.remaining,
        limit - 1,
        "a new key saw someone else's state: {d:?}"
    );
}

/// Two threads insert the same new key at once (packed store, limit 1). Catches a key
/// committed twice (both claims committed: the key live twice, both admitted), a lost commit
/// (the key absent), and a live counter bumped by both the owner and a helper.
#[test]
fn same_new_key_from_two_threads_is_live_once() {
    loom::model(|| {
        let s = store(fixed(1), 1, FullPolicy::Reject);
        let ds = spawn_all(vec![check(&s, 7, T), check(&s, 7, T)]);
        assert_eq!(ds.iter().filter(|d| d.allowed()).count(), 1, "{ds:?}");
        assert_eq!(live_once(&s), vec![7]);
        assert_eq!(s.stats().inserted, 1);
        assert_eq!(s.peek_at(&7u64, T).remaining, 0);
    });
}

/// The two home buckets `Store::locate` gives `id` in a one-shard store of `n` buckets (the
/// same arithmetic, over the public placement hash).
fn homes(id: u64, n: u64) -> (u64, u64) {
    let h = KeyHasher::with_seed(SEED, 64).place(id);
    (
        ((h & 0xff_ffff) * n) >> 24,
        (((h >> 24) & 0xff_ffff) * n) >> 24,
    )
}

/// Keys `k`, `f`, `k2` for the helping model in a two-bucket store: `k` has two different
/// homes; `f` and `k2` have both homes equal to `k`'s first, so all three insert through the
/// same bucket header while `k`'s second range is a bucket that `k2`'s probe never visits.
fn helping_keys() -> (u64, u64, u64) {
    let k = (1..).find(|&i| homes(i, 2).0 != homes(i, 2).1).unwrap();
    let h1 = homes(k, 2).0;
    let mut same = (1..).filter(|&i| homes(i, 2) == (h1, h1));
    (k, same.next().unwrap(), same.next().unwrap())
}

/// Helping across keys that share a bucket header. Thread A inserts `k`; its home bucket
/// holds `f`, so the two-choice fallback puts `k` in its *second* range (loom builds fall back
/// whenever h1 is not empty: `table::insert`). Thread B inserts `k2` (same
/// header, other second range), finds A's insertion pending and helps it, then checks `k`.
/// Catches a helper that locates the pending slot through its own probe sequence instead of
/// the owner's: it misses A's slot, clears the header anyway, and B inserts `k` a second time
/// while A's pending slot is still to be published — `k` live twice, admitted twice.
#[test]
fn helping_across_keys_of_one_header_keeps_a_key_live_once() {
    let (k, f, k2) = helping_keys();
    loom::model(move || {
        let s = store(fixed(1), 2, FullPolicy::Reject);
        assert!(s.check_at(&f, 1, T).allowed());
        let b = s.clone();
        let ds = spawn_all(vec![
            check(&s, k, T),
            Box::new(move || {
                assert!(b.check_at(&k2, 1, T).allowed());
                b.check_at(&k, 1, T)
            }),
        ]);
        assert_eq!(ds.iter().filter(|d| d.allowed()).count(), 1, "{ds:?}");
        let mut want = vec![k, f, k2];
        want.sort_unstable();
        assert_eq!(live_once(&s), want);
        accounted(&s);
    });
}

/// Slot reuse: a one-bucket store (two slots) full of idle keys `1` and `2`. Thread A checks a
/// new key, which must reclaim an idle slot; thread B checks the idle key `1` at the same time
/// (its CAS races the reclaim of its slot). Catches a reclaim that empties a slot just
/// updated (B's admission lost), a CAS that matches the state but not the key (one key's
/// count landing on another), and a reused slot seen with the old key's state.
#[test]
fn reclaimed_slot_reused_while_its_old_key_is_checked() {
    loom::model(|| {
        let s = store(fixed(2), 1, FullPolicy::Reject);
        let old = T - 5_000 * MS;
        assert!(s.check_at(&1u64, 1, old).allowed());
        assert!(s.check_at(&2u64, 1, old).allowed());
        let ds = spawn_all(vec![check(&s, 9, T), check(&s, 1, T)]);
        fresh_admission(&ds[0], 2);
        fresh_admission(&ds[1], 2);
        let live = live_once(&s);
        assert!(live.contains(&9) && live.contains(&1), "{live:?}");
        assert!(s.stats().reclaimed >= 1);
        accounted(&s);
        assert_eq!(s.peek_at(&9u64, T).remaining, 1);
        assert_eq!(s.peek_at(&1u64, T).remaining, 1);
    });
}

/// `FullPolicy::EvictStalest` with two threads: a one-bucket store full of busy keys, two new
/// keys at once, each needing an eviction (perhaps of the other new key). Catches an eviction
/// of a slot that changed since it was judged (a key just inserted into it lost with its
/// admission), a new key inheriting the evicted key's count, two keys claiming one emptied
/// slot, and lost accounting.
#[test]
fn evict_stalest_two_new_keys_at_once() {
    loom::model(|| {
        let s = store(fixed(2), 1, FullPolicy::EvictStalest);
        assert!(s.check_at(&1u64, 1, T).allowed());
        assert!(s.check_at(&2u64, 1, T).allowed());
        let now = T + 2 * MS;
        let ds = spawn_all(vec![check(&s, 8, now), check(&s, 9, now)]);
        fresh_admission(&ds[0], 2);
        fresh_admission(&ds[1], 2);
        assert_eq!(live_once(&s).len(), 2);
        // Each new key needs a slot emptied for it: usually an eviction; a slot that a helper
        // published with a fresh state (its owner stalled) is idle and may be reclaimed.
        let st = s.stats();
        assert!(st.evicted + st.reclaimed >= 2, "{st:?}");
        assert!(st.evicted >= 1, "{st:?}");
        accounted(&s);
    });
}

/// `EvictStalest` on an arena store whose one record is held by a busy key `1` (2 of 3 used):
/// thread A's new key must evict `1` and reuse its record (popped from the free list) while
/// thread B peeks at `1` under the record's writer bit. Catches a reused record not reset
/// for its new key (A would see 1 left, not 2), a checker that does not re-check its slot
/// after taking the writer bit (B would read key 9's record as key 1's: 2 left), and a new
/// key that spins forever because the table has an empty slot but the arena no free record.
#[test]
fn evict_stalest_reuses_the_arena_record() {
    loom::model(|| {
        let s = store(log(3), 1, FullPolicy::EvictStalest);
        assert!(s.check_at(&1u64, 2, T).allowed());
        let now = T + 2 * MS;
        let b = s.clone();
        let ds = spawn_all(vec![
            check(&s, 9, now),
            Box::new(move || b.peek_at(&1u64, now)),
        ]);
        fresh_admission(&ds[0], 3);
        // Before the eviction `1` has 1 of 3 left; after it, it is absent (fresh, 3 left).
        assert!(ds[1].remaining == 1 || ds[1].remaining == 3, "{ds:?}");
        assert_eq!(live_once(&s), vec![9]);
        assert_eq!(s.stats().evicted, 1);
        accounted(&s);
    });
}

/// `FullPolicy::Reject` on an arena store whose one record is held by a busy key: a new key
/// is refused (`StoreFull`) while the old key is checked. Catches a new key that livelocks
/// retrying because the probe range has an empty slot while the arena has no free record.
#[test]
fn reject_when_the_arena_is_full() {
    loom::model(|| {
        let s = store(log(2), 1, FullPolicy::Reject);
        assert!(s.check_at(&1u64, 1, T).allowed());
        let now = T + 2 * MS;
        let ds = spawn_all(vec![check(&s, 9, now), check(&s, 1, now)]);
        assert_eq!(ds[0].outcome, Outcome::StoreFull, "{ds:?}");
        assert_eq!(ds[1].remaining, 0, "{ds:?}");
        assert_eq!(live_once(&s), vec![1]);
        assert_eq!(s.stats().rejected, 1);
    });
}

/// Two threads check one new key of an arena store (limit 1): both prepare a record, one
/// commits, the loser frees its record (free-list push) and applies its request to the
/// winner's record under the writer bit. Exactly one admission.
fn one_new_arena_key(limits: Vec<Limit>, cost: u64) -> Arc<Store<ManualClock>> {
    let s = store(limits, 2, FullPolicy::Reject);
    let ds = spawn_all(vec![check_n(&s, 7, cost, T), check_n(&s, 7, cost, T)]);
    assert_eq!(ds.iter().filter(|d| d.allowed()).count(), 1, "{ds:?}");
    assert_eq!(live_once(&s), vec![7]);
    s
}

/// sliding_log (arena record, limit 1): exactly one of two admitted on a new key. Catches a
/// loser whose prepared record (with its request applied) gets published or stays counted,
/// and a writer bit that does not exclude the two updates.
#[test]
fn sliding_log_record_two_threads_one_key() {
    loom::model(|| {
        let s = one_new_arena_key(log(1), 1);
        assert_eq!(s.peek_at(&7u64, T).remaining, 0);
    });
}

/// window_ring (arena record, limit 1 in 4 sub-windows): exactly one of two admitted.
#[test]
fn window_ring_record_two_threads_one_key() {
    loom::model(|| {
        let s = one_new_arena_key(vec![Limit::window_ring(1, SEC, 4).unwrap()], 1);
        assert_eq!(s.peek_at(&7u64, T).remaining, 0);
    });
}

/// Two packed limits per key (an arena record of two words): fixed_window 3/s and
/// token_bucket 4 (refill 1/h), two threads at cost 2 on a new key. The second breaks the
/// window and must not consume the bucket. Catches a partial apply across limits and an
/// update lost between the two words.
#[test]
fn two_limits_record_all_or_nothing() {
    loom::model(|| {
        let s = one_new_arena_key(
            vec![
                Limit::fixed_window(3, SEC).unwrap(),
                Limit::token_bucket(4, 1, Duration::from_secs(3600)).unwrap(),
            ],
            2,
        );
        let now = s.peek_at(&7u64, T);
        assert_eq!((now.limit, now.remaining), (3, 1), "{now:?}");
        let later = s.peek_at(&7u64, T + 1_000 * MS);
        assert_eq!((later.limit, later.remaining), (4, 2), "{later:?}");
    });
}

/// The arena's free list (a tagged Treiber stack) popped by two threads at once: an arena
/// store of two records whose keys were reset (both records on the free list), and two new
/// keys inserted concurrently. Catches one record handed to both keys (a pop that is not a
/// CAS: a second check of one key then shows in the other) and a lost record.
#[test]
fn free_list_hands_each_record_out_once() {
    loom::model(|| {
        let s = store(log(2), 2, FullPolicy::Reject);
        for k in [1u64, 2] {
            assert!(s.check_at(&k, 1, T).allowed());
        }
        for k in [1u64, 2] {
            assert!(s.reset(&k));
        }
        let ds = spawn_all(vec![check(&s, 8, T), check(&s, 9, T)]);
        fresh_admission(&ds[0], 2);
        fresh_admission(&ds[1], 2);
        assert_eq!(live_once(&s), vec![8, 9]);
        // A record shared by both keys shows only once one key moves: the second insertion
        // zeroed it, so both read 1 left until then.
        assert_eq!(s.check_at(&8u64, 1, T).remaining, 0);
        assert_eq!(s.peek_at(&9u64, T).remaining, 1, "8 and 9 share a record");
    });
}

/// `reset` racing a check on an arena key at its limit: the reset empties the slot and frees
/// the record (free-list push) under the record's writer bit; the check is either denied
/// before it or inserts the key afresh after it (popping the record). Catches a re-inserted
/// key that inherits the freed record's old log (record not reset on reuse), a reset that
/// leaves the key live or loses it from the live count, and a check admitted on the old log.
#[test]
fn reset_races_a_check_on_an_arena_key() {
    loom::model(|| {
        let s = store(log(1), 2, FullPolicy::Reject);
        assert!(s.check_at(&7u64, 1, T).allowed());
        let r = s.clone();
        let (reset, d) = {
            let h = thread::spawn(move || r.reset(&7u64));
            let d = s.check_at(&7u64, 1, T);
            (h.join().unwrap(), d)
        };
        assert!(reset);
        let live = live_once(&s);
        if d.allowed() {
            assert_eq!(live, vec![7]);
            assert_eq!(s.peek_at(&7u64, T).remaining, 0);
        } else {
            assert_eq!(live, Vec::<u64>::new());
            assert_eq!(s.peek_at(&7u64, T).remaining, 1);
        }
    });
}

/// Keys for the stale-helper model in a two-bucket store: `ko` and `kt` insert through
/// bucket 0's header (`ko` first into bucket 0's slot 0, "Y"), `k` through bucket 1's header
/// with bucket 0 as its second range (so Y is in its probe), `f` fills bucket 1 half-way.
fn stale_helper_keys() -> (u64, u64, u64, u64) {
    let mut h1_0 = (1..).filter(|&i| homes(i, 2).0 == 0);
    let (ko, kt) = (h1_0.next().unwrap(), h1_0.next().unwrap());
    let k = (1..).find(|&i| homes(i, 2) == (1, 0)).unwrap();
    let f = (1..).find(|&i| homes(i, 2).0 == 1 && i != k).unwrap();
    (ko, kt, k, f)
}

/// A stale helper must not publish another insertion's pending slot.
/// Bucket 0's header Ha and bucket 1's header Hb are brought to the same version (each had one
/// commit: `ko` inserted and reset, `f` inserted). Then, with three threads:
///
/// * O inserts `ko` through Ha into slot Y (Ha pending, naming Y and its tag);
/// * T checks `kt`, reads Ha pending and stalls before helping;
/// * O publishes Y, clears Ha, resets `ko` (Y empty) and inserts `k` through Hb: it claims Y
///   and stalls before its commit;
/// * B inserts `k` too: Y is pending, not live, so B claims another slot, commits Hb,
///   publishes;
/// * T resumes: Y is pending with the tag it read from Ha (a tag only unique per header, not
///   per shard, before the fix), so it publishes O's uncommitted claim; O's commit fails, and
///   its undo finds the slot live.
///
/// `k` is then live twice (Y and B's slot). Three preemptions (O after its commit, T after
/// reading Ha, O after its claim): the bound CI runs.
#[test]
fn stale_helper_does_not_publish_another_headers_claim() {
    let (ko, kt, k, f) = stale_helper_keys();
    loom::model(move || {
        let s = store(fixed(1), 2, FullPolicy::Reject);
        assert!(s.check_at(&ko, 1, T).allowed());
        assert!(s.reset(&ko));
        assert!(s.check_at(&f, 1, T).allowed());
        let o = s.clone();
        let ds = spawn_all(vec![
            check(&s, kt, T),
            Box::new(move || {
                assert!(o.check_at(&ko, 1, T).allowed());
                assert!(o.reset(&ko));
                o.check_at(&k, 1, T)
            }),
            check(&s, k, T),
        ]);
        // `kt` may find its range full of live and pending slots (StoreFull): not checked.
        assert_eq!(ds[1..].iter().filter(|d| d.allowed()).count(), 1, "{ds:?}");
        let live = live_once(&s);
        assert!(live.contains(&k) && live.contains(&f), "{live:?}");
        assert_eq!(s.peek_at(&k, T).remaining, 0);
    });
}

/// Probing past the home buckets and wrapping around the table: a
/// two-bucket store whose keys have ranges of two buckets (`loom_range(2)`), so that a key at
/// home in bucket 1 probes buckets 1, 1, then 0, 0 (bucket 1 + 1 wraps to 0). Bucket 1 is full
/// of busy keys; thread A inserts `a`, thread B inserts `b` and then checks `a`, all three
/// with homes (1, 1): both new keys must be placed past their home buckets, across the wrap,
/// and B's check of `a` must find it there (`find_far`), or help its pending insertion, or
/// insert it itself — exactly once. Catches a probe or a lookup that stops at the home
/// buckets (`a` inserted twice: admitted twice), a wrap computed on the wrong table size, and
/// a helper that locates a slot past the home buckets wrongly.
#[test]
fn insertions_past_the_home_buckets_wrap_around_the_table() {
    let mut ones = (1..).filter(|&i| homes(i, 2) == (1, 1));
    let [f1, f2, a, b] = std::array::from_fn(|_| ones.next().unwrap());
    loom::model(move || {
        let s = Arc::new(
            Store::builder(Limits::new(fixed(1)).unwrap())
                .capacity(2)
                .shards(1)
                .seed(SEED)
                .loom_range(2)
                .build_with_clock(ManualClock::new(T))
                .unwrap(),
        );
        assert!(s.check_at(&f1, 1, T).allowed());
        assert!(s.check_at(&f2, 1, T).allowed());
        let t = s.clone();
        let ds = spawn_all(vec![
            check(&s, a, T),
            Box::new(move || {
                assert!(t.check_at(&b, 1, T).allowed());
                t.check_at(&a, 1, T)
            }),
        ]);
        assert_eq!(ds.iter().filter(|d| d.allowed()).count(), 1, "{ds:?}");
        let mut want = vec![f1, f2, a, b];
        want.sort_unstable();
        assert_eq!(live_once(&s), want);
        // f1, f2 in their first home bucket; a, b past both.
        assert_eq!(s.placement(), [2, 0, 2]);
        accounted(&s);
    });
}

/// Tags (`table.rs`, "Tags"): a key's tag byte is set before its slot goes live. Thread A
/// inserts `k` while thread B looks for `k`'s live slot and, if it sees it, reads its tag, then
/// checks `k` through `check_batch_verdicts` (which goes by the tag first). At rest every live
/// slot carries its key's tag and every other slot none. Catches a tag set after the publish
/// (B sees the slot live without its tag) and a tag left behind by an undone claim. Failed
/// with `set_tag` moved after the publishing CAS.
#[test]
fn tag_is_set_before_a_slot_goes_live() {
    loom::model(|| {
        let s = store(fixed(2), 2, FullPolicy::Reject);
        let b = s.clone();
        let ds = spawn_all(vec![
            check(&s, 7, T),
            Box::new(move || {
                assert_ne!(
                    b.loom_tag_agrees(&7u64),
                    Some(false),
                    "live without its tag"
                );
                let mut v = [turnstile::Verdict::default()];
                b.check_batch_verdicts_at(&[7u64], 1, T, &mut v);
                assert_ne!(
                    b.loom_tag_agrees(&7u64),
                    Some(false),
                    "live without its tag"
                );
                let d = b.peek_at(&7u64, T);
                assert!(v[0].allowed(), "{v:?}");
                d
            }),
        ]);
        assert!(ds[0].allowed(), "{ds:?}");
        assert_eq!(live_once(&s), vec![7]);
        assert_eq!(s.peek_at(&7u64, T).remaining, 0, "both admissions counted");
        assert!(s.loom_tags_exact(), "tags at rest");
    });
}

/// Tags cleared after a slot dies, and set for the key that reuses it: a one-bucket store full
/// of idle keys `1` and `2` (tags differing from the new key's). Thread A checks a new key,
/// which reclaims an idle slot (death, then its tag cleared) and claims it (its own tag set);
/// thread B resets key `2` at the same time (another death and clearing). At rest the tags are
/// exactly those of the live keys. Catches a tag left on a dead slot, a clearing that erases
/// the next key's tag, and a live key without its tag. Failed with the clearing after a
/// reclaim or reset removed.
#[test]
fn tag_is_cleared_after_a_slot_dies() {
    loom::model(|| {
        let s = store(fixed(2), 1, FullPolicy::Reject);
        let k = (3..)
            .find(|&k| {
                let t = s.loom_tag_of(k);
                t != s.loom_tag_of(1) && t != s.loom_tag_of(2)
            })
            .unwrap();
        let old = T - 5_000 * MS;
        assert!(s.check_at(&1u64, 1, old).allowed());
        assert!(s.check_at(&2u64, 1, old).allowed());
        let b = s.clone();
        let ds = spawn_all(vec![
            check(&s, k, T),
            Box::new(move || {
                b.reset(&2u64);
                b.peek_at(&2u64, T)
            }),
        ]);
        fresh_admission(&ds[0], 2);
        let live = live_once(&s);
        assert!(live.contains(&k) && !live.contains(&2), "{live:?}");
        assert!(s.loom_tags_exact(), "tags at rest");
    });
}

/// Limits given per check (`Store::check_with_at`): two threads check one key of a token
/// bucket store, each by its own limit, A (2 per 2 s) and B (3, one per 2 s). The record is one
/// TAT, updated by the one CAS path whatever decides it, so the outcome is one of the two
/// serial orders': A then B admits both (TAT now + 3 s), B then A admits B only (A's bucket
/// of 2 s cannot take the 2 s B drew plus its own 1 s; TAT now + 2 s). `new`: the key is
/// inserted by these checks (the insertion path), else it is live already (the CAS loop).
fn two_limits_one_key(new: bool) {
    loom::model(move || {
        let a = Limit::token_bucket(2, 1, SEC).unwrap();
        let b = Limit::token_bucket(3, 1, 2 * SEC).unwrap();
        let wide = Limit::token_bucket(10, 1, SEC).unwrap();
        let s = store(vec![a], 1, FullPolicy::Reject);
        // A live key that drew nothing at T: a check of cost 0 does not insert, so give it 1
        // ns of backlog from long ago (idle, but live).
        if !new {
            assert!(s
                .check_with_at(&7u64, &wide, 1, T - 5_000 * MS)
                .unwrap()
                .allowed());
        }
        let (sa, sb) = (s.clone(), s.clone());
        let ds = spawn_all(vec![
            Box::new(move || sa.check_with_at(&7u64, &a, 1, T).unwrap()),
            Box::new(move || sb.check_with_at(&7u64, &b, 1, T).unwrap()),
        ]);
        let left = s.peek_with_at(&7u64, &wide, T).unwrap().remaining;
        match (ds[0].allowed(), ds[1].allowed()) {
            (true, true) => assert_eq!(left, 7, "A then B: TAT now + 3 s; {ds:?}"),
            (false, true) => assert_eq!(left, 8, "B then A: TAT now + 2 s; {ds:?}"),
            _ => panic!("no serial order answers {ds:?}"),
        }
        assert_eq!(live_once(&s), vec![7]);
    });
}

#[test]
fn limits_given_per_check_insert_a_key_once() {
    two_limits_one_key(true);
}

#[test]
fn limits_given_per_check_share_one_record() {
    two_limits_one_key(false);
}
