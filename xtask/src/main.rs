//! `cargo xtask`: the project's own tasks, in Rust, with nothing but the toolchain
//! (`.cargo/config.toml` aliases `cargo xtask` to `cargo run --release -q -p xtask --`).
//!
//! * `cargo xtask test [ARGS...]`: installs what the tests need (`src/deps.rs`, the one table),
//!   then runs `cargo test --release --workspace ARGS...` with `PATH` limited to what that
//!   table declares (`src/hermetic.rs`), and exits with its status; also 1 when the tests
//!   started a program the table does not declare.
//! * `cargo xtask fresh [--keep] [--only test|bench]`: the README's two commands in a fresh
//!   clone of the repository with an empty target directory (`src/fresh.rs`).
//! * `cargo xtask hermetic CMD [ARGS...]`: runs one command with the tests' `PATH`.
//! * `cargo xtask deps [--dry-run] [--path PATH] [--privilege root|sudo|none] [--pip SPEC]
//!   [--npm SPEC]`: only the check and install; `--path ''` shows what a fresh machine gets.
//! * `cargo xtask docs [--list] [--only TEXT] [--verbose]`: the docs test — runs the shell
//!   commands of README.md and docs/*.md (the fence convention: `src/docs.rs`).
//! * `cargo xtask cycles [--crate NAME]...`: fails on an import cycle between sibling modules
//!   (`src/cycles.rs`).
//! * `cargo xtask size [--crate NAME]...`: fails on a product function over 80 lines, or on
//!   files over 600 lines past the few allowed with their reason (`src/size.rs`).
//!
//! No dependencies: it must build on a fresh machine before anything is installed.

mod cycles;
mod deps;
mod docs;
mod fresh;
mod hermetic;
mod install;
mod modtree;
mod scan;
mod size;

use install::{Options, Privilege};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

const USAGE: &str = "\
cargo xtask: the project's own tasks

