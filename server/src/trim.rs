//! Memory given back to the system once a burst is over.
//!
//! An allocator keeps what a thread freed for that thread's next allocations; a worker that goes
//! quiet after a thousand connections have come and gone would hold their buffers for as long
//! as it stays quiet. The binary sets a hook that asks its allocator to return what it no longer
//! uses (`turnstile` runs on mimalloc: `mi_collect`); each worker calls [`idle`] when it goes
//! idle (a tokio worker parking, an io_uring worker's tick after connections closed), and the
//! hook runs at most once per [`EVERY`] per thread — never on the path of a request.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

static HOOK: OnceLock<fn()> = OnceLock::new();

/// The least time between two runs of the hook on one thread.
pub const EVERY: Duration = Duration::from_secs(1);

thread_local! {
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
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

/// [`idle`] for a tokio runtime's `on_thread_park`.
pub(crate) fn park() {
    idle();
}
