//! Reading a log file line by line with bounded memory: one buffer per file (at least
//! [`BUFFER`] bytes, twice the longest line accepted), lines handed out as ranges of it (no
//! allocation per line), gzip recognised by its magic bytes and inflated on the fly
//! (concatenated members too, as logrotate's `compress` and `cat a.gz b.gz` make them).

use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{self, Read};
use std::ops::Range;
use std::path::Path;

/// Bytes read at once (and the least the buffer holds).
pub const BUFFER: usize = 1 << 20;

/// One line from [`Lines::next`].
pub enum Line {
    /// The line's bytes in [`Lines::buf`], without its `\n` or `\r\n`.
    Text(Range<usize>),
    /// A line longer than the limit: its length; its bytes were skipped.
    TooLong(u64),
}

/// The lines of one file.
pub struct Lines {
    src: Box<dyn Read + Send>,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    max_line: usize,
    /// 1-based number of the line last returned.
    pub line_no: u64,
    /// Whether the file is gzip-compressed.
    pub gzip: bool,
}

impl Lines {
    /// Opens `path` (`-`: standard input); lines longer than `max_line` bytes are skipped
    /// and reported as [`Line::TooLong`].
    pub fn open(path: &Path, max_line: usize) -> io::Result<Lines> {
        let src: Box<dyn Read + Send> = if path == Path::new("-") {
            Box::new(io::stdin())
        } else {
            Box::new(File::open(path)?)
        };
        Self::new(src, max_line)
    }

    /// Lines of `src`, inflated if it starts with gzip's magic bytes.
    pub fn new(mut src: Box<dyn Read + Send>, max_line: usize) -> io::Result<Lines> {
        let mut head = [0u8; 2];
        let mut n = 0;
        while n < 2 {
            match src.read(&mut head[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let chained = Box::new(io::Cursor::new(head[..n].to_vec()).chain(src));
        let gzip = head[..n] == [0x1f, 0x8b];
        let src: Box<dyn Read + Send> = if gzip {
            Box::new(MultiGzDecoder::new(io::BufReader::with_capacity(
                BUFFER, chained,
            )))
        } else {
            chained
        };
        Ok(Lines {
            src,
            buf: vec![0; BUFFER.max(2 * max_line)],
            start: 0,
            end: 0,
            eof: false,
            max_line,
            line_no: 0,
            gzip,
        })
    }

    /// The buffer the ranges of [`Line::Text`] index.
    #[inline]
    pub fn buf(&self) -> &[u8] {
        &self.buf
    }

    /// The next line, `None` at the end of the file.
    pub fn next(&mut self) -> io::Result<Option<Line>> {
        let mut skipped: Option<u64> = None;
        loop {
            let pending = &self.buf[self.start..self.end];
            if let Some(i) = memchr::memchr(b'\n', pending) {
                let s = self.start;
                self.start += i + 1;
                self.line_no += 1;
                if let Some(k) = skipped {
                    return Ok(Some(Line::TooLong(k + i as u64)));
                }
                let e = if i > 0 && self.buf[s + i - 1] == b'\r' {
                    s + i - 1
                } else {
                    s + i
                };
                if e - s > self.max_line {
                    return Ok(Some(Line::TooLong((e - s) as u64)));
                }
                return Ok(Some(Line::Text(s..e)));
            }
            if self.eof {
                if self.start == self.end && skipped.is_none() {
                    return Ok(None);
                }
                // The last line, without a newline.
                let (s, e) = (self.start, self.end);
                self.start = e;
                self.line_no += 1;
                if let Some(k) = skipped {
                    return Ok(Some(Line::TooLong(k + (e - s) as u64)));
                }
                if e - s > self.max_line {
                    return Ok(Some(Line::TooLong((e - s) as u64)));
                }
                return Ok(Some(Line::Text(s..e)));
            }
            if self.end - self.start > self.max_line {
                // Too long already: drop what is buffered and skip to the next newline.
                *skipped.get_or_insert(0) += (self.end - self.start) as u64;
                self.start = 0;
                self.end = 0;
            }
            self.fill()?;
        }
    }

    /// Moves the pending bytes to the front and reads more after them.
    fn fill(&mut self) -> io::Result<()> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(());
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn all(data: Vec<u8>, max: usize) -> Vec<Result<Vec<u8>, u64>> {
        let mut l = Lines::new(Box::new(io::Cursor::new(data)), max).unwrap();
        let mut out = Vec::new();
        while let Some(x) = l.next().unwrap() {
            out.push(match x {
                Line::Text(r) => Ok(l.buf()[r].to_vec()),
                Line::TooLong(n) => Err(n),
            });
        }
        out
    }

    #[test]
    fn lines_long_lines_and_gzip() {
        let text = b"a\r\nbb\n\nccc".to_vec();
        let want: Vec<Result<Vec<u8>, u64>> = vec![
            Ok(b"a".to_vec()),
            Ok(b"bb".to_vec()),
            Ok(vec![]),
            Ok(b"ccc".to_vec()),
        ];
        assert_eq!(all(text.clone(), 100), want);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&text).unwrap();
        assert_eq!(all(gz.finish().unwrap(), 100), want);
        // A line over the limit, within one buffer and across several.
        let mut big = b"x\n".to_vec();
        big.extend(std::iter::repeat_n(b'y', 3 * BUFFER + 5));
        big.extend(b"\nz\n");
        assert_eq!(
            all(big, 10),
            vec![
                Ok(b"x".to_vec()),
                Err(3 * BUFFER as u64 + 5),
                Ok(b"z".to_vec())
            ]
        );
        assert_eq!(
            all(b"0123456789ab\nq".to_vec(), 10),
            vec![Err(12), Ok(b"q".to_vec())]
        );
    }
}
