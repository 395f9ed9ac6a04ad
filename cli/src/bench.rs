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

mod atomics;
mod clocks;
mod floor;
mod keys;
mod limits;
mod own_limits;
mod plot;
mod redis;
mod run;

use super::args::parse_count;
use clap::{ArgGroup, Args, ValueEnum};
use governor::RateLimiter;
use keys::Distribution;
pub(crate) use limits::{governor_quota, store_capacity, throughput_limit};
use run::{Checker, Measured, Mode, Timer};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Algorithm, Clock, Limit, Limiter, Limits, ManualClock};

/// Checks/s and latency of turnstile and governor 0.10, side by side, on the same quota and
/// keys. Progress goes to stderr; the table (or --json) to stdout.
#[derive(Args)]
#[command(group(ArgGroup::new("mode").args(["clocks", "plot", "callgrind", "own_limits"])))]
pub struct BenchArgs {
    /// turnstile's algorithm: token_bucket, fixed_window, sliding_window, leaky_bucket,
    /// sliding_log, window_ring (governor always runs its GCRA, on the token bucket's numbers).
    #[arg(long, value_name = "NAME", default_value = "token_bucket")]
    algorithm: Algorithm,
    /// Keys in the keyed workloads (accepts 10k, 1M, 1e6).
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "1M")]
    keys: u64,
    /// Comma-separated: unkeyed, uniform, zipf, zipf:S, hot.
    #[arg(long, value_name = "LIST", default_value = "unkeyed,uniform,zipf,hot")]
    distribution: String,
    /// Worker threads, comma-separated; pinned to cores.
    #[arg(long, value_name = "LIST", default_value = "1,2")]
    threads: String,
    /// Measured seconds per run (plus a tenth as warm-up).
    #[arg(
        long,
        value_name = "S",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    seconds: f64,
    /// Batch size for turnstile's batch runs (0: none): `check_batch_verdicts`, the compact
    /// answers.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "32")]
    batch: u64,
    /// Also run batches through `check_batch` (a whole Decision per key): rows "batch N D".
    #[arg(long)]
    batch_decisions: bool,
    /// Which engines run (redis: the Redis store's own rows, see --redis-url).
    #[arg(long, value_name = "NAME", value_enum, default_value = "both")]
    engine: Engines,
    /// The Redis server `--engine redis` measures (a scratch one: the run writes keys).
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// Calls per row with `--engine redis` (accepts 20k, 1e5).
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "20000")]
    redis_requests: u64,
    /// Run every configuration N times, interleaved; report medians.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "1")]
    repeat: u64,
    /// One JSON document on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Cost of each clock, raw and inside a keyed check, and exit.
    #[arg(long)]
    clocks: bool,
    /// Sweep keys (1k..10M) and threads, write an SVG plot to FILE.
    #[arg(long, value_name = "FILE")]
    plot: Option<String>,
    /// A fixed, untimed workload for `valgrind --tool=callgrind` (see docs/performance.md).
    #[arg(long)]
    callgrind: bool,
    /// A rule whose keys have limits of their own (a limits class, from a file of --keys
    /// entries) against the same rule's own limit, side by side; with the file's load time
    /// and the bytes per entry (see docs/rules.md).
    #[arg(long)]
    own_limits: bool,
    /// Checks in the --callgrind workload.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "1048576")]
    checks: u64,
    /// Cost of an 8-byte and a 16-byte read-then-CAS update, on 1 thread and on 2 threads
    /// sharing one location (the hot key's bound); takes no other option.
    #[arg(long, exclusive = true)]
    atomics: bool,
}

/// Which engines run.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Engines {
    Both,
    Turnstile,
    Governor,
    /// RedisStore against a Redis server (`--redis-url`), beside INCR.
    Redis,
}

/// A keyless run, or a keyed one under a distribution.
#[derive(Clone, Copy, PartialEq)]
enum Workload {
    Unkeyed,
    Keyed(Distribution),
}

/// Parsed options.
pub(crate) struct Options {
    algorithm: Algorithm,
    keys: u64,
    workloads: Vec<Workload>,
    threads: Vec<usize>,
    seconds: f64,
    batch: usize,
    batch_decisions: bool,
    engines: Engines,
    repeat: usize,
    json: bool,
    checks: u64,
}

fn list<T>(s: &str, name: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    let v: Result<Vec<T>, String> = s.split(',').map(|w| f(w.trim())).collect();
    match v {
        Ok(v) if !v.is_empty() => Ok(v),
        Ok(_) => Err(format!("option --{name}: give at least one value")),
        Err(e) => Err(format!("option --{name}: {e}")),
    }
}

