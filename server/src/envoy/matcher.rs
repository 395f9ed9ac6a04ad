//! Which configured limit a request's descriptor gets: upstream's lookup, level by level.
//!
//! For each entry `(key, value)` of the descriptor, at the current level of the domain's tree:
//! 1. the node `key_value` (an exact value);
//! 2. else the first wildcard node, in file order (for merged files, in the order the files
//!    are read), whose `key_value` pattern matches the entry's `key_value`: each `*` matches
//!    any run of characters, the empty one too (`value: "*"` matches any value, `foo*` any
//!    value starting with `foo`, `bar*b` `barb`, `barab` and `bar123b`, `foo*bar*baz`
//!    `foobarbaz` and `foo1bar2baz`);
//! 3. else the node `key` (no value: any value).
//!
//! The limit applies only if the node found for the *last* entry has one ("last-entry
//! matching": a descriptor with more entries than the configured path gets no limit, nor one
//! with fewer). The walk goes down a level while the found node has children, and stops at the
//! first entry that finds no node.
//!
//! The counter a matched descriptor uses is keyed by every entry's key and value; under a
//! wildcard node with `share_threshold: true` the value is replaced by the wildcard pattern,
//! so every matching value shares one counter.

use super::config::{Descriptor, EnvoyConfig, RateLimit};
use envoy_types::pb::google::protobuf::Struct;
use std::collections::HashMap;

/// One configured limit, numbered in [`Matcher::rules`].
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Upstream's stats key: `domain.key_value.subkey`.
    pub full_key: String,
    /// The domain.
    pub domain: String,
    /// The descriptor's path of keys for `/metrics`: the parents' `key_value`s and its own key
    /// (`key`, `parent_value.key`), never a value the configuration does not name.
    pub metric_key: String,
    /// Its value, as configured (empty: any value).
    pub metric_value: String,
    /// The limit.
    pub limit: RateLimit,
    /// Report over-limit but answer OK.
    pub shadow_mode: bool,
    /// `detailed_metric` was set.
    pub detailed_metric: bool,
    /// Over only when every quota descriptor of the request is over.
    pub quota_mode: bool,
    /// Returned in `dynamic_metadata` when this limit passes.
    pub metadata: Option<Struct>,
}

#[derive(Debug, Default)]
struct Level {
    nodes: Vec<Node>,
    exact: HashMap<String, usize>,
    /// (pattern, node), in file order.
    wildcards: Vec<(Wildcard, usize)>,
}

/// A `key_value` pattern with `*`s, split on them once when the configuration is compiled.
#[derive(Debug)]
struct Wildcard {
    /// The literal runs between the `*`s: at least two (a leading or trailing `*` gives an
    /// empty first or last run).
    parts: Vec<String>,
    /// Their total length: no shorter text matches.
    fixed: usize,
}

impl Wildcard {
    fn new(pattern: &str) -> Self {
        let parts: Vec<String> = pattern.split('*').map(str::to_string).collect();
        let fixed = parts.iter().map(String::len).sum();
        Wildcard { parts, fixed }
    }

