//! Request spans, for a tracing layer that exports them (OpenTelemetry in the `turnstile`
//! binary, docs/service.md "Tracing"): off until [`enable`], and then one span per request on
//! each protocol — a RESP command, an HTTP request, a gRPC `ShouldRateLimit` — with the
//! decision recorded on it; the Redis backend's calls are its children (turnstile-redis).
//!
//! Off, a request pays one relaxed load of a static flag and a branch: no span, no
//! allocation. The spans' target is [`TARGET`]; the server's log filters it out, so that only
//! the exporting layer sees them.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use tracing::field::Empty;
use tracing::Span;

/// The target of every request span (and of turnstile-redis's call spans).
pub const TARGET: &str = "turnstile::span";

static ON: AtomicBool = AtomicBool::new(false);

/// Sets a span's parent from a request's W3C `traceparent` and `tracestate` values (what the
/// exporting layer's propagator reads); installed by [`enable`].
pub type ParentHook = fn(&Span, &str, Option<&str>);

static PARENT: OnceLock<ParentHook> = OnceLock::new();

/// A root request is spanned when a random u64 is below this: `u64::MAX` always, 0 never.
static ROOTS: AtomicU64 = AtomicU64::new(u64::MAX);

thread_local! {
    /// This thread's random state for [`root_sampled`] (xorshift64*, seeded once per thread).
    static RNG: Cell<u64> = const { Cell::new(0) };
}

/// Turns the request spans on for the rest of the process (and turnstile-redis's call
/// spans), with `parent` to continue a caller's trace from its headers or metadata. Of the
/// requests without a caller's trace, a share `roots` (0 to 1: the root sampler's ratio) is
/// spanned, decided before the span is made: the exporting layer's sampler is then to keep
/// every root it is given. (A span made and then dropped by the sampler costs about 9 000
/// instructions: a CL.THROTTLE's worth three times.)
pub fn enable(parent: Option<ParentHook>, roots: f64) {
    if let Some(p) = parent {
        let _ = PARENT.set(p);
    }
    let t = if roots >= 1.0 {
        u64::MAX
    } else if roots > 0.0 {
        (roots * u64::MAX as f64) as u64
    } else {
        0
    };
    // Relaxed: read only after ON, itself relaxed: a request that sees the old value is one
    // more or one fewer spanned at start.
    ROOTS.store(t, Ordering::Relaxed);
    turnstile_redis::enable_call_spans();
    // Relaxed: the flag orders nothing; a request that reads it late is one more unspanned.
    ON.store(true, Ordering::Relaxed);
}

/// Whether requests are spanned.
#[inline(always)]
pub fn on() -> bool {
    // Relaxed: a flag set once at start, ordering nothing.
    ON.load(Ordering::Relaxed)
}

/// Whether a request without a caller's trace is spanned (the root sampler's ratio).
#[inline]
pub(crate) fn root_sampled() -> bool {
    // Relaxed: see enable.
    let t = ROOTS.load(Ordering::Relaxed);
    if t == u64::MAX {
        return true;
    }
    RNG.with(|r| {
        let mut x = r.get();
        if x == 0 {
            x = getrandom::u64().unwrap_or(0x9E37_79B9_7F4A_7C15) | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D) < t
    })
}

/// Whether an HTTP or gRPC request carries a caller's trace (then its span is made, and the
/// sampler follows the caller).
pub(crate) fn has_parent(headers: &http::HeaderMap) -> bool {
    PARENT.get().is_some() && headers.contains_key("traceparent")
}

/// The span of a RESP command, named after it (`unknown` for a command the table lacks: a
/// client's bytes never name a span).
pub(crate) fn resp(command: &'static str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "resp",
        otel.name = command,
        otel.kind = "server",
        turnstile.protocol = "resp",
        turnstile.command = command,
        turnstile.key_class = Empty,
        turnstile.rule = Empty,
        turnstile.decision = Empty,
    )
}

