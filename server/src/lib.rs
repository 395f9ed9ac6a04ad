//! # turnstile-server
//!
//! `turnstile serve`: the engine as a standalone service. Any Redis client can ask it
//! redis-cell's `CL.THROTTLE` and the rules engine's `TURNSTILE.CHECK` over RESP (RESP2, and
//! RESP3 after `HELLO 3`, pipelined); HTTP clients `POST /v1/check`; Prometheus scrapes
//! `/metrics`. With `--envoy-config`, Envoy's rate limit service answers over gRPC (`--grpc`)
//! and `POST /json` (docs/envoy.md). The rules file and the Envoy configuration reload on
//! `SIGHUP`, `POST /v1/reload` or a change of their files (the limits classes' files with
//! them); keys' own limits are managed live (`TURNSTILE.LIMITS`, `/v1/limits/{class}/{key}`:
//! `limits`); the stores are snapshotted to a file and restored on start. docs/service.md.
//!
//! * [`resp`]: the protocol, a pure parser and an encoder.
//! * [`throttle`]: `CL.THROTTLE` on turnstile's keyed stores.
//! * `conn`: a RESP connection and its commands; `http`: the HTTP API; `metrics`;
//!   `snapshot`; `workers`: thread-per-core or one multi-thread runtime; `control`: signals,
//!   reload and the snapshot timer.
//!
//! The binary is `turnstile serve` (its flags are [`ServeArgs`]); a program or a test starts
//! the same server in process with [`start`] and stops it with [`Running::stop`]:
//!
//! ```
//! use std::io::{BufRead, BufReader, Write};
//! use std::net::TcpStream;
//! use turnstile_server::{start, ServeArgs};
//!
//! // `turnstile serve` on free loopback ports, CL.THROTTLE only (no rules file).
//! let mut args = ServeArgs::new();
//! args.resp = "127.0.0.1:0".parse().unwrap();
//! args.http = "127.0.0.1:0".parse().unwrap();
//! args.workers = Some(1);
//! args.throttle_keys = 10_000;
//! let server = start(args).unwrap();
//!
//! // Any Redis client works; here RESP by hand: CL.THROTTLE user:1 15 30 60, as redis-cell.
//! let mut conn = TcpStream::connect(server.resp).unwrap();
//! conn.write_all(b"*5\r\n$11\r\nCL.THROTTLE\r\n$6\r\nuser:1\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n")
//!     .unwrap();
//! let mut reply = BufReader::new(conn);
//! let lines: Vec<String> = (0..6)
//!     .map(|_| {
//!         let mut l = String::new();
//!         reply.read_line(&mut l).unwrap();
//!         l.trim_end().to_string()
//!     })
//!     .collect();
//! // Allowed (0), limit 16, 15 left, no retry (-1), idle again in 2 s.
//! assert_eq!(lines, ["*5", ":0", ":16", ":15", ":-1", ":2"]);
//!
//! server.stop();
//! server.join().unwrap();
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod args;
mod backend;
mod check;
mod cmd;
mod config;
mod conn;
mod control;
mod denied;
pub mod envoy;
mod error;
mod explain;
mod exposition;
mod grpc;
mod http;
mod limits;
mod listen;
mod metrics;
mod ready;
mod redis_limits;
pub mod resp;
pub mod snapshot;
pub mod spans;
mod state;
pub mod throttle;
mod tls;
pub mod trim;
mod workers;

use state::Server;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use turnstile::rules::{Engine, Rules};

pub use args::{RuntimeKind, ServeArgs};
pub use error::ServeError;
pub use http::RateLimitHeaders;
pub use snapshot::SnapshotError;

/// The RESP connection fuzz target's body (`fuzz/fuzz_targets/resp_connection.rs`). Not an
/// API.
#[doc(hidden)]
pub use conn::fuzz::fuzz_connection;

/// A server started by [`start`].
pub struct Running {
    /// The RESP address it listens on (the real port when `--resp` asked for port 0).
    pub resp: SocketAddr,
    /// The HTTP address.
    pub http: SocketAddr,
    /// The gRPC address of Envoy's rate limit service, if `--grpc` was given.
    pub grpc: Option<SocketAddr>,
    /// The admin HTTP address, if `--admin` was given.
    pub admin: Option<SocketAddr>,
    /// The runtime RESP is served on (`--runtime`, or `per-core` where io_uring is
    /// unavailable).
    pub runtime: RuntimeKind,
    srv: Arc<Server>,
    workers: Vec<std::thread::JoinHandle<()>>,
    control: std::thread::JoinHandle<()>,
}

impl Running {
    /// Asks it to stop as SIGTERM does: stop accepting, finish what connections sent, write
    /// the snapshot.
    pub fn stop(&self) {
        self.srv.shutdown.send_replace(true);
    }

    /// Waits until it has stopped (after [`Running::stop`] or a signal), then writes the final
    /// snapshot.
    pub fn join(self) -> Result<(), ServeError> {
        for t in self.workers {
            let _ = t.join();
        }
        self.srv.checks.backends.shutdown();
        // Release: the control thread's Acquire load sees the workers' end.
        self.srv.workers_done.store(true, Ordering::Release);
        let _ = self.control.join();
        control::final_snapshot(&self.srv)
    }
}

