//! `POST /v1/check?explain=1`: the check's body, explained instead of checked
//! ([`crate::explain`]): 200 with the explanation as JSON whatever the check would answer
//! (the explanation's `allowed` says that), counting nothing; 400 for a body that is not a
//! check, 503 without rules, 501 with the counts in Redis.

use super::body::{bad_json, parse_json, read_body};
use super::check::{request_of, CheckBody};
use super::error;
use crate::explain::{tree, ExplainError};
use crate::metrics::C;
use crate::state::Server;
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use std::sync::Arc;

/// Explains the check `body` asks for.
pub(super) async fn explain(s: Arc<Server>, body: Body) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    let bytes = match read_body(&s, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let b: CheckBody = match parse_json(&bytes, "") {
        Ok(b) => b,
        Err(m) => return bad_json(&s, m),
    };
    let req = match request_of(&b) {
        Ok(r) => r,
        Err(m) => return error(&s, StatusCode::BAD_REQUEST, m),
    };
    let x = match s.checks.explanation(&req) {
        Ok(x) => x,
        Err(e) => {
            let status = match e {
                ExplainError::NoRules => StatusCode::SERVICE_UNAVAILABLE,
                ExplainError::Redis => StatusCode::NOT_IMPLEMENTED,
            };
            return error(&s, status, e.to_string());
        }
    };
    s.metrics.add(C::Explains, 1);
    // Writing a tree of numbers and strings to memory cannot fail.
    let json = serde_json::to_vec(&tree(&x)).unwrap_or_default();
    let mut res = Response::new(Body::from(json));
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}
