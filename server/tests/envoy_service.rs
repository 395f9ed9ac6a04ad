//! The decision, called directly on a manual Unix clock (no sleeping): upstream's service and
//! limiter behaviour (`test/service/ratelimit_test.go`, `test/limiter/base_limiter_test.go`,
//! `test/redis/fixed_cache_impl_test.go`), each case named.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value};
use std::sync::Arc;
use std::time::Duration;
use turnstile::ManualClock;
use turnstile_server::envoy::config::parse;
use turnstile_server::envoy::engine::{CODE_OK, CODE_OVER_LIMIT};
use turnstile_server::envoy::{Envoy, InvalidRequest, Settings};

// 2026-01-01T00:00:00Z plus 10 s: inside a minute window with 50 s to go.
const T0: u64 = 1_767_225_610_000_000_000;

const CFG: &str = "\
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: b
    value: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: u
    rate_limit: {unlimited: true}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: old
    rate_limit: {unit: hour, requests_per_unit: 1, name: old}
  - key: new
    rate_limit: {unit: hour, requests_per_unit: 5, replaces: [{name: old}]}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket}
  - key: m
    rate_limit: {unit: minute, requests_per_unit: 10, unit_multiplier: 5}
";

fn envoy(settings: Settings) -> (Envoy, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let e = Envoy::with_clock(&parse("cfg.yaml", CFG).unwrap(), settings, clock.clone()).unwrap();
    (e, clock)
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn req(domain: &str, ds: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: ds,
        hits_addend: hits,
    }
}

#[test]
fn fixed_window_counts_like_upstream() {
    let (e, clock) = envoy(Settings::default());
    let r = req("d", vec![desc(&[("a", "x")])], 0);
    for left in [2, 1, 0] {
        let resp = e.should_rate_limit(&r).unwrap();
        assert_eq!(resp.overall_code, CODE_OK);
        let s = &resp.statuses[0];
        assert_eq!(s.code, CODE_OK);
        assert_eq!(s.limit_remaining, left);
        let l = s.current_limit.as_ref().unwrap();
        assert_eq!((l.requests_per_unit, l.unit), (3, 2));
        assert_eq!(s.duration_until_reset.unwrap().seconds, 50);
    }
    let resp = e.should_rate_limit(&r).unwrap();
    assert_eq!(resp.overall_code, CODE_OVER_LIMIT);
    assert_eq!(resp.statuses[0].limit_remaining, 0);
    // Another value of `a` has its own counter.
    let other = e
        .should_rate_limit(&req("d", vec![desc(&[("a", "y")])], 0))
        .unwrap();
    assert_eq!(other.statuses[0].limit_remaining, 2);
    // The next calendar minute resets it.
    clock.advance(Duration::from_secs(50));
    let resp = e.should_rate_limit(&r).unwrap();
    assert_eq!(resp.statuses[0].limit_remaining, 2);
    assert_eq!(resp.statuses[0].duration_until_reset.unwrap().seconds, 60);
    // Metrics: 5 hits in the first window (3 within, 2 over; near threshold floor(3*0.8)=2).
    let c = e.counters("d.a").unwrap();
    assert_eq!(c, [6, 1, 1, 5, 0], "total, over, near, within, shadow");
    let text = e.render_metrics();
    for line in [
        "ratelimit_service_rate_limit_total_hits{key=\"d.a\"} 6",
        "ratelimit_service_rate_limit_over_limit{key=\"d.a\"} 1",
        "ratelimit_service_rate_limit_near_limit{key=\"d.a\"} 1",
        "ratelimit_service_rate_limit_within_limit{key=\"d.a\"} 5",
        "ratelimit_service_rate_limit_shadow_mode{key=\"d.a\"} 0",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

#[test]
fn settings_from_environment() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
    };
    let s = Settings::from_vars(vars(&[
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_REMAINING_HEADER", "X-Left"),
        ("NEAR_LIMIT_RATIO", "0.5"),
    ]))
    .unwrap();
    let h = s.response_headers.unwrap();
    assert_eq!(h[1], "X-Left");
    assert_eq!(h[0], "RateLimit-Limit");
    assert_eq!(s.near_limit_ratio, 0.5);
    assert!(Settings::from_vars(vars(&[("SHADOW_MODE", "yes please")]))
        .unwrap_err()
        .contains("SHADOW_MODE"));
    assert!(Settings::from_vars(vars(&[("NEAR_LIMIT_RATIO", "2")])).is_err());
}

