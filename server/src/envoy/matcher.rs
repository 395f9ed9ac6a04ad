//! Which configured limit a request's descriptor gets: upstream's lookup, level by level.
//!
//! For each entry `(key, value)` of the descriptor, at the current level of the domain's tree:
//! 1. the node `key_value` (an exact value);
//! 2. else the first wildcard node, in file order, whose `key_value` without its trailing `*`
//!    is a prefix of the entry's `key_value` (`value: "*"` matches any value; `value: "foo*"`
//!    any value starting with `foo`; a `*` elsewhere is a literal);
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
use std::collections::HashMap;

/// One configured limit, numbered in [`Matcher::rules`].
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Upstream's stats key: `domain.key_value.subkey`.
    pub full_key: String,
    /// The domain.
    pub domain: String,
    /// The limit.
    pub limit: RateLimit,
    /// Report over-limit but answer OK.
    pub shadow_mode: bool,
    /// `detailed_metric` was set.
    pub detailed_metric: bool,
}

#[derive(Debug, Default)]
struct Level {
    nodes: Vec<Node>,
    exact: HashMap<String, usize>,
    /// (prefix without the `*`, node), in file order.
    wildcards: Vec<(String, usize)>,
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
                    .find(|(prefix, _)| buf.starts_with(prefix.as_str()))
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
            rules.push(Rule {
                full_key: d.full_key.clone(),
                domain: domain.to_string(),
                limit: rl.clone(),
                shadow_mode: d.shadow_mode,
                detailed_metric: d.detailed_metric,
            });
            rules.len() - 1
        });
        let composite = d.composite();
        let idx = l.nodes.len();
        let wildcard = composite.ends_with('*');
        l.nodes.push(Node {
            rule,
            children: level(domain, &d.descriptors, rules),
            shared_value: (wildcard && d.share_threshold).then(|| d.value.clone()),
        });
        if wildcard {
            l.wildcards
                .push((composite[..composite.len() - 1].to_string(), idx));
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
