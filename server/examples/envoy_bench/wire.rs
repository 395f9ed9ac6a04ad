//! The same checks as the gRPC bench ([`super::grpc`]) over the other listeners of
//! `turnstile serve`, for the rows beside gRPC in one run: `POST /json` (Envoy's request in
//! proto3 JSON, the same decision code as gRPC), `TURNSTILE.CHECK` over RESP and `POST
//! /v1/check` (the rules engine, on the rules `import_to_rules` makes of the bench
//! configuration: the same fixed-window limit per `client` value).
//!
//! The server is the real one (`turnstile_server::start`): one worker (`--workers 1`, per-core, so
//! pinned to the first core) serving RESP and HTTP. The load generator is one current-thread
//! tokio runtime pinned to another core, with `streams` connections each keeping one request
//! in flight (no pipelining: a call's latency is its round trip). Server CPU is the worker
//! thread's own time on CPU (`/proc/self/task/TID/schedstat`) over the run.

use super::grpc::{Report, BENCH_CONFIG};
use hdrhistogram::Histogram;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turnstile_server::{start, RuntimeKind, ServeArgs};

/// Which listener and request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// `POST /json`: Envoy's request in proto3 JSON.
    Json,
    /// `TURNSTILE.CHECK api_key cN` over RESP.
    Resp,
    /// `POST /v1/check` `{"key_class":"api_key","key":"cN"}`.
    Check,
}

impl Wire {
    /// The row's label.
    pub fn label(self) -> &'static str {
        match self {
            Wire::Json => "HTTP POST /json",
            Wire::Resp => "RESP TURNSTILE.CHECK",
            Wire::Check => "HTTP POST /v1/check",
        }
    }
}

/// Nanoseconds on CPU of this process's thread named `name` (Linux; 0 if not found).
fn thread_ns(name: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    for t in dir.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            return s
                .split_whitespace()
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
        }
    }
    0
}

