//! Building a store: the options of [`StoreBuilder`], and the sizing that turns a key capacity
//! or a memory budget into shards, buckets and arena records ([`Geometry`], a pure function of
//! the numbers, unit-tested apart from the table).

use super::key::KeyHasher;
use super::policy::FullPolicy;
use super::store::Store;
use super::table::{Shard, BUCKET, GROUP};
use crate::algo::{Limit, Limits};
use crate::clock::{Clock, DefaultClock};
use crate::decision::ConfigError;
use crossbeam_utils::CachePadded;

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

/// A store's layout, worked out from the builder's numbers alone: nothing is allocated, so the
/// sizing rules are tested apart from the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Shards (a power of two).
    pub(crate) shards: usize,
    /// Buckets in each shard.
    pub(crate) buckets: usize,
    /// Arena records per shard and state words per record; `None` for a packed store.
    pub(crate) arena: Option<(u32, usize)>,
    /// Keys the store is sized for.
    pub(crate) capacity: u64,
}

/// What a builder asks for, in numbers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizing {
    pub(crate) capacity: Option<u64>,
    pub(crate) budget: Option<usize>,
    /// Shards asked for; `None`: `cores`, raised as a large capacity needs.
    pub(crate) shards: Option<usize>,
    pub(crate) cores: usize,
    /// Words of an arena record; `None` for a packed store (one packed limit per key).
    pub(crate) arena_words: Option<usize>,
    /// Bytes of the store beside its shards (counted against a budget).
    pub(crate) overhead: usize,
}

impl Sizing {
    /// Bytes one key costs, for turning a budget into a first capacity: a slot, its tag byte
    /// and its share of a header word at [`LOAD_FACTOR`], and its arena record.
    fn per_key(&self) -> f64 {
        (16.0 + 1.0 + 8.0 / (BUCKET * GROUP) as f64) / LOAD_FACTOR
            + self.arena_words.map_or(0.0, |w| 8.0 * (1 + w) as f64 + 4.0)
    }

    /// The layout, or why none fits: the key capacity asked for, or the most keys whose
    /// tables fit the budget (shrunk by 1 % until they do).
    pub(crate) fn geometry(&self) -> Result<Geometry, ConfigError> {
        let shards = self.shards.unwrap_or(self.cores).max(1).next_power_of_two();
        if shards > MAX_SHARDS {
            return Err(ConfigError::new("shards", "at most 65536 shards"));
        }
        let capacity = match (self.capacity, self.budget) {
            (Some(c), None) => c,
            (None, Some(b)) => (b as f64 / self.per_key()) as u64,
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
            return Err(self.too_large(capacity, shards, per_shard_max));
        }
        let mut cap = capacity;
        loop {
            if cap == 0 {
                return Err(ConfigError::new(
                    "memory_budget",
                    format!(
                        "a budget of {} bytes holds no key; one key needs about {:.0} bytes",
                        self.budget.unwrap_or(0),
                        self.per_key()
                    ),
                ));
            }
            let per_shard = cap.div_ceil(shards as u64);
            if self.arena_words.is_some() && per_shard > (1 << 30) {
                return Err(ConfigError::new(
                    "capacity",
                    "at most 2^30 arena records per shard; add shards",
                ));
            }
            let g = Geometry {
                shards,
                // At most 2^PLACE_BITS (checked above): fits a usize, and the sizes below too.
                buckets: buckets_for(per_shard) as usize,
                arena: self.arena_words.map(|w| (per_shard as u32, w)),
                capacity: cap,
            };
            match self.budget {
                // The estimate first (it has room to spare), then the exact bytes.
                Some(b) if g.estimate() > b || g.bytes(self.overhead) > b => cap = cap * 99 / 100,
                _ => return Ok(g),
            }
        }
    }

