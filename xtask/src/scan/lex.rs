//! The tokens of a Rust source file, as much as `cargo xtask cycles` and `size` need: identifiers
//! (keywords among them), punctuation (`::` as one token), and literals reduced to a marker.
//! Comments, strings, raw strings, byte and C strings, and char literals are skipped, so that a
//! path inside a doc comment or a string is never taken for an import; a lifetime (`'a`) is
//! told apart from a char literal (`'a'`).

/// One token and the 1-based line it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tok {
    pub kind: Kind,
    pub line: u32,
}

/// What a token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An identifier or keyword (`r#` stripped from a raw identifier).
    Ident(String),
    /// One punctuation character, or `::`.
    Punct(&'static str),
    /// A plain string literal's text between its quotes, escapes as written (for
    /// `#[path = "…"]`).
    Str(String),
    /// Any other literal (raw, byte or C string, char, number); its content does not matter.
    Lit,
    /// A lifetime or label (`'a`).
    Lifetime,
}

impl Tok {
    /// The identifier's text, if this is one.
    pub fn ident(&self) -> Option<&str> {
        match &self.kind {
            Kind::Ident(s) => Some(s),
            _ => None,
        }
    }

    /// Whether this is the punctuation `p`.
    pub fn is(&self, p: &str) -> bool {
        matches!(self.kind, Kind::Punct(q) if q == p)
    }

    /// Whether this is the identifier or keyword `s`.
    pub fn is_ident(&self, s: &str) -> bool {
        self.ident() == Some(s)
    }
}

const PUNCT: &[&str] = &[
    "{", "}", "(", ")", "[", "]", ";", ",", ":", "#", "!", "=", "<", ">", "*", "&", "$", ".", "-",
    "+", "/", "%", "^", "|", "?", "@", "~",
];

/// The tokens of `src`. Never fails: an unterminated literal or comment ends at the end of the
/// text, and a character it does not know is skipped.
pub fn tokens(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0usize, 1u32);
    while i < b.len() {
        let c = b[i];
        let start_line = line;
        let push = |out: &mut Vec<Tok>, kind| {
            out.push(Tok {
                kind,
                line: start_line,
            })
        };
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            _ if c.is_ascii_whitespace() => i += 1,
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => i = block_comment(b, i, &mut line),
            b'"' => {
                let end = quoted(b, i + 1, b'"', &mut line);
                let text = src.get(i + 1..end.saturating_sub(1)).unwrap_or("");
                push(&mut out, Kind::Str(text.to_string()));
                i = end;
            }
            b'\'' => {
                let (end, kind) = quote_or_lifetime(b, i);
                i = end;
                push(&mut out, kind);
            }
            _ if c.is_ascii_digit() => {
                i = number(b, i);
                push(&mut out, Kind::Lit);
            }
            _ if c == b'_' || c.is_ascii_alphabetic() => {
                if let Some(end) = prefixed_literal(b, i, &mut line) {
                    i = end;
                    push(&mut out, Kind::Lit);
                    continue;
                }
                let (end, word) = ident(src, i);
                i = end;
                push(&mut out, Kind::Ident(word));
            }
            b':' if b.get(i + 1) == Some(&b':') => {
                i += 2;
                push(&mut out, Kind::Punct("::"));
            }
            _ => {
                if c.is_ascii() {
                    let s = &src[i..i + 1];
                    if let Some(p) = PUNCT.iter().find(|p| **p == s) {
                        push(&mut out, Kind::Punct(p));
                    }
                }
                // A non-ASCII character (in an identifier or a literal already skipped):
                // step over the whole UTF-8 sequence.
                i += src[i..].chars().next().map_or(1, char::len_utf8);
            }
        }
    }
    out
}

/// Past a `/* … */` comment starting at `i`, nested ones included.
fn block_comment(b: &[u8], mut i: usize, line: &mut u32) -> usize {
    let mut depth = 0usize;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            depth += 1;
            i += 2;
        } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            if b[i] == b'\n' {
                *line += 1;
            }
            i += 1;
        }
    }
    i
}

/// Past a literal closed by `close` whose body starts at `i`, with `\` escapes.
fn quoted(b: &[u8], mut i: usize, close: u8, line: &mut u32) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => {
                if b.get(i + 1) == Some(&b'\n') {
                    *line += 1;
                }
                i += 2;
            }
            b'\n' => {
                *line += 1;
                i += 1;
            }
            c if c == close => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// At a `'`: a char literal (`'a'`, `'\n'`, `'\u{1F600}'`, `'é'`) or a lifetime (`'a`).
fn quote_or_lifetime(b: &[u8], i: usize) -> (usize, Kind) {
    if b.get(i + 1) == Some(&b'\\') {
        let mut j = i + 2;
        while j < b.len() && b[j] != b'\'' {
            j += 1;
        }
        return (j + 1, Kind::Lit);
    }
    // One character (possibly several UTF-8 bytes) then a quote: a char literal.
    let width = match b.get(i + 1) {
        Some(&c) if c < 0x80 => 1,
        Some(&c) if c >= 0xF0 => 4,
        Some(&c) if c >= 0xE0 => 3,
        Some(_) => 2,
        None => return (i + 1, Kind::Lit),
    };
    if b.get(i + 1 + width) == Some(&b'\'') {
        return (i + 2 + width, Kind::Lit);
    }
    let mut j = i + 1;
    while j < b.len() && (b[j] == b'_' || b[j].is_ascii_alphanumeric()) {
        j += 1;
    }
    (j, Kind::Lifetime)
}

/// Past a number literal (`1_000`, `0x1F`, `1.5e3`, `2u64`) starting at `i`.
fn number(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        let c = b[i];
        let fraction = c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit);
        if c == b'_' || c.is_ascii_alphanumeric() || fraction {
            i += 1;
        } else {
            break;
        }
    }
    i
}

/// At an identifier's first byte: a prefixed literal (`b"…"`, `b'…'`, `c"…"`, `r"…"`,
/// `r#"…"#`, `br#"…"#`, `cr"…"`) if there is one, and where it ends.
fn prefixed_literal(b: &[u8], i: usize, line: &mut u32) -> Option<usize> {
    let mut j = i;
    if matches!(b[j], b'b' | b'c') {
        j += 1;
        match b.get(j) {
            Some(b'"') => return Some(quoted(b, j + 1, b'"', line)),
            Some(b'\'') if b[i] == b'b' => return Some(quoted(b, j + 1, b'\'', line)),
            _ => {}
        }
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j + hashes) == Some(&b'#') {
        hashes += 1;
    }
    if b.get(j + hashes) != Some(&b'"') {
        return None; // `r#ident`, or an identifier that starts with r, b or c
    }
    let mut k = j + hashes + 1;
    while k < b.len() {
        if b[k] == b'\n' {
            *line += 1;
        }
        if b[k] == b'"' && (1..=hashes).all(|h| b.get(k + h) == Some(&b'#')) {
            return Some(k + 1 + hashes);
        }
        k += 1;
    }
    Some(k)
}

/// An identifier starting at `i` (a raw `r#name` gives `name`), and where it ends.
fn ident(src: &str, i: usize) -> (usize, String) {
    let b = src.as_bytes();
    let start = if b[i] == b'r' && b.get(i + 1) == Some(&b'#') {
        i + 2
    } else {
        i
    };
    let mut j = start;
    while j < b.len() && (b[j] == b'_' || b[j].is_ascii_alphanumeric() || b[j] >= 0x80) {
        j += src[j..].chars().next().map_or(1, char::len_utf8);
    }
    (j, src[start..j].to_string())
}
