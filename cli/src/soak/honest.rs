//! The honest clients: `CL.THROTTLE` over RESP (redis-rs, one multiplexed connection each),
//! `POST /v1/check` over HTTP (hyper's client, one keep-alive connection each) and Envoy's
//! `ShouldRateLimit` over gRPC ([`grpc`]), each sending one request at a time at a fixed pace,
//! recording every latency (hdrhistogram), and keeping what each key was admitted, so that
//! the counts can be checked against the server's afterwards.
//!
//! Keys: each RESP client owns [`KEYS`] keys of one parameter set with a budget that does not
//! refill during a soak ([`BURST`] + 1 requests, then one more every [`PERIOD`] s), sends one
//! request to each at its start, and then half its requests to its first key, a quarter to
//! the second, and so on: at the default pace the first keys are spent and denied, the others
//! partly used, so that both what was admitted and what was refused are checked. The HTTP
//! clients check customer ids of their own (numbers from the run's id, not used by anything
//! else).

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{say, Shared, SoakArgs};

mod grpc;

/// Keys per RESP client.
pub const KEYS: usize = 16;
/// The honest keys' `max_burst`: each admits `BURST + 1` requests.
pub const BURST: i64 = 999;
/// The honest keys' period (s) for one request: a key gains one request back every 11.6 days,
/// so that nothing is given back during a soak.
pub const PERIOD: i64 = 1_000_000;
/// How long one honest request may take before it counts as an error.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Latencies of one kind of honest request: the current interval's (taken by the sampler)
/// and the current phase's.
pub struct Recorder {
    inner: Mutex<Hists>,
}

struct Hists {
    interval: Histogram<u64>,
    phases: Vec<Histogram<u64>>,
    phase: usize,
}

/// A histogram of latencies in ns, 1 ns to 60 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

impl Recorder {
    pub fn new(phases: usize) -> Self {
        Self {
            inner: Mutex::new(Hists {
                interval: histogram(),
                phases: (0..phases).map(|_| histogram()).collect(),
                phase: 0,
            }),
        }
    }

    pub fn record(&self, d: Duration) {
        let ns = (d.as_nanos() as u64).clamp(1, 60_000_000_000);
        let mut h = self.inner.lock().expect("not poisoned");
        let p = h.phase;
        // Within the bounds (clamped above): recording cannot fail.
        let _ = h.interval.record(ns);
        let _ = h.phases[p].record(ns);
    }

    /// The latencies since the last call.
    pub fn take_interval(&self) -> Histogram<u64> {
        let mut h = self.inner.lock().expect("not poisoned");
        std::mem::replace(&mut h.interval, histogram())
    }

    /// From now on, latencies count for phase `p`.
    pub fn set_phase(&self, p: usize) {
        self.inner.lock().expect("not poisoned").phase = p;
    }

    /// Phase `p`'s latencies.
    pub fn phase(&self, p: usize) -> Histogram<u64> {
        self.inner.lock().expect("not poisoned").phases[p].clone()
    }
}

/// What one honest client saw.
#[derive(Default, Debug, Clone)]
pub struct Seen {
    /// Per key: requests admitted.
    pub admitted: Vec<u64>,
    /// Per key: requests whose reply never came (an error or a timeout after sending it): the
    /// server may have counted them.
    pub unknown: Vec<u64>,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    /// The first few errors, as said.
    pub samples: Vec<String>,
}

impl Seen {
    fn new(keys: usize) -> Self {
        Self {
            admitted: vec![0; keys],
            unknown: vec![0; keys],
            ..Self::default()
        }
    }

    fn error(&mut self, key: usize, e: String) {
        self.unknown[key] += 1;
        self.failed(e);
    }

    /// A request of `key` answered: admitted or not.
    fn answered(&mut self, key: usize, allowed: bool) {
        if allowed {
            self.allowed += 1;
            self.admitted[key] += 1;
        } else {
            self.denied += 1;
        }
    }

    /// An error before any request was sent (no connection): nothing the server counted.
    fn failed(&mut self, e: String) {
        self.errors += 1;
        if self.samples.len() < 3 {
            self.samples.push(e);
        }
    }
}

