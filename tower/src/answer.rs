//! What the layer answers: rate-limit headers on every response, and the 429 / 503 of a
//! refused request (problem+json, text, the user's own, or a gRPC status).

use crate::limit::{ceil_secs, retry_after_secs};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use std::sync::Arc;
use turnstile::{Decision, Outcome};

/// Which rate-limit headers responses carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HeaderStyle {
    /// None (a refused request still gets `Retry-After`).
    None,
    /// The IETF draft (draft-ietf-httpapi-ratelimit-headers):
    /// `RateLimit-Policy: "name";q=100;w=60` and `RateLimit: "name";r=50;t=30`.
    #[default]
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (earlier drafts).
    RateLimit,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    XRateLimit,
}

/// The policy the IETF headers name: a name (an sf-string: printable ASCII without `"` or
/// `\`) and the window in seconds, if one is known.
#[derive(Clone, Debug)]
pub struct Policy {
    pub(crate) name: Arc<str>,
    pub(crate) window: Option<u64>,
    /// The `RateLimit-Policy` value of the first limit seen: a store's limit never changes,
    /// so the value is formatted once and then cloned (a reference count, no allocation).
    cached: Arc<std::sync::OnceLock<(u64, HeaderValue)>>,
}

impl PartialEq for Policy {
    fn eq(&self, o: &Self) -> bool {
        (&self.name, self.window) == (&o.name, o.window)
    }
}

impl Eq for Policy {}

impl Policy {
    /// A policy named `name`, or an error saying which character is not allowed.
    pub fn new(name: &str, window: Option<std::time::Duration>) -> Result<Self, String> {
        if let Some(c) = name
            .chars()
            .find(|c| !(' '..='~').contains(c) || *c == '"' || *c == '\\')
        {
            return Err(format!(
                "policy name `{}` holds {c:?}: use printable ASCII without `\"` and `\\`",
                name.escape_debug()
            ));
        }
        Ok(Self {
            name: name.into(),
            window: window.map(|w| w.as_secs_f64().ceil() as u64),
            cached: Arc::default(),
        })
    }
    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `RateLimit-Policy` value for a quota of `limit`.
    fn header(&self, limit: u64) -> Option<HeaderValue> {
        let format = || {
            let q = match self.window {
                Some(w) => format!("\"{}\";q={limit};w={w}", self.name),
                None => format!("\"{}\";q={limit}", self.name),
            };
            // The name was checked to be visible ASCII: this never fails.
            HeaderValue::try_from(q).ok()
        };
        match self.cached.get() {
            Some((l, v)) if *l == limit => Some(v.clone()),
            Some(_) => format(),
            None => {
                let v = format()?;
                // Another thread may have cached another limit first: then `v` is the answer.
                let (l, c) = self.cached.get_or_init(|| (limit, v.clone()));
                Some(if *l == limit { c.clone() } else { v })
            }
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            name: "default".into(),
            window: None,
            cached: Arc::default(),
        }
    }
}

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RL_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static RL_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RL_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Seconds until the client may expect more quota: when admitted, until the limit is idle
/// again; when refused, until this request would be admitted (rounded up, ≥ 1).
pub fn reset_secs(d: &Decision) -> u64 {
    match retry_after_secs(d) {
        Some(s) if !d.allowed() => s,
        _ => ceil_secs(d.reset_after_ns),
    }
}

/// Writes `style`'s headers for decision `d` into `h`. Nothing for a decision no limit made
/// (no rule applied: `limit` is `u64::MAX`) or a store-full / shed decision (`limit` 0).
pub fn write_headers(style: &HeaderStyle, policy: &Policy, d: &Decision, h: &mut HeaderMap) {
    if d.limit == u64::MAX || d.limit == 0 || matches!(style, HeaderStyle::None) {
        return;
    }
    let remaining = if d.allowed() { d.remaining } else { 0 };
    let reset = reset_secs(d);
    let (l, r, t) = match style {
        HeaderStyle::None => return,
        HeaderStyle::Ietf => {
            // Written into a stack buffer: `format!` was a fifth of the layer's instructions
            // (callgrind, `benches/layer.rs`). The name was checked to be visible ASCII, so
            // the value is valid; a name too long for the buffer takes the `format!` path.
            let mut buf = [0u8; 128];
            let mut w = Buf { b: &mut buf, n: 0 };
            w.put(b"\"");
            w.put(policy.name.as_bytes());
            w.put(b"\";r=");
            w.num(remaining);
            w.put(b";t=");
            w.num(reset);
            let rl = match w.done() {
                Some(b) => HeaderValue::from_bytes(b).ok(),
                None => {
                    HeaderValue::try_from(format!("\"{}\";r={remaining};t={reset}", policy.name))
                        .ok()
                }
            };
            if let (Some(q), Some(rl)) = (policy.header(d.limit), rl) {
                h.insert(RATELIMIT_POLICY.clone(), q);
                h.insert(RATELIMIT.clone(), rl);
            }
            return;
        }
        HeaderStyle::RateLimit => (&RL_LIMIT, &RL_REMAINING, &RL_RESET),
        HeaderStyle::XRateLimit => (&X_LIMIT, &X_REMAINING, &X_RESET),
    };
    h.insert(l.clone(), HeaderValue::from(d.limit));
    h.insert(r.clone(), HeaderValue::from(remaining));
    h.insert(t.clone(), HeaderValue::from(reset));
}