#[test]
fn hits_addend_request_and_descriptor() {
    let (e, _) = envoy(Settings::default());
    // Request hits_addend 2: 2 of 3 used.
    let resp = e
        .should_rate_limit(&req("d", vec![desc(&[("a", "h")])], 2))
        .unwrap();
    assert_eq!(resp.statuses[0].limit_remaining, 1);
    // A descriptor's own hits_addend overrides the request's; 0 checks without counting.
    let mut d0 = desc(&[("a", "h")]);
    d0.hits_addend = Some(UInt64Value { value: 0 });
    let resp = e.should_rate_limit(&req("d", vec![d0.clone()], 5)).unwrap();
    assert_eq!(resp.statuses[0].code, CODE_OK);
    assert_eq!(resp.statuses[0].limit_remaining, 1);
    // Over by a big addend: the hits count (as upstream's INCRBY), so the key stays over.
    let resp = e
        .should_rate_limit(&req("d", vec![desc(&[("a", "h")])], 4))
        .unwrap();
    assert_eq!(resp.overall_code, CODE_OVER_LIMIT);
    // At count 6 > 3, a zero-hit check reports over without counting.
    let resp = e.should_rate_limit(&req("d", vec![d0], 1)).unwrap();
    assert_eq!(resp.statuses[0].code, CODE_OVER_LIMIT);
}

#[test]
fn zero_hit_check_at_exactly_the_limit_is_ok() {
    let (e, _) = envoy(Settings::default());
    e.should_rate_limit(&req("d", vec![desc(&[("a", "z")])], 3))
        .unwrap();
    let mut d0 = desc(&[("a", "z")]);
    d0.hits_addend = Some(UInt64Value { value: 0 });
    let resp = e.should_rate_limit(&req("d", vec![d0], 0)).unwrap();
    assert_eq!(resp.statuses[0].code, CODE_OK);
    assert_eq!(resp.statuses[0].limit_remaining, 0);
}

#[test]
fn overall_code_and_shadow_descriptors() {
    let (e, _) = envoy(Settings::default());
    let r = req(
        "d",
        vec![desc(&[("b", "shadow")]), desc(&[("nomatch", "x")])],
        0,
    );
    e.should_rate_limit(&r).unwrap();
    let resp = e.should_rate_limit(&r).unwrap();
    // Over, but in shadow mode: OK, with the over-limit counted.
    assert_eq!(resp.overall_code, CODE_OK);
    assert_eq!(resp.statuses[0].code, CODE_OK);
    assert_eq!(resp.statuses[0].limit_remaining, 0);
    assert!(resp.statuses[1].current_limit.is_none());
    assert_eq!(e.counters("d.b_shadow").unwrap()[4], 1);
    // One non-shadow descriptor over makes the whole answer over, in request order.
    let r = req(
        "d",
        vec![desc(&[("b", "shadow")]), desc(&[("zero", "x")])],
        0,
    );
    let resp = e.should_rate_limit(&r).unwrap();
    assert_eq!(resp.overall_code, CODE_OVER_LIMIT);
    assert_eq!(resp.statuses[0].code, CODE_OK);
    assert_eq!(resp.statuses[1].code, CODE_OVER_LIMIT);
}