/// One measurement over `wire`. See the module docs.
pub fn run(
    wire: Wire,
    streams: usize,
    keys: usize,
    duration: Duration,
    max_calls: u64,
    client_core: Option<usize>,
) -> Result<Report, String> {
    let dir = std::env::temp_dir().join(format!("turnstile-wire-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let yaml = dir.join("bench.yaml");
    let rules = dir.join("bench.toml");
    let cfg = turnstile_server::envoy::config::parse("bench.yaml", BENCH_CONFIG)
        .map_err(|e| e.to_string())?;
    std::fs::write(&yaml, BENCH_CONFIG).map_err(|e| e.to_string())?;
    std::fs::write(&rules, turnstile_server::envoy::import_to_rules(&cfg))
        .map_err(|e| e.to_string())?;
    let mut a = ServeArgs::new();
    a.resp = "127.0.0.1:0".parse().expect("an address");
    a.http = "127.0.0.1:0".parse().expect("an address");
    a.workers = Some(1);
    a.runtime = RuntimeKind::PerCore;
    a.rules = Some(rules);
    a.envoy_config = Some(yaml);
    a.watch_every = Duration::ZERO;
    a.throttle_keys = 1024;
    let server = start(a).map_err(|e| e.to_string())?;
    let addr = match wire {
        Wire::Resp => server.resp,
        Wire::Json | Wire::Check => server.http,
    };
    // The worker thread's name as the kernel keeps it (15 bytes).
    let worker = "turnstile-worker-0"[..15].to_string();
    let cpu0 = thread_ns(&worker);
    let client = std::thread::spawn(move || -> Result<Report, String> {
        super::grpc::pin(client_core);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(load(
            wire,
            addr,
            streams.max(1),
            keys.max(1),
            duration,
            max_calls,
        ))
    });
    let report = client
        .join()
        .map_err(|_| "the load generator panicked".to_string())?;
    let cpu = thread_ns(&worker).saturating_sub(cpu0);
    server.stop();
    let _ = server.join();
    let _ = std::fs::remove_dir_all(&dir);
    report.map(|r| Report {
        server_cpu_ns: cpu,
        ..r
    })
}

/// The bytes of call `i`'s request.
fn request(wire: Wire, i: usize, keys: usize) -> Vec<u8> {
    let v = format!("c{}", i % keys);
    let http = |path: &str, body: String| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    match wire {
        Wire::Resp => format!(
            "*3\r\n$15\r\nTURNSTILE.CHECK\r\n$7\r\napi_key\r\n${}\r\n{v}\r\n",
            v.len()
        )
        .into_bytes(),
        Wire::Json => http(
            "/json",
            format!(
                r#"{{"domain":"bench","descriptors":[{{"entries":[{{"key":"client","value":"{v}"}}]}}],"hitsAddend":1}}"#
            ),
        ),
        Wire::Check => http(
            "/v1/check",
            format!(r#"{{"key_class":"api_key","key":"{v}"}}"#),
        ),
    }
}

/// Reads one reply into `buf` (cleared first): whether it says the call succeeded.
async fn reply(
    wire: Wire,
    s: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> Result<bool, String> {
    buf.clear();
    loop {
        if let Some(ok) = whole(wire, buf) {
            return Ok(ok);
        }
        if s.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("the server closed the connection".into());
        }
    }
}

/// `Some(success)` once `b` holds a whole reply.
fn whole(wire: Wire, b: &[u8]) -> Option<bool> {
    let lines = || b.windows(2).filter(|w| w == b"\r\n").count();
    match wire {
        // `*6`, five integers, then the rule: `$-1` (none) or `$N` and its line.
        Wire::Resp => {
            let n = lines();
            let ok = b.starts_with(b"*6\r\n:1\r\n");
            if n >= 7 && (n >= 8 || b.windows(5).any(|w| w == b"$-1\r\n")) {
                Some(ok)
            } else {
                None
            }
        }
        Wire::Json | Wire::Check => {
            let end = b.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
            let head = std::str::from_utf8(&b[..end]).ok()?.to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())?;
            (b.len() >= end + len).then(|| head.starts_with("http/1.1 200"))
        }
    }
}

async fn load(
    wire: Wire,
    addr: SocketAddr,
    streams: usize,
    keys: usize,
    duration: Duration,
    max_calls: u64,
) -> Result<Report, String> {
    let per_stream = max_calls.div_ceil(streams as u64);
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(streams);
    for st in 0..streams {
        let reqs: Vec<Vec<u8>> = (0..keys.div_ceil(streams))
            .map(|k| request(wire, st + k * streams, keys))
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let (mut n, mut errors) = (0u64, 0u64);
            let mut buf = Vec::with_capacity(1024);
            let mut i = 0;
            while n + errors < per_stream && Instant::now() < deadline {
                let t = Instant::now();
                s.write_all(&reqs[i % reqs.len()])
                    .await
                    .map_err(|e| e.to_string())?;
                i += 1;
                if reply(wire, &mut s, &mut buf).await? {
                    n += 1;
                    let _ = h.record((t.elapsed().as_nanos() as u64).max(1));
                } else {
                    errors += 1;
                }
            }
            Ok::<_, String>((h, n, errors))
        }));
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let (mut calls, mut errors) = (0, 0);
    for t in tasks {
        let (th, n, e) = t.await.map_err(|e| e.to_string())??;
        h.add(th).map_err(|e| e.to_string())?;
        calls += n;
        errors += e;
    }
    Ok(Report::new(streams, calls, errors, start.elapsed(), &h))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short run of each: every call answered, none failed, the worker's CPU seen.
    #[test]
    fn each_wire_answers() {
        for wire in [Wire::Resp, Wire::Json, Wire::Check] {
            let r = run(wire, 4, 100, Duration::from_secs(5), 200, None).unwrap();
            assert_eq!((r.calls, r.errors), (200, 0), "{wire:?}");
            assert!(r.server_cpu_ns > 0, "{wire:?}");
        }
    }
}
