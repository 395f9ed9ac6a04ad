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

use crate::store::{Error, EXPLICIT_NOW_TTL_SLACK_MS};
use redis::{Pipeline, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use turnstile::algo::fixed_window::{self, Params, COUNT_BITS, INDEX_BITS, MAX_LIMIT};
use turnstile::Decision;

/// Milliseconds a window's key outlives the window's end by the caller's clock: callers whose
/// clocks are behind by up to this still find the window's count (a caller farther behind
/// starts the window afresh, and may admit up to the limit again in it).
pub const PLAIN_CLOCK_SLACK_MS: u64 = 1_000;

/// What one plain call does.
pub(crate) enum Op {
    /// Read the count (`GET`: a peek, or a cost that never fits).
    Read,
    /// Add to the count (negative: give back a refused cost), in a transaction that gives a
    /// new key its TTL.
    Add(i64),
}

/// The parameters of the store's one fixed_window limit.
#[derive(Clone, Debug)]
pub(crate) struct Plain {
    pub(crate) p: Params,
}

/// Now by the caller's clock, in ns since the Unix epoch (0 before it; u64 until 2554).
pub(crate) fn caller_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Plain {
    /// The key of the window holding `now` for the record key `base`.
    pub(crate) fn key(&self, base: &str, now: u64) -> String {
        format!("{base}:{}", now / self.p.window)
    }

    /// The TTL of the window's key at `now`: ms to the window's end, rounded up, plus the
    /// slack (the explicit-now slack when `now` was given).
    fn ttl_ms(&self, now: u64, explicit: bool) -> u64 {
        let w = u128::from(self.p.window);
        let end = (u128::from(now) / w + 1) * w;
        let ms = (end - u128::from(now)).div_ceil(1_000_000) as u64;
        ms + if explicit {
            EXPLICIT_NOW_TTL_SLACK_MS
        } else {
            PLAIN_CLOCK_SLACK_MS
        }
    }

    /// The transaction (or read) of `op` on `key` at `now`.
    pub(crate) fn pipeline(&self, key: &str, now: u64, explicit: bool, op: Op) -> Pipeline {
        let mut pipe = redis::pipe();
        match op {
            Op::Read => {
                pipe.cmd("GET").arg(key);
            }
            Op::Add(n) => {
                pipe.atomic()
                    .cmd("INCRBY")
                    .arg(key)
                    .arg(n)
                    .cmd("PEXPIRE")
                    .arg(key)
                    .arg(self.ttl_ms(now, explicit))
                    .arg("NX")
                    .ignore();
            }
        }
        pipe
    }

    /// The decision for a check of `cost` at `now` when the window's count was `before`
    /// (before this call's own cost): the in-memory algorithm's own, over that count.
    pub(crate) fn decide(&self, before: u64, now: u64, cost: u64) -> Decision {
        let idx = (now / self.p.window) & ((1 << INDEX_BITS) - 1);
        let state = (idx << COUNT_BITS) | before.min(MAX_LIMIT);
        fixed_window::decide(state, now, &self.p, cost).1
    }

    /// Whether a check of `cost` adds it to the count (else it only reads): a cost that fits
    /// at all (a never-fitting one changes nothing, as in memory).
    pub(crate) fn adds(&self, cost: u64) -> bool {
        cost > 0 && cost <= self.p.limit
    }

    /// The count's ceiling for a refund (plain.lua): a limit counting denials saturates its
    /// counter at [`MAX_LIMIT`], as in memory; 0 (none) otherwise, where a count above the
    /// limit holds refused costs about to be given back, which must stay counted.
    pub(crate) fn ceiling(&self) -> u64 {
        if self.p.count_denied {
            MAX_LIMIT
        } else {
            0
        }
    }

    /// Whether an admission refused with the count `after` (this call's cost included) must
    /// give the cost back: unless the limit counts denials.
    pub(crate) fn undoes(&self, after: i64) -> bool {
        after > self.p.limit as i64 && !self.p.count_denied
    }
}

/// The count in a reply of [`Plain::pipeline`]: `GET`'s (nil: 0), or `INCRBY`'s (negative,
/// below 0, only in a window whose key expired before a refusal gave its cost back: 0).
pub(crate) fn count(v: &[Value]) -> Result<i64, Error> {
    let bad = || Error::Reply(format!("{v:?}"));
    let mut cur = v.first().ok_or_else(bad)?;
    if let Value::Array(a) = cur {
        cur = a.first().ok_or_else(bad)?;
    }
    match cur {
        Value::Nil => Ok(0),
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad),
        Value::ServerError(e) => Err(Error::Reply(format!("{e:?}"))),
        _ => Err(bad()),
    }
}
