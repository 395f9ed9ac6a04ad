//! `turnstile rules import-envoy FILE`: an Envoy configuration as a turnstile rules file.
//!
//! Each limited descriptor becomes one `[[rule]]` named by its upstream stats key
//! (`domain.key_value.subkey`), with a fixed window (or its `algorithm:`) of
//! `requests_per_unit` per `unit × unit_multiplier`, and `mode = "shadow"` for `shadow_mode`.
//! A turnstile rule has no descriptor conditions, so the key class says how a caller maps a
//! descriptor onto a request: `global` when every entry of the path has a fixed value (one
//! counter), else `api_key`, where the caller passes the descriptor's entries as the API key.
//! `unlimited` limits and `requests_per_unit: 0` have no turnstile equivalent and are kept as
//! comments. The output parses with `turnstile rules check` (a test keeps it so).

use super::config::{Descriptor, EnvoyConfig, RateLimit};
use std::collections::HashSet;
use std::fmt::Write;

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The turnstile rules file equivalent to `cfg`.
pub fn import_to_rules(cfg: &EnvoyConfig) -> String {
    let mut out = Out {
        text: String::from(
            "# Imported from an envoyproxy/ratelimit configuration: one rule per limited descriptor.\n",
        ),
        names: HashSet::new(),
    };
    for d in cfg.domains.values() {
        let _ = writeln!(
            out.text,
            "\n# domain {} ({})",
            comment(&d.name),
            comment(&d.files())
        );
        let mut path = Vec::new();
        walk(&d.descriptors, &mut path, &mut out);
    }
    out.text
}

struct Out {
    text: String,
    names: HashSet<String>,
}

/// Comments stay on one line.
/// Text for a comment: printable ASCII only (TOML parsers differ on what else a comment may
/// hold; found by fuzzing).
fn comment(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}

fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A rule name as the rules file wants it (1..=128 printable characters, unique): the full
/// key, its control characters replaced, cut to fit, and numbered when taken.
fn rule_name(full_key: &str, taken: &mut HashSet<String>) -> String {
    let base: String = one_line(full_key).chars().take(100).collect();
    let mut name = base.clone();
    let mut n = 2;
    while taken.contains(&name) {
        name = format!("{base}~{n}");
        n += 1;
    }
    taken.insert(name.clone());
    name
}

fn walk<'a>(ds: &'a [Descriptor], path: &mut Vec<&'a Descriptor>, out: &mut Out) {
    for d in ds {
        path.push(d);
        if let Some(rl) = &d.rate_limit {
            rule(d, rl, path, out);
        }
        walk(&d.descriptors, path, out);
        path.pop();
    }
}

fn rule(d: &Descriptor, rl: &RateLimit, path: &[&Descriptor], o: &mut Out) {
    let out = &mut o.text;
    let entries: Vec<String> = path
        .iter()
        .map(|p| {
            if p.value.is_empty() {
                format!("{}=<any>", p.key)
            } else {
                format!("{}={}", p.key, p.value)
            }
        })
        .collect();
    let _ = writeln!(out, "\n# descriptor {}", comment(&entries.join(", ")));
    if rl.unlimited {
        let _ = writeln!(out, "# {}: unlimited (no rule)", comment(&d.full_key));
        return;
    }
    if rl.requests_per_unit == 0 {
        let _ = writeln!(
            out,
            "# {}: requests_per_unit 0 denies every request (no rule)",
            comment(&d.full_key)
        );
        return;
    }
    if o.names.len() >= turnstile::rules::MAX_RULES {
        let _ = writeln!(
            out,
            "# {}: left out, a rules file holds at most {} rules",
            comment(&d.full_key),
            turnstile::rules::MAX_RULES
        );
        return;
    }
    let fixed = path
        .iter()
        .all(|p| !p.value.is_empty() && !p.value.ends_with('*'));
    let _ = writeln!(out, "[[rule]]");
    let _ = writeln!(
        out,
        "name = {}",
        toml_str(&rule_name(&d.full_key, &mut o.names))
    );
    let _ = writeln!(
        out,
        "key = \"{}\"",
        if fixed { "global" } else { "api_key" }
    );
    if d.shadow_mode {
        let _ = writeln!(out, "mode = \"shadow\"");
    }
    let _ = writeln!(
        out,
        "limits = [{{ algorithm = \"{}\", limit = {}, window = \"{}s\" }}]",
        rl.algorithm.name(),
        rl.requests_per_unit,
        rl.window().as_secs()
    );
}
