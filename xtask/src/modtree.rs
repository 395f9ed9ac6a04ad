//! The workspace as trees of modules: its crates (the root `Cargo.toml`'s `members`), each
//! crate's targets (library, binaries, tests, benches, examples), and each target's modules
//! from its root file down its `mod` declarations, with every module path the modules name,
//! resolved to the module it points into.

use crate::scan::{self, FileScan, FnSpan};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// One crate of the workspace.
pub struct Crate {
    /// Its package name.
    pub name: String,
    pub targets: Vec<Target>,
}

/// One target: a module tree from one root file.
pub struct Target {
    /// `lib`, `bin`, `test`, `bench` or `example`.
    pub kind: &'static str,
    /// Its root file, relative to the workspace root.
    pub root: PathBuf,
    pub modules: Vec<Module>,
    /// `mod` declarations whose file was not found.
    pub missing: Vec<String>,
}

/// One module outside test code.
pub struct Module {
    /// Its path from the crate root (empty for the root).
    pub path: Vec<String>,
    /// The file its items are in (an inline module's is its parent's), relative to the root.
    pub file: PathBuf,
    /// Whether the file is its own (not an inline module's parent's).
    pub owns_file: bool,
    /// The module paths it names, as written.
    pub refs: Vec<scan::PathRef>,
    /// Its functions (an inline module's are its parent file's, not listed again here).
    pub fns: Vec<FnSpan>,
    /// The file's lines (0 for an inline module).
    pub lines: usize,
}

impl Target {
    /// Whether this is product code (a library or a binary) rather than a test, bench or example.
    pub fn is_product(&self) -> bool {
        matches!(self.kind, "lib" | "bin")
    }

    /// The set of its module paths.
    pub fn known(&self) -> HashSet<&[String]> {
        self.modules.iter().map(|m| m.path.as_slice()).collect()
    }
}

/// Where `segments`, written in module `from`, point: the deepest module of this target
/// the path walks through, or `None` for a path outside the crate (another crate, a
/// prelude name) or one that only names a child of `from`.
pub fn resolve(
    known: &HashSet<&[String]>,
    from: &[String],
    segments: &[String],
) -> Option<Vec<String>> {
    let (mut base, rest): (Vec<String>, &[String]) = match segments.first()?.as_str() {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (from.to_vec(), &segments[1..]),
        "super" => {
            let ups = segments.iter().take_while(|s| *s == "super").count();
            let keep = from.len().checked_sub(ups)?;
            (from[..keep].to_vec(), &segments[ups..])
        }
        _ => return None,
    };
    for seg in rest {
        base.push(seg.clone());
        if !known.contains(base.as_slice()) {
            base.pop();
            break;
        }
    }
    Some(base)
}

/// The workspace's crates, read from the root `Cargo.toml`'s `members`.
pub fn workspace(root: &Path) -> Result<Vec<Crate>, String> {
    let manifest = read(&root.join("Cargo.toml"))?;
    let mut crates = Vec::new();
    for member in members(&manifest) {
        let dir = root.join(&member);
        let text = read(&dir.join("Cargo.toml"))?;
        let name = package_name(&text).unwrap_or_else(|| member.clone());
        let mut targets = Vec::new();
        for (kind, file) in target_roots(&dir) {
            let rel = file.strip_prefix(root).unwrap_or(&file).to_path_buf();
            targets.push(load_target(root, kind, &rel)?);
        }
        crates.push(Crate { name, targets });
    }
    Ok(crates)
}

