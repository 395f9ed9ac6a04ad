//! Keys' own limits, managed live: `TURNSTILE.LIMITS SET|GET|DEL class key [spec]` over RESP
//! (`cmd::limits`) and `PUT|GET|DELETE /v1/limits/{class}/{key}` over HTTP (`http::limits`),
//! on the rules engine's limits classes (docs/rules.md, "Keys' own limits").
//!
//! A class's source may do network I/O on `set`, `remove` and `entry` (one in front of Redis
//! waits for a round trip): an operation never runs on an I/O worker. [`run`] hands it to the
//! runtime's blocking pool and is awaited by the connection (RESP: as a
//! [`crate::cmd::remote::RemoteCall`]) or the request; the worker serves the others meanwhile.
//! Bounds: a RESP connection has at most one operation out (it reads nothing more until the
//! answer), an HTTP request one; tokio's blocking pool runs at most 512 at once per runtime
//! and queues the rest.

use crate::snapshot::RulesEngine;
use axum::http::StatusCode;
use std::sync::Arc;
use turnstile::rules::limits::{KeyLimit, LimitsClass, Lookup};

/// What to do with a key's entry.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// Its entry, and what decides for the key now.
    Get,
    /// Sets its entry: a limits file's value (`pro`, `5/1s burst=10`).
    Set(String),
    /// Sets its entry from a JSON Lines entry (`{"plan": "pro"}`, `{"limit": 5, "window":
    /// "1s"}`; its `key`, if given, must be the key's).
    SetJson(String),
    /// Removes its entry.
    Del,
}

impl Op {
    /// Whether it changes the server (and so needs the admin credential).
    pub(crate) fn changes(&self) -> bool {
        !matches!(self, Op::Get)
    }
}

/// One operation on one key of one class.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub(crate) class: String,
    pub(crate) key: String,
    pub(crate) op: Op,
}

/// What an operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Done {
    /// The entry set, as the class reads it back.
    Set(String),
    /// The key's entry as given (a plan's name or a limit), the limit that decides for it now
    /// (the plan's, or its own; `None`: the rule's override or limits), and which source of
    /// limits decides: `own`, `default` or `unknown` (a cache that has not fetched the key).
    Get {
        entry: Option<String>,
        limit: Option<String>,
        decides: &'static str,
    },
    /// Whether the key had an entry.
    Del(bool),
}

/// Why an operation was refused: its HTTP status and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

fn refused(status: StatusCode, message: impl Into<String>) -> Refused {
    Refused {
        status,
        message: message.into(),
    }
}

/// Runs `req` on the runtime's blocking pool (the source may wait for the network) and
/// answers when it is done; `engine`: the server's rules engine, if it was started with one.
pub(crate) async fn run(engine: Option<Arc<RulesEngine>>, req: Request) -> Result<Done, Refused> {
    match tokio::task::spawn_blocking(move || apply(engine.as_deref(), &req)).await {
        Ok(r) => r,
        Err(e) => Err(refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the limits operation failed: {e}"),
        )),
    }
}

/// Runs `req` here (it may block: see [`run`]).
pub(crate) fn apply(engine: Option<&RulesEngine>, req: &Request) -> Result<Done, Refused> {
    let Some(engine) = engine else {
        return Err(refused(
            StatusCode::CONFLICT,
            "no limits classes: the server was started without --rules",
        ));
    };
    let classes = engine.limits_classes();
    let (Some(class), Some(source)) = (
        classes.iter().find(|c| c.name == req.class),
        engine.limits(&req.class),
    ) else {
        return Err(refused(
            StatusCode::NOT_FOUND,
            no_class(&req.class, &classes),
        ));
    };
    let id = engine
        .limits_key_id(&req.class, &req.key)
        .map_err(|e| refused(StatusCode::BAD_REQUEST, e.to_string()))?;
    let bad = |e: String| refused(StatusCode::BAD_REQUEST, e);
    match &req.op {
        Op::Get => {
            let entry = source.entry(id);
            let decides = match source.get(id) {
                Lookup::Own(_) => "own",
                Lookup::Default => "default",
                Lookup::Unknown => "unknown",
            };
            let limit = entry.as_ref().and_then(|e| limit_text(class, e));
            Ok(Done::Get {
                entry: entry.map(|e| e.to_string()),
                limit: limit.filter(|_| decides == "own"),
                decides,
            })
        }
        Op::Set(_) | Op::SetJson(_) => {
            let entry = match &req.op {
                Op::Set(text) => class.parse(text).map_err(|e| bad(e.to_string()))?,
                Op::SetJson(json) => json_entry(class, &req.key, json).map_err(bad)?,
                _ => unreachable!("matched above"),
            };
            source
                .set(id, &entry)
                .map_err(|e| refused(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?;
            tracing::info!(class = %req.class, key = %req.key, entry = %entry, "limits entry set");
            Ok(Done::Set(entry.to_string()))
        }
        Op::Del => {
            let had = source
                .remove(id)
                .map_err(|e| refused(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?;
            tracing::info!(class = %req.class, key = %req.key, had, "limits entry removed");
            Ok(Done::Del(had))
        }
    }
}

/// The refusal of an unknown class: the classes there are.
fn no_class(name: &str, classes: &[LimitsClass]) -> String {
    if classes.is_empty() {
        return format!(
            "no limits class `{name}`: the rules define none (add a [limits.NAME] table)"
        );
    }
    let mut names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    format!(
        "no limits class `{name}`; the classes: {}",
        names.join(", ")
    )
}

/// The limit an entry stands for: a plan's definition, or the entry itself.
fn limit_text(class: &LimitsClass, e: &KeyLimit) -> Option<String> {
    match e {
        KeyLimit::Plan(p) => class
            .plans
            .iter()
            .find(|(n, _)| n == p)
            .map(|(_, s)| KeyLimit::Limit(s.clone()).to_string()),
        KeyLimit::Limit(_) => Some(e.to_string()),
    }
}

/// A JSON Lines entry for `key`: its `key` may be left out, and if given must be `key`.
fn json_entry(class: &LimitsClass, key: &str, json: &str) -> Result<KeyLimit, String> {
    let mut v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not a JSON entry: {e}"))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(
            "not a JSON entry: give an object such as {\"plan\": \"pro\"} or {\"limit\": 5, \"window\": \"1s\"}"
                .into(),
        );
    };
    obj.entry("key")
        .or_insert_with(|| serde_json::Value::String(key.to_string()));
    let (given, entry) = class
        .parse_json(&v.to_string())
        .map_err(|e| e.to_string())?;
    if given != key {
        return Err(format!(
            "the entry's key `{given}` is not the path's `{key}`: leave `key` out, or give the same"
        ));
    }
    Ok(entry)
}
