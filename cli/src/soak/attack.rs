//! The attackers: each of `--connections` tasks plays one [`Kind`] of hostile client over
//! raw sockets (HTTP/2 through h2's client, driven by hand), on a runtime of its own (one
//! thread, niced, so that the honest clients' measurements are not delayed by the attack's
//! own work on the client side). A task connects, attacks, notes what the server did
//! ([`Outcome`]), waits about a second and starts again, until the attack's end: one
//! connection per task at any time (a descriptor hog: at most [`Target::hog_each`]), and
//! every wait is bounded by the end. Dropping the runtime closes every attacking socket.

mod auth;
mod conn;
mod http;
mod http2;
mod idle;
mod kind;
mod resp;
mod source;
mod stats;

use conn::Conn;
use http::{big_body, json_big, no_creds, slow_body, slowloris, tagged_http};
pub use idle::FD_HOG_LIMIT;
pub use kind::{Kind, Listeners};
use resp::{garbage, giant, hold_frame, multi, never_read, new_params, tagged_resp, unauth_flood};
use stats::KindStats;
pub use stats::{Proto, Stats};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, timeout_at, Instant};

/// What the attackers aim at.
pub struct Target {
    pub resp: SocketAddr,
    pub http: Option<SocketAddr>,
    pub grpc: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub password: Option<Vec<u8>>,
    /// Whether the server has an admin password (`None`: its flags could not be read).
    pub admin_password: Option<bool>,
    pub max_args: usize,
    pub max_bulk: usize,
    pub max_inline: usize,
    pub max_body: usize,
    pub metrics_open: bool,
    /// Idle connections each descriptor hog holds at most.
    pub hog_each: usize,
}

impl Target {
    /// The listeners besides RESP.
    pub fn listeners(&self) -> Listeners {
        Listeners {
            http: self.http.is_some(),
            grpc: self.grpc.is_some(),
            admin: self.admin.is_some(),
        }
    }

    /// The address of `p` (HTTP/2 with prior knowledge goes to the HTTP listener).
    fn addr(&self, p: Proto) -> Option<SocketAddr> {
        match p {
            Proto::Resp => Some(self.resp),
            Proto::Http | Proto::HttpH2 => self.http,
            Proto::Grpc => self.grpc,
            Proto::Admin => self.admin,
        }
    }
}

/// What one attempt of an attacker ended with.
pub(super) enum Outcome {
    /// What a bounded server does (the label says what).
    Expected(&'static str),
    /// What it should not do.
    Unexpected(String),
    /// No connection.
    Connect(String),
}

/// The kinds of `n` attackers, in the shares of [`Kind::MIX`] (largest remainders), the kinds
/// the server's listeners cannot take left out, and only the kinds of `only` if it is not
/// empty.
pub fn plan(n: usize, listeners: Listeners, only: &[Kind]) -> Vec<Kind> {
    let mix: Vec<(Kind, u32)> = Kind::MIX
        .iter()
        .copied()
        .filter(|(k, _)| k.runs_with(listeners) && (only.is_empty() || only.contains(k)))
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

/// The listener the `task`-th attacker of `kind` goes to.
fn proto_of(kind: Kind, task: usize, t: &Target) -> Proto {
    let l = t.listeners();
    match kind {
        Kind::TaggedIds if task % 2 == 1 && l.http => Proto::Http,
        k if k.http() => Proto::Http,
        Kind::H2Streams if l.grpc && (task % 2 == 1 || !l.http) => Proto::Grpc,
        Kind::H2Streams => Proto::HttpH2,
        Kind::GrpcSilent | Kind::GrpcSlow => Proto::Grpc,
        Kind::AdminNocreds => Proto::Admin,
        Kind::AuthGuess => {
            let mut on = vec![Proto::Resp];
            if l.http {
                on.push(Proto::Http);
            }
            if l.grpc {
                on.push(Proto::Grpc);
            }
            on[task % on.len()]
        }
        _ => Proto::Resp,
    }
}

async fn one(
    kind: Kind,
    task: usize,
    attempt: u64,
    t: &Target,
    s: &Stats,
    until: Instant,
) -> Outcome {
    let st = s.of(kind);
    let proto = proto_of(kind, task, t);
    let Some(addr) = t.addr(proto) else {
        return Outcome::Connect(format!("no {} address", proto.name()));
    };
    let mut c = match Conn::open(addr, kind, st, s.proto(proto)).await {
        Ok(c) => c,
        Err(o) => return o,
    };
    // The variant of the newer kinds: each task starts at its own, so that a run too short
    // for a second attempt (an attempt may hold to the end) still has every variant.
    let variant = attempt + task as u64;
    let r = match kind {
        Kind::Giant => giant(&mut c, t, attempt).await,
        Kind::HoldFrame => hold_frame(&mut c, t, until).await,
        Kind::NeverRead => never_read(&mut c, t, s, task, until, true).await,
        Kind::UnauthFlood if task % 2 == 0 => unauth_flood(&mut c, t, until).await,
        Kind::UnauthFlood => never_read(&mut c, t, s, task, until, false).await,
        Kind::NewParams => new_params(&mut c, t, s, task, until).await,
        Kind::Garbage => garbage(&mut c, attempt, task).await,
        Kind::MultiNoExec => multi(&mut c, t, until).await,
        Kind::TaggedIds if proto == Proto::Http => tagged_http(&mut c, t, until).await,
        Kind::TaggedIds => tagged_resp(&mut c, t, attempt, until).await,
        Kind::Slowloris => slowloris(&mut c, until).await,
        Kind::BigBody => big_body(&mut c, t, attempt).await,
        Kind::NoCreds => no_creds(&mut c, t, until).await,
        Kind::SlowBody => slow_body(&mut c, t, variant, until).await,
        Kind::H2Streams => http2::streams(&mut c, t, s, proto, variant, until).await,
        Kind::JsonBig => json_big(&mut c, t, s, variant).await,
        Kind::GrpcSilent => Ok(c
            .held(until, "closed by the server", "held to the end")
            .await),
        Kind::GrpcSlow => http2::grpc_slow(&mut c, t, variant, until).await,
        Kind::UnauthHolder => idle::unauth_holder(&mut c, t, task, until).await,
        Kind::AuthGuess => auth::guess(&mut c, t, proto, attempt, until).await,
        Kind::AdminNocreds => auth::admin(&mut c, t, task).await,
        Kind::FdHog => idle::fd_hog(c, t, s, task, until).await,
    };
    r.unwrap_or_else(|o| o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_follows_the_mix() {
        let all = Listeners {
            http: true,
            grpc: true,
            admin: true,
        };
        let p = plan(1000, all, &[]);
        assert_eq!(p.len(), 1000);
        for (k, w) in Kind::MIX {
            assert_eq!(
                p.iter().filter(|x| **x == k).count(),
                w as usize * 10,
                "{k:?}"
            );
        }
        let resp_only = Listeners::default();
        let p = plan(7, resp_only, &[]);
        assert_eq!(p.len(), 7);
        assert!(p.iter().all(|k| k.runs_with(resp_only) && !k.http()));
        assert_eq!(plan(5, all, &[Kind::Garbage]), vec![Kind::Garbage; 5]);
        assert!(plan(5, resp_only, &[Kind::Slowloris]).is_empty());
        assert!(plan(5, resp_only, &[Kind::GrpcSilent, Kind::AdminNocreds]).is_empty());
        let grpc_only = Listeners {
            grpc: true,
            ..resp_only
        };
        assert_eq!(plan(3, grpc_only, &[Kind::H2Streams]).len(), 3);
    }
}
