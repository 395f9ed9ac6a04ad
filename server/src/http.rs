//! The HTTP API (axum): `POST /v1/check`, `GET /metrics`, `GET /healthz`, `POST /v1/reload`,
//! `GET`/`PUT`/`DELETE /v1/limits/{class}/{key}` (keys' own limits, `limits`), and with `--envoy-config` Envoy's `POST /json` and `GET /healthcheck`
//! ([`crate::envoy::json_router`], whose own body limit applies). Errors are JSON
//! `{"error": "..."}`; a body over `--max-body` gets 413.

mod check;
mod limits;

use crate::config::Access;
use crate::metrics::C;
use crate::state::{accepted_or_wait, served, stopped, Server};
use crate::watchdog::{ConnState, Watchdog};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use check::check_direct;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Which rate-limit headers `POST /v1/check` sends (`--ratelimit-headers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RateLimitHeaders {
    /// draft-ietf-httpapi-ratelimit-headers-10: `RateLimit-Policy` and `RateLimit`.
    Draft10,
    /// The earlier drafts' `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    Legacy,
    /// Both.
    Both,
}

fn error(shared: &Server, status: StatusCode, msg: impl Into<String>) -> Response {
    shared.metrics.add(C::HttpErrors, 1);
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

async fn metrics(State(s): State<Arc<Server>>) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(&s),
    )
        .into_response()
}

async fn healthz(State(s): State<Arc<Server>>) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    Json(json!({ "status": "ok" })).into_response()
}

async fn reload(State(s): State<Arc<Server>>) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    let s2 = s.clone();
    match tokio::task::spawn_blocking(move || crate::control::reload(&s2, "POST /v1/reload")).await
    {
        Ok(Ok(report)) => Json(report).into_response(),
        Ok(Err((status, m))) => error(&s, status, m),
        Err(e) => error(
            &s,
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reload task failed: {e}"),
        ),
    }
}

/// A known path with another method: 405 with the `{"error": ...}` body of every other error
/// (axum adds `Allow`).
async fn method_not_allowed(
    State(s): State<Arc<Server>>,
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    error(
        &s,
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{method} {}: not a method of this path; the Allow header lists those that are",
            uri.path()
        ),
    )
}

async fn not_found(State(s): State<Arc<Server>>, uri: axum::http::Uri) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    if s.envoy.is_none() && matches!(uri.path(), "/json" | "/healthcheck") {
        return error(
            &s,
            StatusCode::NOT_FOUND,
            format!(
                "{}: Envoy's rate limit service is off; start the server with --envoy-config FILE_OR_DIR",
                uri.path()
            ),
        );
    }
    let envoy = if s.envoy.is_some() {
        ", POST /json, GET /healthcheck"
    } else {
        ""
    };
    error(
        &s,
        StatusCode::NOT_FOUND,
        format!(
            "no such endpoint: POST /v1/check, GET /metrics, GET /healthz, POST /v1/reload, GET|PUT|DELETE /v1/limits/{{class}}/{{key}}{envoy}"
        ),
    )
}

/// The HTTP service: `POST /v1/check`, the hot endpoint, goes straight to its handler; every
/// other request to the router. Measured (docs/service.md): the router's path for a request
/// (its route lookup and URL parameters, the cloned boxed route service, the body-limit
/// extension, two more futures) was about 3 % of the server's CPU per check under wrk.
#[derive(Clone)]
struct Dispatch {
    router: Router,
    shared: Arc<Server>,
    /// Whether the listener grants admin without the admin password.
    trusted: bool,
    /// The connection's state for the idle watchdog (none with `--header-timeout 0`).
    conn: Option<Arc<ConnState>>,
}

/// What a request must have shown for `method` on `path`: `/healthz` and Envoy's
/// `/healthcheck` are open (probes carry no credentials), `/metrics` unless `--metrics-open`,
/// the operations that change the server (a reload, a key's limit set or removed) need admin,
/// the rest (reading a key's limit included) the client password.
fn needs(method: &Method, path: &str, metrics_open: bool) -> Access {
    match path {
        "/healthz" | "/healthcheck" => Access::None,
        "/metrics" if metrics_open => Access::None,
        "/v1/reload" => Access::Admin,
        p if p.starts_with("/v1/limits/") && method != Method::GET && method != Method::HEAD => {
            Access::Admin
        }
        _ => Access::Client,
    }
}

