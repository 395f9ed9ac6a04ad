//! The flags of `turnstile serve` ([`ServeArgs`]) and their parsers. They are read once, in
//! [`crate::start`], into the per-listener configurations of [`crate::config`]; nothing else
//! reads them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How connections are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    /// One worker thread per core, pinned, each with its own io_uring and its own
    /// `SO_REUSEPORT` RESP listener; HTTP and gRPC on tokio. Where io_uring is unavailable (an
    /// older kernel, a seccomp profile that blocks it, `TURNSTILE_IO_URING=off`), or with
    /// TLS, RESP is served as `per-core` (the log says so).
    Uring,
    /// One worker thread per core, pinned, each with its own current-thread runtime and its
    /// own `SO_REUSEPORT` listeners (the kernel spreads connections over them).
    PerCore,
    /// One multi-thread tokio runtime of `--workers` threads and one listener per protocol.
    MultiThread,
}

pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    turnstile::rules::parse_duration(s).map_err(|e| e.to_string())
}

/// `--coalesce`: at most 10 ms (the wait is per loop, added to each request it holds).
fn coalesce(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d > Duration::from_millis(10) {
        return Err(format!(
            "`{s}` is longer than 10ms: each request a wait holds is that much later; try 200us"
        ));
    }
    Ok(d)
}

fn workers(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(n),
        _ => Err(format!("`{s}` is not a number of workers from 1 to 4096")),
    }
}

