//! `turnstile bench`'s options: the clap arguments and their validation into [`Options`].

use super::keys::Distribution;
use super::limits::throughput_limit;
use super::run;
use crate::args::parse_count;
use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use std::time::Duration;
use turnstile::Algorithm;

/// Checks/s and latency of turnstile and governor 0.10, side by side, on the same quota and
/// keys. Progress goes to stderr; the table (or --json) to stdout.
#[derive(Args)]
#[command(group(ArgGroup::new("mode").args(["clocks", "plot", "callgrind"])))]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// The service and the layer instead of the engine: `tower`, `serve`, `ab`.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// turnstile's algorithm: token_bucket, fixed_window, sliding_window, leaky_bucket,
    /// sliding_log, window_ring (governor always runs its GCRA, on the token bucket's numbers).
    #[arg(long, value_name = "NAME", default_value = "token_bucket")]
    pub algorithm: Algorithm,
    /// Keys in the keyed workloads (accepts 10k, 1M, 1e6).
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "1M")]
    pub keys: u64,
    /// Comma-separated: unkeyed, uniform, zipf, zipf:S, hot.
    #[arg(long, value_name = "LIST", default_value = "unkeyed,uniform,zipf,hot")]
    pub distribution: String,
    /// Worker threads, comma-separated; pinned to cores.
    #[arg(long, value_name = "LIST", default_value = "1,2")]
    pub threads: String,
    /// Measured seconds per run (plus a tenth as warm-up).
    #[arg(
        long,
        value_name = "S",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub seconds: f64,
    /// Batch size for turnstile's batch runs (0: none): `check_batch_verdicts`, the compact
    /// answers.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "32")]
    pub batch: u64,
    /// Also run batches through `check_batch` (a whole Decision per key): rows "batch N D".
    #[arg(long)]
    pub batch_decisions: bool,
    /// Which engines run (redis: the Redis store's own rows, see --redis-url).
    #[arg(long, value_name = "NAME", value_enum, default_value = "both")]
    pub engine: Engines,
    /// The Redis server `--engine redis` measures (a scratch one: the run writes keys).
    #[arg(long, value_name = "URL")]
    pub redis_url: Option<String>,
    /// Calls per row with `--engine redis` (accepts 20k, 1e5).
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "20000")]
    pub redis_requests: u64,
    /// Run every configuration N times, interleaved; report medians.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "1")]
    pub repeat: u64,
    /// One JSON document on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Cost of each clock, raw and inside a keyed check, and exit.
    #[arg(long)]
    pub clocks: bool,
    /// Sweep keys (1k..10M) and threads, write an SVG plot to FILE.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<String>,
    /// A fixed, untimed workload for `valgrind --tool=callgrind` (see docs/performance.md).
    #[arg(long)]
    pub callgrind: bool,
    /// A rule whose keys have limits of their own (a limits class, from a file of --keys
    /// entries) against the same rule's own limit, side by side; with the file's load time
    /// and the bytes per entry (see docs/rules.md). With --callgrind: instructions per check
    /// of each rule.
    #[arg(long, conflicts_with_all = ["clocks", "plot"])]
    pub own_limits: bool,
    /// Checks in the --callgrind workload.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "1048576")]
    pub checks: u64,
    /// Cost of an 8-byte and a 16-byte read-then-CAS update, on 1 thread and on 2 threads
    /// sharing one location (the hot key's bound); takes no other option.
    #[arg(long, exclusive = true)]
    pub atomics: bool,
}

/// The benchmarks of the service and of the layer, each driving real servers and clients.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// turnstile-tower's layer: an axum hello world with and without it under wrk, or
    /// instructions per request under callgrind.
    Tower(super::tower::TowerArgs),
    /// `turnstile serve` beside redis-server (INCR; redis-cell's CL.THROTTLE with --cell-so):
    /// redis-benchmark at each pipeline depth and wrk on POST /v1/check.
    Serve(super::serve::ServeArgs),
    /// turnstile builds against each other on CL.THROTTLE, redis-server's INCR in every round.
    Ab(super::serve::AbArgs),
    /// Nodes sharing limits through Redis (a server or a 3-master cluster it starts): the
    /// per-check path, leases and INCR, admissions against the exact limit per key and window.
    Fleet(super::fleet::FleetArgs),
    /// The engine's cost per check from 1k to 100M keys (uniform, Zipf; single, batched),
    /// bytes per key, governor and the floor at each size, and a plot (about 11 minutes to 100M).
    Scale(ScaleArgs),
    /// The published suite in one run (engine, scale, service, layer, Redis), written to
    /// docs/benchmarks.md with its plots, the machine and the commands.
    Report(super::published::ReportArgs),
}

/// Which engines run.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Engines {
    Both,
    Turnstile,
    Governor,
    /// RedisStore against a Redis server (`--redis-url`), beside INCR.
    Redis,
}

