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

use crate::algo::{concurrency, with_packed, Algorithm, Limit, Limits, Packed, PackedFn};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::{ConfigError, Decision, Outcome, Verdict};
use crate::sync::{AtomicU128, Ordering};
use crossbeam_utils::CachePadded;
// std's `Arc`, not the sync shim's: it is the receiver of `acquire_owned` (public API), and
// loom's `Arc` cannot be a method receiver; the shards it shares between stores (reloads) are
// never touched by loom models of a check.
pub use key::{parse_key, Key, KeyError, KeyHasher, ParsedKey};
use std::sync::Arc;
use table::{Ctx, Loc, Shard, BUCKET, GROUP};

/// What to do with a new key when its probe range is full of live keys.
///
/// The default is `AllowUntracked`, chosen by measurement (`docs/memory.md`, "A key flood";
/// `tests/store_flood.rs`): under a flood of ten times the capacity in one-shot keys, `Reject`
/// refused 45 % of honest users' requests for a window limit, `EvictStalest` reset every
/// abuser being limited (a window limit's records all become idle at the same instant, so
/// "closest to idle" cannot tell an abuser from a one-shot key), and `AllowUntracked` refused
/// no honest user and kept every abuser it already tracked limited: only keys new while the
/// range is full go untracked, until it has room again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FullPolicy {
    /// Refuse it: the check answers [`Outcome::StoreFull`] (fail closed), with a retry hint.
    Reject,
    /// Admit it without tracking: [`Outcome::Untracked`] (fail open).
    #[default]
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

/// What a batch check writes per key: a whole [`Decision`], or a [`Verdict`].
trait Answer {
    fn of(d: &Decision) -> Self;
}

/// The last stage of a packed batch's ring: one key's check on the slot its tags point at.
trait CheckSlot<'s, T> {
    fn check(&mut self, slot: &'s AtomicU128, id: u64) -> T;
}

impl Answer for Decision {
    #[inline(always)]
    fn of(d: &Decision) -> Self {
        *d
    }
}

impl Answer for Verdict {
    #[inline(always)]
    fn of(d: &Decision) -> Self {
        // The common answer without the general conversion's selects.
        if d.outcome == Outcome::Allowed && d.delay_ns == 0 {
            Verdict::ALLOWED
        } else {
            // By value, the three fields a verdict keeps: a `&Decision` made the caller build
            // the whole decision in memory, its `remaining` (a division) included.
            verdict_of(d.outcome, d.retry_after_ns, d.delay_ns)
        }
    }
}

#[inline(never)]
fn verdict_of(outcome: Outcome, retry_after_ns: Option<u64>, delay_ns: u64) -> Verdict {
    Verdict::of_parts(outcome, retry_after_ns, delay_ns)
}

/// Slots filled per slot allocated, at capacity. Measured: see `docs/memory.md`.
pub const LOAD_FACTOR: f64 = 0.87;

/// Bits of the key's placement mix that pick each home bucket (two independent slices; the
/// shard takes the top bits). A shard has at most `2^PLACE_BITS` buckets: with more, some
/// would be reachable by no key. Wider slices would need a second mix on every check (the
/// 64-bit mix has no 2 × 28 bits left beside 16 shard bits), so the builder refuses larger
/// shards instead and asks for more of them.
pub const PLACE_BITS: u32 = 24;

/// Buckets a store of `keys` keys per shard gives each shard.
fn buckets_for(keys: u64) -> u64 {
    ((keys as f64 / (LOAD_FACTOR * BUCKET as f64)).ceil() as u64).max(1)
}

/// The most keys one shard holds: `2^PLACE_BITS` buckets at [`LOAD_FACTOR`] (116 769 423).
pub fn max_keys_per_shard() -> u64 {
    let mut k = ((1u64 << PLACE_BITS) as f64 * LOAD_FACTOR * BUCKET as f64) as u64;
    while buckets_for(k) > 1 << PLACE_BITS {
        k -= 1;
    }
    k
}

/// Shards a store allows at most.
const MAX_SHARDS: usize = 1 << 16;