/// A size in bytes: a number, optionally followed by `b`, `kb`/`k`, `mb`/`m` or `gb`/`g`
/// (powers of 1024, any case), as Redis writes sizes in its configuration.
pub(crate) fn bytes(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let mul: u64 = match unit {
        "" | "b" => 1,
        "k" | "kb" => 1 << 10,
        "m" | "mb" => 1 << 20,
        "g" | "gb" => 1 << 30,
        _ => {
            return Err(format!(
                "`{s}`: the unit must be b, kb, mb or gb (e.g. 64kb)"
            ))
        }
    };
    n.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("`{s}` is not a size: write a number of bytes, e.g. 4096 or 64kb"))
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
    /// A second HTTP address for the operations that change the server (POST /v1/reload),
    /// served without the admin password; it must be a loopback address unless --admin-pass
    /// is set.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// envoyproxy/ratelimit YAML configuration, a file or a directory (docs/envoy.md): served
    /// over gRPC on --grpc and as POST /json on the HTTP address; reloaded like the rules
    /// file. SHADOW_MODE and the LIMIT_* variables of the environment apply.
    #[arg(long)]
    pub envoy_config: Option<PathBuf>,
    /// Snapshot file of every store (CL.THROTTLE's and the rules'): restored on start,
    /// written periodically and on graceful shutdown. A file that cannot be restored is moved
    /// aside (FILE.corrupt-TIME), never overwritten. A symbolic link at FILE is followed only
    /// if this user or root owns it; none beside FILE is.
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
    /// uring (io_uring, thread per core; per-core where io_uring is unavailable), per-core
    /// (pinned current-thread tokio runtimes) or multi-thread (one tokio runtime).
    #[arg(long, value_enum, default_value = "uring")]
    pub runtime: RuntimeKind,
    /// The password every client must give: AUTH (or HELLO ... AUTH) on RESP,
    /// `Authorization: Bearer PASSWORD` on HTTP, `authorization` metadata on gRPC. Prefer
    /// --requirepass-file: a command line is visible to every user of the machine.
    #[arg(long, conflicts_with = "requirepass_file")]
    pub requirepass: Option<String>,
    /// A file holding the password of --requirepass (one line; a final newline is ignored).
    #[arg(long)]
    pub requirepass_file: Option<PathBuf>,
    /// The password of the operations that change the server (POST /v1/reload): HTTP
    /// `Authorization: Bearer PASSWORD`, RESP `AUTH admin PASSWORD`. Without it they are
    /// served only on loopback listeners (and --admin).
    #[arg(long, conflicts_with = "admin_pass_file")]
    pub admin_pass: Option<String>,
    /// A file holding the password of --admin-pass.
    #[arg(long)]
    pub admin_pass_file: Option<PathBuf>,
    /// Serve on addresses other machines can reach without a password (refused otherwise,
    /// as Redis's protected mode refuses).
    #[arg(long)]
    pub unprotected: bool,
    /// Serve GET /metrics without the password when one is set.
    #[arg(long)]
    pub metrics_open: bool,
    /// TLS certificate chain (PEM): every listener (RESP, HTTP, gRPC, admin) then speaks TLS
    /// only. Needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM, PKCS#8, PKCS#1 or SEC1). Needs --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Keys CL.THROTTLE holds (one record each, whatever parameters its commands give; the
    /// stalest are evicted when full). About 20 bytes per key.
    #[arg(long, default_value_t = 1 << 21)]
    pub throttle_keys: u64,
    /// Most simultaneous RESP connections; more are told so and closed.
    #[arg(long, default_value_t = 10_000)]
    pub max_connections: usize,
    /// Close a RESP connection idle this long, reading or writing ("0": never).
    #[arg(long, default_value = "300s", value_parser = duration)]
    pub idle_timeout: Duration,
    /// io_uring runtime: when a worker's last loop found several completions, wait up to this
    /// long for as many again before serving them, then go on with those that came (io_uring's
    /// min_wait, Linux 6.12+). Less server CPU per request under load, at up to this much more
    /// latency per request; after a loop that found one, no wait ("0": off). E.g. "200us".
    #[arg(long, env = "TURNSTILE_COALESCE", default_value = "0", value_parser = coalesce)]
    pub coalesce: Duration,
    /// Most arguments in one RESP command (no command takes more than 8; COMMAND DOCS and
    /// INFO take names).
    #[arg(long, default_value_t = 16)]
    pub max_args: usize,
    /// Longest RESP argument (a key, a password), in bytes.
    #[arg(long, default_value = "4kb", value_parser = bytes)]
    pub max_bulk: usize,
    /// Longest RESP inline command, in bytes.
    #[arg(long, default_value = "16kb", value_parser = bytes)]
    pub max_inline: usize,
    /// Most output a RESP connection may have waiting for its client in the server's buffer
    /// (the kernel's send queue holds at most 256 KiB more): a client that stops reading is
    /// disconnected past it, as Redis's client-output-buffer-limit does.
    #[arg(long, default_value = "1mb", value_parser = bytes)]
    pub client_output_limit: usize,
    /// Largest HTTP request body, and gRPC message, in bytes (larger: 413, gRPC
    /// RESOURCE_EXHAUSTED).
    #[arg(long, default_value = "64kb", value_parser = bytes)]
    pub max_body: usize,
    /// Largest HTTP request head (request line and headers), in bytes (larger: 431).
    #[arg(long, default_value = "16kb", value_parser = bytes)]
    pub max_header_bytes: usize,
    /// The rate-limit headers of POST /v1/check: draft10 (`RateLimit`, `RateLimit-Policy`),
    /// legacy (`RateLimit-Limit`, `-Remaining`, `-Reset`) or both.
    #[arg(long, value_enum, default_value = "draft10")]
    pub ratelimit_headers: crate::RateLimitHeaders,
    /// Most headers in one HTTP request (more: 431).
    #[arg(long, default_value_t = 64)]
    pub max_headers: usize,
    /// Most simultaneous HTTP connections; more are closed at once.
    #[arg(long, default_value_t = 10_000)]
    pub max_http_connections: usize,
    /// Most simultaneous gRPC connections (--grpc); more are closed at once.
    #[arg(long, default_value_t = 10_000)]
    pub max_grpc_connections: usize,
    /// Most simultaneous connections to --admin; more are closed at once. Counted apart from
    /// the others, so that a flood of the API does not lock the operators out.
    #[arg(long, default_value_t = 64)]
    pub max_admin_connections: usize,
    /// Close a connection that has not shown the password (--requirepass) this long after it
    /// was accepted: RESP without AUTH, HTTP and gRPC without a request that gave it ("0":
    /// never).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub auth_timeout: Duration,
    /// Close an HTTP or gRPC connection whose request body is not whole this long after it
    /// began ("0": never).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub body_timeout: Duration,
    /// The slowest a request body may come, in bytes a second, after its first 5 s (slower:
    /// the connection is closed; "0": no minimum). As Apache's mod_reqtimeout MinRate: each
    /// such amount received buys one more second.
    #[arg(long, default_value = "1kb", value_parser = bytes)]
    pub min_body_rate: usize,
    /// Most HTTP/2 streams (requests) at once on one connection, HTTP and gRPC.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_streams: u32,
    /// Request bodies the server may hold at once (received, not yet answered), every
    /// connection's together; past it a request is answered 503 (gRPC: RESOURCE_EXHAUSTED).
    #[arg(long, default_value = "64mb", value_parser = bytes)]
    pub body_memory: usize,
    /// A TLS handshake must finish this long after the connection was accepted.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub tls_handshake_timeout: Duration,
    /// Close an HTTP connection without a request in progress for this long (within 2 s
    /// after), and a gRPC connection that has not begun a call: a client that trickles its
    /// headers, sends nothing, or keeps a connection idle between requests, does not hold it
    /// for good ("0": never; nginx's client_header_timeout is 60 s too).
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub header_timeout: Duration,
    /// Close a gRPC connection without a call in progress for this long, once it has had
    /// one (before its first call --header-timeout applies): Envoy keeps its connection to a
    /// rate limit service open between calls, and closes it itself after an hour idle ("0":
    /// never).
    #[arg(long, default_value = "1h", value_parser = duration)]
    pub grpc_idle_timeout: Duration,
    /// How often to look whether the rules file or the Envoy configuration changed ("0":
    /// never; SIGHUP and POST /v1/reload still reload).
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub watch_every: Duration,
    /// The share of a limit past which an admission counts as near the limit in /metrics
    /// (`turnstile_rule_limit_events_total{event="near_limit"}`: admitted with less than
    /// `1 - share` of the limit left), from 0 to 1.
    #[arg(long, default_value_t = 0.8, value_parser = share)]
    pub near_limit: f64,
    /// How many of the most denied keys GET /v1/top-denied answers (a sketch of 4 x K
    /// slots per thread that denies; 0: none recorded), at most 1000.
    #[arg(long, default_value_t = 10, value_parser = top_k)]
    pub top_denied: usize,
}

