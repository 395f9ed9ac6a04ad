//! `import_to_rules`: the output is a valid turnstile rules file with one rule per limit.

use turnstile::rules::{KeyClass, Mode, Rules};
use turnstile_server::envoy::{config::parse, import_to_rules};

#[test]
fn import_gives_a_valid_rules_file() {
    let cfg = parse(
        "e.yaml",
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: path\n    value: /login\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 5, unit_multiplier: 2, algorithm: sliding_window}\n  - key: free\n    rate_limit: {unlimited: true}\n  - key: never\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: \"quo\\\"te\"\n    value: \"*\"\n    rate_limit: {unit: day, requests_per_unit: 7}\n",
    )
    .unwrap();
    let text = import_to_rules(&cfg);
    let rules = Rules::parse(&text, "imported.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    let names: Vec<&str> = rules.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["edge.remote_address", "edge.path_/login", "edge.quo\"te_*"]
    );
    assert_eq!(rules.rules[0].key, KeyClass::api_key());
    assert_eq!(rules.rules[1].key, KeyClass::global());
    assert_eq!(rules.rules[1].mode, Mode::Shadow);
    let l = &rules.rules[1].limits[0];
    assert_eq!((l.limit, l.window.as_secs()), (5, 120));
    assert!(text.contains("edge.free: unlimited (no rule)"), "{text}");
    assert!(text.contains("edge.never: requests_per_unit 0"), "{text}");
}

#[test]
fn long_and_colliding_names_stay_valid() {
    let long = "k".repeat(300);
    let y = format!(
        "domain: d\ndescriptors:\n  - key: {long}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n  - key: {long}\n    value: v\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    );
    let text = import_to_rules(&parse("e.yaml", &y).unwrap());
    let rules = Rules::parse(&text, "imported.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(rules.rules.len(), 2);
}
