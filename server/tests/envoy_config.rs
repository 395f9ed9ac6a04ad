//! The YAML loader and matcher against the cases of envoyproxy/ratelimit's
//! `test/config/config_test.go` (configs rewritten here; each test names the upstream case).

use turnstile_server::envoy::config::{load, parse, parse_many, ConfigError, Unit};
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

#[test]
fn upstream_test_wildcard_config() {
    let m = Matcher::new(
        &parse(
            "wildcard.yaml",
            "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: noWild\n    value: foo\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: noVal\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: midWild\n    value: bar*b\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: star\n    value: \"*\"\n    rate_limit: {unit: minute, requests_per_unit: 7}\n",
        )
        .unwrap(),
    );
    assert_eq!(
        lookup(&m, "test-domain", &[("noVal", "foo1")]),
        lookup(&m, "test-domain", &[("noVal", "foo2")])
    );
    let w1 = lookup(&m, "test-domain", &[("wild", "foo1")]).unwrap();
    assert_eq!(
        Some(w1.clone()),
        lookup(&m, "test-domain", &[("wild", "foo2")])
    );
    assert_eq!(w1.0, "test-domain.wild_foo*");
    assert!(lookup(&m, "test-domain", &[("wild", "bar")]).is_none());
    assert!(lookup(&m, "test-domain", &[("noWild", "foo1")]).is_none());
    assert!(lookup(&m, "test-domain", &[("midWild", "barab")]).is_none());
    // `value: "*"` matches every value, the empty one too.
    assert_eq!(
        lookup(&m, "test-domain", &[("star", "anything")])
            .unwrap()
            .1,
        7
    );
    assert_eq!(lookup(&m, "test-domain", &[("star", "")]).unwrap().1, 7);
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
