//! Request bodies as the handlers read them: whole, up to `--max-body` (413 past it, 503 when
//! the server holds as many bodies as it may: `--body-memory`), then as JSON (400 with serde's
//! reason). One reading for every route that takes a body.

use super::{busy, error};
use crate::state::Server;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

/// `body` whole, or the answer refusing it: 413 past `--max-body`, 503 past what the server
/// may hold (`--body-memory`, the connection's share), 400 if the client broke it off.
pub(super) async fn read_body(s: &Server, body: Body) -> Result<Bytes, Response> {
    use http_body_util::BodyExt;
    let limit = s.http.max_body;
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if crate::listen::budget::is_budget(&*e) => Err(busy(s)),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(error(
            s,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is over {limit} bytes (--max-body)"),
        )),
        Err(e) => Err(error(
            s,
            StatusCode::BAD_REQUEST,
            format!("the request body could not be read: {e}"),
        )),
    }
}

/// `bytes` as a `T` (which may borrow from them), or the message of the 400 that refuses
/// them ([`bad_json`]): serde's reason and `expected` (what such a body is; may be empty).
pub(super) fn parse_json<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
    expected: &str,
) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON body: {e}{expected}"))
}

/// The 400 of a body [`parse_json`] refused with `msg`.
pub(super) fn bad_json(s: &Server, msg: String) -> Response {
    error(s, StatusCode::BAD_REQUEST, msg)
}

/// [`read_body`], then [`parse_json`], for a `T` that owns its strings.
pub(super) async fn read_json<T: serde::de::DeserializeOwned>(
    s: &Server,
    body: Body,
    expected: &str,
) -> Result<T, Response> {
    let bytes = read_body(s, body).await?;
    parse_json(&bytes, expected).map_err(|m| bad_json(s, m))
}
