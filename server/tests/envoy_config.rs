//! The YAML loader and matcher against the cases of envoyproxy/ratelimit's
//! `test/config/config_test.go` (configs rewritten here; each test names the upstream case).

use envoy_types::pb::google::protobuf::value::Kind;
use turnstile_server::envoy::config::{
    load, parse, parse_many, parse_many_with, ConfigError, LoadOptions, Unit,
};
use turnstile_server::envoy::matcher::Matcher;

/// Ported from upstream's `test/config/basic_config.yaml` (with its key6/key7 additions).
pub const BASIC: &str = "\
# Basic configuration
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 1
  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25
  - key: key6
    rate_limit:
      unlimited: true
  - key: key7
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 70
";

fn lookup(
    m: &Matcher,
    domain: &str,
    e: &[(&str, &str)],
) -> Option<(String, u32, Option<Unit>, bool)> {
    let (mut b, mut k) = (String::new(), Vec::new());
    m.lookup(domain, e, &mut b, &mut k).map(|i| {
        let r = &m.rules()[i];
        (
            r.full_key.clone(),
            r.limit.requests_per_unit,
            r.limit.unit,
            r.limit.unlimited,
        )
    })
}

fn err(yaml: &str) -> ConfigError {
    parse("f.yaml", yaml).unwrap_err()
}

#[test]
fn upstream_test_basic_config() {
    let m = Matcher::new(&parse("basic_config.yaml", BASIC).unwrap());
    assert!(lookup(&m, "foo_domain", &[]).is_none());
    assert!(lookup(&m, "test-domain", &[]).is_none());
    assert!(lookup(&m, "test-domain", &[("key1", "something")]).is_none());
    assert!(lookup(&m, "test-domain", &[("key1", "value1")]).is_none());
    assert!(lookup(
        &m,
        "test-domain",
        &[("key2", "value2"), ("subkey", "subvalue")]
    )
    .is_none());
    assert!(lookup(
        &m,
        "test-domain",
        &[("key5", "value5"), ("subkey5", "subvalue")]
    )
    .is_none());
    let x = lookup(
        &m,
        "test-domain",
        &[("key1", "value1"), ("subkey1", "something")],
    )
    .unwrap();
    assert_eq!(
        x,
        (
            "test-domain.key1_value1.subkey1".into(),
            5,
            Some(Unit::Second),
            false
        )
    );
    let x = lookup(
        &m,
        "test-domain",
        &[("key1", "value1"), ("subkey1", "subvalue1")],
    )
    .unwrap();
    assert_eq!(
        x,
        (
            "test-domain.key1_value1.subkey1_subvalue1".into(),
            10,
            Some(Unit::Second),
            false
        )
    );
    let x = lookup(&m, "test-domain", &[("key2", "something")]).unwrap();
    assert_eq!(
        x,
        ("test-domain.key2".into(), 20, Some(Unit::Minute), false)
    );
    let x = lookup(&m, "test-domain", &[("key2", "value2")]).unwrap();
    assert_eq!(
        x,
        (
            "test-domain.key2_value2".into(),
            30,
            Some(Unit::Minute),
            false
        )
    );
    // key2 with another value falls back to key2's default (upstream: same).
    let x = lookup(&m, "test-domain", &[("key2", "value3")]).unwrap();
    assert_eq!(x.0, "test-domain.key2");
    assert_eq!(
        lookup(&m, "test-domain", &[("key3", "foo")]).unwrap().2,
        Some(Unit::Hour)
    );
    assert_eq!(
        lookup(&m, "test-domain", &[("key4", "foo")]).unwrap().2,
        Some(Unit::Day)
    );
    assert!(lookup(&m, "test-domain", &[("key6", "foo")]).unwrap().3);
    assert_eq!(lookup(&m, "test-domain", &[("key7", "x")]).unwrap().1, 70);
    // key5_value5 has a limit and children: the one-entry descriptor gets it.
    assert_eq!(
        lookup(&m, "test-domain", &[("key5", "value5")]).unwrap().1,
        15
    );
    assert_eq!(
        lookup(
            &m,
            "test-domain",
            &[("key5", "value5"), ("subkey5", "subvalue5")]
        )
        .unwrap()
        .1,
        25
    );
}

/// Upstream's `test/config/wildcard.yaml`, written out here.
const WILDCARD: &str = "\
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: star
    value: \"*\"
    rate_limit: {unit: minute, requests_per_unit: 7}
";

