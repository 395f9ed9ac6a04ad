//! What the layer answers: rate-limit headers on every response, and the 429 / 503 of a
//! refused request (problem+json, text, the user's own, or a gRPC status).

use crate::limit::{ceil_secs, retry_after_secs};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
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
    /// `"name";r=`: the start of every `RateLimit` value.
    prefix: Arc<[u8]>,
    /// The `RateLimit-Policy` values of the first limits seen (a store has one limit, an
    /// engine one per rule), formatted once and then cloned.
    cached: Arc<[OnceLock<(u64, HeaderValue)>; POLICY_CACHE]>,
}

/// How many limits a [`Policy`] keeps a formatted `RateLimit-Policy` value for; beyond, the
/// value is formatted per response.
const POLICY_CACHE: usize = 8;

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
        Ok(Self::unchecked(
            name,
            window.map(|w| w.as_secs_f64().ceil() as u64),
        ))
    }

    fn unchecked(name: &str, window: Option<u64>) -> Self {
        Self {
            name: name.into(),
            window,
            prefix: format!("\"{name}\";r=").into_bytes().into(),
            cached: Arc::default(),
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `RateLimit-Policy` value for a quota of `limit`.
    fn header(&self, limit: u64) -> Option<HeaderValue> {
        for slot in self.cached.iter() {
            match slot.get() {
                Some((l, v)) if *l == limit => return Some(v.clone()),
                Some(_) => continue,
                None => {
                    let v = static_value(intern(self.format_policy(limit)))?;
                    // Another thread may have filled the slot first, with another limit.
                    let (l, c) = slot.get_or_init(|| (limit, v.clone()));
                    return Some(if *l == limit { c.clone() } else { v });
                }
            }
        }
        HeaderValue::try_from(self.format_policy(limit)).ok()
    }

    fn format_policy(&self, limit: u64) -> String {
        match self.window {
            Some(w) => format!("\"{}\";q={limit};w={w}", self.name),
            None => format!("\"{}\";q={limit}", self.name),
        }
    }

    /// The `RateLimit` value: `"name";r=REMAINING;t=RESET`, in one allocation of its exact
    /// size (`format!` was a fifth of the layer's instructions under callgrind; a stack
    /// buffer and a digit loop cost more than this).
    fn rate(&self, remaining: u64, reset: u64) -> HeaderValue {
        let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (r, t) = (r.format(remaining).as_bytes(), t.format(reset).as_bytes());
        let mut v = Vec::with_capacity(self.prefix.len() + r.len() + 3 + t.len());
        v.extend_from_slice(&self.prefix);
        v.extend_from_slice(r);
        v.extend_from_slice(b";t=");
        v.extend_from_slice(t);
        debug_assert!(v.iter().all(|b| (b' '..=b'~').contains(b)));
        // `Bytes` from a `Vec` whose length is its capacity takes the buffer as it is.
        let v = Bytes::from(v);
        // SAFETY: a valid header value is visible ASCII and spaces; `v` is the policy name,
        // which `Policy::new` checked to be printable ASCII (`Policy::default`'s is), in
        // quotes, `;r=`, `;t=` and decimal digits. (`from_maybe_shared` would check it again
        // byte by byte: a sixth of what building the value costs, under callgrind.)
        #[allow(unsafe_code)]
        unsafe {
            HeaderValue::from_maybe_shared_unchecked(v)
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self::unchecked("default", None)
    }
}

/// `s` for the rest of the process: each distinct value is leaked once (a process holds a few
/// policies, each with a few limits, and a value is interned only when a [`Policy`] slot is
/// first filled), so that a cached header value is backed by static bytes and cloning it per
/// response writes no shared reference count (a count every core's responses would bump).
fn intern(s: String) -> &'static str {
    static SET: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut set = SET.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = set.get(s.as_str()) {
        return v;
    }
    let v: &'static str = Box::leak(s.into_boxed_str());
    set.insert(v);
    v
}

/// A header value over static bytes: cloning and dropping it touch no reference count.
fn static_value(s: &'static str) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from_static(s.as_bytes())).ok()
}

/// The decimal header value of `v`: from a table built once for `v` < 1024 (limits, remaining
/// counts, seconds to reset are mostly small), else formatted.
pub(crate) fn number(v: u64) -> HeaderValue {
    const N: usize = 1024;
    static TEXT: OnceLock<String> = OnceLock::new();
    static TABLE: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let text = TEXT.get_or_init(|| (0..N).map(|i| i.to_string()).collect());
        let mut at = 0;
        (0..N)
            .map(|i| {
                let len = itoa::Buffer::new().format(i).len();
                at += len;
                let s: &'static str = &text[at - len..at];
                static_value(s).unwrap_or_else(|| HeaderValue::from(i))
            })
            .collect()
    });
    match table.get(v as usize) {
        Some(h) => h.clone(),
        None => HeaderValue::from(v),
    }
}

