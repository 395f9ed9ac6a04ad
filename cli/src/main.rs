//! The `turnstile` command: `bench`, `memory`, `accuracy`, `demo`, `serve`, `soak`, `replay`,
//! `rules check`, `limits check` and `completions`. Every subcommand is one module; the
//! options are clap derives, so `--help` works everywhere and a bad option exits with status 2
//! and a message naming it.

use clap::{CommandFactory, Parser, Subcommand};

// mimalloc: the bench's per-thread allocations and the memory report's large tables; its
// effect on the bench is measured in docs/performance.md. `serve` also gives back the pages of
// large freed blocks (`alloc`). The core crate sets no allocator: an embedder keeps its own.
#[global_allocator]
static GLOBAL: alloc::Alloc = alloc::Alloc;

mod accuracy;
mod alloc;
mod args;
mod bench;
mod demo;
mod limits;
mod memory;
#[cfg(feature = "otel")]
mod otel;
mod progress;
mod replay;
mod rules;
mod soak;

/// The error of every subcommand: a message for the user (what failed, where, how to fix it),
/// printed by `main`. A boxed error, as mini-redis's `crate::Error`, rather than a typed enum:
/// nothing matches on a CLI's errors, it only prints them, and `?` takes the libraries' own
/// errors (the engine's configuration errors, io, serde, Redis) as they are, their messages
/// unchanged.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// `Result` with the CLI's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The errors a `check` subcommand met: each printed to standard error as it comes; any of
/// them makes the exit status 1 once every file has been checked.
#[derive(Default)]
pub struct Failures(usize);

impl Failures {
    /// Prints `e` and counts it.
    pub fn report(&mut self, e: impl std::fmt::Display) {
        eprintln!("{e}");
        self.0 += 1;
    }

    /// Exits with status 1 if any error was reported.
    pub fn exit_if_any(self) {
        if self.0 > 0 {
            std::process::exit(1);
        }
    }
}

/// `turnstile -V`: the version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TURNSTILE_COMMIT"),
    ")"
);

/// `turnstile --version`: also the target, the CPU features the build assumes and what is
/// compiled in.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit:   ",
    env!("TURNSTILE_COMMIT"),
    "\ntarget:   ",
    env!("TURNSTILE_TARGET"),
    "\nfeatures: ",
    env!("TURNSTILE_FEATURES"),
);

/// A lock-free rate-limiting engine: benchmarks, reports and tools.
#[derive(Parser)]
#[command(
    name = "turnstile",
    version = VERSION,
    long_version = LONG_VERSION,
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the decisions of each algorithm on the design notes' scenarios.
    Demo,
    /// Checks/s and latency of the embedded engine, side by side with governor (the main job).
    Bench(Box<bench::BenchArgs>),
    /// Measured bytes per user per algorithm, against the design notes' estimates.
    Memory(memory::MemoryArgs),
    /// The approximate algorithms against the exact sliding log, beside Cloudflare's figures.
    Accuracy(accuracy::AccuracyArgs),
    /// Run the engine as a service: Redis protocol (CL.THROTTLE, TURNSTILE.CHECK), HTTP
    /// (/v1/check, /metrics), and Envoy's rate limit service over gRPC (docs/service.md).
    #[command(
        after_help = "Try it:\n  turnstile serve --rules examples/rules.toml\n  redis-cli -p 6380 CL.THROTTLE user:1 15 30 60\n  redis-cli -p 6380 TURNSTILE.CHECK customer 42\n  curl -s -XPOST localhost:8080/v1/check -d '{\"key_class\":\"customer\",\"key\":\"42\"}'\n  curl -s localhost:8080/metrics\n\nLogs go to standard error (RUST_LOG=debug for more). SIGHUP reloads; SIGTERM or SIGINT\nstops after answering what clients sent and writing the snapshot."
    )]
    Serve(Box<turnstile_server::ServeArgs>),
    /// Abuse soak of a running `turnstile serve` on this machine: 1 000 hostile connections
    /// at once while honest clients measure their latencies; the server's memory against its
    /// bound, and every admission checked against its counts (docs/service.md).
    Soak(soak::SoakArgs),
    /// Replay access logs against a rules file: who would have been limited, by which rule,
    /// how often, when (docs/replay.md).
    Replay(Box<replay::ReplayArgs>),
    /// Rules files: validate them, or import envoyproxy/ratelimit's YAML.
    Rules {
        #[command(subcommand)]
        command: rules::RulesCommand,
    },
    /// Keys' own limits: check the files of a rules file's limits classes, export a class's
    /// entries, or import a file into a class's Redis.
    Limits {
        #[command(subcommand)]
        command: limits::LimitsCommand,
    },
    /// Print a shell completion script (e.g. `turnstile completions bash > /etc/bash_completion.d/turnstile`).
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

