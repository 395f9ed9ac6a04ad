//! `turnstile memory` (not yet implemented).

use super::args::Args;

/// Runs the subcommand.
pub fn run(_args: Args) -> Result<(), String> {
    Err("`memory` is not implemented yet".into())
}