impl Dispatch {
    /// What the request has shown: its bearer token's grant, or what the listener grants
    /// without one.
    fn access<B>(&self, req: &axum::http::Request<B>) -> Option<Access> {
        let auth = &self.shared.http.auth;
        match req.headers().get(header::AUTHORIZATION) {
            None => Some(auth.initial(self.trusted)),
            Some(v) => {
                let token = v.as_bytes().strip_prefix(b"Bearer ")?;
                auth.grant(None, token, self.trusted)
            }
        }
    }

    /// The refusal of a request that has not shown enough (answered without reading its body).
    fn refuse(&self, shown: Option<Access>, method: &Method, path: &str) -> Response {
        let s = &self.shared;
        s.metrics.add(C::HttpRequests, 1);
        match shown {
            Some(a) if a >= Access::Client => error(
                s,
                StatusCode::FORBIDDEN,
                format!("{method} {path} changes the server: give the admin password (--admin-pass) as `Authorization: Bearer PASSWORD`, or send it to a loopback listener or --admin when no admin password is set"),
            ),
            _ => {
                let mut r = error(
                    s,
                    StatusCode::UNAUTHORIZED,
                    format!("{path} needs the server's password: send `Authorization: Bearer PASSWORD` (--requirepass)"),
                );
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"turnstile\""),
                );
                r
            }
        }
    }
}

type CheckFuture = futures_util::future::BoxFuture<'static, Result<Response, Infallible>>;

impl<B> tower_service::Service<axum::http::Request<B>> for Dispatch
where
    B: axum::body::HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = futures_util::future::Either<
        CheckFuture,
        <Router as tower_service::Service<axum::extract::Request>>::Future,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready (axum's Router::poll_ready), and so is the handler.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        use futures_util::future::Either;
        let req = req.map(Body::new);
        // The request's headers are in: the connection is busy until its response is made.
        let busy = self.conn.as_ref().map(ConnState::begin);
        let shown = self.access(&req);
        let need = needs(
            req.method(),
            req.uri().path(),
            self.shared.http.metrics_open,
        );
        if shown.unwrap_or(Access::None) < need {
            let r = self.refuse(shown, req.method(), req.uri().path());
            let limit = self.shared.http.max_body;
            return Either::Left(Box::pin(async move {
                // The body is read (up to --max-body, then dropped) before the refusal: a
                // client still sending it otherwise sees its HTTP/2 stream reset under it
                // (curl: "Stream error in the HTTP/2 framing layer") instead of the 401.
                let _ = axum::body::to_bytes(req.into_body(), limit).await;
                drop(busy);
                Ok(r)
            }));
        }
        if req.method() == Method::POST && req.uri().path() == "/v1/check" {
            let s = self.shared.clone();
            // Boxed as axum boxes a handler's future (one allocation, as before).
            Either::Left(Box::pin(async move {
                let r = check_direct(s, req.into_body()).await;
                drop(busy);
                Ok(r)
            }))
        } else {
            let fut = tower_service::Service::call(&mut self.router, req);
            match busy {
                None => Either::Right(fut),
                // The router's endpoints are not the hot path: one allocation to hold `busy`.
                Some(busy) => Either::Left(Box::pin(async move {
                    let r = fut.await;
                    drop(busy);
                    r
                })),
            }
        }
    }
}

/// Counts an HTTP connection for `--max-http-connections` while it lives.
struct Slot(Arc<Server>);

