//! One key's lease on this node: its words in the lease table (`turnstile::keyed::Records`),
//! and the operations on them, each run under the record's writer bit.
//!
//! All times are the node's local nanoseconds (`Tier::now`); a lease's ends are local times
//! computed from Redis's answer and the time the call was sent (before Redis read its clock),
//! less a guard: a lease never outlives what Redis granted.

use super::counters::Counters;
use super::LeaseMode;
use turnstile::algo::Cells;
use turnstile::keyed::{RecordKind, RecordOp};
use turnstile::{Decision, Outcome};

/// Admissions held (reserve: granted and unspent; delayed: the local allowance).
pub(super) const HELD: usize = 0;
/// Held admissions may be spent before this time (window leases; buckets lapse by `ENDS`).
pub(super) const UNTIL: usize = 1;
/// `FETCHING` | `EXHAUSTED`.
pub(super) const FLAGS: usize = 2;
/// When the fetch in flight started (a flag older than `Shape::stale` is a dropped call's).
pub(super) const FETCH_AT: usize = 3;
/// Requests of at least `DENY_COST` are denied locally before this time.
pub(super) const DENY_UNTIL: usize = 4;
pub(super) const DENY_COST: usize = 5;
/// Rate: `period index << 32 | cost units in it`, and the previous period's units.
pub(super) const RATE: usize = 6;
pub(super) const RATE_PREV: usize = 7;
/// The last check.
pub(super) const LAST: usize = 8;
/// Redis's time of the grant (ns), which a give-back names.
pub(super) const EPOCH: usize = 9;
/// Admissions the current lease was granted beyond its request.
pub(super) const GRANTED: usize = 10;
/// What Redis had left after the last call, the limit it reported, and when (local time)
/// its record is equivalent to absent.
pub(super) const LEFT: usize = 11;
pub(super) const LIMIT: usize = 12;
pub(super) const RESET_AT: usize = 13;
/// Checks go to Redis one by one before this time (a window's final share).
pub(super) const FINAL_UNTIL: usize = 14;
/// Delayed mode: admitted locally, not yet recorded in Redis.
pub(super) const PENDING: usize = 15;
/// After an exhausting grant is spent, requests are denied here until this time (just after
/// the lease's end, when other nodes may have given admissions back).
pub(super) const DRY_UNTIL: usize = 16;
/// When the current rate period's count began, if nothing carried over from the previous
/// one (a key new or back from idle): its rate is its count over the time since.
pub(super) const RATE_FROM: usize = 17;
/// Per limit, from `ENDS`: a bucket's TAT after the grant (local time; 0 for a window); then
/// per limit, the same as Redis answered it (ns after `EPOCH`), which a give-back names.
pub(super) const ENDS: usize = 18;

pub(super) const FETCHING: u64 = 1 << 63;
/// The grant emptied Redis: once it is spent, deny until the lease's end.
pub(super) const EXHAUSTED: u64 = 1 << 62;
/// The key is in the sweep's list (`listed.rs`).
pub(super) const LISTED: u64 = 1 << 61;

/// Longest key kept in a record (a longer key is checked in Redis one by one).
pub(crate) const KEY_MAX: usize = 56;
pub(super) const KEY_WORDS: usize = KEY_MAX / 8;

/// What every record of a store shares: the limits' shape and the leasing rules.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub(crate) mode: LeaseMode,
    /// Per limit: a bucket's interval T (ns per unit), 0 for a window.
    pub(crate) bucket_t: Vec<u64>,
    /// Rate periods (ns).
    pub(crate) period: u64,
    /// How long a lease is expected to last (a window: an eighth of it, what a lease call
    /// sizes; a bucket: its span): a key is leased when its rate fills `min_checks` in that
    /// time.
    pub(crate) horizon: u64,
    pub(crate) min_checks: u64,
    /// A fetch flag this old belongs to a call that was dropped.
    pub(crate) stale: u64,
    /// The longest a lease is sized for (ns).
    pub(crate) longest: u64,
    /// A node denied while other nodes may hold leases asks again after at most this (ns).
    pub(crate) recheck: u64,
    /// Per limit: a fixed window's final share (ns), from its lease's end to its own; `None`
    /// for the others.
    pub(crate) finals: Vec<Option<u64>>,
}