fn read(p: &Path) -> Result<String, String> {
    std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

/// The strings of `members = [ … ]` in a workspace manifest.
fn members(manifest: &str) -> Vec<String> {
    let Some(start) = manifest.find("members") else {
        return vec![".".into()];
    };
    let after = &manifest[start..];
    let (Some(open), Some(close)) = (after.find('['), after.find(']')) else {
        return vec![".".into()];
    };
    after[open + 1..close]
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `name = "…"` in a manifest's `[package]` section.
fn package_name(manifest: &str) -> Option<String> {
    let package = &manifest[manifest.find("[package]")?..];
    let line = package
        .lines()
        .find(|l| l.trim_start().starts_with("name"))?;
    Some(line.split('"').nth(1)?.to_string())
}

/// A crate's target root files by cargo's conventions (this workspace declares no others).
fn target_roots(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let mut out = Vec::new();
    for (kind, file) in [("lib", "src/lib.rs"), ("bin", "src/main.rs")] {
        if dir.join(file).is_file() {
            out.push((kind, dir.join(file)));
        }
    }
    for (kind, sub) in [
        ("bin", "src/bin"),
        ("test", "tests"),
        ("bench", "benches"),
        ("example", "examples"),
    ] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter_map(|p| match p.extension() {
                Some(e) if e == "rs" => Some(p),
                _ => Some(p.join("main.rs")).filter(|m| m.is_file()),
            })
            .collect();
        files.sort();
        out.extend(files.into_iter().map(|f| (kind, f)));
    }
    out
}

/// A target's modules, from its root file down.
fn load_target(root: &Path, kind: &'static str, file: &Path) -> Result<Target, String> {
    let mut t = Target {
        kind,
        root: file.to_path_buf(),
        modules: Vec::new(),
        missing: Vec::new(),
    };
    let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
    load_file(root, &mut t, file, Vec::new(), &dir)?;
    Ok(t)
}

/// Adds the module in `file` (path `path`, children's files under `child_dir`), its inline
/// modules, and, recursively, the files of the modules it declares.
fn load_file(
    root: &Path,
    t: &mut Target,
    file: &Path,
    path: Vec<String>,
    child_dir: &Path,
) -> Result<(), String> {
    let text = read(&root.join(file))?;
    let lines = text.lines().count();
    let FileScan { mods, refs, fns } = scan::scan(&text);
    let first = t.modules.len();
    t.modules.push(Module {
        path: path.clone(),
        file: file.to_path_buf(),
        owns_file: true,
        refs: Vec::new(),
        fns,
        lines,
    });
    for m in mods.iter().filter(|m| m.inline) {
        let mut p = path.clone();
        p.extend(m.scope.iter().cloned());
        p.push(m.name.clone());
        t.modules.push(Module {
            path: p,
            file: file.to_path_buf(),
            owns_file: false,
            refs: Vec::new(),
            fns: Vec::new(),
            lines: 0,
        });
    }
    for r in refs {
        let mut p = path.clone();
        p.extend(r.scope.iter().cloned());
        if let Some(m) = t.modules[first..].iter_mut().find(|m| m.path == p) {
            m.refs.push(r);
        }
    }
    for m in mods.iter().filter(|m| !m.inline) {
        let inner: PathBuf = m.scope.iter().collect();
        let candidates = match &m.path_attr {
            // Relative to this file's folder, or to the inline module's folder within it.
            Some(p) if m.scope.is_empty() => vec![file.parent().unwrap_or(Path::new("")).join(p)],
            Some(p) => vec![child_dir.join(&inner).join(p)],
            None => vec![
                child_dir.join(&inner).join(format!("{}.rs", m.name)),
                child_dir.join(&inner).join(&m.name).join("mod.rs"),
            ],
        };
        let Some(found) = candidates.into_iter().find(|c| root.join(c).is_file()) else {
            t.missing
                .push(format!("{}:{}: mod {}", file.display(), m.line, m.name));
            continue;
        };
        let mut p = path.clone();
        p.extend(m.scope.iter().cloned());
        p.push(m.name.clone());
        let dir = if m.path_attr.is_some() || found.file_name().is_some_and(|n| n == "mod.rs") {
            found.parent().unwrap_or(Path::new("")).to_path_buf()
        } else {
            found.with_extension("")
        };
        load_file(root, t, &found, p, &dir)?;
    }
    Ok(())
}
