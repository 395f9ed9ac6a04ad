//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic, and
//! `grpc.health.v1.Health` ([`super::health`]) beside it.
//!
//! The types and the service glue are `envoy-types`' generated code (prost + tonic, no
//! protoc). A malformed message is refused by tonic's decoder with `INVALID_ARGUMENT`
//! (`INTERNAL` for some framing errors) before it reaches [`Envoy`]. An empty domain or
//! descriptor list is refused with `UNKNOWN` and upstream's message, as upstream's Go service
//! answers it (a plain error, which grpc-go sends as `UNKNOWN`); too many descriptors, an
//! oversized entry or an unknown override unit with `INVALID_ARGUMENT`.

use super::engine::Envoy;
use super::explain::{asks, EXPLAIN};
use super::health::Health;
use super::limits::InvalidRequest;
use crate::config::{Access, Auth};
use crate::listen::accept::{accept_loop, Accepted};
use crate::listen::hyper::{grpc_builder, spawn_conn, Serve, Stream};
use crate::listen::{Busy, Conn, Guard, Kind, Limits, Ticket};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hyper::server::conn::http2::Builder as Http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;

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
        if crate::spans::on() {
            return self.spanned(&request);
        }
        self.decide(&request)
    }
}

impl Grpc {
    fn decide(
        &self,
        request: &Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // Explained from peeks just before the answer counts: what the answer then does.
        let explained = match asks_explain(request.metadata())? {
            true => Some(self.envoy.explain(request.get_ref())),
            false => None,
        };
        let mut r = self
            .envoy
            .should_rate_limit(request.get_ref())
            .map(Response::new)
            .map_err(|e| match e {
                InvalidRequest::Upstream(m) => Status::unknown(m),
                InvalidRequest::Invalid(m) => Status::invalid_argument(m),
            })?;
        if let Some(Ok(x)) = explained {
            // ASCII JSON is always a valid metadata value.
            if let Ok(v) = x.to_ascii_json().parse() {
                r.metadata_mut().insert(EXPLAIN, v);
            }
        }
        Ok(r)
    }

    /// [`Grpc::decide`] within the call's span (crate::spans): the domain, the overall code,
    /// the gRPC status.
    #[cold]
    fn spanned(
        &self,
        request: &Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let headers = request.metadata().clone().into_headers();
        if !crate::spans::has_parent(&headers) && !crate::spans::root_sampled() {
            return self.decide(request);
        }
        let span = crate::spans::grpc(&request.get_ref().domain, &headers);
        let r = span.in_scope(|| self.decide(request));
        match &r {
            Ok(res) => {
                let code = res.get_ref().overall_code();
                span.record("turnstile.decision", code.as_str_name());
                span.record("rpc.grpc.status_code", 0);
            }
            Err(s) => {
                span.record("rpc.grpc.status_code", s.code() as i32);
                span.record("otel.status_code", "ERROR");
            }
        }
        r
    }
}

/// Whether the request's metadata asks for an explanation ([`super::explain::asks`]).
fn asks_explain(m: &tonic::metadata::MetadataMap) -> Result<bool, Status> {
    asks(m.get(EXPLAIN).map(|v| v.to_str().map_err(|_| ()))).map_err(Status::invalid_argument)
}

/// The tonic service, its messages at most `max_message` bytes (`--max-body`; larger:
/// `OUT_OF_RANGE`), gzip-compressed ones accepted and decompressed into at most as many
/// (larger: `RESOURCE_EXHAUSTED`, the decompression stopped at the bound).
pub fn service(envoy: Arc<Envoy>, max_message: usize) -> RateLimitServiceServer<Grpc> {
    RateLimitServiceServer::new(Grpc { envoy })
        .max_decoding_message_size(max_message)
        .accept_compressed(CompressionEncoding::Gzip)
}

/// Serves [`service`] alone on `listener` until `shutdown` completes, then lets the calls in
/// flight finish (graceful shutdown: each connection gets a GOAWAY), behind a guard of
/// `turnstile serve`'s defaults with no password and no TLS (tests and benchmarks; the
/// server's `--grpc` listener goes through its own guard).
pub async fn serve(
    listener: tokio::net::TcpListener,
    envoy: Arc<Envoy>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let args = crate::ServeArgs::new();
    let (_, http, limits) =
        crate::config::from_args(&args).map_err(|e| std::io::Error::other(e.to_string()))?;
    let gate = Gate {
        guard: Guard::new(limits, false, usize::MAX),
        auth: http.auth,
        tls: None,
        max_header_bytes: http.max_header_bytes,
        ready: None,
    };
    serve_with(listener, envoy, shutdown, gate).await;
    Ok(())
}