impl Shape {
    fn key_at(&self) -> usize {
        ENDS + 2 * self.bucket_t.len()
    }

    /// Word of limit `i`'s TAT as Redis answered it.
    pub(super) fn raw_end(&self, i: usize) -> usize {
        ENDS + self.bucket_t.len() + i
    }

    /// Words of a record.
    pub(crate) fn words(&self) -> usize {
        self.key_at() + 1 + KEY_WORDS
    }

    /// The key's rate after a check of `cost` at `now`, in cost units per 10^12 ns (what the
    /// library takes): this period's units plus the previous period's share still in the
    /// last `period` ns.
    fn track<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64) -> (u64, u64) {
        const LOW: u64 = 0xffff_ffff;
        let p = self.period;
        // The period's index, modulo 2^32 (a record idle that long is long reclaimed).
        let idx = (now / p) & LOW;
        let w = c.get(RATE);
        let (mut at, mut cur) = (w >> 32, w & LOW);
        let mut prev = c.get(RATE_PREV);
        if idx != at || w == 0 {
            prev = if idx == (at + 1) & LOW && w != 0 {
                cur
            } else {
                0
            };
            at = idx;
            cur = 0;
            c.set(RATE_FROM, if prev == 0 { now } else { 0 });
        }
        cur = (cur + cost).min(LOW);
        c.set(RATE, at << 32 | cur);
        c.set(RATE_PREV, prev);
        let into = now % p;
        let from = c.get(RATE_FROM);
        let (units, span) = if prev == 0 && from > 0 {
            // Counted since `from` only: over that time (at least a sixteenth of a period, so
            // that a few checks close together do not make a rate of millions).
            (cur as u128, (now - from).max(p / 16).max(1))
        } else {
            let u = prev as u128 * (p - into) as u128 / p as u128 + cur as u128;
            (u, p)
        };
        let rate = (units * 1_000_000_000_000 / span as u128).min(1 << 52) as u64;
        (rate, prev + cur)
    }

    /// Whether a key seen for `seen` cost units in the last two periods, at `rate`, is worth
    /// a lease: it was seen for `min_checks` requests of `cost` already, and a lease would
    /// serve as many.
    fn worth(&self, rate: u64, seen: u64, cost: u64) -> bool {
        let want = self.min_checks * cost;
        seen >= want && rate as u128 * self.horizon as u128 >= want as u128 * 1_000_000_000_000
    }

    /// How long after a grant that emptied Redis nothing is left (ns from the answer; `ends`
    /// the grant's, per limit): with fixed windows only, until the earliest window's end
    /// (nothing comes back to a spent fixed window but what a node gives back); else until
    /// the earliest window lease's end (a sliding window frees some as it slides), or a
    /// bucket's TAT.
    pub(super) fn dry(&self, ends: &[u64]) -> u64 {
        let all = ends;
        let ends = all.iter().zip(&self.finals);
        if self.finals.iter().all(Option::is_some) {
            return ends
                .map(|(&e, f)| e.saturating_add(f.unwrap_or(0)))
                .min()
                .unwrap_or(0);
        }
        (all.iter().zip(&self.bucket_t))
            .filter(|(_, &t)| t == 0)
            .map(|(&e, _)| e)
            .min()
            .unwrap_or_else(|| all.iter().copied().min().unwrap_or(0))
    }

    /// Held admissions spendable at `now`: 0 after the lease's end; a bucket's only while
    /// the bucket, without them, would not be full (each held token needs T ns of its TAT
    /// still ahead).
    pub(super) fn usable<C: Cells + ?Sized>(&self, c: &C, now: u64) -> u64 {
        let held = c.get(HELD);
        if held == 0 || now >= c.get(UNTIL) {
            return 0;
        }
        let mut u = held;
        for (i, &t) in self.bucket_t.iter().enumerate() {
            if let Some(cover) = c.get(ENDS + i).saturating_sub(now).checked_div(t) {
                u = u.min(cover);
            }
        }
        u
    }

    pub(super) fn key_matches<C: Cells + ?Sized>(&self, c: &C, key: &[u8]) -> bool {
        let at = self.key_at();
        if c.get(at) != key.len() as u64 + 1 {
            return false;
        }
        key.chunks(8)
            .enumerate()
            .all(|(i, ch)| c.get(at + 1 + i) == word(ch))
    }

    fn store_key<C: Cells + ?Sized>(&self, c: &mut C, key: &[u8]) {
        let at = self.key_at();
        c.set(at, key.len() as u64 + 1);
        for (i, ch) in key.chunks(8).enumerate() {
            c.set(at + 1 + i, word(ch));
        }
    }

    /// The key of a record (for a give-back), if it has one.
    pub(crate) fn key_of<C: Cells + ?Sized>(&self, c: &C) -> Option<Vec<u8>> {
        let at = self.key_at();
        let len = c.get(at).checked_sub(1)? as usize;
        if len > KEY_MAX {
            return None;
        }
        let mut k = Vec::with_capacity(len);
        for i in 0..len.div_ceil(8) {
            k.extend_from_slice(&c.get(at + 1 + i).to_le_bytes());
        }
        k.truncate(len);
        Some(k)
    }
}

