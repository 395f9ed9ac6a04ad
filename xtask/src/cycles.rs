//! `cargo xtask cycles`: import cycles between sibling modules, in every crate of the
//! workspace. Module `a::x` naming anything in `a::y` (or below it) is an edge `x → y` among
//! the children of `a`; a child naming its ancestors, or a parent its children, is not. A
//! strongly connected set of siblings is a cycle: neither side can be read, tested or moved
//! without the other. Each is reported with its files and every import that closes it.

use crate::modtree::{self, Crate, Target};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One place a module names a sibling.
#[derive(Clone, Debug)]
pub struct Evidence {
    pub file: PathBuf,
    pub line: u32,
}

/// Edges between siblings: (parent, from child, to child) → where.
type Edges = BTreeMap<(Vec<String>, String, String), Vec<Evidence>>;

/// A set of sibling modules that import one another in a circle.
#[derive(Debug)]
pub struct Cycle {
    /// Their parent module (empty for the crate root).
    pub parent: Vec<String>,
    /// The siblings, each with its file.
    pub members: Vec<(String, PathBuf)>,
    /// One circle through them, for the headline (`a → b → a`).
    pub circle: Vec<String>,
    /// Every edge between them, with where it is written.
    pub edges: Vec<(String, String, Vec<Evidence>)>,
}

/// The edges between sibling modules of one target.
pub fn sibling_edges(t: &Target) -> Edges {
    let known = t.known();
    let mut edges = Edges::new();
    for m in &t.modules {
        for r in &m.refs {
            let Some(to) = modtree::resolve(&known, &m.path, &r.segments) else {
                continue;
            };
            let common = m.path.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // An ancestor or a descendant of `m`: not a sibling edge.
            if common == m.path.len() || common == to.len() {
                continue;
            }
            let key = (
                m.path[..common].to_vec(),
                m.path[common].clone(),
                to[common].clone(),
            );
            edges.entry(key).or_default().push(Evidence {
                file: m.file.clone(),
                line: r.line,
            });
        }
    }
    edges
}

/// The cycles of one target.
pub fn cycles(t: &Target) -> Vec<Cycle> {
    let edges = sibling_edges(t);
    let mut by_parent: BTreeMap<&[String], BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for (parent, from, to) in edges.keys() {
        by_parent
            .entry(parent)
            .or_default()
            .entry(from)
            .or_default()
            .insert(to);
    }
    let mut out = Vec::new();
    for (parent, graph) in by_parent {
        for scc in strongly_connected(&graph) {
            let file_of = |name: &str| {
                let mut p = parent.to_vec();
                p.push(name.to_string());
                t.modules
                    .iter()
                    .find(|m| m.path == p)
                    .map(|m| m.file.clone())
                    .unwrap_or_default()
            };
            let members = scc.iter().map(|n| (n.to_string(), file_of(n))).collect();
            let inside = |n: &str| scc.contains(&n);
            let circle = circle(&graph, scc[0], &inside);
            let edges = edges
                .iter()
                .filter(|((p, f, to), _)| p == parent && inside(f) && inside(to))
                .map(|((_, f, to), ev)| (f.clone(), to.clone(), ev.clone()))
                .collect();
            out.push(Cycle {
                parent: parent.to_vec(),
                members,
                circle,
                edges,
            });
        }
    }
    out
}