/// Which of a client's keys its `i`-th request (from 1) goes to: its first `keys` requests one
/// to each key, so that the server holds every honest key from the quiet run's first moments
/// and the idle RSS includes them (a key first sent minutes later would count as what the
/// attack left); then half to the first, a quarter to the second, ...
pub fn key_of(i: u64, keys: usize) -> usize {
    match usize::try_from(i) {
        Ok(n @ 1..) if n <= keys => n - 1,
        _ => (i.saturating_sub(keys as u64).trailing_zeros() as usize).min(keys - 1),
    }
}

/// The key names of RESP client `client` of run `run`.
pub fn resp_keys(run: u64, client: usize) -> Vec<String> {
    (0..KEYS)
        .map(|k| format!("soak:{run}:{client}:{k}"))
        .collect()
}

/// The customer ids of HTTP client `client` of run `run`.
pub fn customers(run: u64, client: usize) -> Vec<u64> {
    (0..KEYS as u64)
        .map(|k| 7_000_000_000_000 + run * 10_000 + client as u64 * 100 + k)
        .collect()
}

/// A redis-rs client for `addr` with the password, if any.
pub fn redis_client(addr: SocketAddr, password: Option<&[u8]>) -> crate::Result<redis::Client> {
    let mut info = redis::IntoConnectionInfo::into_connection_info(format!(
        "redis://{}:{}",
        addr.ip(),
        addr.port()
    ))?;
    if let Some(p) = password {
        let p = std::str::from_utf8(p).map_err(|_| "the password is not UTF-8")?;
        let settings = info.redis_settings().clone().set_password(p);
        info = info.set_redis_settings(settings);
    }
    Ok(redis::Client::open(info)?)
}

/// A multiplexed connection whose replies may take up to [`TIMEOUT`] (redis-rs's default
/// gives up after 500 ms: a slow reply is a latency to record here, not an error).
pub async fn redis_connection(
    client: &redis::Client,
) -> crate::Result<redis::aio::MultiplexedConnection> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(TIMEOUT))
        .set_connection_timeout(Some(TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .map_err(Into::into)
}

/// A `CL.THROTTLE` of the honest keys' parameters (`quantity` 0: a look that spends nothing).
pub fn throttle(key: &str, quantity: i64) -> redis::Cmd {
    let mut c = redis::cmd("CL.THROTTLE");
    c.arg(key).arg(BURST).arg(1).arg(PERIOD).arg(quantity);
    c
}

/// A client's pace: one request every `every` (late ticks delay the next ones, never
/// bunch them) until `stop`.
struct Pace {
    tick: tokio::time::Interval,
    stop: Arc<AtomicBool>,
}

impl Pace {
    fn new(every: Duration, stop: Arc<AtomicBool>) -> Self {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { tick, stop }
    }

    /// Waits for the next request's turn: false once stopped.
    async fn next(&mut self) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return false;
        }
        self.tick.tick().await;
        true
    }
}

/// How late the honest clients' thread wakes up: a timer every millisecond, each wake-up's
/// delay past its deadline recorded until `stop`. The thread runs every honest client, so a
/// late wake-up there is latency the clients measure that the server did not cause (this
/// machine's CPU, or the thread's other clients).
async fn lateness(rec: Arc<Recorder>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let due = tokio::time::Instant::now() + Duration::from_millis(1);
        tokio::time::sleep_until(due).await;
        rec.record(due.elapsed());
    }
}

/// The client's connection in `slot`, made by `connect` if there is none; a failure is
/// counted in `seen` (and the client tries again at its next turn).
async fn connected<'a, C, F>(
    slot: &'a mut Option<C>,
    seen: &mut Seen,
    connect: impl FnOnce() -> F,
) -> Option<&'a mut C>
where
    F: std::future::Future<Output = crate::Result<C>>,
{
    if slot.is_none() {
        match connect().await {
            Ok(c) => *slot = Some(c),
            Err(e) => {
                seen.failed(format!("connect: {e}"));
                return None;
            }
        }
    }
    slot.as_mut()
}

