//! `turnstile bench serve` and `turnstile bench ab`: `turnstile serve` under a real client,
//! side by side with redis-server in the same run.
//!
//! Every server runs pinned to one core and every client to another (`taskset`). The RESP
//! rows are redis-benchmark (`-c 50`, keys drawn from `--keys`) at each pipeline depth:
//! redis-server's `INCR` (the floor of one Redis round trip), redis-cell's `CL.THROTTLE` when
//! its module is given, and turnstile's `CL.THROTTLE` on each runtime (or each build, for
//! `ab`). The HTTP rows are wrk on `POST /v1/check` against an axum hello world that does no
//! work. Each server is started once and warmed with every key (5 × `--keys` random requests
//! reach all but 0.7 % of them), then the rounds run every row in turn, so that a machine's
//! drift over the run touches every row alike; each figure is the median of its rounds.
//! Besides requests/s and the 99th percentile, each row gives requests per second of the
//! server's own CPU time (`/proc/PID/stat`), which holds when the client, not the server, is
//! what limits requests/s.

use super::drive::{self, Scratch, Server};
use super::row::median;
use super::text::{fmt_rate, load_warning, progress, progress_done};
use super::wrk::{self, Load};
use crate::args::parse_count;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

/// `turnstile bench serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// The turnstile binary that serves (default: this one).
    #[arg(long, value_name = "PATH")]
    turnstile: Option<PathBuf>,
    /// `turnstile serve --runtime` values, comma-separated: a row of each. `uring:200us` is
    /// `--runtime uring --coalesce 200us`.
    #[arg(long, value_name = "LIST", default_value = "uring,per-core")]
    runtime: String,
    /// redis-cell's module (libredis_cell.so): its CL.THROTTLE on a redis-server of its own
    /// (`--loadmodule`), beside turnstile's.
    #[arg(long, value_name = "PATH")]
    cell_so: Option<PathBuf>,
    #[command(flatten)]
    resp: RespArgs,
    /// Seconds of each wrk run on POST /v1/check and on the baseline (0: no HTTP rows).
    #[arg(long, value_name = "S", default_value_t = 10)]
    http_seconds: u64,
    /// Customers POST /v1/check draws from (within the rules file's capacity for them).
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "100k")]
    http_keys: u64,
    /// The rules file of POST /v1/check.
    #[arg(long, value_name = "FILE", default_value = "examples/rules.toml")]
    rules: PathBuf,
    /// An HTTP server POST /v1/check is compared with: server/examples/http_baseline.rs (an
    /// axum hello world), built with `cargo build --release -p turnstile-server --examples`.
    #[arg(long, value_name = "PATH")]
    http_baseline: Option<PathBuf>,
    /// Also draw the rows as bars of requests/s, as an SVG.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

/// `turnstile bench ab`.
#[derive(Args)]
pub struct AbArgs {
    /// The turnstile builds to compare (e.g. `cp target/release/turnstile /tmp/a` before a
    /// change, `/tmp/b` after).
    #[arg(required = true, value_name = "BINARY")]
    builds: Vec<PathBuf>,
    #[command(flatten)]
    resp: RespArgs,
}

/// What the RESP rows share.
#[derive(Args)]
struct RespArgs {
    /// Pipeline depths (redis-benchmark -P), comma-separated [default: 1,16 for serve, 16 for
    /// ab].
    #[arg(long, value_name = "LIST")]
    pipeline: Option<String>,
    /// Requests per row at -P 1.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "200k")]
    requests_p1: u64,
    /// Requests per row at deeper pipelines.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "1M")]
    requests: u64,
    /// Keys the requests draw from (redis-benchmark -r).
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "1M")]
    keys: u64,
    /// Rounds of every row, interleaved; figures are their medians.
    #[arg(long, value_name = "N", default_value_t = 3)]
    rounds: usize,
    /// The core the servers run on.
    #[arg(long, value_name = "N", default_value_t = 0)]
    server_core: usize,
    /// The core the clients run on.
    #[arg(long, value_name = "N", default_value_t = 1)]
    client_core: usize,
    /// One JSON document on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

/// One row of the report: the medians of its rounds.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct ServiceRow {
    pub label: String,
    /// redis-benchmark's -P; `null` for the HTTP rows.
    pub pipeline: Option<usize>,
    pub requests_per_sec: f64,
    pub p99_ms: f64,
    /// Requests per second of the server's own CPU time.
    pub per_server_cpu_sec: f64,
    /// Share of the run the server was on a CPU.
    pub server_on_cpu: f64,
    /// Share of the run the client was on a CPU.
    pub client_on_cpu: f64,
    pub rounds: usize,
}

