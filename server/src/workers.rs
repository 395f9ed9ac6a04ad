//! Where connections run: thread-per-core (`--runtime per-core`, the default) or one
//! multi-thread tokio runtime (`--runtime multi-thread`).
//!
//! Per core: worker i is pinned to core i mod cores (core_affinity), runs a current-thread
//! runtime, and owns one RESP and one HTTP listener bound with `SO_REUSEPORT` to the same
//! addresses as every other worker's; the kernel spreads new connections over the listeners,
//! and a connection then lives on one core. The engine and the stores are shared (lock-free).
//! The first listener is bound before the others, so that a port 0 becomes one real port that
//! the others join.

use crate::{conn, http, RuntimeKind, ServeError, Shared};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A listening socket on `addr`, with `SO_REUSEPORT` if `reuse_port`.
fn listener(
    flag: &'static str,
    addr: SocketAddr,
    reuse_port: bool,
) -> Result<std::net::TcpListener, ServeError> {
    let bind = |addr| -> std::io::Result<std::net::TcpListener> {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        #[cfg(unix)]
        if reuse_port {
            s.set_reuse_port(true)?;
        }
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        s.listen(1024)?;
        Ok(s.into())
    };
    bind(addr).map_err(|e| ServeError::Bind(flag, addr, e))
}

static CONN_ID: AtomicU64 = AtomicU64::new(1);

/// Accepts RESP connections until shutdown.
async fn accept_resp(shared: Arc<Shared>, l: tokio::net::TcpListener) {
    let mut stop = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok((s, _)) => {
                    // Relaxed: a unique number.
                    let id = CONN_ID.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(conn::serve(shared.clone(), s, id));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            _ = crate::stopped(&mut stop) => return,
        }
    }
}

/// Binds the listeners and starts the workers. Returns the bound addresses and the threads.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    workers: usize,
) -> Result<(SocketAddr, SocketAddr, Vec<JoinHandle<()>>), ServeError> {
    let per_core = shared.args.runtime == RuntimeKind::PerCore;
    if per_core {
        // `SO_REUSEPORT` would let this server join the listeners of another one on the same
        // port (a second `turnstile serve`, started by mistake): each would see half of the
        // connections, and keep half of the counts. A listener without it is refused by a
        // port anyone listens on: bound and dropped first, it makes that an error, as it is
        // for one runtime. (Port 0 is a fresh port: nothing to ask.)
        for (flag, addr) in [("--resp", shared.args.resp), ("--http", shared.args.http)] {
            if addr.port() != 0 {
                drop(listener(flag, addr, false)?);
            }
        }
    }
    let first_resp = listener("--resp", shared.args.resp, per_core)?;
    let first_http = listener("--http", shared.args.http, per_core)?;
    let resp = first_resp.local_addr().map_err(ServeError::Runtime)?;
    let http_addr = first_http.local_addr().map_err(ServeError::Runtime)?;
    let mut threads = Vec::new();
    if per_core {
        let mut pairs = vec![(first_resp, first_http)];
        for _ in 1..workers {
            pairs.push((
                listener("--resp", resp, true)?,
                listener("--http", http_addr, true)?,
            ));
        }
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        for (i, (r, h)) in pairs.into_iter().enumerate() {
            let shared = shared.clone();
            let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
            let t = std::thread::Builder::new()
                .name(format!("turnstile-worker-{i}"))
                .spawn(move || {
                    if let Some(c) = core {
                        core_affinity::set_for_current(c);
                    }
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            tracing::error!(error = %e, "worker runtime failed to start");
                            return;
                        }
                    };
                    rt.block_on(serve_pair(shared, r, h));
                })
                .map_err(ServeError::Runtime)?;
            threads.push(t);
        }
    } else {
        let shared = shared.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name("turnstile-worker")
            .enable_all()
            .build()
            .map_err(ServeError::Runtime)?;
        let t = std::thread::Builder::new()
            .name("turnstile-runtime".into())
            .spawn(move || {
                rt.block_on(async move {
                    let h = tokio::spawn(serve_pair(shared, first_resp, first_http));
                    let _ = h.await;
                });
            })
            .map_err(ServeError::Runtime)?;
        threads.push(t);
    }
    Ok((resp, http_addr, threads))
}

/// One RESP and one HTTP listener served until shutdown; then waits (bounded) for this
/// runtime's RESP connections to finish what they read.
async fn serve_pair(shared: Arc<Shared>, r: std::net::TcpListener, h: std::net::TcpListener) {
    let (r, h) = match (
        tokio::net::TcpListener::from_std(r),
        tokio::net::TcpListener::from_std(h),
    ) {
        (Ok(r), Ok(h)) => (r, h),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "listener failed");
            return;
        }
    };
    let web = tokio::spawn(http::serve(shared.clone(), h));
    accept_resp(shared.clone(), r).await;
    let _ = web.await;
    // Connections see the same signal and stop after answering what they read; give them a
    // moment to write.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while shared.connections.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
