//! The one place that calls the library: builds `FCALL`, and when Redis answers that the
//! function is not there (a restart, a failover to a node without it, `FUNCTION FLUSH`) loads
//! the library and calls again, all within the per-call timeout; for single calls and for
//! pipelines alike. The shape of redis-rs's `ScriptInvocation::invoke_async` (EVALSHA, then
//! on `NOSCRIPT` load and retry), with a timeout and a pipeline of its own: the store needs
//! `Cmd` values to pipeline and to time out.

use crate::conn::Conn;
use crate::error::Error;
use crate::script::{library, Library};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ToRedisArgs, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::Instrument;

/// Whether each call is a span (a child of the request's: turnstile-server's request spans).
static SPANS: AtomicBool = AtomicBool::new(false);

/// Makes each call to Redis made within a span a span of target `turnstile::span` (`FCALL` or
/// `PIPELINE`, with the number of commands and the outcome), that span's child; for the rest
/// of the process. Off, a call pays one relaxed load.
pub fn enable_call_spans() {
    // Relaxed: a flag set once at start, ordering nothing.
    SPANS.store(true, Ordering::Relaxed);
}

/// A call's span (`operation`: `FCALL` or `PIPELINE`), if spans are on.
fn span(operation: &'static str, commands: usize) -> Option<tracing::Span> {
    // Relaxed: see enable_call_spans.
    if !SPANS.load(Ordering::Relaxed) {
        return None;
    }
    // Children only: a request that was not sampled has no span, nor have its calls.
    if tracing::Span::current().is_none() {
        return None;
    }
    Some(tracing::info_span!(
        target: "turnstile::span",
        "redis",
        otel.name = operation,
        otel.kind = "client",
        db.system.name = "redis",
        db.operation.name = operation,
        db.operation.batch.size = commands,
        otel.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    ))
}

/// Runs `f` within `span` (if any), marking the span failed when `f` fails.
async fn spanned<T>(
    span: Option<tracing::Span>,
    f: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let Some(span) = span else { return f.await };
    let r = f.instrument(span.clone()).await;
    if let Err(e) = &r {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", e.kind());
    }
    r
}

/// Calls the library's functions over one connection, each call (with its reload) within
/// `timeout`.
#[derive(Clone)]
pub(crate) struct Caller {
    conn: Conn,
    timeout: Duration,
    lib: &'static Library,
}

/// Whether `detail` (a server error's text) says the function is missing.
fn function_missing(code: Option<&str>, detail: Option<&str>) -> bool {
    code == Some("ERR") && detail.is_some_and(|d| d.starts_with("Function not found"))
}

fn missing(e: &redis::RedisError) -> bool {
    function_missing(e.code(), e.detail())
}

fn missing_value(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if function_missing(Some(e.code()), e.details()))
}

/// `FCALL function keys.len() keys... args...`: the only builder of a call.
pub(crate) fn fcall<K: ToRedisArgs, A: ToRedisArgs>(function: &str, keys: &[K], args: A) -> Cmd {
    let mut c = redis::cmd("FCALL");
    c.arg(function).arg(keys.len()).arg(keys).arg(args);
    c
}

/// `FCALL`'s first key (what routes it in a Cluster).
fn first_key(cmd: &Cmd) -> Option<Vec<u8>> {
    let mut args = cmd.args_iter().skip(2);
    match (args.next(), args.next()) {
        (Some(redis::Arg::Simple(n)), Some(redis::Arg::Simple(k))) if n != b"0" => Some(k.to_vec()),
        _ => None,
    }
}

impl Caller {
    pub(crate) fn new(conn: Conn, timeout: Duration) -> Self {
        Self {
            conn,
            timeout,
            lib: library(),
        }
    }

