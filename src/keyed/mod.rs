//! The keyed store: millions of keys' limits in thread-per-core shards of 16-byte records,
//! lock-free, inside a fixed memory budget.
//!
//! * A key (customer id, IP address, API key, ...) becomes a 64-bit id ([`key`]).
//! * The id's keyed mix picks a shard (its top bits) and a home bucket in it. Shards are a
//!   power of two ≥ the available cores, each its own allocation that the thread pinned to
//!   its core can first-touch ([`Store::prefault_shard`]).
//! * One packed limit (fixed_window, sliding_window, token_bucket, leaky_bucket) lives
//!   entirely in its slot: 8 bytes of key, 8 of state, one 16-byte CAS per check, nothing
//!   else touched. Other limits (sliding_log, window_ring, concurrency, several limits per
//!   key) keep a record in the shard's arena, referenced from the slot (`src/keyed/arena.rs`).
//! * Memory is allocated once, when the store is built, from the budget or key capacity, and
//!   never grows. Idle records are reclaimed in place by probes that need room; when a probe
//!   range is full of live keys the [`FullPolicy`] decides, and every outcome is counted.
//!
//! The table's protocol and why it is correct are in the docs of `src/keyed/table.rs`.

pub(crate) mod arena;
pub mod key;
pub(crate) mod table;

use crate::algo::{with_packed, Algorithm, Limit, Limits, Packed, PackedFn};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::{ConfigError, Decision, Outcome};
use crate::sync::Ordering;
use crossbeam_utils::CachePadded;
// std's `Arc`: the shards are shared between stores, never touched by loom models of a check.
pub use key::{parse_key, Key, KeyError, KeyHasher, ParsedKey};
use std::sync::Arc;
use table::{Ctx, Loc, Shard, BUCKET};

/// What to do with a new key when its probe range is full of live keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FullPolicy {
    /// Refuse it: the check answers [`Outcome::StoreFull`] (fail closed).
    #[default]
    Reject,
    /// Admit it without tracking: [`Outcome::Untracked`] (fail open).
    AllowUntracked,
    /// Evict the record closest to idle in the probe range and track the new key.
    EvictStalest,
}

impl std::str::FromStr for FullPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reject" => Ok(FullPolicy::Reject),
            "allow" | "allow_untracked" => Ok(FullPolicy::AllowUntracked),
            "evict" | "evict_stalest" => Ok(FullPolicy::EvictStalest),
            _ => Err(format!("unknown full-store policy `{s}`; expected reject, allow_untracked or evict_stalest")),
        }
    }
}

/// Slots filled per slot allocated, at capacity. Measured: see `docs/memory.md`.
pub const LOAD_FACTOR: f64 = 0.87;

/// Counts of what the store did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// Builds a [`Store`].
#[derive(Clone, Debug)]
pub struct StoreBuilder {
    limits: Limits,
    capacity: Option<u64>,
    budget: Option<usize>,
    shards: Option<usize>,
    policy: FullPolicy,
    seed: Option<u64>,
    ipv6_prefix: u8,
}