/// The shard count for `capacity` keys: `shards` (a power of two), raised to the fewest that
/// hold `capacity` when the caller did not choose it (`explicit`) and it is too few (e.g. a
/// rule of 2^30 keys on a 2-core machine), as long as at most [`MAX_SHARDS`] do. Otherwise
/// unchanged: the builder then refuses the size.
fn shards_for(capacity: u64, shards: usize, explicit: bool) -> usize {
    let need = capacity
        .div_ceil(max_keys_per_shard())
        .next_power_of_two()
        .min(u64::MAX >> 1);
    if explicit || need <= shards as u64 || need > MAX_SHARDS as u64 {
        shards
    } else {
        need as usize
    }
}

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
    #[cfg(loom)]
    range: Option<usize>,
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
    /// Number of shards (rounded up to a power of two). Default: ≥ available cores, and as
    /// many as a large capacity needs ([`max_keys_per_shard`] each).
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

    /// Loom builds only: buckets in each of a key's two probe ranges (default 1 under loom), for
    /// models that probe past the home buckets and wrap around the table.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn loom_range(mut self, buckets: usize) -> Self {
        self.range = Some(buckets);
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
        if shards > MAX_SHARDS {
            return Err(ConfigError::new("shards", "at most 65536 shards"));
        }
        let arena_words = if self.limits.single_packed().is_some() {
            None
        } else {
            Some(self.limits.words())
        };
        // A slot, its tag byte, and its share of a header word.
        let per_key = |words: Option<usize>| {
            (16.0 + 1.0 + 8.0 / (BUCKET * GROUP) as f64) / LOAD_FACTOR
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
        // Sizes the placement cannot reach, or that would overflow the arithmetic below, are
        // refused here (and an allocation that fails is an error too, at `Shard::new`).
        let per_shard_max = max_keys_per_shard();
        let shards = shards_for(capacity, shards, self.shards.is_some());
        if capacity.div_ceil(shards as u64) > per_shard_max {
            let (field, what) = match self.budget {
                Some(b) => (
                    "memory_budget",
                    format!("a budget of {b} bytes holds about {capacity} keys"),
                ),
                None => ("capacity", format!("a capacity of {capacity} keys")),
            };
            let need = capacity.div_ceil(per_shard_max).next_power_of_two();
            return Err(ConfigError::new(
                field,
                if need > MAX_SHARDS as u64 {
                    format!(
                        "{what} is more than a store holds: at most {per_shard_max} keys per \
                         shard (2^{PLACE_BITS} buckets) in at most {MAX_SHARDS} shards; ask for \
                         fewer keys"
                    )
                } else {
                    format!(
                        "{what} needs at least {need} shards (one holds at most \
                         {per_shard_max} keys, 2^{PLACE_BITS} buckets), not {shards}; set \
                         `shards({need})` or ask for fewer keys"
                    )
                },
            ));
        }
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
            // At most 2^PLACE_BITS (checked above): fits a usize, and the sizes below too.
            let buckets = buckets_for(per_shard) as usize;
            if let Some(b) = self.budget {
                // Estimate first (building allocates, lazily zeroed, so a retry is cheap).
                // Saturating: an arena of many words per record can exceed usize here.
                let arena = arena_words.map_or(0, |w| {
                    (per_shard as usize).saturating_mul(w.saturating_add(1).saturating_mul(8) + 4)
                });
                let est = shards.saturating_mul(
                    (buckets * (BUCKET * 16 + 8) + buckets.div_ceil(GROUP) * 8)
                        .saturating_add(arena)
                        .saturating_add(512),
                );
                if est > b {
                    cap = cap * 99 / 100;
                    continue;
                }
            }
            let shard_vec = (0..shards)
                .map(|_| {
                    Shard::new(buckets, arena_words.map(|w| (per_shard as u32, w)))
                        .map(CachePadded::new)
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ConfigError::new(
                        if self.budget.is_some() {
                            "memory_budget"
                        } else {
                            "capacity"
                        },
                        format!(
                            "could not allocate {shards} shards of {buckets} buckets{}; ask \
                             for fewer keys",
                            if arena_words.is_some() {
                                format!(" and {per_shard} records")
                            } else {
                                String::new()
                            }
                        ),
                    )
                })?;
            #[cfg(loom)]
            let mut shard_vec = shard_vec;
            #[cfg(loom)]
            if let Some(r) = self.range {
                for s in &mut shard_vec {
                    s.set_range(r);
                }
            }
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

/// In-flight capacity of one key of a [`Store`], held until dropped (see
/// [`Store::acquire_owned`]). Owns an `Arc` of the store: `Send` and `'static` when the clock
/// is, so it can be held across `.await` and moved between tasks.
#[must_use = "the permit is released as soon as it is dropped"]
pub struct StorePermit<C: Clock = DefaultClock> {
    store: Arc<Store<C>>,
    id: u64,
    /// The lease's stamp; `None` for a permit that releases nothing.
    stamp: Option<u64>,
    decision: Decision,
}

impl<C: Clock> StorePermit<C> {
    /// The decision that granted it.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl<C: Clock> Drop for StorePermit<C> {
    fn drop(&mut self) {
        if let Some(stamp) = self.stamp {
            self.store.release(self.id, stamp);
        }
    }
}

impl<C: Clock> std::fmt::Debug for StorePermit<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorePermit")
            .field("id", &self.id)
            .field("stamp", &self.stamp)
            .field("decision", &self.decision)
            .finish()
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
            #[cfg(loom)]
            range: None,
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
    /// 16-byte slots in the store's tables, all shards (what a table of the same size as the
    /// store holds: `turnstile bench` measures its memory floor over that many).
    pub fn slot_count(&self) -> u64 {
        self.shards.len() as u64 * self.shard_buckets * BUCKET as u64
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
        let shard = self.shard_index(h);
        // Every shard has the same number of buckets, kept here: no load from the shard
        // before its bucket address is known.
        let n = self.shard_buckets;
        // Two independent 24-bit slices of the mix (the shard uses the top bits), reduced by
        // multiply-shift.
        let h1 = (((h & 0xff_ffff) * n) >> 24) as usize;
        let h2 = ((((h >> 24) & 0xff_ffff) * n) >> 24) as usize;
        // Eight more bits (48..55; the shard takes bits from 63 down, so they are independent
        // of it up to 256 shards), never 0 (an empty slot's tag): 255 values.
        let tag = ((h >> 48) as u8).max(1) as u64;
        (shard, Loc { h1, h2, tag })
    }

    /// The shard a key lives in (for routing requests to the thread that owns it).
    pub fn shard_of<K: Key + ?Sized>(&self, key: &K) -> usize {
        self.shard_index(self.hasher.place(key.key_id(&self.hasher)))
    }

    /// The shard of placement hash `h`: its top `shard_bits` bits. Two shifts rather than a
    /// test for `shard_bits == 0` (a shift by 64 is not defined): `(h >> 1) >> 63` is 0.
    #[inline(always)]
    fn shard_index(&self, h: u64) -> usize {
        ((h >> 1) >> (63 - self.shard_bits)) as usize
    }

    /// Shard `i` of [`Store::shard_index`], without a bounds check on the batch path.
    #[inline(always)]
    fn shard_at(&self, i: usize) -> &Shard {
        debug_assert!(i < self.shards.len());
        // SAFETY: `shard_index` keeps `shard_bits` bits, and there are 2^shard_bits shards
        // (the builder rounds the count up to a power of two and takes its trailing zeros).
        unsafe { self.shards.get_unchecked(i) }
    }

    /// Touches every page of shard `i` from the calling thread (first-touch placement).
    pub fn prefault_shard(&self, i: usize) {
        self.shards[i].prefault();
    }

    /// The answer for a new key that found no room ([`Outcome::StoreFull`] or
    /// [`Outcome::Untracked`]). A refusal carries a retry hint: it is not "never fits".
    #[cold]
    fn full_decision(&self, o: Outcome, now: Nanos) -> Decision {
        let cap = self.limits.limits()[0].capacity();
        Decision {
            outcome: o,
            limit: cap,
            remaining: 0,
            reset_after_ns: 0,
            retry_after_ns: (o == Outcome::StoreFull).then(|| self.room_after(now)),
            delay_ns: 0,
        }
    }

    /// The answer when the table refuses a key: the store is full (`full_decision`), or the
    /// key is absent and `now` is before its shard's reclaim horizon (`Limited` until then: its
    /// record may have been reclaimed, and the store can no longer tell what it held at `now`;
    /// `table::RECLAIM_GRACE_NS`).
    fn refused(&self, o: Outcome, shard: &Shard, now: Nanos) -> Decision {
        if o != Outcome::Limited {
            return self.full_decision(o, now);
        }
        let wait = shard.horizon().saturating_sub(now).max(1);
        Decision {
            reset_after_ns: wait,
            retry_after_ns: Some(wait),
            ..self.full_decision(o, now)
        }
    }

    /// When a full probe range should have room again: a record made now by one request (a
    /// one-shot key of a flood) is reclaimable after this long, the reclaim grace included.
    /// Records made earlier free sooner, so it is an upper bound for a flood of one-shot keys;
    /// a range full of keys that keep coming back stays full (docs/memory.md).
    fn room_after(&self, now: Nanos) -> u64 {
        let limits = &self.limits;
        let idle = Shard::fresh(limits.words(), &mut |c| {
            limits.decide(c, now, 1);
            limits.idle_in(c, now)
        });
        idle.saturating_add(table::RECLAIM_GRACE_NS)
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
                &mut |o| self.refused(o, shard, now),
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
                &mut |o| self.refused(o, shard, now),
            ),
        }
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
            &mut |o| self.refused(o, shard, now),
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

    /// For a concurrency limit: takes `cost` of `key`'s in-flight permits, held until the
    /// returned [`StorePermit`] drops (or its lease expires, if it never does). The permit owns
    /// an `Arc` of the store, so it can move into a task and be held across `.await`.
    ///
    /// A plain [`Store::check`] on a concurrency store takes a lease that only its expiry
    /// frees (`refund` cannot name it); `acquire_owned` is how to give it back early. For any
    /// other limit, this answers as `check` and its permit releases nothing.
    pub fn acquire_owned<K: Key + ?Sized>(
        self: &Arc<Self>,
        key: &K,
        cost: u64,
    ) -> Result<StorePermit<C>, Decision> {
        self.acquire_owned_at(key, cost, self.clock.now())
    }

    /// [`Store::acquire_owned`] at `now`.
    pub fn acquire_owned_at<K: Key + ?Sized>(
        self: &Arc<Self>,
        key: &K,
        cost: u64,
        now: Nanos,
    ) -> Result<StorePermit<C>, Decision> {
        let id = key.key_id(&self.hasher);
        let (decision, stamp) = match self.limits.limits() {
            [Limit::Concurrency(p)] => {
                let (shard, home) = self.locate(id);
                let ctx = Ctx {
                    limits: &self.limits,
                    policy: self.policy,
                    missed: false,
                };
                shard.with_key(
                    &ctx,
                    id,
                    home,
                    now,
                    cost > 0,
                    &mut |_: u64| -> (u64, (Decision, Option<u64>)) {
                        unreachable!("a concurrency store keeps its records in the arena")
                    },
                    &mut |c| concurrency::acquire(c, now, p, cost, true),
                    &mut || {
                        Shard::fresh(p.words(), &mut |c| {
                            concurrency::acquire(c, now, p, cost, false)
                        })
                    },
                    &mut |o| (self.full_decision(o, now), None),
                )
            }
            _ => (self.check_id(id, now, cost), None),
        };
        if decision.allowed() {
            Ok(StorePermit {
                store: Arc::clone(self),
                id,
                stamp,
                decision,
            })
        } else {
            Err(decision)
        }
    }

    /// Frees the permit `stamp` of key id `id` (a no-op if its lease expired and its cells
    /// were reused, or its record is gone).
    fn release(&self, id: u64, stamp: u64) {
        let [Limit::Concurrency(p)] = self.limits.limits() else {
            return;
        };
        let (shard, home) = self.locate(id);
        let ctx = Ctx {
            limits: &self.limits,
            policy: self.policy,
            missed: false,
        };
        shard.with_key(
            &ctx,
            id,
            home,
            self.clock.now(),
            false,
            &mut |_: u64| -> (u64, ()) {
                unreachable!("a concurrency store keeps its records in the arena")
            },
            &mut |c| {
                concurrency::release(c, p, stamp);
            },
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

    /// Checks a batch: one clock read, ids hashed and their slots prefetched ahead.
    /// `out` must be as long as `keys`. [`Store::check_batch_verdicts`] answers the same
    /// checks with 8 bytes per key instead of a whole [`Decision`], for less work per key.
    pub fn check_batch<K: Key>(&self, keys: &[K], cost: u64, out: &mut [Decision]) {
        self.check_batch_at(keys, cost, self.clock.now(), out)
    }

    /// [`Store::check_batch`] at `now` (which may lag as [`Store::check_at`]'s may).
    pub fn check_batch_at<K: Key>(&self, keys: &[K], cost: u64, now: Nanos, out: &mut [Decision]) {
        self.batch_into(keys, cost, now, out)
    }

    /// Checks a batch as [`Store::check_batch`] does, answering each key with a [`Verdict`]:
    /// its outcome, and when to retry if it is denied (a shaper's delay if admitted). The
    /// state changes are the same; what is left out is each check's `remaining` and
    /// `reset_after`, and the 56 bytes of a `Decision` written per key (docs/performance.md).
    /// `out` must be as long as `keys`.
    pub fn check_batch_verdicts<K: Key>(&self, keys: &[K], cost: u64, out: &mut [Verdict]) {
        self.check_batch_verdicts_at(keys, cost, self.clock.now(), out)
    }

    /// [`Store::check_batch_verdicts`] at `now` (which may lag as [`Store::check_at`]'s may).
    pub fn check_batch_verdicts_at<K: Key>(
        &self,
        keys: &[K],
        cost: u64,
        now: Nanos,
        out: &mut [Verdict],
    ) {
        self.batch_into(keys, cost, now, out)
    }

    /// Both batch checks: `T` is what each key's answer is written as.
    #[inline(always)]
    fn batch_into<K: Key, T: Answer>(&self, keys: &[K], cost: u64, now: Nanos, out: &mut [T]) {
        assert_eq!(
            keys.len(),
            out.len(),
            "check_batch: `out` must have one answer per key"
        );
        // The packed algorithm is dispatched once per batch: one copy of the loop per algorithm,
        // its transition inlined.
        struct Batch<'a, C: Clock, K, T> {
            store: &'a Store<C>,
            keys: &'a [K],
            cost: u64,
            now: Nanos,
            out: &'a mut [T],
        }
        impl<C: Clock, K: Key, T: Answer> PackedFn<()> for Batch<'_, C, K, T> {
            #[inline(always)]
            fn call<P: Packed>(self, p: &P) {
                let Batch {
                    store,
                    keys,
                    cost,
                    now,
                    out,
                } = self;
                store.batch_loop_tagged(
                    keys,
                    out,
                    KeyCheck {
                        store,
                        p,
                        now,
                        cost,
                    },
                )
            }
        }
        // A closure here was compiled out of line, called once per key (its call, spills,
        // return and the decision passed through memory: 270 -> 214 instructions per key in
        // `bench --callgrind`): a struct whose method must inline keeps the check in the ring.
        struct KeyCheck<'a, C: Clock, P> {
            store: &'a Store<C>,
            p: &'a P,
            now: Nanos,
            cost: u64,
        }
        impl<'a, C: Clock, P: Packed, T: Answer> CheckSlot<'a, T> for KeyCheck<'_, C, P> {
            #[inline(always)]
            fn check(&mut self, slot: &'a AtomicU128, id: u64) -> T {
                match Shard::update_candidate(slot, id, self.p, self.now, self.cost) {
                    Some(d) => T::of(&d),
                    None => T::of(&self.store.batch_cold(self.p, id, self.now, self.cost)),
                }
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
                T::of(&self.check_located(sh, home, id, now, cost))
            }),
        }
    }

    /// A key of a packed batch whose first tag match did not lead to it: the other slots its
    /// tags match (another key's tag came first), else the whole lookup (it may live past its
    /// home buckets, or its tag may not be set yet), then the general path.
    #[inline(never)]
    fn batch_cold<P: Packed>(&self, p: &P, id: u64, now: Nanos, cost: u64) -> Decision {
        let (shard, home) = self.locate(id);
        if let Some(d) = shard.update_tagged(home, id, p, now, cost) {
            return d;
        }
        self.check_located(shard, home, id, now, cost)
    }

    /// The ring of [`Store::check_batch_at`]: each key is hashed and located once, and both its
    /// home buckets are prefetched AHEAD keys before `check` runs on it, so that the misses of
    /// consecutive keys overlap (docs/performance.md).
    #[inline(always)]
    fn batch_loop<K: Key, T>(
        &self,
        keys: &[K],
        out: &mut [T],
        mut check: impl FnMut(&Shard, Loc, u64) -> T,
    ) {
        const AHEAD: usize = 8;
        let n = keys.len();
        let mut ring = [(0u64, 0usize, Loc::default()); AHEAD];
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

    /// The ring of a packed [`Store::check_batch_at`], in three stages: a key is hashed and its
    /// home buckets' tag words prefetched `2 * AHEAD` keys before it is checked; `AHEAD` keys
    /// before, its tags give the slot to look at ([`Shard::candidate`]), whose line is
    /// prefetched; then `check` verifies that slot and updates it. One line of the table per
    /// key, instead of the four of both home buckets, and three words kept per key in flight
    /// (docs/performance.md).
    #[inline(always)]
    fn batch_loop_tagged<'s, K: Key, T>(
        &'s self,
        keys: &[K],
        out: &mut [T],
        mut check: impl CheckSlot<'s, T>,
    ) {
        // 4, measured against 2 and 8 (`bench --keys 1000000 --engine turnstile`, three
        // alternating runs each): 8 left the first keys of a batch of 32 waiting on misses
        // its prologue could not cover, 2 left the misses of the steady state uncovered.
        const AHEAD: usize = 4;
        let n = keys.len();
        assert_eq!(out.len(), n);
        let mut placed = [(0u64, &*self.shards[0], Loc::default()); AHEAD];
        let mut found = [(0u64, self.shards[0].any_slot()); AHEAD];
        // Step `i` checks key `i - 2 * AHEAD`, finds the slot of key `i - AHEAD` and places key
        // `i`, in that order (each reads its ring entry before the next stage overwrites it).
        macro_rules! step {
            ($i:expr, $place:literal, $find:literal, $check:literal) => {{
                let i: usize = $i;
                step!(i, i % AHEAD, $place, $find, $check)
            }};
            ($i:expr, $r:expr, $place:literal, $find:literal, $check:literal) => {{
                let i: usize = $i;
                let r: usize = $r;
                if $check {
                    let (id, slot) = found[r];
                    debug_assert!(i - 2 * AHEAD < out.len());
                    // SAFETY: a step checks only in spans within [2 * AHEAD, n + 2 * AHEAD),
                    // and `out` holds n answers (asserted above).
                    unsafe { *out.get_unchecked_mut(i - 2 * AHEAD) = check.check(slot, id) };
                }
                if $find {
                    let (id, shard, home) = placed[r];
                    let slot = shard.candidate(home);
                    Shard::prefetch_slot(slot);
                    found[r] = (id, slot);
                }
                if $place {
                    debug_assert!(i < n);
                    // SAFETY: a step places only in spans within [0, n).
                    let id = unsafe { keys.get_unchecked(i) }.key_id(&self.hasher);
                    let (sh, home) = self.place_of(id);
                    let shard = self.shard_at(sh);
                    shard.prefetch_tags(home);
                    placed[r] = (id, shard, home);
                }
            }};
        }
        // The steps run in spans over which the three stages' conditions (`i < n`,
        // `AHEAD <= i < n + AHEAD`, `2 * AHEAD <= i`) are constant, each span a loop of its
        // own: the span of a long batch, [2 * AHEAD, n), tests none of them (testing them on
        // every step cost ~10 instructions per key, `bench --callgrind`).
        let mut ends = [0, AHEAD, 2 * AHEAD, n, n + AHEAD, n + 2 * AHEAD];
        ends.sort_unstable();
        for w in ends.windows(2) {
            let span = w[0]..w[1];
            let lo = w[0];
            match (lo < n, lo >= AHEAD && lo < n + AHEAD, lo >= 2 * AHEAD) {
                (true, true, true) => {
                    // Unrolled by AHEAD from 2 * AHEAD: each step's ring entry is a constant
                    // offset, right because the span starts at a multiple of AHEAD (of the
                    // ends, only 2 * AHEAD lies in [2 * AHEAD, n)). Written as it is on
                    // purpose: starting from the constant, or asserting `lo` in release
                    // builds, compiled to as many instructions but a loop 4-5 ns per key
                    // slower (23.4-25.2 -> 28.4-29.2 ns, `bench --keys 1000000`, three
                    // alternating runs of each build).
                    debug_assert_eq!(lo % AHEAD, 0);
                    const { assert!(AHEAD == 4, "the loop below is unrolled by hand for 4") };
                    let mut i = lo;
                    while i + AHEAD <= span.end {
                        step!(i, 0, true, true, true);
                        step!(i + 1, 1, true, true, true);
                        step!(i + 2, 2, true, true, true);
                        step!(i + 3, 3, true, true, true);
                        i += AHEAD;
                    }
                    (i..span.end).for_each(|i| step!(i, true, true, true))
                }
                (true, true, false) => span.for_each(|i| step!(i, true, true, false)),
                (true, false, false) => span.for_each(|i| step!(i, true, false, false)),
                (false, true, true) => span.for_each(|i| step!(i, false, true, true)),
                (false, true, false) => span.for_each(|i| step!(i, false, true, false)),
                (false, false, true) => span.for_each(|i| step!(i, false, false, true)),
                // (true, false, true) cannot be: 2 * AHEAD <= i < n puts i in the middle
                // range; (false, false, false) is a span of no work (n < AHEAD).
                _ => {}
            }
        }
    }

    /// Snapshot support: visits every live record of a *packed* store (one packed limit per
    /// key, [`Store::is_inline`]) as `(key id, state)`, where `state` is the limit's packed
    /// 63-bit state (e.g. a token bucket's TAT in ns of this store's clock). A scan, not
    /// linearizable: a record updated during the scan is seen before or after the update.
    /// Returns `false` (and visits nothing) for an arena store, whose records are not one word.
    ///
    /// Ids are hashes of the keys under this store's seed: a store that imports them must be
    /// built with the same [`StoreBuilder::seed`]. Times inside the state are this store's
    /// clock's: convert them before importing into a store on another clock.
    pub fn export_packed(&self, mut f: impl FnMut(u64, u64)) -> bool {
        if self.packed.is_none() {
            return false;
        }
        let ctx = Ctx {
            limits: &self.limits,
            policy: self.policy,
            missed: false,
        };
        for s in self.shards.iter() {
            let mut ids = Vec::new();
            s.for_each_live(|id| ids.push(id));
            for id in ids {
                let (shard, home) = self.locate(id);
                // Reads the state: the transition returns it unchanged (no CAS is made).
                let st = shard.with_key(
                    &ctx,
                    id,
                    home,
                    0,
                    false,
                    &mut |st| (st, Some(st)),
                    &mut |_| unreachable!("packed store has no arena"),
                    &mut || None,
                    &mut |_| None,
                );
                if let Some(st) = st {
                    f(id, st);
                }
            }
        }
        true
    }

    /// Snapshot support: sets key id `id`'s record in a packed store to `state` (from
    /// [`Store::export_packed`], its times converted to this store's clock), inserting it if
    /// absent. `now` is this store's clock's time (a full probe range reclaims idle records
    /// as of it, then follows the store's [`FullPolicy`]). Returns whether the record is
    /// stored; `false` for an arena store, a state using bit 63, or no room.
    pub fn import_packed(&self, id: u64, state: u64, now: Nanos) -> bool {
        if self.packed.is_none() || state >> 63 != 0 {
            return false;
        }
        let (shard, home) = self.locate(id);
        let ctx = Ctx {
            limits: &self.limits,
            policy: self.policy,
            missed: false,
        };
        shard.with_key(
            &ctx,
            id,
            home,
            now,
            true,
            &mut |_| (state, true),
            &mut |_| unreachable!("packed store has no arena"),
            &mut || false,
            &mut |_| false,
        )
    }

    /// Words of one record as [`Store::export_records`] gives them: 1 for a packed store,
    /// [`Limits::words`] for an arena store.
    pub fn record_words(&self) -> usize {
        if self.packed.is_some() {
            1
        } else {
            self.limits.words()
        }
    }

    /// Snapshot support for any store: visits every live record as `(key id, words)`, where
    /// `words` are [`Store::record_words`] words: a packed store's state (as
    /// [`Store::export_packed`]), or an arena record's state words, read under the record's
    /// writer bit (so each record is whole). A scan, not linearizable. Ids are hashes under
    /// this store's seed and times are this store's clock's: import into a store of the same
    /// limits and seed whose clock continues this one's timeline.
    pub fn export_records(&self, mut f: impl FnMut(u64, &[u64])) {
        let ctx = Ctx {
            limits: &self.limits,
            policy: self.policy,
            missed: false,
        };
        let buf = std::cell::RefCell::new(Vec::with_capacity(self.record_words()));
        let mut ids = Vec::new();
        for s in self.shards.iter() {
            ids.clear();
            s.for_each_live(|id| ids.push(id));
            for &id in &ids {
                let (shard, home) = self.locate(id);
                // Reads the record: the transitions leave it unchanged (no CAS is made, and
                // the arena words are written back as they were read).
                let found = shard.with_key(
                    &ctx,
                    id,
                    home,
                    0,
                    false,
                    &mut |st| {
                        let mut b = buf.borrow_mut();
                        b.clear();
                        b.push(st);
                        (st, true)
                    },
                    &mut |c| {
                        let mut b = buf.borrow_mut();
                        b.clear();
                        b.extend((0..c.0.len()).map(|i| crate::algo::Cells::get(c, i)));
                        true
                    },
                    &mut || false,
                    &mut |_| false,
                );
                if found {
                    f(id, &buf.borrow());
                }
            }
        }
    }

    /// Snapshot support for any store: sets key id `id`'s record to `words` (from
    /// [`Store::export_records`] of a store with the same limits and seed, on a clock that
    /// this store's continues), inserting it if absent. `now` is this store's clock's time (a
    /// full probe range reclaims idle records as of it, then follows the store's
    /// [`FullPolicy`]). Returns whether the record is stored; `false` if `words` is not
    /// [`Store::record_words`] long, a packed state uses bit 63, or there is no room.
    pub fn import_record(&self, id: u64, words: &[u64], now: Nanos) -> bool {
        if words.len() != self.record_words() {
            return false;
        }
        if self.packed.is_some() {
            return self.import_packed(id, words[0], now);
        }
        let (shard, home) = self.locate(id);
        let ctx = Ctx {
            limits: &self.limits,
            policy: self.policy,
            missed: false,
        };
        shard.with_key(
            &ctx,
            id,
            home,
            now,
            true,
            &mut |_| unreachable!("arena store has no packed slots"),
            &mut |c| {
                for (i, &w) in words.iter().enumerate() {
                    crate::algo::Cells::set(c, i, w);
                }
                true
            },
            &mut || false,
            &mut |_| false,
        )
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ManualClock;
    use std::time::Duration;

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
        let (shard, home) = store.locate(key);
        let ctx = Ctx {
            limits: &store.limits,
            policy: store.policy,
            missed: false,
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            shard.with_key(
                &ctx,
                key,
                home,
                S,
                false,
                &mut |_: u64| -> (u64, Decision) { unreachable!("arena store") },
                &mut |_| -> Decision { panic!("a transition that panics") },
                &mut || unreachable!("the key is live"),
                &mut |_| unreachable!("the key is live"),
            )
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

    #[test]
    fn unchosen_shard_counts_grow_to_hold_the_capacity() {
        let max = max_keys_per_shard();
        assert_eq!(shards_for(1 << 30, 2, false), 16);
        assert_eq!(shards_for(1 << 30, 2, true), 2);
        assert_eq!(shards_for(2 * max, 2, false), 2);
        assert_eq!(shards_for(2 * max + 1, 2, false), 4);
        assert_eq!(shards_for(u64::MAX, 2, false), 2);
        assert_eq!(shards_for(100, 8, false), 8);
    }
}