fn main() {
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Demo
            | Command::Accuracy(_)
            | Command::Replay(_)
            | Command::Rules { .. }
            | Command::Limits { .. }
    ) {
        end_quietly_on_a_closed_pipe();
    }
    let result = match cli.command {
        Command::Demo => demo::run(),
        Command::Bench(a) => bench::run(*a),
        Command::Memory(a) => memory::run(a),
        Command::Accuracy(a) => accuracy::run(a),
        Command::Serve(a) => {
            no_huge_pages_for_a_service();
            alloc::give_back_freed_pages();
            turnstile_server::trim::set_hook(give_memory_back);
            serve(*a)
        }
        Command::Soak(a) => soak::run(a),
        Command::Replay(a) => replay::run(*a),
        Command::Rules { command } => rules::run(command),
        Command::Limits { command } => limits::run(command),
        Command::Completions { shell } => completions(shell),
    };
    if let Err(e) = result {
        // The same form and status as clap's own usage errors.
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

/// `turnstile serve`, its request spans exported when the `OTEL_*` variables ask for it
/// (feature otel).
fn serve(args: turnstile_server::ServeArgs) -> Result<()> {
    // Kept until the server has stopped: dropped, it exports the last spans.
    #[cfg(feature = "otel")]
    let (layer, _tracing) = match otel::from_env()? {
        Some((layer, what, t)) => (Some((layer, what)), Some(t)),
        None => (None, None),
    };
    #[cfg(not(feature = "otel"))]
    let layer = None;
    turnstile_server::run_traced(args, layer).map_err(Error::from)
}

/// `serve` runs without transparent huge pages, unless `MIMALLOC_ALLOW_THP` says otherwise.
/// mimalloc asks for them (`MADV_HUGEPAGE` on its arena), and the kernel then backs each 2 MiB
/// range a byte of which is touched with a whole huge page: an idle server (2 workers) was
/// 62 MiB resident instead of 16, each CL.THROTTLE store a client makes took 8.4 MiB instead of 1.7
/// at its first key, and what a burst of connections had used stayed resident after they
/// left (about 60 MiB after 200 clients that never read, against 2-7 without); measured by
/// `turnstile soak` (docs/service.md). The stores' checks do not gain from huge pages
/// (docs/performance.md, docs/tower.md). The bench and memory reports keep the allocator's
/// default.
fn no_huge_pages_for_a_service() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: prctl(2) with integer arguments; it sets a flag of this process's memory
        // map (new faults get 4 KiB pages), touching no memory of ours.
        unsafe {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
}

/// What an idle worker of `serve` calls (at most once a second, `turnstile_server::trim`):
/// mimalloc frees what the thread no longer uses and returns its empty pages to the system,
/// so that the memory of a burst of connections goes once they have.
fn give_memory_back() {
    // SAFETY: mi_collect takes no pointer; it works on the calling thread's own heap.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// A command that prints as it goes (`turnstile demo | head -1`) then ends as a Unix filter does
/// when its reader is gone: by SIGPIPE, quietly. (Rust ignores SIGPIPE, and `println!` panics
/// on the failed write.) Not for `serve`, which a closed log pipe must not stop, nor `bench`
/// and `memory`, which write through their own error handling.
fn end_quietly_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: signal(2) with the default action, at the start of main, before any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Writes the completion script; a closed pipe (`| head`) ends it quietly, not with a panic.
fn completions(shell: clap_complete::Shell) -> Result<()> {
    use std::io::Write;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "turnstile", &mut script);
    match std::io::stdout().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write the completion script: {e}").into())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