/// Whether `--runtime uring` can serve RESP here, or why not: `TURNSTILE_IO_URING=off`, not
/// Linux, or a kernel (or seccomp profile) that refuses what it needs (Linux 5.19 or later).
pub fn io_uring_available() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    return conn::uring::available();
    #[cfg(not(target_os = "linux"))]
    return Err("io_uring is Linux's".into());
}

/// Starts the server (listeners bound when this returns) and answers until stopped.
pub fn start(args: ServeArgs) -> Result<Running, ServeError> {
    let loaded = load(&args)?;
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    denied::DENIED.set_k(args.top_denied);
    let srv = server(&args, loaded, workers);
    listen(srv, &args, workers)
}

/// What the server starts with, read and checked before anything listens.
struct Loaded {
    resp: config::RespConfig,
    http: config::HttpConfig,
    limits: listen::Limits,
    checks: check::Checks,
    envoy: Option<Arc<envoy::Envoy>>,
    tls: Option<tls::Tls>,
    throttles: throttle::Throttles,
    rules_mtime: Option<std::time::SystemTime>,
    envoy_stamp: envoy::Stamp,
    limits_loading: redis_limits::Loading,
}

/// Reads and checks the flags and every file, in the order a mistake is likeliest, and
/// restores the snapshot into the stores.
fn load(args: &ServeArgs) -> Result<Loaded, ServeError> {
    // The flags first, then the rules: a refused file is the likelier mistake, and says so
    // before anything else happens.
    let (resp, http, limits) = config::from_args(args)?;
    let rules = match &args.rules {
        None => None,
        Some(p) => Some(Rules::from_file(p).map_err(ServeError::Rules)?),
    };
    let rules_mtime = args
        .rules
        .as_ref()
        .and_then(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    let envoy_stamp = args
        .envoy_config
        .as_deref()
        .map(envoy::stamp)
        .unwrap_or_default();
    // A Redis backend is connected before anything listens; a Redis that cannot be reached
    // leaves it connecting in the background (the server starts not ready), while what the
    // [backend] table gets wrong is said at its line, as a refused rules file is.
    let backends = backend::Backends::new();
    let change = match &rules {
        Some(r) => Some(backends.prepare(r, true).map_err(ServeError::Rules)?),
        None => None,
    };
    let envoy = grpc::envoy(args)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some(tls::Tls::load(c, k)?),
        _ => None,
    };
    let restored = snapshot::on_start(args.snapshot.as_deref(), args.snapshot_required)?;
    let seed = seed(restored.as_ref())?;
    let (engine, limits_loading) = match rules {
        None => (None, redis_limits::Loading::default()),
        Some(rules) => {
            let (e, l) = engine(args, rules, change, &backends, seed, restored.as_ref())?;
            (Some(e), l)
        }
    };
    let throttles =
        throttle::Throttles::new(args.throttle_keys, seed).map_err(ServeError::Other)?;
    if let Some(s) = restored {
        let r = snapshot::restore(&throttles, engine.as_ref(), s);
        tracing::info!(
            throttle = r.throttle,
            rules = r.rules,
            idle = r.idle,
            not_restored = r.unmatched,
            "snapshot restored"
        );
    }
    Ok(Loaded {
        resp,
        http,
        limits,
        checks: check::Checks {
            engine: engine.map(Arc::new),
            backends,
        },
        envoy,
        tls,
        throttles,
        rules_mtime,
        envoy_stamp,
        limits_loading,
    })
}

/// The stores' hash seed: the snapshot's, or a random one.
fn seed(restored: Option<&snapshot::Snapshot>) -> Result<u64, ServeError> {
    match restored {
        Some(s) => Ok(s.seed),
        None => {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b)
                .map_err(|e| ServeError::Other(format!("no random seed: {e}")))?;
            Ok(u64::from_le_bytes(b))
        }
    }
}

/// The rules engine, its backend (prepared for `rules` as `change`) put in use, and its limits
/// classes in Redis still loading. Its key ids
/// are hashes under the snapshot's seed, and its clock continues the snapshot's timeline, so
/// that restored records mean what they meant (snapshot.rs).
fn engine(
    args: &ServeArgs,
    rules: Rules,
    change: Option<backend::Change>,
    backends: &backend::Backends,
    seed: u64,
    restored: Option<&snapshot::Snapshot>,
) -> Result<(snapshot::RulesEngine, redis_limits::Loading), ServeError> {
    let origin = args
        .rules
        .as_deref()
        .unwrap_or(Path::new(""))
        .display()
        .to_string();
    let mut b = Engine::builder(rules.clone()).seed(seed);
    let (sources, loading) = redis_limits::sources(&rules, &origin).map_err(ServeError::Other)?;
    for (class, src) in sources {
        b = b.limits_source(class, src);
    }
    let e = b
        .build_with_clock(snapshot::Timeline::continuing(restored))
        .map_err(ServeError::Rules)?;
    e.set_near_limit(args.near_limit);
    if let Some(c) = change {
        backends.commit(c, &rules);
    }
    tracing::info!(rules = %args.rules.as_deref().unwrap_or(Path::new("")).display(), summary = %e.summary(), backend = backends.name(), "rules loaded");
    Ok((e, loading))
}

