//! Command-line front end. Each subcommand is one file.

pub mod accuracy;
pub mod args;
pub mod bench;
pub mod demo;
pub mod memory;
pub mod rules;

use args::Args;

const USAGE: &str = "\
usage: turnstile <command> [options]

commands:
  demo                      print the decisions for the design notes' scenarios
  bench [options]           benchmark checks/s, side by side with governor (the main job)
  memory [--users N] [--json]
                            measure bytes per user per algorithm against the notes' estimates
  accuracy [--requests N] [--sources S] [--seed X] [--json]
                            approximate algorithms against the exact sliding log
  rules check FILE          validate a rules file
  help                      this text

`turnstile <command> --help` describes a command's options.";

/// Runs the command line.
pub fn run(argv: Vec<String>) -> Result<(), String> {
    let mut it = argv.into_iter();
    let Some(cmd) = it.next() else {
        return Err(format!("no command given\n\n{USAGE}"));
    };
    let args = Args::new(it.collect());
    match cmd.as_str() {
        "demo" => demo::run(args),
        "bench" => bench::run(args),
        "memory" => memory::run(args),
        "accuracy" => accuracy::run(args),
        "rules" => rules::run(args),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    }
}
