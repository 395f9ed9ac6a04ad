//! Checks what the tests need ([`crate::deps`]) and installs what is missing.
//!
//! The decision is a pure function ([`plan_apt`]) of what is missing, the privilege the process
//! has and whether `apt-get` exists, so that it is tested without touching the machine; the
//! probes take the `PATH` to search as an argument (`cargo xtask deps --path ''` shows what a
//! fresh machine would get), and `--dry-run` prints the commands instead of running them.

use crate::deps::{Apt, Probe, Scope, APT, NODE_APT, NPM, PIP, PYTHON_APT};
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the process may do to install Debian packages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Privilege {
    /// Running as root: apt-get directly.
    Root,
    /// `sudo -n true` succeeds: apt-get through `sudo -n`.
    Sudo,
    /// Neither: print the command for the user to run.
    None,
}

impl std::str::FromStr for Privilege {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "root" => Ok(Privilege::Root),
            "sudo" => Ok(Privilege::Sudo),
            "none" => Ok(Privilege::None),
            _ => Err(format!(
                "--privilege: unknown `{s}`; expected root, sudo or none"
            )),
        }
    }
}

/// What to do about missing Debian packages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AptPlan {
    /// Everything is there: no apt-get at all (not even `update`).
    Nothing,
    /// Run these commands, in order.
    Run(Vec<Vec<String>>),
    /// The user must run this one command (no root, no password-less sudo).
    Ask(String),
    /// No apt-get on this machine: the user installs these with their package manager.
    NoApt(Vec<&'static str>),
}

/// The decision: what to do about `missing` packages with `privilege`, on a machine with or
/// without apt-get.
pub fn plan_apt(missing: &[&Apt], privilege: Privilege, have_apt: bool) -> AptPlan {
    if missing.is_empty() {
        return AptPlan::Nothing;
    }
    let mut packages: Vec<&'static str> = missing.iter().map(|a| a.package).collect();
    packages.dedup();
    if !have_apt {
        return AptPlan::NoApt(packages);
    }
    let update = ["apt-get", "update", "-qq"];
    let install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends"];
    let with = |prefix: &[&str], cmd: &[&str], pkgs: bool| -> Vec<String> {
        let mut v: Vec<String> = prefix.iter().chain(cmd).map(|s| s.to_string()).collect();
        if pkgs {
            v.extend(packages.iter().map(|p| p.to_string()));
        }
        v
    };
    let prefix: &[&str] = match privilege {
        Privilege::Root => &["env", "DEBIAN_FRONTEND=noninteractive"],
        Privilege::Sudo => &["sudo", "-n", "env", "DEBIAN_FRONTEND=noninteractive"],
        Privilege::None => {
            return AptPlan::Ask(format!(
                "sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends {}'",
                packages.join(" ")
            ))
        }
    };
    AptPlan::Run(vec![
        with(prefix, &update, false),
        with(prefix, &install, true),
    ])
}

/// How a run of the installer is set up.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `PATH` programs are looked up in (the process's own by default).
    pub search_path: OsString,
    /// The privilege to plan for (detected by default).
    pub privilege: Privilege,
    /// Print the commands instead of running them.
    pub dry_run: bool,
    /// Whether the machine has apt-get (on the process's own `PATH`).
    pub have_apt: bool,
    /// Where `test-deps/` goes: the workspace's target directory.
    pub target_dir: PathBuf,
    /// Python packages beyond the table's (to try the mechanism).
    pub extra_pip: Vec<String>,
    /// Node packages beyond the table's.
    pub extra_npm: Vec<String>,
    /// Whose packages: the tests' (default) or also the docs test's.
    pub scope: Scope,
}

impl Options {
    /// The process's `PATH`, its detected privilege, the workspace's target directory.
    pub fn detect(root: &Path) -> Options {
        Options {
            search_path: std::env::var_os("PATH").unwrap_or_default(),
            privilege: detect_privilege(),
            dry_run: false,
            have_apt: find_program(&std::env::var_os("PATH").unwrap_or_default(), "apt-get")
                .is_some(),
            target_dir: target_dir(root),
            extra_pip: Vec::new(),
            extra_npm: Vec::new(),
            scope: Scope::Tests,
        }
    }

