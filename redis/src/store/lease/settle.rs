//! What Redis's answers and the store's other calls do to a key's lease record: a lease call
//! settled (`Settle`), a fetch that ended without one (`Unfetch`), a refund into the lease
//! (`Credit`), what a peek adds (`Held`), and what a sweep gives back (`Take`).

use super::counters::Counters;
use super::record::*;
use super::LeaseMode;
use crate::error::Error;
use crate::reply;
use redis::Value;
use turnstile::algo::Cells;
use turnstile::keyed::RecordOp;
use turnstile::Decision;

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
    /// Set when the record holds a lease it did not before: to list for the sweep, due then.
    pub(crate) list: Option<u64>,
}

/// The guard of a time `ns` ahead on Redis's clock: the clocks' rates may differ (0.1 %),
/// and 100 µs more.
fn guard(ns: u64) -> u64 {
    ns / 1000 + 100_000
}

/// A local end `ns` after `sent` (before Redis read its clock), less the guard: the earliest
/// Redis's end can be here. What bounds spending (a lease's end, a bucket's TAT) uses it.
pub(crate) fn local_end(sent: u64, ns: u64) -> u64 {
    sent.saturating_add(ns.saturating_sub(guard(ns)))
}

/// A local time `ns` after `now` (after Redis answered, so after it read its clock): at or
/// just after Redis's time then, as far as the clocks' rates agree. What bounds waiting (a
/// denial's retry, a final share's end) uses it, so that the node asks again once, after the
/// time, not several times just before it (as an early end did: each answer a smaller retry);
/// and it waits no longer than that (a later end would deny requests the next window admits).
fn local_after(now: u64, ns: u64) -> u64 {
    now.saturating_add(ns)
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
            c.set(FINAL_UNTIL, local_after(now, windows.unwrap_or(0)));
        }
        let pending = c.get(PENDING);
        c.set(PENDING, pending - self.pending_sent.min(pending));
        if g.granted < self.cost || g.granted == 0 {
            c.set(LEFT, 0);
            // Deny locally until the retry. While Redis had admissions left (fewer than the
            // request), look again when other nodes' leases end in this window (they may give
            // admissions back); a window Redis found spent is spent here until its retry, or
            // `recheck` (no call per node for the give-backs of its final share).
            // (Not in a final share: no node holds a lease there.)
            let mut wait = d.retry_after_ns.unwrap_or(0);
            if let (false, Some(w)) = (g.last, windows) {
                if d.remaining > 0 {
                    wait = wait.min(w);
                }
                wait = wait.min(sh.recheck);
            }
            if wait > 0 {
                c.set(DENY_UNTIL, local_after(now, wait));
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
                    c.set(DRY_UNTIL, local_after(now, sh.dry(&g.ends).min(sh.recheck)));
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
        if (c.get(HELD) > 0 || c.get(PENDING) > 0) && c.get(FLAGS) & LISTED == 0 {
            c.set(FLAGS, c.get(FLAGS) | LISTED);
            self.list = Some(c.get(UNTIL));
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

/// What the record's reserve lease of `key` can spend at `now`; `None` when the record is
/// another key's or the mode is delayed (a refund or a charge is then Redis's alone).
fn leased<C: Cells + ?Sized>(sh: &Shape, c: &C, key: &[u8], now: u64) -> Option<u64> {
    (sh.key_matches(c, key) && sh.mode == LeaseMode::Reserve).then(|| sh.usable(c, now))
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
        let Some(usable) = leased(self.shape, c, self.key, self.now) else {
            return self.n;
        };
        // A denial remembered here may fit now.
        c.set(DENY_UNTIL, 0);
        if usable == 0 {
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

/// A settled charge of `n` for the key (a cost above the one its check reserved): taken from
/// its lease when the lease holds all of it unspent, else left whole for Redis (returns what
/// is left: 0 or `n`). Never over: the lease's admissions were counted in Redis when they were
/// granted, so spending them on the charge counts it as Redis would; a charge the lease cannot
/// cover goes to Redis whole (all or nothing: none of it spent here), where it is counted
/// beside what the lease still holds. Delayed mode leaves every charge to Redis.
pub(crate) struct Debit<'a> {
    pub(crate) shape: &'a Shape,
    pub(crate) counters: &'a Counters,
    pub(crate) key: &'a [u8],
    pub(crate) n: u64,
    pub(crate) now: u64,
}

impl RecordOp for Debit<'_> {
    type Out = u64;
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, c: &mut C) -> u64 {
        let Some(usable) = leased(self.shape, c, self.key, self.now) else {
            return self.n;
        };
        if usable < self.n {
            return self.n;
        }
        // As a local spend: a bucket's tokens past what its TAT still covers lapsed for good.
        self.counters.lapse(c.get(HELD) - usable);
        c.set(HELD, usable - self.n);
        0
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

/// A sweep's look at a record: what it gives back, and when to look again (`None`: nothing
/// held any more; the record is no longer listed).
pub(crate) type Swept = (Option<Taken>, Option<u64>);

impl RecordOp for Take<'_> {
    type Out = Swept;
    fn inserts(&self) -> bool {
        false
    }
    fn apply<C: Cells + ?Sized>(&mut self, c: &mut C) -> Swept {
        let (sh, now) = (self.shape, self.now);
        let idle = now.saturating_sub(c.get(LAST)) >= self.idle;
        let next = c.get(UNTIL).min(c.get(LAST).saturating_add(self.idle));
        let out = match sh.mode {
            LeaseMode::Delayed { .. } => self.delayed(c, idle),
            LeaseMode::Reserve => self.reserve(c, idle),
        };
        match out {
            None if c.get(HELD) > 0 || c.get(PENDING) > 0 => (None, Some(next.max(now + 1))),
            out => {
                c.set(FLAGS, c.get(FLAGS) & !LISTED);
                (out, None)
            }
        }
    }
    fn absent(&mut self) -> Swept {
        (None, None)
    }
}

impl Take<'_> {
    fn delayed<C: Cells + ?Sized>(&self, c: &mut C, idle: bool) -> Option<Taken> {
        let pending = c.get(PENDING);
        if !(idle || self.all || self.now >= c.get(UNTIL)) {
            return None;
        }
        c.set(PENDING, 0);
        c.set(HELD, 0);
        (pending > 0).then(|| Taken {
            key: self.shape.key_of(c).unwrap_or_default(),
            amount: pending,
            epoch: c.get(EPOCH),
            ends: Vec::new(),
        })
    }

    fn reserve<C: Cells + ?Sized>(&self, c: &mut C, idle: bool) -> Option<Taken> {
        let (sh, now) = (self.shape, self.now);
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
}

/// A lease call's reply for a key of `limits` limits (lease.lua): the grant, whether a
/// window was in its final share, the call's time, the admissions recorded for a delayed
/// node, each limit's end, then the decision (six integers).
pub(crate) fn parse_grant(v: &Value, limits: usize) -> Result<(Grant, u64), Error> {
    let f: Vec<i64> = reply::integers(reply::text(v)?)
        .collect::<Result<_, ()>>()
        .map_err(|_| reply::bad(v))?;
    if f.len() != 4 + limits + 6 || f[..4].iter().any(|&x| x < 0) {
        return Err(reply::bad(v));
    }
    let decision = reply::decision(&f[4 + limits..])
        .ok()
        .flatten()
        .ok_or_else(|| reply::bad(v))?;
    let grant = Grant {
        granted: f[0] as u64,
        last: f[1] == 1,
        epoch: f[2] as u64,
        ends: f[4..4 + limits].iter().map(|&e| e.max(0) as u64).collect(),
        decision,
    };
    Ok((grant, f[3] as u64))
}
