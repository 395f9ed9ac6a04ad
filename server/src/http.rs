//! The HTTP API (axum): `POST /v1/check`, `GET /metrics`, `GET /healthz`, `POST /v1/reload`,
//! and with `--envoy-config` Envoy's `POST /json` and `GET /healthcheck`
//! ([`crate::envoy::json_router`], whose own body limit applies). Errors are JSON
//! `{"error": "..."}`; a body over `--max-body` gets 413.

use crate::check::{count, ms_up, request};
use crate::config::Access;
use crate::metrics::C;
use crate::state::{stopped, Server};
use crate::watchdog::{ConnState, Watchdog};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::{BufMut, BytesMut};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use turnstile::rules::Priority;
use turnstile::{Clock, DefaultClock, Outcome};
use turnstile_tower::{write_headers, HeaderStyle, Policy};

/// The body of `POST /v1/check`. Strings borrow from the request's bytes (`Cow`: owned only
/// when the JSON string has escapes), so a check allocates nothing to read its body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody<'a> {
    /// `customer`, `ip`, `api_key`, `route`, `method`, or parts joined by `+`.
    #[serde(borrow)]
    key_class: Cow<'a, str>,
    /// The key (parts joined by `|` for a composite class).
    #[serde(borrow)]
    key: Cow<'a, str>,
    /// Units (default 1; 0 looks without consuming).
    #[serde(default = "one")]
    cost: u64,
    /// critical, post, get or test (default: from the method).
    #[serde(borrow, default)]
    priority: Option<Text<'a>>,
    /// The route, if the key class does not already give it.
    #[serde(borrow, default)]
    route: Option<Text<'a>>,
    /// The method, if the key class does not already give it.
    #[serde(borrow, default)]
    method: Option<Text<'a>>,
}

/// A string borrowed from the body where it can be. A newtype because serde borrows a bare
/// `Option<Cow<str>>` never (serde issue 1497: it always allocates).
#[derive(Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// The answer of `POST /v1/check`: a typed struct serialized straight into the body's one
/// buffer (a `serde_json::Value` built a map and a string per field, and the handler cost
/// twice an empty one's CPU per request; see docs/service.md).
#[derive(Serialize)]
struct CheckReply<'a> {
    allowed: bool,
    outcome: &'static str,
    limit: i64,
    remaining: i64,
    retry_after_ms: Option<i64>,
    reset_after_ms: i64,
    rule: Option<&'a str>,
    shed: bool,
}

