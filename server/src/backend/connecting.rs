//! A `[backend]` Redis that did not answer at the start: [`Connecting`] stands for it (checks
//! answered by the failure policy, readiness refused with the last error), and [`reconnect`]
//! tries again in the background — after [`FIRST_RETRY`], the wait doubling to at most
//! [`MAX_RETRY`] — until Redis answers, then puts the connected backend in use.

use super::{add, Slots};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use turnstile::rules::Rules;
use turnstile_redis::{RedisRules, UnconnectedRules};

/// The first wait before connecting again.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest wait between two attempts (each attempt gives up after turnstile-redis's
/// connect timeout, 2 s).
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(5);

/// A Redis backend not reached since the start.
pub(crate) struct Connecting {
    /// What answers meanwhile: the failure policy.
    pub(crate) rules: UnconnectedRules,
    /// The rules as last loaded (a reload that keeps the `[backend]` table updates them):
    /// what the backend is connected for.
    latest: Mutex<Rules>,
    /// Why the last attempt failed.
    error: Mutex<String>,
    /// Attempts so far.
    attempts: AtomicU64,
}

impl Connecting {
    pub(crate) fn new(rules: UnconnectedRules, latest: Rules, error: String) -> Self {
        Self {
            rules,
            latest: Mutex::new(latest),
            error: Mutex::new(error),
            attempts: AtomicU64::new(1),
        }
    }

    /// Why it is not connected: the last attempt's error, and how many were made.
    pub(crate) fn reason(&self) -> String {
        let e = self.error.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Relaxed: a count for a message.
        let n = self.attempts.load(Ordering::Relaxed);
        format!(
            "the Redis of [backend] has not answered since the start ({n} attempts, retried every {} s at most): {e}",
            MAX_RETRY.as_secs()
        )
    }

    /// Follows a reload that keeps the `[backend]` table.
    pub(crate) fn follow(&self, rules: &Rules) {
        if let Err(e) = self.rules.reload(rules) {
            tracing::error!(error = %e, "the insurance rules were not reloaded");
        }
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = rules.clone();
    }

    fn latest(&self) -> Rules {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Connects `p`'s Redis until it answers, then puts it in use; ends early when `p` is no
/// longer the backend in use (a reload replaced it, or the server stops).
pub(super) async fn reconnect(slots: Arc<Slots>, p: Arc<Connecting>) {
    let mut wait = FIRST_RETRY;
    loop {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_RETRY);
        if !slots.is_pending(&p) {
            return;
        }
        let rules = p.latest();
        // Relaxed: a count for a message.
        p.attempts.fetch_add(1, Ordering::Relaxed);
        match RedisRules::connect(&rules).await {
            Ok(r) => {
                slots.install(&p, Arc::new(r));
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "the Redis of [backend] still does not answer");
                *p.error.lock().unwrap_or_else(|e| e.into_inner()) = e.to_string();
            }
        }
    }
}

impl Slots {
    /// Whether `p` is the backend connecting.
    fn is_pending(&self, p: &Arc<Connecting>) -> bool {
        self.pending
            .load()
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, p))
    }

    /// Puts `r`, connected for `p`, in use in `p`'s place (unless a reload replaced `p`
    /// meanwhile: then `r` is dropped). `current` is set before `pending` is cleared, so that
    /// a check that finds neither reads `current` again (`Slots::connecting`).
    fn install(&self, p: &Arc<Connecting>, r: Arc<RedisRules>) {
        let _switching = self.switch.lock().unwrap_or_else(|e| e.into_inner());
        if !self.is_pending(p) {
            return;
        }
        // A reload while connecting: the insurance rules follow the latest rules.
        if let Err(e) = r.reload(&p.latest()) {
            tracing::error!(error = %e, "the insurance rules were not reloaded");
        }
        // The failure counts held across the switch (see `Backends::commit`).
        let mut t = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        self.current.store(Some(r));
        self.pending.store(None);
        add(&mut t, p.rules.stats());
        drop(t);
        tracing::info!("the Redis of [backend] answers: rules backend connected");
    }
}