/// What the `--grpc` listener goes through: the server's guard, the password, TLS.
pub(crate) struct Gate {
    pub(crate) guard: Arc<Guard>,
    /// `--requirepass`, given as `authorization: Bearer PASSWORD` metadata.
    pub(crate) auth: Auth,
    /// TLS (ALPN `h2`).
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// `--max-header-bytes`: a request's headers (metadata).
    pub(crate) max_header_bytes: usize,
    /// The server's readiness, which the health service follows (`true`: serving); without
    /// it the health service answers `SERVING` throughout.
    pub(crate) ready: Option<tokio::sync::watch::Receiver<bool>>,
}

/// [`serve`] behind `gate`.
///
/// The service is mounted on hyper's HTTP/2 server connection directly rather than through
/// `tonic::transport::Server`, whose `Routes` put every call through axum's router (route
/// lookup, a cloned boxed service and more futures) and a gRPC-timeout layer. With two
/// services on the listener, one comparison of the path's prefix picks the health service;
/// each generated server matches its method path itself (UNIMPLEMENTED for any other).
/// Measured with `envoy_bench` (docs/service.md).
/// HTTP/1 is refused as tonic's server refuses it (HTTP/2 only, prior knowledge). Every bound
/// of the connection is the guard's (crate::listen).
pub(crate) async fn serve_with(
    listener: tokio::net::TcpListener,
    envoy: Arc<Envoy>,
    shutdown: impl Future<Output = ()> + Send,
    gate: Gate,
) {
    let (tx, mut stop) = tokio::sync::watch::channel(false);
    let limits: &Limits = &gate.guard.limits;
    let health = match &gate.ready {
        None => Health::new(true).await,
        Some(rx) => {
            let serving = *rx.borrow();
            let h = Health::new(serving).await;
            tokio::spawn(follow(rx.clone(), h.reporter.clone()));
            h
        }
    };
    let mut on = Listener {
        http2: grpc_builder(limits, gate.max_header_bytes),
        graceful: GracefulShutdown::new(),
        svc: service(envoy, limits.max_body),
        health: health.server.clone(),
        gate: Arc::new(gate),
    };
    let guard = on.gate.guard.clone();
    let accepting = accept_loop(&listener, Kind::Grpc, &guard, &mut stop, &mut on);
    tokio::select! {
        () = accepting => {}
        () = shutdown => {
            let _ = tx.send(true);
        }
    }
    on.graceful.shutdown().await;
}

/// Sets the health service's answers as the server's readiness changes. Ends when its sender
/// is gone, or with the listener's runtime.
async fn follow(
    mut ready: tokio::sync::watch::Receiver<bool>,
    reporter: tonic_health::server::HealthReporter,
) {
    let health = Health::from_reporter(reporter);
    while ready.changed().await.is_ok() {
        let now = *ready.borrow_and_update();
        health.set(now).await;
    }
}

/// The gRPC listener's side of the accept loop.
struct Listener {
    http2: Http2<TokioExecutor>,
    graceful: GracefulShutdown,
    svc: RateLimitServiceServer<Grpc>,
    health: HealthServer<HealthService>,
    gate: Arc<Gate>,
}

impl Accepted for Listener {
    fn admitted(&mut self, sock: tokio::net::TcpStream, peer: std::net::SocketAddr, t: Ticket) {
        // Small unary calls: each answer goes out at once.
        let _ = sock.set_nodelay(true);
        let conn = GrpcConn {
            svc: self.svc.clone(),
            health: self.health.clone(),
            gate: self.gate.clone(),
            conn: t.conn().clone(),
            peer: Some(peer.ip()),
        };
        let serve = GrpcServe {
            http2: self.http2.clone(),
            svc: TowerToHyperService::new(conn),
        };
        let (tls, handshake) = (self.gate.tls.clone(), self.gate.guard.limits.handshake);
        spawn_conn(serve, &self.graceful, tls, handshake, sock, t, "envoy gRPC");
    }
}

/// hyper's HTTP/2 connection of one [`GrpcConn`].
struct GrpcServe {
    http2: Http2<TokioExecutor>,
    svc: TowerToHyperService<GrpcConn>,
}