/// The state every listener and worker shares.
fn server(args: &ServeArgs, l: Loaded, workers: usize) -> Arc<Server> {
    let (tx, _) = tokio::sync::watch::channel(false);
    // The descriptors' bound is the process's: raised to the hard limit first.
    let nofile = match listen::raise_nofile() {
        Some((before, after)) => {
            tracing::info!(
                soft_before = before,
                soft = after,
                "open files limit (RLIMIT_NOFILE)"
            );
            after
        }
        None => 1024,
    };
    let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
    let guard = listen::Guard::new(l.limits, l.resp.auth.required(), nofile);
    Arc::new(Server {
        resp: l.resp,
        http: l.http,
        checks: l.checks,
        envoy: l.envoy,
        tls: l.tls,
        throttles: l.throttles,
        metrics: metrics::Metrics::new(workers),
        files: state::Files {
            rules: args.rules.clone(),
            envoy_config: args.envoy_config.clone(),
            snapshot: args.snapshot.clone(),
            snapshot_every: args.snapshot_every,
            watch_every: args.watch_every,
        },
        guard,
        buffers: listen::Buffers {
            bytes: AtomicUsize::new(0),
            deferred: AtomicUsize::new(0),
            deferred_max: DEFERRED_BUDGET,
        },
        shutdown: tx,
        rules_mtime: Mutex::new(l.rules_mtime),
        envoy_stamp: Mutex::new(l.envoy_stamp),
        limits_refused: Mutex::default(),
        snapshot_lock: Mutex::new(()),
        workers_done: AtomicBool::new(false),
        ready: AtomicBool::new(false),
        limits_loading: l.limits_loading,
    })
}

/// The server-wide budget of output and queued commands that RESP connections may hold
/// beyond their own small allowance (crate::conn): 64 MiB.
const DEFERRED_BUDGET: usize = 64 << 20;

/// Binds the listeners and starts the workers and the control thread.
fn listen(srv: Arc<Server>, args: &ServeArgs, workers: usize) -> Result<Running, ServeError> {
    // Signal handlers first: a signal that follows the first accepted connection is handled.
    let prepared = control::prepare()?;
    // The sweeper of the tokio connections' deadlines: detached, it ends within a second of
    // the shutdown signal (or of the server's end).
    srv.guard
        .spawn_sweeper(srv.shutdown.subscribe())
        .map_err(ServeError::Runtime)?;
    let (bound, mut threads, runtime) = workers::spawn(&srv, args, workers)?;
    let mut grpc = None;
    let started = grpc::spawn(&srv, args).and_then(|(t, g)| {
        threads.extend(t);
        grpc = g;
        control::spawn(&srv, prepared)
    });
    let control = match started {
        Ok(c) => c,
        Err(e) => {
            srv.shutdown.send_replace(true);
            for t in threads {
                let _ = t.join();
            }
            return Err(e);
        }
    };
    tracing::info!(resp = %bound.resp, http = %bound.http, admin = ?bound.admin, workers, ?runtime, "serving");
    Ok(Running {
        resp: bound.resp,
        http: bound.http,
        admin: bound.admin,
        runtime,
        grpc,
        srv,
        workers: threads,
        control,
    })
}

/// Standard error for the log, where a line that cannot be written is dropped: a closed pipe
/// or a full disk must not stop the server. (Writing to `std::io::stderr` directly, a failed
/// write made the log layer report it with `eprintln!`, which panics when standard error is
/// gone: the thread that logged, the one that handles signals among them, died.)
struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// A tracing layer that exports the request spans ([`spans`]): given to [`run_traced`].
pub type TraceLayer =
    Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static>;

/// `turnstile serve`: logs to stderr (`RUST_LOG`, default `info`), starts, and runs until
/// SIGTERM or SIGINT (a second one exits at once).
pub fn run(args: ServeArgs) -> Result<(), ServeError> {
    run_traced(args, None)
}

/// [`run`], with `layer` (if any) beside the log: it sees the request spans, which
/// [`spans::enable`] turns on, and nothing the log prints; its description is logged once the
/// log is set up.
pub fn run_traced(args: ServeArgs, layer: Option<(TraceLayer, String)>) -> Result<(), ServeError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    // Colours for a terminal only: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    match layer {
        None => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_writer(|| LogWriter)
                .with_ansi(ansi)
                .try_init();
        }
        Some((layer, what)) => {
            // The log's filter is its own: the request spans are the layer's alone.
            let off = spans::TARGET.to_owned() + "=off";
            let log_filter = filter().add_directive(off.parse().expect("a valid directive"));
            let log = tracing_subscriber::fmt::layer()
                .with_writer(|| LogWriter)
                .with_ansi(ansi)
                .with_filter(log_filter);
            let _ = tracing_subscriber::registry()
                .with(layer)
                .with(log)
                .try_init();
            tracing::info!("{what}");
        }
    }
    let r = start(args)?;
    r.join()
}
