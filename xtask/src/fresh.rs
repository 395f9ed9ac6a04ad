//! `cargo xtask fresh`: the README's two commands as a new user runs them — in a fresh clone
//! of the repository, with an empty target directory, and with `PATH` limited to what
//! `src/deps.rs` declares — so that a missing install step, an undeclared program or a file
//! that only exists in a developer's tree shows here before it shows on someone's machine.
//!
//! The clone is of the commit checked out (`HEAD`): uncommitted changes are not in it, and
//! the run says so. `cargo xtask …` commands apply the hermetic `PATH` to what they start
//! themselves (they install first, which needs the machine's `PATH`); any other command of
//! the README runs with it from the start.

use crate::hermetic;
use crate::install::{self, Options};
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

/// The README's first fenced block, one command a line, comments and blank lines dropped:
/// the main job and the tests (`.ci/run` reads them the same way).
pub fn readme_commands(readme: &str) -> Result<Vec<String>, String> {
    let mut block = 0;
    let mut out = Vec::new();
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            block += 1;
            if block == 2 {
                break;
            }
            continue;
        }
        if block == 1 {
            let cmd = match line.find(" #") {
                Some(i) => &line[..i],
                None => line,
            };
            let cmd = cmd.trim();
            if !cmd.is_empty() && !cmd.starts_with('#') {
                out.push(cmd.to_string());
            }
        }
    }
    if out.len() != 2 {
        return Err(format!(
            "README.md's first code block must hold exactly two commands (the main job, the tests); found {}: {out:?}",
            out.len()
        ));
    }
    Ok(out)
}

fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `cargo xtask fresh [--keep] [--only test|bench]`.
pub fn run(root: &Path, args: &[OsString]) -> Result<ExitCode, String> {
    let (mut keep, mut only) = (false, None::<String>);
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        match a.as_str() {
            "--keep" => keep = true,
            "--only" => match it.next().as_deref() {
                Some(w @ ("test" | "bench")) => only = Some(w.to_string()),
                _ => return Err("--only takes `test` or `bench`".into()),
            },
            other => {
                return Err(format!(
                    "fresh: unknown option `{other}` (cargo xtask help)"
                ))
            }
        }
    }
    let head = git(root, &["rev-parse", "HEAD"])?;
    if !git(root, &["status", "--porcelain", "--untracked-files=no"])?.is_empty() {
        eprintln!("xtask: fresh clones the commit checked out ({head}); uncommitted changes are not in it");
    }
    let base = std::env::temp_dir().join(format!("turnstile-fresh-{}", std::process::id()));
    let clone = base.join("turnstile");
    let target = base.join("target");
    std::fs::create_dir_all(&target)
        .map_err(|e| format!("cannot create {}: {e}", target.display()))?;
    eprintln!("xtask: cloning {head} into {}", clone.display());
    git(
        &base,
        &[
            "clone",
            "--quiet",
            "--no-checkout",
            &root.display().to_string(),
            "turnstile",
        ],
    )?;
    git(&clone, &["checkout", "--quiet", &head])?;
    let readme = std::fs::read_to_string(clone.join("README.md"))
        .map_err(|e| format!("cannot read the clone's README.md: {e}"))?;
    let commands = readme_commands(&readme)?;
    let result = run_commands(&clone, &target, &commands, only.as_deref());
    if keep {
        eprintln!(
            "xtask: kept {} (the clone) and {}",
            clone.display(),
            target.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&base);
    }
    result
}

/// `bash -c cmd` in the clone with its own target directory (and the hermetic `PATH`); its
/// exit code.
fn shell(
    bash: &Path,
    cmd: &str,
    clone: &Path,
    target: &Path,
    hermetic: Option<&hermetic::Hermetic>,
) -> Result<i32, String> {
    let mut c = Command::new(bash);
    c.args(["-c", cmd])
        .current_dir(clone)
        .env("CARGO_TARGET_DIR", target)
        // The clone's cargo commands find their own toolchain, as a user's shell does.
        .env_remove("CARGO");
    if let Some(h) = hermetic {
        c.env("PATH", h.path_var());
    }
    let status = c.status().map_err(|e| format!("cannot run bash: {e}"))?;
    Ok(status.code().unwrap_or(1))
}

/// Runs the README's commands in the clone, one after the other; the first failure's code.
fn run_commands(
    clone: &Path,
    target: &Path,
    commands: &[String],
    only: Option<&str>,
) -> Result<ExitCode, String> {
    let mut opts = Options::detect(clone);
    opts.target_dir = target.to_path_buf();
    let mut summary = Vec::new();
    let mut failed = None;
    for cmd in commands {
        let is_test = cmd.contains("xtask test");
        if only.is_some_and(|o| (o == "test") != is_test) {
            continue;
        }
        let t0 = Instant::now();
        eprintln!("xtask: fresh: {cmd}");
        let code = if cmd.starts_with("cargo xtask") {
            // It installs (with the machine's PATH), then applies the hermetic one itself.
            shell(Path::new("bash"), cmd, clone, target, None)?
        } else {
            install::ensure(&opts)?;
            let declared = hermetic::declared(opts.scope, opts.uses_python(), opts.uses_node());
            let toolchain = hermetic::toolchain_dir();
            let h = hermetic::prepare(
                target,
                &opts.search_path,
                toolchain.as_deref(),
                opts.scope,
                &declared,
            )?;
            let code = shell(&h.bin.join("bash"), cmd, clone, target, Some(&h))?;
            match h.verdict() {
                Ok(()) => code,
                Err(e) => {
                    eprintln!("xtask: {e}");
                    code.max(1)
                }
            }
        };
        let line = format!(
            "{} {cmd} ({:.0} s, exit {code})",
            if code == 0 { "ok  " } else { "FAIL" },
            t0.elapsed().as_secs_f64()
        );
        eprintln!("xtask: fresh: {line}");
        summary.push(line);
        if code != 0 && failed.is_none() {
            failed = Some(code);
        }
    }
    eprintln!("xtask: fresh clone, empty target directory:");
    for l in &summary {
        eprintln!("  {l}");
    }
    Ok(match failed {
        None => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_gives_its_two_commands() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let text = std::fs::read_to_string(root.join("README.md")).unwrap();
        let cmds = readme_commands(&text).unwrap();
        assert!(cmds[0].starts_with("cargo run --release"), "{cmds:?}");
        assert_eq!(cmds[1], "cargo xtask test");
        assert!(readme_commands("```sh\none\n```\n").is_err());
        assert_eq!(
            readme_commands("# t\n\n```sh x\na  # why\n\n# note\nb\n```\n```sh\nc\n```").unwrap(),
            ["a", "b"]
        );
    }
}