impl Slot {
    fn take(srv: &Arc<Server>) -> Option<Slot> {
        // Relaxed: a count; no other memory is published through it.
        let n = srv.http_connections.fetch_add(1, Ordering::Relaxed) + 1;
        let slot = Slot(srv.clone());
        (n <= srv.http.max_connections).then_some(slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Relaxed: see `take`.
        self.0.http_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves HTTP on `l` until shutdown; `trusted`: the listener grants admin without the admin
/// password (a loopback listener with no --admin-pass, or --admin).
pub(crate) async fn serve(shared: Arc<Server>, l: tokio::net::TcpListener, trusted: bool) {
    let mut stop = shared.shutdown.subscribe();
    let app = Dispatch {
        router: router(&shared),
        shared: shared.clone(),
        trusted,
        conn: None,
    };
    // hyper's connections, served here rather than by `axum::serve`, which closes no
    // connection a client holds without a request (a byte of headers at a time, or idle):
    // the watchdog does (src/watchdog.rs).
    let conns = connections(&shared);
    let dog =
        (!shared.http.header_timeout.is_zero()).then(|| Watchdog::new(shared.http.header_timeout));
    if let Some(dog) = &dog {
        tokio::spawn(dog.clone().run(shared.shutdown.subscribe()));
    }
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = l.accept() => {
                let Some(sock) = accepted_or_wait(accepted, "HTTP").await else {
                    continue;
                };
                let Some(slot) = Slot::take(&shared) else {
                    shared.metrics.add(C::HttpRejectedConnections, 1);
                    drop(sock);
                    continue;
                };
                let registered = dog.as_ref().and_then(|d| d.register(&sock));
                let mut app = app.clone();
                app.conn = registered.as_ref().map(|r| r.state.clone());
                let tls = shared.tls.as_ref().map(|t| t.http.clone());
                spawn_conn(&conns, &graceful, tls, sock, app, (registered, slot));
            }
            () = stopped(&mut stop) => break,
        }
    }
    graceful.shutdown().await;
}

/// The router of every endpoint but the hot one's POST.
fn router(shared: &Arc<Server>) -> Router {
    let app = Router::new()
        // POST never gets here (Dispatch answers it first); the route gives other methods
        // their 405 with `Allow: POST`.
        .route(
            "/v1/check",
            post(|State(s): State<Arc<Server>>, body: Body| check_direct(s, body)),
        )
        .route("/v1/reload", post(reload))
        .route(
            "/v1/limits/{class}/{key}",
            get(limits::get).put(limits::put).delete(limits::delete),
        )
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(shared.http.max_body))
        .with_state(shared.clone());
    match &shared.envoy {
        Some(e) => app.merge(crate::envoy::json_router(e.clone())),
        None => app,
    }
}

/// hyper's connection builder, HTTP/1 and HTTP/2. A request's head (line and headers) is
/// bounded in bytes and count: past either, hyper answers 431 and closes.
fn connections(shared: &Server) -> Builder<TokioExecutor> {
    let mut conns = Builder::new(TokioExecutor::new());
    conns
        .http1()
        .max_buf_size(shared.http.max_header_bytes.max(8192))
        .max_headers(shared.http.max_headers);
    conns
        .http2()
        .max_header_list_size(shared.http.max_header_bytes as u32)
        .max_concurrent_streams(100);
    conns
}

/// Serves one accepted connection in a task of its own, watched by `graceful`; with TLS, the
/// handshake first, in that task and bounded in time. `hold` is kept until the connection ends.
fn spawn_conn(
    conns: &Builder<TokioExecutor>,
    graceful: &GracefulShutdown,
    tls: Option<tokio_rustls::TlsAcceptor>,
    sock: tokio::net::TcpStream,
    app: Dispatch,
    hold: impl Send + 'static,
) {
    let svc = TowerToHyperService::new(app);
    let Some(tls) = tls else {
        let conn = graceful.watch(
            conns
                .serve_connection_with_upgrades(TokioIo::new(sock), svc)
                .into_owned(),
        );
        tokio::spawn(served(conn, "HTTP", hold));
        return;
    };
    let conns = conns.clone();
    let watcher = graceful.watcher();
    tokio::spawn(async move {
        let stream = match tokio::time::timeout(crate::tls::HANDSHAKE, tls.accept(sock)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return tracing::debug!(error = %e, "HTTP: TLS handshake failed"),
            Err(_) => return tracing::debug!("HTTP: TLS handshake timed out"),
        };
        let conn = watcher.watch(
            conns
                .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                .into_owned(),
        );
        served(conn, "HTTP", hold).await;
    });
}
