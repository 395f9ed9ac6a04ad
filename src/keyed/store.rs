//! The keyed store: [`Store`], its checks of one key, and what it reports.
//!
//! A check hashes its key to an id, finds the id's shard and home buckets, and runs on the
//! table: the packed fast path (one lookup and 16-byte CAS, the algorithm inlined:
//! `algo::Packed`) for a live key of a packed store, else an operation through
//! [`Shard::with_key`] (`keyed::ops`). Batches are in `keyed::batch`, snapshots in
//! `keyed::snapshot`, concurrency permits in `keyed::permit`.

use super::key::{Key, KeyHasher};
use super::ops::{Check, Decides, Evaluate, Refund, Settle};
use super::policy::FullPolicy;
use super::table::{shard_index, Ctx, Judge, Loc, Op, Shard, BUCKET};
use crate::algo::{with_packed, Algorithm, Limit, Limits, Packed, PackedFn};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::sync::Ordering;
use crossbeam_utils::CachePadded;
// std's `Arc`, not the sync shim's: it is the receiver of `acquire_owned` (public API), and
// loom's `Arc` cannot be a method receiver; the shards it shares between stores (reloads) are
// never touched by loom models of a check.
use std::sync::Arc;

/// Counts of what the store did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Live records.
    pub live: u64,
    /// Records created.
    pub inserted: u64,
    /// Idle records reclaimed in place.
    pub reclaimed: u64,
    /// Live records evicted (policy `EvictStalest`).
    pub evicted: u64,
    /// New keys refused (policy `Reject`, or no record free).
    pub rejected: u64,
    /// New keys admitted untracked (policy `AllowUntracked`).
    pub untracked: u64,
}

impl StoreStats {
    /// The counters of `shards`, summed.
    pub(crate) fn of(shards: &[CachePadded<Shard>]) -> Self {
        let mut t = StoreStats::default();
        for s in shards {
            let c = &s.counters;
            // Relaxed: statistics.
            t.live += c.live.load(Ordering::Relaxed);
            t.inserted += c.inserted.load(Ordering::Relaxed);
            t.reclaimed += c.reclaimed.load(Ordering::Relaxed);
            t.evicted += c.evicted.load(Ordering::Relaxed);
            t.rejected += c.rejected.load(Ordering::Relaxed);
            t.untracked += c.untracked.load(Ordering::Relaxed);
        }
        t
    }
}

/// Limits for many keys. See the module docs.
pub struct Store<C: Clock = DefaultClock> {
    /// The one packed limit every slot holds, if the store is packed (the fast path).
    pub(crate) packed: Option<Limit>,
    /// Buckets in each shard (all shards are the same size).
    pub(crate) shard_buckets: u64,
    /// Shared with the stores [`Store::with_limits`] made from this one (rules reload).
    pub(crate) shards: Arc<[CachePadded<Shard>]>,
    pub(crate) shard_bits: u32,
    pub(crate) limits: Limits,
    pub(crate) hasher: KeyHasher,
    pub(crate) policy: FullPolicy,
    pub(crate) clock: C,
    pub(crate) capacity: u64,
}

impl<C: Clock> Store<C> {
    /// A store over the very same records, deciding them by `limits` under `policy`: what a
    /// rules reload that changes a limit uses to carry every key's state over. Checks through
    /// either store update the same atomic records (no update is lost, whichever limits a
    /// check was decided by). `None` unless the records read alike under both limits
    /// ([`Limits::carries_to`]): then a new store starts fresh.
    pub fn with_limits(&self, limits: Limits, policy: FullPolicy) -> Option<Store<C>>
    where
        C: Clone,
    {
        if !self.limits.carries_to(&limits) {
            return None;
        }
        Some(Store::from_parts(
            self.shards.clone(),
            limits,
            self.hasher.clone(),
            policy,
            self.clock.clone(),
            self.capacity,
        ))
    }

    /// A store over `shards` (all the same size, a power of two of them).
    pub(crate) fn from_parts(
        shards: Arc<[CachePadded<Shard>]>,
        limits: Limits,
        hasher: KeyHasher,
        policy: FullPolicy,
        clock: C,
        capacity: u64,
    ) -> Self {
        debug_assert!(shards.len().is_power_of_two());
        Store {
            packed: limits.single_packed().copied(),
            shard_buckets: shards[0].n_buckets() as u64,
            shard_bits: shards.len().trailing_zeros(),
            shards,
            limits,
            hasher,
            policy,
            clock,
            capacity,
        }
    }