/// A keyless run, or a keyed one under a distribution.
#[derive(Clone, Copy, PartialEq)]
pub enum Workload {
    Unkeyed,
    Keyed(Distribution),
}

/// Parsed options.
pub(crate) struct Options {
    pub algorithm: Algorithm,
    pub keys: u64,
    pub workloads: Vec<Workload>,
    pub threads: Vec<usize>,
    pub seconds: f64,
    pub batch: usize,
    pub batch_decisions: bool,
    pub engines: Engines,
    pub repeat: usize,
    pub json: bool,
    pub checks: u64,
}

/// A comma-separated option's values, each parsed by `f`; at least one.
fn list<T>(s: &str, name: &str, f: impl Fn(&str) -> crate::Result<T>) -> crate::Result<Vec<T>> {
    let v: crate::Result<Vec<T>> = s.split(',').map(|w| f(w.trim())).collect();
    match v {
        Ok(v) if !v.is_empty() => Ok(v),
        Ok(_) => Err(format!("option --{name}: give at least one value").into()),
        Err(e) => Err(format!("option --{name}: {e}").into()),
    }
}

impl Options {
    pub(crate) fn parse(a: &BenchArgs) -> crate::Result<Self> {
        let algorithm = a.algorithm;
        throughput_limit(algorithm).map_err(|e| format!("option --algorithm: {e}"))?;
        let keys = a.keys;
        if keys == 0 || keys > 1_000_000_000 {
            return Err(format!("option --keys: {keys} keys; give 1 to 1e9 (e.g. 1M)").into());
        }
        let workloads = list(&a.distribution, "distribution", |w| match w {
            "unkeyed" | "none" => Ok(Workload::Unkeyed),
            _ => Ok(Workload::Keyed(w.parse()?)),
        })?;
        let threads = list(&a.threads, "threads", |w| match w.parse::<usize>() {
            Ok(t) if (1..=256).contains(&t) => Ok(t),
            _ => Err(format!("`{w}` is not a thread count from 1 to 256").into()),
        })?;
        let seconds = a.seconds;
        if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0) {
            return Err(format!(
                "option --seconds: {seconds} is not a duration above 0 and at most 3600 seconds (e.g. 0.5)"
            )
            .into());
        }
        let batch = a.batch as usize;
        if batch > run::CHUNK {
            return Err(format!(
                "option --batch: {batch} is larger than {}; give 0 (no batch runs) to {}",
                run::CHUNK,
                run::CHUNK
            )
            .into());
        }
        let repeat = a.repeat;
        if !(1..=100).contains(&repeat) {
            return Err(format!("option --repeat: {repeat}; give 1 to 100").into());
        }
        let checks = a.checks;
        if checks == 0 || checks > 1 << 32 {
            return Err(format!("option --checks: {checks}; give 1 to 2^32").into());
        }
        Ok(Self {
            algorithm,
            keys,
            workloads,
            threads,
            seconds,
            batch,
            batch_decisions: a.batch_decisions,
            engines: a.engine,
            repeat: repeat as usize,
            json: a.json,
            checks,
        })
    }

    /// The warm-up before each measured window: a tenth of it.
    pub(crate) fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.seconds / 10.0)
    }

    /// The measured window of each run.
    pub(crate) fn window(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }

    /// The most threads any run uses.
    pub(crate) fn max_threads(&self) -> usize {
        *self.threads.iter().max().expect("at least one")
    }

    /// Whether turnstile's and governor's rows run.
    pub(crate) fn turnstile_and_governor(&self) -> (bool, bool) {
        (
            self.engines != Engines::Governor,
            self.engines != Engines::Turnstile,
        )
    }

    /// What `--clocks` takes.
    pub(crate) fn clock_options(&self) -> ClockOptions {
        ClockOptions {
            algorithm: self.algorithm,
            keys: self.keys,
            seconds: self.seconds,
            json: self.json,
        }
    }
}

/// Options of `--clocks`.
pub struct ClockOptions {
    pub algorithm: Algorithm,
    pub keys: u64,
    pub seconds: f64,
    pub json: bool,
}

/// Cost per check from 1k to 100M keys (uniform and Zipf; single and batched), bytes per key,
/// governor and the floor at each size, and the plot of ns/check against keys.
#[derive(Args)]
pub struct ScaleArgs {
    /// The largest size: 1k, 10k, 100k, 1M, 10M or 100M (the sizes up to it run).
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "100M")]
    pub(crate) max_keys: u64,
    /// Measured seconds per row (plus a tenth as warm-up).
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    pub(crate) seconds: f64,
    /// A smoke run: 0.1 s per row.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Leave governor out.
    #[arg(long)]
    pub(crate) no_governor: bool,
    /// Write the plot of CPU-ns per check against keys (log scale) as an SVG to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) plot: Option<String>,
    /// One JSON document on stdout instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}
