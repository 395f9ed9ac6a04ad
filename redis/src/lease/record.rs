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
const HELD: usize = 0;
/// Held admissions may be spent before this time (window leases; buckets lapse by `ENDS`).
const UNTIL: usize = 1;
/// `FETCHING` | `EXHAUSTED`.
const FLAGS: usize = 2;
/// When the fetch in flight started (a flag older than `Shape::stale` is a dropped call's).
const FETCH_AT: usize = 3;
/// Requests of at least `DENY_COST` are denied locally before this time.
const DENY_UNTIL: usize = 4;
const DENY_COST: usize = 5;
/// Rate: `period index << 32 | cost units in it`, and the previous period's units.
const RATE: usize = 6;
const RATE_PREV: usize = 7;
/// The last check.
const LAST: usize = 8;
/// Redis's time of the grant (ns), which a give-back names.
const EPOCH: usize = 9;
/// Admissions the current lease was granted beyond its request.
const GRANTED: usize = 10;
/// What Redis had left after the last call, the limit it reported, and when (local time)
/// its record is equivalent to absent.
const LEFT: usize = 11;
const LIMIT: usize = 12;
const RESET_AT: usize = 13;
/// Checks go to Redis one by one before this time (a window's final share).
const FINAL_UNTIL: usize = 14;
/// Delayed mode: admitted locally, not yet recorded in Redis.
const PENDING: usize = 15;
/// Per limit, from `ENDS`: a bucket's TAT after the grant (local time; 0 for a window); then
/// per limit, the same as Redis answered it (ns after `EPOCH`), which a give-back names.
const ENDS: usize = 16;

const FETCHING: u64 = 1 << 63;
/// The grant emptied Redis: once it is spent, deny until the lease's end.
const EXHAUSTED: u64 = 1 << 62;

/// Longest key kept in a record (a longer key is checked in Redis one by one).
pub(crate) const KEY_MAX: usize = 56;
const KEY_WORDS: usize = KEY_MAX / 8;

/// What every record of a store shares: the limits' shape and the leasing rules.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub(crate) mode: LeaseMode,
    /// Per limit: a bucket's interval T (ns per unit), 0 for a window.
    pub(crate) bucket_t: Vec<u64>,
    /// Rate periods (ns).
    pub(crate) period: u64,
    /// How long a lease is expected to last (a window: half of it less its final share; a
    /// bucket: its span): a key is leased when its rate fills `min_checks` in that time.
    pub(crate) horizon: u64,
    pub(crate) min_checks: u64,
    /// A fetch flag this old belongs to a call that was dropped.
    pub(crate) stale: u64,
}

impl Shape {
    fn key_at(&self) -> usize {
        ENDS + 2 * self.bucket_t.len()
    }

    /// Word of limit `i`'s TAT as Redis answered it.
    fn raw_end(&self, i: usize) -> usize {
        ENDS + self.bucket_t.len() + i
    }

    /// Words of a record.
    pub(crate) fn words(&self) -> usize {
        self.key_at() + 1 + KEY_WORDS
    }

    /// The key's rate after a check of `cost` at `now`, in cost units per 10^12 ns (what the
    /// library takes): this period's units plus the previous period's share still in the
    /// last `period` ns.
    fn track<C: Cells + ?Sized>(&self, c: &mut C, now: u64, cost: u64) -> u64 {
        let p = self.period;
        let idx = now / p;
        let w = c.get(RATE);
        let (mut at, mut cur) = (w >> 32, w & 0xffff_ffff);
        let mut prev = c.get(RATE_PREV);
        if idx != at & 0xffff_ffff || c.get(LAST) == 0 {
            prev = if idx == (at + 1) & 0xffff_ffff {
                cur
            } else {
                0
            };
            at = idx;
            cur = 0;
        }
        cur = (cur + cost).min(0xffff_ffff);
        c.set(RATE, (at & 0xffff_ffff) << 32 | cur);
        c.set(RATE_PREV, prev);
        let into = now % p;
        let units = prev as u128 * (p - into) as u128 / p as u128 + cur as u128;
        (units * 1_000_000_000_000 / p as u128).min(1 << 52) as u64
    }

