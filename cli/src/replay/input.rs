//! Reading a log file line by line with bounded memory: one buffer per file (at least
//! [`BUFFER`] bytes, twice the longest line accepted), lines handed out as ranges of it (no
//! allocation per line), gzip recognised by its magic bytes and inflated on the fly
//! (concatenated members too, as logrotate's `compress` and `cat a.gz b.gz` make them) on a
//! thread of its own, so that inflating and replaying overlap ([`Inflater`]).

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
            Box::new(Inflater::spawn(MultiGzDecoder::new(
                io::BufReader::with_capacity(BUFFER, chained),
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

/// Chunks of inflated bytes handed from the inflating thread to the reader.
const CHUNKS: usize = 4;

/// A reader whose source is read on a thread of its own, [`BUFFER`]-byte chunks handed over a
/// channel of [`CHUNKS`] and their buffers handed back: at most `CHUNKS + 2` buffers (6 MiB)
/// exist at once. Inflating a gzip log took a third of a replay's CPU on the same thread
/// (`zcat` alone: 4.8 s of 7.2 for a 10M-line log); on its own thread it overlaps the parse.
/// The thread ends when the source does, or when the reader is dropped.
struct Inflater {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    back: std::sync::mpsc::SyncSender<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
    done: bool,
}

impl Inflater {
    fn spawn(mut src: impl Read + Send + 'static) -> Inflater {
        use std::sync::mpsc::sync_channel;
        let (tx, rx) = sync_channel::<io::Result<Vec<u8>>>(CHUNKS);
        let (back, spare) = sync_channel::<Vec<u8>>(CHUNKS);
        std::thread::spawn(move || loop {
            let mut b = spare.try_recv().unwrap_or_default();
            b.resize(BUFFER, 0);
            let mut n = 0;
            let r = loop {
                match src.read(&mut b[n..]) {
                    Ok(0) => break Ok(()),
                    Ok(k) => {
                        n += k;
                        if n == b.len() {
                            break Ok(());
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            b.truncate(n);
            let last = n == 0 || r.is_err();
            let sent = match r {
                Err(e) => tx.send(Err(e)),
                Ok(()) => tx.send(Ok(b)),
            };
            if last || sent.is_err() {
                return;
            }
        });
        Inflater {
            rx,
            back,
            cur: Vec::new(),
            pos: 0,
            done: false,
        }
    }
}

impl Read for Inflater {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            if self.done {
                return Ok(0);
            }
            let spent = std::mem::take(&mut self.cur);
            // The inflating thread may have ended: its buffer is then simply dropped.
            let _ = self.back.try_send(spent);
            self.pos = 0;
            match self.rx.recv() {
                Ok(Ok(b)) if b.is_empty() => self.done = true,
                Ok(Ok(b)) => self.cur = b,
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => self.done = true,
            }
        }
        let n = out.len().min(self.cur.len() - self.pos);
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
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
        // Several chunks of the inflating thread, lines across their edges.
        let many: Vec<u8> = (0..400_000u32)
            .flat_map(|i| format!("{i}\n").into_bytes())
            .collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&many).unwrap();
        let got = all(gz.finish().unwrap(), 100);
        assert_eq!(got.len(), 400_000);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, l)| l.as_deref() == Ok(i.to_string().as_bytes())));
        // A corrupt stream is an error, not a panic or a hang.
        let mut bad = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
        bad.extend(std::iter::repeat_n(0xff, 64));
        let mut l = Lines::new(Box::new(io::Cursor::new(bad)), 100).unwrap();
        assert!(l.next().is_err());
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
