//! The HTTP API (axum): `POST /v1/check` (`?explain=1`: explained, not checked: `explain`),
//! `POST /v1/settle`, `GET /metrics`, `GET /healthz`,
//! `GET /readyz`, `POST /v1/reload`, `GET`/`PUT`/`DELETE /v1/limits/{class}/{key}` (keys' own limits, `limits`), and with `--envoy-config` Envoy's `POST /json` and `GET /healthcheck`
//! ([`crate::envoy::json_router`], whose own body limit applies). Errors are JSON
//! `{"error": "..."}`; a body over `--max-body` gets 413.

mod body;
mod check;
mod explain;
mod limits;
mod settle;

use crate::config::Access;
use crate::listen::accept::{accept_loop, Accepted};
use crate::listen::hyper::{http_builder, spawn_conn, Serve, Stream};
use crate::listen::{Conn, Kind, Ticket};
use crate::metrics::C;
use crate::state::Server;
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
use std::net::IpAddr;
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

/// 503 for a request whose body the server could not hold (`--body-memory`): retry.
fn busy(shared: &Server) -> Response {
    let mut r = error(
        shared,
        StatusCode::SERVICE_UNAVAILABLE,
        crate::listen::budget::BodyBudget.to_string(),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

async fn metrics(State(s): State<Arc<Server>>) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::exposition::render(&s),
    )
        .into_response()
}

/// `GET /v1/top-denied` (admin): the most denied keys (crate::denied).
async fn top_denied(State(s): State<Arc<Server>>) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    Json(crate::denied::DENIED.json()).into_response()
}

async fn healthz(State(s): State<Arc<Server>>) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    Json(json!({ "status": "ok" })).into_response()
}

/// `GET /readyz`: 200 when ready (crate::ready), else 503 with the reason.
async fn readyz(State(s): State<Arc<Server>>) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    match crate::ready::check(&s).await {
        Ok(()) => Json(json!({ "status": "ready" })).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not ready", "reason": reason })),
        )
            .into_response(),
    }
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
            "no such endpoint: POST /v1/check, POST /v1/settle, GET /metrics, GET /healthz, GET /readyz, POST /v1/reload, GET|PUT|DELETE /v1/limits/{{class}}/{{key}}{envoy}"
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
    /// The connection's state for the guard: its requests, its bodies, its password.
    conn: Arc<Conn>,
    /// The client's address (failed passwords are slowed per address).
    peer: Option<IpAddr>,
}

/// What a request must have shown for `method` on `path`: `/healthz`, `/readyz` and Envoy's
/// `/healthcheck` are open (probes carry no credentials), `/metrics` unless `--metrics-open`,
/// the operations that change the server (a reload, a key's limit set or removed) need admin,
/// the rest (reading a key's limit included) the client password.
fn needs(method: &Method, path: &str, metrics_open: bool) -> Access {
    match path {
        "/healthz" | "/readyz" | "/healthcheck" => Access::None,
        "/metrics" if metrics_open => Access::None,
        "/v1/reload" | "/v1/top-denied" => Access::Admin,
        p if p.starts_with("/v1/limits/") && method != Method::GET && method != Method::HEAD => {
            Access::Admin
        }
        _ => Access::Client,
    }
}

/// What a request showed.
enum Shown {
    /// This access (`None`: a password that matches nothing, or another scheme).
    Access(Option<Access>),
    /// A password from a source over its wrong attempts: refused unchecked.
    Throttled(std::time::Duration),
}

impl Dispatch {
    /// What the request has shown: its bearer token's grant (slowed per source address: a
    /// source over its wrong attempts is refused without a check), or what the listener
    /// grants without one.
    fn access<B>(&self, req: &axum::http::Request<B>) -> Shown {
        let auth = &self.shared.http.auth;
        let Some(v) = req.headers().get(header::AUTHORIZATION) else {
            return Shown::Access(Some(auth.initial(self.trusted)));
        };
        if !auth.required() && auth.admin.is_none() {
            // No password to check: a token changes nothing (as Redis's AUTH with nopass).
            return Shown::Access(Some(auth.initial(self.trusted)));
        }
        let Some(token) = v.as_bytes().strip_prefix(b"Bearer ") else {
            return Shown::Access(None);
        };
        if let Some(a) = self.conn.accepted(token).and_then(Access::of_tag) {
            // The password this connection had accepted before: not a guess.
            return Shown::Access(Some(a));
        }
        let guard = &self.shared.guard;
        if let Err(t) = guard.throttle.allow(self.peer) {
            guard.auth_failed(true);
            return Shown::Throttled(t.retry_after);
        }
        let granted = auth.grant(None, token, self.trusted);
        match granted {
            Some(a) if a >= Access::Client => {
                self.conn.authenticated();
                self.conn.accept(token, a.tag());
            }
            _ => {
                guard.throttle.failed(self.peer);
                guard.auth_failed(false);
                self.conn.auth_failed();
            }
        }
        Shown::Access(granted)
    }

