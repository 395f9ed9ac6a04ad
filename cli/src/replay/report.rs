//! The report: a text summary for people and a JSON document (`--json`) for tools, from the
//! same figures.

use super::compare::Diff;
use super::source::{Bad, Counts};
use super::tally::{RuleTally, Tally};
use super::time::format_iso;
use super::topk::Entry;
use serde_json::{json, Value};

/// What the run read, and how fast.
pub struct Run {
    pub files: Vec<(String, String)>,
    pub mapping: Vec<String>,
    pub counts: Counts,
    pub bad: Bad,
    pub seconds: f64,
    pub first: Option<u64>,
    pub last: Option<u64>,
}

/// Keys listed per rule.
pub const TOP: usize = 10;

fn pct(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        100.0 * n as f64 / d as f64
    }
}

/// `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn entry(e: &Entry) -> Value {
    json!({
        "key": e.text, "denied": e.count, "error": e.error,
        "first_denied": format_iso(e.first), "first_denied_exact": e.error == 0,
    })
}

fn rule_json(r: &RuleTally) -> Value {
    let limits: Vec<Value> = r
        .by_limit
        .iter()
        .map(|(l, n)| json!({ "limit": l, "denied": n, "spec": spec(r, *l) }))
        .collect();
    json!({
        "name": r.name, "mode": r.mode.name(), "key": r.class.to_string(),
        "requests": r.requests, "admitted": r.admitted, "elastic": r.pooled,
        "denied": r.denied, "shadow_denied": r.would_deny, "by_limit": limits,
        "keys": r.keys.count(), "keys_limited": r.limited.count(),
        "keys_exact": r.keys.exact() && r.limited.exact(),
        "share_of_keys_limited": pct(r.limited.count(), r.keys.count()) / 100.0,
        "top_denied": r.top.top(TOP).iter().map(entry).collect::<Vec<_>>(),
        "top_error_bound": r.top.max_error(),
    })
}

/// The written limits whose `limit` is `l` (a soft rule's nominal limit), or `limit l`.
fn spec(r: &RuleTally, l: u64) -> String {
    let mut m: Vec<&str> = r
        .limits
        .iter()
        .filter(|(x, _)| *x == l)
        .map(|(_, s)| s.as_str())
        .collect();
    m.dedup();
    if m.is_empty() {
        format!("limit {l} (an override's)")
    } else {
        m.join(" or ")
    }
}

fn tally_json(t: &Tally) -> Value {
    json!({
        "requests": t.requests, "admitted": t.requests - t.denied, "denied": t.denied,
        "shadow_denied": t.would_deny, "unmatched": t.unmatched,
        "rules": t.rules.iter().map(rule_json).collect::<Vec<_>>(),
    })
}

/// The JSON document.
pub fn document(run: &Run, base: Option<&Tally>, other: Option<(&Tally, &Diff)>) -> Value {
    let c = &run.counts;
    let mut doc = json!({
        "files": run.files.iter().map(|(f, fmt)| json!({"file": f, "format": fmt})).collect::<Vec<_>>(),
        "mapping": run.mapping,
        "lines": c.lines, "records": c.records, "skipped": c.skipped,
        "malformed": run.bad.count, "malformed_examples": run.bad.examples,
        "late_lines": c.late, "max_late_seconds": c.max_late_ns as f64 / 1e9,
        "bytes": c.bytes, "seconds": run.seconds,
        "lines_per_second": c.lines as f64 / run.seconds.max(1e-9),
        "first": run.first.map(format_iso), "last": run.last.map(format_iso),
    });
    if let Some(t) = base {
        doc["replay"] = tally_json(t);
    }
    if let Some((t, d)) = other {
        doc["compare"] = json!({
            "replay": tally_json(t),
            "newly_denied": d.newly_denied, "newly_allowed": d.newly_allowed,
            "keys_changed": d.changed.count(),
            "top_newly_denied": d.denied_keys.top(TOP).iter().map(entry).collect::<Vec<_>>(),
            "top_newly_allowed": d.allowed_keys.top(TOP).iter().map(entry).collect::<Vec<_>>(),
        });
    }
    doc
}