USAGE:
    cargo xtask test [ARGS...]    install what the tests need, then cargo test --release
                                  --workspace ARGS... with PATH limited to the programs
                                  xtask/src/deps.rs declares
    cargo xtask fresh [OPTIONS]   the README's two commands in a fresh clone with an empty
                                  target directory, as on a fresh machine
    cargo xtask hermetic CMD...   run CMD with the tests' PATH (what deps.rs declares)
    cargo xtask deps [OPTIONS]    only check and install what the tests need
    cargo xtask docs [OPTIONS]    the docs test: run the sh fences of README.md and docs/*.md
    cargo xtask cycles [--crate NAME]...
                                  fail on an import cycle between sibling modules, listing
                                  each with its files and the imports that close it
    cargo xtask size [--crate NAME]...
                                  fail on a product function over 80 lines or a file over
                                  600 lines without its reason (at most 2 such files)

deps OPTIONS:
    --dry-run                     print the commands instead of running them
    --path PATH                   look for programs on PATH instead of $PATH
                                  (--path '' --dry-run: what a fresh machine gets)
    --privilege root|sudo|none    plan as if running with this privilege
    --pip SPEC, --npm SPEC        one more package (to try the mechanism)

fresh OPTIONS:
    --keep                        keep the clone and its target directory (printed)
    --only test|bench             run only the README's test or bench command

docs OPTIONS:
    --list                        list the fences and what would be done with each
    --only TEXT                   only the fences whose FILE:LINE contains TEXT
    --verbose                     print every fence's output

What the tests need is one table: xtask/src/deps.rs. The fence convention: xtask/src/docs.rs
(and docs/verification.md).
";

/// The workspace root: xtask's own folder's parent.
fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map_or(here.clone(), |p| p.to_path_buf())
}

/// Removes what `cargo run` set for this process alone (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`,
/// ...), so that the cargo commands it starts, and the docs' shells, see the environment a
/// user's shell has. A build script that tracks one of them (ring's tracks
/// `CARGO_MANIFEST_DIR`) would otherwise be rebuilt, with everything above it, by every cargo
/// command after this one that runs from a shell: minutes each time.
fn forget_cargo_run_env() {
    let own = |k: &str| {
        matches!(
            k,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
        ) || k.starts_with("CARGO_PKG_")
    };
    let keys: Vec<OsString> = std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| k.to_str().is_some_and(own))
        .collect();
    for k in keys {
        // Single-threaded: nothing has been started yet.
        std::env::remove_var(k);
    }
}

fn main() -> ExitCode {
    forget_cargo_run_env();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Some(cmd) = args.first().and_then(|a| a.to_str()) else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let result = match cmd {
        "test" => test(rest),
        "deps" => deps(rest),
        "docs" => docs_test(rest),
        "fresh" => fresh::run(&root(), rest),
        "hermetic" => hermetic_run(rest),
        "cycles" => structure(rest, Structure::Cycles),
        "size" => structure(rest, Structure::Size),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!(
            "unknown task `{other}`; expected test, deps, docs, fresh, hermetic, cycles or size (cargo xtask help)"
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

/// `cargo xtask test`'s command: every crate's tests (turnstile-tower's `RedisLimit`, behind
/// its `redis` feature, among them: the CLI turns that feature on).
const TEST_ARGS: [&str; 3] = ["test", "--release", "--workspace"];

/// The hermetic `PATH` of `opts.scope`, for the packages `opts` installs.
fn hermetic_path(opts: &Options) -> Result<hermetic::Hermetic, String> {
    let declared = hermetic::declared(opts.scope, opts.uses_python(), opts.uses_node());
    let toolchain = hermetic::toolchain_dir();
    let h = hermetic::prepare(
        &opts.target_dir,
        &opts.search_path,
        toolchain.as_deref(),
        opts.scope,
        &declared,
    )?;
    if !h.absent.is_empty() {
        eprintln!(
            "xtask: declared but not on this machine (a test that starts one fails): {}",
            h.absent.join(", ")
        );
    }
    Ok(h)
}

/// Runs `cmd` with the hermetic `PATH`; its exit code, or 1 if it started an undeclared
/// program.
fn run_hermetic(mut cmd: Command, h: &hermetic::Hermetic, what: &str) -> Result<ExitCode, String> {
    let status = cmd
        .env("PATH", h.path_var())
        .status()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let verdict = h.verdict();
    if let Err(e) = &verdict {
        eprintln!("xtask: {e}");
    }
    Ok(match status.code() {
        Some(0) if verdict.is_ok() => ExitCode::SUCCESS,
        Some(0) => ExitCode::FAILURE,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

/// The toolchain's cargo: `$CARGO` when cargo started this process, else `cargo` on `PATH`.
fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Installs what the tests need, then runs them with the hermetic `PATH` and the variables
/// naming the clients.
fn test(args: &[OsString]) -> Result<ExitCode, String> {
    let root = root();
    let opts = Options::detect(&root);
    let env = install::ensure(&opts)?;
    let h = hermetic_path(&opts)?;
    let mut cmd = Command::new(cargo());
    // `-p` names the packages: `--workspace` would run every one anyway.
    let packages = args
        .iter()
        .any(|a| a == "-p" || a == "--package" || a.to_string_lossy().starts_with("--package="));
    let base = if packages {
        &TEST_ARGS[..2]
    } else {
        &TEST_ARGS[..]
    };
    cmd.current_dir(&root).args(base).args(args);
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let shown: Vec<String> = args.iter().map(|a| a.to_string_lossy().into()).collect();
    eprintln!(
        "xtask: cargo {} {} (PATH={})",
        base.join(" "),
        shown.join(" "),
        h.bin.display()
    );
    run_hermetic(cmd, &h, "cargo test")
}

/// `cargo xtask hermetic CMD [ARGS...]`: one command with the tests' `PATH` (installing
/// what the tests need first).
fn hermetic_run(args: &[OsString]) -> Result<ExitCode, String> {
    let Some((program, rest)) = args.split_first() else {
        return Err("hermetic: which command? cargo xtask hermetic CMD [ARGS...]".into());
    };
    let root = root();
    let opts = Options::detect(&root);
    let env = install::ensure(&opts)?;
    let h = hermetic_path(&opts)?;
    // The command itself is looked up on the hermetic PATH too.
    let found = install::find_program(&h.path_var(), &program.to_string_lossy())
        .map(PathBuf::into_os_string)
        .unwrap_or_else(|| program.clone());
    let mut cmd = Command::new(found);
    cmd.args(rest);
    for (k, v) in &env {
        cmd.env(k, v);
    }
    run_hermetic(cmd, &h, &program.to_string_lossy())
}

/// The two checks of the code's shape.
enum Structure {
    Cycles,
    Size,
}

/// `cargo xtask cycles` and `cargo xtask size`, over the whole workspace or the crates named
/// with `--crate`.
fn structure(args: &[OsString], what: Structure) -> Result<ExitCode, String> {
    let mut only = Vec::new();
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        match a.as_str() {
            "--crate" => only.push(it.next().ok_or("--crate needs a package name")?),
            other => return Err(format!("unknown option `{other}` (cargo xtask help)")),
        }
    }
    let root = root();
    let crates = modtree::workspace(&root)?;
    for name in &only {
        if !crates.iter().any(|c| &c.name == name) {
            return Err(format!(
                "no crate `{name}` in the workspace (its package name, e.g. turnstile-cli)"
            ));
        }
    }
    let chosen: Vec<&modtree::Crate> = crates
        .iter()
        .filter(|c| only.is_empty() || only.contains(&c.name))
        .collect();
    let failed = match what {
        Structure::Cycles => {
            let (text, n) = cycles::report(&root, &chosen);
            print!("{text}");
            n > 0
        }
        Structure::Size => {
            let (text, problems) = size::report(&root, &chosen);
            print!("{text}");
            for p in &problems {
                eprintln!("xtask: {p}");
            }
            !problems.is_empty()
        }
    };
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
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

/// Every fence of README.md and docs/*.md with what to do with it.
fn all_fences(root: &std::path::Path) -> Result<Vec<(docs::Fence, docs::Kind)>, String> {
    let mut all = Vec::new();
    for file in docs::doc_files(root)? {
        let rel = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {rel}: {e}"))?;
        for f in docs::fences(&rel, &text)? {
            let kind = f.kind()?;
            all.push((f, kind));
        }
    }
    Ok(all)
}

/// Runs the fences to run, one at a time, saying how each went: (run, failures, not run).
fn run_fences(
    root: &std::path::Path,
    selected: &[&(docs::Fence, docs::Kind)],
    path: &str,
    verbose: bool,
) -> (usize, Vec<String>, usize) {
    let (mut ran, mut failed, mut skipped) = (0, Vec::new(), 0);
    for (f, k) in selected.iter().map(|x| (&x.0, &x.1)) {
        let where_ = format!("{}:{}", f.file, f.line);
        match k {
            docs::Kind::Other => {}
            docs::Kind::NoRun(reason) => {
                skipped += 1;
                eprintln!("skip {where_}: {reason}");
            }
            docs::Kind::Run(timeout) => {
                ran += 1;
                let o = docs::run_fence(root, f, *timeout, path);
                for n in &o.notes {
                    eprintln!("     {where_}: {n}");
                }
                match &o.failure {
                    None => eprintln!("ok   {where_} ({:.1} s)", o.took.as_secs_f64()),
                    Some(why) => {
                        eprintln!("FAIL {where_} ({:.1} s): {why}", o.took.as_secs_f64());
                        failed.push(format!("{where_}: {why}"));
                    }
                }
                if verbose || o.failure.is_some() {
                    eprintln!("---- output of {where_}\n{}\n----", o.log.trim_end());
                }
            }
        }
    }
    (ran, failed, skipped)
}

/// `cargo xtask docs`: the docs test.
fn docs_test(args: &[OsString]) -> Result<ExitCode, String> {
    let (mut list, mut verbose, mut only) = (false, false, None::<String>);
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        match a.as_str() {
            "--list" => list = true,
            "--verbose" => verbose = true,
            "--only" => {
                only = Some(
                    it.next()
                        .ok_or("--only needs a value: a file name or FILE:LINE")?,
                )
            }
            other => return Err(format!("docs: unknown option `{other}` (cargo xtask help)")),
        }
    }
    let root = root();
    // Every fence first: a malformed one fails before anything runs.
    let all = all_fences(&root)?;
    let issue_refs = docs::issue_references(&root)?;
    let selected: Vec<&(docs::Fence, docs::Kind)> = all
        .iter()
        .filter(|(f, _)| {
            only.as_deref()
                .is_none_or(|o| format!("{}:{}", f.file, f.line).contains(o))
        })
        .collect();
    if list {
        for (f, k) in &selected {
            let what = match k {
                docs::Kind::Run(t) => format!("run (within {} s)", t.as_secs()),
                docs::Kind::NoRun(r) => format!("not run: {r}"),
                docs::Kind::Other => continue,
            };
            println!("{}:{}  {what}", f.file, f.line);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut opts = Options::detect(&root);
    opts.scope = deps::Scope::Docs;
    install::ensure(&opts)?;
    let h = hermetic_path(&opts)?;
    eprintln!("xtask: cargo build --release (the turnstile binary the docs run)");
    let built = Command::new(cargo())
        .current_dir(&root)
        .args(["build", "--release", "--quiet"])
        .status()
        .map_err(|e| format!("cannot run cargo build: {e}"))?;
    if !built.success() {
        return Err("cargo build --release failed".into());
    }
    let release = opts.target_dir.join("release");
    docs::check_serve_defaults(&release.join("turnstile"))?;
    // The release binaries first, then only what xtask/src/deps.rs declares.
    let path = format!("{}:{}", release.display(), h.bin.display());
    let t0 = std::time::Instant::now();
    let (ran, mut failed, skipped) = run_fences(&root, &selected, &path, verbose);
    if let Err(e) = h.verdict() {
        failed.push(e);
    }
    if !issue_refs.is_empty() {
        failed.push(format!(
            "issue numbers in the manual (a reader cannot see them; history goes to CHANGELOG.md):\n  {}",
            issue_refs.join("\n  ")
        ));
    }
    eprintln!(
        "docs: {ran} fences run, {} failed, {skipped} not run (their reasons above), in {:.0} s",
        failed.len(),
        t0.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(format!("the docs test failed:\n{}", failed.join("\n")))
    }
}