    /// What the table needs to know about the store; `missed`: see `Ctx::missed`.
    #[inline(always)]
    pub(crate) fn ctx(&self, missed: bool) -> Ctx<'_> {
        Ctx {
            judge: Judge::Limits(&self.limits),
            policy: self.policy,
            missed,
        }
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
    /// The limits every key gets.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
    /// The key hasher (seeded).
    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }
    /// The key capacity the store was sized for.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }
    /// 16-byte slots in the store's tables, all shards (what a table of the same size as the
    /// store holds: `turnstile bench` measures its memory floor over that many).
    pub fn slot_count(&self) -> u64 {
        self.shards.len() as u64 * self.shard_buckets * BUCKET as u64
    }

    #[inline(always)]
    pub(crate) fn locate(&self, id: u64) -> (&Shard, Loc) {
        let (i, home) = self.place_of(id);
        (&self.shards[i], home)
    }

    /// The shard index and home buckets of key id `id`.
    #[inline(always)]
    pub(crate) fn place_of(&self, id: u64) -> (usize, Loc) {
        let h = self.hasher.place(id);
        // Every shard has the same number of buckets, kept here: no load from the shard
        // before its bucket address is known.
        (self.shard_index(h), Loc::of(h, self.shard_buckets))
    }

    /// The shard a key lives in (for routing requests to the thread that owns it).
    pub fn shard_of<K: Key + ?Sized>(&self, key: &K) -> usize {
        self.shard_index(self.hasher.place(key.key_id(&self.hasher)))
    }

    /// The shard of placement hash `h`: its top `shard_bits` bits ([`shard_index`]).
    #[inline(always)]
    fn shard_index(&self, h: u64) -> usize {
        shard_index(h, self.shard_bits)
    }

    /// Shard `i` of [`Store::shard_index`], without a bounds check on the batch path.
    #[inline(always)]
    pub(crate) fn shard_at(&self, i: usize) -> &Shard {
        debug_assert!(i < self.shards.len());
        // SAFETY: `shard_index` keeps `shard_bits` bits, and there are 2^shard_bits shards
        // (the builder rounds the count up to a power of two and takes its trailing zeros).
        unsafe { self.shards.get_unchecked(i) }
    }

    /// Touches every page of shard `i` from the calling thread (first-touch placement).
    pub fn prefault_shard(&self, i: usize) {
        self.shards[i].prefault();
    }

    /// The general path: `op` on key id `id` through the table (lookup, then insertion).
    #[inline]
    pub(crate) fn run<O: Op>(&self, id: u64, now: Nanos, missed: bool, op: &mut O) -> O::Out {
        let (shard, home) = self.locate(id);
        shard.with_key(&self.ctx(missed), id, home, now, op)
    }

    /// A check (or, `cost` 0, a peek) of key id `id` by `by` through the general path.
    pub(crate) fn run_check<D: Decides + ?Sized>(
        &self,
        by: &D,
        id: u64,
        now: Nanos,
        cost: u64,
        insert: bool,
        missed: bool,
    ) -> Decision {
        let mut op = Check {
            by,
            now,
            cost,
            insert,
        };
        self.run(id, now, missed, &mut op)
    }

    /// Checks a request of `cost` for `key` now.
    #[inline(always)]
    pub fn check<K: Key + ?Sized>(&self, key: &K, cost: u64) -> Decision {
        // The key's buckets are fetched before the clock is read: the reading (13-30
        // instructions, a `rdtsc` or a vDSO call) then overlaps the miss to memory instead of
        // delaying its start (docs/performance.md, "The clock before the miss").
        let id = key.key_id(&self.hasher);
        let (shard, home) = self.locate(id);
        shard.prefetch_home(home);
        self.check_located(shard, home, id, self.clock.now(), cost)
    }

    /// Fetches `key`'s home buckets into the cache, and does nothing else: a hint, with no
    /// effect on any decision. A server that has several requests in hand before it answers
    /// them (a pipeline of commands read at once) calls it for each of them first, so that
    /// their misses to memory overlap instead of being paid one after the other — what
    /// [`Store::check_batch`] does inside. Costs the key's hash, computed again by the check.
    #[inline]
    pub fn prefetch<K: Key + ?Sized>(&self, key: &K) {
        let (shard, home) = self.locate(key.key_id(&self.hasher));
        shard.prefetch_home(home);
    }

    /// Checks a request of `cost` for `key` at `now`.
    ///
    /// `now` may lag the times other checks of this store were made at by up to 1 ms (clock
    /// readings of different threads). Beyond that a reclaim may have judged the key's record
    /// idle at a later time: a key found absent at a `now` before the latest time a reclaim in
    /// its shard judged at is denied (`Limited`, `retry_after` the lag) rather than answered
    /// as fresh, since the record it may have had could still hold state at `now`. Keys with a
    /// live record are answered exactly at any `now`.
    #[inline]
    pub fn check_at<K: Key + ?Sized>(&self, key: &K, cost: u64, now: Nanos) -> Decision {
        self.check_id(key.key_id(&self.hasher), now, cost)
    }

    /// A check of key id `id`: the packed fast path for a live key, else the general path.
    #[inline(always)]
    pub(crate) fn check_id(&self, id: u64, now: Nanos, cost: u64) -> Decision {
        let (shard, home) = self.locate(id);
        self.check_located(shard, home, id, now, cost)
    }

    /// [`Store::check_id`] with the key's place already computed (batches compute it ahead).
    #[inline(always)]
    pub(crate) fn check_located(
        &self,
        shard: &Shard,
        home: Loc,
        id: u64,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        let hit = match &self.packed {
            Some(l) => with_packed(
                l,
                Hit {
                    shard,
                    home,
                    id,
                    now,
                    cost,
                },
            )
            .flatten(),
            None => None,
        };
        match hit {
            Some(d) => d,
            None => self.run_cold(id, now, cost, self.packed.is_some()),
        }
    }

    /// [`Store::check_located`] by `limit`, given with the check (a packed limit the store
    /// accepts: `Store::accepts`).
    #[inline(always)]
    pub(crate) fn check_packed(
        &self,
        shard: &Shard,
        home: Loc,
        id: u64,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        let hit = Hit {
            shard,
            home,
            id,
            now,
            cost,
        };
        match with_packed(limit, hit).flatten() {
            Some(d) => d,
            None => self.run_cold_by(limit, id, now, cost),
        }
    }

    /// The general path, out of line: new keys, arena records, a reclaimed slot. `missed`:
    /// the packed fast path's lookup just missed (see `Ctx::missed`).
    #[inline(never)]
    fn run_cold(&self, id: u64, now: Nanos, cost: u64, missed: bool) -> Decision {
        match &self.packed {
            Some(l) => self.run_check(l, id, now, cost, cost > 0, missed),
            None => self.run_check(&self.limits, id, now, cost, cost > 0, missed),
        }
    }

    /// [`Store::run_cold`] by a packed `limit` given with the check, whose fast path's lookup
    /// just missed.
    #[inline(never)]
    fn run_cold_by(&self, limit: &Limit, id: u64, now: Nanos, cost: u64) -> Decision {
        self.run_check(limit, id, now, cost, cost > 0, true)
    }

    /// Looks at `key`'s limit without consuming (and without inserting it).
    pub fn peek<K: Key + ?Sized>(&self, key: &K) -> Decision {
        self.peek_at(key, self.clock.now())
    }

    /// [`Store::peek`] at `now`.
    pub fn peek_at<K: Key + ?Sized>(&self, key: &K, now: Nanos) -> Decision {
        let id = key.key_id(&self.hasher);
        match &self.packed {
            Some(l) => self.run_check(l, id, now, 0, false, false),
            None => self.run_check(&self.limits, id, now, 0, false, false),
        }
    }

    /// What a check of `cost` for `key` at `now` would answer, recording nothing (and not
    /// inserting the key). A denial is described without the count a `count_denied` limit
    /// would add ([`Limits::evaluate`]).
    pub fn evaluate_at<K: Key + ?Sized>(&self, key: &K, cost: u64, now: Nanos) -> Decision {
        let mut op = Evaluate {
            by: &self.limits,
            now,
            cost,
        };
        self.run(key.key_id(&self.hasher), now, false, &mut op)
    }

    /// Gives `n` back to `key`'s limits.
    pub fn refund<K: Key + ?Sized>(&self, key: &K, n: u64) {
        self.refund_at(key, n, self.clock.now())
    }

    /// [`Store::refund`] at `now`.
    pub fn refund_at<K: Key + ?Sized>(&self, key: &K, n: u64, now: Nanos) {
        let mut op = Refund {
            by: &self.limits,
            now,
            n,
        };
        self.run(key.key_id(&self.hasher), now, false, &mut op)
    }

    /// Settles a cost known only after the work: `key` was checked (and admitted) at a cost of
    /// `reserved`, the work cost `actual`. The difference is charged — whatever the limits
    /// hold: past a limit the key owes it, and its next checks are denied until it is paid
    /// (each algorithm's `charge` says how far it can owe) — or given back as
    /// [`Store::refund`] does; on every limit of the store in one atomic step (all or
    /// nothing). The same amount changes nothing. Returns whether a record was settled:
    /// `false` for a refund to an absent key (nothing to give back) or a charge that a full
    /// store with the `Reject` policy refused.
    pub fn settle<K: Key + ?Sized>(&self, key: &K, reserved: u64, actual: u64) -> bool {
        self.settle_at(key, reserved, actual, self.clock.now())
    }

    /// [`Store::settle`] at `now`.
    pub fn settle_at<K: Key + ?Sized>(
        &self,
        key: &K,
        reserved: u64,
        actual: u64,
        now: Nanos,
    ) -> bool {
        if reserved == actual {
            return true;
        }
        let mut op = Settle {
            by: &self.limits,
            now,
            reserved,
            actual,
        };
        self.run(key.key_id(&self.hasher), now, false, &mut op)
    }

    /// Forgets `key`'s state (back to fresh). Returns whether it had any.
    pub fn reset<K: Key + ?Sized>(&self, key: &K) -> bool {
        let id = key.key_id(&self.hasher);
        let (shard, home) = self.locate(id);
        shard.remove(&self.ctx(false), id, home)
    }
    /// Loom models: whether `key`'s live slot, if any, carries `key`'s tag.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn loom_tag_agrees<K: Key + ?Sized>(&self, key: &K) -> Option<bool> {
        let (shard, home) = self.locate(key.key_id(&self.hasher));
        shard.tag_agrees(home, key.key_id(&self.hasher))
    }

    /// Loom models, at rest: every live slot carries its key's tag, every other slot none.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn loom_tags_exact(&self) -> bool {
        self.shards
            .iter()
            .all(|s| s.tags_exact(|id| self.place_of(id).1.tag as u8))
    }

    /// Loom models: the tag byte of key id `id`.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn loom_tag_of(&self, id: u64) -> u8 {
        self.place_of(id).1.tag as u8
    }

    /// Live keys (approximate while checks run).
    pub fn len(&self) -> usize {
        self.stats().live as usize
    }

    /// Whether no key is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the store allocated (tables, headers, arenas); it never allocates more.
    pub fn memory_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.bytes()).sum::<usize>() + std::mem::size_of::<Self>()
    }

    /// What the store did, summed over shards.
    pub fn stats(&self) -> StoreStats {
        StoreStats::of(&self.shards)
    }

    /// How many live keys sit in their first home bucket, their second, and further along
    /// their probe sequence: a lookup reads one bucket for the first, two for the second, and
    /// more for the rest (a scan; not linearizable; for tests and reports).
    pub fn placement(&self) -> [u64; 3] {
        let mut t = [0u64; 3];
        for (i, s) in self.shards.iter().enumerate() {
            s.for_each_live_bucket(|id, b| {
                let (sh, home) = self.place_of(id);
                debug_assert_eq!(sh, i);
                t[if b == home.h1 {
                    0
                } else if b == home.h2 {
                    1
                } else {
                    2
                }] += 1;
            });
        }
        t
    }

    /// Every live key id (a scan; not linearizable).
    pub fn live_ids(&self) -> Vec<u64> {
        let mut v = Vec::new();
        for s in self.shards.iter() {
            s.for_each_live(|k| v.push(k));
        }
        v
    }

    /// Which algorithms are stored inline (16-byte slots) vs. in the arena.
    pub fn is_inline(&self) -> bool {
        self.limits.single_packed().is_some()
    }

    /// The first limit's algorithm (for reports).
    pub fn algorithm(&self) -> Algorithm {
        self.limits.limits()[0].algorithm()
    }
}

/// The packed fast path of one check, as a function generic over the algorithm (one copy of
/// the lookup and CAS loop per packed algorithm, each with its transition inlined:
/// `algo::Packed`).
struct Hit<'a> {
    shard: &'a Shard,
    home: Loc,
    id: u64,
    now: Nanos,
    cost: u64,
}

impl PackedFn<Option<Decision>> for Hit<'_> {
    #[inline(always)]
    fn call<P: Packed>(self, p: &P) -> Option<Decision> {
        self.shard
            .update_live::<P, true>(self.home, self.id, p, self.now, self.cost)
    }
}

#[cfg(all(test, not(loom)))]
#[path = "store_tests.rs"]
mod tests;
