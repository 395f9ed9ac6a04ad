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

/// Longest integer line: a type byte, a sign and 19 digits, `\r\n`.
const INT_LINE: usize = 23;

/// Writes `t`, `n` in decimal and `\r\n` at `at` in `out` (at least [`INT_LINE`] bytes free
/// there); returns the new end. A byte loop on a stack buffer: a reply is then appended with
/// one copy instead of three per integer (measured with callgrind, docs/service.md).
#[inline]
fn int_line(out: &mut [u8], mut at: usize, t: u8, n: i64) -> usize {
    out[at] = t;
    at += 1;
    if n < 0 {
        out[at] = b'-';
        at += 1;
    }
    let mut v = n.unsigned_abs();
    // Most integers of a reply are below 100: written without the digit buffer.
    if v < 100 {
        if v >= 10 {
            out[at] = b'0' + (v / 10) as u8;
            at += 1;
        }
        out[at] = b'0' + (v % 10) as u8;
        out[at + 1] = b'\r';
        out[at + 2] = b'\n';
        return at + 3;
    }
    let mut digits = [0u8; 20];
    let mut k = digits.len();
    loop {
        k -= 1;
        digits[k] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for &d in &digits[k..] {
        out[at] = d;
        at += 1;
    }
    out[at] = b'\r';
    out[at + 1] = b'\n';
    at + 2
}

impl Out<'_> {
    fn line(&mut self, t: u8, s: &[u8]) {
        self.buf.push(t);
        self.buf.extend_from_slice(s);
        self.buf.extend_from_slice(b"\r\n");
    }
    fn count(&mut self, t: u8, n: i64) {
        let mut b = [0u8; INT_LINE];
        let end = int_line(&mut b, 0, t, n);
        self.buf.extend_from_slice(&b[..end]);
    }
    /// An array of integers (a `CL.THROTTLE` reply), appended in one copy.
    pub fn ints<const N: usize>(&mut self, v: &[i64; N]) {
        let mut b = [0u8; 6 * INT_LINE];
        if (N + 1) * INT_LINE > b.len() {
            self.array(N);
            for &x in v {
                self.int(x);
            }
            return;
        }
        let mut at = int_line(&mut b, 0, b'*', N as i64);
        for &x in v {
            at = int_line(&mut b, at, b':', x);
        }
        self.buf.extend_from_slice(&b[..at]);
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
    /// An error line written from format arguments, straight into the buffer (no string is
    /// made first): `-`, the text with any `\r` or `\n` as a space, `\r\n`.
    pub fn error_fmt(&mut self, args: std::fmt::Arguments<'_>) {
        struct Line<'b>(&'b mut Vec<u8>);
        impl std::fmt::Write for Line<'_> {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                self.0.extend(
                    s.bytes()
                        .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
                );
                Ok(())
            }
        }
        self.buf.push(b'-');
        let _ = std::fmt::Write::write_fmt(&mut Line(self.buf), args);
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
    /// A text reply: a verbatim string (`=N\r\ntxt:...`) in RESP3, a bulk string in RESP2.
    pub fn verbatim(&mut self, s: &[u8]) {
        match self.proto {
            Proto::Resp2 => self.bulk(s),
            Proto::Resp3 => {
                self.count(b'=', s.len() as i64 + 4);
                self.buf.extend_from_slice(b"txt:");
                self.buf.extend_from_slice(s);
                self.buf.extend_from_slice(b"\r\n");
            }
        }
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
    /// The header of a set of `n` elements: `~n` in RESP3, an array in RESP2.
    pub fn set(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => self.count(b'*', n as i64),
            Proto::Resp3 => self.count(b'~', n as i64),
        }
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

    #[test]
    fn integers_as_itoa_writes_them() {
        let mut xs = vec![
            0,
            1,
            -1,
            9,
            10,
            99,
            100,
            12345,
            i64::MAX,
            i64::MIN,
            i64::MIN + 1,
        ];
        let mut x = 1i64;
        while let Some(y) = x.checked_mul(10) {
            xs.extend([y - 1, y, y + 1, -y, 1 - y]);
            x = y;
        }
        let mut want = Vec::new();
        let mut buf = Vec::new();
        let mut o = Out {
            buf: &mut buf,
            proto: Proto::Resp2,
        };
        for &x in &xs {
            o.int(x);
            want.extend_from_slice(format!(":{x}\r\n").as_bytes());
        }
        o.ints(&[3, -1, i64::MIN, i64::MAX, 0]);
        want.extend_from_slice(
            format!(
                "*5\r\n:3\r\n:-1\r\n:{}\r\n:{}\r\n:0\r\n",
                i64::MIN,
                i64::MAX
            )
            .as_bytes(),
        );
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            String::from_utf8(want).unwrap()
        );
    }
}
