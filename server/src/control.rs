//! The control thread: signals (SIGTERM/SIGINT stop gracefully, a second one exits at once;
//! SIGHUP reloads), the rules file watch (its modification time, polled, and the limits
//! classes' files with it: `Engine::refresh_limits`), the periodic snapshot, and readiness
//! (crate::ready). Also the reload and snapshot steps that HTTP and shutdown share.

use crate::state::Server;
use crate::ServeError;
use axum::http::StatusCode;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Reloads what the server was configured from: the rules file (`--rules`) and the Envoy
/// configuration (`--envoy-config`), each independently; `why` says who asked (for the log).
/// A refused file keeps its old configuration and is counted. The JSON report has the rules'
/// `kept`, `carried`, `fresh` and `removed` rule names at the top and the Envoy reload under
/// `envoy`; any refusal makes the whole answer an error (422): each refused file's
/// `file:line:column: message`, joined by `; ` (the other file is reloaded all the same).
pub(crate) fn reload(s: &Server, why: &str) -> Result<serde_json::Value, (StatusCode, String)> {
    let rules = reload_rules(s, why);
    let limits = refresh_limits(s, why);
    let envoy = reload_envoy(s, why);
    if rules.is_none() && envoy.is_none() {
        return Err((
            StatusCode::CONFLICT,
            "nothing to reload: the server was started without --rules or --envoy-config".into(),
        ));
    }
    let mut errors = Vec::new();
    let mut report = json!({ "reloaded": true });
    match rules {
        Some(Ok(r)) => {
            report["kept"] = json!(r.kept);
            report["carried"] = json!(r.carried);
            report["fresh"] = json!(r.fresh);
            report["removed"] = json!(r.removed);
            report["backend"] = json!(s.checks.backends.name());
        }
        Some(Err(e)) => errors.push(e),
        None => {}
    }
    if !limits.read.is_empty() {
        report["limits"] = json!(limits.read);
    }
    errors.extend(limits.refused);
    match envoy {
        Some(Ok(domains)) => report["envoy"] = json!({ "reloaded": true, "domains": domains }),
        Some(Err(e)) => errors.push(format!(
            "envoy configuration refused, the old one stays: {e}"
        )),
        None => {}
    }
    if errors.is_empty() {
        Ok(report)
    } else {
        Err((StatusCode::UNPROCESSABLE_ENTITY, errors.join("; ")))
    }
}

/// Reloads the rules file, if there is one.
fn reload_rules(s: &Server, why: &str) -> Option<Result<turnstile::rules::ReloadReport, String>> {
    let (Some(engine), Some(path)) = (&s.checks.engine, &s.files.rules) else {
        return None;
    };
    let mut mtime = s.rules_mtime.lock().unwrap_or_else(|e| e.into_inner());
    *mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let reloaded = turnstile::rules::Rules::from_file(path).and_then(|rules| {
        // The backend first: a Redis that cannot be reached refuses the reload.
        let change = s.checks.backends.prepare(&rules, false)?;
        let r = engine.reload(rules.clone())?;
        s.checks.backends.commit(change, &rules);
        Ok(r)
    });
    Some(match reloaded {
        Ok(r) => {
            s.metrics.reloads_ok.fetch_add(1, Ordering::Relaxed);
            tracing::info!(trigger = why, kept = ?r.kept, carried = ?r.carried, fresh = ?r.fresh, removed = ?r.removed, backend = s.checks.backends.name(), "rules reloaded");
            Ok(r)
        }
        Err(e) => {
            s.metrics.reloads_failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(trigger = why, error = %e, "rules refused; the old rules stay");
            Err(e.to_string())
        }
    })
}

/// What [`refresh_limits`] did: the classes whose files were re-read (name → entries), and
/// each refused file's `file:line: message`.
#[derive(Default)]
pub(crate) struct Refreshed {
    read: std::collections::BTreeMap<String, u64>,
    refused: Vec<String>,
}

/// Re-reads the limits classes' files that changed since they were read
/// (`Engine::refresh_limits`: a `stat` per file when none did). A file with a bad line is
/// refused and its class keeps its entries; both are logged and counted, a refusal once
/// (the poll sees it again each time until the file is fixed).
pub(crate) fn refresh_limits(s: &Server, why: &str) -> Refreshed {
    let mut out = Refreshed::default();
    let Some(engine) = &s.checks.engine else {
        return out;
    };
    let mut last = s.limits_refused.lock().unwrap_or_else(|e| e.into_inner());
    for (class, r) in engine.refresh_limits() {
        if r.is_ok() {
            last.remove(&class);
        }
        match r {
            Ok(None) => {}
            Ok(Some(rep)) => {
                s.metrics.limits_reads_ok.fetch_add(1, Ordering::Relaxed);
                tracing::info!(trigger = why, class = %class, entries = rep.entries, seconds = rep.seconds, "limits file re-read");
                out.read.insert(class, rep.entries);
            }
            Err(e) => {
                if last.get(&class) != Some(&e.to_string()) {
                    s.metrics
                        .limits_reads_failed
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::error!(trigger = why, class = %class, error = %e, "limits file refused; the class keeps its entries");
                    last.insert(class.clone(), e.to_string());
                }
                out.refused.push(format!(
                    "limits class `{class}`: {e} (the class keeps its entries)"
                ));
            }
        }
    }
    out
}

