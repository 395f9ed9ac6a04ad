//! `grpc.health.v1.Health` on the gRPC listener (tonic-health's service and reporter), as
//! envoyproxy/ratelimit registers it: Kubernetes `grpc:` probes, Envoy's `grpc_health_check`
//! and `grpc_health_probe` ask `Check` (or `Watch`) for the server (`""`) or the rate limit
//! service by name. Probes carry no credentials: it is open, as `/healthz` is. It follows the
//! server's readiness (crate::ready): `NOT_SERVING` while not ready. Requests compressed with
//! gzip are accepted, as on the rate limit service.

use tonic::codec::CompressionEncoding;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

/// The rate limit service's name, as a health check asks for it.
pub(crate) const RATE_LIMIT_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The largest health request, decompressed (a service's name; larger: `OUT_OF_RANGE`, or
/// `RESOURCE_EXHAUSTED` for a gzip-compressed one).
pub(crate) const MAX_MESSAGE: usize = 4096;

/// The path prefix of the health service's methods.
pub(crate) const PATH: &str = "/grpc.health.v1.Health/";

/// The health service and the reporter that sets what it answers.
pub(crate) struct Health {
    pub(crate) reporter: HealthReporter,
    pub(crate) server: HealthServer<HealthService>,
}

impl Health {
    /// Both names (the server, `""`, and [`RATE_LIMIT_SERVICE`]) answer `serving`. Any other
    /// name is `NOT_FOUND`, as the standard service answers it.
    pub(crate) async fn new(serving: bool) -> Self {
        let h = Self::from_reporter(HealthReporter::new());
        h.set(serving).await;
        h
    }

    /// The service of `reporter` (to set its answers from another task).
    pub(crate) fn from_reporter(reporter: HealthReporter) -> Self {
        let server = HealthServer::new(HealthService::from_health_reporter(reporter.clone()))
            .max_decoding_message_size(MAX_MESSAGE)
            .accept_compressed(CompressionEncoding::Gzip);
        Health { reporter, server }
    }

    /// Sets both names to `SERVING` or `NOT_SERVING` (watchers are told of a change).
    pub(crate) async fn set(&self, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in ["", RATE_LIMIT_SERVICE] {
            self.reporter.set_service_status(name, status).await;
        }
    }
}
