//! `turnstile bench tower`: what turnstile-tower's layer costs an HTTP server, side by side in
//! one run.
//!
//! - `wrk`: an axum hello world (tower/examples/hello.rs) without the layer, with it by
//!   `Router::layer` and with it around the router, under wrk; server and client pinned to two
//!   cores, every variant once per round, rounds interleaved; requests/s and requests per
//!   second of the server's CPU time, each against the run without the layer, and their medians.
//! - `callgrind`: instructions per request of no layer, turnstile's and tower_governor's, with
//!   and without their rate-limit headers (tower/benches/layer.rs under valgrind): exact and
//!   repeatable on a loaded machine.
//! - `server`: user-space instructions per request of the hello server itself under wrk
//!   (callgrind's counters zeroed after a warm-up); kernel time is not in it.

use super::drive::{self, Scratch, Server};
use super::row::median;
use super::text::{load_average, progress, progress_done};
use super::wrk;
use crate::args::parse_count;
use clap::{Args, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `turnstile bench tower MODE`.
#[derive(Args)]
pub struct TowerArgs {
    #[command(subcommand)]
    mode: TowerMode,
}

#[derive(Subcommand)]
enum TowerMode {
    /// The hello world with and without the layer under wrk (requests/s, per server CPU-second).
    Wrk(WrkArgs),
    /// Instructions per request in process (valgrind's callgrind), beside tower_governor.
    Callgrind(CallgrindArgs),
    /// Instructions per request of the hello server under wrk (callgrind).
    Server(ServerArgs),
}

/// The hello server and how long wrk runs against it.
#[derive(Args)]
struct Hello {
    /// The hello example (`cargo build --release -p turnstile-tower --example hello`).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "target/release/examples/hello"
    )]
    hello: PathBuf,
    /// Seconds of each measured wrk run.
    #[arg(long, value_name = "S", default_value_t = 10)]
    seconds: u64,
}

#[derive(Args)]
struct WrkArgs {
    #[command(flatten)]
    h: Hello,
    /// Rounds, interleaved; ratios are their medians.
    #[arg(long, value_name = "N", default_value_t = 5)]
    rounds: usize,
    /// wrk's connections.
    #[arg(long, value_name = "N", default_value_t = 50)]
    connections: u64,
    /// The layer's rate-limit headers: ietf (draft-10's) or none.
    #[arg(long, value_enum, default_value = "ietf")]
    headers: Headers,
    /// The core the server runs on.
    #[arg(long, value_name = "N", default_value_t = 0)]
    server_core: usize,
    /// The core wrk runs on.
    #[arg(long, value_name = "N", default_value_t = 1)]
    client_core: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Headers {
    Ietf,
    None,
}

#[derive(Args)]
struct CallgrindArgs {
    /// The layer benchmark's binary (`cargo bench -p turnstile-tower --bench layer --no-run`
    /// prints it).
    #[arg(long, value_name = "PATH")]
    bench_bin: PathBuf,
    /// Key sets, comma-separated: 1k, 1M.
    #[arg(long, value_name = "LIST", default_value = "1k,1M")]
    keys: String,
    /// Requests per variant, after a warm-up.
    #[arg(long, value_name = "N", value_parser = parse_count, default_value = "20000")]
    requests: u64,
}

#[derive(Args)]
struct ServerArgs {
    #[command(flatten)]
    h: Hello,
}

/// Runs `turnstile bench tower`.
pub(crate) fn run(a: TowerArgs) -> crate::Result<()> {
    let loaded = |when: &str| {
        if let Some(l) = load_average() {
            println!("== load average {l:.2} ({when})");
        }
    };
    loaded("before");
    match a.mode {
        TowerMode::Wrk(w) => wrk_mode(&w)?,
        TowerMode::Callgrind(c) => callgrind_mode(&c)?,
        TowerMode::Server(s) => server_mode(&s)?,
    }
    progress_done();
    loaded("after");
    Ok(())
}

/// The hello variants: no layer, inside the router, around it.
const VARIANTS: [(&str, &[&str]); 3] = [
    ("without", &[]),
    ("inside", &["--layer"]),
    ("outside", &["--layer-outside"]),
];

fn need_file(p: &Path, how: &str) -> crate::Result<()> {
    if p.is_file() {
        Ok(())
    } else {
        Err(format!("{} does not exist: {how}", p.display()).into())
    }
}

/// Starts the hello server with `flags` on a free port, pinned; checks the first answer's
/// rate-limit header is there exactly when the layer sends it.
fn hello(w: &WrkArgs, flags: &[&str]) -> crate::Result<(Server, u16)> {
    let port = drive::free_port()?;
    let mut c = drive::pinned(w.server_core, &w.h.hello.to_string_lossy());
    c.args(["--addr", &format!("127.0.0.1:{port}")]).args(flags);
    if w.headers == Headers::None {
        c.arg("--no-headers");
    }
    let s = Server::start(c, port, "the hello server")?;
    let head = http_head(port)?;
    let has = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("ratelimit:"));
    let want = !flags.is_empty() && w.headers == Headers::Ietf;
    if has != want {
        return Err(format!(
            "hello {flags:?}: RateLimit header {} where {} expected:\n{head}",
            if has { "present" } else { "absent" },
            if want { "one is" } else { "none is" }
        )
        .into());
    }
    Ok((s, port))
}