impl Options {
    fn parse(a: &BenchArgs) -> Result<Self, String> {
        let algorithm = a.algorithm;
        throughput_limit(algorithm).map_err(|e| format!("option --algorithm: {e}"))?;
        let keys = a.keys;
        if keys == 0 || keys > 1_000_000_000 {
            return Err(format!(
                "option --keys: {keys} keys; give 1 to 1e9 (e.g. 1M)"
            ));
        }
        let workloads = list(&a.distribution, "distribution", |w| match w {
            "unkeyed" | "none" => Ok(Workload::Unkeyed),
            _ => w.parse().map(Workload::Keyed),
        })?;
        let threads = list(&a.threads, "threads", |w| match w.parse::<usize>() {
            Ok(t) if (1..=256).contains(&t) => Ok(t),
            _ => Err(format!("`{w}` is not a thread count from 1 to 256")),
        })?;
        let seconds = a.seconds;
        if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0) {
            return Err(format!(
                "option --seconds: {seconds} is not a duration above 0 and at most 3600 seconds (e.g. 0.5)"
            ));
        }
        let batch = a.batch as usize;
        if batch > run::CHUNK {
            return Err(format!(
                "option --batch: {batch} is larger than {}; give 0 (no batch runs) to {}",
                run::CHUNK,
                run::CHUNK
            ));
        }
        let repeat = a.repeat;
        if !(1..=100).contains(&repeat) {
            return Err(format!("option --repeat: {repeat}; give 1 to 100"));
        }
        let checks = a.checks;
        if checks == 0 || checks > 1 << 32 {
            return Err(format!("option --checks: {checks}; give 1 to 2^32"));
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

    fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.seconds / 10.0)
    }

    fn window(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }
}

/// One row of results (one JSON object of `results`).
#[derive(Serialize, Clone, Debug)]
pub(crate) struct Row {
    pub engine: &'static str,
    pub algorithm: String,
    /// `null` for the keyless limiters.
    pub keys: Option<u64>,
    /// uniform, zipf, zipf:S, hot; "unkeyed" for the keyless limiters.
    pub distribution: String,
    pub threads: usize,
    /// "single" or "batch".
    pub mode: &'static str,
    /// Keys per `check_batch` (1 for single).
    pub batch: usize,
    /// CPU time per check: the workers' CPU ns over the window / checks. What a check costs,
    /// whether or not the scheduler ran something else on the cores meanwhile.
    pub ns_per_check: f64,
    /// Checks per wall-clock second, all threads.
    pub checks_per_sec: f64,
    /// Sum over threads of checks per second of that thread's CPU time: the rate with the
    /// cores to themselves (= checks_per_sec on an idle machine). Ratios use this.
    pub cpu_checks_per_sec: f64,
    /// Fraction of the window the workers were on a CPU (1.0 on an idle machine).
    pub on_cpu: f64,
    /// Involuntary context switches of the workers during the window.
    pub preemptions: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub checks: u64,
    pub denied: u64,
    /// Repeats this row is the median of.
    pub runs: usize,
    /// The floor this row is compared with: "dependent" (single checks) or "batch"
    /// (`check_batch`), measured in the same run over a table of the store's size; `null`
    /// for the keyless rows.
    pub floor: Option<&'static str>,
    /// ns_per_check / that floor's ns_per_access.
    pub x_floor: Option<f64>,
}

impl Row {
    fn workload(&self) -> String {
        match self.keys {
            None => "unkeyed".into(),
            Some(k) => format!("{} {}", fmt_count(k), self.distribution),
        }
    }

    fn same_run(&self, o: &Row) -> bool {
        self.keys == o.keys && self.distribution == o.distribution && self.threads == o.threads
    }
}

/// The median of `v` (the upper one of an even count).
fn median<T: PartialOrd + Copy>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// Rows of the same configuration, one per repeat, folded into their medians.
fn fold(runs: Vec<Row>) -> Row {
    let mut r = runs[0].clone();
    let n = runs.len();
    r.checks_per_sec = median(runs.iter().map(|x| x.checks_per_sec).collect());
    r.cpu_checks_per_sec = median(runs.iter().map(|x| x.cpu_checks_per_sec).collect());
    r.ns_per_check = median(runs.iter().map(|x| x.ns_per_check).collect());
    r.on_cpu = median(runs.iter().map(|x| x.on_cpu).collect());
    r.preemptions = median(runs.iter().map(|x| x.preemptions).collect());
    r.p50_ns = median(runs.iter().map(|x| x.p50_ns).collect());
    r.p99_ns = median(runs.iter().map(|x| x.p99_ns).collect());
    r.p999_ns = median(runs.iter().map(|x| x.p999_ns).collect());
    r.max_ns = median(runs.iter().map(|x| x.max_ns).collect());
    r.checks = runs.iter().map(|x| x.checks).sum();
    r.denied = runs.iter().map(|x| x.denied).sum();
    r.runs = n;
    r
}

pub(crate) struct RowSpec {
    pub engine: &'static str,
    pub algorithm: String,
    pub keys: Option<u64>,
    pub distribution: String,
    pub threads: usize,
    pub mode: Mode,
}

