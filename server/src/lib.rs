//! # turnstile-server
//!
//! `turnstile serve`: the engine as a standalone service. Any Redis client can ask it
//! redis-cell's `CL.THROTTLE` and the rules engine's `TURNSTILE.CHECK` over RESP (RESP2, and
//! RESP3 after `HELLO 3`, pipelined); HTTP clients `POST /v1/check`; Prometheus scrapes
//! `/metrics`. With `--envoy-config`, Envoy's rate limit service answers over gRPC (`--grpc`)
//! and `POST /json` (docs/envoy.md). The rules file and the Envoy configuration reload on
//! `SIGHUP`, `POST /v1/reload` or a change of their files; the stores are snapshotted to a
//! file and restored on start. docs/service.md.
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

mod backend;
mod conn;
mod control;
pub mod envoy;
mod extra;
mod http;
mod metrics;
pub mod resp;
pub mod snapshot;
pub mod throttle;
mod watchdog;
mod workers;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use turnstile::rules::{Engine, Rules};

pub use snapshot::SnapshotError;

/// How connections are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    /// One worker thread per core, pinned, each with its own current-thread runtime and its
    /// own `SO_REUSEPORT` listeners (the kernel spreads connections over them).
    PerCore,
    /// One multi-thread tokio runtime of `--workers` threads and one listener per protocol.
    MultiThread,
}

fn duration(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    turnstile::rules::parse_duration(s)
}

fn workers(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(n),
        _ => Err(format!("`{s}` is not a number of workers from 1 to 4096")),
    }
}

/// The flags of `turnstile serve`.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// Rules file (TOML, docs/rules.md) for TURNSTILE.CHECK and POST /v1/check; without it
    /// the server answers CL.THROTTLE alone.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// RESP (Redis protocol) address.
    #[arg(long, default_value = "127.0.0.1:6380")]
    pub resp: SocketAddr,
    /// HTTP address (/v1/check, /metrics, /healthz, /v1/reload).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
    /// Envoy rate limit service (gRPC) address; off unless given (needs --envoy-config).
    #[arg(long)]
    pub grpc: Option<SocketAddr>,
    /// envoyproxy/ratelimit YAML configuration, a file or a directory (docs/envoy.md): served
    /// over gRPC on --grpc and as POST /json on the HTTP address; reloaded like the rules
    /// file. SHADOW_MODE and the LIMIT_* variables of the environment apply.
    #[arg(long)]
    pub envoy_config: Option<PathBuf>,
    /// Snapshot file of every store (CL.THROTTLE's and the rules'): restored on start,
    /// written periodically and on graceful shutdown.
    #[arg(long)]
    pub snapshot: Option<PathBuf>,
    /// How often to write the snapshot ("0": only on shutdown).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub snapshot_every: Duration,
    /// Exit (instead of starting empty) if the snapshot file exists but cannot be restored.
    #[arg(long)]
    pub snapshot_required: bool,
    /// Worker threads (default: one per core).
    #[arg(long, value_parser = workers)]
    pub workers: Option<usize>,
    /// per-core (pinned current-thread runtimes) or multi-thread (one tokio runtime).
    #[arg(long, value_enum, default_value = "per-core")]
    pub runtime: RuntimeKind,
    /// Password clients must give with AUTH (or HELLO ... AUTH) before other commands.
    #[arg(long)]
    pub requirepass: Option<String>,
    /// Bytes all CL.THROTTLE stores together may take.
    #[arg(long, default_value_t = 1 << 30)]
    pub throttle_memory: usize,
    /// Keys each CL.THROTTLE store (one per max_burst, count, period) holds.
    #[arg(long, default_value_t = 1 << 21)]
    pub throttle_keys: u64,
    /// Most simultaneous RESP connections; more are told so and closed.
    #[arg(long, default_value_t = 10_000)]
    pub max_connections: usize,
    /// Close a RESP connection idle this long ("0": never).
    #[arg(long, default_value = "300s", value_parser = duration)]
    pub idle_timeout: Duration,
    /// Most arguments in one RESP command.
    #[arg(long, default_value_t = 1024)]
    pub max_args: usize,
    /// Longest RESP bulk string, in bytes.
    #[arg(long, default_value_t = 512 * 1024)]
    pub max_bulk: usize,
    /// Longest RESP inline command, in bytes.
    #[arg(long, default_value_t = 64 * 1024)]
    pub max_inline: usize,
    /// Largest HTTP request body, in bytes (larger: 413).
    #[arg(long, default_value_t = 64 * 1024)]
    pub max_body: usize,
    /// Close an HTTP connection without a request in progress for this long (within 2 s
    /// after): a client that trickles its headers, or keeps a connection idle between
    /// requests, does not hold it for good ("0": never; nginx's client_header_timeout is 60 s
    /// too).
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub header_timeout: Duration,
    /// How often to look whether the rules file or the Envoy configuration changed ("0":
    /// never; SIGHUP and POST /v1/reload still reload).
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub watch_every: Duration,
}

