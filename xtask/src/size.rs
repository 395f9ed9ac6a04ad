//! `cargo xtask size`: the functions over 80 lines and the files over 600 lines of product code
//! (each crate's library and binaries; tests, benches, examples and `#[cfg(test)]` modules
//! left out). A function is counted from its `fn` line to its closing brace. At most
//! [`MAX_LONG_FILES`] files may pass 600 lines, each opening with a line that says why:
//! `// Over 600 lines: …`.

use crate::modtree::Crate;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The longest function, in lines.
pub const MAX_FN_LINES: u32 = 80;
/// The longest file without a reason, in lines.
pub const MAX_FILE_LINES: usize = 600;
/// How many files may pass [`MAX_FILE_LINES`], each with its reason.
pub const MAX_LONG_FILES: usize = 2;
/// How a long file's first line starts.
pub const REASON: &str = "// Over 600 lines:";

/// What is over the limits in some crates.
#[derive(Debug, Default)]
pub struct Sizes {
    /// (file, first line, name, lines), longest first.
    pub long_fns: Vec<(PathBuf, u32, String, u32)>,
    /// (file, lines, its first line if it gives the reason).
    pub long_files: Vec<(PathBuf, usize, Option<String>)>,
    /// Product files and functions counted.
    pub files: usize,
    pub fns: usize,
}

impl Sizes {
    /// The problems: functions over the limit, long files without a reason, too many long files.
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .long_fns
            .iter()
            .map(|(f, l, name, n)| {
                format!(
                    "{}:{l}: fn {name} is {n} lines (at most {MAX_FN_LINES})",
                    f.display()
                )
            })
            .collect();
        for (f, n, why) in &self.long_files {
            if why.is_none() {
                out.push(format!(
                    "{}: {n} lines; split it, or open it with a line `{REASON} <why>`",
                    f.display()
                ));
            }
        }
        if self.long_files.len() > MAX_LONG_FILES {
            out.push(format!(
                "{} files over {MAX_FILE_LINES} lines (at most {MAX_LONG_FILES})",
                self.long_files.len()
            ));
        }
        out
    }
}

/// Measures the product code of `crates`.
pub fn measure(root: &Path, crates: &[&Crate]) -> Sizes {
    let mut s = Sizes::default();
    let mut seen = BTreeSet::new();
    let modules = crates
        .iter()
        .flat_map(|c| &c.targets)
        .filter(|t| t.is_product())
        .flat_map(|t| &t.modules)
        .filter(|m| m.owns_file);
    for m in modules {
        if !seen.insert(m.file.clone()) {
            continue;
        }
        s.files += 1;
        s.fns += m.fns.len();
        for f in m.fns.iter().filter(|f| f.lines() > MAX_FN_LINES) {
            s.long_fns
                .push((m.file.clone(), f.first, f.name.clone(), f.lines()));
        }
        if m.lines > MAX_FILE_LINES {
            let first = std::fs::read_to_string(root.join(&m.file))
                .ok()
                .and_then(|t| t.lines().next().map(str::to_string))
                .filter(|l| l.starts_with(REASON));
            s.long_files.push((m.file.clone(), m.lines, first));
        }
    }
    s.long_fns
        .sort_by(|a, b| b.3.cmp(&a.3).then_with(|| a.0.cmp(&b.0)));
    s.long_files.sort_by_key(|f| std::cmp::Reverse(f.1));
    s
}

/// The report: per crate, then the whole selection's problems.
pub fn report(root: &Path, crates: &[&Crate]) -> (String, Vec<String>) {
    let mut text = String::new();
    for c in crates {
        let s = measure(root, &[c]);
        let _ = writeln!(
            text,
            "{}: {} files, {} functions; {} functions over {MAX_FN_LINES} lines, {} files over {MAX_FILE_LINES}",
            c.name,
            s.files,
            s.fns,
            s.long_fns.len(),
            s.long_files.len()
        );
        for (f, l, name, n) in &s.long_fns {
            let _ = writeln!(text, "    fn {name} ({n} lines) {}:{l}", f.display());
        }
        for (f, n, why) in &s.long_files {
            let why = why.as_deref().unwrap_or("(no reason given)");
            let _ = writeln!(text, "    {} ({n} lines) {why}", f.display());
        }
    }
    let all = measure(root, crates);
    let _ = writeln!(
        text,
        "size: {} functions over {MAX_FN_LINES} lines, {} files over {MAX_FILE_LINES} lines ({} files, {} functions)",
        all.long_fns.len(),
        all.long_files.len(),
        all.files,
        all.fns
    );
    (text, all.problems())
}
