//! draft-ietf-httpapi-ratelimit-headers-10's fields as a third-party Structured Fields parser
//! (the `sfv` crate, RFC 9651) reads them: every value `write_headers` writes parses as a List
//! whose member names the policy (a String) with integer parameters that say what the decision
//! says, also for extreme numbers, odd policy names and several policies in one field.

use http::HeaderMap;
use proptest::prelude::*;
use sfv::{BareItem, List, ListEntry, Parser};
use std::time::Duration;
use turnstile::{Decision, Outcome};
use turnstile_tower::{write_headers, HeaderStyle, Policy};

/// The largest Structured Fields integer.
const SF_MAX: u64 = 999_999_999_999_999;

fn decision(allowed: bool, limit: u64, remaining: u64, reset_ns: u64, retry_ns: u64) -> Decision {
    Decision {
        outcome: if allowed {
            Outcome::Allowed
        } else {
            Outcome::Limited
        },
        limit,
        remaining,
        reset_after_ns: reset_ns,
        retry_after_ns: (!allowed).then_some(retry_ns),
        delay_ns: 0,
    }
}

/// A field's values joined as one field line (RFC 9110 5.3), parsed as a List.
fn list(h: &HeaderMap, name: &str) -> List {
    let joined: Vec<&str> = h
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    let text = joined.join(", ");
    Parser::new(&text)
        .parse::<List>()
        .unwrap_or_else(|e| panic!("{name}: {text:?} is not a Structured Fields List: {e}"))
}

/// Each member of a draft field: its policy name and its integer parameters by key.
fn members(l: &List) -> Vec<(String, Vec<(String, i64)>)> {
    l.iter()
        .map(|m| {
            let ListEntry::Item(item) = m else {
                panic!("an inner list: {m:?}")
            };
            let BareItem::String(name) = &item.bare_item else {
                panic!("the member is not a String: {item:?}")
            };
            let params = item
                .params
                .iter()
                .map(|(k, v)| match v {
                    BareItem::Integer(i) => (k.as_str().to_string(), i64::from(*i)),
                    other => panic!("parameter {k:?} is not an Integer: {other:?}"),
                })
                .collect();
            (name.as_str().to_string(), params)
        })
        .collect()
}

fn params(p: &[(&str, u64)]) -> Vec<(String, i64)> {
    p.iter().map(|(k, v)| (k.to_string(), *v as i64)).collect()
}

#[test]
fn the_draft_fields_parse_back_to_the_decision() {
    let per_ip = Policy::new("per-ip", Some(Duration::from_secs(60))).unwrap();
    let admitted = decision(true, 10, 7, 18_000_000_001, 0);
    let mut h = HeaderMap::new();
    write_headers(&HeaderStyle::Ietf, &per_ip, &admitted, &mut h);
    assert_eq!(
        members(&list(&h, "ratelimit-policy")),
        [("per-ip".into(), params(&[("q", 10), ("w", 60)]))]
    );
    assert_eq!(
        members(&list(&h, "ratelimit")),
        [("per-ip".into(), params(&[("r", 7), ("t", 19)]))]
    );
    // Refused: nothing left, and the reset is when this request would be admitted.
    let refused = decision(false, 10, 3, 60_000_000_000, 2_500_000_000);
    let mut h = HeaderMap::new();
    write_headers(&HeaderStyle::Ietf, &Policy::default(), &refused, &mut h);
    assert_eq!(
        members(&list(&h, "ratelimit")),
        [("default".into(), params(&[("r", 0), ("t", 3)]))]
    );
    // Two policies (a global layer over a per-route one): two members of each field.
    write_headers(&HeaderStyle::Ietf, &per_ip, &admitted, &mut h);
    let names: Vec<String> = members(&list(&h, "ratelimit"))
        .into_iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(names, ["default", "per-ip"]);
    assert_eq!(list(&h, "ratelimit-policy").len(), 2);
}

#[test]
fn numbers_beyond_a_structured_fields_integer_are_capped() {
    let p = Policy::new("big", Some(Duration::from_secs(u64::MAX / 2))).unwrap();
    let d = decision(true, u64::MAX - 1, u64::MAX - 2, u64::MAX, 0);
    let mut h = HeaderMap::new();
    write_headers(&HeaderStyle::Ietf, &p, &d, &mut h);
    assert_eq!(
        members(&list(&h, "ratelimit-policy")),
        [("big".into(), params(&[("q", SF_MAX), ("w", SF_MAX)]))]
    );
    assert_eq!(
        members(&list(&h, "ratelimit")),
        [(
            "big".into(),
            params(&[("r", SF_MAX), ("t", u64::MAX.div_ceil(1_000_000_000))])
        )]
    );
}

proptest! {
    /// Any policy name `Policy::new` accepts and any decision with a limit give fields that
    /// parse, name the policy and carry the decision's numbers (capped).
    #[test]
    fn any_accepted_policy_and_decision_parse(
        name in "[ -~]{0,40}",
        window in proptest::option::of(0u64..10_000_000),
        allowed in any::<bool>(),
        limit in 1u64..u64::MAX,
        remaining in any::<u64>(),
        reset in any::<u64>(),
        retry in any::<u64>(),
    ) {
        let Ok(p) = Policy::new(&name, window.map(Duration::from_secs)) else {
            prop_assert!(name.contains('"') || name.contains('\\'));
            return Ok(());
        };
        let d = decision(allowed, limit, remaining, reset, retry);
        let mut h = HeaderMap::new();
        write_headers(&HeaderStyle::Ietf, &p, &d, &mut h);
        let policy = members(&list(&h, "ratelimit-policy"));
        let rate = members(&list(&h, "ratelimit"));
        prop_assert_eq!(&policy[0].0, &name);
        prop_assert_eq!(&rate[0].0, &name);
        let mut want = vec![("q", limit.min(SF_MAX))];
        want.extend(window.map(|w| ("w", w)));
        prop_assert_eq!(&policy[0].1, &params(&want));
        let r = if allowed { remaining } else { 0 };
        let t = if allowed {
            d.reset_after_secs_ceil()
        } else {
            d.retry_after_secs_ceil().unwrap()
        };
        prop_assert_eq!(&rate[0].1, &params(&[("r", r.min(SF_MAX)), ("t", t.min(SF_MAX))]));
    }
}