    /// The refusal of a request that has not shown enough (answered without reading its body).
    fn refuse(&self, shown: Shown, method: &Method, path: &str) -> Response {
        let s = &self.shared;
        s.metrics.add(C::HttpRequests, 1);
        match shown {
            Shown::Throttled(wait) => {
                let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
                let mut r = error(
                    s,
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("too many wrong passwords from this address: the next is checked in {secs} s"),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs));
                r
            }
            Shown::Access(Some(a)) if a >= Access::Client => error(
                s,
                StatusCode::FORBIDDEN,
                format!("{method} {path} changes the server: give the admin password (--admin-pass) as `Authorization: Bearer PASSWORD`, or send it to a loopback listener or --admin when no admin password is set"),
            ),
            Shown::Access(_) => {
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
type DispatchFuture = futures_util::future::Either<
    CheckFuture,
    <Router as tower_service::Service<axum::extract::Request>>::Future,
>;

impl<B> tower_service::Service<axum::http::Request<B>> for Dispatch
where
    B: axum::body::HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = DispatchFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready (axum's Router::poll_ready), and so is the handler.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        if crate::spans::on() {
            return self.call_spanned(req);
        }
        self.call_unspanned(req)
    }
}

impl Dispatch {
    /// [`Dispatch::call`] within the request's span, if sampled (crate::spans), its status
    /// recorded.
    #[cold]
    fn call_spanned<B>(&mut self, req: axum::http::Request<B>) -> DispatchFuture
    where
        B: axum::body::HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        use tracing::Instrument;
        if !crate::spans::has_parent(req.headers()) && !crate::spans::root_sampled() {
            return self.call_unspanned(req);
        }
        let span = crate::spans::http(req.method(), req.uri().path(), req.headers());
        let fut = span.in_scope(|| self.call_unspanned(req));
        futures_util::future::Either::Left(Box::pin(async move {
            let r = fut.instrument(span.clone()).await;
            if let Ok(res) = &r {
                span.record("http.response.status_code", res.status().as_u16());
            }
            r
        }))
    }

    fn call_unspanned<B>(&mut self, req: axum::http::Request<B>) -> DispatchFuture
    where
        B: axum::body::HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        use futures_util::future::Either;
        // The request's head is in: the connection is busy until its response is made.
        let busy = self.conn.begin();
        // Its body is metered: the guard's deadlines and the server's body budget.
        let req = req.map(|b| Body::new(crate::listen::body::Metered::new(b, self.conn.clone())));
        let shown = self.access(&req);
        let need = needs(
            req.method(),
            req.uri().path(),
            self.shared.http.metrics_open,
        );
        let enough = need == Access::None || matches!(shown, Shown::Access(Some(a)) if a >= need);
        if !enough {
            let r = self.refuse(shown, req.method(), req.uri().path());
            return Either::Left(Box::pin(async move {
                // At most a small fixed allowance of the body is read (never --max-body, never
                // the shared budget) before the refusal: a client still sending it otherwise
                // sees its HTTP/2 stream reset under it (curl: "Stream error in the HTTP/2
                // framing layer") instead of the 401. Past it, the stream is reset.
                let _ = axum::body::to_bytes(req.into_body(), crate::listen::PRE_AUTH_BODY).await;
                drop(busy);
                Ok(r)
            }));
        }
        // A query (`?explain=1`) goes through the router: the hot path reads no query.
        if req.method() == Method::POST
            && req.uri().path() == "/v1/check"
            && req.uri().query().is_none()
        {
            let s = self.shared.clone();
            // Boxed as axum boxes a handler's future.
            Either::Left(Box::pin(async move {
                let r = check_direct(s, req.into_body()).await;
                drop(busy);
                Ok(r)
            }))
        } else {
            let fut = tower_service::Service::call(&mut self.router, req);
            // The router's endpoints are not the hot path: one allocation to hold `busy`.
            Either::Left(Box::pin(async move {
                let r = fut.await;
                drop(busy);
                r
            }))
        }
    }
}

