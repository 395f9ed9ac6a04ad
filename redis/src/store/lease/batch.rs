//! One-by-one checks of a leased store gathered into one function call: the keys a node
//! checks in Redis (too rarely checked to be leased, or a window's first check) while
//! another such call is on its way go together in the next one (op "m" of store.lua), so
//! that Redis runs one function call — whose fixed cost is most of a check's — for many.
//!
//! Group commit, no timer: a check queues its key; if no call is in flight it starts one (a
//! task of its own, so that a caller dropped mid-call strands no one); that task sends what
//! is queued, answers each caller, and goes on while checks are queued. A lone check waits
//! for nothing; under load a call carries what queued during the previous one. One Redis
//! server only (a Cluster's keys live in different slots).

use super::Tier;
use crate::call::{fcall, Caller};
use crate::error::Error;
use crate::reply;
use redis::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use turnstile::Decision;

/// Keys in one call (what a call carries at most; the rest go in the next).
const MAX_BATCH: usize = 64;
/// Checks queued at most; a check that finds the queue full goes to Redis alone.
const MAX_QUEUED: usize = 1024;

/// A check waiting for the next call.
struct Queued {
    keys: Vec<String>,
    field: Vec<u8>,
    cost: u64,
    tx: oneshot::Sender<Result<Decision, Error>>,
}

/// The queue of a store's one-by-one checks and whether a call is in flight.
#[derive(Default)]
pub(crate) struct Batch {
    /// A lock, not a lock-free queue: taken for a push or a drain, only by checks that go to
    /// Redis anyway (a round trip is ~10^4 times the lock's uncontended cost).
    queue: Mutex<Vec<Queued>>,
    busy: AtomicBool,
}

/// What a batch call needs of the store.
pub(crate) struct Io {
    pub(crate) caller: Caller,
    pub(crate) spec: String,
}

impl Batch {
    /// Queues a check of `cost` for the key named `keys` (its records, with `field` in the
    /// packed layout) and answers it from the next call, or a timeout after `io_timeout`;
    /// `None`: the queue is full (check alone).
    pub(crate) async fn check(
        &self,
        tier: &Arc<Tier>,
        io: impl FnOnce() -> Io,
        keys: Vec<String>,
        field: Vec<u8>,
        cost: u64,
        io_timeout: std::time::Duration,
    ) -> Option<Result<Decision, Error>> {
        let (tx, rx) = oneshot::channel();
        {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() >= MAX_QUEUED {
                return None;
            }
            q.push(Queued {
                keys,
                field,
                cost,
                tx,
            });
        }
        // AcqRel: one caller (or the running task) wins; the queue's lock orders the push
        // before the task's last look at the queue (`run`).
        if !self.busy.swap(true, Ordering::AcqRel) {
            tokio::spawn(run(Arc::clone(tier), io()));
        }
        // Within the per-call timeout from now, as a call of its own would be, though the
        // call in flight may have to end first (the check, sent later, may still count).
        Some(match tokio::time::timeout(io_timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Error::Reply("the batched call was dropped".into())),
            Err(_) => Err(Error::Timeout(io_timeout)),
        })
    }
}

/// Sends what is queued, call after call, until the queue is empty.
async fn run(tier: Arc<Tier>, io: Io) {
    let batch = &tier.batch;
    loop {
        let due: Vec<Queued> = {
            let mut q = batch.queue.lock().unwrap_or_else(|p| p.into_inner());
            let n = q.len().min(MAX_BATCH);
            q.drain(..n).collect()
        };
        if due.is_empty() {
            // Release: a caller that then finds `busy` false starts a task; one that pushed
            // before our look below is seen by it.
            batch.busy.store(false, Ordering::Release);
            let queued = !batch
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty();
            if queued && !batch.busy.swap(true, Ordering::AcqRel) {
                continue;
            }
            return;
        }
        tier.counters().call(false);
        send(&io, due).await;
    }
}

/// One call for `due`, each caller answered.
async fn send(io: &Io, due: Vec<Queued>) {
    let keys: Vec<&str> = due
        .iter()
        .flat_map(|q| q.keys.iter().map(String::as_str))
        .collect();
    let mut args: Vec<&[u8]> = Vec::with_capacity(2 + 2 * due.len());
    let costs: Vec<String> = due.iter().map(|q| q.cost.to_string()).collect();
    args.push(io.spec.as_bytes());
    args.push(b"m");
    for (q, c) in due.iter().zip(&costs) {
        args.push(c.as_bytes());
        args.push(&q.field);
    }
    let cmd = fcall(io.caller.store_fn(), &keys, args);
    let answers = match io.caller.call(&cmd).await {
        Ok(Value::Array(vs)) if vs.len() == due.len() => vs,
        Ok(v) => {
            let e = reply::bad(&v);
            return due.into_iter().for_each(|q| {
                let _ = q.tx.send(Err(copy(&e)));
            });
        }
        Err(e) => {
            return due.into_iter().for_each(|q| {
                let _ = q.tx.send(Err(copy(&e)));
            });
        }
    };
    for (q, v) in due.into_iter().zip(&answers) {
        let _ = q.tx.send(reply::store(v).map(|(d, _)| d));
    }
}

/// The error of a call, for each of its callers.
fn copy(e: &Error) -> Error {
    match e {
        Error::Timeout(t) => Error::Timeout(*t),
        Error::Redis(r) => Error::Redis(redis::RedisError::from((
            r.kind(),
            "a batched call failed",
            r.to_string(),
        ))),
        e => Error::Reply(e.to_string()),
    }
}
