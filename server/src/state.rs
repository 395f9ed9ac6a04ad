//! [`Server`]: what every listener and worker shares — the listeners' configurations, the
//! check path, the `CL.THROTTLE` stores, Envoy's service, the metrics, the files the control
//! thread reloads and snapshots, and the shutdown signal.

use crate::check::Checks;
use crate::config::{HttpConfig, RespConfig};
use crate::{envoy, metrics, throttle};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// What every listener goes through: connections admitted per listener, deadlines,
    /// request bodies, failed passwords (crate::listen).
    pub(crate) guard: Arc<crate::listen::Guard>,
    pub(crate) buffers: crate::listen::Buffers,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    /// The rules file's modification time at the last reload; held while reloading (the
    /// engine's own lock keeps a reload atomic; this keeps the log and the mtime in order).
    pub(crate) rules_mtime: Mutex<Option<std::time::SystemTime>>,
    /// The same for the Envoy configuration: what its files looked like at the last reload.
    pub(crate) envoy_stamp: Mutex<envoy::Stamp>,
    /// Each limits class's last refusal by the file poll, logged and counted once.
    pub(crate) limits_refused: Mutex<std::collections::HashMap<String, String>>,
    /// Serializes snapshot writes (timer and shutdown).
    pub(crate) snapshot_lock: Mutex<()>,
    /// Set once every worker has stopped (the control thread then exits).
    pub(crate) workers_done: AtomicBool,
    /// Whether the last readiness check found the server ready (crate::ready).
    pub(crate) ready: AtomicBool,
    /// Its limits classes in Redis not loaded at the start (crate::redis_limits).
    pub(crate) limits_loading: crate::redis_limits::Loading,
}

static CONN_ID: AtomicU64 = AtomicU64::new(1);

/// A new connection's id (RESP's `CLIENT ID`).
pub(crate) fn next_conn_id() -> u64 {
    // Relaxed: a unique number.
    CONN_ID.fetch_add(1, Ordering::Relaxed)
}

impl Server {
    /// What a RESP command may use of the server ([`crate::cmd::Ctx`]).
    #[inline]
    pub(crate) fn ctx(&self) -> crate::cmd::Ctx<'_> {
        crate::cmd::Ctx {
            throttles: &self.throttles,
            checks: &self.checks,
            resp: &self.resp,
            guard: &self.guard,
            metrics: &self.metrics,
            buffers: &self.buffers,
            ready: &self.ready,
        }
    }

    /// A server with no listener, for the connection's tests and the fuzz target: the
    /// defaults of `turnstile serve`, with `edit` applied to its flags first, and small
    /// `CL.THROTTLE` stores.
    pub(crate) fn detached(edit: impl FnOnce(&mut crate::ServeArgs)) -> Arc<Server> {
        let mut args = crate::ServeArgs::new();
        args.throttle_keys = 1024;
        edit(&mut args);
        let (resp, http, limits) = crate::config::from_args(&args).expect("test flags are valid");
        let guard = crate::listen::Guard::new(limits, resp.auth.required(), 1 << 16);
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
            guard,
            buffers: crate::listen::Buffers {
                bytes: AtomicUsize::new(0),
                deferred: AtomicUsize::new(0),
                deferred_max: 1 << 20,
            },
            shutdown: tx,
            rules_mtime: Mutex::new(None),
            envoy_stamp: Mutex::new(envoy::Stamp::default()),
            limits_refused: Mutex::default(),
            snapshot_lock: Mutex::new(()),
            workers_done: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            limits_loading: crate::redis_limits::Loading::default(),
        })
    }
}
