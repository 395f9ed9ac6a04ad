//! From the descriptors' statuses to the answer (the end of upstream's
//! `shouldRateLimitWorker`): the overall code with quota mode, the RateLimit headers, and the
//! dynamic metadata.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::value::Kind as V;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

/// `RateLimitResponse.Code`.
pub const CODE_OK: i32 = 1;
/// `RateLimitResponse.Code`.
pub const CODE_OVER_LIMIT: i32 = 2;

/// What the statuses add up to.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// OVER_LIMIT iff a descriptor not in quota mode is over, or every quota descriptor is
    /// (and there is one); OK otherwise (before global shadow mode).
    pub overall_code: i32,
    /// The status the RateLimit headers describe: the one with the least remaining (the
    /// first of equals), or the last over-limit one not in quota mode.
    pub headers_from: Option<usize>,
}

/// Whether descriptor `i` passed (not unlimited, not over): its limit's metadata is returned.
pub(crate) fn passed(st: &DescriptorStatus, unlimited: bool) -> bool {
    !unlimited && st.code != CODE_OVER_LIMIT
}

/// Upstream's walk over the statuses. `unlimited(i)`: descriptor `i` matched an `unlimited`
/// limit; `quota(i)`: it is in quota mode.
pub(crate) fn summarise(
    statuses: &[DescriptorStatus],
    unlimited: impl Fn(usize) -> bool,
    quota: impl Fn(usize) -> bool,
) -> Summary {
    let mut s = Summary::default();
    let mut min_remaining = u32::MAX;
    let (mut failed, mut failed_quota, mut total_quota) = (0, 0, 0);
    for (i, st) in statuses.iter().enumerate() {
        if st.current_limit.is_some() && st.limit_remaining < min_remaining {
            s.headers_from = Some(i);
            min_remaining = st.limit_remaining;
        }
        if unlimited(i) {
            continue;
        }
        let q = quota(i);
        if st.code == CODE_OVER_LIMIT {
            if q {
                failed_quota += 1;
            } else {
                failed += 1;
                s.headers_from = Some(i);
                min_remaining = 0;
            }
        }
        if q {
            total_quota += 1;
        }
    }
    s.overall_code = if failed > 0 || (total_quota > 0 && total_quota == failed_quota) {
        CODE_OVER_LIMIT
    } else {
        CODE_OK
    };
    s
}

/// The three RateLimit headers for `st`, named `names` (limit, remaining, reset).
pub(crate) fn headers(names: &[String; 3], st: &DescriptorStatus) -> Vec<HeaderValue> {
    let limit = st.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
    let reset = st.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
    [
        (&names[0], limit.to_string()),
        (&names[1], st.limit_remaining.to_string()),
        (&names[2], reset.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| HeaderValue {
        key: k.clone(),
        value: v,
        raw_value: Vec::new(),
    })
    .collect()
}

/// The response's `dynamic_metadata` (`RESPONSE_DYNAMIC_METADATA=true`), as upstream builds
/// it: `domain`; `descriptors`, each with `entries` (`"key=value"`), `limit` (an override, in
/// protobuf text format) and `hitsAddend` when set; the request's `hitsAddend` when not 0; and
/// `metadata`, the configured `metadata` of the limits that passed, merged in request order
/// (a key already there keeps its first value; two mappings under one key are merged).
pub(crate) fn dynamic_metadata<'a>(
    req: &RateLimitRequest,
    passed: impl IntoIterator<Item = Option<&'a Struct>>,
) -> Struct {
    let mut out = Struct::default();
    let f = &mut out.fields;
    f.insert("domain".into(), string(&req.domain));
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let mut s = Struct::default();
            let entries = d
                .entries
                .iter()
                .map(|e| string(&format!("{}={}", e.key, e.value)))
                .collect();
            s.fields.insert(
                "entries".into(),
                kind(V::ListValue(ListValue { values: entries })),
            );
            if let Some(l) = &d.limit {
                s.fields.insert("limit".into(), string(&override_text(l)));
            }
            if let Some(h) = &d.hits_addend {
                s.fields
                    .insert("hitsAddend".into(), kind(V::NumberValue(h.value as f64)));
            }
            kind(V::StructValue(s))
        })
        .collect();
    f.insert(
        "descriptors".into(),
        kind(V::ListValue(ListValue {
            values: descriptors,
        })),
    );
    if req.hits_addend != 0 {
        f.insert(
            "hitsAddend".into(),
            kind(V::NumberValue(req.hits_addend as f64)),
        );
    }
    let mut merged = Struct::default();
    for m in passed.into_iter().flatten() {
        merge(&mut merged, m);
    }
    if !merged.fields.is_empty() {
        f.insert("metadata".into(), kind(V::StructValue(merged)));
    }
    out
}

fn kind(k: V) -> Value {
    Value { kind: Some(k) }
}

fn string(s: &str) -> Value {
    kind(V::StringValue(s.to_string()))
}

