//! One row of the fleet benchmark: N nodes, each a store (or a plain connection for INCR) with
//! a connection of its own, each running `tasks` closed-loop clients that draw keys from the
//! distribution; every check timed, and every request counted per key and window (the
//! windows of Redis's clock) as demanded and admitted.

use super::super::keys::{Distribution, SplitMix64, Zipf};
use hdrhistogram::Histogram;
use std::fmt::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile::{Decision, Limit, Limits};
use turnstile_redis::{Conn, LeaseMode, LeaseStats, Leases, RedisStore};

/// What a node checks through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// `INCR key`: the floor of a Redis round trip.
    Incr,
    /// `RedisStore::check`: one function call per check.
    Check,
    /// `RedisStore::check` with leases (reserve).
    Leases,
    /// With delayed leases (flush 100).
    Delayed,
}

impl Path {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Path::Incr => "INCR",
            Path::Check => "per-check",
            Path::Leases => "leases",
            Path::Delayed => "delayed",
        }
    }
}

/// A row to run.
pub(crate) struct Plan {
    pub(crate) path: Path,
    pub(crate) nodes: usize,
    pub(crate) tasks: usize,
    pub(crate) dist: Distribution,
    pub(crate) keys: u64,
    pub(crate) limit: u64,
    pub(crate) window: Duration,
    pub(crate) run: Duration,
    pub(crate) prefix: String,
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    /// Ranks counted per window (the hottest ones).
    pub(crate) track: u64,
}

/// Requests and admissions per tracked key and window, shared by every client.
pub(crate) struct Counts {
    pub(crate) windows: usize,
    pub(crate) track: usize,
    /// Per window, per rank: requests, admissions.
    pub(crate) demand: Vec<AtomicU32>,
    pub(crate) admitted: Vec<AtomicU32>,
    /// Admissions whose window cannot be told (answered across a window's boundary).
    pub(crate) ambiguous: AtomicU32,
}

impl Counts {
    fn new(windows: usize, track: usize) -> Self {
        let n = windows * track;
        Self {
            windows,
            track,
            demand: (0..n).map(|_| AtomicU32::new(0)).collect(),
            admitted: (0..n).map(|_| AtomicU32::new(0)).collect(),
            ambiguous: AtomicU32::new(0),
        }
    }
}

/// Redis's clock from ours: `redis_ns(t)` for a local instant, within `eps` ns.
#[derive(Clone, Copy)]
pub(crate) struct Clock {
    base: Instant,
    redis: u64,
    pub(crate) eps: u64,
}

impl Clock {
    /// The least-delayed of a few `TIME` calls.
    pub(crate) async fn of(conn: &mut Conn) -> crate::Result<Self> {
        let mut best: Option<Self> = None;
        for _ in 0..16 {
            let t0 = Instant::now();
            let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
            let rtt = t0.elapsed();
            let c = Self {
                base: t0 + rtt / 2,
                redis: s * 1_000_000_000 + us * 1000,
                eps: rtt.as_nanos() as u64 / 2 + 1000,
            };
            if best.is_none_or(|b| c.eps < b.eps) {
                best = Some(c);
            }
        }
        Ok(best.expect("16 tries"))
    }

    pub(crate) fn redis_ns(&self, t: Instant) -> u64 {
        match t.checked_duration_since(self.base) {
            Some(d) => self.redis + d.as_nanos() as u64,
            None => self.redis - self.base.duration_since(t).as_nanos() as u64,
        }
    }
}

/// What a row measured.
pub(crate) struct Outcome {
    pub(crate) checks: Vec<u64>,
    pub(crate) secs: f64,
    pub(crate) latency: Histogram<u64>,
    /// Of the checks answered in process (`check_local`).
    pub(crate) local_latency: Histogram<u64>,
    pub(crate) leases: LeaseStats,
    pub(crate) fallbacks: u64,
    pub(crate) counts: Counts,
    /// Windows wholly inside the run (indices into `counts`).
    pub(crate) complete: std::ops::Range<usize>,
}

enum Node {
    Incr(Conn),
    Store(Box<RedisStore>),
}

