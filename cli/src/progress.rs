//! Progress of the long runs on standard error: an indicatif bar, drawn only when standard
//! error is a terminal and the output is not `--json` (so logs and pipes get no escape codes).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A bar of `len` steps, hidden when stderr is not a terminal or `json` is set.
pub fn bar(len: u64, json: bool, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), target(json));
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {percent:>3}% {elapsed_precise} (eta {eta})",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Whether progress is drawn.
pub fn visible(json: bool) -> bool {
    !json && std::io::stderr().is_terminal()
}

fn target(json: bool) -> ProgressDrawTarget {
    if visible(json) {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}