impl ServeArgs {
    /// The defaults, as `turnstile serve` with no flags.
    pub fn new() -> Self {
        use clap::{Args, FromArgMatches};
        let cmd = Self::augment_args(clap::Command::new("serve"));
        let m = cmd.get_matches_from(["serve"]);
        Self::from_arg_matches(&m).expect("the defaults parse")
    }
}

impl Default for ServeArgs {
    fn default() -> Self {
        Self::new()
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug)]
pub enum ServeError {
    /// The rules file was refused (`file:line:column: message`).
    Rules(turnstile::rules::RulesError),
    /// The address of a flag (`--resp`, `--http`, `--grpc`) could not be bound or a socket
    /// option set.
    Bind(&'static str, SocketAddr, std::io::Error),
    /// The snapshot could not be restored and `--snapshot-required` was given.
    Snapshot(SnapshotError),
    /// A runtime or thread could not be started.
    Runtime(std::io::Error),
    /// Something else, said in words.
    Other(String),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Rules(e) => write!(f, "{e}"),
            ServeError::Bind(flag, a, e) => {
                write!(f, "cannot listen on {a} ({flag}): {e}")?;
                match e.kind() {
                    std::io::ErrorKind::AddrInUse => write!(
                        f,
                        "; another process listens there: stop it or give another address with {flag}"
                    ),
                    std::io::ErrorKind::AddrNotAvailable => write!(
                        f,
                        "; no interface of this machine has that address: use 127.0.0.1, 0.0.0.0 or one of its own"
                    ),
                    std::io::ErrorKind::PermissionDenied => write!(
                        f,
                        "; ports under 1024 need privileges: use a higher port"
                    ),
                    _ => Ok(()),
                }
            }
            ServeError::Snapshot(e) => write!(
                f,
                "{e} (--snapshot-required: not starting; remove the flag to start empty)"
            ),
            ServeError::Runtime(e) => write!(f, "cannot start the runtime: {e}"),
            ServeError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ServeError {}

/// What every worker shares.
pub(crate) struct Shared {
    pub(crate) args: ServeArgs,
    pub(crate) engine: Option<snapshot::RulesEngine>,
    /// Where the rules' counts live (`[backend]`): memory or Redis.
    pub(crate) backends: backend::Backends,
    /// Envoy's rate limit service (`--envoy-config`), for gRPC and `POST /json`.
    pub(crate) envoy: Option<Arc<envoy::Envoy>>,
    pub(crate) throttles: throttle::Throttles,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) bounds: resp::Bounds,
    pub(crate) connections: AtomicUsize,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    /// Serializes reloads (the engine's own lock keeps them atomic; this keeps the log and
    /// the file's mtime in order).
    pub(crate) reload_lock: Mutex<Option<std::time::SystemTime>>,
    /// The same for the Envoy configuration: what its files looked like at the last reload.
    pub(crate) envoy_lock: Mutex<control::Stamp>,
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

/// A server started by [`start`].
pub struct Running {
    /// The RESP address it listens on (the real port when `--resp` asked for port 0).
    pub resp: SocketAddr,
    /// The HTTP address.
    pub http: SocketAddr,
    /// The gRPC address of Envoy's rate limit service, if `--grpc` was given.
    pub grpc: Option<SocketAddr>,
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
    control: std::thread::JoinHandle<()>,
}

impl Running {
    /// Asks it to stop as SIGTERM does: stop accepting, finish what connections sent, write
    /// the snapshot.
    pub fn stop(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// Waits until it has stopped (after [`Running::stop`] or a signal), then writes the final
    /// snapshot.
    pub fn join(self) -> Result<(), ServeError> {
        for t in self.workers {
            let _ = t.join();
        }
        self.shared.backends.shutdown();
        // Release: the control thread's Acquire load sees the workers' end.
        self.shared.workers_done.store(true, Ordering::Release);
        let _ = self.control.join();
        control::final_snapshot(&self.shared)
    }
}

/// Starts the server (listeners bound when this returns) and answers until stopped.
pub fn start(args: ServeArgs) -> Result<Running, ServeError> {
    // The rules are read first: a refused file is the likelier mistake, and says so before
    // anything else happens.
    let rules = match &args.rules {
        None => None,
        Some(p) => Some(Rules::from_file(p).map_err(ServeError::Rules)?),
    };
    let mtime = args
        .rules
        .as_ref()
        .and_then(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    let envoy_stamp = args
        .envoy_config
        .as_deref()
        .map(control::stamp)
        .unwrap_or_default();
    // A Redis backend is connected before anything listens: a Redis that cannot be reached
    // is said at the [backend] line, as a refused rules file is.
    let backends = backend::Backends::new();
    let change = match &rules {
        Some(r) => Some(backends.prepare(r).map_err(ServeError::Rules)?),
        None => None,
    };
    let envoy = extra::envoy(&args)?;
    if let Some(p) = &args.snapshot {
        snapshot::writable(p).map_err(|e| {
            ServeError::Other(format!(
                "--snapshot {}: cannot write there ({e}): give a file in a directory that exists and this user may write",
                p.display()
            ))
        })?;
    }
    let restored = match &args.snapshot {
        Some(p) => match snapshot::read(p) {
            Ok(s) => s,
            Err(e) => {
                if args.snapshot_required {
                    return Err(ServeError::Snapshot(e));
                }
                tracing::error!(error = %e, "snapshot refused; starting empty");
                None
            }
        },
        None => None,
    };
    let seed = match &restored {
        Some(s) => s.seed,
        None => {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b)
                .map_err(|e| ServeError::Other(format!("no random seed: {e}")))?;
            u64::from_le_bytes(b)
        }
    };
    // The engine's key ids are hashes under the snapshot's seed, and its clock continues the
    // snapshot's timeline, so that restored records mean what they meant (snapshot.rs).
    let engine = match rules {
        None => None,
        Some(rules) => {
            let e = Engine::builder(rules.clone())
                .seed(seed)
                .build_with_clock(snapshot::Timeline::continuing(restored.as_ref()))
                .map_err(ServeError::Rules)?;
            if let Some(c) = change {
                backends.commit(c, &rules);
            }
            tracing::info!(rules = %args.rules.as_deref().unwrap_or(Path::new("")).display(), summary = %e.summary(), backend = backends.name(), "rules loaded");
            Some(e)
        }
    };
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let throttles = throttle::Throttles::new(args.throttle_memory, args.throttle_keys, seed);
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
    let (tx, _) = tokio::sync::watch::channel(false);
    let shared = Arc::new(Shared {
        bounds: resp::Bounds {
            max_args: args.max_args.max(1),
            max_bulk: args.max_bulk,
            max_inline: args.max_inline.max(16),
        },
        engine,
        backends,
        envoy,
        throttles,
        metrics: metrics::Metrics::new(workers),
        connections: AtomicUsize::new(0),
        shutdown: tx,
        reload_lock: Mutex::new(mtime),
        envoy_lock: Mutex::new(envoy_stamp),
        snapshot_lock: Mutex::new(()),
        workers_done: AtomicBool::new(false),
        args,
    });
    // Signal handlers first: a signal that follows the first accepted connection is handled.
    let prepared = control::prepare()?;
    let (resp, http, mut threads) = workers::spawn(&shared, workers)?;
    let mut grpc = None;
    let started = extra::spawn(&shared).and_then(|(t, g)| {
        threads.extend(t);
        grpc = g;
        control::spawn(&shared, prepared)
    });
    let control = match started {
        Ok(c) => c,
        Err(e) => {
            shared.shutdown.send_replace(true);
            for t in threads {
                let _ = t.join();
            }
            return Err(e);
        }
    };
    tracing::info!(%resp, %http, workers, runtime = ?shared.args.runtime, "serving");
    Ok(Running {
        resp,
        http,
        grpc,
        shared,
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

/// `turnstile serve`: logs to stderr (`RUST_LOG`, default `info`), starts, and runs until
/// SIGTERM or SIGINT (a second one exits at once).
pub fn run(args: ServeArgs) -> Result<(), ServeError> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(|| LogWriter)
        // Colours for a terminal only: a log file or a collector gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let r = start(args)?;
    r.join()
}
