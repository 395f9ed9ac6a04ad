// Over 600 lines: the slot table and its insertion, helping and reclaim protocol, which loom checks as one; split, each part would need the others to be read.
//! One shard's table: buckets of eight 16-byte slots, two choices of home bucket per key with
//! linear probing from both, a tag byte per slot (a hint for batched lookups), a header word
//! per eight buckets that serializes *insertions* (never lookups), and reclaim in place.
//!
//! # Placement
//!
//! A key's probe sequence visits buckets h1, h2, h1 + 1, h2 + 1, ... ([`RANGE`] from each, 64
//! slots). A new key goes into h1 while h1 is at least half free or no fuller than h2, else
//! into the emptier of h1 and h2 ("two choices"), or the first empty slot further on. Measured
//! at 0.87 load (1M keys, `tests/store_fill.rs`): 79 % of keys in h1, 20 % in h2, 0.5 %
//! further, 2 of 1M refused (the emptier bucket alone: 68 % in h1, every key placed; first-fit
//! linear probing alone: 0.6 % of keys found no slot within 64). A lookup reads h1 (two cache
//! lines, h2 prefetched meanwhile), then h2, then the rest.
//!
//! # Slot (16 bytes, one `AtomicU128`, updated by 16-byte CAS)
//!
//! ```text
//!  127 126 125                                64 63                         0
//! +---+---+------------------------------------+----------------------------+
//! | L | P |  63-bit algorithm state / payload   |  key id (64 bits)          |
//! +---+---+------------------------------------+----------------------------+
//! all zero           : empty
//! L = 1              : live; the rest is the packed state, or the arena index of the record
//! L = 0, P = 1       : pending insertion: | ticket (32) | arena index (30) |
//! ```
//!
//! # Tags (one byte per slot, a word per bucket)
//!
//! Each slot has a tag byte in its bucket's tag word: eight bits of the key's placement mix
//! (never 0), or 0. `check_batch` reads the tag words of a key's two home buckets (one small
//! array, 1/16 of the table), picks the first slot whose tag matches and fetches only that
//! slot's line: one line of the table per key instead of the four lines of both home
//! buckets, and no scan whose exit the branch predictor cannot know (docs/performance.md).
//!
//! A tag is a hint: the slot it points at is verified against the full key, and when that
//! fails (another key with the same tag, 2 % of keys at full load; a key past its home
//! buckets; a tag not yet set) the other matching slots are tried and then the whole probe
//! sequence is scanned. A missing tag is never taken to mean the key is absent, so tags never
//! decide an answer. They are kept exact all the same, so that nearly every lookup hits:
//!
//! * set between the claim and the commit (Relaxed: the commit CAS, Release, orders it
//!   before the publish, whether the owner or a helper publishes), so a thread that sees
//!   the slot live sees its tag (loom `tag_is_set_before_a_slot_goes_live`);
//! * cleared after the slot dies (reclaim, eviction, reset) or after an undone claim, only
//!   if it still holds the dead key's tag: a claim that set another tag meanwhile keeps it
//!   (loom `tag_is_cleared_after_a_slot_dies`). The one loss: a new key with the *same* tag
//!   that claims the slot between the death and the clearing loses its tag, and its lookups
//!   take the scan until it dies.
//!
//! Shards checked only one key at a time (`check`) scan as before: a single check waits for
//! its bucket's line anyway, and reading the tag word first would add a second access. A store
//! built without hints (`StoreBuilder::batch_hints(false)`) never sets a tag: every tag word
//! stays 0 and untouched, and batched lookups take the scan.
//!
//! # Bucket header (8 bytes per [`GROUP`] = 8 buckets)
//!
//! ```text
//! | ticket (32) | index of the claimed slot in the shard (31) | pending (1) |
//! ```
//!
//! A *ticket* names one claim: it is drawn from a counter of the shard (`Counters::tickets`),
//! so no two claims in a shard carry the same ticket (until the 32-bit counter wraps, 2^32
//! claims later). It must be unique across the shard, not only across one header's
//! insertions: a helper that read header Ha (pending, slot Y, ticket t) may stall while that
//! insertion is published, Y is emptied (reset, reclaim, eviction) and another insertion,
//! through another header, claims Y. With per-header versions that claim could carry the same
//! tag t; the helper would publish it although its commit had not happened (and might never:
//! its undo then fails, and the key is live twice). Loom model
//! `stale_helper_does_not_publish_another_headers_claim`.
//!
//! The claimed slot is named by its index in the shard, not by its offset in the probe
//! sequence: keys that share a home bucket h1 (and so its header) have different h2, so the
//! same offset is a different slot in their sequences, and a helper would finish the wrong
//! one. Hence at most 2^31 slots per shard; the builder allows 2^27 (2^24 buckets, the reach
//! of placement: `keyed::PLACE_BITS`).
//!
//! # Protocol
//!
//! *Lookup* scans the probe sequence for a live slot
//! with the key and CASes its 16 bytes from (key, old state) to (key, new state): the key is
//! part of the compare, so a slot reclaimed and reused by another key in between makes the CAS
//! fail and the lookup retry. Lookups never touch the header.
//!
//! A header is shared by [`GROUP`] consecutive buckets (loom builds: one per bucket): every
//! insertion whose h1 is one of them commits through it. Sharing only adds conflicts (a
//! commit fails when *any* insertion of the group committed since the header was read, and
//! retries); the argument below holds for any set of homes that share a header.
//!
//! *Insertion* of key K (not found live) goes through the header of K's home bucket:
//! 1. read the header `h` (if pending, help it finish and retry); scan the range again for K;
//! 2. draw a ticket t and claim an empty slot: CAS 0 → (K, pending(t)); set the slot's tag;
//! 3. commit: CAS the header `h` → (t, slot, pending). On failure another insertion into this
//!    home committed since step 1 (perhaps of K): undo the claim (and clear its tag), retry.
//!    Only the holder of
//!    ticket t ever writes a header naming t, so a claim whose commit failed is named by no
//!    header, no helper publishes it, and the undo cannot fail (if it ever did, the store
//!    panics rather than carry on with a key that may be live twice);
//! 4. publish: CAS the slot pending → (K, live state), then clear the header's pending bit.
//!    Anyone who finds the header pending does step 4 for the owner (with a fresh state, or
//!    the owner's prepared arena record), so a stalled inserter blocks nobody.
//!
//! Why K can never be live twice: every commit of a key whose home is H writes a new ticket
//! into H's header, and a commit succeeds only if the header is the one read *before* the
//! scan that found no K. A commit that happened after that read fails the CAS; one before it was
//! published before the header stopped being pending, so the scan saw K. Loom checks this.
//!
//! *Reclaim*: a probe that finds no empty slot CASes a live slot whose state is equivalent to
//! absent (window passed, bucket full again, log empty — for at least `RECLAIM_GRACE_NS`, and
//! still at the probe's `now`, since a wrapped window index can make an idle record count
//! again) back to zero. No sweeper thread. When none is idle, the store's [`FullPolicy`] decides.

