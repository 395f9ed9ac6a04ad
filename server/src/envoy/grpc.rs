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
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::sync::Arc;
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

/// Serves [`service`] alone on `listener` until `shutdown` completes, then lets the calls in
/// flight finish (graceful shutdown: each connection gets a GOAWAY).
///
/// The service is mounted on hyper's HTTP/2 server connection directly rather than through
/// `tonic::transport::Server`, whose `Routes` put every call through axum's router (route
/// lookup, a cloned boxed service and more futures) and a gRPC-timeout layer. With one service
/// on the listener there is nothing to route: the generated server matches the method path
/// itself (UNIMPLEMENTED for any other). Measured with `envoy_bench` (docs/service.md).
/// HTTP/1 is refused as tonic's server refuses it (HTTP/2 only, prior knowledge).
pub async fn serve(
    listener: tokio::net::TcpListener,
    envoy: Arc<Envoy>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;
    let svc = service(envoy);
    let http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let sock = match accepted {
                    Ok((sock, _)) => sock,
                    Err(e) => {
                        // Out of file descriptors and the like: the listener stays; try again
                        // shortly rather than spin.
                        tracing::warn!(error = %e, "envoy gRPC: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Small unary calls: each answer goes out at once.
                let _ = sock.set_nodelay(true);
                let conn = http2.serve_connection(TokioIo::new(sock), TowerToHyperService::new(svc.clone()));
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "envoy gRPC connection ended");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    graceful.shutdown().await;
    Ok(())
}
