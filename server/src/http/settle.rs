//! `POST /v1/settle`: a cost known only after the work, settled against the cost a
//! `POST /v1/check` reserved ([`crate::check::Checks::settle`]). Its body is the check's, with
//! `reserved` (the check's `cost`) and `actual` in place of `cost`: send the same key, route,
//! method and priority as the check, so that the same rules are settled.

use super::body::read_json;
use super::error;
use crate::check::{count, ms_up, request, SettleError};
use crate::metrics::C;
use crate::state::Server;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use turnstile::rules::Priority;

/// The body of `POST /v1/settle`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody {
    /// `customer`, `ip`, `api_key`, `route`, `method`, or parts joined by `+`.
    key_class: String,
    /// The key (parts joined by `|` for a composite class).
    key: String,
    /// The cost the check took (its `cost`).
    reserved: u64,
    /// The cost the work turned out to have.
    actual: u64,
    /// critical, post, get or test (default: from the method), as the check's.
    #[serde(default)]
    priority: Option<String>,
    /// The route, if the key class does not already give it.
    #[serde(default)]
    route: Option<String>,
    /// The method, if the key class does not already give it.
    #[serde(default)]
    method: Option<String>,
}

/// The answer: what was settled, then where the key stands right after it (a peek's limit,
/// remaining and reset: `TURNSTILE.SETTLE`'s reply).
#[derive(Serialize)]
struct SettleReply {
    /// Rules settled (0: none applies).
    settled: u32,
    /// The difference charged, in the request's units (each rule takes it times its cost).
    charged: u64,
    /// The difference given back, likewise.
    given_back: u64,
    limit: i64,
    remaining: i64,
    reset_after_ms: i64,
}

/// `POST /v1/settle`: 200 with what was settled; 400 for a body that is not a settle, 503
/// without rules, 502 when the counts are in Redis and Redis did not take it (nothing
/// settled there).
pub(super) async fn settle(State(s): State<Arc<Server>>, body: Body) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    let expected = "; expected {\"key_class\", \"key\", \"reserved\", \"actual\", \"priority\"?, \"route\"?, \"method\"?}";
    let b: SettleBody = match read_json(&s, body, expected).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut req = match request(&b.key_class, &b.key) {
        Ok(r) => r,
        Err(m) => return error(&s, StatusCode::BAD_REQUEST, m),
    };
    req.cost = b.reserved;
    if req.route.is_none() {
        req.route = b.route.as_deref();
    }
    if req.method.is_none() {
        req.method = b.method.as_deref();
    }
    if let Some(p) = &b.priority {
        match p.parse::<Priority>() {
            Ok(p) => req.priority = Some(p),
            Err(m) => return error(&s, StatusCode::BAD_REQUEST, m.to_string()),
        }
    }
    let t0 = s.metrics.now();
    let r = match s.checks.redis() {
        Some(redis) => s.checks.settle_remote(&redis, &req, b.actual).await,
        None => s.checks.settle(&req, b.actual),
    };
    s.metrics.latency(s.metrics.now().saturating_sub(t0));
    let done = match r {
        Ok(d) => d,
        Err(e) => {
            let status = match e {
                SettleError::NoRules => StatusCode::SERVICE_UNAVAILABLE,
                SettleError::Redis(_) => StatusCode::BAD_GATEWAY,
            };
            return error(&s, status, e.to_string());
        }
    };
    s.metrics.add(C::Settles, 1);
    let d = &done.after.decision;
    Json(SettleReply {
        settled: done.rules,
        charged: done.charged,
        given_back: done.given_back,
        limit: count(d.limit),
        remaining: count(d.remaining),
        reset_after_ms: ms_up(d.reset_after_ns),
    })
    .into_response()
}
