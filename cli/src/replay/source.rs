//! The files of a replay as one stream in time order: each file read line by line
//! ([`Lines`]), parsed and checked into a [`Record`], put back in time order within
//! `--reorder`'s window ([`Reorder`]), its times made non-decreasing (a line earlier than one
//! already replayed from the same file is replayed at that one's time, and counted), and the
//! files merged by a k-way merge on (time, file, line) — a binary heap of one entry per file.
//! Lines that do not parse are counted, the first few kept as examples.

use super::fields::{slice, Mapping, Record, Target};
use super::format::{self, Format, Parser};
use super::input::{Line, Lines};
use super::keys::View;
use super::reorder::Reorder;
use super::template::{Spans, Template};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use turnstile::rules::Request;

/// Examples of bad lines kept.
pub const EXAMPLES: usize = 5;

/// Lines that were not replayed.
#[derive(Default, Debug)]
pub struct Bad {
    /// Lines that do not parse or whose parts are wrong.
    pub count: u64,
    /// The first few: `file:line: why: excerpt`.
    pub examples: Vec<String>,
}

impl Bad {
    fn add(&mut self, file: &Path, line: u64, why: &str, text: &[u8]) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(format!(
                "{}:{line}: {why}: {}",
                file.display(),
                format::excerpt(text)
            ));
        }
    }
}

/// What the files held.
#[derive(Default, Debug)]
pub struct Counts {
    /// Lines read (blank ones included).
    pub lines: u64,
    /// Lines replayed.
    pub records: u64,
    /// Blank lines and `#` comments.
    pub skipped: u64,
    /// Lines earlier than a line before them in their file, replayed at that line's time.
    pub late: u64,
    /// The most such a line was early, ns.
    pub max_late_ns: u64,
    /// Bytes of the lines read (after decompression).
    pub bytes: u64,
}

/// How the files are read: the format, `--log-format`, `--key`s, the longest line.
pub struct Setup {
    pub format: Format,
    pub custom: Option<Template>,
    pub given: Vec<(Target, String)>,
    pub max_line: usize,
    /// `--reorder`, ns (0: lines are taken in file order).
    pub reorder: u64,
}

/// One file: its reader, parser and current record.
pub struct Source {
    pub path: PathBuf,
    lines: Lines,
    parser: Parser,
    mapping: Mapping,
    spans: Spans,
    scratch: Vec<u8>,
    line: Range<usize>,
    rec: Record,
    last: u64,
    max_line: usize,
    /// With `--reorder`: the held records, and the bytes of the current one.
    hold: Option<Reorder>,
    held_line: Vec<u8>,
    held_scratch: Vec<u8>,
    eof: bool,
    /// The format read.
    pub format: Format,
}

impl Source {
    /// Whether the file is gzip-compressed.
    pub fn gzip(&self) -> bool {
        self.lines.gzip
    }
}

impl Source {
    /// Opens `path`, reads its first line to learn (or check) the format, and reads its first
    /// record. `Ok(None)` for a file without any.
    pub fn open(
        path: &Path,
        setup: &Setup,
        bad: &mut Bad,
        counts: &mut Counts,
    ) -> crate::Result<Option<Source>> {
        let fail = |e: crate::Error| format!("{}: {e}", path.display());
        let mut lines = Lines::open(path, setup.max_line).map_err(|e| fail(e.into()))?;
        // The first non-blank line: the header or the format's evidence.
        let first = loop {
            match lines.next().map_err(|e| fail(e.into()))? {
                None => return Ok(None),
                Some(Line::TooLong(n)) => {
                    counts.lines += 1;
                    bad.add(path, lines.line_no, &too_long(n, setup.max_line), b"");
                }
                Some(Line::Text(r)) => {
                    counts.lines += 1;
                    if lines.buf()[r.clone()].trim_ascii().is_empty() {
                        counts.skipped += 1;
                        continue;
                    }
                    break r;
                }
            }
        };
        let text = &lines.buf()[first.clone()];
        let format = match (setup.custom.is_some(), setup.format) {
            (true, _) => Format::Auto,
            (false, Format::Auto) => format::detect(text).map_err(fail)?,
            (false, f) => f,
        };
        let is_header = Parser::takes_header(format);
        let (parser, mapping) = Parser::new(
            format,
            setup.custom.as_ref(),
            &setup.given,
            is_header.then_some(text),
        )
        .map_err(fail)?;
        counts.bytes += text.len() as u64 + 1;
        let mut s = Source {
            path: path.to_path_buf(),
            lines,
            parser,
            mapping,
            spans: std::array::from_fn(|_| 0..0),
            scratch: Vec::new(),
            line: first.clone(),
            rec: Record::default(),
            last: 0,
            max_line: setup.max_line,
            hold: (setup.reorder > 0).then(|| Reorder::new(setup.reorder)),
            held_line: Vec::new(),
            held_scratch: Vec::new(),
            eof: false,
            format,
        };
        if !is_header && s.take(first.clone(), bad, counts) {
            if s.hold.is_none() {
                s.accept(first, counts);
                return Ok(Some(s));
            }
            s.hold_current(first, counts);
        }
        Ok(s.advance(bad, counts)?.then_some(s))
    }

    /// The mapping, as `part=$field` items.
    pub fn mapping(&self) -> &[String] {
        &self.mapping.described
    }

    /// Parses line `r` into the current record; whether it is one.
    #[inline]
    fn take(&mut self, r: Range<usize>, bad: &mut Bad, counts: &mut Counts) -> bool {
        let line = &self.lines.buf()[r.clone()];
        let parsed = self
            .parser
            .parse(line, &mut self.spans, &mut self.scratch)
            .and_then(|()| {
                self.rec
                    .fill(&self.mapping, &self.spans, line, &self.scratch)
            });
        if let Err(why) = parsed {
            bad.add(&self.path, self.lines.line_no, why, line);
            return false;
        }
        counts.records += 1;
        true
    }

