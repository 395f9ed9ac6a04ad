//! `turnstile soak`: an abuse soak of a running `turnstile serve` on this machine (a
//! benchmark, not a test). Honest clients send `CL.THROTTLE`, `POST /v1/check` and gRPC
//! `ShouldRateLimit` at a fixed pace and record their latencies; first alone (the quiet run),
//! then while `--connections` hostile clients attack at once ([`attack::Kind`]: giant frames,
//! clients that never read, unauthenticated floods and holders, new `CL.THROTTLE` parameter
//! sets, garbage, `MULTI` without `EXEC`, tagged customer ids, slow headers and bodies,
//! oversized and big `/json` bodies, no credentials, HTTP/2 streams left unfinished, silent and
//! slow gRPC, descriptor hogs, password guessing, the admin listener without its password),
//! then alone again while the server settles. Every phase is bounded in time, every attacker
//! to one connection at a time (a descriptor hog to its share of `--connections`), and only
//! loopback addresses are accepted.
//!
//! It reports the server's resident memory (from `/proc/PID/status`) at idle, at its peak
//! under attack and after the settle, against the bound computed from the server's own flags
//! ([`bound::Bound`]); its open descriptors (`/proc/PID/fd`) likewise; the honest latencies
//! under attack against the quiet run's; the lines per second of each kind of message in its
//! log ([`logs`]); what the server did to each kind of attacker; and whether every admission
//! the honest clients saw is in the server's counts afterwards (each honest key looked at once
//! more, and `/metrics`).

mod args;
mod attack;
mod bound;
mod check;
mod honest;
mod logs;
pub(crate) mod plot;
pub(crate) mod probe;
mod report;
mod text;

pub use args::SoakArgs;
use attack::Kind;
use hdrhistogram::Histogram;
use honest::Recorder;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use turnstile_server::ServeArgs;

/// The phases, in order.
const PHASES: [&str; 3] = ["quiet", "attack", "settle"];

/// How often the server is sampled.
const SAMPLE: Duration = Duration::from_millis(500);

/// Targets of the soak at the defaults.
const MAX_GROWTH: u64 = 256 << 20;
const MAX_P99_MS: f64 = 10.0;
const SETTLE_WITHIN: f64 = 0.10;
/// Log lines a second of one kind of message, at most.
const MAX_LOG_PER_SECOND: u64 = 10;

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
    pub p99_grpc_ms: Option<f64>,
    /// The server's open descriptors (`/proc/PID/fd`).
    pub fds: Option<u64>,
    /// Lines its log gained over the interval, per second.
    pub log_lines_per_s: Option<f64>,
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
fn enough_files(need: u64) -> crate::Result<()> {
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
            ).into());
        }
        r.rlim_cur = need;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
    Ok(())
}

fn read_password(f: &Option<PathBuf>) -> crate::Result<Option<Vec<u8>>> {
    let Some(f) = f else { return Ok(None) };
    let mut b = std::fs::read(f)
        .map_err(|e| format!("--password-file {}: cannot read it ({e})", f.display()))?;
    while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
        b.pop();
    }
    if b.is_empty() {
        return Err(format!("--password-file {}: empty", f.display()).into());
    }
    Ok(Some(b))
}

fn say(json: bool, msg: impl AsRef<str>) {
    if !json || crate::progress::visible(false) {
        eprintln!("soak: {}", msg.as_ref());
    }
}

