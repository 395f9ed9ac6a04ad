//! `turnstile bench report`: the published suite in one run, written as one page
//! (`docs/benchmarks.md`): the engine (`bench`, `bench scale`), the service (`bench serve`),
//! the layer (`bench tower wrk`) and the Redis backend (`bench --engine redis`, `bench fleet`),
//! each run as a child process of this same binary with the options the page shows, its
//! table copied as printed, with the machine, its load before and after, and each part's
//! time. A part that cannot run here (no hello example, no redis-cell module) says why on
//! the page; a part that fails is written with its error, and the command then fails.

use super::drive::{self, Server};
use super::text::{load_average, progress, progress_done};
use clap::Args;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Runs the engine, service, layer and Redis benchmarks and writes docs/benchmarks.md with
/// every table, the plots, the machine and the commands.
#[derive(Args)]
pub struct ReportArgs {
    /// The directory the page (benchmarks.md) and its plots (perf/scale.svg,
    /// perf/serve.svg) are written to.
    #[arg(long, value_name = "DIR", default_value = "docs")]
    out: PathBuf,
    /// A smoke run (under a minute): every part on a tiny workload. Not figures to publish.
    #[arg(long)]
    quick: bool,
    /// The largest size of `bench scale` (1k .. 100M).
    #[arg(long, value_name = "N", default_value = "100M")]
    max_keys: String,
    /// redis-cell's module (libredis_cell.so): its CL.THROTTLE in `bench serve` too.
    #[arg(long, value_name = "PATH")]
    cell_so: Option<PathBuf>,
    /// The hello example `bench tower` serves (`cargo build --release -p turnstile-tower
    /// --example hello`); the layer's part is left out, saying so, without it.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "target/release/examples/hello"
    )]
    hello: PathBuf,
}