fn word(ch: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..ch.len()].copy_from_slice(ch);
    u64::from_le_bytes(b)
}

/// The lease table's record kind: idle once nothing in it matters any more.
pub(crate) struct LeaseKind {
    pub(crate) shape: Shape,
    pub(crate) counters: Counters,
}

impl RecordKind for LeaseKind {
    fn words(&self) -> usize {
        self.shape.words()
    }
    fn idle_in(&self, c: &mut dyn Cells, now: u64) -> u64 {
        let mut until = c
            .get(DENY_UNTIL)
            .max(c.get(FINAL_UNTIL))
            .max(c.get(DRY_UNTIL));
        if c.get(LAST) > 0 {
            until = until.max(c.get(LAST).saturating_add(2 * self.shape.period));
        }
        if c.get(HELD) > 0 || c.get(PENDING) > 0 {
            until = until.max(c.get(UNTIL));
        }
        if c.get(FLAGS) & FETCHING != 0 {
            until = until.max(c.get(FETCH_AT).saturating_add(self.shape.stale));
        }
        until.saturating_sub(now)
    }
    fn removed(&self, c: &mut dyn Cells) {
        self.counters.lapse(c.get(HELD));
        self.counters.unrecorded(c.get(PENDING));
    }
}

/// What a check found in its key's record.
#[derive(Debug)]
pub(crate) enum Spent {
    /// Answered here.
    Local(Decision),
    /// This caller fetches a lease (at the key's `rate`); delayed mode: records `pending`
    /// admissions first.
    Fetch { rate: u64, pending: u64 },
    /// Another caller is fetching this key's lease.
    Wait,
    /// Not leased: one check in Redis.
    Check,
}

/// A check of `cost` at `now` against the key's lease.
pub(crate) struct Spend<'a> {
    pub(crate) shape: &'a Shape,
    pub(crate) counters: &'a Counters,
    pub(crate) key: &'a [u8],
    pub(crate) cost: u64,
    pub(crate) now: u64,
    /// Count the check in the key's rate (not again when a waiter looks a second time).
    pub(crate) count: bool,
    /// Claim the key's fetch when its lease is out (a caller that cannot fetch — an answer
    /// without a future — leaves it to the check that follows).
    pub(crate) claim: bool,
}

pub(super) fn allowed<C: Cells + ?Sized>(c: &C, now: u64, remaining: u64) -> Decision {
    Decision {
        outcome: Outcome::Allowed,
        limit: c.get(LIMIT),
        remaining: remaining.saturating_add(c.get(LEFT)),
        reset_after_ns: c.get(RESET_AT).saturating_sub(now),
        retry_after_ns: None,
        delay_ns: 0,
    }
}

