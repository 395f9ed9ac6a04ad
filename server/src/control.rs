//! The control thread: signals (SIGTERM/SIGINT stop gracefully, a second one exits at once;
//! SIGHUP reloads), the rules file watch (its modification time, polled), and the periodic
//! snapshot. Also the reload and snapshot steps that HTTP and shutdown share.

use crate::{ServeError, Shared};
use axum::http::StatusCode;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Reloads the rules file; `why` says who asked (for the log). A refused file keeps the old
/// rules and is counted.
pub(crate) fn reload(s: &Shared, why: &str) -> Result<serde_json::Value, (StatusCode, String)> {
    let (Some(engine), Some(path)) = (&s.engine, &s.args.rules) else {
        return Err((
            StatusCode::CONFLICT,
            "no rules file: the server was started without --rules".into(),
        ));
    };
    let mut mtime = s.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
    *mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    match engine.reload_file(path) {
        Ok(r) => {
            s.metrics.reloads_ok.fetch_add(1, Ordering::Relaxed);
            tracing::info!(trigger = why, kept = ?r.kept, fresh = ?r.fresh, removed = ?r.removed, "rules reloaded");
            Ok(json!({ "reloaded": true, "kept": r.kept, "fresh": r.fresh, "removed": r.removed }))
        }
        Err(e) => {
            s.metrics.reloads_failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(trigger = why, error = %e, "rules refused; the old rules stay");
            Err((StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))
        }
    }
}

/// Writes the snapshot if one is configured.
pub(crate) fn snapshot(s: &Shared) -> Result<(), String> {
    let Some(path) = &s.args.snapshot else {
        return Ok(());
    };
    let _g = s.snapshot_lock.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = std::time::Instant::now();
    let snap = crate::snapshot::collect(&s.throttles);
    let n: usize = snap.stores.iter().map(|(_, r)| r.len()).sum();
    match crate::snapshot::write(path, &snap) {
        Ok(()) => {
            s.metrics.snapshots_ok.fetch_add(1, Ordering::Relaxed);
            s.metrics
                .snapshot_records
                .store(n as u64, Ordering::Relaxed);
            tracing::info!(path = %path.display(), records = n, ms = t0.elapsed().as_millis() as u64, "snapshot written");
            Ok(())
        }
        Err(e) => {
            s.metrics.snapshots_failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(path = %path.display(), error = %e, "snapshot failed");
            Err(format!("snapshot {}: {e}", path.display()))
        }
    }
}

/// The snapshot on shutdown, after the workers stopped.
pub(crate) fn final_snapshot(s: &Shared) -> Result<(), ServeError> {
    snapshot(s).map_err(ServeError::Other)
}

/// Starts the control thread.
pub(crate) fn spawn(shared: &Arc<Shared>) -> Result<std::thread::JoinHandle<()>, ServeError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    // Signal handlers are installed before `start` returns, so that a signal sent right after
    // is not missed.
    #[cfg(unix)]
    let sigs = {
        use tokio::signal::unix::{signal, SignalKind};
        let _g = rt.enter();
        let mk = |k| signal(k).map_err(ServeError::Runtime);
        (
            mk(SignalKind::terminate())?,
            mk(SignalKind::interrupt())?,
            mk(SignalKind::hangup())?,
        )
    };
    let s = shared.clone();
    std::thread::Builder::new()
        .name("turnstile-control".into())
        .spawn(move || {
            rt.block_on(async move {
                #[cfg(unix)]
                let (mut term, mut int, mut hup) = sigs;
                let every = |d: Duration| {
                    let d = if d.is_zero() {
                        Duration::from_secs(3600 * 24 * 365)
                    } else {
                        d
                    };
                    let mut i = tokio::time::interval_at(tokio::time::Instant::now() + d, d);
                    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    i
                };
                let mut snap = every(s.args.snapshot_every);
                let watching = s.args.rules.is_some() && !s.args.watch_every.is_zero();
                let mut watch = every(s.args.watch_every);
                let mut stop = s.shutdown.subscribe();
                loop {
                    let stopping = *stop.borrow();
                    if stopping && s.workers_done.load(Ordering::Acquire) {
                        return;
                    }
                    tokio::select! {
                        _ = term.recv() => signal_stop(&s, stopping, "SIGTERM"),
                        _ = int.recv() => signal_stop(&s, stopping, "SIGINT"),
                        _ = hup.recv() => {
                            let s = s.clone();
                            let _ = tokio::task::spawn_blocking(move || reload(&s, "SIGHUP")).await;
                        }
                        _ = snap.tick(), if !stopping && s.args.snapshot.is_some() => {
                            let s = s.clone();
                            let _ = tokio::task::spawn_blocking(move || snapshot(&s)).await;
                        }
                        _ = watch.tick(), if watching && !stopping => {
                            let s = s.clone();
                            let _ = tokio::task::spawn_blocking(move || watch_file(&s)).await;
                        }
                        _ = stop.changed(), if !stopping => {}
                        _ = tokio::time::sleep(Duration::from_millis(20)), if stopping => {}
                    }
                }
            })
        })
        .map_err(ServeError::Runtime)
}

fn signal_stop(s: &Shared, stopping: bool, name: &str) {
    if stopping {
        tracing::warn!(
            signal = name,
            "second signal: exiting now, without a snapshot"
        );
        std::process::exit(130);
    }
    tracing::info!(
        signal = name,
        "stopping: draining connections, then the snapshot"
    );
    s.shutdown.send_replace(true);
}

/// Reloads if the rules file's modification time changed.
fn watch_file(s: &Shared) {
    let Some(path) = &s.args.rules else { return };
    let now = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let last = *s.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
    if now.is_some() && now != last {
        let _ = reload(s, "file changed");
    }
}