// `const`s, not `static`s: each use is a value made at compile time, where a static's would be
// cloned through `Bytes`' vtable per response (callgrind). Static bytes are never written
// through the `AtomicPtr` inside `Bytes` that the lint is about.
#[allow(clippy::declare_interior_mutable_const)]
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
#[allow(clippy::declare_interior_mutable_const)]
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
#[allow(clippy::declare_interior_mutable_const)]
const RL_NAMES: [HeaderName; 3] = [
    HeaderName::from_static("ratelimit-limit"),
    HeaderName::from_static("ratelimit-remaining"),
    HeaderName::from_static("ratelimit-reset"),
];
#[allow(clippy::declare_interior_mutable_const)]
const X_NAMES: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
];

/// Seconds until the client may expect more quota: when admitted, until the limit is idle
/// again; when refused, until this request would be admitted (rounded up, ≥ 1).
pub fn reset_secs(d: &Decision) -> u64 {
    match retry_after_secs(d) {
        Some(s) if !d.allowed() => s,
        _ => ceil_secs(d.reset_after_ns),
    }
}

/// The rate-limit headers of one decision, made when the request is checked and written
/// into its response when that comes: the response future holds these values, not the
/// layer's configuration.
#[derive(Debug)]
pub(crate) enum RateHeaders {
    /// No headers.
    None,
    /// `RateLimit-Policy`, `RateLimit`.
    Ietf(HeaderValue, HeaderValue),
    /// Limit, remaining and reset, as `RateLimit-*`.
    RateLimit(u64, u64, u64),
    /// Limit, remaining and reset, as `X-RateLimit-*`.
    XRateLimit(u64, u64, u64),
}

impl RateHeaders {
    /// `style`'s headers for decision `d`. None for a decision no limit made (no rule
    /// applied: `limit` is `u64::MAX`) or a store-full / shed decision (`limit` 0).
    pub(crate) fn new(style: &HeaderStyle, policy: &Policy, d: &Decision) -> Self {
        if d.limit == u64::MAX
            || d.limit == 0
            || matches!(d.outcome, Outcome::StoreFull | Outcome::Untracked)
        {
            // A full store says nothing of this client's quota (its `remaining` 0 would read
            // as "used up").
            return Self::None;
        }
        let remaining = if d.allowed() { d.remaining } else { 0 };
        let three = match style {
            HeaderStyle::None => return Self::None,
            HeaderStyle::Ietf => {
                return match policy.header(d.limit) {
                    Some(q) => Self::Ietf(q, policy.rate(remaining, reset_secs(d))),
                    None => Self::None,
                };
            }
            HeaderStyle::RateLimit => Self::RateLimit,
            HeaderStyle::XRateLimit => Self::XRateLimit,
        };
        three(d.limit, remaining, reset_secs(d))
    }

    /// Writes the headers into `h`. The IETF fields are lists (one member per policy): they
    /// are appended to what an inner layer (a per-route limit under a global one) wrote, so
    /// the client sees every policy. The older single-valued forms replace what is there.
    pub(crate) fn write(self, h: &mut HeaderMap) {
        match self {
            Self::None => {}
            Self::Ietf(q, r) => {
                h.append(RATELIMIT_POLICY, q);
                h.append(RATELIMIT, r);
            }
            Self::RateLimit(limit, remaining, reset) => {
                let [l, r, t] = RL_NAMES;
                h.insert(l, number(limit));
                h.insert(r, number(remaining));
                h.insert(t, number(reset));
            }
            Self::XRateLimit(limit, remaining, reset) => {
                let [l, r, t] = X_NAMES;
                h.insert(l, number(limit));
                h.insert(r, number(remaining));
                h.insert(t, number(reset));
            }
        }
    }
}

/// Writes `style`'s headers for decision `d` into `h`: the IETF fields appended to any there,
/// the older forms replacing theirs. Nothing for a decision no limit made (no rule applied:
/// `limit` is `u64::MAX`), a shed decision (`limit` 0) or a full store.
pub fn write_headers(style: &HeaderStyle, policy: &Policy, d: &Decision, h: &mut HeaderMap) {
    RateHeaders::new(style, policy, d).write(h);
}

