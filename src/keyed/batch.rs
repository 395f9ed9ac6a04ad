//! Batches: [`Store::check_batch`] and [`Store::check_batch_verdicts`] check many keys with one
//! clock read, hashing and prefetching each key's buckets ahead of its check so that the misses
//! to memory of consecutive keys overlap (docs/performance.md).

use super::key::Key;
use super::store::Store;
use super::table::{Loc, Shard};
use crate::algo::{with_packed, Packed, PackedFn};
use crate::clock::{Clock, Nanos};
use crate::decision::{Decision, Outcome, Verdict};
use crate::sync::AtomicU128;

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

/// One step `i` of [`Store::batch_loop_tagged`] (ring entry `r`, `i % AHEAD` if not given): it
/// checks key `i - 2 * AHEAD`, finds the slot of key `i - AHEAD` and places key `i`, in that
/// order (each reads its ring entry before the next stage overwrites it); the three literals
/// say which stages run. A macro rather than a function, so that each span's loop is compiled
/// with the stages it runs and nothing else (the store's batch: docs/performance.md).
macro_rules! tagged_step {
    (
        [$store:ident, $keys:ident, $out:ident, $placed:ident, $found:ident, $check:ident, $ahead:ident]
        $i:expr, $place:literal, $find:literal, $chk:literal
    ) => {{
        let i: usize = $i;
        tagged_step!(
            [$store, $keys, $out, $placed, $found, $check, $ahead]
            i, i % $ahead, $place, $find, $chk
        )
    }};
    (
        [$store:ident, $keys:ident, $out:ident, $placed:ident, $found:ident, $check:ident, $ahead:ident]
        $i:expr, $r:expr, $place:literal, $find:literal, $chk:literal
    ) => {{
        let i: usize = $i;
        let r: usize = $r;
        if $chk {
            let (id, slot) = $found[r];
            debug_assert!(i - 2 * $ahead < $out.len());
            // SAFETY: a step checks only in spans within [2 * AHEAD, n + 2 * AHEAD),
            // and `out` holds n answers (asserted by the loop).
            unsafe { *$out.get_unchecked_mut(i - 2 * $ahead) = $check.check(slot, id) };
        }
        if $find {
            let (id, shard, home) = $placed[r];
            let slot = shard.candidate(home);
            Shard::prefetch_slot(slot);
            $found[r] = (id, slot);
        }
        if $place {
            debug_assert!(i < $keys.len());
            // SAFETY: a step places only in spans within [0, n).
            let id = unsafe { $keys.get_unchecked(i) }.key_id(&$store.hasher);
            let (sh, home) = $store.place_of(id);
            let shard = $store.shard_at(sh);
            shard.prefetch_tags(home);
            $placed[r] = (id, shard, home);
        }
    }};
}

impl<C: Clock> Store<C> {
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
        macro_rules! step {
            ($($args:tt)*) => {
                tagged_step!([self, keys, out, placed, found, check, AHEAD] $($args)*)
            };
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
}