/// One part of the page: a heading, what it measures, and the `turnstile` arguments.
struct Part {
    title: &'static str,
    about: &'static str,
    args: Vec<String>,
    /// The arguments as the page shows them (a scratch server's port as PORT).
    shown: Option<String>,
    /// Why the part is left out here.
    skip: Option<String>,
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The parts, in page order, with full or quick options.
fn parts(a: &ReportArgs, out: &Path, redis_port: &Result<u16, String>) -> Vec<Part> {
    let mut v = engine_parts(a, out);
    v.push(serve_part(a, out));
    v.extend(layer_and_redis_parts(a, redis_port));
    v
}

/// `bench` and `bench scale`.
fn engine_parts(a: &ReportArgs, out: &Path) -> Vec<Part> {
    let q = a.quick;
    let scale_svg = out.join("perf/scale.svg").to_string_lossy().into_owned();
    let mut v = Vec::new();
    v.push(Part {
        title: "Engine: keyed and keyless checks beside governor",
        about: "1M keys (uniform, Zipf, one hot key) and the keyless limiter, 1 and 2 pinned threads, each beside governor 0.10 and the floor of the same keys.",
        args: if q {
            strs(&["bench", "--keys", "10k", "--seconds", "0.1", "--distribution", "unkeyed,uniform", "--threads", "1"])
        } else {
            strs(&["bench", "--repeat", "3"])
        },
        shown: None,
        skip: None,
    });
    let max = if q { "10k" } else { a.max_keys.as_str() };
    let mut scale = strs(&["bench", "scale", "--max-keys", max, "--plot", &scale_svg]);
    if q {
        scale.push("--quick".into());
    }
    v.push(Part {
        title: "Engine: cost from 1k to 100M keys",
        about: "CPU-ns per check at each size, uniform and Zipf, single and batched, beside governor (where it fits in memory) and the floor; resident bytes per key; the cache knee. Plot: [perf/scale.svg](perf/scale.svg).\n\n\
                ![CPU-ns per check against keys](perf/scale.svg)\n\n\
                How to read it: while the store's table (16-byte slots, about 20 B per key) fits in a core's L2 cache, a check \
                costs its own work: hashing, the clock, the decision and the CAS. Once the table outgrows L2, each check waits \
                for an L3 hit; once it outgrows L3, for DRAM, and at hundreds of MiB for a page-table walk too (4 KiB pages, \
                the TLB covers a few MiB). The floor (one dependent access to the same slots, nothing else) climbs the same \
                steps: where turnstile's curve runs parallel to it, the difference is the check's own work, and the knee \
                printed under the table is turnstile's largest step. Zipf keys keep their hot head in cache, so their curve \
                climbs later; batches prefetch their 32 slots before touching any, so their misses overlap and their curve \
                stays flatter.",
        args: scale,
        shown: Some(format!("bench scale --max-keys {max} --plot docs/perf/scale.svg{}", if q { " --quick" } else { "" })),
        skip: None,
    });
    v
}

/// `bench serve`, its bars in perf/serve.svg.
fn serve_part(a: &ReportArgs, out: &Path) -> Part {
    let serve_svg = out.join("perf/serve.svg").to_string_lossy().into_owned();
    let mut serve = if a.quick {
        strs(&[
            "bench",
            "serve",
            "--runtime",
            "per-core",
            "--keys",
            "1k",
            "--requests",
            "20k",
            "--requests-p1",
            "500",
            "--rounds",
            "1",
            "--http-seconds",
            "1",
        ])
    } else {
        strs(&["bench", "serve"])
    };
    serve.extend(["--plot".to_string(), serve_svg]);
    if let Some(so) = &a.cell_so {
        serve.extend(["--cell-so".to_string(), so.to_string_lossy().into_owned()]);
    }
    let serve_shown = serve[1..]
        .join(" ")
        .replace(&out.to_string_lossy().into_owned(), "docs");
    Part {
        title: "Service: turnstile serve beside redis-server",
        about: "redis-benchmark on CL.THROTTLE against redis-server's INCR (and redis-cell's CL.THROTTLE when its module is given) at each pipeline depth, and wrk on POST /v1/check; server pinned to one core, client to the other. Plot: [perf/serve.svg](perf/serve.svg).",
        args: serve,
        shown: Some(format!("bench {serve_shown}")),
        skip: None,
    }
}

/// `bench tower wrk`, `bench --engine redis` and `bench fleet`.
fn layer_and_redis_parts(a: &ReportArgs, redis_port: &Result<u16, String>) -> Vec<Part> {
    let q = a.quick;
    let mut v = Vec::new();
    let hello = a.hello.to_string_lossy().into_owned();
    v.push(Part {
        title: "Layer: turnstile-tower under wrk",
        about: "An axum hello world with and without the layer, requests/s and per server CPU-second.",
        args: if q {
            strs(&["bench", "tower", "wrk", "--hello", &hello, "--seconds", "1", "--rounds", "1"])
        } else {
            strs(&["bench", "tower", "wrk", "--hello", &hello])
        },
        shown: None,
        skip: (!a.hello.is_file()).then(|| format!(
            "{} is not built: `cargo build --release -p turnstile-tower --example hello`, or give --hello PATH",
            a.hello.display()
        )),
    });
    let requests = if q { "1000" } else { "20000" };
    v.push(Part {
        title: "Redis: the Redis store beside INCR",
        about: "RedisStore's checks against a scratch redis-server the report starts, beside a bare INCR on the same connection.",
        args: match redis_port {
            Ok(p) => strs(&["bench", "--engine", "redis", "--redis-url", &format!("redis://127.0.0.1:{p}"), "--redis-requests", requests]),
            Err(_) => Vec::new(),
        },
        shown: Some(format!("bench --engine redis --redis-url redis://127.0.0.1:PORT --redis-requests {requests}")),
        skip: redis_port.as_ref().err().map(|e| format!("no redis-server could be started: {e}")),
    });
    v.push(Part {
        title: "Redis: a fleet of nodes sharing limits",
        about: "Nodes sharing limits through one redis-server: INCR, the per-check path and leases, admissions against the exact limit.",
        args: if q {
            strs(&["bench", "fleet", "--nodes", "2", "--clients", "2", "--keys", "1k", "--distribution", "zipf", "--seconds", "1", "--calibrate", "0.5", "--window", "1s"])
        } else {
            strs(&["bench", "fleet"])
        },
        shown: None,
        skip: None,
    });
    v
}

/// What the page says about the machine.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown".to_string(), |(_, m)| m.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("MemTotal:"))?.to_string();
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or("unknown".to_string(), |kb| {
            format!("{:.1} GiB", kb as f64 / (1u64 << 20) as f64)
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} CPUs ({model}), {mem} of memory, Linux {}",
        kernel.trim()
    )
}