pub(crate) fn row(spec: RowSpec, m: Measured) -> Row {
    let q = |p: f64| m.hist.value_at_quantile(p);
    Row {
        engine: spec.engine,
        algorithm: spec.algorithm,
        keys: spec.keys,
        distribution: spec.distribution,
        threads: spec.threads,
        mode: spec.mode.name(),
        batch: match spec.mode {
            Mode::Single => 1,
            Mode::Batch(b) | Mode::BatchDecisions(b) => b,
        },
        ns_per_check: m.cpu_ns as f64 / m.checks.max(1) as f64,
        checks_per_sec: m.checks_per_sec,
        cpu_checks_per_sec: m.cpu_checks_per_sec,
        on_cpu: m.cpu_ns as f64 / m.wall_ns.max(1) as f64,
        preemptions: m.preemptions,
        p50_ns: q(0.5),
        p99_ns: q(0.99),
        p999_ns: q(0.999),
        max_ns: m.hist.max(),
        checks: m.checks,
        denied: m.checks - m.allowed,
        runs: 1,
        floor: None,
        x_floor: None,
    }
}

/// Floor rows of the same configuration, one per repeat, folded into their medians.
fn fold_floor(runs: Vec<floor::FloorRow>) -> floor::FloorRow {
    let mut r = runs[0].clone();
    r.ns_per_access = median(runs.iter().map(|x| x.ns_per_access).collect());
    r.on_cpu = median(runs.iter().map(|x| x.on_cpu).collect());
    r.preemptions = median(runs.iter().map(|x| x.preemptions).collect());
    r.accesses = runs.iter().map(|x| x.accesses).sum();
    r.runs = runs.len();
    r
}

/// Sets each keyed row's "× floor": a single check (turnstile or governor) against the
/// dependent access, a `check_batch` against the batch floor, of the same keys, distribution
/// and threads.
fn attach_floors(rows: &mut [Row], floors: &[floor::FloorRow]) {
    for r in rows.iter_mut() {
        let kind = match r.mode {
            "batch" | "batch_decisions" => "batch",
            _ => "dependent",
        };
        let f = floors.iter().find(|f| {
            f.kind == kind
                && Some(f.keys) == r.keys
                && f.distribution == r.distribution
                && f.threads == r.threads
                && (kind != "batch" || f.batch == r.batch)
        });
        if let Some(f) = f {
            r.floor = Some(f.kind);
            r.x_floor = Some(r.ns_per_check / f.ns_per_access);
        }
    }
}

/// `n` key sequences of `len` keys, one per thread, carved from one draw.
pub(crate) fn sequences(d: Distribution, keys: u64, threads: usize, len: usize) -> Vec<u64> {
    keys::sequence(d, keys, len * threads, 0x0be7_c4ec_5eed ^ keys)
}

/// The ranks behind [`sequences`] (the same draws): what the floor rows walk.
fn rank_sequences(d: Distribution, keys: u64, threads: usize, len: usize) -> Vec<u64> {
    keys::ranks(d, keys, len * threads, 0x0be7_c4ec_5eed ^ keys)
}

/// Keys each thread walks through (8 MB of u64): long enough that a run does not replay a
/// cache-resident subset of a large key set.
pub(crate) const SEQ_LEN: usize = 1 << 20;

/// Whether `--json` was given: progress is then not shown.
static QUIET: AtomicBool = AtomicBool::new(false);
/// The spinner drawn under the progress lines when stderr is a terminal.
static SPINNER: OnceLock<indicatif::ProgressBar> = OnceLock::new();

/// A progress line on stderr: above a spinner on a terminal, a plain line in a log, nothing
/// with `--json`.
pub(crate) fn progress(msg: impl AsRef<str>) {
    let json = QUIET.load(Ordering::Relaxed);
    let line = format!("bench: {}", msg.as_ref());
    if crate::progress::visible(json) {
        let s = SPINNER.get_or_init(|| {
            let s = indicatif::ProgressBar::new_spinner();
            s.enable_steady_tick(Duration::from_millis(120));
            s.set_message("bench: running");
            s
        });
        s.println(line);
    } else if !json {
        eprintln!("{line}");
    }
}

/// Clears the spinner, if one was drawn.
fn progress_done() {
    if let Some(s) = SPINNER.get() {
        s.finish_and_clear();
    }
}

/// What every run of one key sequence shares: the keys (one slice of `len` per thread), the
/// timer and the warm-up and measured durations.
pub(crate) struct Runner<'a> {
    pub seq: &'a [u64],
    pub len: usize,
    pub timer: &'a Timer,
    pub warmup: Duration,
    pub window: Duration,
}

impl Runner<'_> {
    /// Runs `c` as `spec` says and returns its row; `label` names it in the progress line.
    pub(crate) fn row<C: Checker>(&self, c: &C, spec: RowSpec, label: &str) -> Row {
        let seqs: Vec<&[u64]> = (0..spec.threads)
            .map(|t| &self.seq[t * self.len..(t + 1) * self.len])
            .collect();
        let m = run::measure(c, spec.mode, &seqs, self.warmup, self.window, self.timer);
        let r = row(spec, m);
        progress(format!(
            "{label}: {} checks/s ({:.0}% on CPU), {:.1} CPU-ns/check, p99.9 {}",
            fmt_rate(r.checks_per_sec),
            r.on_cpu * 100.0,
            r.ns_per_check,
            fmt_ns(r.p999_ns)
        ));
        r
    }
}