/// The strongly connected sets of two or more nodes (Tarjan), each sorted.
fn strongly_connected<'a>(g: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct Tarjan<'a, 'g> {
        g: &'g BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    impl<'a> Tarjan<'a, '_> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for &w in self.g.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.stack.contains(&w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self
                    .stack
                    .iter()
                    .rposition(|&x| x == v)
                    .expect("on the stack");
                let mut scc = self.stack.split_off(at);
                if scc.len() > 1 {
                    scc.sort_unstable();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        g,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for &v in g.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

/// A shortest circle from `start` back to it, through nodes `inside` (breadth first).
fn circle(
    g: &BTreeMap<&str, BTreeSet<&str>>,
    start: &str,
    inside: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut prev: HashMap<&str, &str> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in g.get(v).into_iter().flatten() {
            if !inside(w) {
                continue;
            }
            if w == start {
                let mut path = vec![start.to_string()];
                let mut at = v;
                while at != start {
                    path.push(at.to_string());
                    at = prev[at];
                }
                path.push(start.to_string());
                path.reverse();
                return path;
            }
            if !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    vec![start.to_string()]
}

/// The report for the whole workspace, and the number of cycles in it.
pub fn report(root: &Path, crates: &[&Crate]) -> (String, usize) {
    let mut text = String::new();
    let mut lines = SourceLines::default();
    let (mut total, mut clean) = (0, Vec::new());
    for c in crates {
        let found: Vec<(&Target, Vec<Cycle>)> = c
            .targets
            .iter()
            .map(|t| (t, cycles(t)))
            .filter(|(_, cs)| !cs.is_empty())
            .collect();
        let n: usize = found.iter().map(|(_, cs)| cs.len()).sum();
        total += n;
        if n == 0 {
            clean.push(c.name.as_str());
            continue;
        }
        let _ = writeln!(
            text,
            "{}: {n} cycle{}",
            c.name,
            if n == 1 { "" } else { "s" }
        );
        for (t, cs) in found {
            for cy in cs {
                write_cycle(&mut text, root, t, &cy, &mut lines);
            }
        }
    }
    let _ = writeln!(
        text,
        "cycles: {total} between sibling modules; clean crates: {}",
        clean.join(", ")
    );
    (text, total)
}

fn write_cycle(text: &mut String, root: &Path, t: &Target, cy: &Cycle, lines: &mut SourceLines) {
    let parent = if cy.parent.is_empty() {
        "crate".to_string()
    } else {
        format!("crate::{}", cy.parent.join("::"))
    };
    let _ = writeln!(
        text,
        "  {} {} ({}), under {parent}: {}",
        t.kind,
        t.root.display(),
        cy.members.len(),
        cy.circle.join(" -> ")
    );
    for (name, file) in &cy.members {
        let _ = writeln!(text, "    {name}: {}", file.display());
    }
    for (from, to, ev) in &cy.edges {
        let more = match ev.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        let first = &ev[0];
        let _ = writeln!(
            text,
            "    {from} -> {to}: {}:{}: {}{more}",
            first.file.display(),
            first.line,
            lines.get(root, &first.file, first.line)
        );
    }
}

/// Files' lines, read once each, for quoting the import that makes an edge.
#[derive(Default)]
struct SourceLines(HashMap<PathBuf, Vec<String>>);

impl SourceLines {
    fn get(&mut self, root: &Path, file: &Path, line: u32) -> String {
        let lines = self.0.entry(file.to_path_buf()).or_insert_with(|| {
            std::fs::read_to_string(root.join(file))
                .unwrap_or_default()
                .lines()
                .map(|l| l.trim().to_string())
                .collect()
        });
        lines.get(line as usize - 1).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workspace itself: every crate scanned, its module files found, and the crates
    /// listed that must stay free of cycles.
    #[test]
    fn the_workspace() {
        let root = crate::root();
        let crates = modtree::workspace(&root).expect("the workspace reads");
        let names: Vec<&str> = crates.iter().map(|c| c.name.as_str()).collect();
        for c in [
            "turnstile",
            "turnstile-cli",
            "turnstile-tower",
            "turnstile-server",
            "turnstile-redis",
            "xtask",
        ] {
            assert!(names.contains(&c), "{c} not among {names:?}");
        }
        let missing: Vec<&String> = crates
            .iter()
            .flat_map(|c| &c.targets)
            .flat_map(|t| &t.missing)
            .collect();
        assert!(
            missing.is_empty(),
            "mod declarations without a file: {missing:?}"
        );
        let all: Vec<&Crate> = crates.iter().collect();
        let (text, _) = report(&root, &all);
        println!("{text}");
        let clean_line = text.lines().last().expect("a summary");
        for c in CLEAN {
            assert!(
                clean_line
                    .split(": ")
                    .last()
                    .is_some_and(|l| l.split(", ").any(|n| n == *c)),
                "{c} has a cycle between sibling modules:\n{text}"
            );
        }
    }

    /// The crates that are free of cycles, kept so by this test.
    const CLEAN: &[&str] = &["turnstile-tower", "xtask", "loom-tests"];
}
