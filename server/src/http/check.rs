//! `POST /v1/check`, the hot endpoint: its body read without allocating, the request decided
//! by the rules engine, the reply and its rate-limit headers written into one buffer.

use super::{error, RateLimitHeaders};
use crate::check::{count, ms_up, request};
use crate::explain::outcome_name as outcome;
use crate::metrics::C;
use crate::state::Server;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::{BufMut, BytesMut};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;
use turnstile::rules::{Priority, Request, Verdict};
use turnstile::{Clock, DefaultClock};
use turnstile_tower::{write_headers, HeaderStyle, Policy};

/// The body of `POST /v1/check`. Strings borrow from the request's bytes (`Cow`: owned only
/// when the JSON string has escapes), so a check allocates nothing to read its body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CheckBody<'a> {
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

/// The policy the draft-10 fields name: one for the whole API, "default", no window (the
/// rules' windows differ per rule; the decision does not say which one applied).
static POLICY: std::sync::LazyLock<Policy> = std::sync::LazyLock::new(Policy::default);
static JSON: HeaderValue = HeaderValue::from_static("application/json");

fn one() -> u64 {
    1
}

/// `POST /v1/check` from [`Dispatch`](super::Dispatch): the body read up to `--max-body`
/// (413 past it, as the router's `DefaultBodyLimit` answers), then decided.
pub(super) async fn check_direct(s: Arc<Server>, body: Body) -> Response {
    s.metrics.add(C::HttpRequests, 1);
    let body = match super::body::read_body(&s, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    check_body(s, body).await
}

/// `POST /v1/check` with its body read: the request it asks for, decided, counted and
/// answered.
async fn check_body(s: Arc<Server>, body: Bytes) -> Response {
    let b: CheckBody = match super::body::parse_json(&body, "") {
        Ok(b) => b,
        Err(m) => return super::body::bad_json(&s, m),
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
    let req = match request_of(&b) {
        Ok(r) => r,
        Err(m) => return error(&s, StatusCode::BAD_REQUEST, m),
    };
    let v = match s.checks.backends.redis() {
        // Boxed: the Redis round trip's future is large, and the in-memory path should not
        // carry (and copy, when axum boxes the handler's future) its space on every request.
        Some(redis) => Box::pin(redis.explain(engine, &req)).await,
        None => engine.explain(&req),
    };
    let d = v.decision;
    if crate::spans::on() {
        crate::spans::verdict(d.allowed(), &b.key_class, v.rule.as_deref());
    }
    s.metrics.latency(clock.now().saturating_sub(t0));
    s.metrics.add(C::HttpChecks, 1);
    s.metrics.add(
        if d.allowed() {
            C::CheckAllowed
        } else {
            crate::denied::record_rules(v.rule.as_deref(), &b.key_class, &b.key);
            C::CheckDenied
        },
        1,
    );
    respond(&s, &v)
}

/// The rules request a body asks for.
pub(super) fn request_of<'a>(b: &'a CheckBody<'a>) -> Result<Request<'a>, String> {
    let mut req = request(&b.key_class, &b.key)?;
    req.cost = b.cost;
    if req.route.is_none() {
        req.route = b.route.as_ref().map(|t| &*t.0);
    }
    if req.method.is_none() {
        req.method = b.method.as_ref().map(|t| &*t.0);
    }
    if let Some(p) = &b.priority {
        req.priority = Some(p.0.parse::<Priority>().map_err(|e| e.to_string())?);
    }
    Ok(req)
}

/// The answer to a check: 200 or 429, the JSON reply, the rate-limit headers.
fn respond(s: &Server, v: &Verdict) -> Response {
    let d = v.decision;
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