/// An error from Redis as the commands report it: what failed, where, what to do.
pub(crate) fn redis_error(url: &str, e: turnstile_redis::Error) -> String {
    format!(
        "redis at {url}: {e} (is redis-server running there? start one with `redis-server --port PORT --save '' --appendonly no` and pass --redis-url redis://127.0.0.1:PORT)"
    )
}

/// Runs the command.
pub fn run(args: BenchArgs) -> Result<(), String> {
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
    QUIET.store(o.json, Ordering::Relaxed);
    let (clocks, callgrind, plot_file) = (args.clocks, args.callgrind, args.plot);
    if clocks {
        return clocks::run(&o.keys_and_seconds());
    }
    if callgrind {
        return clocks::callgrind(o.algorithm, o.keys, o.checks, o.batch.max(1));
    }
    if args.own_limits {
        let repeat = if args.repeat > 1 { o.repeat } else { 3 };
        return own_limits::run(o.keys, o.seconds, repeat, o.json);
    }
    if let Some(f) = plot_file {
        // Said before the sweep (tens of seconds), not after it.
        let dir = std::path::Path::new(&f)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        if !dir.is_dir() {
            return Err(format!(
                "option --plot: {f}: the directory {} does not exist; create it or give another path",
                dir.display()
            ));
        }
        return plot::run(&f, o.algorithm, &o.threads, o.seconds, o.batch, o.json);
    }
    let r = suite(&o);
    progress_done();
    r
}

impl Options {
    fn keys_and_seconds(&self) -> clocks::ClockOptions {
        clocks::ClockOptions {
            algorithm: self.algorithm,
            keys: self.keys,
            seconds: self.seconds,
            json: self.json,
        }
    }
}

