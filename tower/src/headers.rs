//! The rate-limit headers of a decision, in one of three forms: draft-ietf-httpapi-ratelimit-
//! headers-10's `RateLimit-Policy` / `RateLimit`, the earlier drafts' `RateLimit-*`, or
//! `X-RateLimit-*`. Made when the request is checked, written into its response when that
//! comes; built to cost little per response (static cached values; the one value that changes
//! split off a per-thread buffer). [`write_headers`] is the one writer of these headers in the
//! workspace: the layer and `turnstile serve`'s `POST /v1/check` both use it.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use turnstile::{Decision, Outcome};

/// Which rate-limit headers responses carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HeaderStyle {
    /// None (a refused request still gets `Retry-After`).
    None,
    /// draft-ietf-httpapi-ratelimit-headers-10: `RateLimit-Policy: "name";q=100;w=60` and
    /// `RateLimit: "name";r=50;t=30`, Structured Fields lists (RFC 9651) of one member each;
    /// numbers above 999 999 999 999 999 (the largest Structured Fields integer) are written
    /// as that.
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

/// The largest integer a Structured Field may hold (RFC 9651, 15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

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
            window.map(|w| (w.as_secs_f64().ceil() as u64).min(SF_INTEGER_MAX)),
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
        let limit = limit.min(SF_INTEGER_MAX);
        match self.window {
            Some(w) => format!("\"{}\";q={limit};w={w}", self.name),
            None => format!("\"{}\";q={limit}", self.name),
        }
    }

    /// The `RateLimit` value: `"name";r=REMAINING;t=RESET`, written into this thread's
    /// [`ARENA`] rather than an allocation of its own (`format!` was a fifth of the layer's
    /// instructions under callgrind; a `Vec` of the exact size, then, ~300 instructions to
    /// allocate, convert and free: the arena's split and release cost ~100).
    fn rate(&self, remaining: u64, reset: u64) -> Option<HeaderValue> {
        let (remaining, reset) = (remaining.min(SF_INTEGER_MAX), reset.min(SF_INTEGER_MAX));
        let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (r, t) = (r.format(remaining).as_bytes(), t.format(reset).as_bytes());
        let v = ARENA.with(|a| {
            let mut a = a.borrow_mut();
            a.reserve(self.prefix.len() + r.len() + 3 + t.len());
            a.extend_from_slice(&self.prefix);
            a.extend_from_slice(r);
            a.extend_from_slice(b";t=");
            a.extend_from_slice(t);
            a.split().freeze()
        });
        rate_value(v)
    }
}

/// A `RateLimit` value as a header value: checked byte by byte by `http`, although
/// `Policy::new` checked the name and the rest is `;r=`, `;t=` and digits (the check is
/// ~215 instructions per response under callgrind, a tenth of what the layer adds; the
/// `unsafe-fast-headers` feature skips it).
#[cfg(not(feature = "unsafe-fast-headers"))]
#[inline]
fn rate_value(v: Bytes) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(v).ok()
}

/// A `RateLimit` value as a header value, unchecked (feature `unsafe-fast-headers`).
#[cfg(feature = "unsafe-fast-headers")]
#[allow(unsafe_code)]
#[inline]
fn rate_value(v: Bytes) -> Option<HeaderValue> {
    debug_assert!(v.iter().all(|b| (b' '..=b'~').contains(b)));
    // SAFETY: a valid header value is visible ASCII and spaces; `v` is the policy name,
    // which `Policy::new` checked to be printable ASCII (`Policy::default`'s is), in quotes,
    // `;r=`, `;t=` and decimal digits.
    Some(unsafe { HeaderValue::from_maybe_shared_unchecked(v) })
}

/// The first size of a thread's [`ARENA`] buffer, and of each one after it: ~40 `RateLimit`
/// values. A value keeps its buffer alive until it is dropped (once the response's head is
/// written), so a response held for long keeps at most this much more than its own value.
const ARENA_BYTES: usize = 1024;