use super::alloc::zeroed_u64;
use super::arena::Arena;
use super::FullPolicy;
use crate::algo::{Cells, Limits, Packed};
use crate::clock::Nanos;
use crate::decision::{Decision, Outcome};
use crate::record::{self, AtomicCells};
use crate::sync::{AtomicU128, AtomicU32, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

/// Slots per bucket.
#[cfg(not(loom))]
pub const BUCKET: usize = 8;
/// Buckets in each of a key's two ranges (two independent home buckets, "two choices").
#[cfg(not(loom))]
pub const RANGE: usize = 4;
// Under loom every slot access is a modelled mutex: a 64-slot probe makes models with two
// inserting threads too big to explore. Two ranges of one two-slot bucket keep every case of
// the protocol (two choices, a full range, helping, reclaim) at a size loom can check.
/// Slots per bucket (loom builds).
#[cfg(loom)]
pub const BUCKET: usize = 2;
/// Buckets in each of a key's two ranges (loom builds).
#[cfg(loom)]
pub const RANGE: usize = 1;

/// Buckets that share one header word (insertions into any of them commit through it).
#[cfg(not(loom))]
pub const GROUP: usize = 8;
// Loom's models name which keys share a header (helping across keys of one header, a stale
// helper between two headers): one header per bucket keeps them as they are. A shared header
// only adds conflicts between commits (module docs, "Bucket header").
/// Buckets that share one header word (loom builds).
#[cfg(loom)]
pub const GROUP: usize = 1;

/// Where a key may live: two ranges of [`RANGE`] buckets; insertions commit through the header
/// of `h1`'s group. `tag`: the key's tag byte (module docs, "Tags").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Loc {
    pub(crate) h1: usize,
    pub(crate) h2: usize,
    // A byte, kept in a word: a `Loc` then copies as three words, not two and a byte.
    pub(crate) tag: u64,
}
impl Loc {
    /// The home buckets and tag of placement hash `h` in a shard of `n` buckets.
    #[inline(always)]
    pub(crate) fn of(h: u64, n: u64) -> Loc {
        // Two independent 24-bit slices of the mix (the shard uses the top bits), reduced by
        // multiply-shift.
        let h1 = (((h & 0xff_ffff) * n) >> 24) as usize;
        let h2 = ((((h >> 24) & 0xff_ffff) * n) >> 24) as usize;
        // Eight more bits (48..55; the shard takes bits from 63 down, so they are independent
        // of it up to 256 shards), never 0 (an empty slot's tag): 255 values.
        let tag = ((h >> 48) as u8).max(1) as u64;
        Loc { h1, h2, tag }
    }
}

/// The shard of placement hash `h` among `2^bits`: its top `bits` bits. Two shifts rather
/// than a test for `bits == 0` (a shift by 64 is not defined): `(h >> 1) >> 63` is 0.
#[inline(always)]
pub(crate) fn shard_index(h: u64, bits: u32) -> usize {
    ((h >> 1) >> (63 - bits)) as usize
}

/// Records idle for less than this are not reclaimed: clock readings of concurrent threads
/// differ by a little, and a record idle at one thread's `now` may still hold state at
/// another's. 1 ms is far above that skew.
///
/// It is also the skew allowed to caller-supplied times (`check_at`, `check_batch_at`): a
/// reclaim at `now` records `now - RECLAIM_GRACE_NS` as its shard's horizon, and a key found
/// absent at a time before the horizon is denied until then (its record may have been
/// reclaimed, and the store can no longer tell what it held at that time). Keys with a live
/// record are answered exactly at any time.
pub const RECLAIM_GRACE_NS: u64 = 1_000_000;

const LIVE: u64 = 1 << 63;
const PENDING: u64 = 1 << 62;
const ARENA_BITS: u32 = 30;
const ARENA_MASK: u64 = (1 << ARENA_BITS) - 1;
const VER_MASK: u64 = 0xffff_ffff;
const HDR_OFF_SHIFT: u32 = 1;
const HDR_OFF_BITS: u32 = 31;
const HDR_VER_SHIFT: u32 = HDR_OFF_SHIFT + HDR_OFF_BITS;

/// Eight slots, 128 bytes, aligned to two cache lines.
#[repr(C, align(128))]
pub(crate) struct Bucket {
    slots: [AtomicU128; BUCKET],
}

/// Debug builds: `home`'s buckets are in a shard of `n` buckets (`Store::place_of` makes them so).
#[inline(always)]
fn assert_home(home: Loc, n: usize) {
    debug_assert!(home.h1 < n && home.h2 < n, "{home:?} in {n} buckets");
}

