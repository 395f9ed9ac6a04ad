//! `turnstile soak`: an abuse soak of a running `turnstile serve` on this machine (a
//! benchmark, not a test). Honest clients send `CL.THROTTLE` and `POST /v1/check` at a fixed
//! pace and record their latencies; first alone (the quiet run), then while `--connections`
//! hostile clients attack at once ([`attack::Kind`]: giant frames, clients that never read,
//! unauthenticated floods, new `CL.THROTTLE` parameter sets, garbage, `MULTI` without `EXEC`,
//! tagged customer ids, slow headers, oversized bodies, no credentials), then alone again
//! while the server settles. Every phase is bounded in time, every attacker to one connection
//! at a time, and only loopback addresses are accepted.
//!
//! It reports the server's resident memory (from `/proc/PID/status`) at idle, at its peak
//! under attack and after the settle, against the bound computed from the server's own flags
//! ([`Bound`]); the honest latencies under attack against the quiet run's; what the server did
//! to each kind of attacker; and whether every admission the honest clients saw is in the
//! server's counts afterwards (each honest key looked at once more, and `/metrics`).

mod attack;
mod honest;
pub(crate) mod plot;
pub(crate) mod probe;

use attack::Kind;
use hdrhistogram::Histogram;
use honest::{Recorder, Seen};
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use turnstile_server::ServeArgs;

/// The options of `turnstile soak`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example (a release server on free ports, with a password):\n  \
    turnstile serve --requirepass-file pw --rules examples/rules.toml --resp 127.0.0.1:6390 --http 127.0.0.1:8090 &\n  \
    turnstile soak --target 127.0.0.1:6390 --http 127.0.0.1:8090 --password-file pw --plot soak.svg\n\n\
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
    /// Each honest client sends one request this often.
    #[arg(long, default_value = "5ms", value_parser = turnstile::rules::parse_duration)]
    pub every: Duration,
    /// Only these kinds of attackers (comma-separated), in their shares of the mix; all by
    /// default.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub kinds: Vec<Kind>,
    /// The server's log: a `panicked` in it fails the no-panic target.
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
fn seconds(s: &str) -> Result<Duration, String> {
    let d = match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Duration::from_secs_f64(x),
        Ok(_) => return Err(format!("`{s}` is not a number of seconds")),
        Err(_) => turnstile::rules::parse_duration(s)?,
    };
    if d > Duration::from_secs(3600) {
        return Err(format!("`{s}`: at most an hour"));
    }
    Ok(d)
}

/// The phases, in order.
const PHASES: [&str; 3] = ["quiet", "attack", "settle"];

/// How often the server is sampled.
const SAMPLE: Duration = Duration::from_millis(500);

/// Targets of the soak at the defaults.
const MAX_GROWTH: u64 = 256 << 20;
const MAX_P99_MS: f64 = 10.0;
const SETTLE_WITHIN: f64 = 0.10;

/// The server's memory bound, from its flags, as docs/service.md states it: per RESP
/// connection its input buffer (the larger of 16 KiB and the largest frame the bounds
/// allow), 16 KiB of output before it pauses plus one reply, 16 KiB of queued `MULTI`
/// commands, and its fixed part; the deferred budget (64 MiB) shared by all; per HTTP
/// connection its header buffer and one body; and the `CL.THROTTLE` store (its size at
/// `--throttle-keys`).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Bound {
    pub per_resp: u64,
    pub per_http: u64,
    pub deferred: u64,
    pub stores: u64,
    pub resp_connections: u64,
    pub http_connections: u64,
}

/// Fixed part of a RESP connection: its task, state, parse-ahead vectors and socket
/// registration (measured: docs/service.md).
const RESP_FIXED: u64 = 8 << 10;
/// Fixed part of an HTTP connection: hyper's connection state, write buffer and task.
const HTTP_FIXED: u64 = 16 << 10;
/// The server-wide deferred budget (server/src/lib.rs).
const DEFERRED: u64 = 64 << 20;

impl Bound {
    pub fn of(a: &ServeArgs, resp_connections: u64, http_connections: u64) -> Self {
        let b = turnstile_server::resp::Bounds {
            max_args: a.max_args.max(1),
            max_bulk: a.max_bulk,
            max_inline: a.max_inline.max(16),
            unauthenticated: false,
        };
        let input = (16u64 << 10).max(b.max_frame() as u64);
        Self {
            per_resp: input + (16 << 10) + (8 << 10) + (16 << 10) + RESP_FIXED,
            per_http: (a.max_header_bytes.max(8192) + a.max_body) as u64 + HTTP_FIXED,
            deferred: DEFERRED,
            stores: throttle_store_bytes(a.throttle_keys),
            resp_connections,
            http_connections,
        }
    }

    /// The connections' part.
    pub fn connections(&self) -> u64 {
        self.resp_connections * self.per_resp
            + self.deferred
            + self.http_connections * self.per_http
    }

    pub fn total(&self) -> u64 {
        self.connections() + self.stores
    }
}