    /// Makes the record just taken from line `r` the current one, in file order.
    #[inline]
    fn accept(&mut self, r: Range<usize>, counts: &mut Counts) {
        if self.rec.time < self.last {
            counts.late += 1;
            counts.max_late_ns = counts.max_late_ns.max(self.last - self.rec.time);
            self.rec.time = self.last;
        }
        self.last = self.rec.time;
        self.line = r;
    }

    /// Holds the record just taken from line `r` for reordering.
    fn hold_current(&mut self, r: Range<usize>, counts: &mut Counts) {
        let Some(h) = self.hold.as_mut() else { return };
        let line = &self.lines.buf()[r];
        if let Some(late) = h.push(self.rec.clone(), line, &self.scratch) {
            counts.late += 1;
            counts.max_late_ns = counts.max_late_ns.max(late);
        }
    }

    /// With `--reorder`: the next record released, made the current one.
    fn release(&mut self) -> bool {
        let Some(h) = self.hold.as_mut() else {
            return false;
        };
        let Some(mut held) = h.pop(self.eof) else {
            return false;
        };
        self.rec = held.rec.clone();
        std::mem::swap(&mut self.held_line, &mut held.line);
        std::mem::swap(&mut self.held_scratch, &mut held.scratch);
        h.recycle(held.line, held.scratch);
        true
    }

    /// Reads up to the next record; `false` at the end of the file.
    pub fn advance(&mut self, bad: &mut Bad, counts: &mut Counts) -> crate::Result<bool> {
        loop {
            if self.release() {
                return Ok(true);
            }
            if self.eof {
                return Ok(false);
            }
            let next = self
                .lines
                .next()
                .map_err(|e| format!("{}: {e}", self.path.display()))?;
            let r = match next {
                None if self.hold.is_some() => {
                    self.eof = true;
                    continue;
                }
                None => return Ok(false),
                Some(Line::TooLong(n)) => {
                    counts.lines += 1;
                    let why = too_long(n, self.max_line);
                    bad.add(&self.path, self.lines.line_no, &why, b"");
                    continue;
                }
                Some(Line::Text(r)) => r,
            };
            counts.lines += 1;
            counts.bytes += (r.end - r.start) as u64 + 1;
            let line = &self.lines.buf()[r.clone()];
            if line.is_empty() || line[0] == b'#' || line.trim_ascii().is_empty() {
                counts.skipped += 1;
                continue;
            }
            if self.take(r.clone(), bad, counts) {
                if self.hold.is_none() {
                    self.accept(r, counts);
                    return Ok(true);
                }
                self.hold_current(r, counts);
            }
        }
    }

    /// The current record's time, ns since the Unix epoch.
    #[inline]
    pub fn time(&self) -> u64 {
        self.rec.time
    }

    /// The current record as a request.
    #[inline]
    pub fn view(&self) -> View<'_> {
        let (line, scratch) = match self.hold {
            None => (&self.lines.buf()[self.line.clone()], &self.scratch[..]),
            Some(_) => (&self.held_line[..], &self.held_scratch[..]),
        };
        let s = |r: &Range<u32>| -> Option<&str> {
            if r.start == r.end {
                return None;
            }
            let b = slice(line, scratch, r);
            // SAFETY: `Record::fill` checked that this span of this line (or of the scratch
            // buffer) is UTF-8, and neither has changed since (a held record's are copies of
            // them): they change only in `advance`, which takes `&mut self` while this view
            // borrows `self`. (Checking again cost a few
            // per cent of a replay, measured with perf.)
            Some(unsafe { std::str::from_utf8_unchecked(b) })
        };
        let rec = &self.rec;
        let mut req = Request::new();
        req.customer = rec.customer;
        req.ip = rec.ip;
        req.api_key = s(&rec.api_key);
        req.route = s(&rec.route);
        req.method = s(&rec.method);
        req.priority = rec.priority;
        req.cost = rec.cost;
        View {
            req,
            customer_text: s(&rec.customer_text).unwrap_or(""),
        }
    }
}

fn too_long(n: u64, max: usize) -> String {
    format!("a line of {n} bytes, longer than --max-line {max}")
}

/// The files merged in time order (ties: the earlier file on the command line first).
pub struct Merge {
    pub sources: Vec<Source>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
}

impl Merge {
    pub fn new(sources: Vec<Source>) -> Merge {
        let heap = sources
            .iter()
            .enumerate()
            .map(|(i, s)| Reverse((s.time(), i)))
            .collect();
        Merge { sources, heap }
    }

    /// The file whose record comes next, or `None` when all are done. After using its record,
    /// call [`Merge::advance`] with it.
    #[inline]
    pub fn peek(&self) -> Option<usize> {
        if self.sources.len() == 1 {
            return (!self.heap.is_empty()).then_some(0);
        }
        self.heap.peek().map(|Reverse((_, i))| *i)
    }

    /// Moves file `i` (the one [`Merge::peek`] gave) to its next record.
    #[inline]
    pub fn advance(&mut self, i: usize, bad: &mut Bad, counts: &mut Counts) -> crate::Result<()> {
        let more = self.sources[i].advance(bad, counts)?;
        if self.sources.len() == 1 {
            if !more {
                self.heap.clear();
            }
            return Ok(());
        }
        match (more, self.heap.peek_mut()) {
            (true, Some(mut top)) => *top = Reverse((self.sources[i].time(), i)),
            (false, Some(top)) => {
                std::collections::binary_heap::PeekMut::pop(top);
            }
            _ => {}
        }
        Ok(())
    }
}