/// One measurement of one row.
struct Sample {
    load: Load,
    server_cpu: f64,
    client_cpu: f64,
    wall: f64,
}

/// Folds a row's rounds into their medians.
fn fold(label: &str, pipeline: Option<usize>, s: &[Sample]) -> ServiceRow {
    let m = |f: &dyn Fn(&Sample) -> f64| median(s.iter().map(f).collect());
    ServiceRow {
        label: label.to_string(),
        pipeline,
        requests_per_sec: m(&|x| x.load.rps),
        p99_ms: m(&|x| x.load.p99_us / 1e3),
        per_server_cpu_sec: m(&|x| x.load.requests / x.server_cpu.max(1e-9)),
        server_on_cpu: m(&|x| x.server_cpu / x.wall),
        client_on_cpu: m(&|x| x.client_cpu / x.wall),
        rounds: s.len(),
    }
}

/// A RESP server under test and the command redis-benchmark sends it.
struct Target {
    label: String,
    server: Server,
    port: u16,
    command: Vec<String>,
}

const INCR: &str = "redis-server INCR";
const CELL: &str = "redis-cell CL.THROTTLE";
const THROTTLE: [&str; 5] = ["CL.THROTTLE", "key:__rand_int__", "15", "30", "60"];

impl RespArgs {
    /// The depths: `--pipeline`, or the command's default (set by `run_serve`, `run_ab`).
    fn pipelines(&self) -> crate::Result<Vec<usize>> {
        let list = self.pipeline.as_deref().unwrap_or("16");
        let p: Result<Vec<usize>, _> = list.split(',').map(|p| p.trim().parse()).collect();
        match p {
            Ok(p) if !p.is_empty() && p.iter().all(|d| (1..=1000).contains(d)) => Ok(p),
            _ => Err(format!(
                "option --pipeline: `{list}`; give depths from 1 to 1000, comma-separated (e.g. 1,16)"
            )
            .into()),
        }
    }

    fn check(&self) -> crate::Result<()> {
        if !(1..=100).contains(&self.rounds) {
            return Err(format!("option --rounds: {}; give 1 to 100", self.rounds).into());
        }
        if self.keys == 0 || self.requests == 0 || self.requests_p1 == 0 {
            return Err("options --keys, --requests and --requests-p1: give at least 1".into());
        }
        if self.server_core == self.client_core {
            return Err("options --server-core and --client-core: give two different cores".into());
        }
        for p in ["redis-server", "redis-benchmark", "taskset"] {
            drive::need(p)?;
        }
        Ok(())
    }

