//! A table of records of the caller's own kind, on the keyed store's table: the same shards,
//! slots, insertion protocol and reclaim in place, for state that is not a limit's — a Redis
//! backend's leases of each key's quota (`turnstile-redis`), for one.
//!
//! A record is a fixed number of 64-bit words ([`RecordKind::words`]) in the shard's arena,
//! found by a 64-bit key id (the caller's: a [`KeyHasher`](super::KeyHasher) id, or any other
//! number). Operations ([`RecordOp`]) run on one record under its writer bit
//! (`record.rs`): writers of one record serialize for the few instructions an operation takes;
//! other keys are never waited for. Memory is allocated once, when the table is built, and
//! never grows: a new key that finds no room takes the room of a record its kind judges idle
//! ([`RecordKind::idle_in`]), or, under [`FullPolicy::EvictStalest`], of the record closest
//! to idle in its probe range; every removal of a live record is told to the kind first
//! ([`RecordKind::removed`]), under the record's writer bit.

use super::builder::Sizing;
use super::key::KeyHasher;
use super::policy::FullPolicy;
use super::store::StoreStats;
use super::table::{shard_index, Ctx, Judge, Loc, Op, RecordKind, Refusal, Shard};
use crate::algo::Cells;
use crate::clock::Nanos;
use crate::decision::ConfigError;
use crossbeam_utils::CachePadded;

/// An operation on one key's record ([`Records::update`]).
pub trait RecordOp {
    /// What the operation answers.
    type Out;
    /// Whether a key without a record gets one (all zero), with `apply` run on it.
    fn inserts(&self) -> bool;
    /// Runs on the key's record under its writer bit: all zero on a record being inserted.
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> Self::Out;
    /// The key has no record and the operation does not insert, or the table had no room.
    fn absent(&mut self) -> Self::Out;
}

/// A [`RecordOp`] as the table runs it.
struct AsOp<'a, O>(&'a mut O);

impl<O: RecordOp> Op for AsOp<'_, O> {
    type Out = O::Out;
    fn inserts(&self) -> bool {
        self.0.inserts()
    }
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> O::Out {
        self.0.apply(rec)
    }
    fn absent(&mut self) -> O::Out {
        self.0.absent()
    }
    fn refused(&mut self, _: Refusal) -> O::Out {
        self.0.absent()
    }
}

/// Records of kind `K` for many keys: bounded, lock-free between keys. See the module docs.
pub struct Records<K: RecordKind> {
    shards: Box<[CachePadded<Shard>]>,
    shard_bits: u32,
    shard_buckets: u64,
    /// Only its placement mix is used: ids are the caller's.
    hasher: KeyHasher,
    policy: FullPolicy,
    capacity: u64,
    kind: K,
}

