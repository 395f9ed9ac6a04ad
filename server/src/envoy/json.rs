//! `POST /json`: the same request and response in proto3 JSON, and `GET /healthcheck`.
//!
//! The request is read as proto3 JSON is: field names in lowerCamelCase or as in the
//! `.proto` (`hitsAddend` or `hits_addend`), 64-bit and wrapper numbers as numbers or
//! strings, enums by name or number; an unknown field is an error. The response is written
//! as `protojson` writes it: lowerCamelCase, default values left out, enums by name,
//! durations as `"42s"`. The status is 200 for OK, 429 for OVER_LIMIT, 400 for a request
//! that cannot be read or is invalid. A request header `x-turnstile-explain: 1` adds the
//! answer's explanation in the response header of that name (`super::explain`).
//!
//! `envoy-types` has no serde support, so this mapping is written here; it covers the
//! request and response messages only.

use super::engine::Envoy;
use super::explain::{asks, EXPLAIN};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value as PbValue};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The routes `POST /json` and `GET /healthcheck`, to merge into the HTTP listener's router;
/// a body of at most `max_body` bytes (`--max-body`, as every route's).
pub fn json_router(envoy: Arc<Envoy>, max_body: usize) -> Router {
    Router::new()
        .route("/json", post(handle_json))
        .route("/healthcheck", get(|| async { "OK" }))
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .with_state(envoy)
}

async fn handle_json(
    State(envoy): State<Arc<Envoy>>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        // `--body-memory`: the server holds as many bodies as it may; a retry may pass.
        Err(e) if crate::listen::budget::is_budget(&e) => {
            let text = crate::listen::budget::BodyBudget.to_string();
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(axum::http::header::RETRY_AFTER, "1")],
                text,
            )
                .into_response();
        }
        Err(e) => return e.into_response(),
    };
    let req = match parse_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    let asked = headers.get(EXPLAIN).map(|v| v.to_str().map_err(|_| ()));
    let explained = match asks(asked) {
        // Explained from peeks just before the answer counts, as over gRPC.
        Ok(true) => envoy.explain(&req).ok(),
        Ok(false) => None,
        Err(m) => return (StatusCode::BAD_REQUEST, m).into_response(),
    };
    match envoy.should_rate_limit(&req) {
        Ok(resp) => {
            let status = if resp.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let mut r = (
                status,
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                response_json(&resp).to_string(),
            )
                .into_response();
            // ASCII JSON is always a valid header value.
            if let Some(Ok(v)) = explained.map(|x| x.to_ascii_json().parse()) {
                r.headers_mut().insert(EXPLAIN, v);
            }
            r
        }
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

fn fields<'a>(v: &'a Value, what: &str, known: &[&str]) -> Result<&'a Map<String, Value>, String> {
    let m = v
        .as_object()
        .ok_or_else(|| format!("{what}: expected an object"))?;
    for k in m.keys() {
        if !known.contains(&k.as_str()) {
            return Err(format!("{what}: unknown field `{k}`"));
        }
    }
    Ok(m)
}

fn field<'a>(m: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    m.get(camel)
        .or_else(|| m.get(snake))
        .filter(|v| !v.is_null())
}

fn uint(v: &Value, what: &str, max: u64) -> Result<u64, String> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse::<u64>().ok(),
        _ => None,
    };
    n.filter(|&n| n <= max)
        .ok_or_else(|| format!("{what}: expected a whole number from 0 to {max}"))
}

fn string(v: &Value, what: &str) -> Result<String, String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{what}: expected a string"))
}

/// Reads a `RateLimitRequest` from proto3 JSON.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    let m = fields(
        &v,
        "request",
        &["domain", "descriptors", "hitsAddend", "hits_addend"],
    )?;
    let mut req = RateLimitRequest {
        domain: field(m, "domain", "domain")
            .map(|d| string(d, "domain"))
            .transpose()?
            .unwrap_or_default(),
        ..Default::default()
    };
    if let Some(h) = field(m, "hitsAddend", "hits_addend") {
        req.hits_addend = uint(h, "hitsAddend", u32::MAX as u64)? as u32;
    }
    if let Some(ds) = field(m, "descriptors", "descriptors") {
        let ds = ds.as_array().ok_or("descriptors: expected an array")?;
        for (i, d) in ds.iter().enumerate() {
            req.descriptors.push(parse_descriptor(i, d)?);
        }
    }
    Ok(req)
}