impl StoreBuilder {
    /// Room for `keys` live keys.
    pub fn capacity(mut self, keys: u64) -> Self {
        self.capacity = Some(keys);
        self
    }
    /// As many keys as fit in `bytes` (the store never allocates more).
    pub fn memory_budget(mut self, bytes: usize) -> Self {
        self.budget = Some(bytes);
        self
    }
    /// Number of shards (rounded up to a power of two). Default: ≥ available cores.
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n);
        self
    }
    /// What to do when full.
    pub fn policy(mut self, p: FullPolicy) -> Self {
        self.policy = p;
        self
    }
    /// Fixed hash seed (reproducible placement); default: random per process.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// Group IPv6 addresses by this prefix length (default 64).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// Builds on the default clock ([`DefaultClock`]: the calibrated TSC).
    pub fn build(self) -> Result<Store<DefaultClock>, ConfigError> {
        self.build_with_clock(DefaultClock::new())
    }

    /// Builds on `clock`.
    pub fn build_with_clock<C: Clock>(self, mut clock: C) -> Result<Store<C>, ConfigError> {
        let shards = self
            .shards
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
            .next_power_of_two();
        if shards > 1 << 16 {
            return Err(ConfigError::new("shards", "at most 65536 shards"));
        }
        let arena_words = if self.limits.single_packed().is_some() {
            None
        } else {
            Some(self.limits.words())
        };
        let per_key = |words: Option<usize>| {
            (16.0 + 8.0 / BUCKET as f64) / LOAD_FACTOR
                + words.map_or(0.0, |w| 8.0 * (1 + w) as f64 + 4.0)
        };
        let capacity = match (self.capacity, self.budget) {
            (Some(c), None) => c,
            (None, Some(b)) => (b as f64 / per_key(arena_words)) as u64,
            (None, None) => {
                return Err(ConfigError::new(
                    "capacity",
                    "give the store a key capacity or a memory budget",
                ))
            }
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "capacity",
                    "give a key capacity or a memory budget, not both",
                ))
            }
        };
        let mut cap = capacity;
        loop {
            if cap == 0 {
                return Err(ConfigError::new(
                    "memory_budget",
                    format!(
                        "a budget of {} bytes holds no key; one key needs about {:.0} bytes",
                        self.budget.unwrap_or(0),
                        per_key(arena_words)
                    ),
                ));
            }
            let per_shard = cap.div_ceil(shards as u64);
            if arena_words.is_some() && per_shard > (1 << 30) {
                return Err(ConfigError::new(
                    "capacity",
                    "at most 2^30 arena records per shard; add shards",
                ));
            }
            let buckets =
                ((per_shard as f64 / (LOAD_FACTOR * BUCKET as f64)).ceil() as usize).max(1);
            if let Some(b) = self.budget {
                // Estimate first (building allocates, lazily zeroed, so a retry is cheap).
                let est = shards
                    * (buckets * (BUCKET * 16 + 8)
                        + arena_words.map_or(0, |w| per_shard as usize * (8 * (1 + w) + 4))
                        + 512);
                if est > b {
                    cap = cap * 99 / 100;
                    continue;
                }
            }
            let shard_vec: Vec<CachePadded<Shard>> = (0..shards)
                .map(|_| {
                    CachePadded::new(Shard::new(
                        buckets,
                        arena_words.map(|w| (per_shard as u32, w)),
                    ))
                })
                .collect();
            let hasher = match self.seed {
                Some(s) => KeyHasher::with_seed(s, self.ipv6_prefix),
                None => KeyHasher::random(self.ipv6_prefix),
            };
            let store = Store {
                packed: self.limits.single_packed().copied(),
                shard_buckets: shard_vec[0].n_buckets() as u64,
                shards: shard_vec.into(),
                shard_bits: shards.trailing_zeros(),
                limits: self.limits.clone(),
                hasher,
                policy: self.policy,
                clock,
                capacity: cap,
            };
            if let Some(b) = self.budget {
                if store.memory_bytes() > b {
                    cap = cap * 99 / 100;
                    clock = store.clock;
                    continue;
                }
            }
            return Ok(store);
        }
    }
}

/// Limits for many keys. See the module docs.
pub struct Store<C: Clock = DefaultClock> {
    /// The one packed limit every slot holds, if the store is packed (the fast path).
    packed: Option<Limit>,
    /// Buckets in each shard (all shards are the same size).
    shard_buckets: u64,
    /// Shared with the stores [`Store::with_limits`] made from this one (rules reload).
    shards: Arc<[CachePadded<Shard>]>,
    shard_bits: u32,
    limits: Limits,
    hasher: KeyHasher,
    policy: FullPolicy,
    clock: C,
    capacity: u64,
}

impl Store<DefaultClock> {
    /// A builder for a store applying `limits` (all-or-nothing) to every key.
    pub fn builder(limits: Limits) -> StoreBuilder {
        StoreBuilder {
            limits,
            capacity: None,
            budget: None,
            shards: None,
            policy: FullPolicy::default(),
            seed: None,
            ipv6_prefix: 64,
        }
    }

    /// A store of one limit with room for `keys` keys.
    pub fn with_capacity(limit: Limit, keys: u64) -> Result<Self, ConfigError> {
        Self::builder(Limits::new(vec![limit])?)
            .capacity(keys)
            .build()
    }
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
        Some(Store {
            packed: limits.single_packed().copied(),
            shard_buckets: self.shard_buckets,
            shards: self.shards.clone(),
            shard_bits: self.shard_bits,
            limits,
            hasher: self.hasher.clone(),
            policy,
            clock: self.clock.clone(),
            capacity: self.capacity,
        })
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

    #[inline(always)]
    fn locate(&self, id: u64) -> (&Shard, Loc) {
        let (i, home) = self.place_of(id);
        (&self.shards[i], home)
    }

    /// The shard index and home buckets of key id `id`.
    #[inline(always)]
    fn place_of(&self, id: u64) -> (usize, Loc) {
        let h = self.hasher.place(id);
        let shard = if self.shard_bits == 0 {
            0
        } else {
            (h >> (64 - self.shard_bits)) as usize
        };
        // Every shard has the same number of buckets, kept here: no load from the shard
        // before its bucket address is known.
        let n = self.shard_buckets;
        // Two independent 24-bit slices of the mix (the shard uses the top bits), reduced by
        // multiply-shift.
        let h1 = (((h & 0xff_ffff) * n) >> 24) as usize;
        let h2 = ((((h >> 24) & 0xff_ffff) * n) >> 24) as usize;
        (shard, Loc { h1, h2 })
    }

