//! The options of `turnstile soak`.

use super::attack::Kind;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The options of `turnstile soak`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example (a release server on free ports, with a password):\n  \
    turnstile serve --requirepass-file pw --rules examples/rules.toml --resp 127.0.0.1:6390 --http 127.0.0.1:8090 \\\n      \
    --grpc 127.0.0.1:8091 --envoy-config examples/envoy/ --admin 127.0.0.1:8092 2> server.log &\n  \
    turnstile soak --target 127.0.0.1:6390 --http 127.0.0.1:8090 --grpc 127.0.0.1:8091 --admin 127.0.0.1:8092 \\\n      \
    --password-file pw --server-log server.log --plot soak.svg\n\n\
    The server's process is found from the port it listens on (or give --pid); its flags are read\n\
    from its command line to compute the memory bound. Figures depend on the machine's load:\n\
    the load average is reported with them."
)]
pub struct SoakArgs {
    /// The server's RESP address (a loopback address: the soak attacks nothing else).
    #[arg(long)]
    pub target: SocketAddr,
    /// The server's HTTP address (loopback): honest POST /v1/check, the HTTP attacks and
    /// /metrics. Without it, RESP only.
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// The server's gRPC address (loopback, `serve --grpc`): honest ShouldRateLimit calls and
    /// the gRPC attacks. Without it, neither.
    #[arg(long)]
    pub grpc: Option<SocketAddr>,
    /// The server's admin address (loopback, `serve --admin`): attacked without credentials
    /// and with the client password.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// A file holding the server's password (--requirepass-file).
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// Attacking connections at once.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=20_000))]
    pub connections: u32,
    /// How long the attack lasts (seconds, or a duration such as 2m).
    #[arg(long, default_value = "60", value_parser = seconds)]
    pub seconds: Duration,
    /// The quiet run before it: the honest clients alone.
    #[arg(long, default_value = "10", value_parser = seconds)]
    pub quiet: Duration,
    /// How long to watch the server after the attackers leave (its memory at the end is the
    /// "after" figure).
    #[arg(long, default_value = "60", value_parser = seconds)]
    pub settle: Duration,
    /// The server's process id (default: the process listening on --target).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Honest RESP clients (CL.THROTTLE).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub honest_resp: u32,
    /// Honest HTTP clients (POST /v1/check).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub honest_http: u32,
    /// Honest gRPC clients (ShouldRateLimit; with --grpc).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub honest_grpc: u32,
    /// Each honest client sends one request this often.
    #[arg(long, default_value = "5ms", value_parser = turnstile::rules::parse_duration)]
    pub every: Duration,
    /// Only these kinds of attackers (comma-separated), in their shares of the mix; all by
    /// default.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub kinds: Vec<Kind>,
    /// The server's log (its standard error): a `panicked` in it fails the no-panic target,
    /// and its lines per second per kind of message are counted while the soak runs.
    #[arg(long)]
    pub server_log: Option<PathBuf>,
    /// Print the report as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    /// Draw RSS and the honest p99 over time into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// Seconds as a number, or a duration with its unit.
fn seconds(s: &str) -> crate::Result<Duration> {
    let d = match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Duration::from_secs_f64(x),
        Ok(_) => return Err(format!("`{s}` is not a number of seconds").into()),
        Err(_) => turnstile::rules::parse_duration(s)?,
    };
    if d > Duration::from_secs(3600) {
        return Err(format!("`{s}`: at most an hour").into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(seconds("60").ok(), Some(Duration::from_secs(60)));
        assert_eq!(seconds("2m").ok(), Some(Duration::from_secs(120)));
        assert!(seconds("2h").is_err());
        assert!(seconds("soon").is_err());
    }
}
