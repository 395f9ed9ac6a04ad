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
mod reorder;
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
    /// Puts each file's lines back in time order within this window (e.g. 30s), for logs
    /// written when responses end (ALB, Envoy); default: file order, a late line replayed at
    /// the time of the line before it.
    #[arg(long, value_name = "DURATION", value_parser = parse_window)]
    reorder: Option<u64>,
    /// The longest line read, bytes; longer ones are counted as malformed and skipped.
    #[arg(long, value_name = "BYTES", default_value_t = 65_536)]
    max_line: usize,
}

fn parse_window(s: &str) -> crate::Result<u64> {
    let d = turnstile::rules::parse_duration(s).map_err(|e| format!("`{s}`: {e}"))?;
    Ok(turnstile::clock::nanos(d))
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
    let tally = |p: Option<&PathBuf>| -> crate::Result<Option<Tally>> {
        p.map(|p| Tally::new(Rules::from_file(p)?)).transpose()
    };
    let mut base = tally(a.rules.as_ref())?;
    let mut other = tally(a.compare.as_ref())?;
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
        reorder: a.reorder.unwrap_or(0),
    };
    let started = Instant::now();
    let (mut run, sources) = open(&a.logs, &setup)?;
    let mut diff = compare::Diff::default();
    replay(&mut run, sources, base.as_mut(), other.as_mut(), &mut diff)?;
    run.seconds = started.elapsed().as_secs_f64();
    let name = |p: &Option<PathBuf>| {
        p.as_ref()
            .map_or(String::new(), |r| r.display().to_string())
    };
    let names = [name(&a.rules), name(&a.compare)];
    if let (Some(p), Some(b)) = (&a.plot, &base) {
        plot::draw(p, b, &names[0])
            .map_err(|e| format!("cannot write the plot to {}: {e}", p.display()))?;
    }
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

/// Opens every log (its first record read): the run's figures so far and the files that
/// have records.
fn open(logs: &[PathBuf], setup: &Setup) -> crate::Result<(report::Run, Vec<Source>)> {
    let mut run = report::Run {
        files: Vec::new(),
        mapping: Vec::new(),
        counts: Counts::default(),
        bad: Bad::default(),
        seconds: 0.0,
        first: None,
        last: None,
    };
    let mut sources = Vec::new();
    for p in logs {
        let s = Source::open(p, setup, &mut run.bad, &mut run.counts)?;
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
        run.files.push((p.display().to_string(), fmt));
        if let Some(s) = s {
            if run.mapping.is_empty() {
                run.mapping = s.mapping().to_vec();
            }
            sources.push(s);
        }
    }
    Ok((run, sources))
}

/// The merged records, each checked by the base rules and the other rules (if any; neither
/// with `--parse-only`), their changes counted in `diff`.
fn replay(
    run: &mut report::Run,
    sources: Vec<Source>,
    mut base: Option<&mut Tally>,
    mut other: Option<&mut Tally>,
    diff: &mut compare::Diff,
) -> crate::Result<()> {
    let mut merge = Merge::new(sources);
    while let Some(i) = merge.peek() {
        let s = &merge.sources[i];
        let now = s.time();
        run.first.get_or_insert(now);
        run.last = Some(now);
        let v = s.view();
        match (base.as_deref_mut(), other.as_deref_mut()) {
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
        merge.advance(i, &mut run.bad, &mut run.counts)?;
    }
    Ok(())
}