    /// The shard a key lives in (for routing requests to the thread that owns it).
    pub fn shard_of<K: Key + ?Sized>(&self, key: &K) -> usize {
        let h = self.hasher.place(key.key_id(&self.hasher));
        if self.shard_bits == 0 {
            0
        } else {
            (h >> (64 - self.shard_bits)) as usize
        }
    }

    /// Touches every page of shard `i` from the calling thread (first-touch placement).
    pub fn prefault_shard(&self, i: usize) {
        self.shards[i].prefault();
    }

    fn full_decision(&self, o: Outcome) -> Decision {
        let cap = self.limits.limits()[0].capacity();
        Decision {
            outcome: o,
            limit: cap,
            remaining: 0,
            reset_after_ns: 0,
            retry_after_ns: None,
            delay_ns: 0,
        }
    }

    #[inline]
    fn run(&self, id: u64, now: Nanos, cost: u64, insert: bool, missed: bool) -> Decision {
        let (shard, home) = self.locate(id);
        let ctx = Ctx {
            limits: &self.limits,
            policy: self.policy,
            missed,
        };
        let limits = &self.limits;
        match &self.packed {
            Some(l) => shard.with_key(
                &ctx,
                id,
                home,
                now,
                insert,
                &mut |s| l.decide_packed(s, now, cost).expect("packed"),
                &mut |_| unreachable!("packed store has no arena"),
                &mut || l.decide_packed(0, now, cost).expect("packed").1,
                &mut |o| self.full_decision(o),
            ),
            None => shard.with_key(
                &ctx,
                id,
                home,
                now,
                insert,
                &mut |_| unreachable!("arena store has no packed slots"),
                &mut |c| limits.decide(c, now, cost),
                &mut || Shard::fresh(limits.words(), &mut |c| limits.decide(c, now, cost)),
                &mut |o| self.full_decision(o),
            ),
        }
    }

    /// Checks a request of `cost` for `key` now.
    #[inline]
    pub fn check<K: Key + ?Sized>(&self, key: &K, cost: u64) -> Decision {
        self.check_at(key, cost, self.clock.now())
    }

    /// Checks a request of `cost` for `key` at `now`.
    #[inline]
    pub fn check_at<K: Key + ?Sized>(&self, key: &K, cost: u64, now: Nanos) -> Decision {
        self.check_id(key.key_id(&self.hasher), now, cost)
    }

    /// A check of key id `id`: the packed fast path for a live key, else the general path.
    #[inline(always)]
    fn check_id(&self, id: u64, now: Nanos, cost: u64) -> Decision {
        let (shard, home) = self.locate(id);
        self.check_located(shard, home, id, now, cost)
    }

