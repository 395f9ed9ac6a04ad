//! Giving leases back: the sweep of the lease table (idle keys, ended leases, or everything
//! on shutdown and reload), the background task that runs it, and the store's calls for it.

use super::check::op;
use super::settle::{Take, Taken};
use super::{LeaseMode, LeaseStats, Tier};
use crate::call::{fcall, Caller};
use crate::layout::Layout;
use crate::store::RedisStore;
use redis::{Cmd, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Give-backs per pipeline (one node).
const PIPELINE: usize = 256;

/// What a sweep needs to call Redis: the store's caller and names (clones; the background
/// task outlives no store but the one it was started for, and holds no reference to it).
#[derive(Clone)]
pub(crate) struct Io {
    caller: Caller,
    layout: Layout,
    spec: String,
    limits: usize,
}

impl Io {
    pub(crate) fn of(s: &RedisStore) -> Self {
        Self {
            caller: s.caller.clone(),
            layout: s.layout.clone(),
            spec: s.spec.clone(),
            limits: s.limits.limits().len(),
        }
    }

    /// The call giving `t` back: a refund in the lease's window (reserve), or a record of
    /// the unrecorded admissions (delayed: a lease call of no request).
    fn call(&self, t: &Taken, mode: LeaseMode, now: Option<u64>) -> Option<Cmd> {
        let key = std::str::from_utf8(&t.key).ok()?;
        let names = self.layout.names(key);
        let field = names.field.unwrap_or_default();
        let f = self.caller.store_fn();
        Some(match mode {
            LeaseMode::Reserve => {
                let args = (&self.spec, op('g', now), t.amount, field, t.epoch, &t.ends);
                fcall(f, &names.keys, args)
            }
            LeaseMode::Delayed { .. } => {
                let args = (&self.spec, op('l', now), 0, field, 0, 0, t.amount, 0);
                fcall(f, &names.keys, args)
            }
        })
    }

    /// The calls, in pipelines (one node) or concurrently (a cluster); an error per call that
    /// failed.
    async fn run(&self, cmds: &[Cmd]) -> Vec<Option<Value>> {
        if self.caller.conn().is_cluster() {
            let calls = cmds.iter().map(|c| self.caller.call(c));
            let out = futures_util::future::join_all(calls).await;
            return out.into_iter().map(Result::ok).collect();
        }
        let mut out = Vec::with_capacity(cmds.len());
        for chunk in cmds.chunks(PIPELINE) {
            match self.caller.pipeline(chunk).await {
                Ok(vals) => out.extend(vals.into_iter().map(Some)),
                Err(_) => out.extend(chunk.iter().map(|_| None)),
            }
        }
        out
    }
}

/// Sweeps `tier` at the node's time or `explicit`: takes what should go back (`all`:
/// everything held) and gives it back, counting what Redis took back and what it did not.
pub(crate) async fn sweep(io: &Io, tier: &Tier, explicit: Option<u64>, all: bool) {
    let now = tier.now(explicit);
    let mut due = Vec::new();
    tier.listed.due(now, all, |slot, id| due.push((slot, id)));
    let (shape, counters) = (tier.shape(), tier.counters());
    let idle = tier.cfg.idle.as_nanos() as u64;
    let mut taken = Vec::new();
    for (slot, id) in due {
        // Out of the list first: a grant settled meanwhile lists the key again.
        tier.listed.remove(slot, id);
        let mut op = Take {
            shape,
            counters,
            now,
            idle,
            all,
        };
        let (t, again) = tier.table.update(id, now, &mut op);
        if let Some(at) = again {
            tier.listed.add(id, at);
        }
        taken.extend(t);
    }
    let mode = shape.mode;
    let (mut cmds, mut sent) = (Vec::new(), Vec::new());
    for t in taken {
        match io.call(&t, mode, explicit) {
            Some(c) => {
                cmds.push(c);
                sent.push(t);
            }
            None => counters.lapse(t.amount),
        }
    }
    for _ in &cmds {
        counters.call(false);
    }
    for (t, v) in sent.iter().zip(io.run(&cmds).await) {
        match (mode, v) {
            (LeaseMode::Reserve, Some(Value::Int(m))) if m as u64 == t.amount => {
                counters.returned(t.amount)
            }
            (LeaseMode::Reserve, _) => counters.lapse(t.amount),
            (LeaseMode::Delayed { .. }, Some(v)) => {
                let flushed = super::settle::parse_grant(&v, io.limits).map_or(0, |(_, f)| f);
                counters.unrecorded(t.amount.saturating_sub(flushed));
            }
            (LeaseMode::Delayed { .. }, None) => counters.unrecorded(t.amount),
        }
    }
}

/// The background sweeper of `tier`, every `every`, until the store is dropped; then one
/// last sweep gives everything back.
async fn sweeper(io: Io, tier: Arc<Tier>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let closed = tier.is_closed();
        sweep(&io, &tier, None, closed).await;
        if closed {
            return;
        }
    }
}

impl RedisStore {
    /// Starts the background sweeper if the store leases with one and a tokio runtime is
    /// running (else the leases are given back only by explicit sweeps).
    pub(crate) fn start_sweeper(&self) {
        let Some(tier) = &self.tier else { return };
        let Some(every) = tier.cfg.sweep else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(sweeper(Io::of(self), Arc::clone(tier), every));
    }

    /// What the store's leases did so far (`None` without leases).
    pub fn lease_stats(&self) -> Option<LeaseStats> {
        self.tier.as_ref().map(|t| t.stats())
    }

    /// Gives back what idle keys and ended leases hold (what the background task does every
    /// [`crate::Leases::sweep_every`]).
    pub async fn sweep_leases(&self) {
        if let Some(t) = &self.tier {
            sweep(&Io::of(self), t, None, false).await;
        }
    }

    /// [`RedisStore::sweep_leases`] at an explicit `now` (the time of `check_at`).
    pub async fn sweep_leases_at(&self, now: u64) {
        if let Some(t) = &self.tier {
            sweep(&Io::of(self), t, Some(now), false).await;
        }
    }

    /// Gives back everything this node holds (shutdown, reload); delayed mode records what it
    /// has not yet recorded. Leases are taken again by later checks.
    pub async fn return_leases(&self) {
        if let Some(t) = &self.tier {
            sweep(&Io::of(self), t, None, true).await;
        }
    }

    /// [`RedisStore::return_leases`] at an explicit `now`.
    pub async fn return_leases_at(&self, now: u64) {
        if let Some(t) = &self.tier {
            sweep(&Io::of(self), t, Some(now), true).await;
        }
    }
}

impl Drop for RedisStore {
    /// A store with leases gives back what it holds in the background: its sweeper's last
    /// sweep, or one spawned on the current tokio runtime (none: what it holds is stranded
    /// until its leases end).
    fn drop(&mut self) {
        let Some(tier) = &self.tier else { return };
        // Release: the sweeper's Acquire sees every record written before.
        tier.closed.store(true, Ordering::Release);
        if tier.cfg.sweep.is_some() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (io, tier) = (Io::of(self), Arc::clone(tier));
            rt.spawn(async move { sweep(&io, &tier, None, true).await });
        }
    }
}