#[test]
fn global_shadow_mode() {
    let s = Settings::from_vars(|k| (k == "SHADOW_MODE").then(|| "true".into())).unwrap();
    assert!(s.shadow_mode);
    let (e, _) = envoy(s);
    let resp = e
        .should_rate_limit(&req("d", vec![desc(&[("zero", "x")])], 0))
        .unwrap();
    assert_eq!(resp.overall_code, CODE_OK);
    assert_eq!(resp.statuses[0].code, CODE_OVER_LIMIT);
    assert!(e
        .render_metrics()
        .contains("ratelimit_service_global_shadow_mode 1"));
}

#[test]
fn unlimited_unknown_and_unmatched() {
    let (e, _) = envoy(Settings::default());
    let resp = e
        .should_rate_limit(&req("d", vec![desc(&[("u", "x")])], 0))
        .unwrap();
    assert_eq!(resp.statuses[0].code, CODE_OK);
    assert_eq!(resp.statuses[0].limit_remaining, u32::MAX);
    assert!(resp.statuses[0].current_limit.is_none());
    let resp = e
        .should_rate_limit(&req("nope", vec![desc(&[("a", "x")])], 0))
        .unwrap();
    assert_eq!(resp.overall_code, CODE_OK);
    assert_eq!(resp.statuses.len(), 1);
    assert!(resp.statuses[0].current_limit.is_none());
    let resp = e
        .should_rate_limit(&req("d", vec![desc(&[("a", "x"), ("deeper", "y")])], 0))
        .unwrap();
    assert!(resp.statuses[0].current_limit.is_none());
}

/// Upstream's TestEmptyDomain and TestEmptyDescriptors: its service errors, word for word
/// (gRPC UNKNOWN, see envoy_grpc).
#[test]
fn empty_domain_or_descriptors_are_invalid() {
    let (e, _) = envoy(Settings::default());
    let err = e
        .should_rate_limit(&req("", vec![desc(&[("a", "x")])], 0))
        .unwrap_err();
    assert_eq!(
        err,
        InvalidRequest::Upstream("rate limit domain must not be empty")
    );
    let err = e.should_rate_limit(&req("d", vec![], 0)).unwrap_err();
    assert_eq!(
        err,
        InvalidRequest::Upstream("rate limit descriptor list must not be empty")
    );
}

#[test]
fn replaces_drops_the_named_limit() {
    let (e, _) = envoy(Settings::default());
    let r = req("d", vec![desc(&[("old", "x")]), desc(&[("new", "x")])], 0);
    for _ in 0..3 {
        let resp = e.should_rate_limit(&r).unwrap();
        assert_eq!(resp.overall_code, CODE_OK);
        assert!(resp.statuses[0].current_limit.is_none(), "replaced");
        assert_eq!(
            resp.statuses[1]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            5
        );
    }
    // Alone, `old` applies (1 per hour).
    let r = req("d", vec![desc(&[("old", "x")])], 0);
    assert_eq!(e.should_rate_limit(&r).unwrap().overall_code, CODE_OK);
    assert_eq!(
        e.should_rate_limit(&r).unwrap().overall_code,
        CODE_OVER_LIMIT
    );
}

#[test]
fn request_limit_override() {
    let (e, _) = envoy(Settings::default());
    let mut d = desc(&[("a", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 4, // DAY
    });
    let r = req("d", vec![d.clone()], 0);
    let s = e.should_rate_limit(&r).unwrap();
    let l = s.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((l.requests_per_unit, l.unit), (1, 4));
    assert_eq!(
        e.should_rate_limit(&r).unwrap().overall_code,
        CODE_OVER_LIMIT
    );
    // An override for a descriptor no rule matches still applies in a known domain.
    let mut d2 = desc(&[("nothing", "here")]);
    d2.limit = d.limit;
    let r2 = req("d", vec![d2.clone()], 2);
    assert_eq!(
        e.should_rate_limit(&r2).unwrap().overall_code,
        CODE_OVER_LIMIT
    );
    // ... not in an unknown domain (upstream: no limit).
    let r3 = req("other", vec![d2.clone()], 2);
    assert_eq!(e.should_rate_limit(&r3).unwrap().overall_code, CODE_OK);
    // Unknown units are refused.
    d2.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    assert!(e
        .should_rate_limit(&req("d", vec![d2.clone()], 0))
        .unwrap_err()
        .message()
        .contains("unit"));
    d2.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 99,
    });
    assert!(e.should_rate_limit(&req("d", vec![d2], 0)).is_err());
}