    /// [`Store::check_id`] with the key's place already computed (batches compute it ahead).
    #[inline(always)]
    fn check_located(&self, shard: &Shard, home: Loc, id: u64, now: Nanos, cost: u64) -> Decision {
        // One copy of the lookup and CAS loop per packed algorithm, each with its transition
        // inlined (`algo::Packed`).
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

    /// The general path, out of line: new keys, arena records, a reclaimed slot. `missed`:
    /// the packed fast path's lookup just missed (see `Ctx::missed`).
    #[inline(never)]
    fn run_cold(&self, id: u64, now: Nanos, cost: u64, missed: bool) -> Decision {
        self.run(id, now, cost, cost > 0, missed)
    }

    /// Looks at `key`'s limit without consuming (and without inserting it).
    pub fn peek<K: Key + ?Sized>(&self, key: &K) -> Decision {
        self.peek_at(key, self.clock.now())
    }

    /// [`Store::peek`] at `now`.
    pub fn peek_at<K: Key + ?Sized>(&self, key: &K, now: Nanos) -> Decision {
        self.run(key.key_id(&self.hasher), now, 0, false, false)
    }

    /// What a check of `cost` for `key` at `now` would answer, recording nothing (and not
    /// inserting the key). A denial is described without the count a `count_denied` limit
    /// would add ([`Limits::evaluate`]).
    pub fn evaluate_at<K: Key + ?Sized>(&self, key: &K, cost: u64, now: Nanos) -> Decision {
        let id = key.key_id(&self.hasher);
        let (shard, home) = self.locate(id);
        let ctx = Ctx {
            limits: &self.limits,
            policy: self.policy,
            missed: false,
        };
        let limits = &self.limits;
        shard.with_key(
            &ctx,
            id,
            home,
            now,
            false,
            &mut |s| {
                let mut w = [s];
                (s, limits.evaluate(&mut w, now, cost))
            },
            &mut |c| limits.evaluate(c, now, cost),
            &mut || Shard::fresh(limits.words(), &mut |c| limits.evaluate(c, now, cost)),
            &mut |o| self.full_decision(o),
        )
    }

    /// Gives `n` back to `key`'s limits.
    pub fn refund<K: Key + ?Sized>(&self, key: &K, n: u64) {
        self.refund_at(key, n, self.clock.now())
    }

    /// [`Store::refund`] at `now`.
    pub fn refund_at<K: Key + ?Sized>(&self, key: &K, n: u64, now: Nanos) {
        let id = key.key_id(&self.hasher);
        let (shard, home) = self.locate(id);
        let ctx = Ctx {
            limits: &self.limits,
            policy: self.policy,
            missed: false,
        };
        let limits = &self.limits;
        shard.with_key(
            &ctx,
            id,
            home,
            now,
            false,
            &mut |s| {
                let mut w = [s];
                limits.refund(&mut w, now, n);
                (w[0], ())
            },
            &mut |c| limits.refund(c, now, n),
            &mut || (),
            &mut |_| (),
        )
    }

    /// Forgets `key`'s state (back to fresh). Returns whether it had any.
    pub fn reset<K: Key + ?Sized>(&self, key: &K) -> bool {
        let id = key.key_id(&self.hasher);
        let (shard, home) = self.locate(id);
        shard.remove(
            &Ctx {
                limits: &self.limits,
                policy: self.policy,
                missed: false,
            },
            id,
            home,
        )
    }

    /// Checks a batch: one clock read, ids hashed and home buckets prefetched ahead.
    /// `out` must be as long as `keys`.
    pub fn check_batch<K: Key>(&self, keys: &[K], cost: u64, out: &mut [Decision]) {
        self.check_batch_at(keys, cost, self.clock.now(), out)
    }

    /// [`Store::check_batch`] at `now`.
    pub fn check_batch_at<K: Key>(&self, keys: &[K], cost: u64, now: Nanos, out: &mut [Decision]) {
        assert_eq!(
            keys.len(),
            out.len(),
            "check_batch: `out` must have one Decision per key"
        );
        // The packed algorithm is dispatched once per batch: one copy of the loop per algorithm,
        // its transition inlined.
        struct Batch<'a, C: Clock, K> {
            store: &'a Store<C>,
            keys: &'a [K],
            cost: u64,
            now: Nanos,
            out: &'a mut [Decision],
        }
        impl<C: Clock, K: Key> PackedFn<()> for Batch<'_, C, K> {
            #[inline(always)]
            fn call<P: Packed>(self, p: &P) {
                let Batch {
                    store,
                    keys,
                    cost,
                    now,
                    out,
                } = self;
                store.batch_loop(keys, out, |sh, home, id| {
                    match sh.update_live::<P, false>(home, id, p, now, cost) {
                        Some(d) => d,
                        None => store.run_cold(id, now, cost, true),
                    }
                })
            }
        }
        match &self.packed {
            Some(l) => {
                let b = Batch {
                    store: self,
                    keys,
                    cost,
                    now,
                    out,
                };
                with_packed(l, b).expect("the store's packed limit is packed");
            }
            None => self.batch_loop(keys, out, |sh, home, id| {
                self.check_located(sh, home, id, now, cost)
            }),
        }
    }

    /// The ring of [`Store::check_batch_at`]: each key is hashed and located once, and both its
    /// home buckets are prefetched AHEAD keys before `check` runs on it, so that the misses of
    /// consecutive keys overlap (docs/performance.md).
    #[inline(always)]
    fn batch_loop<K: Key>(
        &self,
        keys: &[K],
        out: &mut [Decision],
        mut check: impl FnMut(&Shard, Loc, u64) -> Decision,
    ) {
        const AHEAD: usize = 8;
        let n = keys.len();
        let mut ring = [(0u64, 0usize, Loc { h1: 0, h2: 0 }); AHEAD];
        for i in 0..n + AHEAD {
            let r = i % AHEAD;
            if i >= AHEAD {
                let (id, sh, home) = ring[r];
                out[i - AHEAD] = check(&self.shards[sh], home, id);
            }
            if i < n {
                let id = keys[i].key_id(&self.hasher);
                let (sh, home) = self.place_of(id);
                self.shards[sh].prefetch_home(home);
                ring[r] = (id, sh, home);
            }
        }
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
        let mut t = StoreStats::default();
        for s in self.shards.iter() {
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