/// Runs the report.
pub fn run(a: ReportArgs) -> crate::Result<()> {
    let t0 = Instant::now();
    let perf = a.out.join("perf");
    std::fs::create_dir_all(&perf)
        .map_err(|e| format!("option --out: cannot create {}: {e}", perf.display()))?;
    let exe = std::env::current_exe()?;
    let load0 = load_average();
    // A scratch redis-server for `bench --engine redis` (fleet starts its own).
    let redis = scratch_redis();
    let port = redis.as_ref().map(|(_, p)| *p).map_err(|e| e.to_string());
    let mut body = String::new();
    let mut failed = Vec::new();
    for p in parts(&a, &a.out, &port) {
        let shown = format!(
            "turnstile {}",
            p.shown.clone().unwrap_or_else(|| p.args.join(" "))
        );
        let _ = writeln!(body, "## {}\n\n{}\n", p.title, p.about);
        let _ = writeln!(body, "```sh no-run: a benchmark of minutes\n{shown}\n```\n");
        if let Some(why) = &p.skip {
            let _ = writeln!(body, "Not run here: {why}.\n");
            progress(format!("report: {} — not run: {why}", p.title));
            continue;
        }
        progress(format!("report: {} — {shown}", p.title));
        let t = Instant::now();
        let out = Command::new(&exe)
            .args(&p.args)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        let secs = t.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            // A scratch server's port is noise on the page.
            let text = match &port {
                Ok(p) => text.replace(&format!("127.0.0.1:{p}"), "127.0.0.1:PORT"),
                Err(_) => text.into_owned(),
            };
            let _ = writeln!(body, "```text\n{}\n```\n\n({secs:.0} s)\n", text.trim_end());
        } else {
            let _ = writeln!(
                body,
                "Failed ({}) after {secs:.0} s; see the command's own output.\n",
                out.status
            );
            failed.push(p.title);
        }
    }
    drop(redis);
    let load1 = load_average();
    let page = page(&a, &body, load0, load1, t0.elapsed().as_secs_f64());
    let file = a.out.join("benchmarks.md");
    std::fs::write(&file, page).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    progress_done();
    eprintln!(
        "bench report: wrote {} in {:.1} min",
        file.display(),
        t0.elapsed().as_secs_f64() / 60.0
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "bench report: these parts failed (the page says so): {}",
            failed.join("; ")
        )
        .into())
    }
}

/// A redis-server on a free loopback port, no persistence; stopped when dropped.
fn scratch_redis() -> crate::Result<(Server, u16)> {
    drive::need("redis-server")?;
    let port = drive::free_port()?;
    let mut c = Command::new("redis-server");
    c.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]);
    Ok((Server::start(c, port, "redis-server")?, port))
}

/// The whole page around the parts' tables.
fn page(a: &ReportArgs, body: &str, load0: Option<f64>, load1: Option<f64>, secs: f64) -> String {
    let load = |l: Option<f64>| l.map_or("unknown".into(), |l| format!("{l:.2}"));
    let mut s = String::new();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "Every published figure of turnstile, from one run of one command on one machine: the \
         engine beside governor and the floor of the same memory work, its cost from 1k to 100M \
         keys, the service beside redis-server, the tower layer, and the Redis backend. Other \
         pages quote headline figures from here. How each benchmark works and what its columns \
         mean: [performance.md](performance.md), [service.md](service.md), [tower.md](tower.md), \
         [redis.md](redis.md).\n"
    );
    if a.quick {
        let _ = writeln!(
            s,
            "**A smoke run (`--quick`): tiny workloads, not figures to quote.**\n"
        );
    }
    let _ = writeln!(s, "## How to reproduce\n");
    let _ = writeln!(
        s,
        "```sh no-run: a benchmark of tens of minutes\ncargo build --release -p turnstile-cli\n\
         cargo build --release -p turnstile-tower --example hello\n\
         target/release/turnstile bench report            # writes docs/benchmarks.md and docs/perf/{{scale,serve}}.svg\n```\n"
    );
    let _ = writeln!(
        s,
        "`--quick` is a smoke run of under a minute; `--max-keys 10M` stops `bench scale` earlier; \
         `--cell-so PATH` adds redis-cell's CL.THROTTLE to the service part; `--out DIR` writes \
         elsewhere. Each part below is one `turnstile` command, run as shown.\n"
    );
    let _ = writeln!(s, "## The machine\n");
    let _ = writeln!(s, "- {}", machine());
    let _ = writeln!(
        s,
        "- load average (1 min): {} before the run, {} after; other work on the machine makes figures noisier, ratios within one run hold best",
        load(load0),
        load(load1)
    );
    let _ = writeln!(s, "- the whole run: {:.1} minutes\n", secs / 60.0);
    s.push_str(body);
    s
}
