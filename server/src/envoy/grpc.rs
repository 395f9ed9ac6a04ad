//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic.
//!
//! The types and the service glue are `envoy-types`' generated code (prost + tonic, no
//! protoc). A malformed message is refused by tonic's decoder with `INVALID_ARGUMENT`
//! (`INTERNAL` for some framing errors) before it reaches [`Envoy`]; an empty domain or
//! descriptor list, too many descriptors, an oversized entry or an unknown override unit are
//! refused here with `INVALID_ARGUMENT`.

use super::engine::Envoy;
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
            .map_err(|e| Status::invalid_argument(e.0))
    }
}

/// The tonic service to mount on the `--grpc` listener
/// (`tonic::transport::Server::builder().add_service(envoy::service(e))`).
pub fn service(envoy: Arc<Envoy>) -> RateLimitServiceServer<Grpc> {
    RateLimitServiceServer::new(Grpc { envoy }).max_decoding_message_size(MAX_MESSAGE_BYTES)
}

/// Serves [`service`] alone on `listener` until `shutdown` completes (tests, the bench, and
/// any caller without a listener of its own).
pub async fn serve(
    listener: tokio::net::TcpListener,
    envoy: Arc<Envoy>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(service(envoy))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