    /// Whether `text` matches: the first run starts it, the last ends it, and the runs between
    /// appear in order in what is left, each at its first place (leftmost first is enough: a
    /// later run can only gain room from an earlier one placed as far left as it goes).
    fn matches(&self, text: &str) -> bool {
        let (first, last) = (&self.parts[0], &self.parts[self.parts.len() - 1]);
        if text.len() < self.fixed
            || !text.starts_with(first.as_str())
            || !text.ends_with(last.as_str())
        {
            return false;
        }
        // In bounds and on character boundaries: `fixed` ≥ both runs, which are a prefix and
        // a suffix of `text`.
        let mut rest = &text[first.len()..text.len() - last.len()];
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(i) => rest = &rest[i + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[derive(Debug)]
struct Node {
    rule: Option<usize>,
    children: Level,
    /// For a wildcard node with `share_threshold`: the configured value that replaces the
    /// request's in the counter key.
    shared_value: Option<String>,
}

/// The compiled lookup of a configuration.
#[derive(Debug, Default)]
pub struct Matcher {
    domains: HashMap<String, Level>,
    rules: Vec<Rule>,
}

/// A descriptor entry as the matcher reads it.
pub trait Entry {
    /// The entry's key.
    fn key(&self) -> &str;
    /// The entry's value.
    fn value(&self) -> &str;
}

impl Entry for (&str, &str) {
    fn key(&self) -> &str {
        self.0
    }
    fn value(&self) -> &str {
        self.1
    }
}

impl Matcher {
    /// Compiles `cfg`.
    pub fn new(cfg: &EnvoyConfig) -> Self {
        let mut rules = Vec::new();
        let mut domains = HashMap::new();
        for (name, d) in &cfg.domains {
            domains.insert(name.clone(), level(name, &d.descriptors, &mut rules));
        }
        Matcher { domains, rules }
    }

    /// The configured limits.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether the domain is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The rule a descriptor gets, if any. `buf` is scratch space; `key` receives the counter
    /// key (entries with `share_threshold` values replaced), valid when a rule is returned.
    pub fn lookup<E: Entry>(
        &self,
        domain: &str,
        entries: &[E],
        buf: &mut String,
        key: &mut Vec<u8>,
    ) -> Option<usize> {
        let mut level = self.domains.get(domain)?;
        let mut found = None;
        key.clear();
        for (i, e) in entries.iter().enumerate() {
            buf.clear();
            buf.push_str(e.key());
            buf.push('_');
            buf.push_str(e.value());
            let mut node = level.exact.get(buf.as_str()).copied();
            if node.is_none() {
                node = level
                    .wildcards
                    .iter()
                    .find(|(w, _)| w.matches(buf))
                    .map(|&(_, n)| n);
            }
            if node.is_none() {
                node = level.exact.get(e.key()).copied();
            }
            let Some(n) = node.map(|n| &level.nodes[n]) else {
                break;
            };
            push_part(key, e.key());
            push_part(key, n.shared_value.as_deref().unwrap_or(e.value()));
            if n.rule.is_some() && i == entries.len() - 1 {
                found = n.rule;
            }
            if n.children.nodes.is_empty() {
                break;
            }
            level = &n.children;
        }
        found
    }
}

/// Appends one length-prefixed part, so that no two entry lists share a key.
pub fn push_part(key: &mut Vec<u8>, part: &str) {
    key.extend_from_slice(&(part.len() as u32).to_le_bytes());
    key.extend_from_slice(part.as_bytes());
}

fn level(domain: &str, ds: &[Descriptor], rules: &mut Vec<Rule>) -> Level {
    let mut l = Level::default();
    for d in ds {
        let rule = d.rate_limit.as_ref().map(|rl| {
            let parents = d
                .full_key
                .strip_suffix(&d.composite())
                .and_then(|p| p.strip_prefix(domain))
                .and_then(|p| p.strip_prefix('.'))
                .unwrap_or("");
            rules.push(Rule {
                full_key: d.full_key.clone(),
                domain: domain.to_string(),
                metric_key: format!("{parents}{}", d.key),
                metric_value: d.value.clone(),
                limit: rl.clone(),
                shadow_mode: d.shadow_mode,
                detailed_metric: d.detailed_metric,
                quota_mode: d.quota_mode,
                metadata: d.metadata.clone(),
            });
            rules.len() - 1
        });
        let composite = d.composite();
        let idx = l.nodes.len();
        let wildcard = d.is_wildcard();
        l.nodes.push(Node {
            rule,
            children: level(domain, &d.descriptors, rules),
            shared_value: (wildcard && d.share_threshold).then(|| d.value.clone()),
        });
        if wildcard {
            l.wildcards.push((Wildcard::new(&composite), idx));
        }
        l.exact.insert(composite, idx);
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::config::parse;

    fn m(yaml: &str) -> Matcher {
        Matcher::new(&parse("t.yaml", yaml).unwrap())
    }

    fn get<'a>(m: &'a Matcher, entries: &[(&str, &str)]) -> Option<&'a Rule> {
        let (mut b, mut k) = (String::new(), Vec::new());
        m.lookup("d", entries, &mut b, &mut k)
            .map(|i| &m.rules()[i])
    }

    #[test]
    fn last_entry_and_defaults() {
        let m = m("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: b\n        value: x\n        rate_limit: {unit: second, requests_per_unit: 2}\n");
        assert_eq!(get(&m, &[("a", "q")]).unwrap().full_key, "d.a");
        assert_eq!(
            get(&m, &[("a", "q"), ("b", "x")]).unwrap().full_key,
            "d.a.b_x"
        );
        assert!(get(&m, &[("a", "q"), ("b", "y")]).is_none());
        assert!(get(&m, &[("a", "q"), ("b", "x"), ("c", "")]).is_none());
        assert!(get(&m, &[("z", "q")]).is_none());
    }

    #[test]
    fn wildcards_match_as_upstream() {
        let w = |p: &str, t: &str| Wildcard::new(p).matches(t);
        for t in ["barb", "barab", "bar123b", "barbb", "barbarb"] {
            assert!(w("k_bar*b", &format!("k_{t}")), "{t}");
        }
        for t in ["bar", "bara", "xbarb", "barbx", "ba"] {
            assert!(!w("k_bar*b", &format!("k_{t}")), "{t}");
        }
        for t in [
            "foobarbaz",
            "foo1bar2baz",
            "foobarbarbaz",
            "foo-baz-bar-baz",
        ] {
            assert!(w("foo*bar*baz", t), "{t}");
        }
        for t in ["foobaz", "foo123baz", "bar456baz", "foobazbar", "foobarba"] {
            assert!(!w("foo*bar*baz", t), "{t}");
        }
        // Runs may not overlap: `ab*ba` needs four characters.
        assert!(!w("ab*ba", "aba"));
        assert!(w("ab*ba", "abba"));
        assert!(w("*", ""));
        assert!(w("**", "x"));
        assert!(w("a*", "a"));
        assert!(w("*é*", "café au lait"));
        assert!(!w("*é", "cafe"));
    }

    #[test]
    fn exact_before_wildcard_before_default() {
        let m = m("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    value: a*\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: k\n    value: ab*\n    rate_limit: {unit: second, requests_per_unit: 3}\n  - key: k\n    value: abc\n    rate_limit: {unit: second, requests_per_unit: 4}\n");
        let rpu = |v: &str| get(&m, &[("k", v)]).map(|r| r.limit.requests_per_unit);
        assert_eq!(rpu("abc"), Some(4), "exact first");
        assert_eq!(rpu("abd"), Some(2), "then the first wildcard in file order");
        assert_eq!(rpu("ax"), Some(2));
        assert_eq!(rpu("b"), Some(1), "then the key's default");
        assert_eq!(rpu("a*"), Some(2), "a pattern is also its own exact value");
    }

    #[test]
    fn share_threshold_shares_the_counter_key() {
        let m = m("domain: d\ndescriptors:\n  - key: f\n    value: p/*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: g\n    value: p/*\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
        let (mut b, mut k1, mut k2) = (String::new(), Vec::new(), Vec::new());
        assert!(m.lookup("d", &[("f", "p/1")], &mut b, &mut k1).is_some());
        assert!(m.lookup("d", &[("f", "p/2")], &mut b, &mut k2).is_some());
        assert_eq!(k1, k2);
        assert!(m.lookup("d", &[("g", "p/1")], &mut b, &mut k1).is_some());
        assert!(m.lookup("d", &[("g", "p/2")], &mut b, &mut k2).is_some());
        assert_ne!(k1, k2);
    }
}
