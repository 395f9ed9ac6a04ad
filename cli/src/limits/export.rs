//! `turnstile limits export RULES [--class NAME] [--format csv|jsonl]`: a limits class's
//! entries, loaded as the engine loads them, written in the file format `limits check` and the
//! engine read (CSV `key,entry` or JSON Lines), sorted by key: export, then load, gives the
//! same entries.
//!
//! An entry is kept by its key's id, which is the key itself only for some key classes: a
//! customer id (its decimal) and an IPv4 address (grouped by the class's prefix; printed as
//! the group's first address, which reads back as the same group). API keys, routes and IPv6
//! addresses are kept as hashes that cannot be turned back into keys: a class of those is
//! refused, and an IPv6 entry of an `ip` class is counted and reported, not invented.

use clap::{Args, ValueEnum};
use std::io::Write;
use turnstile::keyed::KeyHasher;
use turnstile::rules::limits::{KeyLimit, LimitsClass, LimitsSource, MemoryLimits};
use turnstile::rules::{KeyPart, Rules};

/// How `limits export` writes entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `key,entry` lines: a plan's name or a limit (`5/1s burst=10`), after a `key,entry`
    /// header.
    Csv,
    /// One JSON object a line: `{"key":"42","plan":"pro"}` or `{"key":"7","limit":5,
    /// "window":"1s","burst":10}`.
    Jsonl,
}

/// `turnstile limits export`.
#[derive(Args)]
pub struct ExportArgs {
    /// The rules file.
    #[arg(value_name = "RULES")]
    pub rules: String,
    /// The class to export (needed when the rules have more than one).
    #[arg(long, value_name = "NAME")]
    pub class: Option<String>,
    /// The format written to standard output.
    #[arg(long, value_enum, default_value = "csv")]
    pub format: Format,
}

/// Runs `limits export`.
pub fn run(a: ExportArgs) -> crate::Result<()> {
    let rules = Rules::from_file(&a.rules).map_err(|e| e.to_string())?;
    let class = super::pick_class(&rules, &a.rules, a.class.as_deref())?;
    let key = key_text(class)?;
    // A class in Redis is read from there (every bucket, pipelined); any other from its file.
    let src: Box<dyn LimitsSource> = match &class.redis {
        Some(url) => Box::new(
            turnstile_redis::RedisLimits::builder(class)
                .connect(url)
                .map_err(|e| format!("class `{}`: {e}", class.name))?,
        ),
        None => {
            Box::new(MemoryLimits::new(class, KeyHasher::random(64)).map_err(|e| e.to_string())?)
        }
    };
    let mut entries = Vec::with_capacity(src.len() as usize);
    let mut hashed = 0u64;
    src.export(&mut |id, e| match key(id) {
        Some(k) => entries.push((id, k, line(a.format, class, e))),
        None => hashed += 1,
    });
    entries.sort_unstable_by_key(|(id, ..)| *id);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut write = || -> std::io::Result<()> {
        if a.format == Format::Csv {
            writeln!(out, "key,entry")?;
        }
        for (_, k, rest) in &entries {
            match a.format {
                Format::Csv => writeln!(out, "{k},{rest}")?,
                Format::Jsonl => writeln!(out, "{{\"key\":{}{rest}}}", serde_json::json!(k))?,
            }
        }
        out.flush()
    };
    write().map_err(|e| format!("writing the entries: {e}"))?;
    if hashed > 0 {
        return Err(format!(
            "class `{}`: {hashed} IPv6 entries not exported (an IPv6 address is kept as a hash, \
             which cannot be turned back into the address); the {} IPv4 entries were",
            class.name,
            entries.len()
        )
        .into());
    }
    Ok(())
}

/// How a key id of `class` reads back as its key's text (`None`: a hash), or why the class
/// cannot be exported.
fn key_text(class: &LimitsClass) -> crate::Result<fn(u64) -> Option<String>> {
    let part = class.key.parts().next();
    match part {
        Some(KeyPart::Customer) => Ok(|id| Some(id.to_string())),
        Some(KeyPart::Ip) => Ok(|id| {
            u32::try_from(id)
                .ok()
                .map(|v4| std::net::Ipv4Addr::from(v4).to_string())
        }),
        _ => Err(format!(
            "class `{}` is keyed by {}, which the engine keeps as hashes: its keys cannot be \
             read back, so its entries cannot be exported (keep the file they were loaded from)",
            class.name,
            part.map_or("nothing", |p| p.name())
        )
        .into()),
    }
}

/// An entry's text after its key: CSV's value, or the JSON object's other fields (each
/// preceded by a comma).
fn line(format: Format, class: &LimitsClass, e: &KeyLimit) -> String {
    match (format, e) {
        (Format::Csv, e) => e.to_string(),
        (Format::Jsonl, KeyLimit::Plan(p)) => format!(",\"plan\":{}", serde_json::json!(p)),
        (Format::Jsonl, KeyLimit::Limit(s)) => {
            let mut t = format!(",\"limit\":{}", s.limit);
            if class.window.is_none() {
                // A bucket's own period; a window class's limits all count in its window.
                let text = KeyLimit::Limit(s.clone()).to_string();
                let window = text.split(['/', ' ']).nth(1).unwrap_or("");
                t.push_str(&format!(",\"window\":{}", serde_json::json!(window)));
            }
            if let Some(b) = s.burst {
                t.push_str(&format!(",\"burst\":{b}"));
            }
            if let Some(d) = s.delay {
                t.push_str(&format!(",\"delay\":{d}"));
            }
            if s.count_denied {
                t.push_str(",\"count_denied\":true");
            }
            t
        }
    }
}
