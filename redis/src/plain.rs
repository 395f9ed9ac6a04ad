//! A store of one fixed_window limit by plain commands (no function call): the key names the
//! window, as envoyproxy/ratelimit's fixed window does, and the decision is made here from
//! the count Redis answers, by the in-memory algorithm itself. Opt-in
//! ([`crate::RedisStoreBuilder::plain_commands`]): the window is picked by the **caller's
//! clock** (or the explicit `now`), not the server's `TIME`.
//!
//! A check of `cost` (1 ≤ cost ≤ limit) is one transaction on the window's key `k`:
//!
//! ```text
//! MULTI; INCRBY k <cost>; PEXPIRE k <ms to the window's end + slack> NX; EXEC
//! ```
//!
//! The TTL is set in the same transaction as the key's first increment, so the key never
//! exists without one (an `INCRBY` then an `EXPIRE`, outside a transaction, leave a key that
//! never expires if the client dies between the two, or if the key expires between them).
//! `NX`: a key keeps the TTL its first write gave it.
//!
//! When the count passes the limit and the limit does not count denials, the cost is given
//! back by the same transaction with `-cost`: it never leaves a key without a TTL (`PEXPIRE
//! … NX` again) and never gives back to another window (the key names its window). Had the
//! key expired before the undo (its window's end + slack passed meanwhile: a client stalled
//! that long), the undo makes it anew at `-cost`, with a TTL; that reply is below 0, and the
//! cost is added back at once. A refund must not take a count below 0, which no plain
//! command can promise: it is a function call (plain.lua), never on the hot path.
//!
//! **Never over-admits.** Every caller adds its cost before it looks, and takes back only
//! what it added itself, after it looked. So when a caller reads count `c` after its own
//! increment, `c` is at least the sum of the costs of every admission made so far in that
//! window (theirs were added before and are never taken back; a refund takes back at most
//! the count, never below 0) plus its own: it is admitted only if that sum fits. Concurrent
//! callers may over-deny (a refused caller's cost, not yet given back, makes another's look
//! too large), transiently; never over-admit. (`redis/tests/live.rs`: a race of 640 calls on
//! one key admits at most the limit and leaves exactly the admissions counted.)

use crate::error::Error;
use crate::script::EXPLICIT_NOW_TTL_SLACK_MS;
use redis::{Pipeline, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use turnstile::algo::{fixed_window, sliding_window};
use turnstile::{Decision, Limit};

/// Milliseconds a window's key outlives the window's end by the caller's clock: callers whose
/// clocks are behind by up to this still find the window's count (a caller farther behind
/// starts the window afresh, and may admit up to the limit again in it).
pub const PLAIN_CLOCK_SLACK_MS: u64 = 1_000;

/// What one plain call does.
pub(crate) enum Op {
    /// Read the counts (a peek, or a cost that never fits).
    Read,
    /// Add to the window's count (negative: give back a refused cost), in a transaction that
    /// gives a new key its TTL (and reads the previous window's count: sliding_window).
    Add(i64),
}

/// The store's one limit.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Plain {
    Fixed(fixed_window::Params),
    /// Two windows' counts (this one's and the previous one's, each its own key).
    Sliding(sliding_window::Params),
}

