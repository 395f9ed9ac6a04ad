//! `turnstile rules check FILE...`: validates rules files.
//!
//! Exit 0 with a one-line summary per file, or exit 1 with `file:line:column: message` on
//! standard error (the form editors and CI annotate), one line per bad file.

use clap::Subcommand;
use turnstile::rules::Rules;

/// `turnstile rules ...`.
#[derive(Subcommand)]
pub enum RulesCommand {
    /// Validate rules files (docs/rules.md): TOML syntax, every field, every limit as the
    /// engine would build it. Prints one summary line per good file; for a bad one prints
    /// `file:line:column: what is wrong and how to fix it` and exits with status 1.
    Check {
        /// The rules files.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
    },
}

/// Runs the subcommand.
pub fn run(cmd: RulesCommand) -> Result<(), String> {
    let RulesCommand::Check { files } = cmd;
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