/// Writes `r` as JSON, exactly as `serde_json::to_writer` would (a test compares them). By
/// hand because the shape is fixed and every value but the rule's name is a number or a
/// literal: through serde_json's `io::Write` adaptor the reply took ~2 000 instructions per
/// request in small writes (callgrind); here it is a dozen copies into a buffer reserved once.
fn write_reply(buf: &mut BytesMut, r: &CheckReply) {
    let mut n = itoa::Buffer::new();
    buf.extend_from_slice(if r.allowed {
        br#"{"allowed":true,"outcome":""#
    } else {
        br#"{"allowed":false,"outcome":""#
    });
    buf.extend_from_slice(r.outcome.as_bytes());
    buf.extend_from_slice(br#"","limit":"#);
    buf.extend_from_slice(n.format(r.limit).as_bytes());
    buf.extend_from_slice(br#","remaining":"#);
    buf.extend_from_slice(n.format(r.remaining).as_bytes());
    buf.extend_from_slice(br#","retry_after_ms":"#);
    match r.retry_after_ms {
        Some(v) => buf.extend_from_slice(n.format(v).as_bytes()),
        None => buf.extend_from_slice(b"null"),
    }
    buf.extend_from_slice(br#","reset_after_ms":"#);
    buf.extend_from_slice(n.format(r.reset_after_ms).as_bytes());
    buf.extend_from_slice(br#","rule":"#);
    match r.rule {
        None => buf.extend_from_slice(b"null"),
        Some(name) if !name.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') => {
            buf.put_u8(b'"');
            buf.extend_from_slice(name.as_bytes());
            buf.put_u8(b'"');
        }
        // Escapes: serde_json's. Writing to memory cannot fail.
        Some(name) => {
            let _ = serde_json::to_writer(buf.writer(), name);
        }
    }
    buf.extend_from_slice(if r.shed {
        br#","shed":true}"#
    } else {
        br#","shed":false}"#
    });
}

/// The outcome as the reply spells it (the variant's name, as `Debug` prints it).
fn outcome(o: Outcome) -> &'static str {
    match o {
        Outcome::Allowed => "Allowed",
        Outcome::Limited => "Limited",
        Outcome::NeverFits => "NeverFits",
        Outcome::StoreFull => "StoreFull",
        Outcome::Untracked => "Untracked",
        // `Outcome` is non-exhaustive: a later variant is still an answer, not a panic.
        _ => "Other",
    }
}

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

/// The policy the draft-10 fields name: one for the whole API, "default", no window (the
/// rules' windows differ per rule; the decision does not say which one applied).
static POLICY: std::sync::LazyLock<Policy> = std::sync::LazyLock::new(Policy::default);
static JSON: HeaderValue = HeaderValue::from_static("application/json");

fn one() -> u64 {
    1
}

fn error(shared: &Server, status: StatusCode, msg: impl Into<String>) -> Response {
    shared.metrics.add(C::HttpErrors, 1);
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

/// `POST /v1/check` from [`Dispatch`]: the body read up to `--max-body` (413 past it, as the
/// router's `DefaultBodyLimit` answers), then decided.
async fn check_direct(s: Arc<Server>, body: Body) -> Response {
    use http_body_util::BodyExt;
    s.metrics.add(C::HttpRequests, 1);
    let limit = s.http.max_body;
    let body = match http_body_util::Limited::new(body, limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let (status, what) = if e.is::<http_body_util::LengthLimitError>() {
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "length limit exceeded".to_string(),
                )
            } else {
                (StatusCode::BAD_REQUEST, e.to_string())
            };
            return error(
                &s,
                status,
                format!("Failed to buffer the request body: {what} (the limit is {limit} bytes)"),
            );
        }
    };
    check_body(s, body).await
}

async fn check_body(s: Arc<Server>, body: Bytes) -> Response {
    let b: CheckBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return error(
                &s,
                StatusCode::BAD_REQUEST,
                format!("invalid JSON body: {e}"),
            )
        }
    };
    let Some(engine) = &s.checks.engine else {
        return error(
            &s,
            StatusCode::SERVICE_UNAVAILABLE,
            "no rules loaded: start the server with --rules FILE",
        );
    };
    let clock = DefaultClock::new();
    let t0 = clock.now();
    let mut req = match request(&b.key_class, &b.key) {
        Ok(r) => r,
        Err(m) => return error(&s, StatusCode::BAD_REQUEST, m),
    };
    req.cost = b.cost;
    if req.route.is_none() {
        req.route = b.route.as_ref().map(|t| &*t.0);
    }
    if req.method.is_none() {
        req.method = b.method.as_ref().map(|t| &*t.0);
    }
    if let Some(p) = &b.priority {
        match p.0.parse::<Priority>() {
            Ok(p) => req.priority = Some(p),
            Err(e) => return error(&s, StatusCode::BAD_REQUEST, e),
        }
    }
    let v = match s.checks.backends.redis() {
        // Boxed: the Redis round trip's future is large, and the in-memory path should not
        // carry (and copy, when axum boxes the handler's future) its space on every request.
        Some(redis) => Box::pin(redis.explain(engine, &req)).await,
        None => engine.explain(&req),
    };
    let d = v.decision;
    s.metrics.latency(clock.now().saturating_sub(t0));
    s.metrics.add(C::HttpChecks, 1);
    s.metrics.add(
        if d.allowed() {
            C::CheckAllowed
        } else {
            C::CheckDenied
        },
        1,
    );
    let reply = CheckReply {
        allowed: d.allowed(),
        outcome: outcome(d.outcome),
        limit: count(d.limit),
        remaining: count(d.remaining),
        retry_after_ms: d.retry_after_ns.map(ms_up),
        reset_after_ms: ms_up(d.reset_after_ns),
        rule: v.rule.as_deref(),
        shed: v.shed,
    };
    // One allocation for the body and every header value: the JSON first, then each value's
    // digits, each split off as a shared slice of the same buffer (HeaderValue::from(u64) and
    // a separate HeaderMap merged into the response cost 11 allocations per reply).
    let mut buf = BytesMut::with_capacity(256);
    write_reply(&mut buf, &reply);
    let body = buf.split().freeze();
    let mut res = Response::new(Body::from(body));
    *res.status_mut() = if d.allowed() {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let h = res.headers_mut();
    h.reserve(5);
    h.insert(header::CONTENT_TYPE, JSON.clone());
    // The rate-limit headers from turnstile-tower's writer, as the tower layer sends them.
    let style = s.http.ratelimit_headers;
    if matches!(style, RateLimitHeaders::Draft10 | RateLimitHeaders::Both) {
        write_headers(&HeaderStyle::Ietf, &POLICY, &d, h);
    }
    if matches!(style, RateLimitHeaders::Legacy | RateLimitHeaders::Both) {
        write_headers(&HeaderStyle::RateLimit, &POLICY, &d, h);
    }
    if let Some(secs) = d.retry_after_secs_ceil().filter(|_| d.has_limit()) {
        buf.extend_from_slice(itoa::Buffer::new().format(secs).as_bytes());
        // Decimal digits are always a valid header value.
        if let Ok(v) = HeaderValue::from_maybe_shared(buf.split().freeze()) {
            h.insert(header::RETRY_AFTER, v);
        }
    }
    res
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
            "no such endpoint: POST /v1/check, GET /metrics, GET /healthz, POST /v1/reload{envoy}"
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

/// What a request must have shown for `path`: `/healthz` and Envoy's `/healthcheck` are open
/// (probes carry no credentials), `/metrics` unless `--metrics-open`, the operations that
/// change the server need admin, the rest the client password.
fn needs(path: &str, metrics_open: bool) -> Access {
    match path {
        "/healthz" | "/healthcheck" => Access::None,
        "/metrics" if metrics_open => Access::None,
        "/v1/reload" => Access::Admin,
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
    fn refuse(&self, shown: Option<Access>, path: &str) -> Response {
        let s = &self.shared;
        s.metrics.add(C::HttpRequests, 1);
        match shown {
            Some(a) if a >= Access::Client => error(
                s,
                StatusCode::FORBIDDEN,
                format!("{path} changes the server: give the admin password (--admin-pass) as `Authorization: Bearer PASSWORD`, or send it to a loopback listener or --admin when no admin password is set"),
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
        if shown.unwrap_or(Access::None) < needs(req.uri().path(), self.shared.http.metrics_open) {
            let r = self.refuse(shown, req.uri().path());
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
    let mut app = Router::new()
        // POST never gets here (Dispatch answers it first); the route gives other methods
        // their 405 with `Allow: POST`.
        .route(
            "/v1/check",
            post(|State(s): State<Arc<Server>>, body: Body| check_direct(s, body)),
        )
        .route("/v1/reload", post(reload))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(shared.http.max_body))
        .with_state(shared.clone());
    if let Some(e) = &shared.envoy {
        app = app.merge(crate::envoy::json_router(e.clone()));
    }
    let mut stop = shared.shutdown.subscribe();
    let app = Dispatch {
        router: app,
        shared: shared.clone(),
        trusted,
        conn: None,
    };
    // hyper's connections, served here rather than by `axum::serve`, which closes no
    // connection a client holds without a request (a byte of headers at a time, or idle):
    // the watchdog does (src/watchdog.rs).
    let mut conns = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // A request's head (line and headers) is bounded in bytes and count: past either, hyper
    // answers 431 and closes.
    conns
        .http1()
        .max_buf_size(shared.http.max_header_bytes.max(8192))
        .max_headers(shared.http.max_headers);
    conns
        .http2()
        .max_header_list_size(shared.http.max_header_bytes as u32)
        .max_concurrent_streams(100);
    let dog =
        (!shared.http.header_timeout.is_zero()).then(|| Watchdog::new(shared.http.header_timeout));
    if let Some(dog) = &dog {
        tokio::spawn(dog.clone().run(shared.shutdown.subscribe()));
    }
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = l.accept() => {
                let sock = match accepted {
                    Ok((sock, _)) => sock,
                    Err(e) => {
                        // Out of file descriptors and the like: the listener stays; try again
                        // shortly rather than spin.
                        tracing::warn!(error = %e, "HTTP: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(slot) = Slot::take(&shared) else {
                    shared.metrics.add(C::HttpRejectedConnections, 1);
                    drop(sock);
                    continue;
                };
                let registered = dog.as_ref().and_then(|d| d.register(&sock));
                let mut app = app.clone();
                app.conn = registered.as_ref().map(|r| r.state.clone());
                let svc = TowerToHyperService::new(app);
                let Some(tls) = shared.tls.as_ref().map(|t| t.http.clone()) else {
                    let conn = graceful.watch(conns.serve_connection_with_upgrades(TokioIo::new(sock), svc).into_owned());
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "HTTP connection ended");
                        }
                        drop((registered, slot));
                    });
                    continue;
                };
                // TLS: the handshake in the connection's task, bounded in time; graceful
                // shutdown then watches the connection once it is served.
                let conns = conns.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(crate::tls::HANDSHAKE, tls.accept(sock)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => return tracing::debug!(error = %e, "HTTP: TLS handshake failed"),
                        Err(_) => return tracing::debug!("HTTP: TLS handshake timed out"),
                    };
                    let conn = watcher.watch(conns.serve_connection_with_upgrades(TokioIo::new(stream), svc).into_owned());
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "HTTP connection ended");
                    }
                    drop((registered, slot));
                });
            }
            () = stopped(&mut stop) => break,
        }
    }
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written reply is byte for byte serde_json's, for every shape of value.
    #[test]
    fn the_reply_is_what_serde_json_writes() {
        let names = [
            None,
            Some("customer-hourly"),
            Some("a \"quoted\" \\ name\n\u{1}é"),
        ];
        for allowed in [true, false] {
            for rule in names {
                for (limit, remaining) in [(15, 0), (-1, -1), (i64::MAX, i64::MAX - 1)] {
                    for retry in [None, Some(0), Some(1), Some(i64::MAX)] {
                        let r = CheckReply {
                            allowed,
                            outcome: if allowed { "Allowed" } else { "Limited" },
                            limit,
                            remaining,
                            retry_after_ms: retry,
                            reset_after_ms: 7_198_896,
                            rule,
                            shed: !allowed,
                        };
                        let mut buf = BytesMut::new();
                        write_reply(&mut buf, &r);
                        assert_eq!(
                            std::str::from_utf8(&buf).unwrap(),
                            serde_json::to_string(&r).unwrap()
                        );
                    }
                }
            }
        }
    }
}
