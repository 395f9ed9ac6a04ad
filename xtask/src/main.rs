//! `cargo xtask`: the project's own tasks, in Rust, with nothing but the toolchain
//! (`.cargo/config.toml` aliases `cargo xtask` to `cargo run --release -q -p xtask --`).
//!
//! * `cargo xtask test [ARGS...]`: installs what the tests need (`src/deps.rs`, the one table),
//!   then runs `cargo test --release --workspace ARGS...` and exits with its status.
//! * `cargo xtask deps [--dry-run] [--path PATH] [--privilege root|sudo|none] [--pip SPEC]
//!   [--npm SPEC]`: only the check and install; `--path ''` shows what a fresh machine gets.
//!
//! No dependencies: it must build on a fresh machine before anything is installed.

mod deps;
mod install;

use install::{Options, Privilege};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

const USAGE: &str = "\
cargo xtask: the project's own tasks

USAGE:
    cargo xtask test [ARGS...]    install what the tests need, then
                                  cargo test --release --workspace ARGS...
    cargo xtask deps [OPTIONS]    only check and install what the tests need

deps OPTIONS:
    --dry-run                     print the commands instead of running them
    --path PATH                   look for programs on PATH instead of $PATH
                                  (--path '' --dry-run: what a fresh machine gets)
    --privilege root|sudo|none    plan as if running with this privilege
    --pip SPEC, --npm SPEC        one more package (to try the mechanism)

What the tests need is one table: xtask/src/deps.rs.
";

/// The workspace root: xtask's own folder's parent.
fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map_or(here.clone(), |p| p.to_path_buf())
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Some(cmd) = args.first().and_then(|a| a.to_str()) else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let result = match cmd {
        "test" => test(rest),
        "deps" => deps(rest),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!(
            "unknown task `{other}`; expected test or deps (cargo xtask help)"
        )),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Installs what the tests need, then runs them with the variables naming the clients.
fn test(args: &[OsString]) -> Result<ExitCode, String> {
    let root = root();
    let env = install::ensure(&Options::detect(&root))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["test", "--release", "--workspace"])
        .args(args);
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let shown: Vec<String> = args.iter().map(|a| a.to_string_lossy().into()).collect();
    eprintln!(
        "xtask: cargo test --release --workspace {}",
        shown.join(" ")
    );
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run cargo test: {e}"))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

/// `cargo xtask deps`: the check and install alone.
fn deps(args: &[OsString]) -> Result<ExitCode, String> {
    let mut opts = Options::detect(&root());
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value (cargo xtask help)"))
        };
        match a.as_str() {
            "--dry-run" => opts.dry_run = true,
            "--path" => opts.search_path = value("--path")?.into(),
            "--privilege" => opts.privilege = value("--privilege")?.parse::<Privilege>()?,
            "--pip" => opts.extra_pip.push(value("--pip")?),
            "--npm" => opts.extra_npm.push(value("--npm")?),
            other => return Err(format!("deps: unknown option `{other}` (cargo xtask help)")),
        }
    }
    let env = install::ensure(&opts)?;
    for (k, v) in env {
        println!("{k}={}", v.to_string_lossy());
    }
    Ok(ExitCode::SUCCESS)
}