    /// redis-benchmark's arguments for `n` requests at depth `p` against `port`.
    fn benchmark(&self, port: u16, n: u64, p: usize, command: &[String]) -> Vec<String> {
        let mut a: Vec<String> = ["-p", &port.to_string(), "-n", &n.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend([
            "-r".into(),
            self.keys.to_string(),
            "-P".into(),
            p.to_string(),
        ]);
        a.extend(["-c".into(), "50".into(), "--csv".into()]);
        a.extend(command.iter().cloned());
        a
    }

    /// Every key once before measuring: the rows compare steady states, not the first touch
    /// of a table or the insertion of new keys.
    fn warm(&self, t: &Target) -> crate::Result<()> {
        progress(format!(
            "{}: warming with {} requests",
            t.label,
            fmt_rate(5.0 * self.keys as f64)
        ));
        let a = self.benchmark(t.port, 5 * self.keys, 16, &t.command);
        wrk::run_pinned(self.client_core, "redis-benchmark", &a)?;
        Ok(())
    }

    /// One measurement of `t` at depth `p`.
    fn measure(&self, t: &Target, p: usize) -> crate::Result<Sample> {
        let n = if p == 1 {
            self.requests_p1
        } else {
            self.requests
        };
        let a = self.benchmark(t.port, n, p, &t.command);
        let c0 = t.server.cpu_secs()?;
        let run = wrk::run_pinned(self.client_core, "redis-benchmark", &a)?;
        let server_cpu = t.server.cpu_secs()? - c0;
        Ok(Sample {
            load: wrk::parse_redis_benchmark(&run.stdout, n)?,
            server_cpu,
            client_cpu: run.cpu_secs,
            wall: run.wall_secs,
        })
    }

    /// Every target at every depth, `rounds` times interleaved; one row per (depth, target).
    fn rounds(&self, targets: &[Target]) -> crate::Result<Vec<ServiceRow>> {
        let pipelines = self.pipelines()?;
        let mut samples: Vec<Vec<Sample>> = (0..pipelines.len() * targets.len())
            .map(|_| Vec::new())
            .collect();
        for r in 1..=self.rounds {
            for (i, &p) in pipelines.iter().enumerate() {
                for (j, t) in targets.iter().enumerate() {
                    let s = self.measure(t, p)?;
                    progress(format!(
                        "round {r}/{}: {} -P {p}: {} req/s",
                        self.rounds,
                        t.label,
                        fmt_rate(s.load.rps)
                    ));
                    samples[i * targets.len() + j].push(s);
                }
            }
        }
        let mut rows = Vec::new();
        for (i, &p) in pipelines.iter().enumerate() {
            for (j, t) in targets.iter().enumerate() {
                rows.push(fold(&t.label, Some(p), &samples[i * targets.len() + j]));
            }
        }
        Ok(rows)
    }

    /// redis-server on a free port, pinned; with `module`, loaded with it.
    fn redis(
        &self,
        label: &str,
        module: Option<&PathBuf>,
        command: &[&str],
    ) -> crate::Result<Target> {
        let port = drive::free_port()?;
        let mut c = drive::pinned(self.server_core, "redis-server");
        c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"]);
        c.args(["--save", "", "--appendonly", "no"]);
        if let Some(m) = module {
            c.arg("--loadmodule").arg(m);
        }
        let server = Server::start(c, port, label)?;
        Ok(Target {
            label: label.to_string(),
            server,
            port,
            command: command.iter().map(|s| s.to_string()).collect(),
        })
    }
}

/// `turnstile serve` (the binary `bin`) on free ports, one worker, pinned: its RESP target
/// and its HTTP port.
fn turnstile(
    r: &RespArgs,
    bin: &str,
    label: String,
    extra: &[String],
) -> crate::Result<(Target, u16)> {
    let [port, http] = drive::free_ports()?;
    let mut c = drive::pinned(r.server_core, bin);
    c.arg("serve")
        .args(["--resp", &format!("127.0.0.1:{port}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args([
            "--workers",
            "1",
            "--watch-every",
            "0",
            "--snapshot-every",
            "0",
        ])
        .args(["--throttle-keys", &(2 * r.keys).max(1024).to_string()])
        .args(extra);
    let server = Server::start(c, port, &label)?;
    let target = Target {
        label,
        server,
        port,
        command: THROTTLE.iter().map(|s| s.to_string()).collect(),
    };
    Ok((target, http))
}

/// Runs `turnstile bench serve`.
pub(crate) fn run_serve(mut a: ServeArgs) -> crate::Result<()> {
    a.resp.pipeline.get_or_insert_with(|| "1,16".into());
    let r = &a.resp;
    r.check()?;
    r.pipelines()?;
    if a.http_seconds > 0 {
        drive::need("wrk")?;
        if !a.rules.is_file() {
            return Err(format!(
                "option --rules: {} is not a file (run from the repository's root, or give --rules FILE, or --http-seconds 0 for no HTTP rows)",
                a.rules.display()
            )
            .into());
        }
    }
    let bin = match &a.turnstile {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    let bin = bin.to_string_lossy().into_owned();
    let runtimes = runtimes(&a.runtime)?;
    load_warning();
    let mut targets = vec![r.redis(INCR, None, &["incr", "key:__rand_int__"])?];
    if let Some(so) = &a.cell_so {
        if !so.is_file() {
            return Err(format!("option --cell-so: {} is not a file", so.display()).into());
        }
        targets.push(r.redis(CELL, Some(so), &THROTTLE)?);
    }
    let mut http = Vec::new();
    for (rt, mut extra) in runtimes {
        extra.extend(["--rules".into(), a.rules.to_string_lossy().into_owned()]);
        let (t, port) = turnstile(r, &bin, format!("turnstile CL.THROTTLE ({rt})"), &extra)?;
        http.push((
            format!("turnstile POST /v1/check ({rt})"),
            port,
            targets.len(),
        ));
        targets.push(t);
    }
    for t in &targets {
        r.warm(t)?;
    }
    let mut rows = r.rounds(&targets)?;
    if a.http_seconds > 0 {
        rows.extend(http_rows(&a, &targets, &http)?);
    }
    drop(targets);
    progress_done();
    report(&rows, &[INCR, CELL], r.json, a.plot.as_deref())
}

/// `--runtime`'s entries: each one's label and the `turnstile serve` flags it stands for
/// (`uring:200us` is `--runtime uring --coalesce 200us`); a wrong wait is refused here.
fn runtimes(list: &str) -> crate::Result<Vec<(String, Vec<String>)>> {
    list.split(',')
        .map(str::trim)
        .map(|rt| {
            let mut extra = vec!["--runtime".to_string()];
            match rt.split_once(':') {
                Some((kind, wait)) => {
                    coalesce_ok(rt, wait)?;
                    extra.extend([kind.into(), "--coalesce".into(), wait.into()]);
                }
                None => extra.push(rt.into()),
            }
            Ok((rt.to_string(), extra))
        })
        .collect()
}

/// `--runtime KIND:WAIT`'s wait, read by `turnstile serve`'s own `--coalesce` parser, so that a
/// wrong one is refused with its reason before any server starts (a server that exits at once
/// says nothing here: its stderr is discarded).
fn coalesce_ok(entry: &str, wait: &str) -> crate::Result<()> {
    use clap::FromArgMatches;
    let cmd = turnstile_server::ServeArgs::augment_args(clap::Command::new("serve"));
    cmd.try_get_matches_from(["serve", "--coalesce", wait])
        .and_then(|m| turnstile_server::ServeArgs::from_arg_matches(&m))
        .map(drop)
        .map_err(|e| {
            let why = e.to_string();
            let why = why
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            format!("option --runtime: `{entry}`: {why}").into()
        })
}

/// The HTTP rows: wrk on POST /v1/check of each turnstile (`http`: the row's label, the
/// server's HTTP port and its index in `targets`), and on the baseline if given.
fn http_rows(
    a: &ServeArgs,
    targets: &[Target],
    http: &[(String, u16, usize)],
) -> crate::Result<Vec<ServiceRow>> {
    let r = &a.resp;
    let scratch = Scratch::new("serve")?;
    let script = scratch.path("check.lua");
    std::fs::write(&script, wrk::check_script(a.http_keys, "/v1/check"))?;
    let baseline_script = scratch.path("baseline.lua");
    std::fs::write(&baseline_script, wrk::check_script(a.http_keys, "/"))?;
    let baseline = match &a.http_baseline {
        Some(b) => {
            let port = drive::free_port()?;
            let mut c = drive::pinned(r.server_core, &b.to_string_lossy());
            c.args([format!("127.0.0.1:{port}"), "1".to_string()]);
            Some((port, Server::start(c, port, "the HTTP baseline")?))
        }
        None => None,
    };
    // (label, url, script, server) per row.
    let mut runs: Vec<(String, String, &PathBuf, &Server)> = http
        .iter()
        .map(|(label, port, i)| {
            let url = format!("http://127.0.0.1:{port}/v1/check");
            (label.clone(), url, &script, &targets[*i].server)
        })
        .collect();
    if let Some((port, s)) = &baseline {
        runs.push((
            "axum hello world (POST /)".into(),
            format!("http://127.0.0.1:{port}/"),
            &baseline_script,
            s,
        ));
    }
    let wrk_args = |secs: u64, url: &str, script: &PathBuf| -> Vec<String> {
        let mut v: Vec<String> = ["-t1", "-c50", &format!("-d{secs}s"), "--latency", "-s"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.push(script.to_string_lossy().into_owned());
        v.push(url.to_string());
        v
    };
    for (label, url, script, _) in &runs {
        progress(format!("{label}: a 2 s warm-up pass"));
        wrk::run_pinned(r.client_core, "wrk", &wrk_args(2, url, script))?;
    }
    let mut samples: Vec<Vec<Sample>> = runs.iter().map(|_| Vec::new()).collect();
    for round in 1..=r.rounds {
        for (i, (label, url, script, server)) in runs.iter().enumerate() {
            let c0 = server.cpu_secs()?;
            let run =
                wrk::run_pinned(r.client_core, "wrk", &wrk_args(a.http_seconds, url, script))?;
            let server_cpu = server.cpu_secs()? - c0;
            let load = wrk::parse_wrk(&run.stdout)?;
            progress(format!(
                "round {round}/{}: {label}: {} req/s",
                r.rounds,
                fmt_rate(load.rps)
            ));
            samples[i].push(Sample {
                load,
                server_cpu,
                client_cpu: run.cpu_secs,
                wall: run.wall_secs,
            });
        }
    }
    Ok(runs
        .iter()
        .zip(&samples)
        .map(|((label, ..), s)| fold(label, None, s))
        .collect())
}

/// Runs `turnstile bench ab`.
pub(crate) fn run_ab(a: AbArgs) -> crate::Result<()> {
    let r = &a.resp;
    r.check()?;
    r.pipelines()?;
    for b in &a.builds {
        if !b.is_file() {
            return Err(format!(
                "{}: no such build (give paths of turnstile binaries)",
                b.display()
            )
            .into());
        }
    }
    load_warning();
    let mut targets = vec![r.redis(INCR, None, &["incr", "key:__rand_int__"])?];
    for (i, b) in a.builds.iter().enumerate() {
        let label = format!("{} {}", (b'A' + i as u8) as char, b.display());
        targets.push(turnstile(r, &b.to_string_lossy(), label, &[])?.0);
    }
    for t in &targets {
        r.warm(t)?;
    }
    let rows = r.rounds(&targets)?;
    let targets_labels: Vec<String> = targets[1..].iter().map(|t| t.label.clone()).collect();
    drop(targets);
    progress_done();
    let first = targets_labels.first().map_or("", String::as_str);
    report(&rows, &[INCR, first], r.json, None)
}

/// The table (or JSON) and the ratios against the peers.
fn report(
    rows: &[ServiceRow],
    peers: &[&str],
    json: bool,
    plot: Option<&std::path::Path>,
) -> crate::Result<()> {
    if let Some(f) = plot {
        bars::bars(f, rows)
            .map_err(|e| format!("cannot write the plot to {}: {e}", f.display()))?;
        progress(format!("wrote {}", f.display()));
    }
    if json {
        let doc =
            serde_json::json!({ "results": rows, "load_average": super::text::load_average() });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "{:<40} {:>3} {:>10} {:>9} {:>12} {:>7} {:>7}",
        "server", "-P", "req/s", "p99 ms", "req/CPU-s", "server", "client"
    );
    for r in rows {
        println!(
            "{:<40} {:>3} {:>10.0} {:>9.3} {:>12.0} {:>6.0}% {:>6.0}%",
            r.label,
            r.pipeline.map(|p| p.to_string()).unwrap_or_default(),
            r.requests_per_sec,
            r.p99_ms,
            r.per_server_cpu_sec,
            100.0 * r.server_on_cpu,
            100.0 * r.client_on_cpu
        );
    }
    println!();
    println!(
        "medians of {} interleaved rounds; req/CPU-s: requests per second of the server's own CPU time; server, client: share of the run each was on a CPU",
        rows.first().map_or(0, |r| r.rounds)
    );
    for line in ratios(rows, peers) {
        println!("{line}");
    }
    Ok(())
}

/// Every row but the peers' against each peer of its depth (`peers`: redis-server's INCR,
/// redis-cell, the first build of an A/B), and POST /v1/check against the HTTP baseline:
/// requests/s and per server CPU-second.
fn ratios(rows: &[ServiceRow], peers: &[&str]) -> Vec<String> {
    let peer =
        |label: &str, p: Option<usize>| rows.iter().find(|r| r.label == label && r.pipeline == p);
    let mut out = Vec::new();
    let mut line = |r: &ServiceRow, peer: &ServiceRow| {
        let depth = r.pipeline.map(|p| format!(" -P {p}")).unwrap_or_default();
        out.push(format!(
            "{}{depth} / {}: {:.2}x req/s, {:.2}x per server CPU-second",
            r.label,
            peer.label,
            r.requests_per_sec / peer.requests_per_sec,
            r.per_server_cpu_sec / peer.per_server_cpu_sec
        ));
    };
    for r in rows.iter().filter(|r| !r.label.starts_with("redis")) {
        if r.pipeline.is_some() {
            for name in peers.iter().filter(|&&n| n != r.label) {
                if let Some(p) = peer(name, r.pipeline) {
                    line(r, p);
                }
            }
        } else if let Some(p) =
            peer("axum hello world (POST /)", None).filter(|p| p.label != r.label)
        {
            line(r, p);
        }
    }
    out
}

mod bars;

#[cfg(test)]
mod tests;
