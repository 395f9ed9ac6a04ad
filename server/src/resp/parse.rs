//! The request parser: a pure function over a byte buffer.
//!
//! A client sends a command as an array of bulk strings (`*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n`)
//! or, typed by hand, as an inline line (`ECHO hi\r\n`). [`parse_command`] looks at the front of
//! the buffer and answers [`Parsed::Incomplete`] (read more and call again), a command (the
//! argument ranges and the bytes it took), or a [`ProtocolError`] (reply it, then close the
//! connection, as Redis does). It never reads past the buffer, never panics, and bounds every
//! length it is given ([`Bounds`]) before it trusts it, so a client cannot make the server hold
//! more than one bounded frame. The network loop only fills the buffer and writes replies, so
//! the parser is fuzzed alone (`fuzz/fuzz_targets/resp.rs`).
//!
//! Argument ranges go into a caller-owned `Vec` that the connection reuses: no allocation per
//! command once it has grown to the largest command seen.

use std::fmt;
use std::ops::Range;

/// Limits on what one command may declare. A frame over a limit is a protocol error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Most arguments in one command (the `*N` of the array).
    pub max_args: usize,
    /// Longest bulk string (the `$N`), in bytes.
    pub max_bulk: usize,
    /// Longest inline command line, in bytes (Redis: 64 KiB).
    pub max_inline: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_args: 1024,
            max_bulk: 512 * 1024,
            max_inline: 64 * 1024,
        }
    }
}

/// What the front of the buffer holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not a whole command yet: read more bytes and parse again from the same start.
    Incomplete,
    /// A command of `args.len()` arguments (filled in by [`parse_command`]) that took the first
    /// `consumed` bytes. An empty command (`*0`, a blank line) has no arguments: skip it.
    Command {
        /// Bytes of the buffer this command took.
        consumed: usize,
    },
}