#[test]
fn algorithm_extension_and_multiplier() {
    let (e, clock) = envoy(Settings::default());
    let r = req("d", vec![desc(&[("tb", "x")])], 0);
    assert_eq!(e.should_rate_limit(&r).unwrap().overall_code, CODE_OK);
    assert_eq!(e.should_rate_limit(&r).unwrap().overall_code, CODE_OK);
    assert_eq!(
        e.should_rate_limit(&r).unwrap().overall_code,
        CODE_OVER_LIMIT
    );
    clock.advance(Duration::from_millis(500));
    assert_eq!(e.should_rate_limit(&r).unwrap().overall_code, CODE_OK);
    // 5-minute windows: T0 is 10 s past a 5-minute boundary.
    let r = req("d", vec![desc(&[("m", "x")])], 0);
    let s = e.should_rate_limit(&r).unwrap();
    assert_eq!(s.statuses[0].duration_until_reset.unwrap().seconds, 290);
}

#[test]
fn response_headers() {
    let s = Settings::from_vars(|k| (k == "LIMIT_RESPONSE_HEADERS_ENABLED").then(|| "true".into()))
        .unwrap();
    let (e, _) = envoy(s);
    let r = req("d", vec![desc(&[("a", "hdr")]), desc(&[("m", "hdr")])], 0);
    let resp = e.should_rate_limit(&r).unwrap();
    let h: Vec<(String, String)> = resp
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    // The descriptor closest to its limit: `a` (2 left of 3) before `m` (9 of 10).
    assert_eq!(
        h,
        vec![
            ("RateLimit-Limit".into(), "3".into()),
            ("RateLimit-Remaining".into(), "2".into()),
            ("RateLimit-Reset".into(), "50".into()),
        ]
    );
    // No headers without the setting.
    let (e, _) = envoy(Settings::default());
    assert!(e
        .should_rate_limit(&r)
        .unwrap()
        .response_headers_to_add
        .is_empty());
}

#[test]
fn oversized_requests_are_refused() {
    let (e, _) = envoy(Settings::default());
    let many = req(
        "d",
        (0..10_000)
            .map(|i| desc(&[("a", &i.to_string())]))
            .collect(),
        0,
    );
    assert!(e
        .should_rate_limit(&many)
        .unwrap_err()
        .message()
        .contains("descriptors"));
    let big = "x".repeat(1 << 20);
    let r = req("d", vec![desc(&[("a", &big)])], 0);
    assert!(e
        .should_rate_limit(&r)
        .unwrap_err()
        .message()
        .contains("bytes"));
}

#[test]
fn reload_keeps_unchanged_counters() {
    let (e, _) = envoy(Settings::default());
    let r = req("d", vec![desc(&[("a", "k")])], 3);
    e.should_rate_limit(&r).unwrap();
    // Same limit for `a` (moved down a line): its count is kept.
    let moved = format!("# moved\n{CFG}");
    e.reload(&parse("cfg.yaml", &moved).unwrap()).unwrap();
    assert_eq!(
        e.should_rate_limit(&r).unwrap().overall_code,
        CODE_OVER_LIMIT
    );
    // A changed limit starts fresh.
    let changed = CFG.replace("requests_per_unit: 3}", "requests_per_unit: 4}");
    e.reload(&parse("cfg.yaml", &changed).unwrap()).unwrap();
    let resp = e
        .should_rate_limit(&req("d", vec![desc(&[("a", "k")])], 1))
        .unwrap();
    assert_eq!(resp.statuses[0].limit_remaining, 3);
}

