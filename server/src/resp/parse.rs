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
    /// Whether these are the bounds of a client that has not authenticated yet: a frame over
    /// them is then refused in Redis's words for that case (`unauthenticated multibulk
    /// length`, `unauthenticated bulk length`).
    pub unauthenticated: bool,
}

impl Bounds {
    /// What a client that has not authenticated may send: Redis 7 allows 10 arguments of
    /// 16 KiB; `AUTH admin <password>` and `HELLO 3 AUTH user <password> SETNAME name` need
    /// at most 7 short ones, so the arguments here are of 1 KiB.
    pub const UNAUTHENTICATED: Bounds = Bounds {
        max_args: 10,
        max_bulk: 1024,
        max_inline: 1024,
        unauthenticated: true,
    };

    /// The most bytes one command within these bounds can take: an array of `max_args` bulk
    /// strings of `max_bulk` bytes with their headers, or an inline line. A connection's input
    /// buffer never needs more to hold a whole command.
    pub const fn max_frame(&self) -> usize {
        // "*N\r\n" then per argument "$N\r\n" + bytes + "\r\n"; each count line at most
        // MAX_COUNT_LINE + 1 bytes.
        let array = (MAX_COUNT_LINE + 1) + self.max_args * (MAX_COUNT_LINE + 1 + self.max_bulk + 2);
        let inline = self.max_inline + 2;
        if array > inline {
            array
        } else {
            inline
        }
    }
}

impl Default for Bounds {
    /// The defaults of `turnstile serve` once authenticated: 16 arguments of 4 KiB, inline
    /// lines of 16 KiB.
    fn default() -> Self {
        Self {
            max_args: 16,
            max_bulk: 4096,
            max_inline: 16 * 1024,
            unauthenticated: false,
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
    /// Before authentication: more arguments than [`Bounds::UNAUTHENTICATED`] allows.
    UnauthenticatedMultibulkLength,
    /// Before authentication: a longer argument than [`Bounds::UNAUTHENTICATED`] allows.
    UnauthenticatedBulkLength,
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
            ProtocolError::UnauthenticatedMultibulkLength => {
                f.write_str("unauthenticated multibulk length")
            }
            ProtocolError::UnauthenticatedBulkLength => f.write_str("unauthenticated bulk length"),
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
        return Err(if bounds.unauthenticated {
            ProtocolError::UnauthenticatedMultibulkLength
        } else {
            ProtocolError::MultibulkLength
        });
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
        if len < 0 {
            return Err(ProtocolError::BulkLength);
        }
        if len as u64 > bounds.max_bulk as u64 {
            return Err(if bounds.unauthenticated {
                ProtocolError::UnauthenticatedBulkLength
            } else {
                ProtocolError::BulkLength
            });
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
        if args.last().is_some_and(|r| r.len() > bounds.max_bulk) {
            return Err(if bounds.unauthenticated {
                ProtocolError::UnauthenticatedBulkLength
            } else {
                ProtocolError::BulkLength
            });
        }
        if args.len() > bounds.max_args {
            return Err(if bounds.unauthenticated {
                ProtocolError::UnauthenticatedMultibulkLength
            } else {
                ProtocolError::MultibulkLength
            });
        }
    }
    Ok(Parsed::Command { consumed: nl + 1 })
}

#[cfg(test)]
pub(crate) mod tests {
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

    /// `parts` as a client sends them: an array of bulk strings.
    pub(crate) fn cmd(parts: &[&[u8]]) -> Vec<u8> {
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
        assert_eq!(parse(b"*17\r\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(
            parse(b"*99999999999999999999\r\n"),
            Err(ProtocolError::MultibulkLength)
        );
        assert_eq!(
            parse(b"*1\r\n:1\r\n"),
            Err(ProtocolError::ExpectedBulk(b':'))
        );
        assert_eq!(parse(b"*1\r\n$-1\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(parse(b"*1\r\n$4097\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(
            parse(b"*1\r\n$2\r\nabc\r\n"),
            Err(ProtocolError::BulkTerminator)
        );
        assert_eq!(
            parse(b"*1\r\n$111111111111111111111111"),
            Err(ProtocolError::CountTooBig)
        );
        assert_eq!(
            parse(&vec![b'a'; 16 * 1024 + 1]),
            Err(ProtocolError::InlineTooBig)
        );
        assert_eq!(parse(&vec![b'a'; 16 * 1024]), Ok(None));
        // An inline argument is bounded like a bulk string.
        let mut long = vec![b'a'; 4097];
        long.extend_from_slice(b"\r\n");
        assert_eq!(parse(&long), Err(ProtocolError::BulkLength));
        assert_eq!(parse(b"*0\r\n").unwrap().unwrap(), (vec![], 4));
        assert_eq!(parse(b"*-1\r\n").unwrap().unwrap(), (vec![], 5));
        assert_eq!(
            ProtocolError::ExpectedBulk(b':').to_string(),
            "Protocol error: expected '$', got ':'"
        );
    }

    #[test]
    fn unauthenticated_bounds() {
        let mut args = Vec::new();
        let b = Bounds::UNAUTHENTICATED;
        assert_eq!(
            parse_command(b"*11\r\n", &b, &mut args),
            Err(ProtocolError::UnauthenticatedMultibulkLength)
        );
        assert_eq!(
            parse_command(b"*2\r\n$4\r\nAUTH\r\n$1025\r\n", &b, &mut args),
            Err(ProtocolError::UnauthenticatedBulkLength)
        );
        assert_eq!(
            ProtocolError::UnauthenticatedBulkLength.to_string(),
            "Protocol error: unauthenticated bulk length"
        );
        let mut line = b"AUTH ".to_vec();
        line.extend(vec![b'x'; 1025]);
        line.extend_from_slice(b"\r\n");
        // Longer than the inline bound before it is longer than an argument.
        assert_eq!(
            parse_command(&line, &b, &mut args),
            Err(ProtocolError::InlineTooBig)
        );
        assert_eq!(
            parse_command(b"*2\r\n$4\r\nAUTH\r\n$3\r\nabc\r\n", &b, &mut args),
            Ok(Parsed::Command { consumed: 23 })
        );
    }

    proptest! {
        /// No command within the bounds is longer than `max_frame`.
        #[test]
        fn max_frame_bounds_every_command(n in 1usize..6, len in 0usize..40) {
            let b = Bounds { max_args: n, max_bulk: len, max_inline: 8, unauthenticated: false };
            let parts: Vec<Vec<u8>> = (0..n).map(|_| vec![b'k'; len]).collect();
            let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            let buf = cmd(&refs);
            let mut args = Vec::new();
            prop_assert_eq!(parse_command(&buf, &b, &mut args), Ok(Parsed::Command { consumed: buf.len() }));
            prop_assert!(buf.len() <= b.max_frame());
        }

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
