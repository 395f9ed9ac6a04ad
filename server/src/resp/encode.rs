//! The reply encoder: RESP2, or RESP3 after `HELLO 3`, appended to a connection's output buffer
//! (no allocation once the buffer has grown).
//!
//! The two protocols differ only in the types RESP2 lacks: a null is `$-1` (RESP2) or `_`
//! (RESP3), a map is a flat array of twice its length (RESP2) or `%n` (RESP3).

/// Protocol version of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// RESP2, the default.
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

/// Appends replies to a buffer.
pub struct Out<'a> {
    /// The connection's output buffer.
    pub buf: &'a mut Vec<u8>,
    /// Which protocol to speak.
    pub proto: Proto,
}

impl Out<'_> {
    fn line(&mut self, t: u8, s: &[u8]) {
        self.buf.push(t);
        self.buf.extend_from_slice(s);
        self.buf.extend_from_slice(b"\r\n");
    }
    fn count(&mut self, t: u8, n: i64) {
        let mut b = itoa::Buffer::new();
        self.line(t, b.format(n).as_bytes());
    }
    /// `+OK`-style status. `s` must not hold `\r` or `\n`.
    pub fn simple(&mut self, s: &str) {
        debug_assert!(!s.contains(['\r', '\n']));
        self.line(b'+', s.as_bytes());
    }
    /// An error line: `msg` starts with its code (`ERR ...`, `NOAUTH ...`). Any `\r` or `\n` in
    /// it becomes a space (an error is one line).
    pub fn error(&mut self, msg: &str) {
        self.buf.push(b'-');
        self.buf.extend(
            msg.bytes()
                .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
        self.buf.extend_from_slice(b"\r\n");
    }
    /// An integer.
    pub fn int(&mut self, n: i64) {
        self.count(b':', n);
    }
    /// A bulk string.
    pub fn bulk(&mut self, s: &[u8]) {
        self.count(b'$', s.len() as i64);
        self.buf.extend_from_slice(s);
        self.buf.extend_from_slice(b"\r\n");
    }
    /// A null.
    pub fn null(&mut self) {
        match self.proto {
            Proto::Resp2 => self.buf.extend_from_slice(b"$-1\r\n"),
            Proto::Resp3 => self.buf.extend_from_slice(b"_\r\n"),
        }
    }
    /// The header of an array of `n` elements (the elements follow).
    pub fn array(&mut self, n: usize) {
        self.count(b'*', n as i64);
    }
    /// The header of a map of `n` pairs (the keys and values follow, alternating).
    pub fn map(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => self.count(b'*', 2 * n as i64),
            Proto::Resp3 => self.count(b'%', n as i64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_protocols() {
        for (proto, want) in [
            (
                Proto::Resp2,
                &b"+OK\r\n-ERR a  b\r\n:-7\r\n$2\r\nhi\r\n$-1\r\n*2\r\n*4\r\n"[..],
            ),
            (
                Proto::Resp3,
                &b"+OK\r\n-ERR a  b\r\n:-7\r\n$2\r\nhi\r\n_\r\n*2\r\n%2\r\n"[..],
            ),
        ] {
            let mut buf = Vec::new();
            let mut o = Out {
                buf: &mut buf,
                proto,
            };
            o.simple("OK");
            o.error("ERR a\r\nb");
            o.int(-7);
            o.bulk(b"hi");
            o.null();
            o.array(2);
            o.map(2);
            assert_eq!(buf, want);
        }
    }
}
