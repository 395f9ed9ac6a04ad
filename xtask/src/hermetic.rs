//! The tests' `PATH`: a directory of xtask's own that holds the programs [`crate::deps`]
//! declares and nothing else, so that a test which starts an undeclared program fails on
//! every machine — the developers', where the program happens to be installed, as much as a
//! fresh one, where it is not.
//!
//! `target/xtask/path-<scope>/bin` holds, for each declared program, a link to where this
//! machine has it. Every other program on the machine's `PATH` is there too, as a link to
//! `refuse`: a script that names the program and `xtask/src/deps.rs` on stderr, appends the
//! name to `refused.log`, and exits 127, as a shell does for a program it cannot find. After
//! the run, `cargo xtask` fails if anything was refused, naming what, whatever the tests made
//! of the failure (a test that skips when a program is missing would otherwise pass here and
//! skip there).
//!
//! The directory is made anew by every run: links to what the machine has now.

use crate::deps::{self, Scope};
use crate::install::find_program;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// A `PATH` of declared programs, and the log of what was refused.
#[derive(Clone, Debug)]
pub struct Hermetic {
    /// The directory the `PATH` is.
    pub bin: PathBuf,
    /// One line per refused start: the program's name.
    pub refused_log: PathBuf,
    /// Declared programs this machine does not have (a test that starts one fails as on a
    /// machine without it).
    pub absent: Vec<&'static str>,
}

/// Where a declared program comes from: the machine's `PATH`, except the Rust toolchain's,
/// which come from the toolchain cargo runs with (the rustup proxies in `~/.cargo/bin` would
/// put that directory back on the `PATH` of everything they start).
fn locate(name: &str, real_path: &OsStr, toolchain: Option<&Path>) -> Option<PathBuf> {
    if let Some(dir) = toolchain.filter(|_| deps::RUST.contains(&name)) {
        let p = dir.join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    find_program(real_path, name)
}

/// The directory of the toolchain's own `cargo` (`$CARGO`, which cargo sets for what it
/// runs), if it is one: not a rustup proxy.
pub fn toolchain_dir() -> Option<PathBuf> {
    let cargo = PathBuf::from(std::env::var_os("CARGO")?);
    let dir = cargo.parent()?.to_path_buf();
    // A proxy lives beside `rustup`; the toolchain's cargo beside `rustc` and no `rustup`.
    (dir.join("rustc").is_file() && !dir.join("rustup").exists()).then_some(dir)
}

/// Every program name on `real_path` (executable files), first occurrence only.
fn programs_on(real_path: &OsStr) -> BTreeSet<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut names = BTreeSet::new();
    for dir in std::env::split_paths(real_path).filter(|d| d.is_absolute()) {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let exec = std::fs::metadata(e.path())
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            if let (true, Some(n)) = (exec, e.file_name().to_str()) {
                names.insert(n.to_string());
            }
        }
    }
    names
}

/// The refusing script; `$0` is the link it was started through.
fn refuse_script(log: &Path) -> String {
    format!(
        "#!/bin/sh\n\
         # Started through a link named after a program that xtask/src/deps.rs does not declare.\n\
         name=${{0##*/}}\n\
         parent=unknown; read -r parent < /proc/$PPID/comm 2>/dev/null\n\
         printf '%s\\t%s\\n' \"$name\" \"$parent\" >> '{log}'\n\
         echo \"xtask: \\`$name\\` is not declared in xtask/src/deps.rs, so it is not on the tests' PATH \
         (cargo xtask runs them with PATH limited to what that table declares). Declare it there: in the \
         Debian package that brings it, or in the base tools. A fresh machine would not have it.\" >&2\n\
         exit 127\n",
        log = log.display()
    )
}