/// A malformed or oversized frame. Its `Display` is Redis's wording after `ERR `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// `*` not followed by a valid count, or a count over [`Bounds::max_args`].
    MultibulkLength,
    /// `$` not followed by a valid length, or a length over [`Bounds::max_bulk`].
    BulkLength,
    /// An array element that is not a bulk string.
    ExpectedBulk(u8),
    /// A bulk string not followed by `\r\n`.
    BulkTerminator,
    /// An inline line longer than [`Bounds::max_inline`].
    InlineTooBig,
    /// A count line longer than any valid count (the line never ends in time).
    CountTooBig,
    /// Unbalanced quotes in an inline command.
    UnbalancedQuotes,
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Protocol error: ")?;
        match self {
            ProtocolError::MultibulkLength => f.write_str("invalid multibulk length"),
            ProtocolError::BulkLength => f.write_str("invalid bulk length"),
            ProtocolError::ExpectedBulk(b) => {
                write!(f, "expected '$', got '{}'", char::from(*b).escape_default())
            }
            ProtocolError::BulkTerminator => f.write_str("bulk string not ended by CRLF"),
            ProtocolError::InlineTooBig => f.write_str("too big inline request"),
            ProtocolError::CountTooBig => f.write_str("too big count string"),
            ProtocolError::UnbalancedQuotes => f.write_str("unbalanced quotes in request"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Longest count line accepted: a sign and 19 digits (`i64`), then `\r`.
const MAX_COUNT_LINE: usize = 21;

/// Parses one command at the front of `buf`. On [`Parsed::Command`], `args` holds the ranges
/// of its arguments in `buf` (cleared first). See the module docs.
pub fn parse_command(
    buf: &[u8],
    bounds: &Bounds,
    args: &mut Vec<Range<usize>>,
) -> Result<Parsed, ProtocolError> {
    args.clear();
    match buf.first() {
        None => Ok(Parsed::Incomplete),
        Some(b'*') => parse_multibulk(buf, bounds, args),
        Some(_) => parse_inline(buf, bounds, args),
    }
}

/// The index of the `\r\n` ending the line that starts at `from`, looking at most `max` bytes
/// ahead. `Ok(None)`: not there yet; `Err(())`: longer than `max`.
#[inline]
fn line_end(buf: &[u8], from: usize, max: usize) -> Result<Option<usize>, ()> {
    let rest = buf.get(from..).unwrap_or(&[]);
    let window = &rest[..rest.len().min(max.saturating_add(1))];
    match window.iter().position(|&b| b == b'\n') {
        Some(i) => Ok(Some(from + i)),
        None if rest.len() > max => Err(()),
        None => Ok(None),
    }
}

/// A decimal count between a type byte and `\r\n`: `Some(n)` for 0..=i64::MAX, `Some(-1)`
/// style negatives as `None` (the callers decide), `Err` for anything else.
fn parse_count(digits: &[u8]) -> Result<i64, ()> {
    let (neg, d) = match digits.split_first() {
        Some((b'-', d)) => (true, d),
        _ => (false, digits),
    };
    if d.is_empty() || d.len() > 19 {
        return Err(());
    }
    let mut n: i64 = 0;
    for &c in d {
        if !c.is_ascii_digit() {
            return Err(());
        }
        n = n
            .checked_mul(10)
            .ok_or(())?
            .checked_add((c - b'0') as i64)
            .ok_or(())?;
    }
    Ok(if neg { -n } else { n })
}

/// The count on the line starting at `at` (after its type byte), and where the next line
/// starts. `Ok(None)`: incomplete.
fn count_line(
    buf: &[u8],
    at: usize,
    too_big: ProtocolError,
    invalid: ProtocolError,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    // The common case in one pass: up to 18 digits, then "\r\n" (no sign, no overflow). Any
    // other line takes the general path below, which gives the same count or the error.
    let mut i = at + 1;
    let mut n: i64 = 0;
    while i < buf.len() && i - at <= 18 && buf[i].is_ascii_digit() {
        n = n * 10 + i64::from(buf[i] - b'0');
        i += 1;
    }
    if i > at + 1 && buf.get(i) == Some(&b'\r') && buf.get(i + 1) == Some(&b'\n') {
        return Ok(Some((n, i + 2)));
    }
    let nl = match line_end(buf, at + 1, MAX_COUNT_LINE) {
        Ok(Some(nl)) => nl,
        Ok(None) => return Ok(None),
        Err(()) => return Err(too_big),
    };
    // The line must end in "\r\n" and hold at least one byte besides the type.
    if nl < at + 2 || buf[nl - 1] != b'\r' {
        return Err(invalid);
    }
    let n = parse_count(&buf[at + 1..nl - 1]).map_err(|()| invalid)?;
    Ok(Some((n, nl + 1)))
}

fn parse_multibulk(
    buf: &[u8],
    bounds: &Bounds,
    args: &mut Vec<Range<usize>>,
) -> Result<Parsed, ProtocolError> {
    let (n, mut pos) = match count_line(
        buf,
        0,
        ProtocolError::CountTooBig,
        ProtocolError::MultibulkLength,
    )? {
        Some(x) => x,
        None => return Ok(Parsed::Incomplete),
    };
    // Redis treats `*0` and `*-1` as an empty command.
    if n <= 0 {
        return Ok(Parsed::Command { consumed: pos });
    }
    if n as u64 > bounds.max_args as u64 {
        return Err(ProtocolError::MultibulkLength);
    }
    for _ in 0..n {
        let Some(&t) = buf.get(pos) else {
            return Ok(Parsed::Incomplete);
        };
        if t != b'$' {
            return Err(ProtocolError::ExpectedBulk(t));
        }
        let (len, start) = match count_line(
            buf,
            pos,
            ProtocolError::CountTooBig,
            ProtocolError::BulkLength,
        )? {
            Some(x) => x,
            None => return Ok(Parsed::Incomplete),
        };
        if len < 0 || len as u64 > bounds.max_bulk as u64 {
            return Err(ProtocolError::BulkLength);
        }
        let end = start + len as usize;
        // The string and its "\r\n".
        if buf.len() < end + 2 {
            return Ok(Parsed::Incomplete);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError::BulkTerminator);
        }
        args.push(start..end);
        pos = end + 2;
    }
    Ok(Parsed::Command { consumed: pos })
}

/// An inline command: arguments separated by spaces or tabs, ended by `\n` (a `\r` before it
/// is dropped). Double-quoted arguments may hold spaces; single-quoted ones too; no escapes are
/// interpreted (Redis interprets `\xHH` and friends inside double quotes; clients that need
/// binary arguments send arrays).
fn parse_inline(
    buf: &[u8],
    bounds: &Bounds,
    args: &mut Vec<Range<usize>>,
) -> Result<Parsed, ProtocolError> {
    let nl = match line_end(buf, 0, bounds.max_inline) {
        Ok(Some(nl)) => nl,
        Ok(None) => return Ok(Parsed::Incomplete),
        Err(()) => return Err(ProtocolError::InlineTooBig),
    };
    let line_stop = if nl > 0 && buf[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    };
    let mut i = 0;
    while i < line_stop {
        let c = buf[i];
        if c == b' ' || c == b'\t' {
            i += 1;
            continue;
        }
        if c == b'"' || c == b'\'' {
            let close = buf[i + 1..line_stop]
                .iter()
                .position(|&b| b == c)
                .ok_or(ProtocolError::UnbalancedQuotes)?;
            let end = i + 1 + close;
            // A closing quote must be followed by a space or the end of the line.
            if end + 1 < line_stop && !matches!(buf[end + 1], b' ' | b'\t') {
                return Err(ProtocolError::UnbalancedQuotes);
            }
            args.push(i + 1..end);
            i = end + 1;
        } else {
            let start = i;
            while i < line_stop && !matches!(buf[i], b' ' | b'\t') {
                i += 1;
            }
            args.push(start..i);
        }
        if args.len() > bounds.max_args {
            return Err(ProtocolError::MultibulkLength);
        }
    }
    Ok(Parsed::Command { consumed: nl + 1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A command's arguments and the bytes it took.
    type Cmd = (Vec<Vec<u8>>, usize);

    fn parse(buf: &[u8]) -> Result<Option<Cmd>, ProtocolError> {
        let mut args = Vec::new();
        match parse_command(buf, &Bounds::default(), &mut args)? {
            Parsed::Incomplete => Ok(None),
            Parsed::Command { consumed } => Ok(Some((
                args.iter().map(|r| buf[r.clone()].to_vec()).collect(),
                consumed,
            ))),
        }
    }

    fn cmd(parts: &[&[u8]]) -> Vec<u8> {
        let mut v = format!("*{}\r\n", parts.len()).into_bytes();
        for p in parts {
            v.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
            v.extend_from_slice(p);
            v.extend_from_slice(b"\r\n");
        }
        v
    }

    #[test]
    fn arrays_and_pipelines() {
        let mut buf = cmd(&[b"ECHO", b"hi\r\nthere"]);
        let one = buf.len();
        buf.extend(cmd(&[b"PING"]));
        let (args, used) = parse(&buf).unwrap().unwrap();
        assert_eq!(args, vec![b"ECHO".to_vec(), b"hi\r\nthere".to_vec()]);
        assert_eq!(used, one);
        let (args, used) = parse(&buf[one..]).unwrap().unwrap();
        assert_eq!(args, vec![b"PING".to_vec()]);
        assert_eq!(one + used, buf.len());
        // Every strict prefix is incomplete.
        for i in 0..one {
            assert_eq!(parse(&buf[..i]).unwrap(), None, "prefix {i}");
        }
    }

    #[test]
    fn inline() {
        let (args, used) = parse(b"  CL.THROTTLE  k 1\t2 \"a b\" 'c'\r\nPING")
            .unwrap()
            .unwrap();
        assert_eq!(
            args,
            vec![
                b"CL.THROTTLE".to_vec(),
                b"k".to_vec(),
                b"1".to_vec(),
                b"2".to_vec(),
                b"a b".to_vec(),
                b"c".to_vec()
            ]
        );
        assert_eq!(used, 32);
        assert_eq!(parse(b"PING\n").unwrap().unwrap().0, vec![b"PING".to_vec()]);
        assert_eq!(parse(b"\r\n").unwrap().unwrap().0, Vec::<Vec<u8>>::new());
        assert_eq!(parse(b"PING"), Ok(None));
        assert_eq!(
            parse(b"ECHO \"ab\r\n"),
            Err(ProtocolError::UnbalancedQuotes)
        );
        assert_eq!(
            parse(b"ECHO \"a\"b\r\n"),
            Err(ProtocolError::UnbalancedQuotes)
        );
    }

    #[test]
    fn errors_in_redis_words() {
        assert_eq!(parse(b"*x\r\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(parse(b"*\r\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(parse(b"*1\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(parse(b"*1025\r\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(
            parse(b"*99999999999999999999\r\n"),
            Err(ProtocolError::MultibulkLength)
        );
        assert_eq!(
            parse(b"*1\r\n:1\r\n"),
            Err(ProtocolError::ExpectedBulk(b':'))
        );
        assert_eq!(parse(b"*1\r\n$-1\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(parse(b"*1\r\n$524289\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(
            parse(b"*1\r\n$2\r\nabc\r\n"),
            Err(ProtocolError::BulkTerminator)
        );
        assert_eq!(
            parse(b"*1\r\n$111111111111111111111111"),
            Err(ProtocolError::CountTooBig)
        );
        assert_eq!(
            parse(&vec![b'a'; 64 * 1024 + 1]),
            Err(ProtocolError::InlineTooBig)
        );
        assert_eq!(parse(&vec![b'a'; 64 * 1024]), Ok(None));
        assert_eq!(parse(b"*0\r\n").unwrap().unwrap(), (vec![], 4));
        assert_eq!(parse(b"*-1\r\n").unwrap().unwrap(), (vec![], 5));
        assert_eq!(
            ProtocolError::ExpectedBulk(b':').to_string(),
            "Protocol error: expected '$', got ':'"
        );
    }

    proptest! {
        /// Any command, encoded as an array, parses back to itself, whatever the split point;
        /// every prefix is incomplete.
        #[test]
        fn roundtrip(parts in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..8), junk in prop::collection::vec(any::<u8>(), 0..10)) {
            let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            let mut buf = cmd(&refs);
            let n = buf.len();
            for i in 0..n {
                prop_assert_eq!(parse(&buf[..i]).unwrap(), None);
            }
            buf.extend(junk);
            let (args, used) = parse(&buf).unwrap().unwrap();
            prop_assert_eq!(args, parts);
            prop_assert_eq!(used, n);
        }

        /// Arbitrary bytes: no panic; a command's ranges lie inside what it consumed.
        #[test]
        fn arbitrary(buf in prop::collection::vec(any::<u8>(), 0..200)) {
            let mut args = Vec::new();
            if let Ok(Parsed::Command { consumed }) = parse_command(&buf, &Bounds::default(), &mut args) {
                prop_assert!(consumed > 0 && consumed <= buf.len());
                for r in &args {
                    prop_assert!(r.start <= r.end && r.end <= consumed);
                }
            }
        }
    }
}