    /// Whether this run installs Python packages (and so declares `python3`).
    pub fn uses_python(&self) -> bool {
        !self.pip_specs().is_empty()
    }

    /// Whether this run installs Node packages (and so declares `node` and `npm`).
    pub fn uses_node(&self) -> bool {
        !self.npm_specs().is_empty()
    }

    fn pip_specs(&self) -> Vec<String> {
        let mut v: Vec<String> = PIP.iter().map(|p| p.spec.to_string()).collect();
        v.extend(self.extra_pip.iter().cloned());
        v
    }

    fn npm_specs(&self) -> Vec<String> {
        let mut v: Vec<String> = NPM.iter().map(|p| p.spec.to_string()).collect();
        v.extend(self.extra_npm.iter().cloned());
        v
    }

    /// The Debian packages this run needs: the table's, and Python's or Node's own when
    /// there are packages of theirs to install.
    pub fn apt_needed(&self) -> Vec<&'static Apt> {
        let mut v: Vec<&'static Apt> = APT.iter().filter(|a| a.scope <= self.scope).collect();
        if !self.pip_specs().is_empty() {
            v.extend(PYTHON_APT);
        }
        if !self.npm_specs().is_empty() {
            v.extend(NODE_APT);
        }
        v
    }
}

/// The workspace's target directory (`CARGO_TARGET_DIR`, relative to the workspace root, or
/// `target/`).
pub fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => root.join(d),
        _ => root.join("target"),
    }
}

