//! `turnstile bench` (not yet implemented).

use super::args::Args;

/// Runs the subcommand.
pub fn run(_args: Args) -> Result<(), String> {
    Err("`bench` is not implemented yet".into())
}
