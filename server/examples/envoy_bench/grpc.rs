//! The `bench` mode: ShouldRateLimit calls per second from a tonic load generator.
//!
//! [`run`] starts the service on one thread pinned to one core (a single-threaded tokio
//! runtime: "one server core") and the load generator on another, also single-threaded and
//! pinned, then drives `streams` concurrent calls over one HTTP/2 connection, each call a
//! single-descriptor request drawn from `keys` distinct values, for `duration` or `max_calls`
//! calls, whichever ends first. Latency is measured per call at the client (send to answer).
//! `main.rs` prints the table of docs/service.md.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile_server::envoy::config::parse;
use turnstile_server::envoy::{Envoy, Settings};

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// Concurrent streams.
    pub streams: usize,
    /// Calls answered.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// CPU time the server thread used over the run, nanoseconds (its own clock, so it holds
    /// on a loaded machine where calls per second do not).
    pub server_cpu_ns: u64,
}

impl Report {
    /// A run's report from its latency histogram (nanoseconds); the server's CPU time is set
    /// by the caller.
    pub fn new(
        streams: usize,
        calls: u64,
        errors: u64,
        elapsed: Duration,
        h: &Histogram<u64>,
    ) -> Self {
        Report {
            streams,
            calls,
            errors,
            elapsed,
            p50_us: h.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: h.value_at_quantile(0.99) as f64 / 1000.0,
            server_cpu_ns: 0,
        }
    }

    /// Calls per second.
    pub fn rate(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }
    /// Server CPU microseconds per call.
    pub fn server_us_per_call(&self) -> f64 {
        self.server_cpu_ns as f64 / 1000.0 / self.calls.max(1) as f64
    }
    /// Calls one fully busy server core would answer per second at that cost.
    pub fn calls_per_server_core(&self) -> f64 {
        1e6 / self.server_us_per_call()
    }
}

/// The configuration the bench loads: one limit high enough never to deny.
pub const BENCH_CONFIG: &str = "domain: bench\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 16000000}\n";

/// The decision alone, without transport: this thread's CPU nanoseconds per
/// `Envoy::should_rate_limit` call over `calls` single-descriptor requests of `keys` values.
pub fn decision_ns(calls: u64, keys: usize) -> Result<f64, String> {
    let cfg = parse("bench.yaml", BENCH_CONFIG).map_err(|e| e.to_string())?;
    let envoy = Envoy::new(&cfg, Settings::default())?;
    let requests = requests(keys.max(1));
    let t0 = thread_cpu_ns();
    for i in 0..calls {
        let r = envoy
            .should_rate_limit(&requests[i as usize % requests.len()])
            .map_err(|e| e.to_string())?;
        std::hint::black_box(r);
    }
    Ok((thread_cpu_ns() - t0) as f64 / calls.max(1) as f64)
}

fn requests(keys: usize) -> Vec<RateLimitRequest> {
    (0..keys)
        .map(|i| RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "client".into(),
                    value: format!("c{i}"),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        })
        .collect()
}

/// This thread's CPU time, nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) fn pin(core: Option<usize>) {
    if let Some(c) = core {
        if let Some(id) =
            core_affinity::get_core_ids().and_then(|v| v.into_iter().find(|i| i.id == c))
        {
            core_affinity::set_for_current(id);
        }
    }
}

/// Runs one measurement. `server_core` / `client_core`: the cores to pin to (`None`: unpinned).
pub fn run(
    streams: usize,
    keys: usize,
    duration: Duration,
    max_calls: u64,
    server_core: Option<usize>,
    client_core: Option<usize>,
) -> Result<Report, String> {
    let cfg = parse("bench.yaml", BENCH_CONFIG).map_err(|e| e.to_string())?;
    let envoy = Arc::new(Envoy::new(&cfg, Settings::default())?);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || -> Result<u64, String> {
        pin(server_core);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let cpu0 = thread_cpu_ns();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
            turnstile_server::envoy::grpc::serve(l, envoy, async {
                let _ = stop_rx.await;
            })
            .await
            .map_err(|e| e.to_string())
        })?;
        Ok(thread_cpu_ns() - cpu0)
    });
    let client = std::thread::spawn(move || -> Result<Report, String> {
        pin(client_core);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(load(addr, streams.max(1), keys.max(1), duration, max_calls))
    });
    let report = client
        .join()
        .map_err(|_| "the load generator panicked".to_string())?;
    let _ = stop_tx.send(());
    let cpu = server
        .join()
        .map_err(|_| "the server panicked".to_string())??;
    report.map(|r| Report {
        server_cpu_ns: cpu,
        ..r
    })
}

async fn load(
    addr: std::net::SocketAddr,
    streams: usize,
    keys: usize,
    duration: Duration,
    max_calls: u64,
) -> Result<Report, String> {
    let mut client = None;
    for _ in 0..100 {
        match RateLimitServiceClient::connect(format!("http://{addr}")).await {
            Ok(c) => {
                client = Some(c);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let client = client.ok_or("cannot connect to the bench server")?;
    let requests: Arc<Vec<RateLimitRequest>> = Arc::new(requests(keys));
    let per_stream = max_calls.div_ceil(streams as u64);
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(streams);
    for s in 0..streams {
        let mut c = client.clone();
        let reqs = requests.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let (mut n, mut errors) = (0u64, 0u64);
            let mut i = s;
            while n + errors < per_stream && Instant::now() < deadline {
                let r = reqs[i % reqs.len()].clone();
                i = i.wrapping_add(streams);
                let t = Instant::now();
                match c.should_rate_limit(r).await {
                    Ok(_) => {
                        n += 1;
                        let _ = h.record((t.elapsed().as_nanos() as u64).max(1));
                    }
                    Err(_) => errors += 1,
                }
            }
            (h, n, errors)
        }));
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let (mut calls, mut errors) = (0, 0);
    for t in tasks {
        let (th, n, e) = t.await.map_err(|e| e.to_string())?;
        h.add(th).map_err(|e| e.to_string())?;
        calls += n;
        errors += e;
    }
    Ok(Report::new(streams, calls, errors, start.elapsed(), &h))
}