impl Serve for GrpcServe {
    type Conn = hyper::server::conn::http2::Connection<
        TokioIo<Stream>,
        TowerToHyperService<GrpcConn>,
        TokioExecutor,
    >;

    fn serve(self, io: TokioIo<Stream>) -> Self::Conn {
        self.http2.serve_connection(io, self.svc)
    }
}

/// One connection's service: the call's password checked (slowed per source address), its
/// body metered, the connection busy until the answer is made.
#[derive(Clone)]
struct GrpcConn {
    svc: RateLimitServiceServer<Grpc>,
    health: HealthServer<HealthService>,
    gate: Arc<Gate>,
    conn: Arc<Conn>,
    peer: Option<IpAddr>,
}

impl GrpcConn {
    /// Whether the call may go on: its `authorization` metadata (`Bearer PASSWORD`) when a
    /// password is set.
    fn authorize<B>(&self, req: &http::Request<B>) -> Result<(), Status> {
        let auth = &self.gate.auth;
        if !auth.required() {
            return Ok(());
        }
        let token = req
            .headers()
            .get("authorization")
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        let Some(token) = token else {
            return Err(Status::unauthenticated(NEEDS_PASSWORD));
        };
        if self.conn.accepted(token).is_some() {
            // The password this connection had accepted before: not a guess.
            return Ok(());
        }
        let guard = &self.gate.guard;
        if let Err(t) = guard.throttle.allow(self.peer) {
            guard.auth_failed(true);
            return Err(Status::resource_exhausted(format!(
                "too many wrong passwords from this address: the next is checked in {} s",
                t.retry_after.as_secs_f64().ceil().max(1.0)
            )));
        }
        match auth.grant(None, token, false) {
            Some(a) if a >= Access::Client => {
                self.conn.authenticated();
                self.conn.accept(token, a.tag());
                Ok(())
            }
            _ => {
                guard.throttle.failed(self.peer);
                guard.auth_failed(false);
                self.conn.auth_failed();
                Err(Status::unauthenticated(NEEDS_PASSWORD))
            }
        }
    }
}

const NEEDS_PASSWORD: &str = "this rate limit service needs the server's password: send `authorization: Bearer PASSWORD` metadata (--requirepass)";

type Answer = http::Response<tonic::body::Body>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A generated service's future (both services' are this boxed future).
type Inner =
    Pin<Box<dyn Future<Output = Result<Answer, std::convert::Infallible>> + Send + 'static>>;

/// A body's error, as tonic should answer it: `--body-memory`'s refusal as
/// `RESOURCE_EXHAUSTED` (tonic answers a body's error that is a `Status` with it), any other
/// as it is.
fn budget_status(e: BoxError) -> BoxError {
    if crate::listen::budget::is_budget(&*e) {
        Box::new(Status::resource_exhausted(e.to_string()))
    } else {
        e
    }
}

impl tower_service::Service<http::Request<hyper::body::Incoming>> for GrpcConn {
    type Response = Answer;
    type Error = std::convert::Infallible;
    type Future = Call;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The generated server is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<hyper::body::Incoming>) -> Call {
        let busy = self.conn.begin();
        // Probes carry no credentials: the health service is open, as /healthz is.
        let health = req.uri().path().starts_with(super::health::PATH);
        if !health {
            if let Err(status) = self.authorize(&req) {
                return Call::Refused(Some(status.into_http()));
            }
        }
        let req = req.map(|b| {
            use http_body_util::BodyExt;
            let metered = crate::listen::body::Metered::new(b, self.conn.clone());
            metered.map_err(budget_status as fn(BoxError) -> BoxError)
        });
        let call = if health {
            tower_service::Service::call(&mut self.health, req)
        } else {
            tower_service::Service::call(&mut self.svc, req)
        };
        Call::Serving { call, _busy: busy }
    }
}

/// A call's answer: refused at once, or the service's, the connection busy until it is made.
enum Call {
    Refused(Option<Answer>),
    Serving { call: Inner, _busy: Busy },
}

impl Future for Call {
    type Output = Result<Answer, std::convert::Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Call::Refused(a) => Poll::Ready(Ok(a.take().expect("polled after completion"))),
            // The service's future is boxed (Unpin); `busy` drops with the call.
            Call::Serving { call, .. } => Pin::new(call).poll(cx),
        }
    }
}