/// Each byte of `w` equal to `tag`: bit `8i + 7` of the result set for byte `i` (exact, no
/// carry between bytes: the low seven bits are added apart from the high one).
#[inline(always)]
fn tag_matches(w: u64, tag: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let x = w ^ tag.wrapping_mul(0x0101_0101_0101_0101);
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// Nanoseconds until a record is idle at every time of `at`: the largest of `idle_in(t)`
/// (the reclaim rule: idle at the grace point and still at `now`, module docs).
fn latest_idle(at: &[u64], mut idle_in: impl FnMut(u64) -> u64) -> u64 {
    at.iter().map(|&t| idle_in(t)).max().unwrap_or(0)
}

/// An undo of an uncommitted claim failed: another thread published it (module docs: no
/// header names an uncommitted ticket, so this is unreachable while the protocol holds). A
/// contract check kept in release builds: the key may be live twice, and carrying on would
/// admit it twice or free an arena record still in use.
#[cold]
#[inline(never)]
fn undo_failed(key: u64) -> ! {
    panic!(
        "keyed store: the uncommitted claim of key id {key:#x} was published by another \
         thread; the table's insertion invariant is broken"
    )
}

#[inline]
fn join(key: u64, state: u64) -> u128 {
    (state as u128) << 64 | key as u128
}
#[inline]
fn key_of(v: u128) -> u64 {
    v as u64
}
#[inline]
fn state_of(v: u128) -> u64 {
    (v >> 64) as u64
}

/// Whether slot value `v` is `key`'s live record: `key_of(v) == key && state_of(v) & LIVE != 0`.
///
/// With SSE4.1 it is tested in the vector register the 16-byte load (`vmovdqa`) leaves it in:
/// `(v ^ (LIVE:key)) & (LIVE:!0) == 0` is one `pxor` and one `ptest`, so a slot passed over
/// in a bucket scan costs five instructions instead of eight (the two halves moved to general
/// registers and tested apart; docs/performance.md). The portable expression is the fallback.
#[inline(always)]
fn holds_live(v: u128, key: u64) -> bool {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse4.1", not(loom)))]
    {
        use core::arch::x86_64::{__m128i, _mm_set_epi64x, _mm_testz_si128, _mm_xor_si128};
        // Lane 0 (the low 64 bits) is the key, lane 1 the state (little-endian `u128`).
        // SAFETY: `u128` and `__m128i` are both 16 bytes of plain data, every bit pattern
        // valid; the intrinsics need SSE2 and SSE4.1, which this build targets (the `cfg`).
        unsafe {
            let v = core::mem::transmute::<u128, __m128i>(v);
            let x = _mm_xor_si128(v, _mm_set_epi64x(LIVE as i64, key as i64));
            _mm_testz_si128(x, _mm_set_epi64x(LIVE as i64, -1)) != 0
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse4.1", not(loom))))]
    {
        key_of(v) == key && state_of(v) & LIVE != 0
    }
}

/// Counters of what the store did, per shard (Relaxed: statistics only), and the shard's
/// claim tickets (module docs), kept in the same cache line: an insertion writes both.
#[derive(Default)]
pub(crate) struct Counters {
    /// The last ticket drawn. Relaxed: a ticket only has to be unique, which the read-modify-
    /// write gives; what it names is published by the claim and commit CASes.
    pub(crate) tickets: AtomicU32,
    /// The latest time at which a reclaim in this shard judged a record idle (its `now`
    /// less the grace): a key found absent may have had a record that held state before it,
    /// so a check of an absent key at an earlier time is refused ([`Shard::with_key`]).
    pub(crate) horizon: AtomicU64,
    pub(crate) live: AtomicU64,
    pub(crate) inserted: AtomicU64,
    pub(crate) reclaimed: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) untracked: AtomicU64,
}

/// How a shard operation ended.
enum Step<T> {
    Done(T),
    Retry,
}

/// An operation on one key's record: with [`Shard::with_key`], the store's whole interface to
/// the table (in the way of papaya's `compute_with`). The table finds the key's live record,
/// or makes one if the operation inserts, and calls one of these methods, once or (`apply`
/// on a packed slot whose CAS lost a race) again on the newer state.
pub(crate) trait Op {
    /// What the operation answers.
    type Out;
    /// Whether a key without a record gets one, with `apply` run on its fresh record.
    fn inserts(&self) -> bool;
    /// Runs on the key's record: a packed slot's state as one word (which the table then
    /// CASes in), or an arena record's words under its writer bit; all zero on a record being
    /// inserted (a packed state left at 0 is then not inserted: nothing to remember). On a
    /// packed slot it may run again, on the newer state, so it acts only through `rec` and
    /// what it returns.
    fn apply<C: Cells + ?Sized>(&mut self, rec: &mut C) -> Self::Out;
    /// The key has no record, and the operation does not insert.
    fn absent(&mut self) -> Self::Out;
    /// The table did not run the operation (see [`Refusal`]).
    fn refused(&mut self, why: Refusal) -> Self::Out;
}

/// Why the table did not run an operation on a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A new key found no room, and the store's [`FullPolicy`] answered: `StoreFull`
    /// (`Reject`, or no arena record free) or `Untracked` (`AllowUntracked`).
    NoRoom(Outcome),
    /// The key is absent at a time before the shard's reclaim horizon (this time): its record
    /// may have been reclaimed, so the store cannot tell what it held ([`RECLAIM_GRACE_NS`]).
    BeforeHorizon(u64),
}

/// An insertion's choice of slot ([`Shard::choose`]).
enum Choice {
    /// Slot `off` of the probe sequence is empty and chosen.
    Slot(usize),
    /// The key is live already (inserted since the lookup).
    Present,
    /// No empty slot in the probe range.
    Full,
}

/// How an insertion's claim ended ([`Shard::commit`]).
enum Commit {
    /// Committed and published by this thread.
    Published,
    /// Committed, and published by a helper.
    Helped,
    /// Not committed (another insertion into the same header won, or the slot was taken): undone.
    Lost,
}

/// What [`Shard::make_room`] did.
enum Room {
    /// It made room (reclaimed or evicted a record), or the key appeared: insert again.
    Retry,
    /// The policy refused the key.
    Refused(Outcome),
}

impl Room {
    /// The insertion's next step: retry, or `op`'s answer to the refusal.
    fn answer<O: Op>(self, op: &mut O) -> Step<O::Out> {
        match self {
            Room::Retry => Step::Retry,
            Room::Refused(o) => Step::Done(op.refused(Refusal::NoRoom(o))),
        }
    }
}

/// One shard.
pub(crate) struct Shard {
    buckets: Box<[Bucket]>,
    /// One word per bucket: byte `i` is the tag of slot `i`, 0 for none (module docs).
    tags: Box<[AtomicU64]>,
    /// One word per [`GROUP`] buckets.
    headers: Box<[AtomicU64]>,
    /// Whether insertions set tags (`StoreBuilder::batch_hints`); without, every tag stays 0
    /// (no tag: batched lookups scan).
    hints: bool,
    arena: Option<Arena>,
    pub(crate) counters: CachePadded<Counters>,
    /// Loom builds: buckets per range, [`RANGE`] unless a model asks for more (`range`).
    #[cfg(loom)]
    range: usize,
}

fn zeroed_buckets(n: usize) -> Option<Box<[Bucket]>> {
    // SAFETY: a Bucket is 8 AtomicU128 (portable-atomic's is a plain u128 in an UnsafeCell),
    // for which all-zero bits are valid (0).
    #[cfg(not(loom))]
    return unsafe { super::alloc::alloc_zeroed(n) };
    #[cfg(loom)]
    Some(
        (0..n)
            .map(|_| Bucket {
                slots: std::array::from_fn(|_| AtomicU128::new(0)),
            })
            .collect(),
    )
}

/// What a table's records are: their size, and when one is equivalent to absent.
pub trait RecordKind: Sync {
    /// Words of a record (at least 1).
    fn words(&self) -> usize;
    /// Nanoseconds from `now` until `rec` is equivalent to absent (0: it may be reclaimed
    /// now). An all-zero record must be idle.
    fn idle_in(&self, rec: &mut dyn Cells, now: Nanos) -> u64;
    /// `rec` is about to be removed from the table (reclaimed, evicted or reset): the last
    /// look at it. Default: nothing.
    fn removed(&self, rec: &mut dyn Cells) {
        let _ = rec;
    }
}

/// What judges a table's records idle: a store's limits, or a [`RecordKind`] (a table of
/// records of the caller's own, `keyed::Records`).
#[derive(Clone, Copy)]
pub(crate) enum Judge<'a> {
    Limits(&'a Limits),
    Kind(&'a dyn RecordKind),
}

impl Judge<'_> {
    /// Nanoseconds until a packed state is idle at `now` (a packed store's limit).
    fn idle_packed(&self, st: u64, now: u64) -> u64 {
        match self {
            Judge::Limits(l) => l.single_packed().expect("packed store").idle_in(&[st], now),
            // A table of records always keeps them in its arena (`Records::new`).
            Judge::Kind(_) => unreachable!("a table of records is never packed"),
        }
    }

    /// Nanoseconds until an arena record is idle at `now`.
    fn idle_cells(&self, cells: &mut AtomicCells<'_>, now: u64) -> u64 {
        match self {
            Judge::Limits(l) => l.idle_in(cells, now),
            Judge::Kind(k) => k.idle_in(cells, now),
        }
    }

    /// A live arena record is about to be removed (reclaimed, evicted or reset).
    fn removed(&self, cells: &mut AtomicCells<'_>) {
        if let Judge::Kind(k) = self {
            k.removed(cells);
        }
    }
}

/// What a shard operation needs to know about the store.
pub(crate) struct Ctx<'a> {
    pub(crate) judge: Judge<'a>,
    pub(crate) policy: FullPolicy,
    /// A lookup of this key just missed (the packed fast path): [`Shard::with_key`] starts
    /// with the insertion, which scans the range again under the header protocol, instead of
    /// repeating the lookup (one 64-slot scan less per new key). A miss linearizes at that
    /// lookup, so a peek may answer "absent" at once.
    pub(crate) missed: bool,
}