/// Now by the caller's clock, in ns since the Unix epoch (0 before it; u64 until 2554).
pub(crate) fn caller_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Plain {
    /// The plain path of `limits`, if they are one limit it handles.
    pub(crate) fn of(limits: &[Limit]) -> Option<Self> {
        match limits {
            [Limit::FixedWindow(p)] => Some(Plain::Fixed(*p)),
            [Limit::SlidingWindow(p)] => Some(Plain::Sliding(*p)),
            _ => None,
        }
    }

    fn window(&self) -> u64 {
        match self {
            Plain::Fixed(p) => p.window,
            Plain::Sliding(p) => p.window,
        }
    }

    fn limit(&self) -> u64 {
        match self {
            Plain::Fixed(p) => p.limit,
            Plain::Sliding(p) => p.limit,
        }
    }

    fn count_denied(&self) -> bool {
        match self {
            Plain::Fixed(p) => p.count_denied,
            Plain::Sliding(p) => p.count_denied,
        }
    }

    /// The largest count the in-memory counter holds (it saturates there).
    fn max_count(&self) -> u64 {
        match self {
            Plain::Fixed(_) => fixed_window::MAX_LIMIT,
            Plain::Sliding(_) => sliding_window::MAX_LIMIT,
        }
    }

    /// The key of the window holding `now` for the record key `base`.
    pub(crate) fn key(&self, base: &str, now: u64) -> String {
        format!("{base}:{}", now / self.window())
    }

    /// The previous window's key (`-1` before the first window: a key never written).
    fn prev_key(&self, base: &str, now: u64) -> String {
        format!("{base}:{}", i128::from(now / self.window()) - 1)
    }

    /// The TTL of the window's key at `now`: ms to the end of the last window that reads its
    /// count (this one; sliding_window: the next one too), rounded up, plus the slack (the
    /// explicit-now slack when `now` was given).
    fn ttl_ms(&self, now: u64, explicit: bool) -> u64 {
        let w = u128::from(self.window());
        let windows = match self {
            Plain::Fixed(_) => 1,
            Plain::Sliding(_) => 2,
        };
        let end = (u128::from(now) / w + windows) * w;
        let ms = (end - u128::from(now)).div_ceil(1_000_000) as u64;
        ms + if explicit {
            EXPLICIT_NOW_TTL_SLACK_MS
        } else {
            PLAIN_CLOCK_SLACK_MS
        }
    }

    /// The transaction (or read) of `op` for the record key `base` at `now`.
    pub(crate) fn pipeline(&self, base: &str, now: u64, explicit: bool, op: Op) -> Pipeline {
        let k = self.key(base, now);
        let mut pipe = redis::pipe();
        match (op, self) {
            (Op::Read, Plain::Fixed(_)) => {
                pipe.cmd("GET").arg(&k);
            }
            (Op::Read, Plain::Sliding(_)) => {
                pipe.cmd("MGET").arg(&k).arg(self.prev_key(base, now));
            }
            (Op::Add(n), _) => {
                pipe.atomic()
                    .cmd("INCRBY")
                    .arg(&k)
                    .arg(n)
                    .cmd("PEXPIRE")
                    .arg(&k)
                    .arg(self.ttl_ms(now, explicit))
                    .arg("NX")
                    .ignore();
                if n > 0 && matches!(self, Plain::Sliding(_)) {
                    pipe.cmd("GET").arg(self.prev_key(base, now));
                }
            }
        }
        pipe
    }

    /// The decision for a check of `cost` at `now` when this window's count was `before`
    /// (before this call's own cost) and the previous window's `prev`: the in-memory
    /// algorithm's own, over those counts (its packed state: src/algo/*.rs's module docs).
    pub(crate) fn decide(&self, before: u64, prev: u64, now: u64, cost: u64) -> Decision {
        let full = now / self.window();
        let (before, prev) = (before.min(self.max_count()), prev.min(self.max_count()));
        match self {
            Plain::Fixed(p) => {
                use fixed_window::{COUNT_BITS, INDEX_BITS};
                let idx = full & ((1 << INDEX_BITS) - 1);
                fixed_window::decide((idx << COUNT_BITS) | before, now, p, cost).1
            }
            Plain::Sliding(p) => {
                use sliding_window::{COUNT_BITS, INDEX_BITS};
                let idx = full & ((1 << INDEX_BITS) - 1);
                let state = (idx << (2 * COUNT_BITS)) | (prev << COUNT_BITS) | before;
                sliding_window::decide(state, now, p, cost).1
            }
        }
    }

    /// Whether a check of `cost` adds it to the count (else it only reads): a cost that fits
    /// at all (a never-fitting one changes nothing, as in memory).
    pub(crate) fn adds(&self, cost: u64) -> bool {
        cost > 0 && cost <= self.limit()
    }

    /// Whether a check that added its cost and got `d` must give the cost back: a refusal,
    /// unless the limit counts denials (and the request could ever fit: one that cannot, at
    /// the end of the clock, is not counted, as in memory).
    pub(crate) fn undoes(&self, d: &Decision) -> bool {
        !d.allowed() && (!self.count_denied() || d.retry_after_ns.is_none())
    }

    /// The count's ceiling for a refund (plain.lua): a limit counting denials saturates its
    /// counter where the in-memory one does; 0 (none) otherwise, where a count above the
    /// limit holds refused costs about to be given back, which must stay counted.
    pub(crate) fn ceiling(&self) -> u64 {
        if self.count_denied() {
            self.max_count()
        } else {
            0
        }
    }
}

/// The counts in a reply of [`Plain::pipeline`] (a transaction's or a read's), in order: the
/// window's (`INCRBY`'s or `GET`'s) and, for sliding_window, the previous window's; absent
/// keys read 0. Below 0 only in a window whose key expired before a refusal gave its cost
/// back (the caller adds it back).
pub(crate) fn counts(v: &[Value]) -> Result<(i64, i64), Error> {
    let bad = || Error::Reply(format!("{v:?}"));
    let vals = match v {
        [Value::Array(a)] => &a[..],
        _ => v,
    };
    let one = |x: Option<&Value>| -> Result<i64, Error> {
        match x {
            None | Some(Value::Nil) => Ok(0),
            Some(Value::Int(n)) => Ok(*n),
            Some(Value::BulkString(b)) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(bad),
            Some(Value::ServerError(e)) => Err(Error::Reply(format!("{e:?}"))),
            Some(_) => Err(bad()),
        }
    };
    if vals.is_empty() {
        return Err(bad());
    }
    Ok((one(vals.first())?, one(vals.get(1))?))
}
