//! `turnstile bench --own-limits`: a rule whose keys have limits of their own (a limits class,
//! docs/rules.md) against the same rule's own limit, side by side in one run, on the same keys.
//!
//! N keys (`--keys`) each get an entry in a CSV file: 90 % on five plans, 10 % a limit of
//! their own (1 000 distinct ones). The engine is built from a rules file with two rules of
//! one customer key and the same default limit, told apart by route: `own` takes the class
//! (`limits_from`), `plain` does not. The report gives the file's load time (the engine's
//! build, which reads it), the class's bytes per entry, then single-thread CPU-ns per check of
//! each rule, interleaved `--repeat` times (default 3), medians and their ratio. Every key is
//! checked once on each rule before timing, so every timed check is a lookup; limits are the
//! throughput rows' 1e9 per second, so every check is admitted and does the whole work.

use super::keys::{self, Distribution};
use super::run::{measure, Checker, Mode, Timer};
use super::text::progress;
use std::io::Write;
use std::time::{Duration, Instant};
use turnstile::rules::{Engine, Request, Rules};
use turnstile::Clock as _;

/// The limit of every plan and rule: 1e9 per second, a burst of 1e9 (nothing is denied).
const RATE: u64 = 1_000_000_000;
/// Key sequence seed (the throughput rows').
const SEED: u64 = 0x0be7_c4ec_5eed;

/// One rule of the engine, by its route.
struct Routed<'a> {
    engine: &'a Engine,
    route: &'static str,
}

impl Checker for Routed<'_> {
    #[inline]
    fn one(&self, key: u64) -> bool {
        let r = Request::new().customer(key).route(self.route);
        self.engine.check(&r).allowed()
    }
}

/// A scratch directory, removed on drop (also on error).
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes the entries of `n` keys: 90 % on plans p0..p4, 10 % their own limit.
fn write_entries(path: &std::path::Path, n: u64) -> crate::Result<u64> {
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    writeln!(w, "key,plan").map_err(err)?;
    for rank in 0..n {
        let id = keys::key_id(rank);
        if rank % 10 == 9 {
            let l = RATE - (rank / 10) % 1000;
            writeln!(w, "{id},{l}/1s burst={l}").map_err(err)?;
        } else {
            writeln!(w, "{id},p{}", rank % 5).map_err(err)?;
        }
    }
    w.flush().map_err(err)?;
    Ok(std::fs::metadata(path).map_err(err)?.len())
}

