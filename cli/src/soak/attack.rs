//! The attackers: each of `--connections` tasks plays one [`Kind`] of hostile client over
//! raw sockets, on a runtime of its own (one thread, niced, so that the honest clients'
//! measurements are not delayed by the attack's own work on the client side). A task
//! connects, attacks, notes what the server did ([`Outcome`]), waits about a second and
//! starts again, until the attack's end: at most one connection per task at any time, and
//! every wait is bounded by the end. Dropping the runtime closes every attacking socket.

mod conn;
mod http;
mod resp;

use conn::Conn;
use http::{big_body, no_creds, slowloris, tagged_http};
use resp::{garbage, giant, hold_frame, multi, never_read, new_params, tagged_resp, unauth_flood};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{sleep, timeout_at, Instant};

/// A kind of hostile client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Kind {
    /// Frames past every bound, before and after AUTH: `*128` arrays of 512 KiB bulks, a bulk
    /// longer than `--max-bulk`, an inline line past its limit; each followed by 256 KiB.
    Giant,
    /// Authenticated, sends all of the largest frame the bounds allow but its last byte, and
    /// waits: the server must hold it whole.
    HoldFrame,
    /// Authenticated, pipelines COMMAND, INFO and CL.THROTTLE and never reads a reply.
    NeverRead,
    /// Never authenticates and floods commands: half read the NOAUTH replies, half never read.
    UnauthFlood,
    /// Authenticated, each CL.THROTTLE with a parameter set never seen before.
    NewParams,
    /// RESP garbage: random bytes, wrong types, negative and huge lengths, NULs, bare CRLFs.
    Garbage,
    /// Authenticated, opens a MULTI, queues commands past its bound and never sends EXEC.
    MultiNoExec,
    /// Tagged customer ids (`customer user:7`), over RESP and POST /v1/check.
    TaggedIds,
    /// HTTP headers one byte a second (slowloris).
    Slowloris,
    /// POST /v1/check with a body far past `--max-body` (a length, chunked, no password).
    BigBody,
    /// HTTP without credentials: /v1/check, /metrics, /v1/reload; and /healthz.
    NoCreds,
}

impl Kind {
    /// Every kind with its share of the connections (per cent).
    pub const MIX: [(Kind, u32); 11] = [
        (Kind::Giant, 10),
        (Kind::HoldFrame, 10),
        (Kind::NeverRead, 15),
        (Kind::UnauthFlood, 10),
        (Kind::NewParams, 3),
        (Kind::Garbage, 7),
        (Kind::MultiNoExec, 10),
        (Kind::TaggedIds, 5),
        (Kind::Slowloris, 10),
        (Kind::BigBody, 10),
        (Kind::NoCreds, 10),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Giant => "giant frames",
            Kind::HoldFrame => "largest frame held",
            Kind::NeverRead => "never reads",
            Kind::UnauthFlood => "unauthenticated flood",
            Kind::NewParams => "new CL.THROTTLE parameters",
            Kind::Garbage => "RESP garbage",
            Kind::MultiNoExec => "MULTI without EXEC",
            Kind::TaggedIds => "tagged customer ids",
            Kind::Slowloris => "slow HTTP headers",
            Kind::BigBody => "oversized HTTP bodies",
            Kind::NoCreds => "HTTP without credentials",
        }
    }

    fn http(self) -> bool {
        matches!(self, Kind::Slowloris | Kind::BigBody | Kind::NoCreds)
    }
}

/// What the attackers aim at.
pub struct Target {
    pub resp: SocketAddr,
    pub http: Option<SocketAddr>,
    pub password: Option<Vec<u8>>,
    pub max_args: usize,
    pub max_bulk: usize,
    pub max_inline: usize,
    pub metrics_open: bool,
}