/// The application's own refusal ([`BodyStyle::Custom`]).
pub type DenialHandler = Arc<dyn Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync>;

/// A bounded writer over a stack buffer; `done` is `None` if anything did not fit.
struct Buf<'a> {
    b: &'a mut [u8],
    n: usize,
}

impl Buf<'_> {
    fn put(&mut self, s: &[u8]) {
        let end = self.n.saturating_add(s.len());
        if let Some(dst) = self.b.get_mut(self.n..end) {
            dst.copy_from_slice(s);
            self.n = end;
        } else {
            self.n = usize::MAX;
        }
    }
    fn num(&mut self, mut v: u64) {
        let mut d = [0u8; 20];
        let mut i = d.len();
        loop {
            i -= 1;
            d[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.put(&d[i..]);
    }
    fn done(&self) -> Option<&[u8]> {
        self.b.get(..self.n)
    }
}

/// The body of a refused request.
#[derive(Clone, Default)]
pub enum BodyStyle {
    /// `application/problem+json` (RFC 9457): type, title, status, detail, the violated
    /// policy, and `retry_after` in seconds.
    #[default]
    ProblemJson,
    /// `text/plain`.
    Text,
    /// The application's own response (status and headers are added to it unless it set
    /// them).
    Custom(DenialHandler),
}

impl std::fmt::Debug for BodyStyle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BodyStyle::ProblemJson => "ProblemJson",
            BodyStyle::Text => "Text",
            BodyStyle::Custom(_) => "Custom",
        })
    }
}

/// A refused request, as the error handler sees it.
#[derive(Clone, Copy, Debug)]
pub struct Denial<'a> {
    /// 429, or 503 when shed or the store is full.
    pub status: StatusCode,
    /// The decision.
    pub decision: &'a Decision,
    /// `Retry-After` in whole seconds (rounded up, ≥ 1); `None` when retrying never helps.
    pub retry_after: Option<u64>,
    /// Shed by priority load shedding (or a full store) rather than a limit.
    pub shed: bool,
    /// The policy's name.
    pub policy: &'a str,
}

impl Denial<'_> {
    /// A one-line explanation.
    pub fn detail(&self) -> String {
        let why = if self.shed {
            if self.decision.outcome == Outcome::StoreFull {
                "the rate limiter is at capacity"
            } else {
                "the server is shedding load"
            }
        } else if self.decision.outcome == Outcome::NeverFits {
            "the request costs more than the limit ever admits at once"
        } else {
            "rate limit exceeded"
        };
        match self.retry_after {
            Some(s) => format!("{why}; retry after {s} s"),
            None => format!("{why}; retrying will not help"),
        }
    }
}

/// The problem+json document of a denial (RFC 9457).
pub fn problem_json(d: &Denial<'_>) -> String {
    let mut v = serde_json::json!({
        "type": "about:blank",
        "title": d.status.canonical_reason().unwrap_or("Too Many Requests"),
        "status": d.status.as_u16(),
        "detail": d.detail(),
    });
    if !d.shed {
        v["violated-policies"] = serde_json::json!([d.policy]);
    }
    if let Some(s) = d.retry_after {
        v["retry_after"] = s.into();
    }
    v.to_string()
}

/// The response to a refused HTTP request.
pub(crate) fn denial_response(
    denial: &Denial<'_>,
    body: &BodyStyle,
    style: &HeaderStyle,
    policy: &Policy,
) -> Response<Bytes> {
    let mut res = match body {
        BodyStyle::ProblemJson => {
            let mut r = Response::new(Bytes::from(problem_json(denial)));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            );
            r
        }
        BodyStyle::Text => {
            let mut r = Response::new(Bytes::from(format!(
                "{}: {}\n",
                denial.status.canonical_reason().unwrap_or(""),
                denial.detail()
            )));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r
        }
        BodyStyle::Custom(f) => {
            let mut r = f(denial);
            if r.status() == StatusCode::OK {
                *r.status_mut() = denial.status;
            }
            r
        }
    };
    if !matches!(body, BodyStyle::Custom(_)) {
        *res.status_mut() = denial.status;
    }
    let h = res.headers_mut();
    if let Some(s) = denial.retry_after {
        h.entry(RETRY_AFTER).or_insert(HeaderValue::from(s));
    }
    write_headers(style, policy, denial.decision, h);
    res
}

