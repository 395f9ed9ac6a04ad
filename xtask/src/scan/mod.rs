//! One Rust source file read for its structure, with a small hand-written scanner (xtask has no
//! dependencies, so no `syn`): the `mod` declarations, every module path it names (`use` trees
//! with their `{…}` groups, and `crate::…`, `super::…`, `self::…` paths anywhere, function
//! bodies included), and the line span of every function. Code under `#[cfg(test)]` or
//! `#[test]` is left out: a test may reach anywhere to build its fixtures.
//!
//! What it does not see: paths written inside `macro_rules!` with `$crate`, and modules named
//! through a glob import of an ancestor (`use super::*;` then `sibling::f()`), which only
//! tests do here.

mod lex;
#[cfg(test)]
mod tests;

use lex::{Kind, Tok};

/// What one file holds.
#[derive(Debug, Default)]
pub struct FileScan {
    pub mods: Vec<ModDecl>,
    pub refs: Vec<PathRef>,
    pub fns: Vec<FnSpan>,
}

/// A `mod name;` or `mod name { … }` outside test code.
#[derive(Debug, PartialEq, Eq)]
pub struct ModDecl {
    /// The inline modules of this file it is declared in (empty at the file's top level).
    pub scope: Vec<String>,
    pub name: String,
    /// `mod name { … }`: its items are in this file.
    pub inline: bool,
    /// The value of a `#[path = "…"]` attribute.
    pub path_attr: Option<String>,
    pub line: u32,
}

/// A module path named in the file: `use` trees expanded one path per leaf, or a path in code.
#[derive(Debug, PartialEq, Eq)]
pub struct PathRef {
    /// The inline modules of this file it is written in.
    pub scope: Vec<String>,
    /// The segments as written, `crate`/`super`/`self` included; a `use` leaf's trailing
    /// `self` and a glob's `*` are dropped, a renaming `as` is not kept.
    pub segments: Vec<String>,
    pub line: u32,
}

/// A function with a body: from its `fn` keyword's line to its closing brace's, both counted.
#[derive(Debug, PartialEq, Eq)]
pub struct FnSpan {
    pub name: String,
    pub first: u32,
    pub last: u32,
}

impl FnSpan {
    /// Its length in lines.
    pub fn lines(&self) -> u32 {
        self.last + 1 - self.first
    }
}

/// Scans one file's text.
pub fn scan(src: &str) -> FileScan {
    let toks = lex::tokens(src);
    let mut s = Scanner {
        t: &toks,
        i: 0,
        out: FileScan::default(),
        stack: Vec::new(),
        scope: Vec::new(),
        test_attr: false,
        path_attr: None,
        fn_body: None,
    };
    s.run();
    s.out
}

/// What a `{` opened.
enum Open {
    Mod,
    Fn { name: String, first: u32 },
    Other,
}

struct Scanner<'t> {
    t: &'t [Tok],
    i: usize,
    out: FileScan,
    stack: Vec<Open>,
    scope: Vec<String>,
    /// The attributes read since the last item: a test-only one, a `#[path]`.
    test_attr: bool,
    path_attr: Option<String>,
    /// The index of the `{` that opens the body of the function whose `fn` was just read.
    fn_body: Option<(usize, String, u32)>,
}