    /// Whether a lease at `rate` would serve at least `min_checks` requests of `cost`.
    fn worth(&self, rate: u64, cost: u64) -> bool {
        rate as u128 * self.horizon as u128 >= (self.min_checks * cost) as u128 * 1_000_000_000_000
    }

    /// Held admissions spendable at `now`: 0 after the lease's end; a bucket's only while
    /// the bucket, without them, would not be full (each held token needs T ns of its TAT
    /// still ahead).
    fn usable<C: Cells + ?Sized>(&self, c: &C, now: u64) -> u64 {
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

    fn key_matches<C: Cells + ?Sized>(&self, c: &C, key: &[u8]) -> bool {
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
        let mut until = c.get(DENY_UNTIL).max(c.get(FINAL_UNTIL));
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
}

fn allowed<C: Cells + ?Sized>(c: &C, now: u64, remaining: u64) -> Decision {
    Decision {
        outcome: Outcome::Allowed,
        limit: c.get(LIMIT),
        remaining: remaining.saturating_add(c.get(LEFT)),
        reset_after_ns: c.get(RESET_AT).saturating_sub(now),
        retry_after_ns: None,
        delay_ns: 0,
    }
}

fn denied<C: Cells + ?Sized>(c: &C, now: u64, until: u64) -> Decision {
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
        let rate = if self.count {
            let r = sh.track(c, now, cost);
            c.set(LAST, now);
            r
        } else {
            u64::MAX
        };
        if now < c.get(DENY_UNTIL) && cost >= c.get(DENY_COST) {
            return Spent::Local(denied(c, now, c.get(DENY_UNTIL)));
        }
        let out = match sh.mode {
            LeaseMode::Reserve => self.reserve(c),
            LeaseMode::Delayed { flush } => self.delayed(c, flush),
        };
        if let Some(out) = out {
            return out;
        }
        if c.get(FLAGS) & FETCHING != 0 && now < c.get(FETCH_AT).saturating_add(sh.stale) {
            return Spent::Wait;
        }
        let rate = if rate == u64::MAX {
            sh.track(c, now, 0)
        } else {
            rate
        };
        let pending = c.get(PENDING);
        if pending == 0 && (now < c.get(FINAL_UNTIL) || !sh.worth(rate, cost)) {
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
        if c.get(FLAGS) & EXHAUSTED != 0 && now < c.get(UNTIL) {
            return Some(Spent::Local(denied(c, now, c.get(UNTIL))));
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

/// Redis's answer to a lease call, in local time.
#[derive(Clone, Debug)]
pub(crate) struct Grant {
    /// Admissions granted (the request's cost included); 0: the request was denied.
    pub(crate) granted: u64,
    /// A window was in its final share: no lease, and checks go one by one until it ends.
    pub(crate) last: bool,
    /// Redis's time of the call (ns).
    pub(crate) epoch: u64,
    /// Per limit, ns from the call: a window's lease end (its end when `last`), a bucket's TAT.
    pub(crate) ends: Vec<u64>,
    /// The decision for the request, or for the grant (what Redis then had left).
    pub(crate) decision: Decision,
}

/// Settles a lease call sent at `sent`: the grant, or the denial, into the key's record.
pub(crate) struct Settle<'a> {
    pub(crate) shape: &'a Shape,
    pub(crate) counters: &'a Counters,
    pub(crate) grant: &'a Grant,
    pub(crate) cost: u64,
    /// Delayed mode: the unrecorded admissions the call carried (recorded as many as fitted).
    pub(crate) pending_sent: u64,
    pub(crate) sent: u64,
    pub(crate) now: u64,
}

/// A local end `ns` after `sent`, less a guard for the clocks' rates (0.1 %) and 100 µs.
pub(crate) fn local_end(sent: u64, ns: u64) -> u64 {
    sent.saturating_add(ns.saturating_sub(ns / 1000 + 100_000))
}

impl RecordOp for Settle<'_> {
    type Out = Decision;
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, c: &mut C) -> Decision {
        let (sh, g, now) = (self.shape, self.grant, self.now);
        c.set(FLAGS, c.get(FLAGS) & !(FETCHING | EXHAUSTED));
        let d = &g.decision;
        c.set(LIMIT, d.limit);
        c.set(RESET_AT, local_end(self.sent, d.reset_after_ns));
        let windows = (g.ends.iter().zip(&sh.bucket_t))
            .filter(|(_, &t)| t == 0)
            .map(|(&e, _)| e)
            .min();
        if g.last {
            c.set(FINAL_UNTIL, local_end(self.sent, windows.unwrap_or(0)));
        }
        let pending = c.get(PENDING);
        c.set(PENDING, pending - self.pending_sent.min(pending));
        if g.granted < self.cost || g.granted == 0 {
            c.set(LEFT, 0);
            // Deny locally until the retry, but look again when other nodes' leases end in
            // this window (they may give admissions back).
            let mut wait = d.retry_after_ns.unwrap_or(0);
            if let (false, Some(w)) = (g.last, windows) {
                wait = wait.min(w);
            }
            if wait > 0 {
                c.set(DENY_UNTIL, local_end(self.sent, wait));
                c.set(DENY_COST, self.cost);
            }
            return *d;
        }
        c.set(LEFT, d.remaining);
        c.set(DENY_UNTIL, 0);
        let extra = g.granted - self.cost;
        let until = match windows {
            Some(w) => local_end(self.sent, w),
            None => g
                .ends
                .iter()
                .map(|&e| local_end(self.sent, e))
                .min()
                .unwrap_or(0),
        };
        match sh.mode {
            LeaseMode::Reserve if extra > 0 && !g.last => {
                let kept = sh.usable(c, now);
                self.counters.lapse(c.get(HELD) - kept);
                c.set(HELD, kept + extra);
                c.set(UNTIL, until);
                for (i, (&e, &t)) in g.ends.iter().zip(&sh.bucket_t).enumerate() {
                    if t > 0 {
                        c.set(ENDS + i, local_end(self.sent, e));
                        c.set(sh.raw_end(i), e);
                    }
                }
                c.set(EPOCH, g.epoch);
                c.set(GRANTED, extra);
                if d.remaining == 0 {
                    c.set(FLAGS, c.get(FLAGS) | EXHAUSTED);
                }
                self.counters.granted(extra);
            }
            LeaseMode::Reserve => {}
            LeaseMode::Delayed { flush } => {
                c.set(HELD, d.remaining.min(flush));
                c.set(UNTIL, if g.last { 0 } else { until });
                c.set(EPOCH, g.epoch);
            }
        }
        allowed(c, now, sh.usable(c, now))
    }
    fn absent(&mut self) -> Decision {
        // The record went (evicted meanwhile): the request was decided all the same.
        let mut d = self.grant.decision;
        if self.grant.granted >= self.cost && self.grant.granted > 0 {
            let extra = self.grant.granted - self.cost;
            self.counters.lapse(extra);
            d.remaining += extra;
        }
        d
    }
}

/// Clears a fetch that ended without an answer (an error or a dropped call).
pub(crate) struct Unfetch;

impl RecordOp for Unfetch {
    type Out = ();
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, c: &mut C) {
        c.set(FLAGS, c.get(FLAGS) & !FETCHING);
    }
    fn absent(&mut self) {}
}

/// A refund of `n` for the key: back into its lease while one is held (`None`: the amount
/// for Redis).
pub(crate) struct Credit<'a> {
    pub(crate) shape: &'a Shape,
    pub(crate) key: &'a [u8],
    pub(crate) n: u64,
    pub(crate) now: u64,
}

