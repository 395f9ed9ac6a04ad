//! [`Server`]: what every listener and worker shares — the listeners' configurations, the
//! check path, the `CL.THROTTLE` stores, Envoy's service, the metrics, the files the control
//! thread reloads and snapshots, and the shutdown signal.

use crate::check::Checks;
use crate::config::{HttpConfig, RespConfig};
use crate::{control, envoy, metrics, throttle};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The files the server was started from, and how often it looks at them.
pub(crate) struct Files {
    pub(crate) rules: Option<PathBuf>,
    pub(crate) envoy_config: Option<PathBuf>,
    pub(crate) snapshot: Option<PathBuf>,
    /// Zero: only on shutdown.
    pub(crate) snapshot_every: Duration,
    /// Zero: never.
    pub(crate) watch_every: Duration,
}

/// Memory the RESP connections hold beyond their fixed part, and the budget of what they may
/// defer (output their clients have not read, beyond [`crate::resp::connection::OUTPUT_PAUSE`],
/// and queued `MULTI` commands, beyond [`crate::resp::connection::QUEUE_FREE`]).
pub(crate) struct Buffers {
    /// Bytes of every RESP connection's buffers (their capacities), now.
    pub(crate) bytes: AtomicUsize,
    /// Bytes of the deferred budget in use.
    pub(crate) deferred: AtomicUsize,
    /// The deferred budget.
    pub(crate) deferred_max: usize,
}

impl Buffers {
    /// Takes `n` bytes of the deferred budget, if there are.
    pub(crate) fn reserve(&self, n: usize) -> bool {
        // Relaxed: a counter of bytes; no other memory is published through it.
        let before = self.deferred.fetch_add(n, Ordering::Relaxed);
        if before + n <= self.deferred_max {
            return true;
        }
        self.deferred.fetch_sub(n, Ordering::Relaxed);
        false
    }

    /// Counts `n` bytes as borrowed whether or not the budget has them (memory already
    /// held: the next [`Buffers::reserve`] is refused until it is given back).
    pub(crate) fn force(&self, n: usize) {
        // Relaxed: see `reserve`.
        self.deferred.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives back `n` bytes of the deferred budget.
    pub(crate) fn release(&self, n: usize) {
        if n > 0 {
            // Relaxed: see `reserve`.
            self.deferred.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// A change of a connection's buffer capacities, from `old` to `new` bytes.
    pub(crate) fn resized(&self, old: usize, new: usize) {
        // Relaxed: a gauge.
        if new > old {
            self.bytes.fetch_add(new - old, Ordering::Relaxed);
        } else if old > new {
            self.bytes.fetch_sub(old - new, Ordering::Relaxed);
        }
    }
}

/// What every listener and worker shares.
pub(crate) struct Server {
    /// The RESP listener's configuration.
    pub(crate) resp: RespConfig,
    /// The HTTP listener's configuration.
    pub(crate) http: HttpConfig,
    /// The rules engine and where its counts live.
    pub(crate) checks: Checks,
    /// Envoy's rate limit service (`--envoy-config`), for gRPC and `POST /json`.
    pub(crate) envoy: Option<Arc<envoy::Envoy>>,
    /// TLS on every listener (`--tls-cert`, `--tls-key`).
    pub(crate) tls: Option<crate::tls::Tls>,
    pub(crate) throttles: throttle::Throttles,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) files: Files,
    /// RESP connections open.
    pub(crate) connections: AtomicUsize,
    /// HTTP connections open (every HTTP listener's).
    pub(crate) http_connections: AtomicUsize,
    pub(crate) buffers: Buffers,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    /// The rules file's modification time at the last reload; held while reloading (the
    /// engine's own lock keeps a reload atomic; this keeps the log and the mtime in order).
    pub(crate) rules_mtime: Mutex<Option<std::time::SystemTime>>,
    /// The same for the Envoy configuration: what its files looked like at the last reload.
    pub(crate) envoy_stamp: Mutex<control::Stamp>,
    /// Each limits class's last refusal by the file poll, logged and counted once.
    pub(crate) limits_refused: Mutex<std::collections::HashMap<String, String>>,
    /// Serializes snapshot writes (timer and shutdown).
    pub(crate) snapshot_lock: Mutex<()>,
    /// Set once every worker has stopped (the control thread then exits).
    pub(crate) workers_done: AtomicBool,
}

/// Resolves once `rx` reads `true` (or its sender is gone).
pub(crate) async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// The socket of an accept, or `None` after a failed one (out of file descriptors and the
/// like), logged as `{listener}: accept failed`: the listener stays, and the next accept is
/// tried shortly rather than at once (no spin).
pub(crate) async fn accepted_or_wait(
    r: std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)>,
    listener: &str,
) -> Option<tokio::net::TcpStream> {
    match r {
        Ok((sock, _)) => Some(sock),
        Err(e) => {
            tracing::warn!(error = %e, "{listener}: accept failed");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            None
        }
    }
}

/// Awaits a served connection and logs how it ended (`{listener} connection ended`, at debug
/// level), then lets go of `hold` (what counts it for its listener's bound, and the like).
pub(crate) async fn served<E: std::fmt::Display>(
    conn: impl std::future::Future<Output = Result<(), E>>,
    listener: &str,
    hold: impl Send,
) {
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "{listener} connection ended");
    }
    drop(hold);
}

impl Server {
    /// A server with no listener, for the connection's tests and the fuzz target: the
    /// defaults of `turnstile serve`, with `edit` applied to its flags first, and small
    /// `CL.THROTTLE` stores.
    pub(crate) fn detached(edit: impl FnOnce(&mut crate::ServeArgs)) -> Arc<Server> {
        let mut args = crate::ServeArgs::new();
        args.throttle_keys = 1024;
        edit(&mut args);
        let (resp, http) = crate::config::from_args(&args).expect("test flags are valid");
        let (tx, _) = tokio::sync::watch::channel(false);
        Arc::new(Server {
            resp,
            http,
            checks: Checks {
                engine: None,
                backends: crate::backend::Backends::new(),
            },
            envoy: None,
            tls: None,
            throttles: throttle::Throttles::new(args.throttle_keys, 7)
                .expect("a small store builds"),
            metrics: metrics::Metrics::new(1),
            files: Files {
                rules: None,
                envoy_config: None,
                snapshot: None,
                snapshot_every: Duration::ZERO,
                watch_every: Duration::ZERO,
            },
            connections: AtomicUsize::new(0),
            http_connections: AtomicUsize::new(0),
            buffers: Buffers {
                bytes: AtomicUsize::new(0),
                deferred: AtomicUsize::new(0),
                deferred_max: 1 << 20,
            },
            shutdown: tx,
            rules_mtime: Mutex::new(None),
            envoy_stamp: Mutex::new(control::Stamp::default()),
            limits_refused: Mutex::default(),
            snapshot_lock: Mutex::new(()),
            workers_done: AtomicBool::new(false),
        })
    }
}