fn suite(o: &Options) -> Result<(), String> {
    let timer = Timer::calibrate();
    let limit = throughput_limit(o.algorithm)?;
    let limits = Limits::new(vec![limit]).map_err(|e| e.to_string())?;
    let max_t = *o.threads.iter().max().expect("at least one");
    let (turn, gov) = (
        o.engines != Engines::Governor,
        o.engines != Engines::Turnstile,
    );
    let keyed = o.workloads.iter().any(|w| matches!(w, Workload::Keyed(_)));
    load_warning();
    progress(format!(
        "{} on {} core(s), {:.1} s per run; timer overhead {:.0} ns (in every latency)",
        o.algorithm,
        core_affinity::get_core_ids().map_or(0, |c| c.len()),
        o.seconds,
        timer.overhead_ns
    ));

    // Build and fill both keyed engines once: every keyed workload draws from the same keys.
    let store = if keyed && turn {
        progress(format!(
            "turnstile store: {} keys, inserting all",
            fmt_count(o.keys)
        ));
        let s = Store::builder(limits.clone())
            .capacity(store_capacity(o.algorithm, o.keys))
            .seed(0x7475_726e)
            .build()
            .map_err(|e| e.to_string())?;
        for r in 0..o.keys {
            s.check(&keys::key_id(r), 1);
        }
        Some(s)
    } else {
        None
    };
    let gkeyed = if keyed && gov {
        progress(format!(
            "governor keyed: {} keys, inserting all",
            fmt_count(o.keys)
        ));
        let g = RateLimiter::keyed(governor_quota());
        for r in 0..o.keys {
            let _ = g.check_key(&keys::key_id(r));
        }
        Some(g)
    } else {
        None
    };
    let alg = o.algorithm.name().to_string();
    // The floor table: as many slots as the store, each key rank its own slot.
    let floor_table = match &store {
        Some(s) => {
            progress(format!(
                "floor table: {} slots of 16 bytes (the store's), one random cycle",
                fmt_count(s.slot_count())
            ));
            floor::Table::new(s.slot_count(), o.keys, 0xf100_12ab ^ o.keys)
        }
        None => None,
    };

    let mut rows: Vec<Row> = Vec::new();
    let mut floors: Vec<floor::FloorRow> = Vec::new();
    for w in &o.workloads {
        let (dist, seq) = match w {
            Workload::Unkeyed => ("unkeyed".to_string(), vec![0u64; SEQ_LEN * max_t]),
            Workload::Keyed(d) => {
                progress(format!(
                    "drawing {} {d} keys",
                    fmt_count((SEQ_LEN * max_t) as u64)
                ));
                (d.to_string(), sequences(*d, o.keys, max_t, SEQ_LEN))
            }
        };
        let keys_field = matches!(w, Workload::Keyed(_)).then_some(o.keys);
        // The slot of every key of the sequence, drawn before timing (the same draws).
        let floor_idx = match (w, &floor_table) {
            (Workload::Keyed(d), Some(ft)) => {
                ft.indices(&rank_sequences(*d, o.keys, max_t, SEQ_LEN))
            }
            _ => Vec::new(),
        };
        let wl = match keys_field {
            None => "unkeyed".to_string(),
            Some(k) => format!("{} {dist}", fmt_count(k)),
        };
        let r = Runner {
            seq: &seq,
            len: SEQ_LEN,
            timer: &timer,
            warmup: o.warmup(),
            window: o.window(),
        };
        // reps[i][j]: repeat i, configuration j (the same order every repeat).
        let mut reps: Vec<Vec<Row>> = Vec::new();
        let mut floor_reps: Vec<Vec<floor::FloorRow>> = Vec::new();
        for rep in 0..o.repeat {
            let mut out = Vec::new();
            let mut fout = Vec::new();
            let direct = Limiter::with_limits(limits.clone(), turnstile::DefaultClock::new());
            let gdirect = RateLimiter::direct(governor_quota());
            for &t in &o.threads {
                let spec = |engine, algorithm: &str, mode| RowSpec {
                    engine,
                    algorithm: algorithm.to_string(),
                    keys: keys_field,
                    distribution: dist.clone(),
                    threads: t,
                    mode,
                };
                let label = |e: &str| {
                    let run = if o.repeat > 1 {
                        format!(" (run {}/{})", rep + 1, o.repeat)
                    } else {
                        String::new()
                    };
                    format!("{wl}, {e}, {t} thread(s){run}")
                };
                let single = Mode::Single;
                match w {
                    Workload::Unkeyed => {
                        if turn {
                            let c = run::TurnstileDirect(&direct);
                            out.push(r.row(
                                &c,
                                spec("turnstile", &alg, single),
                                &label("turnstile"),
                            ));
                        }
                        if gov {
                            let c = run::GovernorDirect(&gdirect);
                            out.push(r.row(
                                &c,
                                spec("governor", "gcra", single),
                                &label("governor"),
                            ));
                        }
                    }
                    Workload::Keyed(_) => {
                        if let Some(s) = &store {
                            let c = run::TurnstileKeyed(s);
                            out.push(r.row(
                                &c,
                                spec("turnstile", &alg, single),
                                &label("turnstile"),
                            ));
                            if o.batch > 0 {
                                let l = label(&format!("turnstile batch {}", o.batch));
                                out.push(r.row(
                                    &c,
                                    spec("turnstile", &alg, Mode::Batch(o.batch)),
                                    &l,
                                ));
                            }
                            if o.batch > 0 && o.batch_decisions {
                                let l = label(&format!("turnstile batch {} (Decisions)", o.batch));
                                out.push(r.row(
                                    &c,
                                    spec("turnstile", &alg, Mode::BatchDecisions(o.batch)),
                                    &l,
                                ));
                            }
                        }
                        if let Some(g) = &gkeyed {
                            let c = run::GovernorKeyed(g);
                            out.push(r.row(
                                &c,
                                spec("governor", "gcra", single),
                                &label("governor"),
                            ));
                        }
                        if let (Some(ft), Workload::Keyed(d)) = (&floor_table, w) {
                            let mut kinds = vec![floor::Kind::Dependent, floor::Kind::LoadCas];
                            if o.batch > 0 {
                                kinds.push(floor::Kind::Batch(o.batch));
                            }
                            for kind in kinds {
                                fout.push(floor_row(ft, kind, *d, &floor_idx, t, o, &label));
                            }
                        }
                    }
                }
            }
            reps.push(out);
            floor_reps.push(fout);
        }
        for j in 0..reps[0].len() {
            rows.push(fold(reps.iter().map(|r| r[j].clone()).collect()));
        }
        for j in 0..floor_reps[0].len() {
            floors.push(fold_floor(
                floor_reps.iter().map(|r| r[j].clone()).collect(),
            ));
        }
    }
    attach_floors(&mut rows, &floors);
    let exact = if turn && o.workloads.contains(&Workload::Keyed(Distribution::Hot)) {
        hot_key_checks(max_t.max(2))?
    } else {
        Vec::new()
    };

    if o.json {
        let doc = serde_json::json!({
            "results": rows,
            "floors": floors,
            "hot_key": exact,
            "timer_overhead_ns": timer.overhead_ns,
            "latency_sampling": format!("1 in {} single checks, 1 in 4 batches (batch time / batch size)", run::SAMPLE),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serializable")
        );
    } else {
        print_table(&rows, &floors);
        print_ratios(&rows);
        if !exact.is_empty() {
            println!();
            println!(
                "hot key, {} threads, every attempt on one key:",
                max_t.max(2)
            );
            for e in &exact {
                println!("  {}", e.line());
            }
        }
        println!();
        println!(
            "checks/s: wall clock, all threads; cpu: share of the window the workers ran; ns/check: \
             CPU-ns per check; vs gov and ratios: checks per CPU-second."
        );
        if !floors.is_empty() {
            println!(
                "floor rows: the same keys over a table of the store's {} slots, no hashing, no \
                 clock: a dependent access (single checks' × floor), an independent load + \
                 16-byte CAS, and batches prefetched whole before their loads + CASes \
                 (check_batch's × floor); ns/check is CPU-ns per access.",
                fmt_count(floors[0].slots)
            );
        }
        println!(
            "latency: 1 in {} single checks timed (1 in 4 batches, per check); timer overhead {:.0} ns included",
            run::SAMPLE,
            timer.overhead_ns
        );
    }
    Ok(())
}

/// One floor measurement of `kind` on `t` threads over the slots `idx` (one slice of
/// `SEQ_LEN` per thread).
fn floor_row(
    ft: &floor::Table,
    kind: floor::Kind,
    d: Distribution,
    idx: &[u32],
    t: usize,
    o: &Options,
    label: &dyn Fn(&str) -> String,
) -> floor::FloorRow {
    let seqs: Vec<&[u32]> = (0..t)
        .map(|i| &idx[i * SEQ_LEN..(i + 1) * SEQ_LEN])
        .collect();
    let uniform = d == Distribution::Uniform;
    let (ns, n, on_cpu, pre) = floor::measure(ft, kind, uniform, &seqs, o.warmup(), o.window());
    let batch = match kind {
        floor::Kind::Batch(b) => b,
        _ => 1,
    };
    let what = match kind {
        floor::Kind::Dependent if uniform => "floor, dependent (chase)".to_string(),
        floor::Kind::Dependent => "floor, dependent (chained)".to_string(),
        floor::Kind::LoadCas => "floor, load + CAS".to_string(),
        floor::Kind::Batch(b) => format!("floor, batch {b} prefetched"),
    };
    progress(format!(
        "{}: {ns:.1} CPU-ns/access ({:.0}% on CPU)",
        label(&what),
        on_cpu * 100.0
    ));
    floor::FloorRow {
        kind: kind.name(),
        batch,
        keys: o.keys,
        distribution: d.to_string(),
        threads: t,
        slots: ft.len(),
        ns_per_access: ns,
        accesses: n,
        on_cpu,
        preemptions: pre,
        runs: 1,
    }
}

/// Warns on stderr when the machine is busy (1-minute load average above half the cores).
pub(crate) fn load_warning() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
    if let Some(l) = load.filter(|l| *l > cores as f64 / 2.0) {
        progress(format!(
            "warning: load average {l:.1} on {cores} cores before the run; other work shares the CPUs and the figures will be noisy"
        ));
    }
}