/// The text report on standard output.
pub fn print(run: &Run, base: Option<&Tally>, other: Option<(&Tally, &Diff)>, names: [&str; 2]) {
    let c = &run.counts;
    let files: Vec<String> = run
        .files
        .iter()
        .map(|(f, fmt)| format!("{f} ({fmt})"))
        .collect();
    println!("read {}", files.join(", "));
    println!("  mapping: {}", run.mapping.join(" "));
    println!(
        "  {} lines, {} MiB in {:.2} s: {:.2} M lines/s; {} replayed, {} blank or comments, {} malformed",
        thousands(c.lines),
        c.bytes >> 20,
        run.seconds,
        c.lines as f64 / run.seconds.max(1e-9) / 1e6,
        thousands(c.records),
        thousands(c.skipped),
        thousands(run.bad.count)
    );
    for e in &run.bad.examples {
        println!("    {e}");
    }
    if c.late > 0 {
        println!(
            "  {} lines earlier than a line before them in their file (at most {:.3} s): replayed at that line's time",
            thousands(c.late),
            c.max_late_ns as f64 / 1e9
        );
    }
    if let (Some(a), Some(b)) = (run.first, run.last) {
        println!("  from {} to {}", format_iso(a), format_iso(b));
    }
    if let Some(t) = base {
        println!();
        print_tally(names[0], t);
    }
    if let Some((t, d)) = other {
        println!();
        print_tally(names[1], t);
        println!();
        println!(
            "{} against {}: {} requests newly denied, {} newly allowed, {} keys changed",
            names[1],
            names[0],
            thousands(d.newly_denied),
            thousands(d.newly_allowed),
            thousands(d.changed.count())
        );
        for (what, k) in [
            ("newly denied", &d.denied_keys),
            ("newly allowed", &d.allowed_keys),
        ] {
            let top = k.top(TOP);
            if !top.is_empty() {
                println!("  most {what} keys (key (rule)):");
                print_entries(&top);
            }
        }
    }
}

fn print_tally(name: &str, t: &Tally) {
    println!(
        "{name}: {} requests: {} admitted, {} denied ({:.2} %), {} a shadow rule would deny, {} matched no rule",
        thousands(t.requests),
        thousands(t.requests - t.denied),
        thousands(t.denied),
        pct(t.denied, t.requests),
        thousands(t.would_deny),
        thousands(t.unmatched)
    );
    println!(
        "  {:<24} {:<8} {:<16} {:>12} {:>12} {:>10} {:>10} {:>10} {:>8}",
        "rule", "mode", "key", "requests", "admitted", "denied", "shadow", "keys", "limited"
    );
    for r in &t.rules {
        println!(
            "  {:<24} {:<8} {:<16} {:>12} {:>12} {:>10} {:>10} {:>10} {:>7.2}%",
            r.name,
            r.mode.name(),
            r.class.to_string(),
            thousands(r.requests),
            thousands(r.admitted),
            thousands(r.denied),
            thousands(r.would_deny),
            format!(
                "{}{}",
                if r.keys.exact() { "" } else { "~" },
                thousands(r.keys.count())
            ),
            pct(r.limited.count(), r.keys.count()),
        );
    }
    for r in t.rules.iter().filter(|r| r.denied + r.would_deny > 0) {
        let verb = if r.would_deny > 0 {
            "would deny"
        } else {
            "denied"
        };
        println!();
        let by: Vec<String> = r
            .by_limit
            .iter()
            .map(|(l, n)| format!("{} by {}", thousands(*n), spec(r, *l)))
            .collect();
        println!("  {} {verb}: {}", r.name, by.join("; "));
        let top = r.top.top(TOP);
        println!(
            "    most denied keys{}:",
            match r.top.max_error() {
                0 => String::new(),
                e => format!(" (counts at most {} over)", thousands(e)),
            }
        );
        print_entries(&top);
    }
}

fn print_entries(top: &[Entry]) {
    println!("      {:<40} {:>10}  first denied", "key", "denied");
    for e in top {
        let first = if e.error == 0 {
            format_iso(e.first)
        } else {
            format!("{} or before", format_iso(e.first))
        };
        println!("      {:<40} {:>10}  {first}", e.text, thousands(e.count));
    }
}