/// Whether a request is gRPC (`content-type: application/grpc...`).
pub(crate) fn is_grpc(h: &HeaderMap) -> bool {
    h.get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// gRPC status `RESOURCE_EXHAUSTED`.
pub const GRPC_RESOURCE_EXHAUSTED: u16 = 8;
/// gRPC status `UNAVAILABLE` (a shed request).
pub const GRPC_UNAVAILABLE: u16 = 14;

/// The trailers-only gRPC answer to a refused call: HTTP 200, `grpc-status` 8
/// (`RESOURCE_EXHAUSTED`; 14 `UNAVAILABLE` when shed), `grpc-message`, and the retry time as
/// metadata: `retry-after` (seconds) and `grpc-retry-pushback-ms` (gRFC A6), plus the
/// rate-limit headers.
pub(crate) fn grpc_denial(
    denial: &Denial<'_>,
    style: &HeaderStyle,
    policy: &Policy,
) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let code = if denial.shed {
        GRPC_UNAVAILABLE
    } else {
        GRPC_RESOURCE_EXHAUSTED
    };
    h.insert("grpc-status", HeaderValue::from(code));
    // The detail is ASCII without `%`: no percent-encoding needed.
    if let Ok(v) = HeaderValue::try_from(denial.detail()) {
        h.insert("grpc-message", v);
    }
    if let Some(s) = denial.retry_after {
        h.insert(RETRY_AFTER, HeaderValue::from(s));
        let ms = denial
            .decision
            .retry_after_ns
            .unwrap_or(0)
            .div_ceil(1_000_000);
        h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
    }
    write_headers(style, policy, denial.decision, h);
    res
}

/// The 500 of a request without a key ([`crate::NoKey::Error`]).
pub(crate) fn no_key_response() -> Response<Bytes> {
    let mut r = Response::new(Bytes::from_static(
        b"Internal Server Error: the rate limiter found no key for this request\n",
    ));
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(allowed: bool, limit: u64, remaining: u64, reset: u64, retry: Option<u64>) -> Decision {
        Decision {
            outcome: if allowed {
                Outcome::Allowed
            } else {
                Outcome::Limited
            },
            limit,
            remaining,
            reset_after_ns: reset,
            retry_after_ns: retry,
            delay_ns: 0,
        }
    }

    #[test]
    fn header_styles() {
        let p = Policy::new("per-ip", Some(std::time::Duration::from_secs(60))).unwrap();
        let a = d(true, 10, 7, 18_000_000_001, None);
        let mut h = HeaderMap::new();
        write_headers(&HeaderStyle::Ietf, &p, &a, &mut h);
        assert_eq!(h["ratelimit-policy"], "\"per-ip\";q=10;w=60");
        assert_eq!(h["ratelimit"], "\"per-ip\";r=7;t=19");
        let mut h = HeaderMap::new();
        write_headers(&HeaderStyle::XRateLimit, &p, &a, &mut h);
        assert_eq!(
            (
                &h["x-ratelimit-limit"],
                &h["x-ratelimit-remaining"],
                &h["x-ratelimit-reset"]
            ),
            (
                &"10".parse::<HeaderValue>().unwrap(),
                &"7".parse().unwrap(),
                &"19".parse().unwrap()
            )
        );
        let denied = d(false, 10, 0, 60_000_000_000, Some(1));
        let mut h = HeaderMap::new();
        write_headers(&HeaderStyle::RateLimit, &p, &denied, &mut h);
        assert_eq!(h["ratelimit-reset"], "1", "1 ns rounds up to 1 s");
        assert_eq!(h["ratelimit-remaining"], "0");
        // The stack-buffer writer against `format!`: extreme numbers, a name too long for it.
        let long = "n".repeat(200);
        for name in ["p", long.as_str()] {
            let p = Policy::new(name, None).unwrap();
            for (rem, reset) in [(0, 0), (9, 10), (u64::MAX - 1, u64::MAX)] {
                let d = d(true, u64::MAX - 1, rem, reset, None);
                let mut h = HeaderMap::new();
                write_headers(&HeaderStyle::Ietf, &p, &d, &mut h);
                let want = format!("\"{name}\";r={rem};t={}", reset.div_ceil(1_000_000_000));
                assert_eq!(h["ratelimit"], want.as_str());
            }
        }
        assert!(Policy::new("a\"b", None).is_err());
        assert!(Policy::new("é", None).is_err());
    }

    #[test]
    fn retry_after_rounds_up() {
        for (ns, s) in [
            (1, 1),
            (999_999_999, 1),
            (1_000_000_000, 1),
            (1_000_000_001, 2),
            (0, 1),
        ] {
            assert_eq!(retry_after_secs(&d(false, 1, 0, 0, Some(ns))), Some(s));
        }
        assert_eq!(retry_after_secs(&d(false, 1, 0, 0, None)), None);
    }
}