/// Root, password-less sudo, or neither.
fn detect_privilege() -> Privilege {
    if effective_uid() == Some(0) {
        return Privilege::Root;
    }
    let sudo = Command::new("sudo")
        .args(["-n", "true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match sudo {
        Ok(s) if s.success() => Privilege::Sudo,
        _ => Privilege::None,
    }
}

/// The effective user id, from `/proc/self/status` (no libc needed).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// `name` as found on `path` (an executable file), like `command -v`.
pub fn find_program(path: &OsStr, name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Whether `a` is installed, looking on `path`.
fn present(a: &Apt, path: &OsStr) -> bool {
    match a.probe {
        Probe::Program(p) => find_program(path, p).is_some(),
        Probe::PythonModule(m) => find_program(path, "python3").is_some_and(|py| {
            Command::new(py)
                .args(["-c", &format!("import {m}")])
                .env("PATH", path)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        }),
    }
}

/// Ensures everything is installed; returns the environment variables the tests get.
/// `Err` carries the message to print (what is missing, what to run).
pub fn ensure(opts: &Options) -> Result<Vec<(String, OsString)>, String> {
    let needed = opts.apt_needed();
    let missing: Vec<&Apt> = needed
        .iter()
        .copied()
        .filter(|a| !present(a, &opts.search_path))
        .collect();
    let plan = plan_apt(&missing, opts.privilege, opts.have_apt);
    if !missing.is_empty() {
        let mut list = String::new();
        for a in &missing {
            let _ = writeln!(list, "  {:<14} {}", a.package, a.why);
        }
        eprintln!("xtask: missing for the tests:\n{list}");
    }
    match plan {
        AptPlan::Nothing => {}
        AptPlan::NoApt(pkgs) => {
            return Err(format!(
                "no apt-get on this machine: install {} with its package manager, then run this again",
                pkgs.join(", ")
            ))
        }
        AptPlan::Ask(cmd) => {
            return Err(format!(
                "installing them needs root (not root, and sudo asks for a password). Run:\n\n    {cmd}\n\nthen run this again"
            ))
        }
        AptPlan::Run(cmds) => {
            for c in &cmds {
                run(opts, c)?;
            }
            if !opts.dry_run {
                let still: Vec<&str> = missing
                    .iter()
                    .filter(|a| !present(a, &opts.search_path))
                    .map(|a| a.package)
                    .collect();
                if !still.is_empty() {
                    return Err(format!(
                        "apt-get installed {} but they are still not found on PATH",
                        still.join(", ")
                    ));
                }
            }
        }
    }
    let mut env = Vec::new();
    if let Some(py) = ensure_pip(opts)? {
        env.push(("TURNSTILE_TEST_PYTHON".to_string(), py.into_os_string()));
    }
    if let Some(nm) = ensure_npm(opts)? {
        env.push(("TURNSTILE_TEST_NODE_PATH".to_string(), nm.into_os_string()));
    }
    if missing.is_empty() {
        let names: Vec<&str> = needed.iter().map(|a| a.package).collect();
        eprintln!("xtask: test dependencies present: {}", names.join(", "));
    }
    Ok(env)
}

/// Runs (or, dry, prints) one command (found on the process's own `PATH`: the search path
/// only decides what is missing).
fn run(opts: &Options, cmd: &[String]) -> Result<(), String> {
    let shown = cmd.join(" ");
    if opts.dry_run {
        println!("would run: {shown}");
        return Ok(());
    }
    eprintln!("xtask: {shown}");
    let status = Command::new(&cmd[0])
        .args(&cmd[1..])
        .status()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` failed ({status})"))
    }
}

/// Whether `dir` was last installed with exactly `specs` (its stamp file) and `made` exists.
fn up_to_date(dir: &Path, made: &Path, specs: &[String]) -> bool {
    made.exists()
        && std::fs::read_to_string(dir.join(".turnstile-specs")).ok() == Some(specs.join("\n"))
}

/// Runs `cmd` with `specs` appended, then records them as `dir`'s stamp (not when dry).
fn install_specs(opts: &Options, cmd: &[&str], dir: &Path, specs: &[String]) -> Result<(), String> {
    let mut v: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
    v.extend(specs.iter().cloned());
    run(opts, &v)?;
    if opts.dry_run {
        return Ok(());
    }
    std::fs::write(dir.join(".turnstile-specs"), specs.join("\n"))
        .map_err(|e| format!("cannot write {}: {e}", dir.display()))
}

/// `name` as found on the search path, or just `name`.
fn program(opts: &Options, name: &str) -> String {
    find_program(&opts.search_path, name)
        .map_or_else(|| name.to_string(), |p| p.display().to_string())
}

/// The virtualenv with the Python packages; its interpreter, or `None` if there are none.
fn ensure_pip(opts: &Options) -> Result<Option<PathBuf>, String> {
    let specs = opts.pip_specs();
    if specs.is_empty() {
        return Ok(None);
    }
    let venv = opts.target_dir.join("test-deps").join("venv");
    let python = venv.join("bin").join("python");
    if up_to_date(&venv, &python, &specs) {
        return Ok(Some(python));
    }
    let (py, dir) = (python.display().to_string(), venv.display().to_string());
    if !python.exists() {
        run(
            opts,
            &[program(opts, "python3"), "-m".into(), "venv".into(), dir],
        )?;
    }
    let pip = [
        py.as_str(),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ];
    install_specs(opts, &pip, &venv, &specs)?;
    Ok(Some(python))
}

/// The folder with the Node packages; its `node_modules`, or `None` if there are none.
fn ensure_npm(opts: &Options) -> Result<Option<PathBuf>, String> {
    let specs = opts.npm_specs();
    if specs.is_empty() {
        return Ok(None);
    }
    let dir = opts.target_dir.join("test-deps").join("node");
    let modules = dir.join("node_modules");
    if up_to_date(&dir, &modules, &specs) {
        return Ok(Some(modules));
    }
    if !opts.dry_run {
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let (npm, prefix) = (program(opts, "npm"), dir.display().to_string());
    let cmd = [
        npm.as_str(),
        "install",
        "--prefix",
        &prefix,
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ];
    install_specs(opts, &cmd, &dir, &specs)?;
    Ok(Some(modules))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<&'static Apt> {
        APT.iter().filter(|a| a.scope == Scope::Tests).collect()
    }

    #[test]
    fn nothing_missing_runs_nothing_not_even_update() {
        for p in [Privilege::Root, Privilege::Sudo, Privilege::None] {
            assert_eq!(plan_apt(&[], p, true), AptPlan::Nothing);
            assert_eq!(plan_apt(&[], p, false), AptPlan::Nothing);
        }
    }

    #[test]
    fn root_runs_apt_get_update_then_install() {
        let AptPlan::Run(cmds) = plan_apt(&table(), Privilege::Root, true) else {
            panic!("root should install");
        };
        assert_eq!(cmds.len(), 2);
        assert_eq!(
            cmds[0].join(" "),
            "env DEBIAN_FRONTEND=noninteractive apt-get update -qq"
        );
        assert_eq!(
            cmds[1].join(" "),
            "env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server redis-tools curl wrk haproxy"
        );
    }

    #[test]
    fn sudo_goes_through_sudo_n_and_never_prompts() {
        let AptPlan::Run(cmds) = plan_apt(&table()[2..], Privilege::Sudo, true) else {
            panic!("sudo should install");
        };
        for c in &cmds {
            assert_eq!(&c[..2], ["sudo", "-n"], "{c:?}");
        }
        assert_eq!(cmds[1].last().map(String::as_str), Some("haproxy"));
    }

    #[test]
    fn no_privilege_prints_one_command() {
        let AptPlan::Ask(cmd) = plan_apt(&table()[..1], Privilege::None, true) else {
            panic!("no privilege should ask");
        };
        assert_eq!(
            cmd,
            "sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends redis-server'"
        );
    }

    #[test]
    fn no_apt_names_the_packages() {
        assert_eq!(
            plan_apt(&table(), Privilege::Root, false),
            AptPlan::NoApt(vec![
                "redis-server",
                "redis-tools",
                "curl",
                "wrk",
                "haproxy"
            ])
        );
    }

    #[test]
    fn an_empty_path_finds_nothing_and_the_real_one_finds_sh() {
        assert!(find_program(OsStr::new(""), "sh").is_none());
        assert!(find_program(OsStr::new("/nonexistent"), "sh").is_none());
        assert!(find_program(OsStr::new("/nonexistent:/bin:/usr/bin"), "sh").is_some());
        // A directory or a file that is not executable is not a program.
        assert!(find_program(OsStr::new("/"), "etc").is_none());
        let dir = std::env::temp_dir().join(format!("xtask-find-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("plain"), "").unwrap();
        assert!(find_program(dir.as_os_str(), "plain").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn opts(pip: &[&str], npm: &[&str]) -> Options {
        Options {
            search_path: OsString::new(),
            privilege: Privilege::Root,
            dry_run: true,
            have_apt: true,
            target_dir: std::env::temp_dir().join("xtask-plan-test"),
            extra_pip: pip.iter().map(|s| s.to_string()).collect(),
            extra_npm: npm.iter().map(|s| s.to_string()).collect(),
            scope: Scope::Tests,
        }
    }

    #[test]
    fn python_and_node_bring_their_prerequisites_only_when_used() {
        let names =
            |o: &Options| -> Vec<&str> { o.apt_needed().iter().map(|a| a.package).collect() };
        let base = names(&opts(&[], &[]));
        assert_eq!(
            base.len(),
            table().len() + if PIP.is_empty() { 0 } else { 2 } + if NPM.is_empty() { 0 } else { 2 }
        );
        // The docs test's own packages only for the docs test.
        let docs = names(&Options {
            scope: Scope::Docs,
            ..opts(&[], &[])
        });
        assert!(docs.contains(&"valgrind") && !base.contains(&"valgrind"));
        let py = names(&opts(&["redis==5.2.1"], &[]));
        assert!(py.contains(&"python3") && py.contains(&"python3-venv"));
        let node = names(&opts(&[], &["ioredis@5.4.1"]));
        assert!(node.contains(&"nodejs") && node.contains(&"npm"));
    }

    #[test]
    fn on_an_empty_path_everything_is_missing_and_a_dry_run_changes_nothing() {
        let o = opts(&["redis==5.2.1"], &["ioredis@5.4.1"]);
        let missing: Vec<&Apt> = o
            .apt_needed()
            .into_iter()
            .filter(|a| !present(a, &o.search_path))
            .collect();
        assert_eq!(missing.len(), o.apt_needed().len());
        // Dry: prints the plan, returns the variables the tests would get, creates nothing.
        let env = ensure(&o).expect("a dry run as root plans an install");
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["TURNSTILE_TEST_PYTHON", "TURNSTILE_TEST_NODE_PATH"]);
        assert!(!o.target_dir.join("test-deps").exists());
        // Without privilege the same machine gets the one command to run.
        let none = Options {
            privilege: Privilege::None,
            ..o
        };
        let err = ensure(&none).expect_err("no privilege, packages missing");
        assert!(
            err.contains("sudo sh -c 'apt-get update && apt-get install -y"),
            "{err}"
        );
    }
}
