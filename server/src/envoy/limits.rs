//! Which limit each descriptor of a request gets (upstream's `constructLimitsToCheck`), after
//! the request is checked.

use super::config::Unit;
use super::matcher::{push_part, Entry, Matcher};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as PbEntry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 1024;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 64;
/// The longest entry key or value, in bytes.
pub const MAX_ENTRY_BYTES: usize = 64 << 10;

/// A request refused as a whole (HTTP 400 on `POST /json`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvalidRequest {
    /// Refused as upstream refuses it: an empty domain or descriptor list. Upstream returns a
    /// plain Go error, which gRPC sends as `UNKNOWN` with the message; so does turnstile.
    Upstream(&'static str),
    /// Past one of this server's bounds, or an override unit upstream has no answer for
    /// (gRPC `INVALID_ARGUMENT`).
    Invalid(String),
}

impl InvalidRequest {
    /// What is wrong.
    pub fn message(&self) -> &str {
        match self {
            InvalidRequest::Upstream(m) => m,
            InvalidRequest::Invalid(m) => m,
        }
    }
}

impl std::fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for InvalidRequest {}

/// Upstream's two checks, then this server's bounds.
pub fn validate(req: &RateLimitRequest) -> Result<(), InvalidRequest> {
    if req.domain.is_empty() {
        return Err(InvalidRequest::Upstream(
            "rate limit domain must not be empty",
        ));
    }
    if req.descriptors.is_empty() {
        return Err(InvalidRequest::Upstream(
            "rate limit descriptor list must not be empty",
        ));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(InvalidRequest::Invalid(format!(
            "{} descriptors in one request; at most {MAX_DESCRIPTORS}",
            req.descriptors.len()
        )));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        descriptor(i, d)?;
    }
    Ok(())
}

fn descriptor(i: usize, d: &RateLimitDescriptor) -> Result<(), InvalidRequest> {
    if d.entries.len() > MAX_ENTRIES {
        return Err(InvalidRequest::Invalid(format!(
            "descriptor {i}: {} entries; at most {MAX_ENTRIES}",
            d.entries.len()
        )));
    }
    for (j, e) in d.entries.iter().enumerate() {
        if e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES {
            return Err(InvalidRequest::Invalid(format!(
                "descriptor {i}, entry {j}: a key or value of {} bytes; at most {MAX_ENTRY_BYTES}",
                e.key.len().max(e.value.len())
            )));
        }
    }
    if let Some(o) = d.limit {
        if Unit::from_proto(o.unit).is_none() {
            return Err(InvalidRequest::Invalid(format!(
                "descriptor {i}: the limit override has unit {}; expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
                o.unit
            )));
        }
    }
    Ok(())
}

/// The request's entries are looked up as they are, without a copy.
impl Entry for PbEntry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// What one descriptor resolved to before counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// No limit: no match, an unknown domain, or replaced by another limit of the request.
    None,
    /// An `unlimited` limit (its index in [`Matcher::rules`]): OK, not counted.
    Unlimited(usize),
    /// The configured limit with this index in [`Matcher::rules`].
    Rule(usize),
    /// The request's own `limit` override: requests per unit.
    Override(u32, Unit),
}

/// One descriptor's limit and the key its counter is kept under.
#[derive(Clone, Debug)]
pub struct ToCheck {
    /// The limit.
    pub found: Found,
    /// The counter key (valid for [`Found::Rule`] and [`Found::Override`]).
    pub key: Vec<u8>,
}

/// The limit of each descriptor of a validated request, in request order; a named limit
/// another limit of the request `replaces` is dropped.
pub fn limits_to_check(m: &Matcher, req: &RateLimitRequest) -> Vec<ToCheck> {
    let known = m.has_domain(&req.domain);
    // Scratch for the lookups: one small allocation per request, next to the decoding's many.
    let mut buf = String::new();
    let mut out: Vec<ToCheck> = req
        .descriptors
        .iter()
        .map(|d| {
            let mut key = Vec::new();
            let found = if !known {
                Found::None
            } else if let Some(o) = d.limit {
                // An override counts per domain and entries, whatever the configuration says.
                push_part(&mut key, &req.domain);
                for e in &d.entries {
                    push_part(&mut key, &e.key);
                    push_part(&mut key, &e.value);
                }
                Unit::from_proto(o.unit)
                    .map_or(Found::None, |u| Found::Override(o.requests_per_unit, u))
            } else {
                match m.lookup(&req.domain, &d.entries, &mut buf, &mut key) {
                    Some(r) if m.rules()[r].limit.unlimited => Found::Unlimited(r),
                    Some(r) => Found::Rule(r),
                    None => Found::None,
                }
            };
            ToCheck { found, key }
        })
        .collect();
    // Upstream gathers the names to replace from every limit found, unlimited ones too.
    let replacing: Vec<&str> = out
        .iter()
        .filter_map(|c| match c.found {
            Found::Rule(r) | Found::Unlimited(r) => Some(r),
            Found::None | Found::Override(..) => None,
        })
        .flat_map(|r| m.rules()[r].limit.replaces.iter().map(String::as_str))
        .collect();
    if !replacing.is_empty() {
        for c in out.iter_mut() {
            if let Found::Rule(r) = c.found {
                let name = &m.rules()[r].limit.name;
                if !name.is_empty() && replacing.contains(&name.as_str()) {
                    c.found = Found::None;
                }
            }
        }
    }
    out
}
