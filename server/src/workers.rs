//! Where connections run: thread-per-core on io_uring (`--runtime uring`, the default, Linux),
//! thread-per-core on tokio (`--runtime per-core`, and where io_uring is unavailable) or one
//! multi-thread tokio runtime (`--runtime multi-thread`).
//!
//! Per core: worker i is pinned to core i mod cores (core_affinity), runs a current-thread
//! runtime, and owns one RESP and one HTTP listener bound with `SO_REUSEPORT` to the same
//! addresses as every other worker's; the kernel spreads new connections over the listeners,
//! and a connection then lives on one core. The engine and the stores are shared (lock-free).
//! The first listener is bound before the others, so that a port 0 becomes one real port that
//! the others join.
//!
//! On io_uring, worker i runs the RESP listener i on its own ring (resp::uring); the HTTP
//! listeners (and --admin) are served by one multi-thread tokio runtime of as many threads,
//! which also runs the RESP rules commands whose counts live in Redis.

use crate::listen::accept::{accept_loop, Accepted};
use crate::listen::{Kind, Refusal, Ticket};
use crate::resp::serve::{accept, Peer};
use crate::state::{next_conn_id, Server};
use crate::{http, RuntimeKind, ServeArgs, ServeError};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A listening socket on `addr`, with `SO_REUSEPORT` if `reuse_port`.
pub(crate) fn listener(
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

/// Accepts RESP connections until shutdown.
async fn accept_resp(srv: Arc<Server>, l: tokio::net::TcpListener) {
    let mut stop = srv.shutdown.subscribe();
    let guard = srv.guard.clone();
    accept_loop(&l, Kind::Resp, &guard, &mut stop, &mut RespListener(srv)).await;
}

/// The RESP listener's side of the accept loop.
struct RespListener(Arc<Server>);

impl Accepted for RespListener {
    fn admitted(&mut self, s: tokio::net::TcpStream, addr: SocketAddr, ticket: Ticket) {
        let peer = Peer {
            id: next_conn_id(),
            addr: Some(addr),
            local: s.local_addr().ok(),
            fd: Some(std::os::fd::AsRawFd::as_raw_fd(&s)),
        };
        tokio::spawn(accept(self.0.clone(), s, peer, ticket));
    }

    fn refused(&mut self, s: tokio::net::TcpStream, _: Refusal) {
        refuse_resp(&self.0, &s);
    }
}

/// Tells a refused RESP client why, as Redis does: one write to a new socket, whose send
/// buffer is empty (plaintext only: a TLS client would read it as a broken handshake).
pub(crate) fn refuse_resp(srv: &Server, s: &impl std::os::fd::AsFd) {
    srv.metrics.add(crate::metrics::C::RejectedConnections, 1);
    if srv.tls.is_none() {
        let _ = socket2::SockRef::from(s).send(b"-ERR max number of clients reached\r\n");
    }
}

/// The addresses the listeners are bound to (the real ports where port 0 was asked).
pub(crate) struct Bound {
    pub(crate) resp: SocketAddr,
    pub(crate) http: SocketAddr,
    pub(crate) admin: Option<SocketAddr>,
}

/// One worker's listeners: RESP, HTTP, and (the first worker only) the --admin listener.
struct Listeners {
    resp: std::net::TcpListener,
    http: std::net::TcpListener,
    admin: Option<std::net::TcpListener>,
}

/// Binds every worker's listeners.
fn bind(
    args: &ServeArgs,
    workers: usize,
    per_core: bool,
) -> Result<(Vec<Listeners>, Bound), ServeError> {
    if per_core {
        // `SO_REUSEPORT` would let this server join the listeners of another one on the same
        // port (a second `turnstile serve`, started by mistake): each would see half of the
        // connections, and keep half of the counts. A listener without it is refused by a
        // port anyone listens on: bound and dropped first, it makes that an error, as it is
        // for one runtime. (Port 0 is a fresh port: nothing to ask.)
        for (flag, addr) in [("--resp", args.resp), ("--http", args.http)] {
            if addr.port() != 0 {
                drop(listener(flag, addr, false)?);
            }
        }
    }
    let first = Listeners {
        resp: listener("--resp", args.resp, per_core)?,
        http: listener("--http", args.http, per_core)?,
        admin: args
            .admin
            .map(|a| listener("--admin", a, false))
            .transpose()?,
    };
    let bound = Bound {
        resp: first.resp.local_addr().map_err(ServeError::Runtime)?,
        http: first.http.local_addr().map_err(ServeError::Runtime)?,
        admin: first
            .admin
            .as_ref()
            .map(|a| a.local_addr())
            .transpose()
            .map_err(ServeError::Runtime)?,
    };
    let mut all = vec![first];
    if per_core {
        for _ in 1..workers {
            all.push(Listeners {
                resp: listener("--resp", bound.resp, true)?,
                http: listener("--http", bound.http, true)?,
                admin: None,
            });
        }
    }
    Ok((all, bound))
}

/// The runtime RESP is served on: `--runtime`, unless it asks for io_uring where it cannot be
/// had (said in one log line).
fn effective(args: &ServeArgs) -> RuntimeKind {
    if args.runtime != RuntimeKind::Uring {
        return args.runtime;
    }
    if args.tls_cert.is_some() {
        tracing::info!("RESP over TLS is served on tokio (--runtime per-core): the io_uring runtime serves plain TCP");
        return RuntimeKind::PerCore;
    }
    #[cfg(target_os = "linux")]
    let why = match crate::resp::uring::available() {
        Ok(()) => return RuntimeKind::Uring,
        Err(why) => why,
    };
    #[cfg(not(target_os = "linux"))]
    let why = "io_uring is Linux's".to_string();
    tracing::warn!(reason = %why, "io_uring is unavailable: RESP is served on tokio (--runtime per-core)");
    RuntimeKind::PerCore
}

/// Binds the listeners and starts the workers. Returns the bound addresses, the threads and the
/// runtime RESP is served on.
pub(crate) fn spawn(
    shared: &Arc<Server>,
    args: &ServeArgs,
    workers: usize,
) -> Result<(Bound, Vec<JoinHandle<()>>, RuntimeKind), ServeError> {
    let kind = effective(args);
    if kind != RuntimeKind::Uring && !args.coalesce.is_zero() {
        tracing::warn!("--coalesce is for the io_uring runtime only: RESP runs on tokio here");
    }
    let per_core = kind != RuntimeKind::MultiThread;
    let (all, bound) = bind(args, workers, per_core)?;
    let mut threads = Vec::new();
    if kind == RuntimeKind::Uring {
        #[cfg(target_os = "linux")]
        threads.extend(spawn_uring(shared, all)?);
    } else if per_core {
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        for (i, l) in all.into_iter().enumerate() {
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
                        .on_thread_park(crate::trim::park)
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            tracing::error!(error = %e, "worker runtime failed to start");
                            return;
                        }
                    };
                    rt.block_on(serve_listeners(shared, l));
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
            .on_thread_park(crate::trim::park)
            .build()
            .map_err(ServeError::Runtime)?;
        let l = all.into_iter().next().expect("one set of listeners");
        let t = std::thread::Builder::new()
            .name("turnstile-runtime".into())
            .spawn(move || {
                rt.block_on(async move {
                    let _ = tokio::spawn(serve_listeners(shared, l)).await;
                });
            })
            .map_err(ServeError::Runtime)?;
        threads.push(t);
    }
    Ok((bound, threads, kind))
}

