//! A YAML document as a tree of nodes that know their line and column.
//!
//! `yaml-rust2`'s event parser gives each event its position; its own `Yaml` tree drops them,
//! so this module builds a small tree of its own from the events. Every error the loader
//! reports can then name the line and column of the node at fault, not only of syntax errors.
//!
//! Aliases (`*anchor`) are expanded by copying the anchored node. The whole document is
//! bounded to [`MAX_NODES`] nodes after expansion, so a "billion laughs" document is refused
//! with an error instead of exhausting memory.

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// The most nodes one document may expand to (aliases included).
pub const MAX_NODES: usize = 1_000_000;
/// The deepest nesting accepted.
pub const MAX_DEPTH: usize = 256;

/// A position in the source: 1-based line and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pos {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

impl Pos {
    fn of(m: &Marker) -> Self {
        // yaml-rust2 markers: line 1-based, column 0-based.
        Pos {
            line: m.line(),
            column: m.col() + 1,
        }
    }
}

/// One node of the tree.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// A scalar and whether it was plain (unquoted: `true`, `12` and `~` mean what they say).
    Scalar(String, bool),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order.
    Map(Vec<(Node, Node)>),
}

/// A node and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What it is.
    pub kind: Kind,
    /// Where it starts.
    pub pos: Pos,
}

impl Node {
    /// A plain `~`, `null`, or empty scalar.
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar(s, true) if matches!(s.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }
    /// What the node is, in words, for error messages.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Scalar(s, _) if self.is_null() => format!("null `{s}`"),
            Kind::Scalar(s, _) => format!("`{}`", shorten(s)),
            Kind::Seq(_) => "a list".into(),
            Kind::Map(_) => "a mapping".into(),
        }
    }
}

/// Cuts long text for error messages.
pub fn shorten(s: &str) -> String {
    if s.chars().count() <= 60 {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(57).collect();
        t.push_str("...");
        t
    }
}

/// A syntax error and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    /// Where.
    pub pos: Pos,
    /// What.
    pub message: String,
}

#[derive(Default)]
struct Builder {
    stack: Vec<(Node, Option<Node>, usize)>, // (container, pending map key, anchor id)
    anchors: Vec<(usize, Node)>,
    docs: Vec<Node>,
    nodes: usize,
    error: Option<SyntaxError>,
}

impl Builder {
    fn count(&mut self, n: usize, pos: Pos) -> bool {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > MAX_NODES && self.error.is_none() {
            self.error = Some(SyntaxError {
                pos,
                message: format!("the document expands to more than {MAX_NODES} nodes (aliases included); write it out smaller"),
            });
        }
        self.error.is_none()
    }

    fn push_value(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.push((anchor, node.clone()));
        }
        match self.stack.last_mut() {
            None => self.docs.push(node),
            Some((parent, pending, _)) => match &mut parent.kind {
                Kind::Seq(items) => items.push(node),
                Kind::Map(entries) => match pending.take() {
                    None => {
                        // A block mapping's start event is marked after its first key: the
                        // mapping starts where its first key does.
                        if entries.is_empty() {
                            parent.pos = node.pos;
                        }
                        *pending = Some(node)
                    }
                    Some(k) => entries.push((k, node)),
                },
                Kind::Scalar(..) => {}
            },
        }
    }
}

fn size(n: &Node) -> usize {
    match &n.kind {
        Kind::Scalar(..) => 1,
        Kind::Seq(v) => 1 + v.iter().map(size).sum::<usize>(),
        Kind::Map(v) => 1 + v.iter().map(|(k, v)| size(k) + size(v)).sum::<usize>(),
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        let pos = Pos::of(&mark);
        match ev {
            Event::Scalar(v, style, anchor, _) => {
                if self.count(1, pos) {
                    let plain = style == TScalarStyle::Plain;
                    self.push_value(
                        Node {
                            kind: Kind::Scalar(v, plain),
                            pos,
                        },
                        anchor,
                    );
                }
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    self.error = Some(SyntaxError {
                        pos,
                        message: format!("nested deeper than {MAX_DEPTH} levels"),
                    });
                    return;
                }
                if self.count(1, pos) {
                    let kind = if matches!(ev, Event::SequenceStart(..)) {
                        Kind::Seq(Vec::new())
                    } else {
                        Kind::Map(Vec::new())
                    };
                    self.stack.push((Node { kind, pos }, None, anchor));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, _, anchor)) = self.stack.pop() {
                    self.push_value(node, anchor);
                }
            }
            Event::Alias(id) => {
                let found = self
                    .anchors
                    .iter()
                    .rev()
                    .find(|(a, _)| *a == id)
                    .map(|(_, n)| n.clone());
                match found {
                    Some(mut n) => {
                        if self.count(size(&n), pos) {
                            n.pos = pos;
                            self.push_value(n, 0);
                        }
                    }
                    None => {
                        self.error = Some(SyntaxError {
                            pos,
                            message: "an alias to an unknown anchor".into(),
                        })
                    }
                }
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

/// Parses `text` into its documents' trees (an empty text has none).
pub fn parse(text: &str) -> Result<Vec<Node>, SyntaxError> {
    let mut b = Builder::default();
    let mut parser = Parser::new_from_str(text);
    if let Err(e) = parser.load(&mut b, true) {
        return Err(SyntaxError {
            pos: Pos::of(e.marker()),
            message: e.info().to_string(),
        });
    }
    if let Some(e) = b.error {
        return Err(e);
    }
    Ok(b.docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based() {
        let docs = parse("a: 1\nb:\n  - x\n").unwrap();
        let Kind::Map(m) = &docs[0].kind else {
            panic!()
        };
        assert_eq!(m[0].0.pos, Pos { line: 1, column: 1 });
        assert_eq!(m[1].0.pos, Pos { line: 2, column: 1 });
        let Kind::Seq(s) = &m[1].1.kind else { panic!() };
        assert_eq!(s[0].pos, Pos { line: 3, column: 5 });
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(e.pos.line >= 1, "{e:?}");
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut t = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for c in 'b'..='k' {
            t.push_str(&format!(
                "{c}: &{c} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
            prev = c;
        }
        let e = parse(&t).unwrap_err();
        assert!(e.message.contains("nodes"), "{e:?}");
    }

    #[test]
    fn aliases_expand() {
        let docs = parse("a: &x {k: v}\nb: *x\n").unwrap();
        let Kind::Map(m) = &docs[0].kind else {
            panic!()
        };
        assert_eq!(m[0].1.kind, m[1].1.kind);
    }
}