/// The size of the server's `CL.THROTTLE` store at `keys`: the same store built here, which
/// is exact (a store's size depends on its shards and tables, not on the key count alone).
fn throttle_store_bytes(keys: u64) -> u64 {
    turnstile_server::throttle::Throttles::new(keys, 0)
        .map_or(keys * 20, |t| t.store().memory_bytes() as u64)
}

/// One sample of the server.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    /// Seconds since the start.
    pub t: f64,
    pub phase: usize,
    pub rss: Option<u64>,
    /// turnstile_resp_buffer_bytes.
    pub buffers: Option<f64>,
    /// turnstile_resp_deferred_bytes.
    pub deferred: Option<f64>,
    /// turnstile_connections (RESP, open).
    pub resp_connections: Option<f64>,
    /// The kernel's TCP buffers, machine-wide (the attackers' ends included).
    pub kernel_tcp: Option<u64>,
    /// Bytes queued in the kernel on the server's own connections: (send, receive).
    pub server_queues: Option<(u64, u64)>,
    /// Honest p99 over the interval (ms).
    pub p99_resp_ms: Option<f64>,
    pub p99_http_ms: Option<f64>,
    pub attack_open: u64,
    /// The server's CPU time so far (s).
    pub cpu: Option<f64>,
    /// turnstile_resp_commands_total.
    pub commands: Option<f64>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn p(h: &Histogram<u64>, q: f64) -> Option<f64> {
    (!h.is_empty()).then(|| ms(h.value_at_quantile(q)))
}

/// Raises the soft limit of open files to what the soak needs (the hard limit allows).
fn enough_files(need: u64) -> Result<(), String> {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return Ok(());
        }
        if r.rlim_cur >= need {
            return Ok(());
        }
        if r.rlim_max < need {
            return Err(format!(
                "the soak needs {need} open files and the hard limit is {}: raise it (ulimit -Hn) or lower --connections",
                r.rlim_max
            ));
        }
        r.rlim_cur = need;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
    Ok(())
}

fn read_password(f: &Option<PathBuf>) -> Result<Option<Vec<u8>>, String> {
    let Some(f) = f else { return Ok(None) };
    let mut b = std::fs::read(f)
        .map_err(|e| format!("--password-file {}: cannot read it ({e})", f.display()))?;
    while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
        b.pop();
    }
    if b.is_empty() {
        return Err(format!("--password-file {}: empty", f.display()));
    }
    Ok(Some(b))
}

fn say(json: bool, msg: impl AsRef<str>) {
    if !json || crate::progress::visible(false) {
        eprintln!("soak: {}", msg.as_ref());
    }
}

/// What the honest clients saw, per kind.
struct HonestRun {
    resp: Vec<Seen>,
    http: Vec<Seen>,
}

/// `turnstile soak`.
pub fn run(a: SoakArgs) -> Result<(), String> {
    for (flag, addr) in [("--target", Some(a.target)), ("--http", a.http)] {
        if let Some(addr) = addr {
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "{flag} {addr}: the soak attacks loopback addresses only (127.0.0.1, ::1); run it on the server's machine"
                ));
            }
        }
    }
    let password = read_password(&a.password_file)?;
    enough_files(u64::from(a.connections) + u64::from(a.honest_resp + a.honest_http) + 256)?;
    let pid = a.pid.or_else(|| probe::find_pid(a.target));
    if let Some(pid) = pid {
        if probe::rss(pid).is_none() {
            return Err(format!("--pid {pid}: no such process (or not readable)"));
        }
    }
    let (flags, flags_read) = match pid.and_then(probe::server_flags) {
        Some(f) => (f, true),
        None => (ServeArgs::new(), false),
    };
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 1_000_000);
    let json = a.json;
    say(json, format!(
        "target {} (http {}), server pid {}, {} attackers for {:?} after a {:?} quiet run, then {:?} settle; load average {}",
        a.target,
        a.http.map_or("none".into(), |h| h.to_string()),
        pid.map_or("unknown (RSS not measured)".into(), |p| p.to_string()),
        a.connections,
        a.seconds,
        a.quiet,
        a.settle,
        probe::load_average().map_or("?".into(), |l| format!("{l:.2}")),
    ));
    if !flags_read {
        say(json, "the server's flags could not be read from its command line: the bound assumes the defaults");
    }
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    control.block_on(soak(&a, pid, password, flags, flags_read, run_id))
}

struct Shared {
    samples: Mutex<Vec<Sample>>,
    phase: AtomicUsize,
    stop_sampler: AtomicBool,
    resp_rec: Arc<Recorder>,
    http_rec: Arc<Recorder>,
    attack: Arc<attack::Stats>,
}