pub(super) fn denied<C: Cells + ?Sized>(c: &C, now: u64, until: u64) -> Decision {
    Decision {
        outcome: Outcome::Limited,
        limit: c.get(LIMIT),
        remaining: 0,
        reset_after_ns: c.get(RESET_AT).saturating_sub(now),
        retry_after_ns: Some(until.saturating_sub(now).max(1)),
        delay_ns: 0,
    }
}

impl RecordOp for Spend<'_> {
    type Out = Spent;
    fn inserts(&self) -> bool {
        true
    }
    fn apply<C: Cells + ?Sized>(&mut self, c: &mut C) -> Spent {
        let (sh, now, cost) = (self.shape, self.now, self.cost);
        let at = sh.key_at();
        if c.get(at) == 0 {
            if self.key.len() > KEY_MAX {
                return Spent::Check;
            }
            sh.store_key(c, self.key);
        } else if !sh.key_matches(c, self.key) {
            // Another key with the same id: it is checked in Redis, never on this lease.
            return Spent::Check;
        }
        let local = if now < c.get(DENY_UNTIL) && cost >= c.get(DENY_COST) {
            Some(Spent::Local(denied(c, now, c.get(DENY_UNTIL))))
        } else {
            match sh.mode {
                LeaseMode::Reserve => self.reserve(c),
                LeaseMode::Delayed { flush } => self.delayed(c, flush),
            }
        };
        if !self.claim && local.is_none() {
            // Not counted: the check that follows counts it.
            return Spent::Check;
        }
        let (rate, seen) = if self.count {
            let r = sh.track(c, now, cost);
            c.set(LAST, now);
            r
        } else {
            sh.track(c, now, 0)
        };
        if let Some(out) = local {
            return out;
        }
        if c.get(FLAGS) & FETCHING != 0 && now < c.get(FETCH_AT).saturating_add(sh.stale) {
            return Spent::Wait;
        }
        let pending = c.get(PENDING);
        if pending == 0 && (now < c.get(FINAL_UNTIL) || !sh.worth(rate, seen, cost)) {
            return Spent::Check;
        }
        c.set(FLAGS, c.get(FLAGS) | FETCHING);
        c.set(FETCH_AT, now);
        Spent::Fetch { rate, pending }
    }
    fn absent(&mut self) -> Spent {
        Spent::Check
    }
}

impl Spend<'_> {
    /// Reserve: spend from the lease, or deny after an exhausting grant; `None`: fetch.
    fn reserve<C: Cells + ?Sized>(&self, c: &mut C) -> Option<Spent> {
        let (now, cost) = (self.now, self.cost);
        let usable = self.shape.usable(c, now);
        let held = c.get(HELD);
        if usable >= cost {
            // A bucket's tokens past what its TAT still covers lapsed for good (spending one
            // must not bring them back under the cover).
            self.counters.lapse(held - usable);
            c.set(HELD, usable - cost);
            return Some(Spent::Local(allowed(c, now, usable - cost)));
        }
        if now < c.get(UNTIL) && held > usable {
            // A bucket's tokens that lapsed while held. (A lease that ended unspent is left
            // to the sweep: given back, or counted as lapsed.)
            self.counters.lapse(held - usable);
            c.set(HELD, usable);
        }
        if c.get(FLAGS) & EXHAUSTED != 0 && now < c.get(DRY_UNTIL) {
            return Some(Spent::Local(denied(c, now, c.get(DRY_UNTIL))));
        }
        None
    }

    /// Delayed: admit while the unrecorded count fits the allowance; `None`: flush and fetch.
    fn delayed<C: Cells + ?Sized>(&self, c: &mut C, flush: u64) -> Option<Spent> {
        let (now, cost) = (self.now, self.cost);
        let pending = c.get(PENDING);
        let allowance = if now < c.get(UNTIL) { c.get(HELD) } else { 0 };
        if pending + cost <= allowance && pending + cost <= flush {
            c.set(PENDING, pending + cost);
            return Some(Spent::Local(allowed(c, now, allowance - pending - cost)));
        }
        None
    }
}
