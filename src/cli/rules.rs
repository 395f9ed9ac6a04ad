//! `turnstile rules` (not yet implemented).

use super::args::Args;

/// Runs the subcommand.
pub fn run(_args: Args) -> Result<(), String> {
    Err("`rules` is not implemented yet".into())
}
