//! `turnstile replay --rules FILE LOG...`: access logs as they are (nginx/Apache combined,
//! Envoy's default and JSON logs, AWS ALB, CSV and JSON Lines with named fields; plain or
//! gzip), merged in time order, every request checked by the rules engine at its logged time
//! (`Engine::trace_at`, shadow and soft rules included), and a report per rule — requests,
//! admitted, denied, would-be denials, the most denied keys, the share of keys ever limited,
//! denials per minute — as text, JSON or an SVG plot. `--compare OTHER` replays a second
//! rules file in the same pass and reports the requests and keys whose decision changes.
//!
//! The pipeline, one thread: [`input`] reads each file into one buffer (bounded whatever the
//! file's size), a [`format`]'s parser ([`template`], or [`structured`] for CSV and JSON)
//! splits a line into fields without allocating, [`fields`] maps them to a request and checks
//! its parts, [`source`] keeps each file in time order and merges the files, [`tally`] counts
//! per rule in bounded structures ([`topk`], [`distinct`], [`series`]), and [`report`] and
//! [`plot`] show them. `--generate N` writes a synthetic log ([`generate`]) to measure with.

mod compare;
mod distinct;
mod fields;
mod format;
mod generate;
mod input;
mod keys;
mod plot;
mod report;
mod series;
mod source;
mod structured;
mod tally;
mod template;
mod time;
mod topk;

use clap::Args;
use fields::Target;
use format::Format;
use source::{Bad, Counts, Merge, Setup, Source};
use std::path::PathBuf;
use std::time::Instant;
use tally::Tally;
use turnstile::rules::Rules;

/// Replays access logs against a rules file and reports, per rule, who would have been
/// limited, by which limit, how often and when (docs/replay.md).
#[derive(Args)]
#[command(
    after_help = "Try it:\n  turnstile replay --generate 1M --format combined > access.log\n  turnstile replay --rules examples/replay-rules.toml --key customer='$remote_user' --plot replay.svg access.log\n\nFields: --key PART=$FIELD maps a request part (time, ip, customer, api_key, route, method,\npriority, cost) to a field of the format: nginx variables ($remote_addr, $remote_user,\n$http_x_customer_id or $header_x_customer_id, $request_method, $uri), Envoy operators\n(%REQ(X-CUSTOMER-ID)%), or CSV/JSON names."
)]
pub struct ReplayArgs {
    /// The access logs, plain or gzip-compressed (`-`: standard input), merged in time order.
    #[arg(value_name = "LOG")]
    logs: Vec<PathBuf>,
    /// The rules file to replay the logs against (docs/rules.md).
    #[arg(long, value_name = "FILE")]
    rules: Option<PathBuf>,
    /// The logs' format; auto: detected from each file's first line.
    #[arg(long, value_enum, default_value = "auto")]
    format: Format,
    /// The format string that wrote the logs, nginx `log_format` or Envoy syntax (e.g.
    /// '$remote_addr [$time_local] "$request" $status "$http_x_customer_id"').
    #[arg(long, value_name = "TEMPLATE", conflicts_with = "format")]
    log_format: Option<String>,
    /// Maps a request part to a field: PART=$FIELD (repeatable); see below.
    #[arg(long = "key", value_name = "PART=$FIELD", value_parser = parse_key)]
    keys: Vec<(Target, String)>,
    /// A second rules file, replayed in the same pass: which requests and keys change decision.
    #[arg(long, value_name = "OTHER_RULES")]
    compare: Option<PathBuf>,
    /// The report as one JSON document.
    #[arg(long)]
    json: bool,
    /// Draws requests and denials per minute into an SVG file.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Reads and parses only (no rules): the floor a replay's speed is measured against.
    #[arg(long, conflicts_with_all = ["rules", "compare", "plot"])]
    parse_only: bool,
    /// Writes a synthetic log of N lines (a day of API traffic with abusers) to standard
    /// output, in --format (auto: combined), and exits.
    #[arg(long, value_name = "N", value_parser = crate::args::parse_count)]
    generate: Option<u64>,
    /// The seed of --generate.
    #[arg(long, default_value_t = 1, requires = "generate")]
    seed: u64,
    /// The longest line read, bytes; longer ones are counted as malformed and skipped.
    #[arg(long, value_name = "BYTES", default_value_t = 65_536)]
    max_line: usize,
}