/// One RESP client: a `CL.THROTTLE` every `every` until `stop`.
pub async fn resp_client(
    client: redis::Client,
    keys: Vec<String>,
    every: Duration,
    stop: Arc<AtomicBool>,
    rec: Arc<Recorder>,
) -> Seen {
    let mut seen = Seen::new(keys.len());
    let mut con = None;
    let mut pace = Pace::new(every, stop);
    let mut i = 0u64;
    while pace.next().await {
        let Some(c) = connected(&mut con, &mut seen, || redis_connection(&client)).await else {
            continue;
        };
        i += 1;
        let k = key_of(i, keys.len());
        let t = Instant::now();
        let r: redis::RedisResult<Vec<i64>> = throttle(&keys[k], 1).query_async(c).await;
        let took = t.elapsed();
        match r {
            Ok(v) if v.len() == 5 => {
                rec.record(took);
                seen.answered(k, v[0] == 0);
            }
            Ok(v) => seen.error(k, format!("CL.THROTTLE answered {v:?}")),
            Err(e) => {
                seen.error(k, format!("CL.THROTTLE: {e}"));
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                    con = None;
                }
            }
        }
    }
    seen
}

/// An HTTP/1.1 connection of hyper's client.
type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn http_connect(addr: SocketAddr) -> crate::Result<Sender> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(send)
}