/// What one attempt of an attacker ended with.
enum Outcome {
    /// What a bounded server does (the label says what).
    Expected(&'static str),
    /// What it should not do.
    Unexpected(String),
    /// No connection.
    Connect(String),
}

/// The counts of one kind.
#[derive(Default)]
pub struct KindStats {
    /// Tasks of this kind.
    pub tasks: AtomicU64,
    /// Connections made.
    pub connections: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    pub connect_errors: AtomicU64,
    pub unexpected: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// Expected outcomes by label.
    pub outcomes: Mutex<BTreeMap<&'static str, u64>>,
    /// The first unexpected outcomes and connect errors, as said.
    pub samples: Mutex<Vec<String>>,
}

/// The counts of every kind.
pub struct Stats {
    pub kinds: Vec<(Kind, KindStats)>,
    /// CL.THROTTLE answered with an admission to the attackers that read their replies.
    pub throttle_allowed_seen: AtomicU64,
    /// CL.THROTTLE answered limited to them.
    pub throttle_limited_seen: AtomicU64,
    /// CL.THROTTLE sent by attackers that never read (each may have been counted).
    pub throttle_unread: AtomicU64,
    /// The next new parameter set.
    next_params: AtomicU64,
}

impl Stats {
    pub fn new() -> Self {
        Self {
            kinds: Kind::MIX
                .iter()
                .map(|(k, _)| (*k, KindStats::default()))
                .collect(),
            throttle_allowed_seen: AtomicU64::new(0),
            throttle_limited_seen: AtomicU64::new(0),
            throttle_unread: AtomicU64::new(0),
            next_params: AtomicU64::new(0),
        }
    }

    pub fn of(&self, k: Kind) -> &KindStats {
        &self
            .kinds
            .iter()
            .find(|(x, _)| *x == k)
            .expect("every kind")
            .1
    }

    /// Attacking connections open now.
    pub fn open(&self) -> u64 {
        self.kinds
            .iter()
            .map(|(_, s)| s.open.load(Ordering::Relaxed))
            .sum()
    }
}

/// The kinds of `n` attackers, in the shares of [`Kind::MIX`] (largest remainders), HTTP kinds
/// left out when there is no HTTP address, and only the kinds of `only` if it is not empty.
pub fn plan(n: usize, http: bool, only: &[Kind]) -> Vec<Kind> {
    let mix: Vec<(Kind, u32)> = Kind::MIX
        .iter()
        .copied()
        .filter(|(k, _)| (http || !k.http()) && (only.is_empty() || only.contains(k)))
        .collect();
    if mix.is_empty() {
        return Vec::new();
    }
    let total: u32 = mix.iter().map(|(_, w)| w).sum();
    let mut counts: Vec<(Kind, usize, u64)> = mix
        .iter()
        .map(|(k, w)| {
            let exact = n as u64 * u64::from(*w);
            (
                *k,
                (exact / u64::from(total)) as usize,
                exact % u64::from(total),
            )
        })
        .collect();
    let mut left = n - counts.iter().map(|c| c.1).sum::<usize>();
    let mut order: Vec<usize> = (0..counts.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(counts[i].2));
    for i in order {
        if left == 0 {
            break;
        }
        counts[i].1 += 1;
        left -= 1;
    }
    // Interleaved, so that a smaller run still has every kind early on.
    let mut out = Vec::with_capacity(n);
    let mut given = vec![0usize; counts.len()];
    while out.len() < n {
        for (i, c) in counts.iter().enumerate() {
            if given[i] < c.1 {
                given[i] += 1;
                out.push(c.0);
            }
        }
    }
    out
}

/// Runs the attackers of `plan` on this thread until `until`, then closes every connection.
pub fn run(target: Arc<Target>, plan: Vec<Kind>, until: Instant, stats: Arc<Stats>) {
    nice_this_thread();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, kind) in plan.into_iter().enumerate() {
            stats.of(kind).tasks.fetch_add(1, Ordering::Relaxed);
            let (t, s) = (target.clone(), stats.clone());
            tasks.spawn(async move { attacker(kind, i, t, s, until).await });
        }
        // Every attacker ends at `until` (each wait is bounded by it); a little more for the
        // last ones to see it.
        let _ = timeout_at(until + Duration::from_secs(2), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
    });
    // Dropping the runtime drops every task left, and with them their sockets.
    drop(rt);
}

/// The attacker's thread gets nice 10: the attack's client-side work yields the CPU to the
/// server and to the honest clients, whose latencies are the measurement.
fn nice_this_thread() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority(2) on this thread's own id; no memory is involved.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