/// The quota part of upstream's examples/ratelimit/config/example.yaml, plus a plain limit.
const QUOTA: &str = "\
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: \"service_1\"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      service_with_quota:
        name: \"service_2\"
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {plain: true}
";

fn quota_envoy(vars: &'static [(&'static str, &'static str)]) -> Envoy {
    let s = Settings::from_vars(|k| vars.iter().find(|p| p.0 == k).map(|p| p.1.to_string()));
    let clock = Arc::new(ManualClock::new(T0));
    Envoy::with_clock(&parse("example.yaml", QUOTA).unwrap(), s.unwrap(), clock).unwrap()
}

fn codes(r: &RateLimitResponse) -> (i32, Vec<i32>) {
    (r.overall_code, r.statuses.iter().map(|s| s.code).collect())
}

/// Quota mode counted for real (upstream's TestServiceQuotaModeOnlySomeOverTheLimit,
/// ...OnlyAllOverTheLimit, TestServicePerDescriptorQuotaMode, TestServiceMixedPerDescriptorModes
/// with a real counter in place of the mock): a quota descriptor over its limit keeps its
/// OVER_LIMIT status, and makes the request over only when every quota descriptor is over.
#[test]
fn quota_mode_per_descriptor() {
    let e = quota_envoy(&[]);
    let both = req(
        "rl",
        vec![
            desc(&[("service", "service_1")]),
            desc(&[("service", "service_2")]),
        ],
        0,
    );
    const OK: i32 = CODE_OK;
    const OVER: i32 = CODE_OVER_LIMIT;
    assert_eq!(
        codes(&e.should_rate_limit(&both).unwrap()),
        (OK, vec![OK, OK])
    );
    // service_1 over (2 > 1), service_2 at its limit: some quota over, OK.
    assert_eq!(
        codes(&e.should_rate_limit(&both).unwrap()),
        (OK, vec![OVER, OK])
    );
    // Both over: OVER_LIMIT.
    assert_eq!(
        codes(&e.should_rate_limit(&both).unwrap()),
        (OVER, vec![OVER, OVER])
    );
    // A plain limit over makes the request over whatever the quota descriptors say...
    let e = quota_envoy(&[]);
    let mixed = req(
        "rl",
        vec![desc(&[("plain", "x")]), desc(&[("service", "service_2")])],
        0,
    );
    assert_eq!(
        codes(&e.should_rate_limit(&mixed).unwrap()),
        (OK, vec![OK, OK])
    );
    assert_eq!(
        codes(&e.should_rate_limit(&mixed).unwrap()),
        (OVER, vec![OVER, OK])
    );
    // ...and all quota descriptors over make it over with the plain one under its limit.
    let e = quota_envoy(&[]);
    let mixed = req(
        "rl",
        vec![desc(&[("plain", "y")]), desc(&[("service", "service_1")])],
        0,
    );
    let mut r = mixed.clone();
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    r.descriptors[1].hits_addend = Some(UInt64Value { value: 2 });
    assert_eq!(
        codes(&e.should_rate_limit(&r).unwrap()),
        (OVER, vec![OK, OVER])
    );
    // SHADOW_MODE still answers OK (TestServiceQuotaModeWithShadowMode).
    let e = quota_envoy(&[("SHADOW_MODE", "true")]);
    assert_eq!(
        codes(&e.should_rate_limit(&r).unwrap()),
        (OK, vec![OK, OVER])
    );
}

