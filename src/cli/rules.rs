//! `turnstile rules check FILE...`: validates rules files.
//!
//! Exit 0 with a one-line summary per file, or exit 1 with `file:line:column: message` on
//! standard error (the form editors and CI annotate), one line per bad file.

use super::args::Args;
use turnstile::rules::Rules;

const HELP: &str = "\
usage: turnstile rules check FILE...

Validates rules files (docs/rules.md): TOML syntax, every field, every limit as the engine
would build it. Prints one summary line per good file; for a bad one prints
`file:line:column: what is wrong and how to fix it` and exits with status 1.";

/// Runs the subcommand.
pub fn run(mut args: Args) -> Result<(), String> {
    if args.help() {
        println!("{HELP}");
        return Ok(());
    }
    match args.positional().as_deref() {
        Some("check") => {}
        Some(other) => return Err(format!("unknown `rules` subcommand `{other}`\n\n{HELP}")),
        None => return Err(format!("`rules` needs a subcommand\n\n{HELP}")),
    }
    let mut files = Vec::new();
    while let Some(f) = args.positional() {
        files.push(f);
    }
    args.finish()?;
    if files.is_empty() {
        return Err(format!("`rules check` needs a FILE\n\n{HELP}"));
    }
    let mut bad = 0;
    for f in &files {
        match Rules::from_file(f) {
            Ok(r) => println!("{f}: ok: {}", r.summary()),
            Err(e) => {
                eprintln!("{e}");
                bad += 1;
            }
        }
    }
    if bad > 0 {
        std::process::exit(1);
    }
    Ok(())
}
