//! `GET`, `PUT`, `DELETE /v1/limits/{class}/{key}`: a key's own limit in a limits class
//! ([`crate::limits`]). PUT's body is the entry as a limits file gives it: the text of a CSV
//! value (`pro`, `5/1s burst=10`), or a JSON Lines entry (`{"plan": "pro"}`, `{"limit": 5,
//! "window": "1s", "burst": 10}`) when it is sent as `application/json` or starts with `{`.
//! PUT and DELETE need admin (`Dispatch` checks it before the body is read).

use super::error;
use crate::limits::{Done, Op, Request};
use crate::metrics::C;
use crate::state::Server;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::Arc;

/// `GET /v1/limits/{class}/{key}`.
pub(super) async fn get(
    State(s): State<Arc<Server>>,
    Path((class, key)): Path<(String, String)>,
) -> Response {
    run(s, class, key, Op::Get).await
}

/// `DELETE /v1/limits/{class}/{key}`.
pub(super) async fn delete(
    State(s): State<Arc<Server>>,
    Path((class, key)): Path<(String, String)>,
) -> Response {
    run(s, class, key, Op::Del).await
}

/// `PUT /v1/limits/{class}/{key}`, the entry in the body.
pub(super) async fn put(
    State(s): State<Arc<Server>>,
    Path((class, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    let bytes = match super::body::read_body(&s, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return error(&s, StatusCode::BAD_REQUEST, "the body must be UTF-8 text");
    };
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"))
        || text.trim_start().starts_with('{');
    let op = if json {
        Op::SetJson(text.to_string())
    } else {
        Op::Set(text.trim().to_string())
    };
    answer(&s, &class, &key, s.clone(), op).await
}

async fn run(s: Arc<Server>, class: String, key: String, op: Op) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    answer(&s, &class, &key, s.clone(), op).await
}

async fn answer(s: &Server, class: &str, key: &str, srv: Arc<Server>, op: Op) -> Response {
    let req = Request {
        class: class.to_string(),
        key: key.to_string(),
        op,
    };
    match crate::limits::run(srv.checks.engine.clone(), req).await {
        Err(e) => error(s, e.status, e.message),
        Ok(Done::Set(entry)) => {
            Json(json!({ "class": class, "key": key, "entry": entry })).into_response()
        }
        Ok(Done::Del(had)) => {
            Json(json!({ "class": class, "key": key, "removed": had })).into_response()
        }
        Ok(Done::Get {
            entry,
            limit,
            decides,
        }) => Json(json!({
            "class": class, "key": key, "entry": entry, "limit": limit, "decides": decides,
        }))
        .into_response(),
    }
}