/// Upstream's TestWildcardConfig, case by case (the `star` key is ours).
#[test]
fn upstream_test_wildcard_config() {
    let m = Matcher::new(&parse("wildcard.yaml", WILDCARD).unwrap());
    let key = |e: &[(&str, &str)]| lookup(&m, "test-domain", e).map(|l| l.0);
    // Baseline: a key without value matches any value.
    assert_eq!(
        key(&[("noVal", "foo1")]).as_deref(),
        Some("test-domain.noVal")
    );
    assert_eq!(key(&[("noVal", "foo1")]), key(&[("noVal", "foo2")]));
    // A trailing wildcard, at the top and below it.
    assert_eq!(
        key(&[("wild", "foo1")]).as_deref(),
        Some("test-domain.wild_foo*")
    );
    assert_eq!(
        key(&[("wild", "foo2")]).as_deref(),
        Some("test-domain.wild_foo*")
    );
    assert_eq!(
        key(&[("nestedWild", "val1"), ("wild", "goo2")]).as_deref(),
        Some("test-domain.nestedWild_val1.wild_goo*")
    );
    assert_eq!(key(&[("wild", "bar")]), None);
    assert_eq!(key(&[("noWild", "foo1")]), None, "no eager match without *");
    // A wildcard in the middle: `bar*b`; `*` matches the empty run too.
    for v in ["barab", "bar123b", "barb"] {
        assert_eq!(
            key(&[("midWild", v)]).as_deref(),
            Some("test-domain.midWild_bar*b"),
            "{v}"
        );
    }
    for v in ["bara", "xbarb"] {
        assert_eq!(key(&[("midWild", v)]), None, "{v}");
    }
    // Several wildcards: `foo*bar*baz`, the runs in order.
    for v in ["foo123bar456baz", "foobarbaz"] {
        assert_eq!(
            lookup(&m, "test-domain", &[("multiWild", v)]).map(|l| (l.0, l.1)),
            Some(("test-domain.multiWild_foo*bar*baz".into(), 10)),
            "{v}"
        );
    }
    for v in ["foo123baz", "bar456baz"] {
        assert_eq!(key(&[("multiWild", v)]), None, "{v}");
    }
    // `value: "*"` matches every value, the empty one too.
    assert_eq!(
        lookup(&m, "test-domain", &[("star", "anything")])
            .unwrap()
            .1,
        7
    );
    assert_eq!(lookup(&m, "test-domain", &[("star", "")]).unwrap().1, 7);
}

