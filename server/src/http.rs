//! The HTTP API (axum): `POST /v1/check`, `GET /metrics`, `GET /healthz`, `POST /v1/reload`,
//! and with `--envoy-config` Envoy's `POST /json` and `GET /healthcheck`
//! ([`crate::envoy::json_router`], whose own body limit applies). Errors are JSON
//! `{"error": "..."}`; a body over `--max-body` gets 413.

use crate::conn::{count, ms_up, request};
use crate::metrics::C;
use crate::Shared;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use turnstile::rules::Priority;
use turnstile::{Clock, DefaultClock};

/// The body of `POST /v1/check`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    /// `customer`, `ip`, `api_key`, `route`, `method`, or parts joined by `+`.
    key_class: String,
    /// The key (parts joined by `|` for a composite class).
    key: String,
    /// Units (default 1; 0 looks without consuming).
    #[serde(default = "one")]
    cost: u64,
    /// critical, post, get or test (default: from the method).
    priority: Option<String>,
    /// The route, if the key class does not already give it.
    route: Option<String>,
    /// The method, if the key class does not already give it.
    method: Option<String>,
}

fn one() -> u64 {
    1
}

fn error(shared: &Shared, status: StatusCode, msg: impl Into<String>) -> Response {
    shared.metrics.add(C::HttpErrors, 1);
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

async fn check(State(s): State<Arc<Shared>>, body: Result<Bytes, BytesRejection>) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let status = e.status();
            return error(
                &s,
                status,
                format!("{} (the limit is {} bytes)", e.body_text(), s.args.max_body),
            );
        }
    };
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
    let Some(engine) = &s.engine else {
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
        req.route = b.route.as_deref();
    }
    if req.method.is_none() {
        req.method = b.method.as_deref();
    }
    if let Some(p) = &b.priority {
        match p.parse::<Priority>() {
            Ok(p) => req.priority = Some(p),
            Err(e) => return error(&s, StatusCode::BAD_REQUEST, e),
        }
    }
    let v = match s.backends.redis() {
        Some(redis) => redis.explain(engine, &req).await,
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
    let retry_ms = d.retry_after_ns.map(ms_up);
    let body = json!({
        "allowed": d.allowed(),
        "outcome": format!("{:?}", d.outcome),
        "limit": count(d.limit),
        "remaining": count(d.remaining),
        "retry_after_ms": retry_ms,
        "reset_after_ms": ms_up(d.reset_after_ns),
        "rule": v.rule.as_deref(),
        "shed": v.shed,
    });
    let mut h = HeaderMap::new();
    let secs = |ns: u64| ns.div_ceil(1_000_000_000).to_string();
    if d.limit != u64::MAX {
        let hv = |s: String| HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static("0"));
        h.insert("ratelimit-limit", hv(d.limit.to_string()));
        h.insert("ratelimit-remaining", hv(d.remaining.to_string()));
        h.insert("ratelimit-reset", hv(secs(d.reset_after_ns)));
        if let Some(r) = d.retry_after_ns {
            h.insert(header::RETRY_AFTER, hv(secs(r)));
        }
    }
    let status = if d.allowed() {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    (status, h, Json(body)).into_response()
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
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

async fn healthz(State(s): State<Arc<Shared>>) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    Json(json!({ "status": "ok" })).into_response()
}

async fn reload(State(s): State<Arc<Shared>>) -> Response {
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

async fn not_found(State(s): State<Arc<Shared>>, uri: axum::http::Uri) -> Response {
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

/// Serves HTTP on `l` until shutdown.
pub(crate) async fn serve(shared: Arc<Shared>, l: tokio::net::TcpListener) {
    let mut app = Router::new()
        .route("/v1/check", post(check))
        .route("/v1/reload", post(reload))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(shared.args.max_body))
        .with_state(shared.clone());
    if let Some(e) = &shared.envoy {
        app = app.merge(crate::envoy::json_router(e.clone()));
    }
    let mut stop = shared.shutdown.subscribe();
    let r = axum::serve(l, app)
        .with_graceful_shutdown(async move {
            crate::stopped(&mut stop).await;
        })
        .await;
    if let Err(e) = r {
        tracing::error!(error = %e, "HTTP server failed");
    }
}