    /// The per-call timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The store's function name.
    pub(crate) fn store_fn(&self) -> &'static str {
        &self.lib.store
    }

    /// A plain-commands store's refund (plain.lua).
    pub(crate) fn plain_fn(&self) -> &'static str {
        &self.lib.plain
    }

    /// The rules engine's function name.
    pub(crate) fn rules_fn(&self) -> &'static str {
        &self.lib.rules
    }

    /// The library's name (what `FUNCTION LIST` shows).
    pub(crate) fn library_name(&self) -> &'static str {
        &self.lib.name
    }

    pub(crate) fn conn(&self) -> &Conn {
        &self.conn
    }

    /// Loads the library (`FUNCTION LOAD REPLACE`: the same text under the same name, so two
    /// clients loading at once both succeed): on the node holding `key`'s slot in a Cluster
    /// (the node that answered), else on every master; one node otherwise.
    pub(crate) async fn load(&self, conn: &mut Conn, key: Option<&[u8]>) -> Result<(), Error> {
        let mut c = redis::cmd("FUNCTION");
        c.arg("LOAD").arg("REPLACE").arg(&self.lib.code);
        let r = match (conn, key) {
            (Conn::Cluster(cc), Some(k)) => {
                let route = Route::with_key(k, SlotAddr::Master);
                let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                cc.route_command(c, to).await.map(|_| ())
            }
            (conn, _) => c.query_async::<Value>(conn).await.map(|_| ()),
        };
        r.map_err(|e| {
            if e.detail()
                .is_some_and(|d| d.contains("unknown command") || d.contains("unknown subcommand"))
            {
                Error::Reply(format!(
                    "Redis does not know FUNCTION ({e}): turnstile-redis needs Redis 7.0 or later"
                ))
            } else {
                Error::Redis(e)
            }
        })
    }

    /// One call within the timeout; a missing function is loaded and the call repeated.
    pub(crate) async fn call(&self, cmd: &Cmd) -> Result<Value, Error> {
        let mut conn = self.conn.clone();
        let run = async {
            match cmd.query_async::<Value>(&mut conn).await {
                Err(e) if missing(&e) => {
                    self.load(&mut conn, first_key(cmd).as_deref()).await?;
                    Ok(cmd.query_async::<Value>(&mut conn).await?)
                }
                r => Ok(r?),
            }
        };
        let timed = async {
            match tokio::time::timeout(self.timeout, run).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout(self.timeout)),
            }
        };
        spanned(span("FCALL", 1), timed).await
    }

    /// Plain commands (no function: nothing to reload) within the timeout.
    pub(crate) async fn plain(&self, pipe: &redis::Pipeline) -> Result<Vec<Value>, Error> {
        let mut conn = self.conn.clone();
        let timed = async {
            match tokio::time::timeout(self.timeout, pipe.query_async(&mut conn)).await {
                Ok(r) => Ok(r?),
                Err(_) => Err(Error::Timeout(self.timeout)),
            }
        };
        spanned(span("PIPELINE", pipe.cmd_iter().count()), timed).await
    }

    /// The calls in one pipeline (one node) within the timeout; the replies in order, a
    /// failed call's as its `Value::ServerError`. Calls that found the function missing are
    /// repeated, in a second pipeline, once it is loaded.
    pub(crate) async fn pipeline(&self, cmds: &[Cmd]) -> Result<Vec<Value>, Error> {
        let mut conn = self.conn.clone();
        let run = async {
            let mut pipe = redis::pipe();
            for c in cmds {
                pipe.add_command(c.clone());
            }
            pipe.ignore_errors();
            let mut vals: Vec<Value> = pipe.query_async(&mut conn).await?;
            let again: Vec<usize> = (0..vals.len())
                .filter(|&i| missing_value(&vals[i]))
                .collect();
            if let Some(&first) = again.first() {
                self.load(&mut conn, first_key(&cmds[first]).as_deref())
                    .await?;
                let mut p2 = redis::pipe();
                for &i in &again {
                    p2.add_command(cmds[i].clone());
                }
                p2.ignore_errors();
                let redo: Vec<Value> = p2.query_async(&mut conn).await?;
                for (i, v) in again.into_iter().zip(redo) {
                    vals[i] = v;
                }
            }
            Ok::<_, Error>(vals)
        };
        let timed = async {
            match tokio::time::timeout(self.timeout, run).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout(self.timeout)),
            }
        };
        spanned(span("PIPELINE", cmds.len()), timed).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_its_function_keys_and_arguments() {
        let c = fcall("ts_abc", &["k1", "k2"], &["spec", "c", "1"]);
        let args: Vec<Vec<u8>> = c
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let want: Vec<&[u8]> = vec![b"FCALL", b"ts_abc", b"2", b"k1", b"k2", b"spec", b"c", b"1"];
        assert_eq!(args, want);
        assert_eq!(first_key(&c).as_deref(), Some(&b"k1"[..]));
        assert_eq!(first_key(&fcall::<&str, _>("f", &[], &["a"])), None);
    }

    #[test]
    fn only_a_missing_function_is_reloaded() {
        assert!(function_missing(Some("ERR"), Some("Function not found")));
        assert!(!function_missing(
            Some("ERR"),
            Some("wrong number of arguments")
        ));
        assert!(!function_missing(
            Some("NOSCRIPT"),
            Some("Function not found")
        ));
        assert!(!function_missing(Some("ERR"), None));
    }
}