/// Upstream's TestDomainMerge and TestDuplicateKeyDomainMerge (merge_domain_key1.yaml and
/// merge_domain_key2.yaml, written out here), and TestDuplicateDomain without merging.
#[test]
fn upstream_test_domain_merge() {
    let key1 = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n";
    let key2 = "# merged with key1\ndomain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n";
    let merge = LoadOptions {
        merge_domains: true,
    };
    let cfg = parse_many_with([("key1.yaml", key1), ("key2.yaml", key2)], merge).unwrap();
    assert_eq!(cfg.domains["test-domain"].files(), "key1.yaml, key2.yaml");
    let m = Matcher::new(&cfg);
    assert!(lookup(&m, "foo_domain", &[]).is_none());
    assert!(lookup(&m, "test-domain", &[]).is_none());
    assert_eq!(
        lookup(&m, "test-domain", &[("key1", "value1")]).unwrap().1,
        10
    );
    assert_eq!(
        lookup(&m, "test-domain", &[("key2", "value2")]).unwrap().1,
        20
    );
    // The same key_value in two merged files: refused where the second names it.
    let e = parse_many_with([("key1.yaml", key1), ("again.yaml", key1)], merge).unwrap_err();
    assert_eq!(
        e.to_string(),
        "again.yaml:3:5: duplicate descriptor composite key 'test-domain.key1_value1' (also in key1.yaml:3:5)"
    );
    // Without merging, the second file is refused, naming both files and places.
    let e = parse_many([("key1.yaml", key1), ("key2.yaml", key2)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "key2.yaml:2:9: duplicate domain 'test-domain' in config file (also in key1.yaml:1:9); \
         to merge the files of one domain, set MERGE_DOMAIN_CONFIG=true"
    );
}

/// Upstream's TestMetadata (metadata.yaml, written out here): `metadata` is accepted, free
/// form, and kept with the limit of its descriptor.
#[test]
fn upstream_test_metadata() {
    let yaml = "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota:
        name: service_2
        # Anything goes inside, keys upstream does not know too.
        unknown_key: [1, yes, ~, \"x\"]
";
    let m = Matcher::new(&parse("metadata.yaml", yaml).unwrap());
    let meta = |e: &[(&str, &str)]| {
        let (mut b, mut k) = (String::new(), Vec::new());
        let i = m.lookup("test-domain", e, &mut b, &mut k).unwrap();
        m.rules()[i].metadata.clone()
    };
    let s = meta(&[("key1", "value1"), ("subkey1", "something")]).unwrap();
    assert_eq!(
        s.fields["name"].kind,
        Some(Kind::StringValue("service_1".into()))
    );
    assert!(meta(&[("key1", "value1"), ("subkey1", "subvalue1")]).is_none());
    let s = meta(&[("key2", "something")]).unwrap();
    let Some(Kind::StructValue(q)) = &s.fields["service_with_quota"].kind else {
        panic!("{s:?}")
    };
    assert_eq!(
        q.fields["name"].kind,
        Some(Kind::StringValue("service_2".into()))
    );
    let Some(Kind::ListValue(l)) = &q.fields["unknown_key"].kind else {
        panic!("{q:?}")
    };
    let kinds: Vec<_> = l.values.iter().map(|v| v.kind.clone().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            Kind::NumberValue(1.0),
            Kind::BoolValue(true),
            Kind::NullValue(0),
            Kind::StringValue("x".into())
        ]
    );
    // A descriptor's metadata is a mapping.
    let e = err("domain: d\ndescriptors:\n  - key: k\n    metadata: just text\n");
    assert_eq!((e.line, e.column), (4, 15), "{e}");
    assert!(e.message.contains("`metadata` must be a mapping"), "{e}");
}

/// examples/ratelimit/config/example.yaml's `quota_mode` (and its `metadata`) are accepted.
#[test]
fn quota_mode_is_read() {
    let yaml = "domain: rl\ndescriptors:\n  - key: service\n    value: service_1\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    metadata:\n      service_with_quota:\n        name: \"service_1\"\n  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let m = Matcher::new(&parse("example.yaml", yaml).unwrap());
    let (mut b, mut k) = (String::new(), Vec::new());
    let i = m
        .lookup("rl", &[("service", "service_1")], &mut b, &mut k)
        .unwrap();
    assert!(m.rules()[i].quota_mode);
    let i = m.lookup("rl", &[("other", "x")], &mut b, &mut k).unwrap();
    assert!(!m.rules()[i].quota_mode);
    let e = err("domain: d\ndescriptors:\n  - key: k\n    quota_mode: sometimes\n");
    assert!(e.message.contains("quota_mode"), "{e}");
}

/// Upstream refuses `share_threshold` on a value without a wildcard.
#[test]
fn share_threshold_needs_a_wildcard() {
    let e = err("domain: d\ndescriptors:\n  - key: files\n    value: files/a\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n");
    assert_eq!((e.line, e.column), (3, 5));
    assert_eq!(
        e.message,
        "share_threshold can only be used with wildcard values (containing '*'), but found key 'files_files/a'"
    );
    // In the middle of the value is a wildcard too.
    parse("f.yaml", "domain: d\ndescriptors:\n  - key: p\n    value: /api*v1\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n").unwrap();
}

#[test]
fn wildcards_work_below_the_top_level() {
    let m = Matcher::new(
        &parse(
            "f.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        value: x*\n        rate_limit: {unit: second, requests_per_unit: 3}\n",
        )
        .unwrap(),
    );
    assert_eq!(lookup(&m, "d", &[("a", "1"), ("b", "xyz")]).unwrap().1, 3);
    assert!(lookup(&m, "d", &[("a", "1"), ("b", "yz")]).is_none());
}

#[test]
fn upstream_errors() {
    // TestEmptyDomain
    assert!(err("descriptors: []\n")
        .message
        .contains("cannot have empty domain"));
    // TestDuplicateDomain
    let e = parse_many([("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")]).unwrap_err();
    assert_eq!(e.origin, "b.yaml");
    assert!(e.message.contains("duplicate domain 'd'"), "{e}");
    // TestEmptyKey
    let e = err("domain: d\ndescriptors:\n  - value: v\n");
    assert!(e.message.contains("descriptor has empty key"));
    assert_eq!((e.line, e.column), (3, 5));
    // TestDuplicateKey
    let e = err("domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n");
    assert!(
        e.message
            .contains("duplicate descriptor composite key 'test-domain.key1_value1'"),
        "{e}"
    );
    assert_eq!(e.line, 5);
    // TestBadLimitUnit
    let e = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n");
    assert!(e.message.contains("invalid rate limit unit 'foo'"), "{e}");
    assert_eq!((e.line, e.column), (5, 13));
    // TestReplacesSelf, TestReplacesEmpty
    let e = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      name: me\n      replaces:\n        - name: me\n");
    assert!(
        e.message
            .contains("replaces should not contain name of same descriptor"),
        "{e}"
    );
    let e = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      replaces:\n        - name: \"\"\n");
    assert!(
        e.message
            .contains("should not have an empty replaces entry"),
        "{e}"
    );
    // TestBadYaml
    let e = err("domain: d\ndescriptors: [\n");
    assert!(e.message.starts_with("error loading config file"), "{e}");
    assert!(e.line >= 2, "{e}");
    // TestMisspelledKey (both files)
    let e = err("domain: d\ndescriptors:\n  - key: k\n    ratelimit:\n      unit: second\n");
    assert!(e.message.contains("unknown key 'ratelimit'"), "{e}");
    assert!(e.message.contains("did you mean 'rate_limit'"), "{e}");
    assert_eq!((e.line, e.column), (4, 5));
    let e = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requestsperunit: 5\n");
    assert!(e.message.contains("unknown key 'requestsperunit'"), "{e}");
    // TestNonStringKey
    let e = err("domain: d\ndescriptors:\n  - key: k\n    0.25: x\n");
    assert!(
        e.message.contains("key is not of type string: `0.25`"),
        "{e}"
    );
    // TestNonMapList
    let e = err("domain: d\ndescriptors:\n  - a\n");
    assert!(
        e.message.contains("list of type other than map: `a`"),
        "{e}"
    );
    // TestUnlimitedWithRateLimitUnit
    let e = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n");
    assert!(
        e.message
            .contains("should not specify rate limit unit when unlimited"),
        "{e}"
    );
    assert_eq!(e.line, 6);
}

