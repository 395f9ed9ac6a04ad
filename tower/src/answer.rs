//! What the layer answers: rate-limit headers on every response (their forms are in
//! `headers.rs`, re-exported here), and the 429 / 503 of a refused request (problem+json,
//! text, the user's own, or a gRPC status).

use crate::headers::number;
pub use crate::headers::{reset_secs, write_headers, HeaderStyle, Policy};
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use std::sync::Arc;
use turnstile::{Decision, Outcome};

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
    /// The rule that denied, where the limit says (a rules engine's): the violated policy
    /// the problem document names instead of `policy`.
    pub rule: Option<&'a str>,
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
        v["violated-policies"] = serde_json::json!([d.rule.unwrap_or(d.policy)]);
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
    use crate::headers::tests::d;
    use crate::limit::retry_after_secs;

    /// A refusal of `refused` under the default policy, with a 429.
    fn denial(refused: &Decision) -> Denial<'_> {
        Denial {
            status: StatusCode::TOO_MANY_REQUESTS,
            decision: refused,
            retry_after: retry_after_secs(refused),
            shed: false,
            policy: "default",
            rule: None,
        }
    }

    #[test]
    fn a_custom_refusal_keeps_its_headers() {
        let p = Policy::default();
        let refused = d(false, 10, 0, 0, Some(2_500_000_000));
        let denial = denial(&refused);
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
            let denial = denial(&refused);
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