/// `turnstile soak`.
pub fn run(a: SoakArgs) -> crate::Result<()> {
    let addrs = [
        ("--target", Some(a.target)),
        ("--http", a.http),
        ("--grpc", a.grpc),
        ("--admin", a.admin),
    ];
    for (flag, addr) in addrs {
        if let Some(addr) = addr {
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "{flag} {addr}: the soak attacks loopback addresses only (127.0.0.1, ::1); run it on the server's machine"
                ).into());
            }
        }
    }
    let password = read_password(&a.password_file)?;
    let (plan, hog_each, hog_total) = plan(&a)?;
    let honest = a.honest_resp + a.honest_http + a.honest_grpc;
    enough_files(u64::from(a.connections) + hog_total as u64 + u64::from(honest) + 256)?;
    let pid = a.pid.or_else(|| probe::find_pid(a.target));
    if let Some(pid) = pid {
        if probe::rss(pid).is_none() {
            return Err(format!("--pid {pid}: no such process (or not readable)").into());
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
    let run = Start {
        pid,
        password,
        flags,
        flags_read,
        run_id,
        plan,
        hog_each,
    };
    control.block_on(soak(&a, run))
}

/// The attackers of `a`, and the idle connections each descriptor hog holds and all of them
/// together.
fn plan(a: &SoakArgs) -> crate::Result<(Vec<Kind>, usize, usize)> {
    let listeners = attack::Listeners {
        http: a.http.is_some(),
        grpc: a.grpc.is_some(),
        admin: a.admin.is_some(),
    };
    let plan = attack::plan(a.connections as usize, listeners, &a.kinds);
    if plan.is_empty() {
        return Err(
            "--kinds: none of these attacks can run (the HTTP ones need --http, the gRPC ones --grpc, admin-nocreds --admin)"
                .into(),
        );
    }
    let hogs = plan.iter().filter(|k| **k == Kind::FdHog).count();
    let hog_total = if hogs > 0 {
        (a.connections as usize).min(attack::FD_HOG_LIMIT)
    } else {
        0
    };
    let hog_each = hog_total.div_ceil(hogs.max(1)).max(1);
    Ok((plan, hog_each, hog_total))
}

/// What the soak starts from.
struct Start {
    pid: Option<u32>,
    password: Option<Vec<u8>>,
    flags: ServeArgs,
    flags_read: bool,
    run_id: u64,
    plan: Vec<Kind>,
    hog_each: usize,
}

struct Shared {
    samples: Mutex<Vec<Sample>>,
    phase: AtomicUsize,
    stop_sampler: AtomicBool,
    resp_rec: Arc<Recorder>,
    http_rec: Arc<Recorder>,
    grpc_rec: Arc<Recorder>,
    /// How late the honest clients' thread wakes up (its own share of their latencies).
    late_rec: Arc<Recorder>,
    attack: Arc<attack::Stats>,
    /// Lines of the server's log read so far (unset without `--server-log`).
    log_lines: std::sync::OnceLock<Arc<std::sync::atomic::AtomicU64>>,
}

impl Shared {
    fn new() -> Self {
        Self {
            samples: Mutex::new(Vec::new()),
            phase: AtomicUsize::new(0),
            stop_sampler: AtomicBool::new(false),
            resp_rec: Arc::new(Recorder::new(PHASES.len())),
            http_rec: Arc::new(Recorder::new(PHASES.len())),
            grpc_rec: Arc::new(Recorder::new(PHASES.len())),
            late_rec: Arc::new(Recorder::new(PHASES.len())),
            attack: Arc::new(attack::Stats::new()),
            log_lines: std::sync::OnceLock::new(),
        }
    }

    /// Enters phase `ph` (an index of [`PHASES`]): the samples and the honest latencies
    /// from now on are its.
    fn set_phase(&self, ph: usize) {
        self.phase.store(ph, Ordering::Relaxed);
        self.resp_rec.set_phase(ph);
        self.http_rec.set_phase(ph);
        self.grpc_rec.set_phase(ph);
        self.late_rec.set_phase(ph);
    }
}

/// Samples the server every [`SAMPLE`] until told to stop.
fn sampler(
    sh: Arc<Shared>,
    a: &SoakArgs,
    pid: Option<u32>,
    password: Option<Vec<u8>>,
    t0: Instant,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let ports: Vec<u16> = [Some(a.target), a.http, a.grpc, a.admin]
        .iter()
        .flatten()
        .map(|x| x.port())
        .collect();
    sample_until_stopped(sh, pid, ports, a.http, password, t0)
}

async fn sample_until_stopped(
    sh: Arc<Shared>,
    pid: Option<u32>,
    ports: Vec<u16>,
    http: Option<SocketAddr>,
    password: Option<Vec<u8>>,
    t0: Instant,
) {
    let mut tick = tokio::time::interval(SAMPLE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let lines = || sh.log_lines.get().map(|n| n.load(Ordering::Relaxed));
    let mut last = (t0.elapsed().as_secs_f64(), lines());
    while !sh.stop_sampler.load(Ordering::Relaxed) {
        tick.tick().await;
        let now = (t0.elapsed().as_secs_f64(), lines());
        let log_lines_per_s = match (now.1, last.1) {
            (Some(n), Some(l)) => Some(n.saturating_sub(l) as f64 / (now.0 - last.0).max(1e-3)),
            _ => None,
        };
        last = now;
        let m = match http {
            // Within two samples: a server that cannot accept (out of descriptors) must not
            // stop the sampling of its memory.
            Some(h) => probe::metrics_within(h, password.as_deref(), 2 * SAMPLE).await,
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
            p99_grpc_ms: p(&sh.grpc_rec.take_interval(), 0.99),
            fds: pid.and_then(probe::fd_count),
            log_lines_per_s,
            attack_open: sh.attack.open(),
            cpu: pid.and_then(probe::cpu_seconds),
            commands: g("turnstile_resp_commands_total"),
        };
        sh.samples.lock().expect("not poisoned").push(s);
    }
}

/// The quiet run, the attack and the settle, then the report.
async fn soak(a: &SoakArgs, start: Start) -> crate::Result<()> {
    let (json, pid, password) = (a.json, start.pid, start.password.clone());
    let (client, mut con) = preflight(a.target, password.as_deref()).await?;
    let before = metrics_before(a, password.as_deref()).await;
    let sh = Arc::new(Shared::new());
    let t0 = Instant::now();
    let follower = match &a.server_log {
        Some(f) => Some(follow(&sh, f, t0, json)?),
        None => None,
    };
    let load_start = probe::load_average();
    let sampling = tokio::spawn(sampler(sh.clone(), a, pid, password.clone(), t0));
    let honest = honest::Honest::start(a, &sh, client, start.run_id, password.clone())?;
    tokio::time::sleep(a.quiet).await;
    let idle = quiet_median(&sh, a.quiet, |s| s.rss).or_else(|| pid.and_then(probe::rss));
    let idle_fds = quiet_median(&sh, a.quiet, |s| s.fds);
    let peak_reset = pid.is_some_and(probe::reset_peak);

    let t_attack = attack(a, &sh, &start, idle, t0).await?;
    let hwm = pid.and_then(|p| probe::status_bytes(p, "VmHWM"));
    let t_settle = t0.elapsed().as_secs_f64();
    sh.set_phase(2);
    say(json, format!("attackers gone; settling for {:?}", a.settle));
    tokio::time::sleep(a.settle).await;
    let after = pid.and_then(probe::rss);
    // Before the honest clients leave: their connections are in the idle count too.
    let fds_after = settled(
        &sh.samples.lock().expect("not poisoned"),
        t0.elapsed().as_secs_f64(),
    );
    let load_end = probe::load_average();

    // The honest clients stop; what they saw is checked against the server.
    let (seen, resp_keys) = honest.stop().await?;
    sh.stop_sampler.store(true, Ordering::Relaxed);
    let _ = sampling.await;
    let metrics_after = match a.http {
        Some(h) => probe::metrics(h, password.as_deref()).await,
        None => None,
    };
    let keys = check::check_keys(&mut con, &resp_keys, &seen.resp).await;
    let samples = sh.samples.lock().expect("not poisoned").clone();
    let log = match follower {
        Some(f) => f.finish().await,
        None => None,
    };
    let run = report::Run {
        pid,
        flags: start.flags,
        flags_read: start.flags_read,
        load: [load_start, load_end],
        idle,
        hwm,
        peak_reset,
        after,
        fds: [idle_fds, fds_after],
        before,
        metrics_after,
        seen,
        keys,
        alive: pid.is_none_or(probe::alive),
        panicked: log
            .as_ref()
            .filter(|l| l.readable)
            .map(|l| l.panics.clone()),
        log,
        samples,
    };
    publish(a, &run, &sh, [t_attack, t_settle])
}

/// The report of `run`, printed (as JSON with `--json`), and its plot drawn; `marks`: when the
/// attack started and ended (s).
fn publish(a: &SoakArgs, run: &report::Run, sh: &Shared, marks: [f64; 2]) -> crate::Result<()> {
    let report = report::build(a, run, sh);
    if let Some(f) = &a.plot {
        plot::draw(f, &run.samples, marks, [run.idle, run.fds[0]])
            .map_err(|e| format!("cannot write the plot to {}: {e}", f.display()))?;
        say(a.json, format!("wrote {}", f.display()));
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serializable")
        );
    } else {
        text::print(&report);
    }
    Ok(())
}

/// Follows the server's log at `f` (said when it cannot be read), its lines counted in `sh`.
fn follow(
    sh: &Shared,
    f: &std::path::Path,
    t0: Instant,
    json: bool,
) -> crate::Result<logs::Follower> {
    let log = logs::Log::open(f);
    if !log.readable {
        let e = format!(
            "--server-log {}: cannot be read: its lines are not counted",
            f.display()
        );
        say(json, e);
    }
    let follower = logs::Follower::start(log, t0, SAMPLE).map_err(|e| e.to_string())?;
    let _ = sh.log_lines.set(follower.lines.clone());
    Ok(follower)
}

/// The server answers, and the password is right: a client and a connection for the checks
/// at the end.
async fn preflight(
    target: SocketAddr,
    password: Option<&[u8]>,
) -> crate::Result<(redis::Client, redis::aio::MultiplexedConnection)> {
    let client = honest::redis_client(target, password)?;
    let mut con = honest::redis_connection(&client)
        .await
        .map_err(|e| format!("--target {target}: {e}"))?;
    let pong: String = redis::cmd("PING")
        .query_async(&mut con)
        .await
        .map_err(|e| format!("--target {target}: PING: {e}"))?;
    if pong != "PONG" {
        return Err(format!("--target {target}: PING answered {pong}").into());
    }
    Ok((client, con))
}

/// `/metrics` before the run, if there is an HTTP address (said when it cannot be read).
async fn metrics_before(
    a: &SoakArgs,
    password: Option<&[u8]>,
) -> Option<std::collections::HashMap<String, f64>> {
    let h = a.http?;
    let m = probe::metrics(h, password).await;
    if m.is_none() {
        say(a.json, format!("--http {h}: /metrics cannot be read (wrong password?): the counts are not checked against it"));
    }
    m
}

/// The idle figure of `f`: its median over the quiet run's second half (over all of it if
/// that has no sample).
fn quiet_median(sh: &Shared, quiet: Duration, f: fn(&Sample) -> Option<u64>) -> Option<u64> {
    let s = sh.samples.lock().expect("not poisoned");
    let half = quiet.as_secs_f64() / 2.0;
    let mut v: Vec<u64> = s.iter().filter(|x| x.t >= half).filter_map(f).collect();
    if v.is_empty() {
        v = s.iter().filter_map(f).collect();
    }
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// The server's descriptors once settled: the fewest over the settle's last 5 s (ending at
/// `end`, s since the start), so that the sampler's own /metrics connection, closing, is not
/// counted; with the honest clients still connected, as in the idle count.
fn settled(samples: &[Sample], end: f64) -> Option<u64> {
    samples
        .iter()
        .filter(|s| s.phase == 2 && s.t >= end - 5.0)
        .filter_map(|s| s.fds)
        .min()
}

/// The attack, on a thread of its own, until every attacker has left: when it started (s
/// since `t0`).
async fn attack(
    a: &SoakArgs,
    sh: &Shared,
    start: &Start,
    idle: Option<u64>,
    t0: Instant,
) -> crate::Result<f64> {
    let flags = &start.flags;
    let target = Arc::new(attack::Target {
        resp: a.target,
        http: a.http,
        grpc: a.grpc,
        admin: a.admin,
        password: start.password.clone(),
        admin_password: start
            .flags_read
            .then_some(flags.admin_pass.is_some() || flags.admin_pass_file.is_some()),
        max_args: flags.max_args.max(1),
        max_bulk: flags.max_bulk,
        max_inline: flags.max_inline,
        max_body: flags.max_body,
        metrics_open: flags.metrics_open,
        hog_each: start.hog_each,
    });
    let plan = start.plan.clone();
    say(
        a.json,
        format!(
            "attack: {} attackers for {:?} (idle RSS {})",
            plan.len(),
            a.seconds,
            idle.map_or("?".into(), |r| format!("{:.1} MiB", mib(r)))
        ),
    );
    sh.set_phase(1);
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
    Ok(t_attack)
}
