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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use turnstile::rules::{Backend, Rules, RulesError};
use turnstile_redis::{FailureStats, RedisRules};

/// How long a reload or the start waits for a new backend's connection (turnstile-redis gives
/// up after 2 s; this bounds the wait for its answer).
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// How long the shutdown waits for the leases to be given back (one pipelined call per
/// node; a Redis away times out by the store's own timeout).
const RETURN_WAIT: Duration = Duration::from_secs(2);

/// The backend in use and the runtime its Redis connections were made on.
pub(crate) struct Backends {
    current: arc_swap::ArcSwapOption<RedisRules>,
    /// Whether `current` holds a backend: read first, so that a server whose counts are in
    /// memory pays one relaxed load per rules command, not arc-swap's load.
    active: AtomicBool,
    runtime: Mutex<Option<Runtime>>,
    /// Failure counts of the Redis backends a reload replaced, so that the metrics stay
    /// monotonic.
    retired: Mutex<FailureStats>,
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
}

impl Backends {
    pub(crate) fn new() -> Self {
        Self {
            current: arc_swap::ArcSwapOption::empty(),
            active: AtomicBool::new(false),
            runtime: Mutex::new(None),
            retired: Mutex::new(FailureStats::default()),
        }
    }

    /// The Redis backend, if the rules keep their counts there.
    #[inline]
    pub(crate) fn redis(&self) -> Option<Arc<RedisRules>> {
        // Relaxed: advisory; `current` is read through arc-swap, which orders what it holds.
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        self.current.load_full()
    }

    /// `"redis"` or `"memory"`.
    pub(crate) fn name(&self) -> &'static str {
        if self.current.load().is_some() {
            "redis"
        } else {
            "memory"
        }
    }

    /// Checks `rules` against their backend and connects a new Redis backend if their
    /// `[backend]` table differs from the current one. Nothing changes yet.
    pub(crate) fn prepare(&self, rules: &Rules) -> Result<Change, RulesError> {
        let b = match &rules.backend {
            Backend::Memory => {
                return Ok(if self.current.load().is_some() {
                    Change::Memory
                } else {
                    Change::Keep
                })
            }
            Backend::Redis(_) => RedisRules::check(rules)?,
        };
        if let Some(cur) = &*self.current.load() {
            if cur.backend() == b {
                return Ok(Change::Keep);
            }
        }
        let handle = self
            .handle()
            .map_err(|e| rules.backend_error(format!("cannot start the Redis runtime: {e}")))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let r = rules.clone();
        handle.spawn(async move {
            let _ = tx.send(RedisRules::connect(&r).await);
        });
        match rx.recv_timeout(CONNECT_WAIT) {
            Ok(r) => Ok(Change::Redis(Arc::new(r?))),
            Err(_) => Err(rules.backend_error(format!(
                "no answer from Redis within {CONNECT_WAIT:?}; check that it is up and reachable"
            ))),
        }
    }

    /// Applies `change` after the engine took `rules`.
    pub(crate) fn commit(&self, change: Change, rules: &Rules) {
        let old = match change {
            Change::Keep => {
                if let Some(cur) = &*self.current.load() {
                    // Same table: the insurance rules follow (checked by `prepare`).
                    if let Err(e) = cur.reload(rules) {
                        tracing::error!(error = %e, "the insurance rules were not reloaded");
                    }
                }
                return;
            }
            Change::Memory => self.current.swap(None),
            Change::Redis(r) => self.current.swap(Some(r)),
        };
        // Relaxed: see `redis`.
        self.active
            .store(self.current.load().is_some(), Ordering::Relaxed);
        if let Some(old) = old {
            let mut t = self.retired.lock().unwrap_or_else(|e| e.into_inner());
            add(&mut t, old.stats());
        }
        tracing::info!(backend = self.name(), "rules backend in use");
    }

    /// The failure counts of every Redis backend so far, and whether the current one's circuit
    /// is open; `None` if no Redis backend was ever used.
    pub(crate) fn stats(&self) -> Option<(FailureStats, bool)> {
        let t = *self.retired.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.current.load();
        if cur.is_none() && t == FailureStats::default() {
            return None;
        }
        let mut s = t;
        let mut open = false;
        if let Some(c) = &*cur {
            add(&mut s, c.stats());
            open = c.circuit_open();
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
        self.current
            .load()
            .as_ref()
            .map_or_else(Vec::new, |r| r.lease_stats())
    }

    /// Stops the Redis runtime (after the workers stopped): its connections close. What the
    /// backend's leases hold is given back first, within [`RETURN_WAIT`], so a rolling
    /// restart strands nothing.
    pub(crate) fn shutdown(&self) {
        // Relaxed: see `redis`.
        self.active.store(false, Ordering::Relaxed);
        let current = self.current.swap(None);
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
