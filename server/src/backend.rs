//! Where the rules' counts live: the engine's own stores (memory, the default) or Redis, as
//! the rules file's `[backend]` table says (turnstile-redis's `RedisRules`, which executes the
//! engine's plans in Redis). `TURNSTILE.CHECK`, `PEEK`, `REFUND` and `POST /v1/check` ask
//! whichever is current, awaited on the worker's runtime; `CL.THROTTLE` always stays in
//! memory.
//!
//! The Redis connections are made on a runtime thread of their own (`turnstile-redis`), so
//! that they outlive any one worker's connections and a reload can connect from the control
//! thread; workers await their calls over the connections' channels. A reload that changes
//! the `[backend]` table connects the new backend first (a Redis that cannot be reached
//! refuses the reload, and the old rules and backend stay), then reloads the engine, then
//! switches: a request planned just before the switch is decided by the backend it started
//! with. A reload that keeps the table keeps the backend (its connection and its counts).
//!
//! At the start, a Redis that cannot be reached does not stop the server: it starts with the
//! backend *connecting* (`connecting`), not ready, every check answered by the backend's
//! failure policy, and connects in the background until Redis answers.

mod connecting;

pub(crate) use connecting::Connecting;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use turnstile::rules::{Backend, Engine, Request, Rules, RulesError, Verdict};
use turnstile::Clock;
use turnstile_redis::{FailureStats, RedisRules, UnconnectedRules};

/// How long a reload or the start waits for a new backend's connection (turnstile-redis gives
/// up after 2 s; this bounds the wait for its answer).
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// How long the shutdown waits for the leases to be given back (one pipelined call per
/// node; a Redis away times out by the store's own timeout).
const RETURN_WAIT: Duration = Duration::from_secs(2);

/// The backend in use and the runtime its Redis connections were made on.
pub(crate) struct Backends {
    slots: Arc<Slots>,
    runtime: Mutex<Option<Runtime>>,
}

/// Which backend is in use, shared with the task that connects a Redis not reached at the
/// start.
struct Slots {
    current: arc_swap::ArcSwapOption<RedisRules>,
    /// A Redis not reached yet (at most one of `current` and `pending` holds a backend).
    pending: arc_swap::ArcSwapOption<Connecting>,
    /// Whether `current` or `pending` holds a backend: read first, so that a server whose
    /// counts are in memory pays one relaxed load per rules command, not arc-swap's load.
    active: AtomicBool,
    /// Failure counts of the Redis backends a reload replaced, so that the metrics stay
    /// monotonic.
    retired: Mutex<FailureStats>,
    /// Held while the backend in use changes (a reload's commit, a connection made in the
    /// background), so that the two never cross.
    switch: Mutex<()>,
}

/// The Redis backend a check goes to.
pub(crate) enum Remote {
    /// Connected: Redis decides (its failure policy when it does not answer in time).
    Connected(Arc<RedisRules>),
    /// Not reached since the start: the failure policy decides.
    Connecting(Arc<Connecting>),
}

impl Remote {
    /// [`RedisRules::explain`], or the failure policy's answer while connecting.
    pub(crate) async fn explain<C: Clock>(&self, engine: &Engine<C>, req: &Request<'_>) -> Verdict {
        match self {
            Remote::Connected(r) => r.explain(engine, req).await,
            Remote::Connecting(c) => c.rules.explain(engine, req),
        }
    }

    /// [`RedisRules::refund`]: the number of rules given the cost back, or why Redis did not
    /// take it (while connecting, never: the insurance rules, if any, take it all the same).
    pub(crate) async fn refund<C: Clock>(
        &self,
        engine: &Engine<C>,
        req: &Request<'_>,
    ) -> Result<u32, String> {
        match self {
            Remote::Connected(r) => r.refund(engine, req).await.map_err(|e| e.to_string()),
            Remote::Connecting(c) => {
                c.rules.refund(req);
                Err(
                    "Redis has not been reached since the start (connecting in the background)"
                        .into(),
                )
            }
        }
    }
}

struct Runtime {
    handle: tokio::runtime::Handle,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: JoinHandle<()>,
}

/// What a reload will do to the backend, decided (and connected) before the engine reloads.
pub(crate) enum Change {
    /// Keep the current one (memory stays memory; the same Redis table keeps its backend).
    Keep,
    /// Switch to memory.
    Memory,
    /// Switch to this newly connected Redis backend.
    Redis(Arc<RedisRules>),
    /// At the start: a Redis not reached, connected in the background.
    Connecting(Arc<Connecting>),
}