/// Reloads the Envoy configuration, if there is one: its domains, or why it was refused
/// (`file:line:column: message`).
fn reload_envoy(s: &Server, why: &str) -> Option<Result<usize, String>> {
    let (Some(envoy), Some(path)) = (&s.envoy, &s.files.envoy_config) else {
        return None;
    };
    let mut st = s.envoy_stamp.lock().unwrap_or_else(|e| e.into_inner());
    // The stamp is taken before reading, so that a change made during the read is seen by the
    // next look at the files.
    *st = crate::envoy::stamp(path);
    let r = crate::envoy::load_with(path, envoy.settings().load_options())
        .map_err(|e| e.to_string())
        .and_then(|cfg| {
            envoy
                .reload(&cfg)
                .map(|()| cfg.domains.len())
                .map_err(|e| format!("{}: {e}", path.display()))
        });
    Some(match r {
        Ok(n) => {
            s.metrics.envoy_reloads_ok.fetch_add(1, Ordering::Relaxed);
            tracing::info!(trigger = why, config = %path.display(), domains = n, "envoy configuration reloaded");
            Ok(n)
        }
        Err(e) => {
            s.metrics
                .envoy_reloads_failed
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(trigger = why, error = %e, "envoy configuration refused; the old one stays");
            Err(e)
        }
    })
}

/// Writes the snapshot if one is configured.
pub(crate) fn snapshot(s: &Server) -> Result<(), String> {
    let Some(path) = &s.files.snapshot else {
        return Ok(());
    };
    let _g = s.snapshot_lock.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = std::time::Instant::now();
    let snap = crate::snapshot::collect(&s.throttles, s.checks.engine.as_deref());
    let n: usize = snap.throttle.len()
        + snap
            .rules
            .iter()
            .map(|r| r.records().count())
            .sum::<usize>();
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
pub(crate) fn final_snapshot(s: &Server) -> Result<(), ServeError> {
    snapshot(s).map_err(ServeError::Other)
}

/// The control thread's runtime and signal handlers, made before any listener accepts: a
/// client that connects and at once signals the server (a supervisor's SIGTERM right after its
/// readiness probe) must find the handlers installed, not the default action that kills the
/// process without its shutdown snapshot.
pub(crate) struct Prepared {
    rt: tokio::runtime::Runtime,
    #[cfg(unix)]
    sigs: (
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
    ),
}

/// Installs the signal handlers (SIGTERM, SIGINT, SIGHUP) on the control thread's runtime.
pub(crate) fn prepare() -> Result<Prepared, ServeError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(crate::trim::park)
        .build()
        .map_err(ServeError::Runtime)?;
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
    Ok(Prepared {
        rt,
        #[cfg(unix)]
        sigs,
    })
}

/// Starts the control thread on what [`prepare`] made.
pub(crate) fn spawn(
    shared: &Arc<Server>,
    prepared: Prepared,
) -> Result<std::thread::JoinHandle<()>, ServeError> {
    let Prepared {
        rt,
        #[cfg(unix)]
        sigs,
    } = prepared;
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
                let mut snap = every(s.files.snapshot_every);
                let watching = (s.files.rules.is_some() || s.files.envoy_config.is_some())
                    && !s.files.watch_every.is_zero();
                let mut watch = every(s.files.watch_every);
                // The first at once: the state is known (and logged) from the start.
                let mut ready = tokio::time::interval(crate::ready::POLL);
                ready.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                        _ = snap.tick(), if !stopping && s.files.snapshot.is_some() => {
                            let s = s.clone();
                            let _ = tokio::task::spawn_blocking(move || snapshot(&s)).await;
                        }
                        _ = watch.tick(), if watching && !stopping => {
                            let s = s.clone();
                            let _ = tokio::task::spawn_blocking(move || watch_file(&s)).await;
                        }
                        _ = ready.tick(), if !stopping => {
                            let _ = crate::ready::check(&s).await;
                        }
                        _ = stop.changed(), if !stopping => {}
                        _ = tokio::time::sleep(Duration::from_millis(20)), if stopping => {}
                    }
                }
            })
        })
        .map_err(ServeError::Runtime)
}

fn signal_stop(s: &Server, stopping: bool, name: &str) {
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

/// Reloads the rules file if its modification time changed, and the Envoy configuration if
/// one of its files changed.
fn watch_file(s: &Server) {
    if let Some(path) = &s.files.rules {
        let now = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let last = *s.rules_mtime.lock().unwrap_or_else(|e| e.into_inner());
        if now.is_some() && now != last {
            let _ = reload_rules(s, "file changed");
        }
        refresh_limits(s, "file changed");
    }
    if let Some(path) = &s.files.envoy_config {
        let now = crate::envoy::stamp(path);
        let changed = *s.envoy_stamp.lock().unwrap_or_else(|e| e.into_inner()) != now;
        if changed {
            let _ = reload_envoy(s, "file changed");
        }
    }
}