/// `POST /v1/check` for `customer`: whether it was admitted.
async fn check(
    send: &mut Sender,
    addr: SocketAddr,
    password: Option<&[u8]>,
    customer: u64,
) -> crate::Result<bool> {
    let body = format!("{{\"key_class\":\"customer\",\"key\":\"{customer}\"}}");
    let mut req = hyper::Request::post(format!("http://{addr}/v1/check"))
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    if let Some(p) = password {
        let mut v = b"Bearer ".to_vec();
        v.extend_from_slice(p);
        req = req.header("authorization", v);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    send.ready().await.map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    match status {
        200 if text.contains("\"allowed\":true") => Ok(true),
        429 if text.contains("\"allowed\":false") => Ok(false),
        _ => Err(format!("{status} {}", &text[..text.len().min(200)]).into()),
    }
}

/// One HTTP client: a `POST /v1/check` every `every` until `stop`.
pub async fn http_client(
    addr: SocketAddr,
    password: Option<Vec<u8>>,
    customers: Vec<u64>,
    every: Duration,
    stop: Arc<AtomicBool>,
    rec: Arc<Recorder>,
) -> Seen {
    let mut seen = Seen::new(customers.len());
    let mut send = None;
    let mut pace = Pace::new(every, stop);
    let mut i = 0u64;
    while pace.next().await {
        let connect = || async {
            tokio::time::timeout(TIMEOUT, http_connect(addr))
                .await
                .unwrap_or_else(|_| Err("no connection within 10 s".into()))
        };
        let Some(s) = connected(&mut send, &mut seen, connect).await else {
            continue;
        };
        i += 1;
        let k = key_of(i, customers.len());
        let t = Instant::now();
        let r = tokio::time::timeout(TIMEOUT, check(s, addr, password.as_deref(), customers[k]))
            .await
            .unwrap_or_else(|_| Err("no answer within 10 s".into()));
        let took = t.elapsed();
        match r {
            Ok(allowed) => {
                rec.record(took);
                seen.answered(k, allowed);
            }
            Err(e) => {
                seen.error(k, format!("POST /v1/check: {e}"));
                send = None;
            }
        }
    }
    seen
}

/// What the honest clients saw, per kind.
pub struct HonestRun {
    pub resp: Vec<Seen>,
    pub http: Vec<Seen>,
    pub grpc: Vec<Seen>,
}

/// The honest clients, on a thread of their own, until stopped.
pub(super) struct Honest {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<HonestRun>,
    resp_keys: Vec<Vec<String>>,
}

impl Honest {
    pub(super) fn start(
        a: &SoakArgs,
        sh: &Arc<Shared>,
        client: redis::Client,
        run_id: u64,
        password: Option<Vec<u8>>,
    ) -> crate::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let resp_keys: Vec<Vec<String>> = (0..a.honest_resp as usize)
            .map(|c| resp_keys(run_id, c))
            .collect();
        let customers: Vec<Vec<u64>> = (0..a.honest_http as usize)
            .map(|c| customers(run_id, c))
            .collect();
        let (st, sh, keys) = (stop.clone(), sh.clone(), resp_keys.clone());
        let (http, grpc, every) = (a.http, a.grpc, a.every);
        let grpcs = if grpc.is_some() { a.honest_grpc } else { 0 } as usize;
        let thread = std::thread::Builder::new()
            .name("soak-honest".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a tokio runtime");
                rt.block_on(async move {
                    let resp: Vec<_> = keys
                        .into_iter()
                        .map(|k| {
                            let (c, rec) = (client.clone(), sh.resp_rec.clone());
                            tokio::spawn(resp_client(c, k, every, st.clone(), rec))
                        })
                        .collect();
                    let mut https = Vec::new();
                    if let Some(h) = http {
                        https = customers
                            .into_iter()
                            .map(|c| {
                                let (pw, rec) = (password.clone(), sh.http_rec.clone());
                                tokio::spawn(http_client(h, pw, c, every, st.clone(), rec))
                            })
                            .collect();
                    }
                    tokio::spawn(lateness(sh.late_rec.clone(), st.clone()));
                    let grpcs: Vec<_> = (0..grpcs)
                        .filter_map(|c| {
                            let (pw, rec) = (password.clone(), sh.grpc_rec.clone());
                            let run = (run_id, c);
                            let client = grpc::grpc_client(grpc?, pw, run, every, st.clone(), rec);
                            Some(tokio::spawn(client))
                        })
                        .collect();
                    HonestRun {
                        resp: joined(resp).await,
                        http: joined(https).await,
                        grpc: joined(grpcs).await,
                    }
                })
            })
            .map_err(|e| e.to_string())?;
        say(
            a.json,
            format!(
                "quiet run: {} RESP, {} HTTP and {} gRPC honest clients, one request each every {:?}",
                a.honest_resp,
                if a.http.is_some() { a.honest_http } else { 0 },
                if a.grpc.is_some() { a.honest_grpc } else { 0 },
                a.every
            ),
        );
        Ok(Self {
            stop,
            thread,
            resp_keys,
        })
    }

    /// Stops the clients: what they saw, and the RESP clients' keys.
    pub(super) async fn stop(self) -> crate::Result<(HonestRun, Vec<Vec<String>>)> {
        self.stop.store(true, Ordering::Relaxed);
        while !self.thread.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let seen = self
            .thread
            .join()
            .map_err(|_| "an honest client panicked".to_string())?;
        Ok((seen, self.resp_keys))
    }
}

/// What each client saw, in order (a client that panicked saw nothing).
async fn joined(clients: Vec<tokio::task::JoinHandle<Seen>>) -> Vec<Seen> {
    let mut out = Vec::with_capacity(clients.len());
    for j in clients {
        out.push(j.await.unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_halve() {
        let first: Vec<usize> = (1..=KEYS as u64).map(|i| key_of(i, KEYS)).collect();
        assert_eq!(first, (0..KEYS).collect::<Vec<_>>());
        let mut n = [0u64; KEYS];
        for i in KEYS as u64 + 1..=KEYS as u64 + 1024 {
            n[key_of(i, KEYS)] += 1;
        }
        assert_eq!(&n[..4], &[512, 256, 128, 64]);
        assert_eq!(n.iter().sum::<u64>(), 1024);
    }

    #[test]
    fn recorder_phases() {
        let r = Recorder::new(2);
        r.record(Duration::from_micros(100));
        r.set_phase(1);
        r.record(Duration::from_millis(2));
        assert_eq!(r.take_interval().len(), 2);
        assert_eq!(r.take_interval().len(), 0);
        assert_eq!(r.phase(0).len(), 1);
        assert!(r.phase(1).value_at_quantile(0.5) >= 1_990_000);
    }
}