impl<K: RecordKind> Records<K> {
    /// A table with room for `capacity` records of `kind`, deciding new keys that find no room
    /// by `policy` (`Reject` and `AllowUntracked` both leave such a key without a record:
    /// [`RecordOp::absent`]).
    pub fn new(kind: K, capacity: u64, policy: FullPolicy) -> Result<Self, ConfigError> {
        let words = kind.words().max(1);
        let sizing = Sizing {
            capacity: Some(capacity.max(1)),
            budget: None,
            shards: None,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            arena_words: Some(words),
            overhead: std::mem::size_of::<Self>(),
        };
        let g = sizing.geometry()?;
        let shards = (0..g.shards)
            .map(|_| Shard::new(g.buckets, g.arena, false).map(CachePadded::new))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ConfigError::new(
                    "capacity",
                    format!(
                        "could not allocate {capacity} records of {words} words; ask for fewer"
                    ),
                )
            })?;
        Ok(Self {
            shard_bits: shards.len().trailing_zeros(),
            shard_buckets: g.buckets as u64,
            shards: shards.into_boxed_slice(),
            hasher: KeyHasher::random(64),
            policy,
            capacity: g.capacity,
            kind,
        })
    }

    /// The kind of the records.
    pub fn kind(&self) -> &K {
        &self.kind
    }

    /// The records the table was sized for.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn locate(&self, id: u64) -> (&Shard, Loc) {
        let h = self.hasher.place(id);
        let shard = &self.shards[shard_index(h, self.shard_bits)];
        (shard, Loc::of(h, self.shard_buckets))
    }

    /// Runs `op` on key `id`'s record at `now` (inserting it if the key has none and the
    /// operation inserts; reclaim judges neighbours idle at `now`).
    #[inline]
    pub fn update<O: RecordOp>(&self, id: u64, now: Nanos, op: &mut O) -> O::Out {
        let (shard, home) = self.locate(id);
        let ctx = Ctx {
            judge: Judge::Kind(&self.kind),
            policy: self.policy,
            missed: false,
        };
        shard.with_key(&ctx, id, home, now, &mut AsOp(op))
    }

    /// Removes key `id`'s record (told to the kind first); whether it had one.
    pub fn remove(&self, id: u64) -> bool {
        let (shard, home) = self.locate(id);
        let ctx = Ctx {
            judge: Judge::Kind(&self.kind),
            policy: self.policy,
            missed: false,
        };
        shard.remove(&ctx, id, home)
    }

    /// Calls `f` with every live key id (a scan; not linearizable: keys inserted or removed
    /// meanwhile may or may not be seen).
    pub fn for_each_id(&self, mut f: impl FnMut(u64)) {
        for s in self.shards.iter() {
            s.for_each_live(&mut f);
        }
    }

    /// Bytes the table allocated; it never allocates more.
    pub fn memory_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.bytes()).sum::<usize>() + std::mem::size_of::<Self>()
    }

    /// What the table did, summed over shards.
    pub fn stats(&self) -> StoreStats {
        StoreStats::of(&self.shards)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::Ordering;
    use std::sync::atomic::AtomicU64;

    /// A record of two words: a count, and the time it stops mattering.
    struct Counted {
        removed: AtomicU64,
    }

    impl RecordKind for Counted {
        fn words(&self) -> usize {
            2
        }
        fn idle_in(&self, rec: &mut dyn Cells, now: Nanos) -> u64 {
            rec.get(1).saturating_sub(now)
        }
        fn removed(&self, rec: &mut dyn Cells) {
            // Relaxed: a test's statistic.
            self.removed.fetch_add(rec.get(0), Ordering::Relaxed);
        }
    }

    /// Adds one and keeps the record until `until`.
    struct Bump {
        until: u64,
        insert: bool,
    }

    impl RecordOp for Bump {
        type Out = Option<u64>;
        fn inserts(&self) -> bool {
            self.insert
        }
        fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> Option<u64> {
            rec.set(0, rec.get(0) + 1);
            rec.set(1, self.until);
            Some(rec.get(0))
        }
        fn absent(&mut self) -> Option<u64> {
            None
        }
    }

    fn table(capacity: u64, policy: FullPolicy) -> Records<Counted> {
        let kind = Counted {
            removed: AtomicU64::new(0),
        };
        Records::new(kind, capacity, policy).unwrap()
    }

    #[test]
    fn records_are_found_by_id_and_kept_apart() {
        let t = table(1000, FullPolicy::Reject);
        let bump = |id, insert| t.update(id, 0, &mut Bump { until: 10, insert });
        assert_eq!(bump(7, false), None, "absent, not inserted");
        assert_eq!(bump(7, true), Some(1));
        assert_eq!(bump(7, true), Some(2));
        assert_eq!(bump(8, true), Some(1));
        let mut ids = Vec::new();
        t.for_each_id(|id| ids.push(id));
        ids.sort();
        assert_eq!(ids, [7, 8]);
        assert!(t.remove(7));
        assert!(!t.remove(7));
        // Relaxed: a test's statistic.
        assert_eq!(t.kind().removed.load(Ordering::Relaxed), 2, "told first");
        assert_eq!(t.stats().live, 1);
    }

    #[test]
    fn a_full_table_reclaims_idle_records_and_evicts_by_policy() {
        // More keys than room: records idle at `now` are reclaimed (and told to the kind).
        let t = table(64, FullPolicy::Reject);
        let cap = t.capacity();
        for id in 0..cap * 4 {
            // Each record is idle from time id + 1 on; inserting at time id reclaims older ones.
            let _ = t.update(
                id,
                id * 10_000_000,
                &mut Bump {
                    until: id * 10_000_000 + 1,
                    insert: true,
                },
            );
        }
        let s = t.stats();
        assert!(s.reclaimed > 0, "{s:?}");
        assert!(s.live <= cap, "{s:?}");
        // Relaxed: a test's statistic.
        assert!(t.kind().removed.load(Ordering::Relaxed) >= s.reclaimed);
        // Live forever: Reject refuses new keys once full; EvictStalest makes room.
        for (policy, refused) in [
            (FullPolicy::Reject, true),
            (FullPolicy::EvictStalest, false),
        ] {
            let t = table(64, policy);
            let mut absent = 0;
            for id in 0..t.capacity() * 4 {
                let r = t.update(
                    id,
                    0,
                    &mut Bump {
                        until: u64::MAX,
                        insert: true,
                    },
                );
                absent += r.is_none() as u64;
            }
            assert_eq!(absent > 0, refused, "{policy:?}: {absent}");
            assert!(t.stats().live <= t.capacity());
        }
    }
}