/// QUOTA_MODE=true puts every descriptor in quota mode (TestServiceGlobalQuotaMode).
#[test]
fn quota_mode_global() {
    let e = quota_envoy(&[("QUOTA_MODE", "true")]);
    let r = req(
        "rl",
        vec![desc(&[("plain", "x")]), desc(&[("nothing", "x")])],
        2,
    );
    // `plain` over, the other descriptor has no limit but counts as a quota descriptor that
    // passed: OK.
    assert_eq!(
        codes(&e.should_rate_limit(&r).unwrap()),
        (CODE_OK, vec![CODE_OVER_LIMIT, CODE_OK])
    );
    let r = req("rl", vec![desc(&[("plain", "x")])], 0);
    assert_eq!(codes(&e.should_rate_limit(&r).unwrap()).0, CODE_OVER_LIMIT);
}

/// RESPONSE_DYNAMIC_METADATA=true: the request echoed and the metadata of the limits that
/// passed, the first value of a key kept (TestMetadataReturnedForPassedDescriptors,
/// TestOverlappingMetadataReturnsTheFirstValue).
#[test]
fn dynamic_metadata_of_passed_limits() {
    let e = quota_envoy(&[("RESPONSE_DYNAMIC_METADATA", "true")]);
    let mut r = req(
        "rl",
        vec![
            desc(&[("service", "service_1")]),
            desc(&[("service", "service_2")]),
            desc(&[("plain", "p")]),
        ],
        0,
    );
    r.descriptors[1].hits_addend = Some(UInt64Value { value: 0 });
    let name = |m: &Struct| -> Option<String> {
        let Some(Kind::StructValue(md)) = &m.fields.get("metadata")?.kind else {
            return None;
        };
        let Some(Kind::StructValue(s)) = &md.fields.get("service_with_quota")?.kind else {
            return None;
        };
        match &s.fields["name"].kind {
            Some(Kind::StringValue(n)) => Some(n.clone()),
            _ => None,
        }
    };
    let m = e.should_rate_limit(&r).unwrap().dynamic_metadata.unwrap();
    assert_eq!(name(&m).as_deref(), Some("service_1"), "{m:?}");
    assert_eq!(
        m.fields["domain"].kind,
        Some(Kind::StringValue("rl".into()))
    );
    let Some(Kind::StructValue(md)) = &m.fields["metadata"].kind else {
        panic!()
    };
    assert_eq!(md.fields["plain"].kind, Some(Kind::BoolValue(true)));
    let Some(Kind::ListValue(ds)) = &m.fields["descriptors"].kind else {
        panic!()
    };
    assert_eq!(ds.values.len(), 3);
    let Some(Kind::StructValue(d1)) = &ds.values[1].kind else {
        panic!()
    };
    assert_eq!(d1.fields["hitsAddend"].kind, Some(Kind::NumberValue(0.0)));
    // Second call: service_1 and plain are over, so only service_2's metadata is left.
    let m = e.should_rate_limit(&r).unwrap().dynamic_metadata.unwrap();
    assert_eq!(name(&m).as_deref(), Some("service_2"), "{m:?}");
    let Some(Kind::StructValue(md)) = &m.fields["metadata"].kind else {
        panic!()
    };
    assert!(!md.fields.contains_key("plain"));
    // Off by default.
    let e = quota_envoy(&[]);
    assert!(e.should_rate_limit(&r).unwrap().dynamic_metadata.is_none());
}

/// Headers as upstream picks them: the status with the least remaining, but the last
/// over-limit one that is not in quota mode wins.
#[test]
fn response_headers_follow_the_last_denial() {
    let s = Settings::from_vars(|k| (k == "LIMIT_RESPONSE_HEADERS_ENABLED").then(|| "true".into()))
        .unwrap();
    let (e, _) = envoy(s);
    let r = req("d", vec![desc(&[("a", "h2")]), desc(&[("m", "h2")])], 11);
    let resp = e.should_rate_limit(&r).unwrap();
    assert_eq!(codes(&resp).1, [CODE_OVER_LIMIT, CODE_OVER_LIMIT]);
    let limit = &resp.response_headers_to_add[0];
    assert_eq!(
        (limit.key.as_str(), limit.value.as_str()),
        ("RateLimit-Limit", "10")
    );
}
