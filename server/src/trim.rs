//! Memory given back to the system once a burst is over.
//!
//! An allocator keeps what a thread freed for that thread's next allocations; a worker that goes
//! quiet after a thousand connections have come and gone would hold their buffers for as long
//! as it stays quiet. The binary sets a hook that asks its allocator to return what it no longer
//! uses (`turnstile` runs on mimalloc: `mi_collect`); each worker calls [`idle`] when it goes
//! idle or between rounds (a tokio worker parking; an io_uring worker at the end of a round,
//! its replies sent, once its tick found connections closed), and the hook runs at most once
//! per [`EVERY`] per thread — never in the middle of a request.
//!
//! A tokio thread that parks less than [`EVERY`] after its last run of the hook leaves a timer
//! behind ([`park`]), so that what it freed since is given back once the hook is due even if
//! nothing else ever wakes it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

static HOOK: OnceLock<fn()> = OnceLock::new();

/// The least time between two runs of the hook on one thread.
pub const EVERY: Duration = Duration::from_secs(1);

thread_local! {
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    /// A timer left by [`park`] on this thread is still pending.
    static ARMED: Arc<AtomicBool> = Arc::new(AtomicBool::new(false));
}

/// Sets the function that gives the allocator's unused memory back to the system (once; a
/// later call is ignored). Without it, nothing is done.
pub fn set_hook(f: fn()) {
    let _ = HOOK.set(f);
}

/// The calling thread is idle: runs the hook, unless it ran on this thread within [`EVERY`].
/// Returns whether it is done (run, or nothing to run); `false`: call again later.
pub(crate) fn idle() -> bool {
    let Some(f) = HOOK.get() else {
        return true;
    };
    let now = Instant::now();
    let due = LAST.with(|l| match l.get() {
        Some(t) if now.duration_since(t) < EVERY => false,
        _ => {
            l.set(Some(now));
            true
        }
    });
    if due {
        f();
    }
    due
}

/// [`idle`] for a tokio runtime's `on_thread_park`. When the hook is not due yet, spawns a task
/// that sleeps until it is (one at a time per thread): the runtime wakes then, and the thread
/// that ran the task runs the hook as it parks again. On a current-thread runtime that is this
/// thread; on a multi-thread one, the worker that ran the timer's task (a parked worker that
/// nothing wakes keeps what it freed since its last run until its next wake-up).
pub(crate) fn park() {
    if idle() {
        return;
    }
    let armed = ARMED.with(Arc::clone);
    // Relaxed: the flag is only a bound on pending timers, it orders no other memory.
    if armed.swap(true, Ordering::Relaxed) {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        armed.store(false, Ordering::Relaxed);
        return;
    };
    let wait = LAST
        .with(|l| l.get())
        .map_or(Duration::ZERO, |t| EVERY.saturating_sub(t.elapsed()));
    // Cleared however the task ends, run or dropped with its runtime.
    let disarm = Disarm(armed);
    rt.spawn(async move {
        let _disarm = disarm;
        tokio::time::sleep(wait).await;
    });
}

/// Clears a thread's [`ARMED`] flag when its timer task ends.
struct Disarm(Arc<AtomicBool>);

impl Drop for Disarm {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static RUNS: Cell<u32> = const { Cell::new(0) };
    }

    fn count() {
        RUNS.with(|r| r.set(r.get() + 1));
    }

    /// A current-thread runtime whose only work is one long sleep parks once: without the timer
    /// [`park`] leaves, the hook would run at that park only (and never again however long the
    /// thread stays parked); with it, the runtime wakes each [`EVERY`] until then.
    #[test]
    fn a_parked_thread_runs_the_hook_when_it_is_due() {
        set_hook(count);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .on_thread_park(park)
            .build()
            .expect("a runtime");
        rt.block_on(async {
            // The first run, at once; the timer is armed for a second later.
            tokio::time::sleep(Duration::from_millis(50)).await;
            tokio::time::sleep(EVERY * 3 + EVERY / 2).await;
        });
        // Without the timer 2 (the two parks); with it 4 (at 0, 1, 2 and 3 s), 3 on a machine
        // that runs timers half a second late.
        let runs = RUNS.with(Cell::get);
        assert!(
            (3..=5).contains(&runs),
            "the hook ran {runs} times in 3.55 s of a parked thread (each second expected)"
        );
    }
}