/// One hot-key exactness check.
#[derive(Serialize, Debug)]
pub(crate) struct Exactness {
    pub limiter: &'static str,
    pub algorithm: &'static str,
    pub clock: &'static str,
    pub threads: usize,
    pub attempts: u64,
    pub admitted: u64,
    /// The most the limit may admit over the run (exact for the frozen clock).
    pub bound: u64,
    /// admitted == bound (frozen clock), admitted ≤ bound (real clock: when the threads are
    /// descheduled the bucket overflows and tokens lapse, so only the upper bound is exact).
    pub ok: bool,
}

impl Exactness {
    fn line(&self) -> String {
        format!(
            "{:<8} {:<13} {:<6} clock: admitted {} of {} attempts, bound {} ({}) → {}",
            self.limiter,
            self.algorithm,
            self.clock,
            self.admitted,
            self.attempts,
            self.bound,
            if self.clock == "frozen" {
                "exact"
            } else {
                "at most"
            },
            match (self.ok, self.clock) {
                (true, "frozen") => "ok, no lost or doubled update",
                (true, _) => "ok, never over the limit",
                _ => "MISMATCH",
            }
        )
    }
}

/// `threads` pinned threads each make `per_thread` checks through `f`; admitted in total.
fn hammer(threads: usize, per_thread: u64, f: &(dyn Fn() -> bool + Sync)) -> u64 {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let total = AtomicU64::new(0);
    std::thread::scope(|s| {
        for i in 0..threads {
            let (total, cores) = (&total, &cores);
            s.spawn(move || {
                if !cores.is_empty() {
                    core_affinity::set_for_current(cores[i % cores.len()]);
                }
                let n = (0..per_thread).filter(|_| f()).count() as u64;
                // Relaxed: summed after the scope joins every thread.
                total.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    total.load(Ordering::Relaxed)
}

/// Every thread on one key: a frozen clock must admit exactly the limit (no lost update, no
/// double admission, including the race to insert the key); the real clock at most
/// capacity + elapsed / T.
fn hot_key_checks(threads: usize) -> Result<Vec<Exactness>, String> {
    const B: u64 = 300_000;
    let per = B * 2 / threads as u64;
    let hot = keys::key_id(0);
    let mut v = Vec::new();
    let hour = Duration::from_secs(3600);
    let cfgs: [(&'static str, Limit); 2] = [
        (
            "token_bucket",
            Limit::token_bucket(B, 1, hour).map_err(|e| e.to_string())?,
        ),
        (
            "fixed_window",
            Limit::fixed_window(B, hour).map_err(|e| e.to_string())?,
        ),
    ];
    for (name, l) in cfgs {
        let limits = Limits::new(vec![l]).map_err(|e| e.to_string())?;
        let store = Store::builder(limits.clone())
            .capacity(1024)
            .build_with_clock(ManualClock::new(1_000))
            .map_err(|e| e.to_string())?;
        let admitted = hammer(threads, per, &|| store.check(&hot, 1).allowed());
        v.push(Exactness {
            limiter: "store",
            algorithm: name,
            clock: "frozen",
            threads,
            attempts: per * threads as u64,
            admitted,
            bound: B,
            ok: admitted == B,
        });
        let lim = Limiter::with_limits(limits, ManualClock::new(1_000));
        let admitted = hammer(threads, per, &|| lim.check(1).allowed());
        v.push(Exactness {
            limiter: "limiter",
            algorithm: name,
            clock: "frozen",
            threads,
            attempts: per * threads as u64,
            admitted,
            bound: B,
            ok: admitted == B,
        });
    }
    // Real clock: capacity 1000, one token per µs; saturated by every thread for ~0.3 s.
    let cap = 1_000u64;
    let interval = 1_000u64;
    let limits = Limits::new(vec![Limit::token_bucket(
        cap,
        1_000_000,
        Duration::from_secs(1),
    )
    .map_err(|e| e.to_string())?])
    .map_err(|e| e.to_string())?;
    let store = Store::builder(limits)
        .capacity(1024)
        .build()
        .map_err(|e| e.to_string())?;
    let t0 = store.clock().now();
    let per = 4_000_000 / threads as u64;
    let admitted = hammer(threads, per, &|| store.check(&hot, 1).allowed());
    let t1 = store.clock().now();
    let bound = cap + (t1 - t0) / interval;
    v.push(Exactness {
        limiter: "store",
        algorithm: "token_bucket",
        clock: "real",
        threads,
        attempts: per * threads as u64,
        admitted,
        bound,
        ok: admitted <= bound,
    });
    progress("hot-key exactness checks done");
    Ok(v)
}

/// 1000000 → "1M", 10000 → "10k", others as they are.
pub(crate) fn fmt_count(n: u64) -> String {
    if n >= 1_000_000 && n % 1_000_000 == 0 {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n % 1_000 == 0 {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// 4.7e7 → "47.0M".
pub(crate) fn fmt_rate(r: f64) -> String {
    if r >= 1e9 {
        format!("{:.2}G", r / 1e9)
    } else if r >= 1e6 {
        format!("{:.1}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

/// Nanoseconds with a readable unit.
pub(crate) fn fmt_ns(ns: u64) -> String {
    if ns < 10_000 {
        format!("{ns}ns")
    } else if ns < 10_000_000 {
        format!("{:.1}µs", ns as f64 / 1e3)
    } else {
        format!("{:.1}ms", ns as f64 / 1e6)
    }
}

pub(crate) fn print_table(rows: &[Row], floors: &[floor::FloorRow]) {
    println!(
        "{:<14} {:<10} {:<9} {:>3} {:>9} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7}",
        "workload",
        "engine",
        "mode",
        "thr",
        "checks/s",
        "cpu",
        "ns/check",
        "p50",
        "p99",
        "p99.9",
        "max",
        "vs gov",
        "× floor"
    );
    for (i, r) in rows.iter().enumerate() {
        let gov = rows
            .iter()
            .find(|g| g.engine == "governor" && g.same_run(r))
            .filter(|_| r.engine == "turnstile")
            .map(|g| format!("{:.1}×", r.cpu_checks_per_sec / g.cpu_checks_per_sec))
            .unwrap_or_default();
        let mode = match r.mode {
            "batch" => format!("batch {}", r.batch),
            "batch_decisions" => format!("batch {} D", r.batch),
            m => m.to_string(),
        };
        println!(
            "{:<14} {:<10} {:<9} {:>3} {:>9} {:>4.0}% {:>9.1} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7}",
            r.workload(),
            r.engine,
            mode,
            r.threads,
            fmt_rate(r.checks_per_sec),
            r.on_cpu * 100.0,
            r.ns_per_check,
            fmt_ns(r.p50_ns),
            fmt_ns(r.p99_ns),
            fmt_ns(r.p999_ns),
            fmt_ns(r.max_ns),
            gov,
            r.x_floor.map(|x| format!("{x:.2}×")).unwrap_or_default()
        );
        // After the last row of a configuration: its floor rows.
        if rows.get(i + 1).is_none_or(|n| !n.same_run(r)) {
            for f in floors.iter().filter(|f| {
                Some(f.keys) == r.keys && f.distribution == r.distribution && f.threads == r.threads
            }) {
                let mode = match f.kind {
                    "dependent" => "dependent".to_string(),
                    "load_cas" => "load+CAS".to_string(),
                    _ => format!("batch {}", f.batch),
                };
                println!(
                    "{:<14} {:<10} {:<9} {:>3} {:>9} {:>4.0}% {:>9.1}",
                    r.workload(),
                    "floor",
                    mode,
                    f.threads,
                    "",
                    f.on_cpu * 100.0,
                    f.ns_per_access
                );
            }
        }
    }
}

fn print_ratios(rows: &[Row]) {
    let find = |engine: &str, mode: &str, keys: Option<u64>, dist: &str, t: usize| {
        rows.iter().find(|r| {
            r.engine == engine
                && r.mode == mode
                && r.keys == keys
                && r.distribution == dist
                && r.threads == t
        })
    };
    let mut lines = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.engine == "turnstile" && r.threads > 1)
    {
        if let Some(one) = find("turnstile", r.mode, r.keys, &r.distribution, 1) {
            lines.push(format!(
                "  turnstile {} {}, {} threads / 1 thread: {:.2}×",
                r.workload(),
                r.mode,
                r.threads,
                r.cpu_checks_per_sec / one.cpu_checks_per_sec
            ));
        }
    }
    // The keyed hot key against governor's keyless limiter: the same one-record contention.
    for r in rows
        .iter()
        .filter(|r| r.engine == "turnstile" && r.distribution == "hot" && r.mode == "single")
    {
        if let Some(g) = find("governor", "single", None, "unkeyed", r.threads) {
            lines.push(format!(
                "  turnstile {} ({} thr) / governor keyless ({} thr): {:.2}×",
                r.workload(),
                r.threads,
                g.threads,
                r.cpu_checks_per_sec / g.cpu_checks_per_sec
            ));
        }
    }
    if !lines.is_empty() {
        println!();
        println!("ratios (checks per CPU-second, i.e. as on an idle machine):");
        for l in lines {
            println!("{l}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(engine: &'static str, mode: &'static str, dist: &str, threads: usize, ns: f64) -> Row {
        Row {
            engine,
            algorithm: "token_bucket".into(),
            keys: (dist != "unkeyed").then_some(1000),
            distribution: dist.into(),
            threads,
            mode,
            batch: if mode == "batch" { 32 } else { 1 },
            ns_per_check: ns,
            checks_per_sec: 0.0,
            cpu_checks_per_sec: 0.0,
            on_cpu: 1.0,
            preemptions: 0,
            p50_ns: 0,
            p99_ns: 0,
            p999_ns: 0,
            max_ns: 0,
            checks: 0,
            denied: 0,
            runs: 1,
            floor: None,
            x_floor: None,
        }
    }

    fn floor_row(kind: &'static str, dist: &str, threads: usize, ns: f64) -> floor::FloorRow {
        floor::FloorRow {
            kind,
            batch: if kind == "batch" { 32 } else { 1 },
            keys: 1000,
            distribution: dist.into(),
            threads,
            slots: 1200,
            ns_per_access: ns,
            accesses: 1,
            on_cpu: 1.0,
            preemptions: 0,
            runs: 1,
        }
    }

    #[test]
    fn each_row_is_divided_by_its_own_floor() {
        let mut rows = vec![
            row("turnstile", "single", "uniform", 1, 120.0),
            row("turnstile", "batch", "uniform", 1, 30.0),
            row("governor", "single", "uniform", 1, 250.0),
            row("turnstile", "single", "uniform", 2, 130.0),
            row("turnstile", "batch", "zipf", 1, 20.0),
            row("turnstile", "single", "unkeyed", 1, 15.0),
        ];
        let floors = vec![
            floor_row("dependent", "uniform", 1, 100.0),
            floor_row("load_cas", "uniform", 1, 40.0),
            floor_row("batch", "uniform", 1, 12.0),
            floor_row("dependent", "uniform", 2, 104.0),
            floor_row("batch", "zipf", 1, 8.0),
        ];
        attach_floors(&mut rows, &floors);
        let x: Vec<Option<f64>> = rows.iter().map(|r| r.x_floor).collect();
        assert_eq!(
            x,
            [Some(1.2), Some(2.5), Some(2.5), Some(1.25), Some(2.5), None]
        );
        let f: Vec<Option<&str>> = rows.iter().map(|r| r.floor).collect();
        assert_eq!(
            f,
            [
                Some("dependent"),
                Some("batch"),
                Some("dependent"),
                Some("dependent"),
                Some("batch"),
                None
            ]
        );
    }

    #[test]
    fn medians_of_floor_repeats() {
        let f = fold_floor(vec![
            floor_row("batch", "uniform", 1, 14.0),
            floor_row("batch", "uniform", 1, 11.0),
            floor_row("batch", "uniform", 1, 12.0),
        ]);
        assert_eq!((f.ns_per_access, f.runs, f.accesses), (12.0, 3, 3));
    }
}
