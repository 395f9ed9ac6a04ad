//! `turnstile bench`: checks per second and sampled latency of the embedded engine, side by
//! side with governor 0.10 in the same run, on the same quota and the same pre-generated keys.
//!
//! The default suite (about 30 s on 2 cores): the keyless limiter against governor's direct
//! limiter, then a keyed store of 1M u64 keys against governor's keyed (DashMap) limiter under
//! uniform, Zipf (s = 1) and one-hot-key traffic, on 1 and 2 pinned threads, with turnstile's
//! `check_batch` as a third contender; then the hot-key exactness checks. Other modes:
//! `--clocks` (cost of each clock, alone and inside a check), `--plot FILE` (checks/s against
//! key count and threads, as an SVG) and `--callgrind` (a fixed workload to count instructions
//! per check under valgrind). Results and their caveats: `docs/performance.md`.
//!
//! Subcommands measure the service and the layer with the programs their users run: `serve`
//! (redis-benchmark and wrk against `turnstile serve`, beside redis-server and redis-cell),
//! `ab` (turnstile builds against each other), `tower` (turnstile-tower's layer under wrk
//! and callgrind) and `fleet` (nodes sharing limits through Redis, with and without leases); `scale`
//! (the engine's cost from 1k to 100M keys) and `report` (the whole published suite, written
//! to docs/benchmarks.md). They drive those programs as child processes (`drive.rs`), read their output
//! (`wrk.rs`), and share this module's medians and number formats; `server/bench.sh`,
//! `server/ab.sh` and `tower/bench.sh` only build and call them.

mod atomics;
mod clocks;
mod drive;
mod exact;
mod fleet;
mod floor;
mod keys;
mod limits;
mod options;
mod own_limits;
mod plot;
mod published;
mod redis;
mod report;
mod row;
mod run;
mod scale;
mod scale_table;
mod serve;
mod suite;
mod text;
mod tower;
mod wrk;

pub use options::BenchArgs;
use options::{BenchCommand, Engines, Options};
use text::progress_done;

/// An error from Redis as the commands report it: what failed, where, what to do.
pub(crate) fn redis_error(url: &str, e: turnstile_redis::Error) -> String {
    format!(
        "redis at {url}: {e} (is redis-server running there? start one with `redis-server --port PORT --save '' --appendonly no` and pass --redis-url redis://127.0.0.1:PORT)"
    )
}

/// The runtime of the Redis rows (bench and memory): one worker thread, the Redis client's
/// I/O on it.
pub(crate) fn redis_runtime() -> crate::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}").into())
}

/// Runs the command.
pub fn run(mut args: BenchArgs) -> crate::Result<()> {
    match args.command.take() {
        Some(BenchCommand::Tower(a)) => return tower::run(a),
        Some(BenchCommand::Serve(a)) => return serve::run_serve(a),
        Some(BenchCommand::Ab(a)) => return serve::run_ab(a),
        Some(BenchCommand::Fleet(a)) => return fleet::run(a),
        Some(BenchCommand::Scale(a)) => return scale::run(a),
        Some(BenchCommand::Report(a)) => return published::run(a),
        None => {}
    }
    if args.atomics {
        return atomics::run();
    }
    match (args.engine, &args.redis_url) {
        (Engines::Redis, Some(url)) => return redis::run(url, args.redis_requests, args.json),
        (Engines::Redis, None) => {
            return Err("--engine redis needs --redis-url redis://HOST:PORT".into())
        }
        (_, Some(_)) => return Err("--redis-url is for --engine redis".into()),
        _ => {}
    }
    let o = Options::parse(&args)?;
    text::quiet(o.json);
    if args.clocks {
        return clocks::run(&o.clock_options());
    }
    if args.callgrind && args.own_limits {
        return own_limits::callgrind(o.keys, o.checks);
    }
    if args.callgrind {
        return clocks::callgrind(o.algorithm, o.keys, o.checks, o.batch.max(1));
    }
    if args.own_limits {
        let repeat = if args.repeat > 1 { o.repeat } else { 3 };
        return own_limits::run(o.keys, o.seconds, repeat, o.json);
    }
    if let Some(f) = args.plot {
        // Said before the sweep (tens of seconds), not after it.
        let dir = std::path::Path::new(&f)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        if !dir.is_dir() {
            return Err(format!(
                "option --plot: {f}: the directory {} does not exist; create it or give another path",
                dir.display()
            )
            .into());
        }
        return plot::run(&f, o.algorithm, &o.threads, o.seconds, o.batch, o.json);
    }
    let r = suite::suite(&o);
    progress_done();
    r
}
