//! `turnstile serve` as a standalone program, with the same flags ([`ServeArgs`]): for the
//! benchmark script while the `turnstile` binary gains its `serve` subcommand.

use clap::Parser;
use turnstile_server::ServeArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

fn main() {
    if let Err(e) = turnstile_server::run(Cli::parse().serve) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
