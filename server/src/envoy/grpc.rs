//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic.
//!
//! The types and the service glue are `envoy-types`' generated code (prost + tonic, no
//! protoc). A malformed message is refused by tonic's decoder with `INVALID_ARGUMENT`
//! (`INTERNAL` for some framing errors) before it reaches [`Envoy`]. An empty domain or
//! descriptor list is refused with `UNKNOWN` and upstream's message, as upstream's Go service
//! answers it (a plain error, which grpc-go sends as `UNKNOWN`); too many descriptors, an
//! oversized entry or an unknown override unit with `INVALID_ARGUMENT`.

use super::engine::Envoy;
use super::limits::InvalidRequest;
use crate::state::{accepted_or_wait, served};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hyper::server::conn::http2::Builder as Http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use tonic::service::interceptor::{InterceptedService, Interceptor};
use tonic::{Request, Response, Status};

/// The largest request message accepted, in bytes (tonic's default is 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The gRPC service over one [`Envoy`].
#[derive(Clone)]
pub struct Grpc {
    envoy: Arc<Envoy>,
}

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.envoy
            .should_rate_limit(request.get_ref())
            .map(Response::new)
            .map_err(|e| match e {
                InvalidRequest::Upstream(m) => Status::unknown(m),
                InvalidRequest::Invalid(m) => Status::invalid_argument(m),
            })
    }
}

/// The tonic service to mount on the `--grpc` listener
/// (`tonic::transport::Server::builder().add_service(envoy::service(e))`).
pub fn service(envoy: Arc<Envoy>) -> RateLimitServiceServer<Grpc> {
    RateLimitServiceServer::new(Grpc { envoy }).max_decoding_message_size(MAX_MESSAGE_BYTES)
}

/// Whether a bearer token may call.
pub type Authorize = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// What guards a gRPC listener: TLS, a password in the `authorization` metadata, a bound on
/// connections. The default guards nothing (tests and benchmarks).
#[derive(Clone, Default)]
pub struct Guard {
    /// TLS (ALPN `h2`): every connection's handshake must finish within 10 s.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Whether a request's `authorization` value (after `Bearer `) may call; `None`: every
    /// request may. A refused call gets `UNAUTHENTICATED`.
    pub authorize: Option<Authorize>,
    /// The most connections at once (more are closed at once); `0`: no bound.
    pub max_connections: usize,
}

/// A connection counted for [`Guard::max_connections`].
struct Slot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        // Relaxed: a count; no other memory is published through it.
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Serves [`service`] alone on `listener` until `shutdown` completes, then lets the calls in
/// flight finish (graceful shutdown: each connection gets a GOAWAY). Unguarded: see
/// [`serve_with`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    envoy: Arc<Envoy>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    serve_with(listener, envoy, shutdown, Guard::default()).await
}

/// [`serve`] behind `guard`.
///
/// The service is mounted on hyper's HTTP/2 server connection directly rather than through
/// `tonic::transport::Server`, whose `Routes` put every call through axum's router (route
/// lookup, a cloned boxed service and more futures) and a gRPC-timeout layer. With one service
/// on the listener there is nothing to route: the generated server matches the method path
/// itself (UNIMPLEMENTED for any other). Measured with `envoy_bench` (docs/service.md).
/// HTTP/1 is refused as tonic's server refuses it (HTTP/2 only, prior knowledge). A request's
/// headers are bounded (16 KiB), and so are the streams of a connection (100).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    envoy: Arc<Envoy>,
    shutdown: impl std::future::Future<Output = ()> + Send,
    guard: Guard,
) -> std::io::Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let svc = InterceptedService::new(service(envoy), Check(guard.authorize.clone()));
    let mut http2 = Http2::new(TokioExecutor::new());
    http2
        .max_header_list_size(16 * 1024)
        .max_concurrent_streams(100);
    let graceful = GracefulShutdown::new();
    let open = Arc::new(AtomicUsize::new(0));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Some(sock) = accepted_or_wait(accepted, "envoy gRPC").await else {
                    continue;
                };
                // Relaxed: a count; no other memory is published through it.
                let n = open.fetch_add(1, Ordering::Relaxed) + 1;
                let slot = Slot(open.clone());
                if guard.max_connections > 0 && n > guard.max_connections {
                    continue;
                }
                // Small unary calls: each answer goes out at once.
                let _ = sock.set_nodelay(true);
                let svc = TowerToHyperService::new(svc.clone());
                spawn_conn(&http2, &graceful, guard.tls.clone(), sock, svc, slot);
            }
            () = &mut shutdown => break,
        }
    }
    graceful.shutdown().await;
    Ok(())
}

/// The check of a call's `authorization` metadata ([`Guard::authorize`]).
#[derive(Clone)]
struct Check(Option<Authorize>);

impl Interceptor for Check {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(ok) = &self.0 else {
            return Ok(req);
        };
        let token = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        match token {
            Some(t) if ok(t) => Ok(req),
            _ => Err(Status::unauthenticated(
                "this rate limit service needs the server's password: send `authorization: Bearer PASSWORD` metadata (--requirepass)",
            )),
        }
    }
}

/// One connection's service: [`service`] behind the [`Check`].
type ConnService = TowerToHyperService<InterceptedService<RateLimitServiceServer<Grpc>, Check>>;

/// Serves one accepted connection in a task of its own, its TLS handshake first (bounded in
/// time) if the listener speaks TLS; its `slot` is held until it ends.
fn spawn_conn(
    http2: &Http2<TokioExecutor>,
    graceful: &GracefulShutdown,
    tls: Option<tokio_rustls::TlsAcceptor>,
    sock: tokio::net::TcpStream,
    svc: ConnService,
    slot: Slot,
) {
    let Some(tls) = tls else {
        let conn = graceful.watch(http2.serve_connection(TokioIo::new(sock), svc));
        tokio::spawn(served(conn, "envoy gRPC", slot));
        return;
    };
    let (http2, watcher) = (http2.clone(), graceful.watcher());
    tokio::spawn(async move {
        let handshake = tokio::time::timeout(std::time::Duration::from_secs(10), tls.accept(sock));
        let stream = match handshake.await {
            Ok(Ok(s)) => s,
            _ => return tracing::debug!("envoy gRPC: TLS handshake failed or timed out"),
        };
        let conn = watcher.watch(http2.serve_connection(TokioIo::new(stream), svc));
        served(conn, "envoy gRPC", slot).await;
    });
}