/// `--top-denied`: 0 to [`crate::denied::MAX_K`] keys.
fn top_k(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(k) if k <= crate::denied::MAX_K => Ok(k),
        _ => Err(format!(
            "`{s}` is not a number of keys from 0 to {}",
            crate::denied::MAX_K
        )),
    }
}

/// `--near-limit`: a share from 0 to 1.
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!(
            "`{s}` is not a share of the limit from 0 to 1 (e.g. 0.8)"
        )),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("64kb"), Ok(65536));
        assert_eq!(bytes("1MB"), Ok(1 << 20));
        assert_eq!(bytes("2g"), Ok(2 << 30));
        assert!(bytes("1.5mb").is_err());
        assert!(bytes("12 parsecs").is_err());
        assert!(bytes("").is_err());
        assert!(bytes("99999999999999999999gb").is_err());
    }

    #[test]
    fn coalescing_waits_are_short() {
        assert_eq!(coalesce("0"), Ok(Duration::ZERO));
        assert_eq!(coalesce("200us"), Ok(Duration::from_micros(200)));
        assert_eq!(coalesce("10ms"), Ok(Duration::from_millis(10)));
        let e = coalesce("11ms").unwrap_err();
        assert!(e.contains("longer than 10ms") && e.contains("200us"), "{e}");
        assert!(coalesce("soon").is_err());
    }

    #[test]
    fn defaults_parse() {
        let a = ServeArgs::new();
        assert_eq!(a.max_bulk, 4096);
        assert_eq!(a.client_output_limit, 1 << 20);
    }
}