impl<'t> Scanner<'t> {
    fn at(&self, k: usize) -> Option<&'t Tok> {
        self.t.get(self.i + k)
    }

    fn run(&mut self) {
        while let Some(tok) = self.t.get(self.i) {
            if tok.is("#") {
                self.attribute();
                continue;
            }
            if self.test_attr {
                self.skip_item();
                self.test_attr = false;
                self.path_attr = None;
                continue;
            }
            match &tok.kind {
                Kind::Ident(w) if w == "use" => self.use_decl(),
                Kind::Ident(w) if w == "mod" => self.mod_decl(),
                Kind::Ident(w) if w == "fn" => self.fn_header(),
                Kind::Ident(w) if matches!(w.as_str(), "crate" | "super" | "self") => {
                    self.code_path()
                }
                Kind::Punct("{") => {
                    let open = match self.fn_body.take() {
                        Some((at, name, first)) if at == self.i => Open::Fn { name, first },
                        other => {
                            self.fn_body = other;
                            Open::Other
                        }
                    };
                    self.stack.push(open);
                    self.path_attr = None;
                    self.i += 1;
                }
                Kind::Punct("}") => {
                    self.close(tok.line);
                    self.i += 1;
                }
                Kind::Punct(";") => {
                    self.path_attr = None;
                    self.i += 1;
                }
                _ => self.i += 1,
            }
        }
    }

    fn close(&mut self, line: u32) {
        match self.stack.pop() {
            Some(Open::Mod) => {
                self.scope.pop();
            }
            Some(Open::Fn { name, first }) => self.out.fns.push(FnSpan {
                name,
                first,
                last: line,
            }),
            Some(Open::Other) | None => {}
        }
    }

    /// `#[…]` or `#![…]`: notes whether it makes the next item test-only, or gives its path.
    fn attribute(&mut self) {
        let mut j = self.i + 1;
        if self.t.get(j).is_some_and(|t| t.is("!")) {
            j += 1;
        }
        if !self.t.get(j).is_some_and(|t| t.is("[")) {
            self.i += 1;
            return;
        }
        let end = matching(self.t, j);
        let body = &self.t[j + 1..end.min(self.t.len())];
        let inner = self.t[self.i + 1].is("!");
        if !inner {
            self.test_attr |= is_test_attr(body);
            if let [name, eq, Tok {
                kind: Kind::Str(p), ..
            }] = body
            {
                if name.is_ident("path") && eq.is("=") {
                    self.path_attr = Some(p.clone());
                }
            }
        }
        self.i = end + 1;
    }

    /// Past the item a test-only attribute stands on: to its `;` or `,`, or its closing `}`,
    /// or up to a `}` that closes what encloses it.
    fn skip_item(&mut self) {
        let mut depth = 0usize;
        while let Some(t) = self.t.get(self.i) {
            match &t.kind {
                Kind::Punct("(" | "[" | "{") => depth += 1,
                Kind::Punct(")" | "]") => depth = depth.saturating_sub(1),
                Kind::Punct("}") if depth == 0 => return,
                Kind::Punct("}") => {
                    depth -= 1;
                    if depth == 0 {
                        self.i += 1;
                        return;
                    }
                }
                Kind::Punct(";" | ",") if depth == 0 => {
                    self.i += 1;
                    return;
                }
                _ => {}
            }
            self.i += 1;
        }
    }

    /// `mod name;` or `mod name {`.
    fn mod_decl(&mut self) {
        let (Some(name), Some(next)) = (self.at(1).and_then(Tok::ident), self.at(2)) else {
            self.i += 1;
            return;
        };
        let inline = next.is("{");
        if !inline && !next.is(";") {
            self.i += 1;
            return;
        }
        self.out.mods.push(ModDecl {
            scope: self.scope.clone(),
            name: name.to_string(),
            inline,
            path_attr: self.path_attr.take(),
            line: self.t[self.i].line,
        });
        if inline {
            self.scope.push(name.to_string());
            self.stack.push(Open::Mod);
        }
        self.i += 3;
    }

    /// `fn name …`: finds where its body opens (none for a declaration ending in `;`).
    fn fn_header(&mut self) {
        let Some(name) = self.at(1).and_then(Tok::ident).map(str::to_string) else {
            self.i += 1; // `fn(u8) -> u8`, a pointer type
            return;
        };
        let first = self.t[self.i].line;
        let mut depth = 0usize;
        let mut j = self.i + 2;
        while let Some(t) = self.t.get(j) {
            match &t.kind {
                Kind::Punct("(" | "[") => depth += 1,
                Kind::Punct(")" | "]") => depth = depth.saturating_sub(1),
                Kind::Punct("{") if depth == 0 => {
                    self.fn_body = Some((j, name, first));
                    break;
                }
                Kind::Punct(";" | "}") if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        self.i += 2;
    }

    /// `use …;`: one reference per leaf of the tree.
    fn use_decl(&mut self) {
        self.i += 1;
        let mut leaves = Vec::new();
        use_tree(self.t, &mut self.i, Vec::new(), &mut leaves);
        for (segments, line) in leaves {
            if !segments.is_empty() {
                self.out.refs.push(PathRef {
                    scope: self.scope.clone(),
                    segments,
                    line,
                });
            }
        }
        while self.t.get(self.i).is_some_and(|t| !t.is(";")) {
            self.i += 1;
        }
        self.path_attr = None;
    }

    /// `crate::a::b`, `super::x`, `self::y` in code (not `$crate::…`, not `pub(in crate::…)`).
    fn code_path(&mut self) {
        let prev = |k: usize| self.i.checked_sub(k).and_then(|p| self.t.get(p));
        let macro_crate = prev(1).is_some_and(|t| t.is("$"));
        let visibility = prev(1).is_some_and(|t| t.is_ident("in"))
            && prev(2).is_some_and(|t| t.is("("))
            && prev(3).is_some_and(|t| t.is_ident("pub"));
        if macro_crate || !self.at(1).is_some_and(|t| t.is("::")) {
            self.i += 1;
            return;
        }
        let line = self.t[self.i].line;
        let mut segments = vec![self.t[self.i].ident().unwrap_or_default().to_string()];
        self.i += 1;
        while let (Some(sep), Some(seg)) = (self.at(0), self.at(1)) {
            match seg.ident() {
                Some(s) if sep.is("::") => {
                    segments.push(s.to_string());
                    self.i += 2;
                }
                _ => break,
            }
        }
        if !visibility {
            self.out.refs.push(PathRef {
                scope: self.scope.clone(),
                segments,
                line,
            });
        }
    }
}

/// The index of the bracket closing the one at `open` (or the end of the tokens).
fn matching(t: &[Tok], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, tok) in t.iter().enumerate().skip(open) {
        match &tok.kind {
            Kind::Punct("(" | "[" | "{") => depth += 1,
            Kind::Punct(")" | "]" | "}") => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    t.len()
}

/// `test`, or `cfg(test)`, or `cfg(all(…, test, …))`: the item exists in test builds only.
fn is_test_attr(body: &[Tok]) -> bool {
    let words: Vec<&str> = body.iter().filter_map(Tok::ident).collect();
    match words.as_slice() {
        ["test"] => true,
        ["cfg", "test"] => true,
        ["cfg", "all", rest @ ..] => rest.contains(&"test") && !rest.contains(&"not"),
        _ => false,
    }
}

/// One use tree from `*i` (after `use` or inside a group): pushes each leaf's full path and
/// the line of its last segment; leaves `*i` on the `,`, `}` or `;` that ends it.
fn use_tree(t: &[Tok], i: &mut usize, prefix: Vec<String>, out: &mut Vec<(Vec<String>, u32)>) {
    let mut path = prefix;
    let mut line = t.get(*i).map_or(0, |t| t.line);
    while let Some(tok) = t.get(*i) {
        match &tok.kind {
            Kind::Punct("::") => *i += 1,
            Kind::Punct("*") => *i += 1,
            Kind::Ident(w) if w == "as" => *i += 2,
            Kind::Ident(w) => {
                path.push(w.clone());
                line = tok.line;
                *i += 1;
            }
            Kind::Punct("{") => {
                *i += 1;
                while t.get(*i).is_some_and(|t| !t.is("}")) {
                    let before = *i;
                    use_tree(t, i, path.clone(), out);
                    if t.get(*i).is_some_and(|t| t.is(",")) {
                        *i += 1;
                    } else if *i == before {
                        return; // not a use tree (a `;` inside a group): stop here
                    }
                }
                *i += 1;
                return;
            }
            _ => break,
        }
    }
    if path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    out.push((path, line));
}