/// The head of one `GET /` answer.
fn http_head(port: u16) -> crate::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out.split("\r\n\r\n").next().unwrap_or_default().to_string())
}

/// One wrk run against `port`: requests/s and requests per server CPU-second.
fn wrk_run(w: &WrkArgs, port: u16, s: &Server) -> crate::Result<(f64, f64)> {
    let args: Vec<String> = vec![
        "-t1".into(),
        format!("-c{}", w.connections),
        format!("-d{}s", w.h.seconds),
        "--latency".into(),
        format!("http://127.0.0.1:{port}/"),
    ];
    let c0 = s.cpu_secs()?;
    let run = wrk::run_pinned(w.client_core, "wrk", &args)?;
    let cpu = s.cpu_secs()? - c0;
    let load = wrk::parse_wrk(&run.stdout)?;
    Ok((load.rps, load.requests / cpu.max(1e-9)))
}

fn wrk_mode(w: &WrkArgs) -> crate::Result<()> {
    drive::need("wrk")?;
    drive::need("taskset")?;
    need_file(
        &w.h.hello,
        "cargo build --release -p turnstile-tower --example hello",
    )?;
    let h = if w.headers == Headers::Ietf {
        "ietf"
    } else {
        "none"
    };
    println!(
        "axum hello world, wrk -t1 -c{} -d{}s, server on core {}, wrk on core {}",
        w.connections, w.h.seconds, w.server_core, w.client_core
    );
    println!(
        "req/s, and requests per server CPU-second (cpu-s); the layer by Router::layer (inside)"
    );
    println!("and around the router (outside), rate-limit headers: {h}; ratios against no layer");
    println!(
        "{:<6} {:>10} {:>10} {:>7} {:>10} {:>7} {:>11} {:>7} {:>7}",
        "round", "without", "inside", "ratio", "outside", "ratio", "cpu-s w/o", "inside", "outside"
    );
    // ratios[v]: (req/s ratio, cpu-s ratio) per round, v = inside, outside.
    let mut ratios: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    for r in 1..=w.rounds {
        let mut m = Vec::new();
        for (name, flags) in VARIANTS {
            let (s, port) = hello(w, flags)?;
            m.push(wrk_run(w, port, &s)?);
            progress(format!(
                "round {r}: {name}: {:.0} req/s",
                m.last().map_or(0.0, |x| x.0)
            ));
        }
        let ratio = |i: usize| (m[i].0 / m[0].0, m[i].1 / m[0].1);
        ratios[0].push(ratio(1));
        ratios[1].push(ratio(2));
        println!(
            "{r:<6} {:>10.0} {:>10.0} {:>7.3} {:>10.0} {:>7.3} {:>11.0} {:>7.3} {:>7.3}",
            m[0].0,
            m[1].0,
            ratio(1).0,
            m[2].0,
            ratio(2).0,
            m[0].1,
            ratio(1).1,
            ratio(2).1
        );
    }
    for (name, v) in ["inside", "outside"].iter().zip(&ratios) {
        println!(
            "median ratio, {name}: {:.3} req/s, {:.3} per server CPU-second",
            median(v.iter().map(|x| x.0).collect()),
            median(v.iter().map(|x| x.1).collect())
        );
    }
    Ok(())
}

/// The benchmark's variants under callgrind.
const LAYERS: [&str; 5] = [
    "none",
    "turnstile",
    "tower_governor",
    "turnstile_no_headers",
    "tower_governor_no_headers",
];