/// Serves HTTP on `l` until shutdown, as `kind` (the API or --admin); `trusted`: the listener
/// grants admin without the admin password (a loopback listener with no --admin-pass).
pub(crate) async fn serve(
    shared: Arc<Server>,
    l: tokio::net::TcpListener,
    kind: Kind,
    trusted: bool,
) {
    let mut stop = shared.shutdown.subscribe();
    // hyper's connections, served here rather than by `axum::serve`, which closes no
    // connection a client holds without a request: the guard does (crate::listen).
    let mut on = Listener {
        conns: http_builder(
            &shared.guard.limits,
            shared.http.max_header_bytes,
            shared.http.max_headers,
        ),
        graceful: GracefulShutdown::new(),
        router: router(&shared),
        shared: shared.clone(),
        trusted,
        kind,
    };
    accept_loop(&l, kind, &shared.guard, &mut stop, &mut on).await;
    on.graceful.shutdown().await;
}

/// An HTTP listener's side of the accept loop.
struct Listener {
    conns: Builder<TokioExecutor>,
    graceful: GracefulShutdown,
    router: Router,
    shared: Arc<Server>,
    trusted: bool,
    kind: Kind,
}

impl Accepted for Listener {
    fn admitted(&mut self, sock: tokio::net::TcpStream, peer: std::net::SocketAddr, t: Ticket) {
        let app = Dispatch {
            router: self.router.clone(),
            shared: self.shared.clone(),
            trusted: self.trusted,
            conn: t.conn().clone(),
            peer: Some(peer.ip()),
        };
        let tls = self.shared.tls.as_ref().map(|t| t.http.clone());
        let serve = HttpServe {
            conns: self.conns.clone(),
            svc: TowerToHyperService::new(app),
        };
        let handshake = self.shared.guard.limits.handshake;
        let name = if self.kind == Kind::Admin {
            "admin"
        } else {
            "HTTP"
        };
        spawn_conn(serve, &self.graceful, tls, handshake, sock, t, name);
    }

    fn refused(&mut self, _: tokio::net::TcpStream, _: crate::listen::Refusal) {
        self.shared.metrics.add(C::HttpRejectedConnections, 1);
    }
}

/// hyper's HTTP/1 and HTTP/2 connection of one [`Dispatch`].
struct HttpServe {
    conns: Builder<TokioExecutor>,
    svc: TowerToHyperService<Dispatch>,
}

impl Serve for HttpServe {
    type Conn = hyper_util::server::conn::auto::UpgradeableConnection<
        'static,
        TokioIo<Stream>,
        TowerToHyperService<Dispatch>,
        TokioExecutor,
    >;

    fn serve(self, io: TokioIo<Stream>) -> Self::Conn {
        self.conns
            .serve_connection_with_upgrades(io, self.svc)
            .into_owned()
    }
}

/// `POST /v1/check?...`: `explain=1` (or `true`) explains the check instead of making it
/// (`explain=0`, `false` or no `explain`: the check); another value is a 400.
async fn check_or_explain(
    axum::extract::State(s): axum::extract::State<Arc<Server>>,
    uri: axum::http::Uri,
    body: Body,
) -> Response {
    let mut explain = false;
    // The values this reads need no percent-decoding; any other is refused as it is.
    for (k, v) in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|p| p.split_once('='))
    {
        if k == "explain" {
            explain = match v {
                "1" | "true" => true,
                "0" | "false" => false,
                v => {
                    return error(
                        &s,
                        StatusCode::BAD_REQUEST,
                        format!("explain={v}: expected explain=1 (or true) to explain the check, 0 (or false) to make it"),
                    )
                }
            };
        }
    }
    if !explain {
        return check_direct(s, body).await;
    }
    explain::explain(s, body).await
}

/// The router of every endpoint but the hot one's POST.
fn router(shared: &Arc<Server>) -> Router {
    let app = Router::new()
        // A POST without a query never gets here (Dispatch answers it first); with one it
        // may ask for an explanation. The route gives other methods their 405 with
        // `Allow: POST`.
        .route("/v1/check", post(check_or_explain))
        .route("/v1/settle", post(settle::settle))
        .route("/v1/reload", post(reload))
        .route(
            "/v1/limits/{class}/{key}",
            get(limits::get).put(limits::put).delete(limits::delete),
        )
        .route("/metrics", get(metrics))
        .route("/v1/top-denied", get(top_denied))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(shared.http.max_body))
        .with_state(shared.clone());
    match &shared.envoy {
        Some(e) => app.merge(crate::envoy::json_router(e.clone(), shared.http.max_body)),
        None => app,
    }
}
