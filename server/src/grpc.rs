//! Envoy's rate limit service beside RESP and HTTP: [`envoy`] builds it from `--envoy-config`
//! (the HTTP listener then serves `POST /json` and `GET /healthcheck` too), and [`spawn`]
//! starts its gRPC listener (`--grpc`), behind the server's guard like every listener. It binds
//! before [`spawn`] returns (so that a bad address fails the start), runs on its own thread,
//! answers from the shared state, and stops accepting when the server's shutdown signal turns
//! `true`; [`start`] joins the thread before it writes the final snapshot.
//!
//! [`start`]: crate::start

use crate::listen::stopped;
use crate::state::Server;
use crate::{envoy, ServeArgs, ServeError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// How long calls in flight may take to finish after the shutdown signal.
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The Envoy service `--envoy-config` asks for (`None` without it). A `--grpc` without
/// `--envoy-config` is refused, as is a configuration that does not load.
pub(crate) fn envoy(args: &ServeArgs) -> Result<Option<Arc<envoy::Envoy>>, ServeError> {
    let path = match (args.grpc, &args.envoy_config) {
        (None, None) => return Ok(None),
        (Some(a), None) => {
            return Err(ServeError::Other(format!(
                "--grpc {a}: give the rate limit configuration with --envoy-config FILE_OR_DIR"
            )))
        }
        (_, Some(p)) => p,
    };
    let settings = envoy::Settings::from_env().map_err(ServeError::Other)?;
    let cfg = envoy::load_with(path, settings.load_options())
        .map_err(|e| ServeError::Other(e.to_string()))?;
    let service = envoy::Envoy::new(&cfg, settings)
        .map_err(|e| ServeError::Other(format!("{}: {e}", path.display())))?;
    tracing::info!(config = %path.display(), domains = cfg.domains.len(), "envoy rate limit configuration loaded");
    Ok(Some(Arc::new(service)))
}

/// The gRPC listener's thread and bound address.
pub(crate) type Grpc = (Vec<JoinHandle<()>>, Option<std::net::SocketAddr>);

/// Starts the gRPC listener if `--grpc` was given. Called once by `start`, after the RESP and
/// HTTP listeners are bound.
pub(crate) fn spawn(shared: &Arc<Server>, args: &ServeArgs) -> Result<Grpc, ServeError> {
    let (Some(addr), Some(service)) = (args.grpc, shared.envoy.clone()) else {
        return Ok((Vec::new(), None));
    };
    // Bound as the other listeners are (SO_REUSEADDR, a backlog of 1024).
    let listener = crate::listen::listener("--grpc", addr, false)?;
    let bound = listener
        .local_addr()
        .map_err(|e| ServeError::Bind("--grpc", addr, e))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(crate::trim::park)
        .build()
        .map_err(ServeError::Runtime)?;
    let gate = envoy::grpc::Gate {
        guard: shared.guard.clone(),
        auth: shared.http.auth.clone(),
        tls: shared.tls.as_ref().map(|t| t.grpc.clone()),
        max_header_bytes: shared.http.max_header_bytes,
        ready: Some(readiness(shared, &rt)),
    };
    let mut rx = shared.shutdown.subscribe();
    let mut rx_grace = shared.shutdown.subscribe();
    tracing::info!(grpc = %bound, "envoy rate limit service (gRPC)");
    let t = std::thread::Builder::new()
        .name("envoy-grpc".into())
        .spawn(move || {
            rt.block_on(async move {
                let l = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "envoy gRPC listener");
                        return;
                    }
                };
                let serve = envoy::grpc::serve_with(
                    l,
                    service,
                    async move { stopped(&mut rx).await },
                    gate,
                );
                // Envoy keeps its connection open: after the shutdown signal, calls in
                // flight get GRACE to finish, then the runtime closes what is left.
                let grace = async move {
                    stopped(&mut rx_grace).await;
                    tokio::time::sleep(GRACE).await;
                };
                tokio::select! {
                    () = serve => {}
                    _ = grace => tracing::info!("envoy gRPC: connections closed after the grace period"),
                }
            })
        })
        .map_err(ServeError::Runtime)?;
    Ok((vec![t], Some(bound)))
}

/// The server's readiness as a watch channel for the health service: checked at start, then
/// every [`crate::ready::POLL`] on `rt` (the gRPC listener's runtime).
fn readiness(
    srv: &Arc<Server>,
    rt: &tokio::runtime::Runtime,
) -> tokio::sync::watch::Receiver<bool> {
    let first = rt.block_on(crate::ready::check(srv)).is_ok();
    let (tx, rx) = tokio::sync::watch::channel(first);
    let srv = srv.clone();
    rt.spawn(async move {
        loop {
            tokio::time::sleep(crate::ready::POLL).await;
            let now = crate::ready::check(&srv).await.is_ok();
            tx.send_if_modified(|was| std::mem::replace(was, now) != now);
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}
