//! `turnstile rules check FILE...`: validates rules files.
//! `turnstile rules import-envoy PATH`: envoyproxy/ratelimit's YAML as a turnstile rules file.
//!
//! Exit 0 with a one-line summary per file, or exit 1 with `file:line:column: message` on
//! standard error (the form editors and CI annotate), one line per bad file.

use clap::Subcommand;
use turnstile::rules::{Backend, Rules};

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
    /// Print the turnstile rules file equivalent to an envoyproxy/ratelimit configuration
    /// (a YAML file or a directory of them; with MERGE_DOMAIN_CONFIG=true the files of one
    /// domain are merged; docs/envoy.md). A configuration error prints
    /// `file:line:column: message` and exits with status 1.
    ImportEnvoy {
        /// The YAML file or directory.
        #[arg(value_name = "PATH")]
        path: std::path::PathBuf,
    },
}

/// Runs the subcommand.
pub fn run(cmd: RulesCommand) -> crate::Result<()> {
    let files = match cmd {
        RulesCommand::Check { files } => files,
        RulesCommand::ImportEnvoy { path } => return import_envoy(&path),
    };
    let mut failures = crate::Failures::default();
    for f in &files {
        // With a Redis backend, also what Redis's scripts can run (Redis is not contacted).
        let checked = Rules::from_file(f).and_then(|r| {
            if let Backend::Redis(_) = r.backend {
                turnstile_redis::RedisRules::check(&r)?;
            }
            Ok(r)
        });
        match checked {
            Ok(r) => println!("{f}: ok: {}", r.summary()),
            Err(e) => failures.report(e),
        }
    }
    failures.exit_if_any();
    Ok(())
}

fn import_envoy(path: &std::path::Path) -> crate::Result<()> {
    use std::io::Write;
    // MERGE_DOMAIN_CONFIG=true merges the files of one domain, as `turnstile serve` does.
    let opts = turnstile_server::envoy::Settings::from_env()?.load_options();
    match turnstile_server::envoy::load_with(path, opts) {
        Ok(cfg) => {
            let out = turnstile_server::envoy::import_to_rules(&cfg);
            // A closed pipe (`| head`) ends it quietly.
            let _ = std::io::stdout().write_all(out.as_bytes());
            Ok(())
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