impl RecordOp for Credit<'_> {
    type Out = u64;
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, c: &mut C) -> u64 {
        let sh = self.shape;
        if !sh.key_matches(c, self.key) || sh.mode != LeaseMode::Reserve {
            return self.n;
        }
        // A denial remembered here may fit now.
        c.set(DENY_UNTIL, 0);
        if sh.usable(c, self.now) == 0 {
            return self.n;
        }
        // At most what the lease has spent goes back into it; the rest was not taken from it.
        let spent = c.get(GRANTED).saturating_sub(c.get(HELD));
        let back = self.n.min(spent);
        c.set(HELD, c.get(HELD) + back);
        self.n - back
    }
    fn absent(&mut self) -> u64 {
        self.n
    }
}

/// What a peek adds to Redis's answer: the admissions this node holds.
pub(crate) struct Held<'a> {
    pub(crate) shape: &'a Shape,
    pub(crate) now: u64,
}

impl RecordOp for Held<'_> {
    type Out = u64;
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, c: &mut C) -> u64 {
        match self.shape.mode {
            LeaseMode::Reserve => self.shape.usable(c, self.now),
            LeaseMode::Delayed { .. } => 0,
        }
    }
    fn absent(&mut self) -> u64 {
        0
    }
}

/// What a give-back takes out of a record.
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) key: Vec<u8>,
    /// Reserve: unspent admissions to give back; delayed: admissions to record.
    pub(crate) amount: u64,
    pub(crate) epoch: u64,
    /// Per limit, a bucket's TAT after the grant (ns after `epoch`): Redis takes tokens back
    /// only while the bucket's TAT is still there (no one took a token since, so the tokens
    /// given back are the bucket's last).
    pub(crate) ends: Vec<u64>,
}