/// callgrind's total instruction count (`summary:` or `totals:` line) of an output file.
pub(crate) fn callgrind_total(out: &str) -> Option<u64> {
    out.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

fn callgrind_mode(c: &CallgrindArgs) -> crate::Result<()> {
    drive::need("valgrind")?;
    need_file(
        &c.bench_bin,
        "cargo bench -p turnstile-tower --bench layer --no-run prints its path",
    )?;
    let scratch = Scratch::new("tower-callgrind")?;
    let n = c.requests as f64;
    println!(
        "instructions per request (callgrind), {} requests per variant after warm-up;",
        c.requests
    );
    println!("+: added over no layer; ratio: turnstile's added / tower_governor's");
    println!(
        "{:<5} {:<14} {:>8} {:>10} {:>8}",
        "keys", "layer", "headers", "no headers", "none"
    );
    for keys in c.keys.split(',').map(str::trim) {
        let mut ir = [0f64; LAYERS.len()];
        for (i, v) in LAYERS.iter().enumerate() {
            progress(format!("{keys} keys: {v}"));
            let out = scratch.path(&format!("{v}.out"));
            let mut cmd = Command::new("valgrind");
            cmd.args([
                "--tool=callgrind",
                "--collect-atstart=no",
                "--toggle-collect=*cg_run*",
            ])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&c.bench_bin)
            .arg("--bench")
            .env("LAYER_BENCH_KEYS", keys)
            .env("LAYER_BENCH_VARIANT", v)
            .env("LAYER_BENCH_CALLGRIND", c.requests.to_string());
            drive::run(cmd, "valgrind")?;
            let text = std::fs::read_to_string(&out)?;
            ir[i] =
                callgrind_total(&text).ok_or("no instruction total in callgrind's output")? as f64;
        }
        let [none, t, g, tn, gn] = ir;
        println!(
            "{keys:<5} {:<14} {:>8.0} {:>10.0} {:>8.0}",
            "turnstile",
            t / n,
            tn / n,
            none / n
        );
        println!(
            "{keys:<5} {:<14} {:>8.0} {:>10.0}",
            "tower_governor",
            g / n,
            gn / n
        );
        println!(
            "{keys:<5} {:<14} {:>+8.0} {:>+10.0}",
            "turnstile+",
            (t - none) / n,
            (tn - none) / n
        );
        println!(
            "{keys:<5} {:<14} {:>+8.0} {:>+10.0}",
            "governor+",
            (g - none) / n,
            (gn - none) / n
        );
        println!(
            "{keys:<5} {:<14} {:>8.2} {:>10.2}",
            "ratio",
            (t - none) / (g - none),
            (tn - none) / (gn - none)
        );
    }
    Ok(())
}

fn server_mode(a: &ServerArgs) -> crate::Result<()> {
    for p in ["valgrind", "callgrind_control", "wrk"] {
        drive::need(p)?;
    }
    need_file(
        &a.h.hello,
        "cargo build --release -p turnstile-tower --example hello",
    )?;
    let scratch = Scratch::new("tower-server")?;
    println!("hello server under callgrind, wrk -t1 -c10: user-space instructions per request");
    for (name, flags) in VARIANTS {
        let port = drive::free_port()?;
        let out = scratch.path("srv.out");
        let mut c = Command::new("valgrind");
        c.arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&a.h.hello)
            .args(["--addr", &format!("127.0.0.1:{port}")])
            .args(flags);
        let s = Server::start(c, port, "the hello server under valgrind")?;
        let url = format!("http://127.0.0.1:{port}/");
        let wrk_args = |secs: u64| {
            vec![
                "-t1".to_string(),
                "-c10".into(),
                format!("-d{secs}s"),
                "--latency".into(),
                url.clone(),
            ]
        };
        drive::run(wrk_cmd(&wrk_args(3)), "wrk")?;
        let control = |flag: &str| {
            let mut c = Command::new("callgrind_control");
            c.args([flag, &s.pid().to_string()]);
            drive::run(c, "callgrind_control")
        };
        control("-z")?;
        let run = drive::run(wrk_cmd(&wrk_args(a.h.seconds)), "wrk")?;
        control("-d")?;
        let requests = wrk::parse_wrk(&run.stdout)?.requests;
        drop(s);
        let dump = scratch.path("srv.out.1");
        let ir = callgrind_total(&std::fs::read_to_string(&dump)?)
            .ok_or("no instruction total in callgrind's dump")?;
        println!(
            "{name:<14} {requests:>8.0} requests {:>8.0} Ir/request",
            ir as f64 / requests
        );
        let _ = std::fs::remove_file(&dump);
    }
    Ok(())
}

fn wrk_cmd(args: &[String]) -> Command {
    let mut c = Command::new("wrk");
    c.args(args);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callgrind_totals_are_read() {
        assert_eq!(
            callgrind_total("events: Ir\nsummary: 78460000\n"),
            Some(78_460_000)
        );
        assert_eq!(callgrind_total("events: Ir\ntotals: 123 45\n"), Some(123));
        assert_eq!(callgrind_total("events: Ir\n"), None);
    }
}