async fn node(p: &Plan) -> crate::Result<Node> {
    let urls: Vec<&str> = p.urls.iter().map(String::as_str).collect();
    let connect = Duration::from_secs(2);
    if p.path == Path::Incr {
        let c = match p.cluster {
            true => Conn::cluster(&urls, connect).await?,
            false => Conn::single(urls[0], connect).await?,
        };
        return Ok(Node::Incr(c));
    }
    let l = Limit::fixed_window(p.limit, p.window)?;
    let mut b = RedisStore::builder(Limits::new(vec![l])?)
        .prefix(p.prefix.clone())
        .timeout(Duration::from_millis(500));
    b = match p.path {
        Path::Leases => b.leases(Leases::auto()),
        Path::Delayed => b.leases(Leases::auto().mode(LeaseMode::Delayed { flush: 100 })),
        _ => b,
    };
    let s = match p.cluster {
        true => b.connect_cluster(&urls).await,
        false => b.connect(urls[0]).await,
    };
    Ok(Node::Store(Box::new(s.map_err(|e| e.to_string())?)))
}

struct Client {
    node: Arc<Node>,
    seed: u64,
    counts: Arc<Counts>,
    clock: Clock,
    first: u64,
    window: u64,
    until: Instant,
}

/// One closed-loop client: checks until `until`; its checks and latencies.
async fn client(c: Client, dist: Distribution, keys: u64) -> (u64, Histogram<u64>, Histogram<u64>) {
    let mut hist = histogram();
    let mut local_hist = histogram();
    let mut rng = SplitMix64::new(c.seed);
    let zipf = match dist {
        Distribution::Zipf(s) => Some(Zipf::new(keys, s)),
        _ => None,
    };
    let mut key = String::with_capacity(24);
    let mut n = 0;
    while Instant::now() < c.until {
        let rank = match (dist, &zipf) {
            (Distribution::Hot, _) => 0,
            (_, Some(z)) => z.sample(&mut rng) - 1,
            _ => rng.below(keys),
        };
        key.clear();
        let _ = write!(key, "k{rank}");
        let t0 = Instant::now();
        let (decision, local) = match &*c.node {
            Node::Incr(conn) => {
                let mut conn = conn.clone();
                let mut incr = redis::cmd("INCR");
                incr.arg(&key);
                let _ = incr.query_async::<i64>(&mut conn).await;
                (None, false)
            }
            // As the tower layer asks: in process first, then the store's check.
            Node::Store(s) => match s.check_local(&key, 1) {
                Some(d) => (Some(d), true),
                None => (Some(s.check(&key, 1).await), false),
            },
        };
        let t1 = Instant::now();
        let ns = (t1 - t0).as_nanos().max(1) as u64;
        let _ = hist.record(ns);
        if local {
            let _ = local_hist.record(ns);
            // An answer without I/O: let the runtime's other tasks run now and then.
            tokio::task::coop::consume_budget().await;
        }
        n += 1;
        count(&c, rank, decision, t0, t1);
    }
    (n, hist, local_hist)
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

/// Counts a request of `rank` sent at `t0` and answered at `t1`: demanded in the window of
/// Redis's clock it was sent in; admitted in the window whose end the answer names (a fixed
/// window's admission says how long until its window ends, and a window end is a multiple
/// of the window), else (more than a quarter window off) ambiguous.
fn count(c: &Client, rank: u64, d: Option<Decision>, t0: Instant, t1: Instant) {
    let cn = &c.counts;
    if rank >= cn.track as u64 {
        return;
    }
    let (lo, hi) = (
        c.clock.redis_ns(t0).saturating_sub(c.clock.eps),
        c.clock.redis_ns(t1) + c.clock.eps,
    );
    let slot = |w: u64| {
        w.checked_sub(c.first)
            .filter(|&w| (w as usize) < cn.windows)
            .map(|w| w as usize * cn.track + rank as usize)
    };
    let Some(i) = slot(lo / c.window) else {
        return;
    };
    // Relaxed: counters read after every client has ended (joined).
    cn.demand[i].fetch_add(1, Ordering::Relaxed);
    let Some(d) = d.filter(|d| d.allowed()) else {
        return;
    };
    // The window's end: the multiple of the window nearest the answer's (an admission from a
    // lease names its window's end less the lease's guard, 0.1 % + 100 us; one from Redis,
    // the end within the round trip).
    let mid = (lo + hi) / 2 + d.reset_after_ns;
    let end = (mid + c.window / 2) / c.window;
    let off = (end * c.window).abs_diff(mid);
    match slot(end.wrapping_sub(1)) {
        Some(j) if off <= c.window / 4 => {
            cn.admitted[j].fetch_add(1, Ordering::Relaxed);
        }
        _ => {
            cn.ambiguous.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs `p`; `cpu` reads the servers' CPU seconds before and after the clients run.
pub(crate) async fn run(
    p: &Plan,
    cpu: &(dyn Fn() -> crate::Result<f64> + Sync),
) -> crate::Result<(Outcome, f64)> {
    let mut nodes = Vec::new();
    for _ in 0..p.nodes {
        nodes.push(Arc::new(node(p).await?));
    }
    let urls: Vec<&str> = p.urls.iter().map(String::as_str).collect();
    let mut conn = match p.cluster {
        true => Conn::cluster(&urls, Duration::from_secs(2)).await?,
        false => Conn::single(urls[0], Duration::from_secs(2)).await?,
    };
    let clock = Clock::of(&mut conn).await?;
    let w = p.window.as_nanos() as u64;
    let start = Instant::now();
    let first = clock.redis_ns(start) / w;
    let windows = (p.run.as_nanos() as u64 / w + 2) as usize;
    let counts = Arc::new(Counts::new(windows, p.track.min(p.keys) as usize));
    let until = start + p.run;
    let cpu0 = cpu()?;
    let mut handles = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for t in 0..p.tasks {
            let c = Client {
                node: Arc::clone(n),
                seed: (i * 1000 + t) as u64 * 0x9e37_79b9 + 1,
                counts: Arc::clone(&counts),
                clock,
                first,
                window: w,
                until,
            };
            handles.push((i, tokio::spawn(client(c, p.dist, p.keys))));
        }
    }
    let mut checks = vec![0u64; p.nodes];
    let (mut latency, mut local_latency) = (histogram(), histogram());
    for (i, h) in handles {
        let (n, hist, local) = h.await.map_err(|e| format!("a client failed: {e}"))?;
        checks[i] += n;
        latency.add(&hist).map_err(|e| format!("{e:?}"))?;
        local_latency.add(&local).map_err(|e| format!("{e:?}"))?;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu()? - cpu0;
    let end = clock.redis_ns(start + p.run);
    let (mut leases, mut fallbacks) = (LeaseStats::default(), 0);
    for n in &nodes {
        if let Node::Store(s) = &**n {
            s.return_leases().await;
            fallbacks += s.stats().fallbacks;
            if let Some(l) = s.lease_stats() {
                leases = add(leases, l);
            }
        }
    }
    // Windows wholly between the first check and the last.
    let lo = clock.redis_ns(start).div_ceil(w) - first;
    let hi = (end / w).saturating_sub(first).max(lo);
    let counts = Arc::try_unwrap(counts).map_err(|_| "a client still holds the counts")?;
    let out = Outcome {
        checks,
        secs,
        latency,
        local_latency,
        leases,
        fallbacks,
        counts,
        complete: lo as usize..(hi as usize).min(windows),
    };
    Ok((out, cpu))
}

fn add(a: LeaseStats, b: LeaseStats) -> LeaseStats {
    LeaseStats {
        checks: a.checks + b.checks,
        local: a.local + b.local,
        round_trips: a.round_trips + b.round_trips,
        lease_calls: a.lease_calls + b.lease_calls,
        granted: a.granted + b.granted,
        returned: a.returned + b.returned,
        stranded: a.stranded + b.stranded,
        unrecorded: a.unrecorded + b.unrecorded,
        keys: a.keys + b.keys,
    }
}