/// Upstream's `mergeMetadata`: adds `src`'s keys to `dest`; where both hold a mapping under
/// one key, merges them; otherwise the value already in `dest` stays.
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match dest.fields.get_mut(k) {
            None => {
                dest.fields.insert(k.clone(), v.clone());
            }
            Some(Value {
                kind: Some(V::StructValue(d)),
            }) => {
                if let Some(V::StructValue(s)) = &v.kind {
                    merge(d, s);
                }
            }
            Some(_) => {}
        }
    }
}

/// A limit override in protobuf text format, as upstream's Go `String()` writes it, less the
/// random spacing Go adds: `requests_per_unit:42 unit:MINUTE`; fields at their default are
/// left out.
fn override_text(l: &RateLimitOverride) -> String {
    let mut parts = Vec::new();
    if l.requests_per_unit != 0 {
        parts.push(format!("requests_per_unit:{}", l.requests_per_unit));
    }
    if l.unit != 0 {
        let unit =
            PbUnit::try_from(l.unit).map_or(l.unit.to_string(), |u| u.as_str_name().to_string());
        parts.push(format!("unit:{unit}"));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;

    fn st(code: i32, remaining: u32) -> DescriptorStatus {
        DescriptorStatus {
            code,
            current_limit: Some(RateLimit::default()),
            limit_remaining: remaining,
            ..Default::default()
        }
    }

    const OK: i32 = CODE_OK;
    const OVER: i32 = CODE_OVER_LIMIT;

    /// The cases of upstream's `TestServicePerDescriptorQuotaMode`,
    /// `TestServiceMixedPerDescriptorModes(UnderLimit)`, `TestServiceQuotaModeOnly*` and
    /// `TestServiceGlobalQuotaMode`: (statuses, quota flags) → overall code.
    #[test]
    fn quota_mode_as_upstream() {
        let code =
            |s: &[DescriptorStatus], q: &[bool]| summarise(s, |_| false, |i| q[i]).overall_code;
        assert_eq!(code(&[st(OVER, 0), st(OK, 0)], &[false, true]), OVER);
        assert_eq!(code(&[st(OK, 0), st(OVER, 0)], &[false, true]), OVER);
        assert_eq!(code(&[st(OK, 0), st(OK, 0)], &[false, true]), OK);
        assert_eq!(code(&[st(OVER, 0), st(OVER, 0)], &[true, true]), OVER);
        assert_eq!(code(&[st(OVER, 0), st(OK, 0)], &[true, true]), OK);
        assert_eq!(code(&[st(OVER, 0), st(OVER, 0)], &[false, false]), OVER);
        assert_eq!(code(&[st(OK, 3)], &[false]), OK);
    }

    #[test]
    fn headers_describe_the_least_remaining_or_the_last_over() {
        let from =
            |s: &[DescriptorStatus], q: &[bool]| summarise(s, |_| false, |i| q[i]).headers_from;
        assert_eq!(
            from(&[st(OK, 5), st(OK, 2), st(OK, 2)], &[false; 3]),
            Some(1)
        );
        assert_eq!(
            from(&[st(OVER, 0), st(OK, 2), st(OVER, 0)], &[false; 3]),
            Some(2)
        );
        // A quota descriptor over its limit is the least remaining, not an override.
        assert_eq!(
            from(&[st(OK, 2), st(OVER, 0), st(OK, 1)], &[false, true, false]),
            Some(1)
        );
        let none = DescriptorStatus::default();
        assert_eq!(from(&[none], &[false]), None);
    }

    #[test]
    fn metadata_merges_first_wins() {
        let s = |pairs: &[(&str, Value)]| Struct {
            fields: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        };
        let a = s(&[
            ("name", string("service_1")),
            ("nested", kind(V::StructValue(s(&[("x", string("1"))])))),
        ]);
        let b = s(&[
            ("name", string("service_2")),
            ("other", string("o")),
            (
                "nested",
                kind(V::StructValue(s(&[("x", string("2")), ("y", string("3"))]))),
            ),
        ]);
        let req = RateLimitRequest {
            domain: "d".into(),
            hits_addend: 2,
            ..Default::default()
        };
        let m = dynamic_metadata(&req, [Some(&a), None, Some(&b)]);
        let Some(V::StructValue(merged)) = &m.fields["metadata"].kind else {
            panic!("{m:?}")
        };
        assert_eq!(merged.fields["name"], string("service_1"));
        assert_eq!(merged.fields["other"], string("o"));
        assert_eq!(
            merged.fields["nested"],
            kind(V::StructValue(s(&[("x", string("1")), ("y", string("3"))])))
        );
        assert_eq!(m.fields["domain"], string("d"));
        assert_eq!(m.fields["hitsAddend"], kind(V::NumberValue(2.0)));
        let none = dynamic_metadata(&req, [None]);
        assert!(!none.fields.contains_key("metadata"));
    }

    #[test]
    fn override_in_text_format() {
        let t = |rpu, unit| {
            override_text(&RateLimitOverride {
                requests_per_unit: rpu,
                unit,
            })
        };
        assert_eq!(t(42, 2), "requests_per_unit:42 unit:MINUTE");
        assert_eq!(t(0, 1), "unit:SECOND");
        assert_eq!(t(7, 99), "requests_per_unit:7 unit:99");
    }
}