impl Backends {
    pub(crate) fn new() -> Self {
        Self {
            slots: Arc::new(Slots {
                current: arc_swap::ArcSwapOption::empty(),
                pending: arc_swap::ArcSwapOption::empty(),
                active: AtomicBool::new(false),
                retired: Mutex::new(FailureStats::default()),
                switch: Mutex::new(()),
            }),
            runtime: Mutex::new(None),
        }
    }

    /// The Redis backend, if the rules keep their counts there.
    #[inline]
    pub(crate) fn redis(&self) -> Option<Remote> {
        let s = &*self.slots;
        // Relaxed: advisory; the slots are read through arc-swap, which orders what they hold.
        if !s.active.load(Ordering::Relaxed) {
            return None;
        }
        match s.current.load_full() {
            Some(r) => Some(Remote::Connected(r)),
            None => s.connecting(),
        }
    }

    /// `"redis"` or `"memory"`.
    pub(crate) fn name(&self) -> &'static str {
        if self.slots.in_use() {
            "redis"
        } else {
            "memory"
        }
    }

    /// Checks `rules` against their backend and connects a new Redis backend if their
    /// `[backend]` table differs from the current one. Nothing changes yet. A Redis that
    /// cannot be reached refuses `rules`, unless `at_start`: then the backend is
    /// [`Change::Connecting`] (what the rules themselves get wrong is refused all the same).
    pub(crate) fn prepare(&self, rules: &Rules, at_start: bool) -> Result<Change, RulesError> {
        let b = match &rules.backend {
            Backend::Memory => {
                return Ok(if self.slots.in_use() {
                    Change::Memory
                } else {
                    Change::Keep
                })
            }
            Backend::Redis(_) => RedisRules::check(rules)?,
        };
        if let Some(cur) = &*self.slots.current.load() {
            if cur.backend() == b {
                return Ok(Change::Keep);
            }
        }
        if let Some(p) = &*self.slots.pending.load() {
            if p.rules.backend() == b {
                return Ok(Change::Keep);
            }
        }
        let unconnected = if at_start {
            Some(UnconnectedRules::new(rules)?)
        } else {
            None
        };
        let handle = self
            .handle()
            .map_err(|e| rules.backend_error(format!("cannot start the Redis runtime: {e}")))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let r = rules.clone();
        handle.spawn(async move {
            let _ = tx.send(RedisRules::connect(&r).await);
        });
        let e = match rx.recv_timeout(CONNECT_WAIT) {
            Ok(Ok(r)) => return Ok(Change::Redis(Arc::new(r))),
            Ok(Err(e)) => e,
            Err(_) => rules.backend_error(format!(
                "no answer from Redis within {CONNECT_WAIT:?}; check that it is up and reachable"
            )),
        };
        match unconnected {
            Some(u) => {
                tracing::warn!(error = %e, "the Redis of [backend] does not answer: starting not ready, checks answered by its failure policy; connecting in the background");
                Ok(Change::Connecting(Arc::new(Connecting::new(
                    u,
                    rules.clone(),
                    e.to_string(),
                ))))
            }
            None => Err(e),
        }
    }

    /// Applies `change` after the engine took `rules`.
    pub(crate) fn commit(&self, change: Change, rules: &Rules) {
        let s = &*self.slots;
        let _switching = s.switch.lock().unwrap_or_else(|e| e.into_inner());
        // Held across the switch, as `stats` holds it across its reads: the metrics never see
        // a retired backend's counts twice or not at all.
        let mut t = s.retired.lock().unwrap_or_else(|e| e.into_inner());
        let (old, old_pending) = match change {
            Change::Keep => {
                if let Some(cur) = &*s.current.load() {
                    // Same table: the insurance rules follow (checked by `prepare`).
                    if let Err(e) = cur.reload(rules) {
                        tracing::error!(error = %e, "the insurance rules were not reloaded");
                    }
                } else if let Some(p) = &*s.pending.load() {
                    p.follow(rules);
                }
                return;
            }
            Change::Memory => (s.current.swap(None), s.pending.swap(None)),
            Change::Redis(r) => (s.current.swap(Some(r)), s.pending.swap(None)),
            Change::Connecting(p) => {
                let old = (s.current.swap(None), s.pending.swap(Some(p.clone())));
                match self.handle() {
                    Ok(h) => drop(h.spawn(connecting::reconnect(self.slots.clone(), p))),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the Redis runtime: the backend stays unconnected")
                    }
                }
                old
            }
        };
        // Relaxed: see `redis`.
        s.active.store(s.in_use(), Ordering::Relaxed);
        if let Some(old) = old {
            add(&mut t, old.stats());
        }
        if let Some(old) = old_pending {
            add(&mut t, old.rules.stats());
        }
        drop(t);
        tracing::info!(backend = self.name(), "rules backend in use");
    }

    /// The failure counts of every Redis backend so far, and whether the current one's circuit
    /// is open; `None` if no Redis backend was ever used.
    /// (The circuit counts as open while the backend is still connecting.)
    pub(crate) fn stats(&self) -> Option<(FailureStats, bool)> {
        let sl = &*self.slots;
        let t = sl.retired.lock().unwrap_or_else(|e| e.into_inner());
        let (cur, pending) = (sl.current.load(), sl.pending.load());
        if cur.is_none() && pending.is_none() && *t == FailureStats::default() {
            return None;
        }
        let mut s = *t;
        drop(t);
        let mut open = false;
        if let Some(c) = &*cur {
            add(&mut s, c.stats());
            open = c.circuit_open();
        }
        if let Some(p) = &*pending {
            add(&mut s, p.rules.stats());
            open = true;
        }
        Some((s, open))
    }

    /// The Redis runtime's handle, its thread started on first use.
    fn handle(&self) -> std::io::Result<tokio::runtime::Handle> {
        let mut g = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = &*g {
            return Ok(r.handle.clone());
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(crate::trim::park)
            .build()?;
        let handle = rt.handle().clone();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("turnstile-redis".into())
            .spawn(move || {
                rt.block_on(async move {
                    let _ = rx.await;
                });
            })?;
        *g = Some(Runtime {
            handle: handle.clone(),
            stop,
            thread,
        });
        Ok(handle)
    }

    /// What each leased rule of the backend in use did with its leases (since it was
    /// connected: a new backend starts from 0, as a restarted process does).
    pub(crate) fn lease_stats(&self) -> Vec<(String, turnstile_redis::LeaseStats)> {
        self.slots
            .current
            .load()
            .as_ref()
            .map_or_else(Vec::new, |r| r.lease_stats())
    }

    /// Stops the Redis runtime (after the workers stopped): its connections close. What the
    /// backend's leases hold is given back first, within [`RETURN_WAIT`], so a rolling
    /// restart strands nothing.
    pub(crate) fn shutdown(&self) {
        // Relaxed: see `redis`.
        self.slots.active.store(false, Ordering::Relaxed);
        self.slots.pending.swap(None);
        let current = self.slots.current.swap(None);
        let handle = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|r| r.handle.clone());
        if let (Some(r), Some(h)) = (current, handle) {
            let (tx, rx) = std::sync::mpsc::channel();
            h.spawn(async move {
                r.return_leases().await;
                let _ = tx.send(());
            });
            if rx.recv_timeout(RETURN_WAIT).is_err() {
                tracing::warn!(
                    "the leases were not all given back within {RETURN_WAIT:?}; what they hold comes back when they end"
                );
            }
        }
        let r = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(r) = r {
            let _ = r.stop.send(());
            let _ = r.thread.join();
        }
    }
}

impl Slots {
    /// Whether a Redis backend is in use (connected or connecting).
    fn in_use(&self) -> bool {
        self.current.load().is_some() || self.pending.load().is_some()
    }

    /// The backend connecting, or the one it just became.
    #[cold]
    fn connecting(&self) -> Option<Remote> {
        if let Some(p) = self.pending.load_full() {
            return Some(Remote::Connecting(p));
        }
        // Connected between the two loads: `current` is set before `pending` is cleared.
        self.current.load_full().map(Remote::Connected)
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        // A server that failed to start, or was dropped without `join`, stops the thread too.
        self.shutdown();
    }
}

/// Adds `x` to `to`: the counts the metrics show (every one but the cached denials).
fn add(to: &mut FailureStats, x: FailureStats) {
    to.redis += x.redis;
    to.timeouts += x.timeouts;
    to.errors += x.errors;
    to.short_circuited += x.short_circuited;
    to.fallbacks += x.fallbacks;
    to.opened += x.opened;
}