    /// The error for a capacity more than `shards` shards hold.
    fn too_large(&self, capacity: u64, shards: usize, per_shard_max: u64) -> ConfigError {
        let (field, what) = match self.budget {
            Some(b) => (
                "memory_budget",
                format!("a budget of {b} bytes holds about {capacity} keys"),
            ),
            None => ("capacity", format!("a capacity of {capacity} keys")),
        };
        let need = capacity.div_ceil(per_shard_max).next_power_of_two();
        ConfigError::new(
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
        )
    }
}

impl Geometry {
    /// The bytes the store will allocate: its shards ([`Shard::bytes_for`]) and `overhead`.
    pub(crate) fn bytes(&self, overhead: usize) -> usize {
        self.shards
            .saturating_mul(Shard::bytes_for(self.buckets, self.arena))
            .saturating_add(overhead)
    }

    /// A budget's first test, with room to spare (512 bytes per shard). Saturating: an arena
    /// of many words per record can exceed `usize` here.
    fn estimate(&self) -> usize {
        let arena = self.arena.map_or(0, |(n, w)| {
            (n as usize).saturating_mul(w.saturating_add(1).saturating_mul(8) + 4)
        });
        self.shards.saturating_mul(
            (self.buckets * (BUCKET * 16 + 8) + self.buckets.div_ceil(GROUP) * 8)
                .saturating_add(arena)
                .saturating_add(512),
        )
    }
}

impl Store<DefaultClock> {
    /// A builder for a store applying `limits` (all-or-nothing) to every key.
    pub fn builder(limits: Limits) -> StoreBuilder {
        StoreBuilder::new(limits)
    }