/// A small xorshift: jitter and garbage bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

async fn attacker(kind: Kind, task: usize, t: Arc<Target>, s: Arc<Stats>, until: Instant) {
    let st = s.of(kind);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (task as u64 + 1).wrapping_mul(0x2545_F491));
    // Spread the first connections over the first second, as the later ones are.
    sleep(Duration::from_millis(rng.next() % 1000)).await;
    let mut attempt = 0u64;
    while Instant::now() < until {
        let r = timeout_at(until, one(kind, task, attempt, &t, &s, until)).await;
        match r {
            // The end came first: whatever it was doing, it was held to the end.
            Err(_) => note(st, Outcome::Expected("held to the end")),
            Ok(o) => note(st, o),
        }
        attempt += 1;
        let pause = Duration::from_millis(700 + rng.next() % 600);
        if timeout_at(until, sleep(pause)).await.is_err() {
            break;
        }
    }
}

fn note(st: &KindStats, o: Outcome) {
    let sample = |e: String| {
        let mut v = st.samples.lock().expect("not poisoned");
        if v.len() < 4 {
            v.push(e);
        }
    };
    match o {
        Outcome::Expected(l) => {
            *st.outcomes
                .lock()
                .expect("not poisoned")
                .entry(l)
                .or_default() += 1;
        }
        Outcome::Unexpected(e) => {
            st.unexpected.fetch_add(1, Ordering::Relaxed);
            sample(e);
        }
        Outcome::Connect(e) => {
            st.connect_errors.fetch_add(1, Ordering::Relaxed);
            sample(format!("connect: {e}"));
        }
    }
}

/// How long an attacker waits for a reply it expects.
const WAIT: Duration = Duration::from_secs(5);

async fn one(
    kind: Kind,
    task: usize,
    attempt: u64,
    t: &Target,
    s: &Stats,
    until: Instant,
) -> Outcome {
    let st = s.of(kind);
    // Half the tagged-id attackers use POST /v1/check.
    let http = kind.http() || (kind == Kind::TaggedIds && task % 2 == 1 && t.http.is_some());
    let addr = match t.http {
        Some(h) if http => h,
        _ => t.resp,
    };
    let mut c = match Conn::open(addr, st).await {
        Ok(c) => c,
        Err(o) => return o,
    };
    let r = match kind {
        Kind::Giant => giant(&mut c, t, attempt).await,
        Kind::HoldFrame => hold_frame(&mut c, t, until).await,
        Kind::NeverRead => never_read(&mut c, t, s, task, until, true).await,
        Kind::UnauthFlood if task % 2 == 0 => unauth_flood(&mut c, t, until).await,
        Kind::UnauthFlood => never_read(&mut c, t, s, task, until, false).await,
        Kind::NewParams => new_params(&mut c, t, s, task, until).await,
        Kind::Garbage => garbage(&mut c, attempt, task).await,
        Kind::MultiNoExec => multi(&mut c, t, until).await,
        Kind::TaggedIds if http => tagged_http(&mut c, t, until).await,
        Kind::TaggedIds => tagged_resp(&mut c, t, attempt, until).await,
        Kind::Slowloris => slowloris(&mut c, until).await,
        Kind::BigBody => big_body(&mut c, t, attempt).await,
        Kind::NoCreds => no_creds(&mut c, t, until).await,
    };
    r.unwrap_or_else(|o| o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_follows_the_mix() {
        let p = plan(1000, true, &[]);
        assert_eq!(p.len(), 1000);
        for (k, w) in Kind::MIX {
            assert_eq!(
                p.iter().filter(|x| **x == k).count(),
                w as usize * 10,
                "{k:?}"
            );
        }
        let p = plan(7, false, &[]);
        assert_eq!(p.len(), 7);
        assert!(p.iter().all(|k| !k.http()));
        assert_eq!(plan(5, true, &[Kind::Garbage]), vec![Kind::Garbage; 5]);
        assert!(plan(5, false, &[Kind::Slowloris]).is_empty());
        assert_eq!(Kind::MIX.iter().map(|m| m.1).sum::<u32>(), 100);
    }
}