#[test]
fn our_checks() {
    let e = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n");
    assert!(e.message.contains("requests_per_unit"), "{e}");
    assert_eq!(e.line, 6);
    let e = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: magic\n");
    assert!(e.message.contains("unknown algorithm `magic`"), "{e}");
    let e = err("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n");
    assert!(e.message.contains("true or false"), "{e}");
    let e = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, unit_multiplier: 0}\n");
    assert!(e.message.contains("unit_multiplier"), "{e}");
    let e = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 20000000}\n");
    assert!(e.message.contains("token_bucket"), "{e}");
    assert!(err("").message.contains("empty"));
    assert!(err("- a\n").message.contains("mapping"));
    // Display: file:line:column: message
    let e = err("domain: d\ndescriptors:\n  - key: k\n    ratelimit: 1\n");
    assert!(
        e.to_string()
            .starts_with("f.yaml:4:5: config error, unknown key"),
        "{e}"
    );
}

#[test]
fn units_multiplier_and_algorithm() {
    let c = parse(
        "f.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: MINUTE, requests_per_unit: 20, unit_multiplier: 5}\n  - key: b\n    rate_limit: {unit: Week, requests_per_unit: 1, algorithm: sliding_window}\n",
    )
    .unwrap();
    let ls = c.limits();
    assert_eq!(ls[0].2.window().as_secs(), 300);
    assert_eq!(ls[1].2.unit, Some(Unit::Week));
    assert_eq!(ls[1].2.algorithm, turnstile::Algorithm::SlidingWindow);
    for u in ["second", "minute", "hour", "day", "week", "month", "year"] {
        let y = format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: {u}, requests_per_unit: 1}}\n");
        assert!(parse("f.yaml", &y).is_ok(), "{u}");
    }
}

#[test]
fn directory_of_files_and_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    std::fs::write(dir.path().join("b.yml"), "domain: b\n").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not yaml: [").unwrap();
    let c = load(dir.path()).unwrap();
    assert_eq!(c.domains.len(), 2);
    std::fs::write(
        dir.path().join("c.yaml"),
        "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
    )
    .unwrap();
    let e = load(dir.path()).unwrap_err();
    assert!(e.origin.ends_with("c.yaml"), "{e}");
    assert_eq!(e.line, 4);
    assert!(load(dir.path().join("missing.yaml")).is_err());
}