/// The span of an HTTP request: `{method} {route}`, the route one of the server's (or
/// `unknown`); its caller's trace continued from `traceparent`.
pub(crate) fn http(method: &http::Method, path: &str, headers: &http::HeaderMap) -> Span {
    let route = route(path);
    let name = format!("{method} {route}");
    let span = tracing::info_span!(
        target: TARGET,
        "http",
        otel.name = name.as_str(),
        otel.kind = "server",
        turnstile.protocol = "http",
        http.request.method = method.as_str(),
        http.route = route,
        http.response.status_code = Empty,
        turnstile.key_class = Empty,
        turnstile.rule = Empty,
        turnstile.decision = Empty,
    );
    parent(&span, headers);
    span
}

/// The span of a gRPC `ShouldRateLimit` for `domain`.
pub(crate) fn grpc(domain: &str, headers: &http::HeaderMap) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "grpc",
        otel.name = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        otel.kind = "server",
        turnstile.protocol = "grpc",
        rpc.system = "grpc",
        rpc.service = "envoy.service.ratelimit.v3.RateLimitService",
        rpc.method = "ShouldRateLimit",
        turnstile.domain = domain,
        turnstile.decision = Empty,
        rpc.grpc.status_code = Empty,
        otel.status_code = Empty,
    );
    parent(&span, headers);
    span
}

/// The server's routes, as a span names them (never the raw path: a client's path would be
/// a new span name per key).
fn route(path: &str) -> &'static str {
    match path {
        "/v1/check" => "/v1/check",
        "/v1/settle" => "/v1/settle",
        "/v1/reload" => "/v1/reload",
        "/metrics" => "/metrics",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/healthcheck" => "/healthcheck",
        "/json" => "/json",
        p if p.starts_with("/v1/limits/") => "/v1/limits/{class}/{key}",
        _ => "unknown",
    }
}

/// Continues the caller's trace, when its request carries a `traceparent`.
fn parent(span: &Span, headers: &http::HeaderMap) {
    let (Some(hook), Some(tp)) = (PARENT.get(), headers.get("traceparent")) else {
        return;
    };
    let Ok(tp) = tp.to_str() else { return };
    let ts = headers.get("tracestate").and_then(|v| v.to_str().ok());
    hook(span, tp, ts);
}

/// Records a rules decision on the current span (a rules command's or `/v1/check`'s).
pub(crate) fn verdict(allowed: bool, key_class: &str, rule: Option<&str>) {
    let span = Span::current();
    span.record("turnstile.decision", decision(allowed));
    span.record("turnstile.key_class", key_class);
    if let Some(r) = rule {
        span.record("turnstile.rule", r);
    }
}

/// Records a `CL.THROTTLE` decision on `span`.
pub(crate) fn throttled(span: &Span, limited: bool) {
    span.record("turnstile.decision", decision(!limited));
}

/// `allowed` or `limited`.
pub(crate) fn decision(allowed: bool) -> &'static str {
    if allowed {
        "allowed"
    } else {
        "limited"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_the_servers_never_the_raw_path() {
        assert_eq!(route("/v1/check"), "/v1/check");
        assert_eq!(route("/v1/limits/customer/42"), "/v1/limits/{class}/{key}");
        assert_eq!(route("/v1/check/extra"), "unknown");
        assert_eq!(route("/anything/else"), "unknown");
    }

    #[test]
    fn roots_are_sampled_at_the_ratio() {
        // The default (before enable): every root.
        assert!((0..1000).all(|_| root_sampled()));
        ROOTS.store((0.01 * u64::MAX as f64) as u64, Ordering::Relaxed);
        let n = (0..1_000_000).filter(|_| root_sampled()).count();
        ROOTS.store(u64::MAX, Ordering::Relaxed);
        // 1 % of 10^6: 10 000, sd ~99.5; within 5 sd.
        assert!((9_500..=10_500).contains(&n), "{n}");
    }

    #[test]
    fn off_until_enabled() {
        // No test of this crate enables the spans: a request pays the flag only.
        assert!(!on());
    }
}