/// The sweep of one record: takes what should go back to Redis now. Reserve: a lease whose
/// end came (a window's final share), a lease idle for `idle` ns, or any lease (`all`:
/// shutdown, reload), when the key was short of admissions in Redis at its last call
/// (held admissions matter to other nodes only then). Delayed: unrecorded admissions of an
/// idle key, or all of them.
pub(crate) struct Take<'a> {
    pub(crate) shape: &'a Shape,
    pub(crate) counters: &'a Counters,
    pub(crate) now: u64,
    pub(crate) idle: u64,
    pub(crate) all: bool,
}

impl RecordOp for Take<'_> {
    type Out = Option<Taken>;
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, c: &mut C) -> Option<Taken> {
        let (sh, now) = (self.shape, self.now);
        let idle = now.saturating_sub(c.get(LAST)) >= self.idle;
        if let LeaseMode::Delayed { .. } = sh.mode {
            let pending = c.get(PENDING);
            if pending == 0 || !(idle || self.all || now >= c.get(UNTIL)) {
                return None;
            }
            c.set(PENDING, 0);
            c.set(HELD, 0);
            return Some(Taken {
                key: sh.key_of(c)?,
                amount: pending,
                epoch: c.get(EPOCH),
                ends: Vec::new(),
            });
        }
        let held = c.get(HELD);
        if held == 0 {
            return None;
        }
        let usable = sh.usable(c, now);
        let ended = now >= c.get(UNTIL);
        let short = c.get(LEFT) < c.get(GRANTED).max(1);
        if !(self.all || ((ended || idle) && short)) {
            if ended {
                self.counters.lapse(held);
                c.set(HELD, 0);
            }
            return None;
        }
        c.set(HELD, 0);
        // A window's lease given back after its end is still in its window (it ended at the
        // final share): the give-back names the epoch, and Redis takes it back only there.
        let amount = if ended && sh.bucket_t.iter().all(|&t| t == 0) {
            held
        } else {
            usable
        };
        self.counters.lapse(held - amount);
        (amount > 0).then(|| Taken {
            key: sh.key_of(c).unwrap_or_default(),
            amount,
            epoch: c.get(EPOCH),
            ends: (0..sh.bucket_t.len())
                .map(|i| c.get(sh.raw_end(i)))
                .collect(),
        })
    }
    fn absent(&mut self) -> Option<Taken> {
        None
    }
}
