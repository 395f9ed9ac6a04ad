//! `turnstile limits check RULES...`: loads each limits class's file of a rules file as the
//! engine would (docs/rules.md, "Keys' own limits"), and reports its entries, its load time and
//! its memory, or the first bad line as `file:line: message` (exit status 1).
//! `turnstile limits export RULES` writes a class's entries back in that format (`export`);
//! `turnstile limits import RULES FILE` puts a file's entries into a class's Redis
//! (`import`).

mod export;
mod import;

use clap::Subcommand;
use std::time::Instant;
use turnstile::keyed::KeyHasher;
use turnstile::rules::limits::{LimitsSource, MemoryLimits};
use turnstile::rules::Rules;

/// `turnstile limits ...`.
#[derive(Subcommand)]
pub enum LimitsCommand {
    /// Load the files of the limits classes of rules files: every line checked against its
    /// class (its key, algorithm, window and plans). Prints one line per class; for a bad
    /// file prints `file:line: what is wrong` and exits with status 1.
    Check {
        /// The rules files.
        #[arg(required = true, value_name = "RULES")]
        files: Vec<String>,
    },
    /// Write a limits class's entries (loaded from its file as the engine loads them, or read
    /// from its Redis) to
    /// standard output in the file format `limits check` reads, sorted by key. Customer and
    /// IPv4 keys only: API keys, routes and IPv6 addresses are kept as hashes, not keys.
    Export(export::ExportArgs),
    /// Put a file's entries into the Redis of a class whose entries live there
    /// (`redis = "redis://..."`): every line checked as `check` does, then written pipelined
    /// with a progress bar; prints entries per second. Entries not in the file stay.
    Import(import::ImportArgs),
}

/// Runs the subcommand.
pub fn run(cmd: LimitsCommand) -> crate::Result<()> {
    let files = match cmd {
        LimitsCommand::Check { files } => files,
        LimitsCommand::Export(a) => return export::run(a),
        LimitsCommand::Import(a) => return import::run(a),
    };
    let mut failures = crate::Failures::default();
    for f in &files {
        let rules = match Rules::from_file(f) {
            Ok(r) => r,
            Err(e) => {
                failures.report(e);
                continue;
            }
        };
        if rules.classes.is_empty() {
            println!("{f}: no limits class");
        }
        for class in &rules.classes {
            let t0 = Instant::now();
            match MemoryLimits::new(class, KeyHasher::random(64)) {
                Ok(src) => {
                    let n = src.len();
                    let from = class
                        .file
                        .as_ref()
                        .map_or("no file".to_string(), |p| p.display().to_string());
                    let room = class.capacity.max(n);
                    println!(
                        "{f}: class {}: {from}: ok: {n} entries in {:.2} s; {} plans; room for \
                         {room} keys in {:.1} MiB ({:.1} bytes per key of room)",
                        class.name,
                        t0.elapsed().as_secs_f64(),
                        class.plans.len(),
                        src.bytes() as f64 / (1024.0 * 1024.0),
                        src.bytes() as f64 / room as f64
                    );
                }
                Err(e) => failures.report(e),
            }
        }
    }
    failures.exit_if_any();
    Ok(())
}

/// The class `name` of the rules file `path`, or its only class: what `limits export` and
/// `limits import` act on.
fn pick_class<'a>(
    rules: &'a Rules,
    path: &dyn std::fmt::Display,
    name: Option<&str>,
) -> crate::Result<&'a turnstile::rules::limits::LimitsClass> {
    let names = || {
        rules
            .classes
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (name, rules.classes.as_slice()) {
        (_, []) => Err(format!("{path}: no limits class").into()),
        (None, [one]) => Ok(one),
        (None, _) => Err(format!(
            "{path}: more than one limits class ({}): choose one with --class NAME",
            names()
        )
        .into()),
        (Some(n), all) => all.iter().find(|c| c.name == n).ok_or_else(|| {
            format!("{path}: no limits class `{n}`; the classes: {}", names()).into()
        }),
    }
}