thread_local! {
    /// The buffer `RateLimit` values are split off: each value shares it through a reference
    /// count (`Bytes`), and once every value from it is gone, `reserve` writes the next ones
    /// from its start again: in a server that writes each response's head before the next
    /// ones pile up, no allocation per response at all.
    static ARENA: std::cell::RefCell<bytes::BytesMut> =
        std::cell::RefCell::new(bytes::BytesMut::with_capacity(ARENA_BYTES));
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
    match d.retry_after_secs_ceil() {
        Some(s) if !d.allowed() => s,
        _ => d.reset_after_secs_ceil(),
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
        if !d.has_limit()
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
                return match (
                    policy.header(d.limit),
                    policy.rate(remaining, reset_secs(d)),
                ) {
                    (Some(q), Some(r)) => Self::Ietf(q, r),
                    _ => Self::None,
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

/// Writes `style`'s headers for decision `d` into `h`: the draft-10 fields appended to any
/// there (one list member per policy), the older forms replacing theirs.
///
/// The values: the quota (`q`, `-Limit`) is `d.limit`; what is left (`r`, `-Remaining`) is
/// `d.remaining` when admitted and 0 when refused; the seconds to reset (`t`, `-Reset`),
/// rounded up, are until the limit is idle again when admitted, and when refused until this
/// request would be admitted (its `Retry-After`, at least 1). Nothing is written for a decision
/// no limit made (`limit` is `u64::MAX`: no rule applied), a shed one (`limit` 0) or a full
/// store's (its 0 left would read as this client's quota used up).
///
/// ```
/// use http::HeaderMap;
/// use turnstile::{Decision, Outcome};
/// use turnstile_tower::{write_headers, HeaderStyle, Policy};
///
/// let d = Decision { outcome: Outcome::Allowed, limit: 10, remaining: 7,
///     reset_after_ns: 18_500_000_000, retry_after_ns: None, delay_ns: 0 };
/// let policy = Policy::new("per-ip", Some(std::time::Duration::from_secs(60))).unwrap();
/// let mut h = HeaderMap::new();
/// write_headers(&HeaderStyle::Ietf, &policy, &d, &mut h);
/// assert_eq!(h["ratelimit-policy"], r#""per-ip";q=10;w=60"#);
/// assert_eq!(h["ratelimit"], r#""per-ip";r=7;t=19"#);
/// ```
pub fn write_headers(style: &HeaderStyle, policy: &Policy, d: &Decision, h: &mut HeaderMap) {
    RateHeaders::new(style, policy, d).write(h);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A decision of `limit` with `remaining` left, reset and retry after so many ns (the
    /// answer module's tests use it too).
    pub(crate) fn d(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset: u64,
        retry: Option<u64>,
    ) -> Decision {
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
                let sf = |v: u64| v.min(SF_INTEGER_MAX);
                let want = format!(
                    "\"{name}\";r={};t={}",
                    sf(rem),
                    sf(reset.div_ceil(1_000_000_000))
                );
                assert_eq!(h["ratelimit"], want.as_str());
            }
        }
        assert!(Policy::new("a\"b", None).is_err());
        assert!(Policy::new("é", None).is_err());
    }

    #[test]
    fn arena_values_outlive_their_buffer() {
        // Values split off this thread's arena, kept while many more are made (several
        // buffers' worth), then some dropped so that a buffer may be written again: every value
        // still reads as it was made.
        let p = Policy::new("a-policy", None).unwrap();
        let want = |i: u64| format!("\"a-policy\";r={i};t={}", i * 7);
        let rate = |i: u64| p.rate(i, i * 7).unwrap();
        let mut kept: Vec<(u64, HeaderValue)> = (0..300).map(|i| (i, rate(i))).collect();
        kept.retain(|(i, _)| i % 3 == 0);
        kept.extend((300..600).map(|i| (i, rate(i))));
        for (i, v) in &kept {
            assert_eq!(v, want(*i).as_str());
        }
        drop(kept);
        assert_eq!(p.rate(1, 2).unwrap(), "\"a-policy\";r=1;t=2");
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
}