fn rules(file: &std::path::Path, n: u64) -> String {
    let limit = format!(
        "{{ algorithm = \"token_bucket\", limit = {RATE}, window = \"1s\", burst = {RATE} }}"
    );
    let plans: String = (0..5)
        .map(|k| {
            let l = RATE - 1000 - k;
            format!("p{k} = {{ limit = {l}, window = \"1s\", burst = {l} }}\n")
        })
        .collect();
    format!(
        r#"
[limits.customers]
key = "customer"
algorithm = "token_bucket"
file = {file:?}
capacity = {n}

[limits.customers.plans]
{plans}
[[rule]]
name = "own"
key = "customer"
match = {{ route_prefix = "/own" }}
limits_from = "customers"
capacity = {n}
limits = [{limit}]

[[rule]]
name = "plain"
key = "customer"
match = {{ route_prefix = "/plain" }}
capacity = {n}
limits = [{limit}]
"#
    )
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What loading the limits file gave.
struct Loaded {
    file_bytes: u64,
    load_s: f64,
    entries: u64,
    bytes: usize,
}

/// Runs the mode (see the module docs).
pub fn run(n: u64, seconds: f64, repeat: usize, json: bool) -> crate::Result<()> {
    let dir = std::env::temp_dir().join(format!("turnstile-own-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let scratch = Scratch(dir);
    let path = scratch.0.join("limits.csv");
    progress(format!("own limits: writing {n} entries"));
    let file_bytes = write_entries(&path, n)?;
    let (engine, loaded) = load(&path, n, file_bytes)?;
    let (a, b) = timed_runs(&engine, n, seconds, repeat);
    super::progress_done();
    if json {
        print_json(n, &loaded, &a, &b);
    } else {
        print_table(n, seconds, &loaded, &a, &b);
    }
    Ok(())
}

/// Builds the engine of both rules from the file at `path` (of `file_bytes`), timing the build.
fn load(path: &std::path::Path, n: u64, file_bytes: u64) -> crate::Result<(Engine, Loaded)> {
    let text = rules(path, n);
    let rules = Rules::parse(&text, "bench").map_err(|e| e.to_string())?;
    progress("own limits: building the engine (reads the file)");
    let t0 = Instant::now();
    let engine = Engine::builder(rules)
        .seed(SEED)
        .build()
        .map_err(|e| e.to_string())?;
    let load_s = t0.elapsed().as_secs_f64();
    let src = engine.limits("customers").ok_or("no class `customers`")?;
    let (entries, bytes) = (src.len(), src.bytes());
    let loaded = Loaded {
        file_bytes,
        load_s,
        entries,
        bytes,
    };
    Ok((engine, loaded))
}

/// `bench --callgrind --own-limits`: the engine of both rules over `n` keys, every key inserted
/// in both, then `checks` uniform checks of each rule in its own `#[inline(never)]` function
/// (`cg_engine_own`, `cg_engine_plain`) at one fixed time: their inclusive instruction counts
/// over `checks` are instructions per check (docs/performance.md).
pub fn callgrind(n: u64, checks: u64) -> crate::Result<()> {
    let dir = std::env::temp_dir().join(format!("turnstile-own-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let scratch = Scratch(dir);
    let path = scratch.0.join("limits.csv");
    let file_bytes = write_entries(&path, n)?;
    let (engine, _) = load(&path, n, file_bytes)?;
    let now = engine.clock().now();
    for rank in 0..n {
        let id = keys::key_id(rank);
        for route in ["/own", "/plain"] {
            engine.check_at(&Request::new().customer(id).route(route), now);
        }
    }
    let seq = keys::sequence(Distribution::Uniform, n, checks as usize, SEED);
    let own = cg_engine_own(&engine, &seq, now);
    let plain = cg_engine_plain(&engine, &seq, now);
    println!("# own limits: {n} keys, uniform");
    println!("# function checks admitted");
    println!("cg_engine_own {checks} {own}");
    println!("cg_engine_plain {checks} {plain}");
    println!("# instructions per check = inclusive Ir of the function / checks:");
    println!("#   valgrind --tool=callgrind --callgrind-out-file=cg.out target/release/turnstile bench --callgrind --own-limits");
    println!("#   callgrind_annotate --inclusive=yes cg.out | grep cg_");
    Ok(())
}

/// Checks of rule `own` (the key's own limit) at `now`; how many were admitted.
#[inline(never)]
fn cg_engine_own(engine: &Engine, seq: &[u64], now: turnstile::Nanos) -> u64 {
    cg_engine(engine, seq, "/own", now)
}

/// Checks of rule `plain` (the rule's own limit) at `now`; how many were admitted.
#[inline(never)]
fn cg_engine_plain(engine: &Engine, seq: &[u64], now: turnstile::Nanos) -> u64 {
    cg_engine(engine, seq, "/plain", now)
}

#[inline(always)]
fn cg_engine(engine: &Engine, seq: &[u64], route: &str, now: turnstile::Nanos) -> u64 {
    seq.iter()
        .filter(|&&k| {
            let r = Request::new().customer(k).route(route);
            engine.check_at(&r, std::hint::black_box(now)).allowed()
        })
        .count() as u64
}

/// Inserts every key in both rules, then times them interleaved `repeat` times: CPU-ns per
/// check of each run, `own` then `plain`.
fn timed_runs(engine: &Engine, n: u64, seconds: f64, repeat: usize) -> (Vec<f64>, Vec<f64>) {
    progress("own limits: inserting every key in both rules");
    let own = Routed {
        engine,
        route: "/own",
    };
    let plain = Routed {
        engine,
        route: "/plain",
    };
    for rank in 0..n {
        let id = keys::key_id(rank);
        own.one(id);
        plain.one(id);
    }
    let seq = keys::sequence(Distribution::Uniform, n, 1 << 20, SEED);
    let timer = Timer::calibrate();
    let window = Duration::from_secs_f64(seconds);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..repeat.max(1) {
        for (name, c, out) in [("own", &own, &mut a), ("plain", &plain, &mut b)] {
            progress(format!("own limits: {name}, run {}", r + 1));
            let m = measure(c, Mode::Single, &[&seq], window / 10, window, &timer);
            out.push(m.cpu_ns as f64 / m.checks.max(1) as f64);
        }
    }
    (a, b)
}

fn print_json(n: u64, l: &Loaded, a: &[f64], b: &[f64]) {
    let (ma, mb) = (median(&mut a.to_vec()), median(&mut b.to_vec()));
    println!(
        "{}",
        serde_json::json!({
            "keys": n, "entries": l.entries, "file_bytes": l.file_bytes,
            "load_seconds": l.load_s, "bytes": l.bytes,
            "bytes_per_entry": l.bytes as f64 / l.entries.max(1) as f64,
            "own_cpu_ns": a, "plain_cpu_ns": b,
            "own_median": ma, "plain_median": mb, "ratio": ma / mb,
        })
    );
}

fn print_table(n: u64, seconds: f64, l: &Loaded, a: &[f64], b: &[f64]) {
    let (ma, mb) = (median(&mut a.to_vec()), median(&mut b.to_vec()));
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let (load_s, entries) = (l.load_s, l.entries);
    println!(
        "own limits: {n} keys with an entry (90 % on 5 plans, 10 % their own limit, 1000 \
         distinct), CSV file of {:.1} MiB",
        mib(l.file_bytes as f64)
    );
    println!(
        "load: {load_s:.2} s (the engine's build, which reads the file); {entries} entries, \
         {:.1} MiB, {:.1} bytes per entry",
        mib(l.bytes as f64),
        l.bytes as f64 / entries.max(1) as f64
    );
    println!();
    let runs = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "{:<34} {:>14} {:>10}   runs",
        "rule (1 thread, uniform keys)", "CPU-ns/check", "× plain"
    );
    println!(
        "{:<34} {:>14.1} {:>9.2}×   {}",
        "own: the key's own limit",
        ma,
        ma / mb,
        runs(a)
    );
    println!(
        "{:<34} {:>14.1} {:>9.2}×   {}",
        "plain: the rule's own limit",
        mb,
        1.0,
        runs(b)
    );
    println!();
    println!("medians of {} interleaved runs of {seconds} s", a.len());
}