/// The application's own refusal ([`BodyStyle::Custom`]).
pub type DenialHandler = Arc<dyn Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync>;

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
        h.entry(RETRY_AFTER).or_insert(number(s));
    }
    if let BodyStyle::Custom(_) = body {
        // The application's own refusal keeps any rate-limit header it set.
        let mut ours = HeaderMap::new();
        write_headers(style, policy, denial.decision, &mut ours);
        for (name, v) in ours {
            if let Some(name) = name {
                h.entry(name).or_insert(v);
            }
        }
    } else {
        write_headers(style, policy, denial.decision, h);
    }
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
        h.insert(RETRY_AFTER, number(s));
        // Rounded up and at least 1, as `Retry-After`: never 0 while refused.
        let ms = denial
            .decision
            .retry_after_ns
            .unwrap_or(0)
            .div_ceil(1_000_000)
            .max(1);
        h.insert("grpc-retry-pushback-ms", number(ms));
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
    fn numbers_and_cached_policies() {
        for v in [0, 1, 9, 10, 99, 100, 1023, 1024, 123_456_789, u64::MAX] {
            assert_eq!(number(v), HeaderValue::from(v), "{v}");
        }
        // More limits than the cache holds: each value still names its own limit.
        let p = Policy::new("p", Some(std::time::Duration::from_millis(1500))).unwrap();
        for round in 0..2 {
            for limit in 1..=(POLICY_CACHE as u64 + 3) {
                let d = d(true, limit, 0, 0, None);
                let mut h = HeaderMap::new();
                write_headers(&HeaderStyle::Ietf, &p, &d, &mut h);
                let want = format!("\"p\";q={limit};w=2");
                assert_eq!(h["ratelimit-policy"], want.as_str(), "round {round}");
                assert_eq!(h["ratelimit"], "\"p\";r=0;t=0");
            }
        }
        // A clone shares the cache; another policy of the same name interns the same text.
        let q = Policy::new("p", Some(std::time::Duration::from_secs(2))).unwrap();
        let mut h = HeaderMap::new();
        write_headers(&HeaderStyle::Ietf, &q, &d(true, 1, 0, 0, None), &mut h);
        assert_eq!(h["ratelimit-policy"], "\"p\";q=1;w=2");
    }

    #[test]
    fn what_gets_headers() {
        let p = Policy::default();
        let mut full = d(false, 1000, 0, 0, Some(5_000_000_000));
        full.outcome = Outcome::StoreFull;
        let mut untracked = d(true, 1000, 0, 0, None);
        untracked.outcome = Outcome::Untracked;
        for d in [
            full,
            untracked,
            d(false, 0, 0, 0, Some(1)),
            d(true, u64::MAX, 0, 0, None),
        ] {
            let mut h = HeaderMap::new();
            write_headers(&HeaderStyle::Ietf, &p, &d, &mut h);
            assert!(h.is_empty(), "{d:?}");
        }
        // The IETF fields add to an inner layer's; the older forms replace.
        let mut h = HeaderMap::new();
        h.insert("ratelimit", HeaderValue::from_static("\"inner\";r=1;t=1"));
        h.insert("x-ratelimit-limit", HeaderValue::from_static("7"));
        let a = d(true, 10, 3, 2_000_000_000, None);
        write_headers(&HeaderStyle::Ietf, &p, &a, &mut h);
        write_headers(&HeaderStyle::XRateLimit, &p, &a, &mut h);
        let all: Vec<_> = h.get_all("ratelimit").iter().collect();
        assert_eq!(all, ["\"inner\";r=1;t=1", "\"default\";r=3;t=2"]);
        assert_eq!(
            h.get_all("x-ratelimit-limit").iter().collect::<Vec<_>>(),
            ["10"]
        );
    }

    #[test]
    fn a_custom_refusal_keeps_its_headers() {
        let p = Policy::default();
        let refused = d(false, 10, 0, 0, Some(2_500_000_000));
        let denial = Denial {
            status: StatusCode::TOO_MANY_REQUESTS,
            decision: &refused,
            retry_after: retry_after_secs(&refused),
            shed: false,
            policy: "default",
        };
        let body = BodyStyle::Custom(Arc::new(|_: &Denial<'_>| {
            let mut r = Response::new(Bytes::from_static(b"slow down"));
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("60"));
            r.headers_mut()
                .insert("ratelimit", HeaderValue::from_static("mine"));
            r
        }));
        let r = denial_response(&denial, &body, &HeaderStyle::Ietf, &p);
        assert_eq!(r.status(), 429, "200 becomes the refusal's status");
        assert_eq!(r.headers()["retry-after"], "60");
        assert_eq!(r.headers().get_all("ratelimit").iter().count(), 1);
        assert_eq!(r.headers()["ratelimit"], "mine");
        assert_eq!(r.headers()["ratelimit-policy"], "\"default\";q=10");
        let r = denial_response(&denial, &BodyStyle::Text, &HeaderStyle::Ietf, &p);
        assert_eq!(r.headers()["retry-after"], "3");
        assert_eq!(r.headers()["ratelimit"], "\"default\";r=0;t=3");
    }

    #[test]
    fn grpc_pushback_is_never_zero() {
        for (ns, ms, s) in [(0, 1, 1), (1, 1, 1), (1_000_000, 1, 1), (1_000_001, 2, 1)] {
            let refused = d(false, 10, 0, 0, Some(ns));
            let denial = Denial {
                status: StatusCode::TOO_MANY_REQUESTS,
                decision: &refused,
                retry_after: retry_after_secs(&refused),
                shed: false,
                policy: "default",
            };
            let r = grpc_denial(&denial, &HeaderStyle::None, &Policy::default());
            assert_eq!(
                r.headers()["grpc-retry-pushback-ms"],
                ms.to_string().as_str()
            );
            assert_eq!(r.headers()["retry-after"], s.to_string().as_str());
            assert_eq!(r.headers()["grpc-status"], "8");
        }
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