fn parse_descriptor(i: usize, d: &Value) -> Result<RateLimitDescriptor, String> {
    let what = format!("descriptors[{i}]");
    let m = fields(
        d,
        &what,
        &[
            "entries",
            "limit",
            "hitsAddend",
            "hits_addend",
            "isNegativeHits",
            "is_negative_hits",
        ],
    )?;
    let mut out = RateLimitDescriptor::default();
    if let Some(es) = field(m, "entries", "entries") {
        let es = es
            .as_array()
            .ok_or_else(|| format!("{what}.entries: expected an array"))?;
        for (j, e) in es.iter().enumerate() {
            let w = format!("{what}.entries[{j}]");
            let em = fields(e, &w, &["key", "value"])?;
            out.entries.push(Entry {
                key: field(em, "key", "key")
                    .map(|k| string(k, &w))
                    .transpose()?
                    .unwrap_or_default(),
                value: field(em, "value", "value")
                    .map(|k| string(k, &w))
                    .transpose()?
                    .unwrap_or_default(),
            });
        }
    }
    if let Some(l) = field(m, "limit", "limit") {
        let w = format!("{what}.limit");
        let lm = fields(l, &w, &["requestsPerUnit", "requests_per_unit", "unit"])?;
        let rpu = field(lm, "requestsPerUnit", "requests_per_unit")
            .map(|v| uint(v, &w, u32::MAX as u64))
            .transpose()?
            .unwrap_or(0) as u32;
        let unit = match field(lm, "unit", "unit") {
            None => 0,
            Some(Value::String(s)) => PbUnit::from_str_name(s)
                .map(|u| u as i32)
                .ok_or_else(|| format!("{w}.unit: unknown unit `{s}`"))?,
            Some(v) => uint(v, &format!("{w}.unit"), i32::MAX as u64)? as i32,
        };
        out.limit = Some(RateLimitOverride {
            requests_per_unit: rpu,
            unit,
        });
    }
    if let Some(h) = field(m, "hitsAddend", "hits_addend") {
        out.hits_addend = Some(UInt64Value {
            value: uint(h, &format!("{what}.hitsAddend"), u64::MAX)?,
        });
    }
    if let Some(n) = field(m, "isNegativeHits", "is_negative_hits") {
        out.is_negative_hits = n
            .as_bool()
            .ok_or_else(|| format!("{what}.isNegativeHits: expected true or false"))?;
    }
    Ok(out)
}

fn code_name(c: i32) -> &'static str {
    Code::try_from(c).map_or("UNKNOWN", |c| c.as_str_name())
}

/// Writes a `RateLimitResponse` as proto3 JSON.
pub fn response_json(r: &RateLimitResponse) -> Value {
    let mut o = Map::new();
    if r.overall_code != 0 {
        o.insert("overallCode".into(), json!(code_name(r.overall_code)));
    }
    if !r.statuses.is_empty() {
        let statuses: Vec<Value> = r
            .statuses
            .iter()
            .map(|s| {
                let mut m = Map::new();
                if s.code != 0 {
                    m.insert("code".into(), json!(code_name(s.code)));
                }
                if let Some(l) = &s.current_limit {
                    let mut lm = Map::new();
                    if !l.name.is_empty() {
                        lm.insert("name".into(), json!(l.name));
                    }
                    if l.requests_per_unit != 0 {
                        lm.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                    }
                    if l.unit != 0 {
                        let u = PbUnit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name());
                        lm.insert("unit".into(), json!(u));
                    }
                    m.insert("currentLimit".into(), Value::Object(lm));
                }
                if s.limit_remaining != 0 {
                    m.insert("limitRemaining".into(), json!(s.limit_remaining));
                }
                if let Some(d) = &s.duration_until_reset {
                    m.insert(
                        "durationUntilReset".into(),
                        json!(format!("{}s", d.seconds)),
                    );
                }
                Value::Object(m)
            })
            .collect();
        o.insert("statuses".into(), Value::Array(statuses));
    }
    if !r.response_headers_to_add.is_empty() {
        let hs: Vec<Value> = r
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        o.insert("responseHeadersToAdd".into(), Value::Array(hs));
    }
    if let Some(m) = &r.dynamic_metadata {
        o.insert("dynamicMetadata".into(), struct_json(m));
    }
    Value::Object(o)
}

/// A `google.protobuf.Struct` as proto3 JSON writes it: a plain object (a number that JSON
/// cannot hold, NaN or infinite, as its name in a string, as protojson does).
fn struct_json(s: &Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &PbValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n).map_or_else(
            || {
                json!(if n.is_nan() {
                    "NaN"
                } else if *n > 0.0 {
                    "Infinity"
                } else {
                    "-Infinity"
                })
            },
            Value::Number,
        ),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_field_spellings() {
        let a = parse_request(br#"{"domain":"d","hitsAddend":"3","descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":0}]}"#).unwrap();
        let b = parse_request(br#"{"domain":"d","hits_addend":3,"descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requests_per_unit":"5","unit":2},"hits_addend":"0"}]}"#).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.descriptors[0].hits_addend, Some(UInt64Value { value: 0 }));
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse_request(br#"{"domain":"d","descriptors":[{"entries":[{"key":1}]}]}"#)
            .unwrap_err();
        assert!(e.contains("descriptors[0].entries[0]"), "{e}");
        let e = parse_request(br#"{"domain":"d","extra":1}"#).unwrap_err();
        assert!(e.contains("unknown field `extra`"), "{e}");
        assert!(parse_request(b"{").unwrap_err().contains("invalid JSON"));
    }
}