impl Shard {
    /// A shard of `buckets` buckets (and an arena of `n` records of `w` words); `None` if the
    /// memory cannot be allocated. The builder keeps `buckets` within `2^PLACE_BITS`.
    pub(crate) fn new(
        buckets: usize,
        arena_records: Option<(u32, usize)>,
        hints: bool,
    ) -> Option<Self> {
        // The builder's bound (2^24 buckets, `keyed::PLACE_BITS`) is far inside this one.
        debug_assert!(buckets.max(1) * BUCKET <= 1 << HDR_OFF_BITS);
        Some(Self {
            buckets: zeroed_buckets(buckets.max(1))?,
            tags: zeroed_u64(buckets.max(1))?,
            headers: zeroed_u64(buckets.max(1).div_ceil(GROUP))?,
            hints,
            arena: match arena_records {
                Some((n, w)) => Some(Arena::new(n, w)?),
                None => None,
            },
            counters: CachePadded::new(Counters::default()),
            #[cfg(loom)]
            range: RANGE,
        })
    }

    /// Loom builds: sets the buckets per range (models of probing past the home buckets and
    /// of wrapping around the table; the default keeps the other models small).
    #[cfg(loom)]
    pub(crate) fn set_range(&mut self, range: usize) {
        self.range = range.max(1);
    }

    /// Buckets in each of a key's two ranges.
    #[inline(always)]
    fn range(&self) -> usize {
        #[cfg(not(loom))]
        return RANGE;
        #[cfg(loom)]
        self.range
    }