    /// A store of one limit with room for `keys` keys.
    pub fn with_capacity(limit: Limit, keys: u64) -> Result<Self, ConfigError> {
        Self::builder(Limits::new(vec![limit])?)
            .capacity(keys)
            .build()
    }
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
    hints: bool,
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
    /// Whether a new key sets the tag byte that batched checks ([`Store::check_batch`],
    /// [`Store::check_batch_verdicts`]) read to find it (default: on). A store checked one key
    /// at a time can go without: a new key then writes one cache line less, in a table of its
    /// own (a page of memory less for each key of a sparse store, as a service's first keys
    /// are). Batched checks on such a store stay exact; they scan the key's buckets instead.
    ///
    /// [`Store::check_batch`]: super::Store::check_batch
    /// [`Store::check_batch_verdicts`]: super::Store::check_batch_verdicts
    pub fn batch_hints(mut self, on: bool) -> Self {
        self.hints = on;
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

    /// A builder for a store applying `limits` to every key ([`Store::builder`]).
    pub(crate) fn new(limits: Limits) -> Self {
        StoreBuilder {
            limits,
            capacity: None,
            budget: None,
            shards: None,
            policy: FullPolicy::default(),
            seed: None,
            ipv6_prefix: 64,
            hints: true,
            #[cfg(loom)]
            range: None,
        }
    }

    /// Builds on the default clock ([`DefaultClock`]: the calibrated TSC).
    pub fn build(self) -> Result<Store<DefaultClock>, ConfigError> {
        self.build_with_clock(DefaultClock::new())
    }

    /// Builds on `clock`.
    pub fn build_with_clock<C: Clock>(self, clock: C) -> Result<Store<C>, ConfigError> {
        let sizing = Sizing {
            capacity: self.capacity,
            budget: self.budget,
            shards: self.shards,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            arena_words: match self.limits.single_packed() {
                Some(_) => None,
                None => Some(self.limits.words()),
            },
            overhead: std::mem::size_of::<Store<C>>(),
        };
        let g = sizing.geometry()?;
        let shards = (0..g.shards)
            .map(|_| Shard::new(g.buckets, g.arena, self.hints).map(CachePadded::new))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ConfigError::new(
                    if self.budget.is_some() {
                        "memory_budget"
                    } else {
                        "capacity"
                    },
                    format!(
                        "could not allocate {} shards of {} buckets{}; ask for fewer keys",
                        g.shards,
                        g.buckets,
                        match g.arena {
                            Some((n, _)) => format!(" and {n} records"),
                            None => String::new(),
                        }
                    ),
                )
            })?;
        #[cfg(loom)]
        let mut shards = shards;
        #[cfg(loom)]
        if let Some(r) = self.range {
            for s in &mut shards {
                s.set_range(r);
            }
        }
        let hasher = match self.seed {
            Some(s) => KeyHasher::with_seed(s, self.ipv6_prefix),
            None => KeyHasher::random(self.ipv6_prefix),
        };
        let store = Store::from_parts(
            shards.into(),
            self.limits,
            hasher,
            self.policy,
            clock,
            g.capacity,
        );
        debug_assert_eq!(store.memory_bytes(), g.bytes(sizing.overhead));
        Ok(store)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sizing() -> Sizing {
        Sizing {
            capacity: None,
            budget: None,
            shards: Some(2),
            cores: 2,
            arena_words: None,
            overhead: 200,
        }
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

    /// A capacity gets buckets at the load factor in each of its shards, and shards grow to
    /// hold it when none were asked for.
    #[test]
    fn a_capacity_is_spread_over_shards_at_the_load_factor() {
        let g = Sizing {
            capacity: Some(1_000_000),
            ..sizing()
        }
        .geometry()
        .unwrap();
        assert_eq!((g.shards, g.capacity, g.arena), (2, 1_000_000, None));
        assert_eq!(g.buckets as u64, buckets_for(500_000));
        assert!(g.buckets as f64 * BUCKET as f64 * LOAD_FACTOR >= 500_000.0);
        let big = Sizing {
            capacity: Some(1 << 30),
            shards: None,
            ..sizing()
        }
        .geometry()
        .unwrap();
        assert_eq!(big.shards, 16);
        let arena = Sizing {
            capacity: Some(1000),
            arena_words: Some(3),
            ..sizing()
        }
        .geometry()
        .unwrap();
        assert_eq!(arena.arena, Some((500, 3)));
    }

    /// A budget gives the most keys whose bytes fit it (within the 1 % steps), and the bytes
    /// are the shards' own sum.
    #[test]
    fn a_budget_is_never_exceeded() {
        for (budget, words) in [(1 << 20, None), (10 << 20, None), (1 << 20, Some(4))] {
            let s = Sizing {
                budget: Some(budget),
                arena_words: words,
                ..sizing()
            };
            let g = s.geometry().unwrap();
            assert!(g.bytes(s.overhead) <= budget, "{g:?}");
            let more = Geometry {
                capacity: g.capacity * 102 / 100,
                ..g
            };
            let per_shard = more.capacity.div_ceil(2);
            let more = Geometry {
                buckets: buckets_for(per_shard) as usize,
                arena: words.map(|w| (per_shard as u32, w)),
                ..more
            };
            assert!(
                more.bytes(s.overhead) > budget || more.estimate() > budget,
                "{g:?}"
            );
            let shard = Shard::new(g.buckets, g.arena, true).unwrap();
            assert_eq!(shard.bytes(), Shard::bytes_for(g.buckets, g.arena));
        }
    }

    /// Sizes nothing can hold are refused with what to change.
    #[test]
    fn impossible_sizes_say_what_to_change() {
        let err = |s: Sizing| s.geometry().unwrap_err().to_string();
        let e = err(Sizing {
            budget: Some(10),
            ..sizing()
        });
        assert!(e.contains("holds no key"), "{e}");
        let e = err(Sizing {
            capacity: Some(1 << 50),
            ..sizing()
        });
        assert!(e.contains("is more than a store holds"), "{e}");
        let e = err(Sizing {
            capacity: Some(1 << 28),
            ..sizing()
        });
        assert!(e.contains("set `shards(4)`"), "{e}");
        let e = err(sizing());
        assert!(e.contains("a key capacity or a memory budget"), "{e}");
        let e = err(Sizing {
            shards: Some(1 << 17),
            capacity: Some(1),
            ..sizing()
        });
        assert!(e.contains("at most 65536 shards"), "{e}");
    }
}