fn parse_key(s: &str) -> crate::Result<(Target, String)> {
    let (part, field) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: write PART=$FIELD, e.g. customer=$remote_user"))?;
    let t = Target::ALL
        .into_iter()
        .find(|t| t.name() == part.trim())
        .ok_or_else(|| {
            let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
            format!(
                "`{part}` is not a request part; one of {}",
                names.join(", ")
            )
        })?;
    let field = field.trim();
    let field = if field.starts_with('%') {
        template::envoy_name(field.trim_matches('%'))
    } else {
        field.trim_start_matches('$').to_string()
    };
    if field.is_empty() {
        return Err(format!("`{s}`: no field after `=`").into());
    }
    Ok((t, field))
}

/// Runs the command.
pub fn run(a: ReplayArgs) -> crate::Result<()> {
    if let Some(n) = a.generate {
        return generate::run(n, a.format, a.seed);
    }
    if a.logs.is_empty() {
        return Err("no log files: turnstile replay --rules FILE LOG...".into());
    }
    if a.rules.is_none() && !a.parse_only {
        return Err("--rules FILE is needed (or --parse-only to measure reading alone)".into());
    }
    let load = |p: &PathBuf| Rules::from_file(p).map_err(crate::Error::from);
    let mut base = a
        .rules
        .as_ref()
        .map(load)
        .transpose()?
        .map(Tally::new)
        .transpose()?;
    let mut other = a
        .compare
        .as_ref()
        .map(load)
        .transpose()?
        .map(Tally::new)
        .transpose()?;
    let custom = a
        .log_format
        .as_deref()
        .map(template::Template::compile)
        .transpose()
        .map_err(|e| format!("--log-format: {e}"))?;
    let setup = Setup {
        format: a.format,
        custom,
        given: a.keys.clone(),
        max_line: a.max_line,
    };
    let (mut bad, mut counts) = (Bad::default(), Counts::default());
    let started = Instant::now();
    let mut sources = Vec::new();
    let mut files = Vec::new();
    let mut mapping = Vec::new();
    for p in &a.logs {
        let s = Source::open(p, &setup, &mut bad, &mut counts)?;
        let fmt = s.as_ref().map_or("empty".to_string(), |s| {
            let f = match (&setup.custom, s.format) {
                (Some(_), _) => "--log-format",
                (None, f) => f.name(),
            };
            if s.gzip() {
                format!("{f}, gzip")
            } else {
                f.to_string()
            }
        });
        files.push((p.display().to_string(), fmt));
        if let Some(s) = s {
            if mapping.is_empty() {
                mapping = s.mapping().to_vec();
            }
            sources.push(s);
        }
    }
    let mut merge = Merge::new(sources);
    let mut diff = compare::Diff::default();
    let (mut first, mut last) = (None, None);
    while let Some(i) = merge.peek() {
        let s = &merge.sources[i];
        let now = s.time();
        first.get_or_insert(now);
        last = Some(now);
        let v = s.view();
        match (&mut base, &mut other) {
            (Some(b), None) => {
                b.check(&v, now);
            }
            (Some(b), Some(o)) => {
                let x = b.check(&v, now);
                let y = o.check(&v, now);
                diff.add(&v, now, x, b, y, o);
            }
            _ => {
                std::hint::black_box(&v);
            }
        }
        merge.advance(i, &mut bad, &mut counts)?;
    }
    let run = report::Run {
        files,
        mapping,
        counts,
        bad,
        seconds: started.elapsed().as_secs_f64(),
        first,
        last,
    };
    if let (Some(p), Some(b)) = (&a.plot, &base) {
        let title = a
            .rules
            .as_ref()
            .map_or(String::new(), |r| r.display().to_string());
        plot::draw(p, b, &title)
            .map_err(|e| format!("cannot write the plot to {}: {e}", p.display()))?;
    }
    let names = [
        a.rules
            .as_ref()
            .map_or(String::new(), |r| r.display().to_string()),
        a.compare
            .as_ref()
            .map_or(String::new(), |r| r.display().to_string()),
    ];
    let other = other.as_ref().map(|o| (o, &diff));
    if a.json {
        let doc = report::document(&run, base.as_ref(), other);
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        report::print(&run, base.as_ref(), other, [&names[0], &names[1]]);
        if let Some(p) = &a.plot {
            println!("\nplot: {}", p.display());
        }
    }
    Ok(())
}