    pub(crate) fn n_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Bytes the shard allocated, itself included.
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.buckets)
            + self.tags.len() * 8
            + self.headers.len() * 8
            + self.arena.as_ref().map_or(0, |a| a.bytes())
            + std::mem::size_of::<Self>()
    }

    /// What [`Shard::bytes`] will be for a shard made by [`Shard::new`] with these arguments.
    pub(crate) fn bytes_for(buckets: usize, arena_records: Option<(u32, usize)>) -> usize {
        let n = buckets.max(1);
        n * std::mem::size_of::<Bucket>()
            + n * 8
            + n.div_ceil(GROUP) * 8
            + arena_records.map_or(0, |(r, w)| Arena::bytes_for(r, w))
            + std::mem::size_of::<Self>()
    }

    /// Writes every page of this shard so that it is resident in the caller's NUMA node (the
    /// first-touch policy): call it from the thread pinned to the core that owns the shard.
    pub(crate) fn prefault(&self) {
        for b in self.buckets.iter() {
            // Relaxed: an unconditional-failure CAS touches the line without changing it.
            let _ = b.slots[0].compare_exchange(
                u128::MAX,
                u128::MAX,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    #[inline]
    fn probe_len(&self) -> usize {
        2 * self.range() * BUCKET
    }

    /// Slot `off` of a key's probe sequence: buckets h1, h2, h1 + 1, h2 + 1, ... alternately.
    #[inline]
    fn slot(&self, home: Loc, off: usize) -> &AtomicU128 {
        &self.bucket(home, off / BUCKET).slots[off % BUCKET]
    }

    /// Bucket `k` of a key's probe sequence (slots `k * BUCKET ..`).
    #[inline]
    fn bucket(&self, home: Loc, k: usize) -> &Bucket {
        &self.buckets[self.bucket_index(home, k)]
    }

    /// Index in the shard of bucket `k` of a key's probe sequence.
    #[inline]
    fn bucket_index(&self, home: Loc, k: usize) -> usize {
        let start = if k % 2 == 0 { home.h1 } else { home.h2 };
        let mut b = start + k / 2;
        if b >= self.buckets.len() {
            b %= self.buckets.len();
        }
        b
    }

    /// The live slot holding `key`, with the value read.
    ///
    /// Home buckets h1 then h2 inline, without the wrap-around arithmetic (both are in range by
    /// construction), where 99.5 % of keys live at full load (module docs). The rest of the
    /// probe sequence is out of line.
    #[inline(always)]
    fn find(&self, home: Loc, key: u64) -> Option<(&AtomicU128, u128)> {
        Self::scan(&self.buckets[home.h1], key)
            .or_else(|| Self::scan(&self.buckets[home.h2], key))
            // The tag is not used there: passing 0 lets a check that never needs it not
            // compute it.
            .or_else(|| self.find_far(Loc { tag: 0, ..home }, key))
    }

    /// [`Shard::find`] over the probe sequence past the two home buckets.
    #[inline(never)]
    fn find_far(&self, home: Loc, key: u64) -> Option<(&AtomicU128, u128)> {
        (2..2 * self.range()).find_map(|k| Self::scan(self.bucket(home, k), key))
    }

    /// The live slot of bucket `b` holding `key`, with the value read.
    #[inline(always)]
    fn scan(b: &Bucket, key: u64) -> Option<(&AtomicU128, u128)> {
        for s in &b.slots {
            // Acquire: the state read here is the base of a CAS, or the arena index of a
            // record whose words were published before the slot went live.
            let v = s.load(Ordering::Acquire);
            if holds_live(v, key) {
                return Some((s, v));
            }
        }
        None
    }

    /// The packed fast path: applies the transition `p` to `key`'s live slot by CAS, with `p`
    /// inlined into the loop. `None` if `key` has no live slot (or it was reclaimed between the
    /// lookup and the CAS): the caller then takes [`Shard::with_key`], which inserts. Only for
    /// shards without an arena (a packed state in the slot).
    /// `PREFETCH_H2`: fetch h2 first (a single check; a batch has prefetched both homes).
    #[inline(always)]
    pub(crate) fn update_live<P: Packed, const PREFETCH_H2: bool>(
        &self,
        home: Loc,
        key: u64,
        p: &P,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        debug_assert!(self.arena.is_none());
        // A fifth of the keys live in h2 (module docs): fetch it while h1 is scanned, so that
        // their lookup waits for one miss, not two in a row (docs/performance.md).
        if PREFETCH_H2 {
            self.prefetch_bucket(home.h2);
        }
        let (s, v) = self.find(home, key)?;
        Self::update_slot(s, v, key, p, now, cost)
    }

    /// The CAS loop of the packed fast path on slot `s`, read as `v` (`key`'s, live).
    #[inline(always)]
    fn update_slot<P: Packed>(
        s: &AtomicU128,
        mut v: u128,
        key: u64,
        p: &P,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        loop {
            let (ns, r) = p.decide(state_of(v) & !LIVE, now, cost);
            let nv = join(key, ns | LIVE);
            if nv == v {
                // Nothing to write (a denial that does not count, a peek).
                return Some(r);
            }
            // AcqRel: the 16 bytes are the whole record; Acquire on failure re-reads the
            // latest state for the next round of the pure transition.
            match s.compare_exchange(v, nv, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(r),
                Err(x) if holds_live(x, key) => v = x,
                Err(_) => return None,
            }
        }
    }

    /// The header word of `home`'s group.
    #[inline(always)]
    fn header(&self, home: Loc) -> &AtomicU64 {
        &self.headers[home.h1 / GROUP]
    }

    /// Index in the shard of slot `s` (a slot of this shard).
    fn index_of(&self, s: &AtomicU128) -> usize {
        let off = s as *const AtomicU128 as usize - self.buckets.as_ptr() as usize;
        let (b, in_b) = (
            off / std::mem::size_of::<Bucket>(),
            off % std::mem::size_of::<Bucket>(),
        );
        let i = b * BUCKET + in_b / std::mem::size_of::<AtomicU128>();
        debug_assert!(std::ptr::eq(self.slot_at(i), s));
        i
    }

    /// Slot `i` of the shard.
    #[inline(always)]
    fn slot_at(&self, i: usize) -> &AtomicU128 {
        &self.buckets[i / BUCKET].slots[i % BUCKET]
    }

    /// Sets slot `i`'s tag byte to `tag`. Called between the claim and the commit: the commit
    /// CAS (Release, then the publish by the owner or by a helper that acquired the header)
    /// orders it before the slot goes live, so Relaxed here.
    fn set_tag(&self, i: usize, tag: u8) {
        if !self.hints {
            return;
        }
        let w = &self.tags[i / BUCKET];
        let sh = 8 * (i % BUCKET);
        // Relaxed: as above; the CAS validates the value read.
        let mut cur = w.load(Ordering::Relaxed);
        loop {
            let new = cur & !(0xff << sh) | (tag as u64) << sh;
            if new == cur {
                return;
            }
            // Relaxed: as above.
            match w.compare_exchange(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(x) => cur = x,
            }
        }
    }

    /// Slot `i`'s tag byte.
    fn tag_of(&self, i: usize) -> u8 {
        // Relaxed: a hint, read before the slot's death CAS (module docs, "Tags").
        (self.tags[i / BUCKET].load(Ordering::Relaxed) >> (8 * (i % BUCKET))) as u8
    }

    /// Clears slot `i`'s tag byte if it still holds `tag` (after the slot died; a claim that
    /// set another tag since is left alone). Relaxed: a hint (module docs, "Tags").
    fn clear_tag(&self, i: usize, tag: u8) {
        if tag == 0 {
            return;
        }
        let w = &self.tags[i / BUCKET];
        let sh = 8 * (i % BUCKET);
        // Relaxed: as above.
        let mut cur = w.load(Ordering::Relaxed);
        while (cur >> sh) as u8 == tag {
            // Relaxed: as above.
            match w.compare_exchange(
                cur,
                cur & !(0xff << sh),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(x) => cur = x,
            }
        }
    }

    /// Prefetches the tag words of both home buckets (a batch's first stage).
    #[inline(always)]
    pub(crate) fn prefetch_tags(&self, home: Loc) {
        assert_home(home, self.buckets.len());
        // A hint: `wrapping_add` computes the address without a bounds check (h1 and h2 are
        // in range: `candidate`), and a prefetch never faults.
        let t = self.tags.as_ptr();
        Self::prefetch(t.wrapping_add(home.h1) as *const i8);
        Self::prefetch(t.wrapping_add(home.h2) as *const i8);
    }

    /// The slot `key`'s tag points at: the first slot of h1, else of h2, whose tag byte is
    /// `home.tag`; slot 0 of h1 when none is (the lookup verifies it either way). Branch-free
    /// but for the choice of bucket.
    #[inline(always)]
    pub(crate) fn candidate(&self, home: Loc) -> &AtomicU128 {
        assert_home(home, self.buckets.len());
        // SAFETY: h1 and h2 are below the bucket count (`Store::place_of` reduces them by
        // multiply-shift; asserted in debug builds), and there is one tag word per bucket.
        let (t1, t2) = unsafe {
            (
                self.tags.get_unchecked(home.h1),
                self.tags.get_unchecked(home.h2),
            )
        };
        // Relaxed: a hint, verified against the slot (Acquire) before it is used.
        let m1 = tag_matches(t1.load(Ordering::Relaxed), home.tag);
        // Relaxed: as above.
        let m2 = tag_matches(t2.load(Ordering::Relaxed), home.tag);
        let (b, m) = if m1 != 0 {
            (home.h1, m1)
        } else {
            (home.h2, m2)
        };
        let b = if m != 0 { b } else { home.h1 };
        // SAFETY: `b` is h1 or h2 (above), and the slot index is reduced modulo BUCKET.
        unsafe {
            self.buckets
                .get_unchecked(b)
                .slots
                .get_unchecked((m.trailing_zeros() as usize / 8) % BUCKET)
        }
    }

    /// [`Shard::update_candidate`] on each slot of the home buckets whose tag is `home.tag`;
    /// `None` if none holds `key` live.
    pub(crate) fn update_tagged<P: Packed>(
        &self,
        home: Loc,
        key: u64,
        p: &P,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        for b in [home.h1, home.h2] {
            // Relaxed: a hint, as in `candidate`.
            let mut m = tag_matches(self.tags[b].load(Ordering::Relaxed), home.tag);
            while m != 0 {
                let s = &self.buckets[b].slots[m.trailing_zeros() as usize / 8];
                if let Some(d) = Self::update_candidate(s, key, p, now, cost) {
                    return Some(d);
                }
                m &= m - 1;
            }
        }
        None
    }

    /// Prefetches the line of slot `s` (a batch's second stage).
    #[inline(always)]
    pub(crate) fn prefetch_slot(s: &AtomicU128) {
        Self::prefetch(s as *const AtomicU128 as *const i8);
    }

    /// A slot of the shard, to fill a batch's ring before it holds keys.
    pub(crate) fn any_slot(&self) -> &AtomicU128 {
        &self.buckets[0].slots[0]
    }

    /// [`Shard::update_live`] on slot `cand` ([`Shard::candidate`]), if it holds `key` live (or
    /// comes to hold another key while the CAS loop runs); `None` otherwise: no tag, a tag of
    /// another key, a tag not yet set or lost. The caller then looks the key up in full (a tag
    /// is never trusted to say a key is absent).
    #[inline(always)]
    pub(crate) fn update_candidate<P: Packed>(
        s: &AtomicU128,
        key: u64,
        p: &P,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        // Acquire: as in `scan`.
        let v = s.load(Ordering::Acquire);
        if !holds_live(v, key) {
            return None;
        }
        Self::update_slot(s, v, key, p, now, cost)
    }

    /// Prefetches the line at `p` (a hint: never faults).
    #[inline(always)]
    fn prefetch(p: *const i8) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        // SAFETY: prefetch is a hint that never faults.
        unsafe {
            core::arch::x86_64::_mm_prefetch(p, core::arch::x86_64::_MM_HINT_T0);
        }
        #[cfg(not(all(target_arch = "x86_64", not(loom))))]
        let _ = p;
    }

    /// Prefetches both home buckets (both lines of each): a fifth of the keys live in h2, and a
    /// batch that fetched only h1 ahead waited for a miss on each of them (docs/performance.md).
    #[inline(always)]
    pub(crate) fn prefetch_home(&self, home: Loc) {
        self.prefetch_bucket(home.h1);
        self.prefetch_bucket(home.h2);
    }

    /// Prefetches both lines of bucket `b`.
    #[inline(always)]
    fn prefetch_bucket(&self, b: usize) {
        let p = &self.buckets[b] as *const Bucket as *const i8;
        Self::prefetch(p);
        // A 128-byte bucket: its second line (`wrapping_add`: a hint, never dereferenced).
        Self::prefetch(p.wrapping_add(64));
    }

    /// Runs `op` on `key`'s live record, inserting a fresh one first if the key has none and
    /// the operation inserts ([`Op`]).
    #[inline]
    pub(crate) fn with_key<O: Op>(
        &self,
        ctx: &Ctx<'_>,
        key: u64,
        home: Loc,
        now: u64,
        op: &mut O,
    ) -> O::Out {
        let mut missed = ctx.missed;
        loop {
            if !std::mem::take(&mut missed) {
                if let Some((s, v)) = self.find(home, key) {
                    match self.apply(s, v, key, op) {
                        Step::Done(r) => return r,
                        Step::Retry => continue,
                    }
                }
            }
            // Relaxed: the scan that found no live slot read it emptied with Acquire, and a
            // reclaimer raises the horizon before emptying a slot (`make_room`), so a record
            // reclaimed before that scan shows here.
            let horizon = self.counters.horizon.load(Ordering::Relaxed);
            if now < horizon {
                return op.refused(Refusal::BeforeHorizon(horizon));
            }
            if !op.inserts() {
                return op.absent();
            }
            match self.insert(ctx, key, home, now, op) {
                Step::Done(r) => return r,
                Step::Retry => continue,
            }
        }
    }

    /// [`Op::apply`] on slot `s`, read as `v` (`key`'s, live): by CAS for a packed state, under
    /// the record's writer bit for an arena record.
    #[inline]
    fn apply<O: Op>(&self, s: &AtomicU128, mut v: u128, key: u64, op: &mut O) -> Step<O::Out> {
        match &self.arena {
            None => loop {
                let st = state_of(v);
                if key_of(v) != key || st & LIVE == 0 {
                    return Step::Retry;
                }
                let mut rec = [st & !LIVE];
                let r = op.apply(&mut rec);
                let nv = join(key, rec[0] | LIVE);
                if nv == v {
                    return Step::Done(r);
                }
                // AcqRel: the 16 bytes are the whole record; Acquire on failure re-reads the
                // latest state for the next round of the pure transition.
                match s.compare_exchange(v, nv, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Step::Done(r),
                    Err(x) => v = x,
                }
            },
            Some(arena) => {
                let idx = (state_of(v) & ARENA_MASK) as u32;
                let (seq, cells) = arena.record(idx);
                // Released when dropped, unwinding included (`record`).
                let _writer = record::lock(seq);
                // Acquire: re-check under the writer bit that the slot still maps key → idx
                // (a reclaimer empties it only while holding this same bit).
                if s.load(Ordering::Acquire) == v {
                    Step::Done(op.apply(&mut AtomicCells(cells)))
                } else {
                    Step::Retry
                }
            }
        }
    }

    /// Inserts `key` (found absent) with `op` applied to its fresh record, in the phases of
    /// the module docs: choose a slot ([`Shard::choose`]), prepare the record, claim, commit
    /// and publish ([`Shard::commit`]).
    fn insert<O: Op>(
        &self,
        ctx: &Ctx<'_>,
        key: u64,
        home: Loc,
        now: u64,
        op: &mut O,
    ) -> Step<O::Out> {
        // Acquire: pairs with the header CASes of earlier insertions, so the scan below sees
        // every slot they published.
        let h = self.header(home).load(Ordering::Acquire);
        if h & 1 != 0 {
            self.help(home, h);
            return Step::Retry;
        }
        let off = match self.choose(home, key) {
            Choice::Slot(off) => off,
            Choice::Present => return Step::Retry,
            Choice::Full => return self.make_room(ctx, key, home, now).answer(op),
        };
        // Prepare the record with the operation applied.
        let (payload, live_state, r) = match &self.arena {
            None => {
                let mut rec = [0];
                let r = op.apply(&mut rec);
                if rec[0] == 0 {
                    // Nothing to remember (denied without counting, or a peek).
                    return Step::Done(r);
                }
                (0, LIVE | rec[0], r)
            }
            Some(arena) => {
                let Some(idx) = arena.alloc() else {
                    return self.make_room(ctx, key, home, now).answer(op);
                };
                let (seq, cells) = arena.record(idx);
                let r = record::write(seq, cells, |c| {
                    for i in 0..cells.len() {
                        c.set(i, 0);
                    }
                    op.apply(c)
                });
                (idx as u64, LIVE | idx as u64, r)
            }
        };
        match self.commit(key, home, h, off, payload, live_state) {
            Commit::Published => Step::Done(r),
            // An arena record published by a helper is the one we prepared: `r` stands.
            Commit::Helped if self.arena.is_some() => Step::Done(r),
            // A helper published a fresh state: apply the request through the lookup path.
            Commit::Helped | Commit::Lost => Step::Retry,
        }
    }

    /// An insertion's choice of slot in `key`'s probe range (module docs, "Placement"); the
    /// caller read the header, not pending, before this scan.
    fn choose(&self, home: Loc, key: u64) -> Choice {
        // Free slots in each home bucket and the first empty slot of the range (the choice
        // between them is made below).
        let (mut first_empty, mut free) = (None, [0usize; 2]);
        let mut choice = [None; 2];
        // Bucket by bucket (the bucket index once per eight slots, as in `find_far`).
        for k in 0..2 * self.range() {
            for (i, s) in self.bucket(home, k).slots.iter().enumerate() {
                // Acquire: as in `find`.
                let v = s.load(Ordering::Acquire);
                if holds_live(v, key) {
                    return Choice::Present;
                }
                if v == 0 {
                    let off = k * BUCKET + i;
                    if k < 2 {
                        free[k] += 1;
                        choice[k].get_or_insert(off);
                    }
                    first_empty.get_or_insert(off);
                }
            }
        }
        // h1 while at least H1_FREE of its slots are free or it is no fuller than h2, else the
        // emptier of the two ("two choices"): a lookup scans h1 first, so the more keys live
        // there the fewer lines a check reads, and the fallback to the emptier bucket keeps
        // the two-choice balance that places every key at full load. Measured at 0.87 load
        // (tests/store_fill.rs): 79 % of keys in h1 (68 % with the emptier bucket alone),
        // 0.5 % past the home buckets, 2 of 1M keys refused (h1 whenever it has room: 89 %
        // in h1, but 581 refused).
        #[cfg(not(loom))]
        const H1_FREE: usize = BUCKET / 2;
        // Loom's buckets have two slots: "half free" would put nearly every key in h1 and leave
        // the two-choice fallback (and the helping across ranges it leads to) unexplored.
        #[cfg(loom)]
        const H1_FREE: usize = BUCKET;
        let empty = if free[0] >= H1_FREE || (free[0] > 0 && free[0] >= free[1]) {
            choice[0]
        } else if free[1] > 0 {
            choice[1]
        } else {
            first_empty
        };
        empty.map_or(Choice::Full, Choice::Slot)
    }

    /// Claims slot `off` of `key`'s probe range for a record prepared as `payload` (its arena
    /// index, or 0) and `live_state`, commits the claim through the header read as `h`, and
    /// publishes it (module docs, "Protocol", steps 2-4). A claim or commit that loses a race
    /// is undone, and its arena record freed.
    fn commit(
        &self,
        key: u64,
        home: Loc,
        h: u64,
        off: usize,
        payload: u64,
        live_state: u64,
    ) -> Commit {
        let hdr = self.header(home);
        // A ticket unique across the shard (module docs). Relaxed: see `Counters::tickets`.
        let ver = u64::from(
            self.counters
                .tickets
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1),
        );
        let pending = join(key, PENDING | ver << ARENA_BITS | payload);
        let s = self.slot(home, off);
        // AcqRel: claims the slot; Acquire on failure because we go back to scanning.
        if s.compare_exchange(0, pending, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            self.release_arena(payload);
            return Commit::Lost;
        }
        // The header names the slot by its index in the shard (module docs: a helper's probe
        // sequence may differ from ours past the first bucket).
        let index = self.bucket_index(home, off / BUCKET) * BUCKET + off % BUCKET;
        // The tag before the commit: from the commit on, a helper may publish the slot.
        self.set_tag(index, home.tag as u8);
        let committed = ver << HDR_VER_SHIFT | (index as u64) << HDR_OFF_SHIFT | 1;
        // AcqRel: the commit point of the insertion (module docs); Release publishes the claim.
        if hdr
            .compare_exchange(h, committed, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Not committed, so no header names our ticket and no helper touches our pending
            // slot: the undo cannot fail. AcqRel: as for the claim.
            if s.compare_exchange(pending, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Someone published a claim that was never committed: the key may now be
                // live twice, and an arena record freed here would still be referenced.
                // Stop rather than answer from a table that broke its invariant.
                undo_failed(key);
            }
            self.clear_tag(index, home.tag as u8);
            self.release_arena(payload);
            return Commit::Lost;
        }
        // AcqRel: publishes the record (Release) for lookups' Acquire loads.
        let published = s
            .compare_exchange(
                pending,
                join(key, live_state),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        let c = &self.counters;
        if published {
            // Relaxed: statistics.
            c.live.fetch_add(1, Ordering::Relaxed);
        }
        // Relaxed: statistics.
        c.inserted.fetch_add(1, Ordering::Relaxed);
        // AcqRel: ends the pending phase; later inserters acquire the published slot.
        let _ = hdr.compare_exchange(
            committed,
            committed & !1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if published {
            Commit::Published
        } else {
            Commit::Helped
        }
    }

    fn release_arena(&self, payload: u64) {
        if let Some(a) = &self.arena {
            a.free(payload as u32);
        }
    }

    /// Finishes the pending insertion named by header `h` of `home`'s group.
    fn help(&self, home: Loc, h: u64) {
        let index = ((h >> HDR_OFF_SHIFT) & ((1 << HDR_OFF_BITS) - 1)) as usize;
        let ver = (h >> HDR_VER_SHIFT) & VER_MASK;
        let s = &self.buckets[index / BUCKET].slots[index % BUCKET];
        // Acquire: reads the owner's claim, published by its claim CAS.
        let v = s.load(Ordering::Acquire);
        let st = state_of(v);
        if st & (LIVE | PENDING) == PENDING && (st >> ARENA_BITS) & VER_MASK == ver {
            let live = LIVE | (st & ARENA_MASK);
            // AcqRel: publishes the slot as the owner would.
            if s.compare_exchange(
                v,
                join(key_of(v), live),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
            {
                // Relaxed: statistics.
                self.counters.live.fetch_add(1, Ordering::Relaxed);
            }
        }
        // AcqRel: as the owner's clearing.
        let _ = self
            .header(home)
            .compare_exchange(h, h & !1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Nanoseconds until the live slot value `v` is idle at each of `at` (the largest),
    /// taking its record's writer bit for an arena record; `None` if the slot changed meanwhile.
    fn idle_in(
        &self,
        ctx: &Ctx<'_>,
        s: &AtomicU128,
        v: u128,
        at: &[u64],
        remove: impl Fn(u64) -> bool,
    ) -> Option<u64> {
        let st = state_of(v) & !LIVE;
        match &self.arena {
            None => {
                let idle = latest_idle(at, |t| ctx.judge.idle_packed(st, t));
                if remove(idle) {
                    let i = self.index_of(s);
                    let tag = self.tag_of(i);
                    // AcqRel: empties the slot only if unchanged since it was judged.
                    s.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Acquire)
                        .ok()?;
                    self.clear_tag(i, tag);
                    self.removed(None);
                }
                Some(idle)
            }
            Some(arena) => {
                let idx = st as u32;
                let (seq, cells) = arena.record(idx);
                // Released when dropped, unwinding included (`record`).
                let writer = record::lock(seq);
                // Acquire: as in `apply`.
                if s.load(Ordering::Acquire) != v {
                    return None;
                }
                let idle = latest_idle(at, |t| ctx.judge.idle_cells(&mut AtomicCells(cells), t));
                if remove(idle) {
                    ctx.judge.removed(&mut AtomicCells(cells));
                    let i = self.index_of(s);
                    let tag = self.tag_of(i);
                    // AcqRel: under the writer bit, nobody else empties this slot.
                    let r = s.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Acquire);
                    debug_assert!(r.is_ok());
                    self.clear_tag(i, tag);
                    // Ends the section (publishing the record's state) before it is reused.
                    drop(writer);
                    self.removed(Some(idx));
                }
                Some(idle)
            }
        }
    }

    fn removed(&self, idx: Option<u32>) {
        // Relaxed: statistics.
        self.counters.live.fetch_sub(1, Ordering::Relaxed);
        if let (Some(a), Some(i)) = (&self.arena, idx) {
            a.free(i);
        }
    }

    /// No empty slot (or arena record) for a new key: reclaim an idle one, else apply the
    /// policy — unless the key itself is being inserted by another thread.
    ///
    /// The key itself, live or claimed by another thread since our scan, is not absent, so no
    /// policy may answer for it (`AllowUntracked` would admit it a second time, `Reject` refuse
    /// a key the store holds). Live: the lookup finds it. Claimed and not yet committed
    /// (insertion steps 2-3): wait for that commit or its undo — the only wait in the protocol,
    /// on one key, for two CASes of the other thread. Loom model
    /// `insertions_past_the_home_buckets_wrap_around_the_table`.
    ///
    /// A record is reclaimed if idle at `judged` (the grace for other threads' clocks) and at
    /// `now` as well: a packed window index wraps (sliding_window, window_ring: module docs),
    /// so a record idle at one time can count again at a later one, and the check that follows
    /// at `now` must see the record it would have seen had it stayed.
    ///
    /// One function on purpose: splitting the policy out, even `#[inline(always)]`, cost ~10
    /// instructions per call (a full store's insertions under callgrind).
    fn make_room(&self, ctx: &Ctx<'_>, key: u64, home: Loc, now: u64) -> Room {
        let judged = now.saturating_sub(RECLAIM_GRACE_NS);
        let mut stalest: Option<(u64, usize, u128)> = None;
        for off in 0..self.probe_len() {
            let s = self.slot(home, off);
            // Acquire: as in `find`.
            let v = s.load(Ordering::Acquire);
            if key_of(v) == key && state_of(v) & (LIVE | PENDING) != 0 {
                // The key itself (function docs): wait for the other thread.
                crate::sync::spin_hint();
                return Room::Retry;
            }
            if state_of(v) & LIVE == 0 {
                // An empty slot is room for a packed store. An arena store also gets here
                // with empty slots but no free record: retrying would spin forever.
                if v == 0 && self.arena.is_none() {
                    return Room::Retry;
                }
                continue;
            }
            // Idle at `judged` and at `now` (function docs).
            let reclaim = |idle| {
                if idle == 0 {
                    // Relaxed: ordered before the slot's emptying by that CAS (Release): a
                    // checker that sees the slot empty sees this horizon (`with_key`).
                    self.counters.horizon.fetch_max(judged, Ordering::Relaxed);
                }
                idle == 0
            };
            match self.idle_in(ctx, s, v, &[judged, now], reclaim) {
                Some(0) => {
                    // Relaxed: statistics.
                    self.counters.reclaimed.fetch_add(1, Ordering::Relaxed);
                    return Room::Retry;
                }
                Some(idle) if stalest.is_none_or(|(i, _, _)| idle < i) => {
                    stalest = Some((idle, off, v))
                }
                _ => {}
            }
        }
        // An arena-backed store can have empty slots but no free record: records idle in
        // other probe ranges are only reclaimed from their own. The policy decides here too.
        let c = &self.counters;
        match ctx.policy {
            FullPolicy::Reject => {
                // Relaxed: statistics.
                c.rejected.fetch_add(1, Ordering::Relaxed);
                Room::Refused(Outcome::StoreFull)
            }
            FullPolicy::AllowUntracked => {
                // Relaxed: statistics.
                c.untracked.fetch_add(1, Ordering::Relaxed);
                Room::Refused(Outcome::Untracked)
            }
            FullPolicy::EvictStalest => {
                if let Some((_, off, v)) = stalest {
                    if self
                        .idle_in(ctx, self.slot(home, off), v, &[judged], |_| true)
                        .is_some()
                    {
                        // Relaxed: statistics.
                        c.evicted.fetch_add(1, Ordering::Relaxed);
                    }
                    Room::Retry
                } else if self.arena.is_some() {
                    // The range holds no live record at all, yet the arena is exhausted: evict
                    // nothing we cannot see; refuse this one.
                    // Relaxed: statistics.
                    c.rejected.fetch_add(1, Ordering::Relaxed);
                    Room::Refused(Outcome::StoreFull)
                } else {
                    Room::Retry
                }
            }
        }
    }

    /// Removes `key`'s record (reset to fresh). Returns whether it was present.
    pub(crate) fn remove(&self, ctx: &Ctx<'_>, key: u64, home: Loc) -> bool {
        while let Some((s, v)) = self.find(home, key) {
            if self.idle_in(ctx, s, v, &[0], |_| true).is_some() {
                return true;
            }
        }
        false
    }

    /// Loom models: whether `key`'s live slot, if it finds one, carries `key`'s tag (read after
    /// the slot was seen live: the tag is set before the slot goes live, module docs).
    #[cfg(loom)]
    pub(crate) fn tag_agrees(&self, home: Loc, key: u64) -> Option<bool> {
        let (s, _) = self.find(home, key)?;
        Some(self.tag_of(self.index_of(s)) == home.tag as u8)
    }

    /// Loom models, at rest: every live slot carries its key's tag (`tag_of_key`) and every
    /// other slot none.
    #[cfg(loom)]
    pub(crate) fn tags_exact(&self, tag_of_key: impl Fn(u64) -> u8) -> bool {
        (0..self.buckets.len() * BUCKET).all(|i| {
            // Acquire: as in `find`.
            let v = self.slot_at(i).load(Ordering::Acquire);
            let want = if state_of(v) & LIVE != 0 {
                tag_of_key(key_of(v))
            } else {
                0
            };
            self.tag_of(i) == want
        })
    }

    /// Tests: the slots whose tag byte is set.
    #[cfg(test)]
    pub(crate) fn tagged_slots(&self) -> usize {
        (0..self.buckets.len() * BUCKET)
            .filter(|&i| self.tag_of(i) != 0)
            .count()
    }

    /// Visits every live key id with the index of the bucket it is in (for tests and
    /// reports). Not linearizable.
    pub(crate) fn for_each_live_bucket(&self, mut f: impl FnMut(u64, usize)) {
        for (i, b) in self.buckets.iter().enumerate() {
            for s in &b.slots {
                // Acquire: as in `find`.
                let v = s.load(Ordering::Acquire);
                if state_of(v) & LIVE != 0 {
                    f(key_of(v), i);
                }
            }
        }
    }

    /// Visits every live key id (for tests and reports). Not linearizable.
    pub(crate) fn for_each_live(&self, mut f: impl FnMut(u64)) {
        self.for_each_live_bucket(|id, _| f(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(v: u128, key: u64) -> bool {
        key_of(v) == key && state_of(v) & LIVE != 0
    }

    proptest! {
        /// The vector test of a slot (SSE4.1 builds) agrees with the plain one, on slots
        /// near the key (one bit of the key or state flipped) as well as on arbitrary ones.
        #[test]
        fn holds_live_is_the_plain_test(key: u64, state: u64, flip in 0u32..129, live: bool) {
            let state = if live { state | LIVE } else { state & !LIVE };
            let v = join(key, state);
            let v = if flip < 128 { v ^ (1u128 << flip) } else { v };
            prop_assert_eq!(holds_live(v, key), reference(v, key));
        }
    }

    proptest! {
        /// The bytewise tag match agrees with comparing byte by byte (no carry from one byte
        /// into the next), on words holding the tag in some bytes and near misses in others.
        #[test]
        fn tag_matches_is_bytewise(w: u64, tag in 1u8.., put: u8, flip in 0u32..8) {
            let mut w = w;
            for i in 0..8 {
                if put >> i & 1 != 0 {
                    let b = if i == 0 { tag ^ (1 << flip) } else { tag };
                    w = w & !(0xff << (8 * i)) | (b as u64) << (8 * i);
                }
            }
            let m = tag_matches(w, tag as u64);
            for i in 0..8 {
                prop_assert_eq!(m >> (8 * i + 7) & 1 != 0, (w >> (8 * i)) as u8 == tag);
            }
            prop_assert_eq!(m & !0x8080_8080_8080_8080, 0);
        }
    }

    #[test]
    fn holds_live_edges() {
        for key in [0, 1, u64::MAX, LIVE] {
            for state in [0, LIVE, LIVE | 1, !LIVE, u64::MAX, PENDING, LIVE | PENDING] {
                let v = join(key, state);
                assert_eq!(holds_live(v, key), state & LIVE != 0);
                assert!(!holds_live(v, key ^ 1));
                assert!(!holds_live(v, key ^ LIVE));
            }
        }
    }
}