/// The io_uring workers (one pinned thread per RESP listener) and the tokio runtime of the HTTP
/// listeners and of the calls to Redis.
#[cfg(target_os = "linux")]
fn spawn_uring(
    shared: &Arc<Server>,
    all: Vec<Listeners>,
) -> Result<Vec<JoinHandle<()>>, ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(all.len())
        .thread_name("turnstile-http")
        .enable_all()
        .on_thread_park(crate::trim::park)
        .build()
        .map_err(ServeError::Runtime)?;
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let mut threads = Vec::new();
    let mut web = Vec::new();
    for (i, l) in all.into_iter().enumerate() {
        web.push((l.http, l.admin));
        let (shared, handle, resp) = (shared.clone(), rt.handle().clone(), l.resp);
        let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
        let t = std::thread::Builder::new()
            .name(format!("turnstile-uring-{i}"))
            .spawn(move || {
                if let Some(c) = core {
                    core_affinity::set_for_current(c);
                }
                uring_worker(shared, resp, handle);
            })
            .map_err(ServeError::Runtime)?;
        threads.push(t);
    }
    let shared = shared.clone();
    let t = std::thread::Builder::new()
        .name("turnstile-http".into())
        .spawn(move || {
            rt.block_on(async move {
                let mut served = Vec::new();
                for (h, a) in web {
                    for (l, kind) in [(Some(h), Kind::Http), (a, Kind::Admin)] {
                        let Some(l) = l else { continue };
                        match tokio::net::TcpListener::from_std(l) {
                            Ok(l) => served.push(tokio::spawn(serve_http(shared.clone(), l, kind))),
                            Err(e) => tracing::error!(error = %e, "listener failed"),
                        }
                    }
                }
                for s in served {
                    let _ = s.await;
                }
                // The RESP workers' calls to Redis run here: kept until they are done.
                wait_for_connections(&shared).await;
            });
        })
        .map_err(ServeError::Runtime)?;
    threads.push(t);
    Ok(threads)
}