/// Makes `target/xtask/path-<scope>` for `scope`'s declared programs, found on
/// `real_path` (and the toolchain in `toolchain`).
pub fn prepare(
    target_dir: &Path,
    real_path: &OsStr,
    toolchain: Option<&Path>,
    scope: Scope,
    declared: &[&'static str],
) -> Result<Hermetic, String> {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let scope_name = match scope {
        Scope::Tests => "tests",
        Scope::Docs => "docs",
    };
    let root = target_dir.join("xtask").join(format!("path-{scope_name}"));
    let bin = root.join("bin");
    let refused_log = root.join("refused.log");
    let err =
        |what: &str, p: &Path, e: std::io::Error| format!("cannot {what} {}: {e}", p.display());
    if root.exists() {
        std::fs::remove_dir_all(&root).map_err(|e| err("remove", &root, e))?;
    }
    std::fs::create_dir_all(&bin).map_err(|e| err("create", &bin, e))?;
    std::fs::write(&refused_log, "").map_err(|e| err("create", &refused_log, e))?;
    let refuse = root.join("refuse");
    std::fs::write(&refuse, refuse_script(&refused_log)).map_err(|e| err("write", &refuse, e))?;
    std::fs::set_permissions(&refuse, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| err("make executable", &refuse, e))?;
    let mut absent = Vec::new();
    let declared_set: BTreeSet<&str> = declared.iter().copied().collect();
    for &name in &declared_set {
        match locate(name, real_path, toolchain) {
            Some(p) => symlink(&p, bin.join(name)).map_err(|e| err("link", &p, e))?,
            None => absent.push(name),
        }
    }
    for name in programs_on(real_path) {
        if !declared_set.contains(name.as_str()) {
            let link = bin.join(&name);
            symlink(&refuse, &link).map_err(|e| err("link", &link, e))?;
        }
    }
    Ok(Hermetic {
        bin,
        refused_log,
        absent,
    })
}

impl Hermetic {
    /// The `PATH` value.
    pub fn path_var(&self) -> OsString {
        self.bin.clone().into_os_string()
    }

    /// What was refused since [`prepare`], with how many times.
    #[cfg(test)]
    pub fn refused(&self) -> BTreeMap<String, usize> {
        self.refused_by()
            .into_iter()
            .fold(BTreeMap::new(), |mut m, ((name, _), c)| {
                *m.entry(name).or_insert(0) += c;
                m
            })
    }

    /// What was refused, by (program, the name of the process that started it), with how
    /// many times: the parent says where to look (a fence's shell, a test binary, a script).
    pub fn refused_by(&self) -> BTreeMap<(String, String), usize> {
        let text = std::fs::read_to_string(&self.refused_log).unwrap_or_default();
        let mut m = BTreeMap::new();
        for l in text.lines().filter(|l| !l.is_empty()) {
            let (name, parent) = l.split_once('\t').unwrap_or((l, "unknown"));
            *m.entry((name.to_string(), parent.to_string())).or_insert(0) += 1;
        }
        m
    }

    /// The failure to report when anything was refused.
    pub fn verdict(&self) -> Result<(), String> {
        let refused = self.refused_by();
        if refused.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = refused
            .iter()
            .map(|((n, parent), c)| {
                let s = if *c == 1 { "" } else { "s" };
                format!("  {n} ({c} time{s}, started by `{parent}`)")
            })
            .collect();
        Err(format!(
            "programs were started that xtask/src/deps.rs does not declare (refused on the \
             tests' PATH, {}):\n{}\ndeclare each in xtask/src/deps.rs (the Debian package that \
             brings it, or the base tools); a fresh machine would not have it",
            self.bin.display(),
            list.join("\n")
        ))
    }
}

/// The declared programs of `scope`, the table's and the base tools'.
pub fn declared(scope: Scope, with_python: bool, with_node: bool) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = deps::BASE.iter().map(|(name, _)| *name).collect();
    v.extend(deps::RUST);
    v.extend(deps::C_TOOLCHAIN);
    let mut apt: Vec<&deps::Apt> = deps::APT.iter().filter(|a| a.scope <= scope).collect();
    if with_python {
        apt.extend(deps::PYTHON_APT);
    }
    if with_node {
        apt.extend(deps::NODE_APT);
    }
    for a in apt {
        v.extend(a.programs);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::process::Command;

    fn program(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn an_undeclared_program_is_refused_and_a_declared_one_runs() {
        let tmp = std::env::temp_dir().join(format!("xtask-hermetic-{}", std::process::id()));
        let machine = tmp.join("usr-bin");
        std::fs::create_dir_all(&machine).unwrap();
        program(&machine, "declared-tool", "echo declared ran");
        program(&machine, "other-tool", "echo other ran");
        let h = prepare(
            &tmp.join("target"),
            machine.as_os_str(),
            None,
            Scope::Tests,
            &["declared-tool", "missing-tool"],
        )
        .unwrap();
        assert_eq!(h.absent, ["missing-tool"]);
        let run = |name: &str| {
            Command::new("/bin/sh")
                .args(["-c", name])
                .env("PATH", h.path_var())
                .output()
                .unwrap()
        };
        let ok = run("declared-tool");
        assert!(ok.status.success());
        assert_eq!(String::from_utf8_lossy(&ok.stdout), "declared ran\n");
        assert!(h.verdict().is_ok());

        // On the machine, not declared: refused, named, and the run fails afterwards.
        let no = run("other-tool");
        assert_eq!(no.status.code(), Some(127));
        assert!(no.stdout.is_empty(), "it must not run");
        let err = String::from_utf8_lossy(&no.stderr);
        assert!(
            err.contains("`other-tool` is not declared in xtask/src/deps.rs"),
            "{err}"
        );
        // Started directly, not through a shell, as Command::new does.
        let direct = Command::new("other-tool")
            .env("PATH", h.path_var())
            .output()
            .unwrap();
        assert_eq!(direct.status.code(), Some(127));
        assert_eq!(h.refused().get("other-tool"), Some(&2));
        let verdict = h.verdict().unwrap_err();
        assert!(
            verdict.contains("other-tool (1 time, started by `sh`)")
                && verdict.contains("xtask/src/deps.rs"),
            "{verdict}"
        );
        // Neither on the machine nor declared: not found, as on a fresh machine.
        assert_eq!(run("missing-tool").status.code(), Some(127));
        assert!(Command::new("missing-tool")
            .env("PATH", h.path_var())
            .output()
            .is_err());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn every_declared_name_is_a_plain_file_name() {
        for scope in [Scope::Tests, Scope::Docs] {
            for n in declared(scope, true, true) {
                assert!(
                    !n.is_empty() && !n.contains('/') && n.trim() == n,
                    "`{n}` is not a program name"
                );
            }
        }
    }
}
