//! The attackers: each of `--connections` tasks plays one [`Kind`] of hostile client over
//! raw sockets, on a runtime of its own (one thread, niced, so that the honest clients'
//! measurements are not delayed by the attack's own work on the client side). A task
//! connects, attacks, notes what the server did ([`Outcome`]), waits about a second and
//! starts again, until the attack's end: at most one connection per task at any time, and
//! every wait is bounded by the end. Dropping the runtime closes every attacking socket.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, timeout_at, Instant};

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

/// A connection counted open while it lives.
struct Conn<'a> {
    s: TcpStream,
    buf: Vec<u8>,
    st: &'a KindStats,
}

/// How reading ended.
enum End {
    Closed,
    Error(String),
    Quiet,
}

impl<'a> Conn<'a> {
    async fn open(addr: SocketAddr, st: &'a KindStats) -> Result<Conn<'a>, Outcome> {
        let s = timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .map_err(|_| Outcome::Connect("no connection within 5 s".into()))?
            .map_err(|e| Outcome::Connect(e.to_string()))?;
        let _ = s.set_nodelay(true);
        st.connections.fetch_add(1, Ordering::Relaxed);
        st.open.fetch_add(1, Ordering::Relaxed);
        Ok(Conn {
            s,
            buf: Vec::new(),
            st,
        })
    }

    async fn send(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.s.write_all(b).await?;
        self.st
            .bytes_sent
            .fetch_add(b.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Writes what it can of `b` within `wait`: the bytes written (0 when the socket stays
    /// full that long).
    async fn push(&mut self, b: &[u8], wait: Duration) -> std::io::Result<usize> {
        match timeout(wait, self.s.write(b)).await {
            Err(_) => Ok(0),
            Ok(Ok(0)) => Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => {
                self.st.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
                Ok(n)
            }
            Ok(Err(e)) => Err(e),
        }
    }

    /// Sends `b` as far as the server takes it within `wait` per write, ignoring errors (a
    /// server that refused the frame closes the connection under it).
    async fn spray(&mut self, b: &[u8], wait: Duration) {
        let mut at = 0;
        while at < b.len() {
            match self.push(&b[at..], wait).await {
                Ok(0) | Err(_) => return,
                Ok(n) => at += n,
            }
        }
    }

    /// One line of the reply (CRLF removed), within `wait`; at most 1 MiB.
    async fn line(&mut self, wait: Duration) -> Result<String, End> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return Ok(l);
            }
            if self.buf.len() > 1 << 20 {
                return Err(End::Error("a reply line over 1 MiB".into()));
            }
            let mut chunk = [0u8; 16384];
            match timeout_at(deadline, self.s.read(&mut chunk)).await {
                Err(_) => return Err(End::Quiet),
                Ok(Ok(0)) => return Err(End::Closed),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => return Err(End::Error(e.to_string())),
            }
        }
    }

    /// One whole reply (arrays and bulk strings included): its first line, or how reading
    /// ended.
    async fn reply(&mut self, wait: Duration) -> Result<String, End> {
        let first = self.line(wait).await?;
        let mut todo = 0i64;
        match first.as_bytes().first() {
            Some(b'*') => todo = first[1..].parse::<i64>().unwrap_or(0),
            Some(b'$') if first[1..].parse::<i64>().unwrap_or(-1) >= 0 => todo = 1,
            _ => {}
        }
        while todo > 0 {
            let l = self.line(wait).await?;
            todo -= 1;
            match l.as_bytes().first() {
                Some(b'*') => todo += l[1..].parse::<i64>().unwrap_or(0),
                Some(b'$') if l[1..].parse::<i64>().unwrap_or(-1) >= 0 => todo += 1,
                _ => {}
            }
        }
        Ok(first)
    }

    /// Reads (discarding) until the server closes, an error, or `quiet` without data.
    async fn drain(&mut self, quiet: Duration) -> End {
        self.buf.clear();
        let mut chunk = [0u8; 16384];
        loop {
            match timeout(quiet, self.s.read(&mut chunk)).await {
                Err(_) => return End::Quiet,
                Ok(Ok(0)) => return End::Closed,
                Ok(Ok(n)) => {
                    if self.buf.len() < 4096 {
                        self.buf.extend_from_slice(&chunk[..n.min(4096)]);
                    }
                }
                Ok(Err(e)) => return End::Error(e.to_string()),
            }
        }
    }

    /// Waits, reading nothing it needs, until the server closes the connection (`true`) or
    /// `until`.
    async fn hold(&mut self, until: Instant) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match timeout_at(until, self.s.read(&mut chunk)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// AUTH with the password, if there is one.
    async fn auth(&mut self, password: Option<&[u8]>) -> Result<(), Outcome> {
        let Some(p) = password else { return Ok(()) };
        let mut parts: Vec<&[u8]> = vec![b"AUTH"];
        parts.push(p);
        self.send(&frame(&parts))
            .await
            .map_err(|e| Outcome::Unexpected(format!("AUTH not sent: {e}")))?;
        match self.line(Duration::from_secs(5)).await {
            Ok(l) if l == "+OK" => Ok(()),
            Ok(l) => Err(Outcome::Unexpected(format!("AUTH answered {l}"))),
            Err(e) => Err(Outcome::Unexpected(format!("AUTH: {}", ended(&e)))),
        }
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        self.st.open.fetch_sub(1, Ordering::Relaxed);
    }
}

fn ended(e: &End) -> String {
    match e {
        End::Closed => "closed".into(),
        End::Error(e) => e.clone(),
        End::Quiet => "no reply within the wait".into(),
    }
}

/// A RESP array of bulk strings.
pub fn frame(parts: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        v.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
        v.extend_from_slice(p);
        v.extend_from_slice(b"\r\n");
    }
    v
}

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

/// A frame past the bounds, then 256 KiB: answered `-ERR Protocol error` and closed.
async fn giant(c: &mut Conn<'_>, t: &Target, attempt: u64) -> Result<Outcome, Outcome> {
    let authed = (attempt / 3) % 2 == 1;
    if authed {
        c.auth(t.password.as_deref()).await?;
    }
    let head: Vec<u8> = match attempt % 3 {
        0 => b"*128\r\n$524288\r\n".to_vec(),
        1 if authed => {
            format!("*2\r\n$4\r\nECHO\r\n${}\r\n", t.max_bulk.max(1024) * 128).into_bytes()
        }
        1 => b"*2\r\n$4\r\nAUTH\r\n$524288\r\n".to_vec(),
        _ => Vec::new(),
    };
    let rest = if head.is_empty() {
        // An inline line past every limit.
        vec![b'x'; t.max_inline.max(1024) * 4 + (256 << 10)]
    } else {
        vec![b'x'; 256 << 10]
    };
    if !head.is_empty() && c.send(&head).await.is_err() {
        return Ok(Outcome::Unexpected(
            "closed before the frame's header".into(),
        ));
    }
    c.spray(&rest, Duration::from_secs(2)).await;
    match c.line(WAIT).await {
        Ok(l) if l.starts_with("-ERR Protocol error") => match c.drain(WAIT).await {
            End::Closed | End::Error(_) => {
                Ok(Outcome::Expected("refused with a protocol error, closed"))
            }
            End::Quiet => Ok(Outcome::Unexpected(format!("{l}, then left open"))),
        },
        Ok(l) => Ok(Outcome::Unexpected(format!("answered {l:.80}"))),
        Err(End::Quiet) => Ok(Outcome::Unexpected(
            "no reply and still open 5 s after a frame past the bounds".into(),
        )),
        // Closed with the rest unread: the kernel resets the connection, and the reply may
        // be lost with it.
        Err(_) => Ok(Outcome::Expected("closed (reset; the reply not seen)")),
    }
}

/// All but the last byte of the largest frame the bounds allow, held until the end.
async fn hold_frame(c: &mut Conn<'_>, t: &Target, until: Instant) -> Result<Outcome, Outcome> {
    c.auth(t.password.as_deref()).await?;
    let bulk = vec![b'h'; t.max_bulk];
    let parts: Vec<&[u8]> = (0..t.max_args).map(|_| &bulk[..]).collect();
    let mut f = frame(&parts);
    f.truncate(f.len() - 1);
    if c.send(&f).await.is_err() {
        return Ok(Outcome::Unexpected(
            "closed while sending an allowed frame".into(),
        ));
    }
    Ok(if c.hold(until).await {
        Outcome::Expected("closed by the server (idle timeout)")
    } else {
        Outcome::Expected("held to the end")
    })
}

/// Pipelines commands and never reads: `auth` first or not (an unauthenticated flood).
async fn never_read(
    c: &mut Conn<'_>,
    t: &Target,
    s: &Stats,
    task: usize,
    until: Instant,
    auth: bool,
) -> Result<Outcome, Outcome> {
    if auth {
        c.auth(t.password.as_deref()).await?;
    }
    let key = format!("soak-attack:{task}");
    let mut batch = Vec::new();
    let mut throttles = 0u64;
    for i in 0..256 {
        match i % 3 {
            0 => batch.extend_from_slice(b"COMMAND\r\n"),
            1 => batch.extend_from_slice(&frame(&[b"INFO"])),
            _ => {
                batch.extend_from_slice(&frame(&[
                    b"CL.THROTTLE",
                    key.as_bytes(),
                    b"5",
                    b"10",
                    b"60",
                ]));
                throttles += 1;
            }
        }
    }
    let counted = auth || t.password.is_none();
    let mut at = 0;
    let mut blocked_since: Option<Instant> = None;
    loop {
        if Instant::now() >= until {
            return Ok(Outcome::Expected(if blocked_since.is_some() {
                "paused by the server, held to the end"
            } else {
                "still sending at the end"
            }));
        }
        match c.push(&batch[at..], Duration::from_secs(1)).await {
            Err(_) => {
                return Ok(Outcome::Expected(if auth {
                    "closed by the server (output limit or idle)"
                } else {
                    "closed by the server"
                }))
            }
            Ok(0) => {
                blocked_since.get_or_insert_with(Instant::now);
                // Blocked: the server stopped reading. Try again a little later.
                let _ = timeout_at(until, sleep(Duration::from_secs(1))).await;
            }
            Ok(n) => {
                blocked_since = None;
                at += n;
                if at == batch.len() {
                    at = 0;
                    if counted {
                        s.throttle_unread.fetch_add(throttles, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// Unauthenticated pipelines of CL.THROTTLE, reading every reply: each must be NOAUTH.
async fn unauth_flood(c: &mut Conn<'_>, t: &Target, until: Instant) -> Result<Outcome, Outcome> {
    let one = frame(&[b"CL.THROTTLE", b"k", b"1", b"1", b"1"]);
    let batch = one.repeat(64);
    while Instant::now() < until {
        if c.send(&batch).await.is_err() {
            return Ok(Outcome::Unexpected("closed while flooding".into()));
        }
        for _ in 0..64 {
            match c.reply(WAIT).await {
                Ok(l) if t.password.is_none() || l.starts_with("-NOAUTH") => {}
                Ok(l) => return Ok(Outcome::Unexpected(format!("answered {l:.80} before AUTH"))),
                Err(e) => return Ok(Outcome::Unexpected(format!("flood: {}", ended(&e)))),
            }
        }
    }
    Ok(Outcome::Expected("every command answered NOAUTH"))
}

/// CL.THROTTLE with a parameter set never used before, one at a time.
async fn new_params(
    c: &mut Conn<'_>,
    t: &Target,
    s: &Stats,
    task: usize,
    until: Instant,
) -> Result<Outcome, Outcome> {
    c.auth(t.password.as_deref()).await?;
    let mut made = 0u64;
    let mut refused = 0u64;
    while Instant::now() < until {
        let n = s.next_params.fetch_add(1, Ordering::Relaxed);
        let key = format!("soak-params:{task}");
        let burst = (1000 + n).to_string();
        if c.send(&frame(&[
            b"CL.THROTTLE",
            key.as_bytes(),
            burst.as_bytes(),
            b"1",
            b"60",
        ]))
        .await
        .is_err()
        {
            return Ok(Outcome::Unexpected("closed while sending".into()));
        }
        match c.reply(WAIT).await {
            Ok(l) if l == "*5" => {
                made += 1;
                s.throttle_allowed_seen.fetch_add(1, Ordering::Relaxed);
            }
            Ok(l) if l.starts_with("-ERR no room for another CL.THROTTLE store") => refused += 1,
            Ok(l) => return Ok(Outcome::Unexpected(format!("answered {l:.120}"))),
            Err(e) => return Ok(Outcome::Unexpected(format!("no reply: {}", ended(&e)))),
        }
    }
    Ok(Outcome::Expected(match (made, refused) {
        (_, 0) => "every new parameter set answered",
        (0, _) => "refused: no room for another store",
        _ => "answered, then refused: no room for another store",
    }))
}

/// Bytes no RESP client sends.
async fn garbage(c: &mut Conn<'_>, attempt: u64, task: usize) -> Result<Outcome, Outcome> {
    let mut rng = Rng(0xDEAD_BEEF ^ (attempt << 20) ^ task as u64);
    let bytes: Vec<u8> = match (attempt + task as u64) % 8 {
        0 => (0..4096).map(|_| rng.next() as u8).collect(),
        1 => b"*3\r\n$3\r\nfoo\r\n:12\r\n+x\r\n".to_vec(),
        2 => b"*-5\r\n*1\r\n$-7\r\n".to_vec(),
        3 => b"$abc\r\n*x\r\n".to_vec(),
        4 => b"*2\r\n$99999999999999999999\r\n".to_vec(),
        5 => vec![0u8; 1024],
        6 => b"\r\n".repeat(2000),
        _ => b"*1\r\n$4\r\nPINGxx*1\r\n".to_vec(),
    };
    c.spray(&bytes, Duration::from_secs(2)).await;
    Ok(match c.drain(Duration::from_secs(2)).await {
        End::Closed | End::Error(_) if c.buf.starts_with(b"-ERR Protocol error") => {
            Outcome::Expected("refused with a protocol error, closed")
        }
        End::Closed | End::Error(_) => Outcome::Expected("closed"),
        End::Quiet if c.buf.is_empty() => Outcome::Expected("no reply, left open (incomplete)"),
        End::Quiet => Outcome::Expected("answered with errors, left open"),
    })
}

/// MULTI, then more commands than a transaction may queue, then nothing until the end.
async fn multi(c: &mut Conn<'_>, t: &Target, until: Instant) -> Result<Outcome, Outcome> {
    c.auth(t.password.as_deref()).await?;
    let ping = frame(&[b"PING"]);
    let mut queued = 0u64;
    let mut refused = 0u64;
    c.send(&frame(&[b"MULTI"]))
        .await
        .map_err(|e| Outcome::Unexpected(e.to_string()))?;
    match c.line(WAIT).await {
        Ok(l) if l == "+OK" => {}
        Ok(l) => return Ok(Outcome::Unexpected(format!("MULTI answered {l}"))),
        Err(e) => return Ok(Outcome::Unexpected(format!("MULTI: {}", ended(&e)))),
    }
    for _ in 0..12 {
        if c.send(&ping.repeat(1000)).await.is_err() {
            return Ok(Outcome::Unexpected("closed while queueing".into()));
        }
        for _ in 0..1000 {
            match c.line(WAIT).await {
                Ok(l) if l == "+QUEUED" => queued += 1,
                Ok(l) if l.starts_with("-ERR the transaction is too large") => refused += 1,
                Ok(l) => return Ok(Outcome::Unexpected(format!("queueing answered {l:.80}"))),
                Err(e) => return Ok(Outcome::Unexpected(format!("queueing: {}", ended(&e)))),
            }
        }
    }
    if refused == 0 {
        return Ok(Outcome::Unexpected(format!(
            "{queued} commands queued in one MULTI, none refused"
        )));
    }
    Ok(if c.hold(until).await {
        Outcome::Expected("queue bounded, then closed by the server")
    } else {
        Outcome::Expected("queue bounded, held to the end without EXEC")
    })
}

/// `TURNSTILE.CHECK customer user:N`, 16 at a time: each refused.
async fn tagged_resp(
    c: &mut Conn<'_>,
    t: &Target,
    attempt: u64,
    until: Instant,
) -> Result<Outcome, Outcome> {
    c.auth(t.password.as_deref()).await?;
    let mut n = attempt * 1_000_000;
    while Instant::now() < until {
        let mut batch = Vec::new();
        for _ in 0..16 {
            n += 1;
            let id = format!("user:{n}");
            batch.extend(frame(&[b"TURNSTILE.CHECK", b"customer", id.as_bytes()]));
        }
        if c.send(&batch).await.is_err() {
            return Ok(Outcome::Unexpected("closed while sending".into()));
        }
        for _ in 0..16 {
            match c.reply(WAIT).await {
                Ok(l) if l.contains("is not a customer id") => {}
                Ok(l) => return Ok(Outcome::Unexpected(format!("answered {l:.120}"))),
                Err(e) => return Ok(Outcome::Unexpected(format!("no reply: {}", ended(&e)))),
            }
        }
    }
    Ok(Outcome::Expected("every tagged id refused"))
}

/// An HTTP/1.1 request head.
fn request(method: &str, path: &str, password: Option<&[u8]>, extra: &str) -> Vec<u8> {
    let mut v = format!("{method} {path} HTTP/1.1\r\nHost: soak\r\n{extra}").into_bytes();
    if let Some(p) = password {
        v.extend_from_slice(b"Authorization: Bearer ");
        v.extend_from_slice(p);
        v.extend_from_slice(b"\r\n");
    }
    v.extend_from_slice(b"\r\n");
    v
}

/// `POST /v1/check` of tagged ids with the password: each refused with the key's rule.
async fn tagged_http(c: &mut Conn<'_>, t: &Target, until: Instant) -> Result<Outcome, Outcome> {
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let body = format!("{{\"key_class\":\"customer\",\"key\":\"org:{n}\"}}");
        let mut req = request(
            "POST",
            "/v1/check",
            t.password.as_deref(),
            &format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ),
        );
        req.extend_from_slice(body.as_bytes());
        if c.send(&req).await.is_err() {
            return Ok(Outcome::Unexpected("closed while sending".into()));
        }
        match timeout(WAIT, super::probe::read_response(&mut c.s, &mut c.buf)).await {
            Ok(Ok(r))
                if (400..500).contains(&r.status)
                    && String::from_utf8_lossy(&r.body).contains("is not a customer id") => {}
            Ok(Ok(r)) => {
                return Ok(Outcome::Unexpected(format!(
                    "{} {:.120}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                )))
            }
            Ok(Err(e)) => return Ok(Outcome::Unexpected(e)),
            Err(_) => return Ok(Outcome::Unexpected("no answer within 5 s".into())),
        }
    }
    Ok(Outcome::Expected("every tagged id refused"))
}

/// A request head a byte a second, never finished.
async fn slowloris(c: &mut Conn<'_>, until: Instant) -> Result<Outcome, Outcome> {
    if c.send(b"POST /v1/check HTTP/1.1\r\nHost: soak\r\nX-Slow: ")
        .await
        .is_err()
    {
        return Ok(Outcome::Unexpected("closed at once".into()));
    }
    let mut chunk = [0u8; 1024];
    loop {
        let tick = timeout_at(until, async {
            tokio::select! {
                r = c.s.read(&mut chunk) => Some(r),
                () = sleep(Duration::from_secs(1)) => None,
            }
        })
        .await;
        match tick {
            Err(_) => {
                return Ok(Outcome::Expected(
                    "held to the end (within --header-timeout)",
                ))
            }
            Ok(Some(Ok(0))) | Ok(Some(Err(_))) => {
                return Ok(Outcome::Expected("closed by the server (--header-timeout)"))
            }
            Ok(Some(Ok(_))) => {
                // An answer (408, 431): the server refused the head; it closes next.
                return Ok(Outcome::Expected("answered an error, closed"));
            }
            Ok(None) => {
                if c.send(b"x").await.is_err() {
                    return Ok(Outcome::Expected("closed by the server (--header-timeout)"));
                }
            }
        }
    }
}

/// A body of 16 MiB: with its length, chunked, or without the password.
async fn big_body(c: &mut Conn<'_>, t: &Target, attempt: u64) -> Result<Outcome, Outcome> {
    const BODY: usize = 16 << 20;
    let variant = attempt % 3;
    let (password, extra) = match variant {
        0 => (
            t.password.as_deref(),
            format!("Content-Type: application/json\r\nContent-Length: {BODY}\r\n"),
        ),
        1 => (
            t.password.as_deref(),
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n".to_string(),
        ),
        _ => (
            None,
            format!("Content-Type: application/json\r\nContent-Length: {BODY}\r\n"),
        ),
    };
    let head = request("POST", "/v1/check", password, &extra);
    if c.send(&head).await.is_err() {
        return Ok(Outcome::Unexpected("closed at once".into()));
    }
    let mut piece = b"{\"key_class\":\"customer\",\"key\":\"1\",\"pad\":\"".to_vec();
    piece.resize(64 << 10, b'x');
    let piece = if variant == 1 {
        let mut v = format!("{:x}\r\n", piece.len()).into_bytes();
        v.extend_from_slice(&piece);
        v.extend_from_slice(b"\r\n");
        v
    } else {
        piece
    };
    for _ in 0..BODY / (64 << 10) {
        match c.push(&piece, Duration::from_secs(2)).await {
            Ok(n) if n == piece.len() => {}
            Ok(n) if n > 0 => c.spray(&piece[n..], Duration::from_secs(2)).await,
            _ => break,
        }
    }
    let want = if password.is_none() && t.password.is_some() {
        401
    } else {
        413
    };
    let mut extra = std::mem::take(&mut c.buf);
    Ok(
        match timeout(WAIT, super::probe::read_response(&mut c.s, &mut extra)).await {
            Ok(Ok(r)) if r.status == want => Outcome::Expected(if want == 401 {
                "401 without the password"
            } else {
                "413 past --max-body"
            }),
            Ok(Ok(r)) => Outcome::Unexpected(format!(
                "{} {:.120} to a 16 MiB body",
                r.status,
                String::from_utf8_lossy(&r.body)
            )),
            // Refused and closed with the body unread: a reset can take the answer with it.
            Ok(Err(_)) => Outcome::Expected("closed (reset; the answer not seen)"),
            Err(_) => Outcome::Unexpected("no answer within 5 s after a 16 MiB body".into()),
        },
    )
}

/// Requests without credentials on one keep-alive connection until the end.
async fn no_creds(c: &mut Conn<'_>, t: &Target, until: Instant) -> Result<Outcome, Outcome> {
    let protected = t.password.is_some();
    let body = b"{\"key_class\":\"customer\",\"key\":\"1\"}";
    let mut i = 0u64;
    while Instant::now() < until {
        i += 1;
        let (req, want) = match (i % 4, protected) {
            (0, true) => {
                let mut r = request(
                    "POST",
                    "/v1/check",
                    None,
                    &format!(
                        "Content-Type: application/json\r\nContent-Length: {}\r\n",
                        body.len()
                    ),
                );
                r.extend_from_slice(body);
                (r, 401)
            }
            (1, true) => (
                request("GET", "/metrics", None, ""),
                if t.metrics_open { 200 } else { 401 },
            ),
            (2, true) => (
                request("POST", "/v1/reload", None, "Content-Length: 0\r\n"),
                401,
            ),
            (1, false) => (request("GET", "/metrics", None, ""), 200),
            _ => (request("GET", "/healthz", None, ""), 200),
        };
        if c.send(&req).await.is_err() {
            return Ok(Outcome::Unexpected("closed while sending".into()));
        }
        match timeout(WAIT, super::probe::read_response(&mut c.s, &mut c.buf)).await {
            Ok(Ok(r)) if r.status == want => {
                if want == 401 && !String::from_utf8_lossy(&r.body).starts_with("{\"error\":") {
                    return Ok(Outcome::Unexpected(format!(
                        "401 without the JSON error body: {:.120}",
                        String::from_utf8_lossy(&r.body)
                    )));
                }
            }
            Ok(Ok(r)) => {
                return Ok(Outcome::Unexpected(format!(
                    "{} (wanted {want}) {:.120}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                )))
            }
            Ok(Err(e)) => return Ok(Outcome::Unexpected(e)),
            Err(_) => return Ok(Outcome::Unexpected("no answer within 5 s".into())),
        }
    }
    Ok(Outcome::Expected(if protected {
        "every request refused (401), /healthz open"
    } else {
        "answered (no password set)"
    }))
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