/// One io_uring worker; if its ring fails, the listener is served on tokio instead.
#[cfg(target_os = "linux")]
fn uring_worker(shared: Arc<Server>, resp: std::net::TcpListener, remote: tokio::runtime::Handle) {
    let ring_side = match resp.try_clone() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "listener failed");
            return;
        }
    };
    let Err(e) = crate::resp::uring::serve(shared.clone(), ring_side, remote) else {
        return;
    };
    if *shared.shutdown.borrow() {
        return;
    }
    tracing::warn!(error = %e, "io_uring worker failed: its RESP listener is served on tokio");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(crate::trim::park)
        .build();
    match (rt, tokio::net::TcpListener::from_std(resp)) {
        (Ok(rt), Ok(l)) => rt.block_on(async move {
            accept_resp(shared.clone(), l).await;
            wait_for_connections(&shared).await;
        }),
        (Err(e), _) | (_, Err(e)) => tracing::error!(error = %e, "worker runtime failed to start"),
    }
}

/// One worker's listeners served until shutdown; then waits (bounded) for this runtime's RESP
/// connections to finish what they read.
async fn serve_listeners(shared: Arc<Server>, l: Listeners) {
    let tokio_listener = |l: std::net::TcpListener| tokio::net::TcpListener::from_std(l);
    let (r, h, a) = match (
        tokio_listener(l.resp),
        tokio_listener(l.http),
        l.admin.map(tokio_listener).transpose(),
    ) {
        (Ok(r), Ok(h), Ok(a)) => (r, h, a),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            tracing::error!(error = %e, "listener failed");
            return;
        }
    };
    let web = tokio::spawn(serve_http(shared.clone(), h, Kind::Http));
    let admin = a.map(|a| tokio::spawn(serve_http(shared.clone(), a, Kind::Admin)));
    accept_resp(shared.clone(), r).await;
    let _ = web.await;
    if let Some(a) = admin {
        let _ = a.await;
    }
    wait_for_connections(&shared).await;
}

/// The API's HTTP listener or --admin, each trusted as its flags say.
async fn serve_http(shared: Arc<Server>, l: tokio::net::TcpListener, kind: Kind) {
    let trusted = match kind {
        Kind::Admin => shared.http.admin_trusted,
        _ => shared.http.trusted,
    };
    http::serve(shared, l, kind, trusted).await;
}

/// Connections see the shutdown signal and stop after answering what they read; this gives
/// them a moment (at most 5 s) to write.
async fn wait_for_connections(shared: &Server) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while shared.guard.open(Kind::Resp) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