async fn sampler(
    sh: Arc<Shared>,
    pid: Option<u32>,
    ports: Vec<u16>,
    http: Option<SocketAddr>,
    password: Option<Vec<u8>>,
    t0: Instant,
) {
    let mut tick = tokio::time::interval(SAMPLE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !sh.stop_sampler.load(Ordering::Relaxed) {
        tick.tick().await;
        let m = match http {
            Some(h) => probe::metrics(h, password.as_deref()).await,
            None => None,
        };
        let g = |k: &str| m.as_ref().and_then(|m| m.get(k).copied());
        let s = Sample {
            t: t0.elapsed().as_secs_f64(),
            phase: sh.phase.load(Ordering::Relaxed),
            rss: pid.and_then(probe::rss),
            buffers: g("turnstile_resp_buffer_bytes"),
            deferred: g("turnstile_resp_deferred_bytes"),
            resp_connections: g("turnstile_connections"),
            kernel_tcp: probe::tcp_kernel_bytes(),
            server_queues: probe::server_queues(&ports),
            p99_resp_ms: p(&sh.resp_rec.take_interval(), 0.99),
            p99_http_ms: p(&sh.http_rec.take_interval(), 0.99),
            attack_open: sh.attack.open(),
            cpu: pid.and_then(probe::cpu_seconds),
            commands: g("turnstile_resp_commands_total"),
        };
        sh.samples.lock().expect("not poisoned").push(s);
    }
}

async fn soak(
    a: &SoakArgs,
    pid: Option<u32>,
    password: Option<Vec<u8>>,
    flags: ServeArgs,
    flags_read: bool,
    run_id: u64,
) -> Result<(), String> {
    let json = a.json;
    // Preflight: the server answers, and the password is right.
    let client = honest::redis_client(a.target, password.as_deref())?;
    let mut con = honest::redis_connection(&client)
        .await
        .map_err(|e| format!("--target {}: {e}", a.target))?;
    let pong: String = redis::cmd("PING")
        .query_async(&mut con)
        .await
        .map_err(|e| format!("--target {}: PING: {e}", a.target))?;
    if pong != "PONG" {
        return Err(format!("--target {}: PING answered {pong}", a.target));
    }
    let before = match a.http {
        Some(h) => {
            let m = probe::metrics(h, password.as_deref()).await;
            if m.is_none() {
                say(json, format!("--http {h}: /metrics cannot be read (wrong password?): the counts are not checked against it"));
            }
            m
        }
        None => None,
    };
    let sh = Arc::new(Shared {
        samples: Mutex::new(Vec::new()),
        phase: AtomicUsize::new(0),
        stop_sampler: AtomicBool::new(false),
        resp_rec: Arc::new(Recorder::new(PHASES.len())),
        http_rec: Arc::new(Recorder::new(PHASES.len())),
        attack: Arc::new(attack::Stats::new()),
    });
    let t0 = Instant::now();
    let load_start = probe::load_average();
    let ports: Vec<u16> = std::iter::once(a.target.port())
        .chain(a.http.map(|h| h.port()))
        .collect();
    let sampling = tokio::spawn(sampler(
        sh.clone(),
        pid,
        ports,
        a.http,
        password.clone(),
        t0,
    ));

    // The honest clients, on a thread of their own.
    let stop = Arc::new(AtomicBool::new(false));
    let resp_keys: Vec<Vec<String>> = (0..a.honest_resp as usize)
        .map(|c| honest::resp_keys(run_id, c))
        .collect();
    let customers: Vec<Vec<u64>> = (0..a.honest_http as usize)
        .map(|c| honest::customers(run_id, c))
        .collect();
    let honest_thread = {
        let (stop, sh) = (stop.clone(), sh.clone());
        let (client, keys, customers) = (client.clone(), resp_keys.clone(), customers.clone());
        let (http, password, every) = (a.http, password.clone(), a.every);
        std::thread::Builder::new()
            .name("soak-honest".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a tokio runtime");
                rt.block_on(async move {
                    let mut resp = Vec::new();
                    for k in keys {
                        resp.push(tokio::spawn(honest::resp_client(
                            client.clone(),
                            k,
                            every,
                            stop.clone(),
                            sh.resp_rec.clone(),
                        )));
                    }
                    let mut https = Vec::new();
                    if let Some(h) = http {
                        for c in customers {
                            https.push(tokio::spawn(honest::http_client(
                                h,
                                password.clone(),
                                c,
                                every,
                                stop.clone(),
                                sh.http_rec.clone(),
                            )));
                        }
                    }
                    let mut out = HonestRun {
                        resp: Vec::new(),
                        http: Vec::new(),
                    };
                    for j in resp {
                        out.resp.push(j.await.unwrap_or_default());
                    }
                    for j in https {
                        out.http.push(j.await.unwrap_or_default());
                    }
                    out
                })
            })
            .map_err(|e| e.to_string())?
    };

    say(
        json,
        format!(
            "quiet run: {} RESP and {} HTTP honest clients, one request each every {:?}",
            a.honest_resp,
            if a.http.is_some() { a.honest_http } else { 0 },
            a.every
        ),
    );
    tokio::time::sleep(a.quiet).await;
    let idle = {
        let s = sh.samples.lock().expect("not poisoned");
        let half = a.quiet.as_secs_f64() / 2.0;
        let mut v: Vec<u64> = s
            .iter()
            .filter(|x| x.t >= half)
            .filter_map(|x| x.rss)
            .collect();
        if v.is_empty() {
            v = s.iter().filter_map(|x| x.rss).collect();
        }
        v.sort_unstable();
        v.get(v.len() / 2)
            .copied()
            .or_else(|| pid.and_then(probe::rss))
    };
    let peak_reset = pid.is_some_and(probe::reset_peak);

    // The attack.
    let target = Arc::new(attack::Target {
        resp: a.target,
        http: a.http,
        password: password.clone(),
        max_args: flags.max_args.max(1),
        max_bulk: flags.max_bulk,
        max_inline: flags.max_inline,
        metrics_open: flags.metrics_open,
    });
    let plan = attack::plan(a.connections as usize, a.http.is_some(), &a.kinds);
    if plan.is_empty() {
        return Err("--kinds: none of these attacks can run (the HTTP ones need --http)".into());
    }
    say(
        json,
        format!(
            "attack: {} connections for {:?} (idle RSS {})",
            plan.len(),
            a.seconds,
            idle.map_or("?".into(), |r| format!("{:.1} MiB", mib(r)))
        ),
    );
    sh.phase.store(1, Ordering::Relaxed);
    sh.resp_rec.set_phase(1);
    sh.http_rec.set_phase(1);
    let t_attack = t0.elapsed().as_secs_f64();
    let until = tokio::time::Instant::now() + a.seconds;
    let attack_thread = {
        let stats = sh.attack.clone();
        std::thread::Builder::new()
            .name("soak-attack".into())
            .spawn(move || attack::run(target, plan, until, stats))
            .map_err(|e| e.to_string())?
    };
    tokio::time::sleep_until(until).await;
    while !attack_thread.is_finished() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = attack_thread.join();
    let hwm = pid.and_then(|p| probe::status_bytes(p, "VmHWM"));
    let t_settle = t0.elapsed().as_secs_f64();
    sh.phase.store(2, Ordering::Relaxed);
    sh.resp_rec.set_phase(2);
    sh.http_rec.set_phase(2);
    say(json, format!("attackers gone; settling for {:?}", a.settle));
    tokio::time::sleep(a.settle).await;
    let after = pid.and_then(probe::rss);
    let load_end = probe::load_average();

    // The honest clients stop; what they saw is checked against the server.
    stop.store(true, Ordering::Relaxed);
    let seen = loop {
        if honest_thread.is_finished() {
            break honest_thread
                .join()
                .map_err(|_| "an honest client panicked".to_string())?;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    sh.stop_sampler.store(true, Ordering::Relaxed);
    let _ = sampling.await;
    let metrics_after = match a.http {
        Some(h) => probe::metrics(h, password.as_deref()).await,
        None => None,
    };
    let keys = check_keys(&mut con, &resp_keys, &seen.resp).await;
    let alive = pid.is_none_or(probe::alive);
    let panicked = a
        .server_log
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|log| {
            log.lines()
                .filter(|l| l.contains("panicked"))
                .take(3)
                .map(str::to_string)
                .collect::<Vec<_>>()
        });

    let samples = sh.samples.lock().expect("not poisoned").clone();
    let in_attack = |s: &&Sample| s.phase == 1;
    let sampled_peak = samples.iter().filter(in_attack).filter_map(|s| s.rss).max();
    let peak = match (sampled_peak, hwm.filter(|_| peak_reset)) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    let max_of = |f: fn(&Sample) -> Option<f64>| {
        samples
            .iter()
            .filter(in_attack)
            .filter_map(f)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    let peak_buffers = max_of(|s| s.buffers);
    let peak_deferred = max_of(|s| s.deferred);
    let peak_conns = max_of(|s| s.resp_connections);
    let kernel_idle = samples
        .iter()
        .filter(|s| s.phase == 0)
        .filter_map(|s| s.kernel_tcp)
        .min();
    let kernel_peak = samples
        .iter()
        .filter(in_attack)
        .filter_map(|s| s.kernel_tcp)
        .max();
    let queues_peak = samples
        .iter()
        .filter(in_attack)
        .filter_map(|s| s.server_queues)
        .fold(None, |m: Option<(u64, u64)>, (t, r)| {
            Some(m.map_or((t, r), |(a, b)| (a.max(t), b.max(r))))
        });
    // Per phase: the server's CPU share (of one core) and RESP commands per second.
    let per_phase: Vec<serde_json::Value> = (0..PHASES.len())
        .map(|ph| {
            let v: Vec<&Sample> = samples.iter().filter(|s| s.phase == ph).collect();
            let rate = |f: fn(&Sample) -> Option<f64>| {
                let (a, b) = (v.first()?, v.last()?);
                let dt = b.t - a.t;
                let d = f(b)? - f(a)?;
                (dt > 0.0).then(|| d / dt)
            };
            json!({ "phase": PHASES[ph], "server_cpu": rate(|s| s.cpu), "resp_commands_per_s": rate(|s| s.commands) })
        })
        .collect();
    let st = &sh.attack;
    let http_attackers = plan_http(st);
    let resp_conns = peak_conns.map_or(
        u64::from(a.connections) + u64::from(a.honest_resp) + 2,
        |c| c as u64,
    );
    let bound = Bound::of(
        &flags,
        resp_conns,
        http_attackers + u64::from(a.honest_http) + 2,
    );

    // What the server states itself (turnstile_memory_bound_bytes, by part).
    let server_bound = before.as_ref().map(|m| {
        let part = |p: &str| {
            m.get(&format!("turnstile_memory_bound_bytes{{part=\"{p}\"}}"))
                .map(|v| v / (1 << 20) as f64)
        };
        json!({
            "resp_connections": part("resp_connections"),
            "deferred": part("deferred"),
            "throttle_store": part("throttle_store"),
        })
    });

    let lat = |r: &Recorder, ph: usize| {
        let h = r.phase(ph);
        json!({ "requests": h.len(), "p50_ms": p(&h, 0.5), "p99_ms": p(&h, 0.99), "max_ms": p(&h, 1.0) })
    };
    let sum = |v: &[Seen], f: fn(&Seen) -> u64| v.iter().map(f).sum::<u64>();
    let honest_errors = sum(&seen.resp, |s| s.errors) + sum(&seen.http, |s| s.errors);
    let samples_of = |v: &[Seen]| {
        v.iter()
            .flat_map(|s| s.samples.clone())
            .take(5)
            .collect::<Vec<_>>()
    };

    let metric_checks = metric_checks(before.as_ref(), metrics_after.as_ref(), &seen, st);
    let growth = match (idle, peak) {
        (Some(i), Some(p)) => Some(p.saturating_sub(i)),
        _ => None,
    };
    let settle_ratio = match (idle, after) {
        (Some(i), Some(x)) if i > 0 => Some((x as f64 - i as f64) / i as f64),
        _ => None,
    };
    let p99_attack = [
        p(&sh.resp_rec.phase(1), 0.99),
        p(&sh.http_rec.phase(1), 0.99),
    ];
    let mut targets = Vec::new();
    let mut target = |name: &str, met: Option<bool>, figure: String| {
        targets.push(json!({ "target": name, "met": met, "figure": figure }));
    };
    target(
        "peak RSS <= idle + the documented bound",
        growth.map(|g| g <= bound.total()),
        format!(
            "+{} MiB against +{:.1} MiB (connections {:.1} MiB + CL.THROTTLE store {:.1} MiB)",
            growth.map_or("?".into(), |g| format!("{:.1}", mib(g))),
            mib(bound.total()),
            mib(bound.connections()),
            mib(bound.stores)
        ),
    );
    target(
        "peak RSS <= idle + 256 MiB",
        growth.map(|g| g <= MAX_GROWTH),
        format!(
            "+{} MiB",
            growth.map_or("?".into(), |g| format!("{:.1}", mib(g)))
        ),
    );
    target(
        "RSS within 10 % of idle after the settle",
        settle_ratio.map(|r| r.abs() <= SETTLE_WITHIN),
        format!(
            "{} after {:?}",
            settle_ratio.map_or("?".into(), |r| format!("{:+.1} %", r * 100.0)),
            a.settle
        ),
    );
    for (name, v) in [
        (
            "honest CL.THROTTLE p99 under attack <= 10 ms",
            p99_attack[0],
        ),
        (
            "honest POST /v1/check p99 under attack <= 10 ms",
            p99_attack[1],
        ),
    ] {
        if name.contains("/v1/check") && a.http.is_none() {
            continue;
        }
        target(
            name,
            v.map(|x| x <= MAX_P99_MS),
            v.map_or("?".into(), |x| format!("{x:.2} ms")),
        );
    }
    target(
        "no panic",
        Some(alive && panicked.as_ref().is_none_or(Vec::is_empty)),
        format!(
            "server {}{}",
            if alive { "alive" } else { "gone" },
            match &panicked {
                None => ", log not read".to_string(),
                Some(v) if v.is_empty() => ", no panic in its log".to_string(),
                Some(v) => format!(": {}", v.join(" | ")),
            }
        ),
    );
    target(
        "nothing admitted lost",
        Some(keys.mismatches.is_empty() && metric_checks.iter().all(|c| c["ok"] != json!(false))),
        format!(
            "{} keys: {} admissions seen, {} consumed; {} mismatches",
            keys.keys,
            keys.seen,
            keys.consumed,
            keys.mismatches.len()
        ),
    );
    target(
        "no honest errors",
        Some(honest_errors == 0),
        format!("{honest_errors} errors"),
    );

    let attacks: Vec<_> = st
        .kinds
        .iter()
        .filter(|(_, k)| k.tasks.load(Ordering::Relaxed) > 0)
        .map(|(kind, k)| {
            json!({
                "kind": kind.name(),
                "tasks": k.tasks.load(Ordering::Relaxed),
                "connections": k.connections.load(Ordering::Relaxed),
                "sent_mib": mib(k.bytes_sent.load(Ordering::Relaxed)),
                "outcomes": *k.outcomes.lock().expect("not poisoned"),
                "unexpected": k.unexpected.load(Ordering::Relaxed),
                "connect_errors": k.connect_errors.load(Ordering::Relaxed),
                "samples": *k.samples.lock().expect("not poisoned"),
            })
        })
        .collect();
    let report = json!({
        "target": a.target.to_string(),
        "http": a.http.map(|h| h.to_string()),
        "pid": pid,
        "flags_read": flags_read,
        "connections": a.connections,
        "seconds": a.seconds.as_secs_f64(),
        "quiet_seconds": a.quiet.as_secs_f64(),
        "settle_seconds": a.settle.as_secs_f64(),
        "honest": { "resp": a.honest_resp, "http": if a.http.is_some() { a.honest_http } else { 0 }, "every_ms": a.every.as_secs_f64() * 1e3 },
        "load_average": { "start": load_start, "end": load_end },
        "server": per_phase,
        "memory": {
            "idle_rss_mib": idle.map(mib),
            "peak_rss_mib": peak.map(mib),
            "peak_from_vmhwm": peak_reset,
            "after_settle_rss_mib": after.map(mib),
            "growth_mib": growth.map(mib),
            "after_settle_vs_idle": settle_ratio,
            "peak_resp_buffer_mib": peak_buffers.map(|b| b / (1 << 20) as f64),
            "peak_resp_deferred_mib": peak_deferred.map(|b| b / (1 << 20) as f64),
            "peak_resp_connections": peak_conns,
            "kernel_tcp_idle_mib": kernel_idle.map(mib),
            "kernel_tcp_peak_mib": kernel_peak.map(mib),
            "server_send_queues_peak_mib": queues_peak.map(|q| mib(q.0)),
            "server_receive_queues_peak_mib": queues_peak.map(|q| mib(q.1)),
            "bound": {
                "per_resp_connection_kib": bound.per_resp as f64 / 1024.0,
                "per_http_connection_kib": bound.per_http as f64 / 1024.0,
                "deferred_mib": mib(bound.deferred),
                "resp_connections": bound.resp_connections,
                "http_connections": bound.http_connections,
                "connections_mib": mib(bound.connections()),
                "stores_mib": mib(bound.stores),
                "total_mib": mib(bound.total()),
            },
            "server_stated_bound_mib": server_bound,
        },
        "latency": {
            "resp": { "quiet": lat(&sh.resp_rec, 0), "attack": lat(&sh.resp_rec, 1), "settle": lat(&sh.resp_rec, 2) },
            "http": { "quiet": lat(&sh.http_rec, 0), "attack": lat(&sh.http_rec, 1), "settle": lat(&sh.http_rec, 2) },
        },
        "honest": {
            "resp": { "allowed": sum(&seen.resp, |s| s.allowed), "denied": sum(&seen.resp, |s| s.denied), "errors": sum(&seen.resp, |s| s.errors), "samples": samples_of(&seen.resp) },
            "http": { "allowed": sum(&seen.http, |s| s.allowed), "denied": sum(&seen.http, |s| s.denied), "errors": sum(&seen.http, |s| s.errors), "samples": samples_of(&seen.http) },
        },
        "keys": { "checked": keys.keys, "admissions_seen": keys.seen, "consumed": keys.consumed, "mismatches": keys.mismatches },
        "metrics": metric_checks,
        "attacks": attacks,
        "targets": targets,
        "samples": samples,
    });
    if let Some(f) = &a.plot {
        plot::draw(f, &samples, [t_attack, t_settle], idle)
            .map_err(|e| format!("cannot write the plot to {}: {e}", f.display()))?;
        say(json, format!("wrote {}", f.display()));
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serializable")
        );
    } else {
        print_report(&report);
    }
    Ok(())
}

/// HTTP attackers of the plan.
fn plan_http(st: &attack::Stats) -> u64 {
    st.kinds
        .iter()
        .filter(|(k, _)| {
            matches!(
                k,
                Kind::Slowloris | Kind::BigBody | Kind::NoCreds | Kind::TaggedIds
            )
        })
        .map(|(_, s)| s.tasks.load(Ordering::Relaxed))
        .sum()
}

/// The honest keys looked at once more.
struct KeyCheck {
    keys: usize,
    seen: u64,
    consumed: u64,
    mismatches: Vec<String>,
}

/// Each honest key's consumption (`CL.THROTTLE ... 0`, which spends nothing) against what its
/// client saw admitted: never above the budget, and equal to it, within the requests whose
/// reply was lost (an error after sending).
async fn check_keys(
    con: &mut redis::aio::MultiplexedConnection,
    keys: &[Vec<String>],
    seen: &[Seen],
) -> KeyCheck {
    let mut out = KeyCheck {
        keys: 0,
        seen: 0,
        consumed: 0,
        mismatches: Vec::new(),
    };
    let budget = (honest::BURST + 1) as u64;
    for (names, s) in keys.iter().zip(seen) {
        for (k, name) in names.iter().enumerate() {
            out.keys += 1;
            let admitted = s.admitted.get(k).copied().unwrap_or(0);
            let unknown = s.unknown.get(k).copied().unwrap_or(0);
            out.seen += admitted;
            let r: redis::RedisResult<Vec<i64>> = honest::throttle(name, 0).query_async(con).await;
            let consumed = match r {
                Ok(v) if v.len() == 5 => budget.saturating_sub(v[2].max(0) as u64),
                other => {
                    out.mismatches
                        .push(format!("{name}: the look answered {other:?}"));
                    continue;
                }
            };
            out.consumed += consumed;
            let wrong = admitted > budget || consumed < admitted || consumed > admitted + unknown;
            if wrong && out.mismatches.len() < 20 {
                out.mismatches.push(format!(
                    "{name}: {admitted} admissions seen ({unknown} replies lost), {consumed} consumed of {budget}"
                ));
            }
        }
    }
    out
}

/// `/metrics` before and after against what the clients saw: the rules' checks exactly (only
/// the honest clients make any that count), CL.THROTTLE within what attackers that never read
/// may have added.
fn metric_checks(
    before: Option<&std::collections::HashMap<String, f64>>,
    after: Option<&std::collections::HashMap<String, f64>>,
    seen: &HonestRun,
    st: &attack::Stats,
) -> Vec<serde_json::Value> {
    let (Some(b), Some(a)) = (before, after) else {
        return vec![json!({ "check": "/metrics", "ok": null, "said": "not readable" })];
    };
    let d = |k: &str| a.get(k).copied().unwrap_or(0.0) - b.get(k).copied().unwrap_or(0.0);
    let sum = |v: &[Seen], f: fn(&Seen) -> u64| v.iter().map(f).sum::<u64>() as f64;
    let unknown = |v: &[Seen]| v.iter().flat_map(|s| s.unknown.iter()).sum::<u64>() as f64;
    let mut out = Vec::new();
    let mut check = |name: &str, got: f64, lo: f64, hi: f64| {
        out.push(json!({ "check": name, "ok": got >= lo && got <= hi, "delta": got, "expected_from": lo, "expected_to": hi }));
    };
    let (ha, hd, hu) = (
        sum(&seen.http, |s| s.allowed),
        sum(&seen.http, |s| s.denied),
        unknown(&seen.http),
    );
    check(
        "turnstile_checks_total{result=\"allowed\"} = honest POST /v1/check admitted",
        d("turnstile_checks_total{result=\"allowed\"}"),
        ha,
        ha + hu,
    );
    check(
        "turnstile_checks_total{result=\"denied\"} = honest POST /v1/check denied",
        d("turnstile_checks_total{result=\"denied\"}"),
        hd,
        hd + hu,
    );
    let (ra, rd, ru) = (
        sum(&seen.resp, |s| s.allowed),
        sum(&seen.resp, |s| s.denied),
        unknown(&seen.resp),
    );
    let (aa, al, unread) = (
        st.throttle_allowed_seen.load(Ordering::Relaxed) as f64,
        st.throttle_limited_seen.load(Ordering::Relaxed) as f64,
        st.throttle_unread.load(Ordering::Relaxed) as f64,
    );
    check(
        "turnstile_throttle_total{result=\"allowed\"} >= admissions seen, <= + unread attacks",
        d("turnstile_throttle_total{result=\"allowed\"}"),
        ra + aa,
        ra + aa + ru + unread,
    );
    check(
        "turnstile_throttle_total{result=\"limited\"} >= denials seen, <= + unread attacks",
        d("turnstile_throttle_total{result=\"limited\"}"),
        rd + al,
        rd + al + ru + unread,
    );
    out
}

fn print_report(r: &serde_json::Value) {
    let f = |v: &serde_json::Value| v.as_f64().map_or("?".to_string(), |x| format!("{x:.1}"));
    let f2 = |v: &serde_json::Value| v.as_f64().map_or("?".to_string(), |x| format!("{x:.2}"));
    let m = &r["memory"];
    println!(
        "turnstile soak: {} (pid {}), {} attacking connections for {} s; load average {} at the start, {} at the end",
        r["target"].as_str().unwrap_or("?"),
        r["pid"],
        r["connections"],
        r["seconds"],
        f2(&r["load_average"]["start"]),
        f2(&r["load_average"]["end"]),
    );
    println!();
    println!(
        "server RSS: idle {} MiB, peak {} MiB (+{} MiB{}), {} MiB after the {} s settle ({})",
        f(&m["idle_rss_mib"]),
        f(&m["peak_rss_mib"]),
        f(&m["growth_mib"]),
        if m["peak_from_vmhwm"] == json!(true) {
            ", VmHWM"
        } else {
            ", sampled"
        },
        f(&m["after_settle_rss_mib"]),
        r["settle_seconds"],
        m["after_settle_vs_idle"]
            .as_f64()
            .map_or("?".into(), |x| format!("{:+.1} % of idle", x * 100.0)),
    );
    let b = &m["bound"];
    println!(
        "bound: {} RESP connections x {} KiB + {} MiB deferred + {} HTTP connections x {} KiB = {} MiB, + CL.THROTTLE store {} MiB",
        b["resp_connections"], f(&b["per_resp_connection_kib"]), f(&b["deferred_mib"]), b["http_connections"], f(&b["per_http_connection_kib"]), f(&b["connections_mib"]), f(&b["stores_mib"]),
    );
    let sb = &m["server_stated_bound_mib"];
    if !sb.is_null() {
        println!(
            "the server's own bound (turnstile_memory_bound_bytes): RESP connections {} MiB (at --max-connections), deferred {} MiB, CL.THROTTLE store {} MiB",
            f(&sb["resp_connections"]),
            f(&sb["deferred"]),
            f(&sb["throttle_store"]),
        );
    }
    println!(
        "RESP buffers at peak {} MiB, deferred {} MiB, {} RESP connections",
        f(&m["peak_resp_buffer_mib"]),
        f(&m["peak_resp_deferred_mib"]),
        m["peak_resp_connections"],
    );
    println!(
        "kernel: the server's sockets queue at most {} MiB to send, {} MiB received; all TCP buffers of the machine (attackers' ends included) {} MiB idle, {} MiB peak",
        f(&m["server_send_queues_peak_mib"]),
        f(&m["server_receive_queues_peak_mib"]),
        f(&m["kernel_tcp_idle_mib"]),
        f(&m["kernel_tcp_peak_mib"]),
    );
    for ph in r["server"].as_array().into_iter().flatten() {
        println!(
            "server {}: CPU {} of a core, {} RESP commands/s",
            ph["phase"].as_str().unwrap_or("?"),
            ph["server_cpu"]
                .as_f64()
                .map_or("?".into(), |c| format!("{:.0} %", c * 100.0)),
            ph["resp_commands_per_s"]
                .as_f64()
                .map_or("?".into(), |c| format!("{c:.0}")),
        );
    }
    println!();
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>9}",
        "honest latency (ms)", "requests", "p50", "p99", "max"
    );
    for (proto, name) in [("resp", "CL.THROTTLE"), ("http", "POST /v1/check")] {
        for ph in PHASES {
            let l = &r["latency"][proto][ph];
            if l["requests"] == json!(0) {
                continue;
            }
            println!(
                "{:<22} {:>9} {:>9} {:>9} {:>9}",
                format!("{name} {ph}"),
                l["requests"],
                f2(&l["p50_ms"]),
                f2(&l["p99_ms"]),
                f2(&l["max_ms"])
            );
        }
    }
    println!();
    println!(
        "{:<28} {:>6} {:>8} {:>9} {:>6}  outcomes",
        "attack", "tasks", "conns", "sent MiB", "unexp"
    );
    for k in r["attacks"].as_array().into_iter().flatten() {
        let outcomes = k["outcomes"]
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(l, n)| format!("{n} {l}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        println!(
            "{:<28} {:>6} {:>8} {:>9} {:>6}  {outcomes}",
            k["kind"].as_str().unwrap_or("?"),
            k["tasks"],
            k["connections"],
            f(&k["sent_mib"]),
            k["unexpected"]
        );
        for s in k["samples"].as_array().into_iter().flatten() {
            println!("{:<28} {}", "", s.as_str().unwrap_or("?"));
        }
        if k["connect_errors"] != json!(0) {
            println!(
                "{:<28} {} connections refused or failed",
                "", k["connect_errors"]
            );
        }
    }
    println!();
    let k = &r["keys"];
    println!(
        "honest keys: {} checked, {} admissions seen, {} consumed",
        k["checked"], k["admissions_seen"], k["consumed"]
    );
    for m in k["mismatches"].as_array().into_iter().flatten() {
        println!("  MISMATCH {}", m.as_str().unwrap_or("?"));
    }
    for c in r["metrics"].as_array().into_iter().flatten() {
        println!(
            "  {} {}: {} (expected {}..{})",
            if c["ok"] == json!(true) {
                "ok"
            } else if c["ok"] == json!(false) {
                "MISMATCH"
            } else {
                "-"
            },
            c["check"].as_str().unwrap_or("?"),
            c["delta"],
            c["expected_from"],
            c["expected_to"]
        );
    }
    for proto in ["resp", "http"] {
        for s in r["honest"][proto]["samples"]
            .as_array()
            .into_iter()
            .flatten()
        {
            println!("  honest {proto} error: {}", s.as_str().unwrap_or("?"));
        }
    }
    println!();
    for t in r["targets"].as_array().into_iter().flatten() {
        let mark = match t["met"].as_bool() {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not measured",
        };
        println!(
            "{:<50} {:<13} {}",
            t["target"].as_str().unwrap_or("?"),
            mark,
            t["figure"].as_str().unwrap_or("")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_at_the_defaults() {
        let b = Bound::of(&ServeArgs::new(), 1000, 100);
        // 16 arguments of 4 KiB: about 66 KiB of input.
        assert!(
            b.per_resp > 100 << 10 && b.per_resp < 140 << 10,
            "{}",
            b.per_resp
        );
        // 2 Mi keys, about 20 B each (39.4 MiB).
        assert!(b.stores > 36 << 20 && b.stores < 44 << 20, "{}", b.stores);
        assert_eq!(
            b.connections(),
            1000 * b.per_resp + (64 << 20) + 100 * b.per_http
        );
    }

    #[test]
    fn durations() {
        assert_eq!(seconds("60"), Ok(Duration::from_secs(60)));
        assert_eq!(seconds("2m"), Ok(Duration::from_secs(120)));
        assert!(seconds("2h").is_err());
        assert!(seconds("soon").is_err());
    }
}
