//! `--reorder DURATION`: lines put back in time order within a bounded window. Proxies write a
//! line when the response ends (AWS ALB, Envoy), so a file's lines are in order of completion,
//! not of arrival. Each record is held (a copy of its line) until a record at least
//! `DURATION` newer has been read, then released in time order; at most [`MAX_BYTES`] are
//! held (past it, the oldest is released early). A record older than one already released is
//! replayed at that one's time and counted as late.

use super::fields::Record;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// The most bytes of lines held at once.
pub const MAX_BYTES: usize = 32 << 20;

/// A record held back, with the bytes its spans index.
pub struct Held {
    pub rec: Record,
    pub line: Vec<u8>,
    pub scratch: Vec<u8>,
    seq: u64,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    /// Reversed: the heap's top is the oldest (by time, then by line order).
    fn cmp(&self, o: &Self) -> Ordering {
        (o.rec.time, o.seq).cmp(&(self.rec.time, self.seq))
    }
}

/// The held records of one file.
pub struct Reorder {
    window: u64,
    heap: BinaryHeap<Held>,
    bytes: usize,
    seq: u64,
    newest: u64,
    /// The time of the last record released.
    pub released: u64,
    spare: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Reorder {
    /// Holds records for `window` ns.
    pub fn new(window: u64) -> Reorder {
        Reorder {
            window,
            heap: BinaryHeap::new(),
            bytes: 0,
            seq: 0,
            newest: 0,
            released: 0,
            spare: Vec::new(),
        }
    }

    /// Holds `rec` (its spans indexing `line` and `scratch`, copied). Returns how much earlier
    /// than the last released record it was, if it was (it is then held at that time).
    pub fn push(&mut self, mut rec: Record, line: &[u8], scratch: &[u8]) -> Option<u64> {
        let late = (rec.time < self.released).then(|| self.released - rec.time);
        rec.time = rec.time.max(self.released);
        let (mut l, mut s) = self.spare.pop().unwrap_or_default();
        l.clear();
        l.extend_from_slice(line);
        s.clear();
        s.extend_from_slice(scratch);
        self.bytes += l.len() + s.len();
        self.newest = self.newest.max(rec.time);
        self.seq += 1;
        self.heap.push(Held {
            rec,
            line: l,
            scratch: s,
            seq: self.seq,
        });
        late
    }

    /// The oldest record, if it is due: a record `window` newer has been read, the bytes
    /// held are past [`MAX_BYTES`], or `end` (the file is read).
    pub fn pop(&mut self, end: bool) -> Option<Held> {
        let top = self.heap.peek()?;
        let due = end
            || self.bytes > MAX_BYTES
            || top.rec.time.saturating_add(self.window) <= self.newest;
        if !due {
            return None;
        }
        let h = self.heap.pop()?;
        self.bytes -= h.line.len() + h.scratch.len();
        self.released = h.rec.time;
        Some(h)
    }

    /// Takes back the buffers of a released record.
    pub fn recycle(&mut self, line: Vec<u8>, scratch: Vec<u8>) {
        if self.spare.len() < 64 {
            self.spare.push((line, scratch));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: u64) -> Record {
        Record {
            time: t,
            ..Record::default()
        }
    }

    #[test]
    fn released_in_time_order_within_the_window() {
        let mut r = Reorder::new(10);
        let mut out = Vec::new();
        for t in [5, 3, 12, 8, 20, 1, 30] {
            if let Some(late) = r.push(rec(t), b"x", b"") {
                out.push((1000 + t, late));
            }
            while let Some(h) = r.pop(false) {
                out.push((h.rec.time, 0));
                r.recycle(h.line, h.scratch);
            }
        }
        while let Some(h) = r.pop(true) {
            out.push((h.rec.time, 0));
        }
        // 1 came after 8 was released (20 read): late by 7, replayed at 8.
        assert_eq!(
            out,
            vec![
                (3, 0),
                (5, 0),
                (8, 0),
                (1001, 7),
                (8, 0),
                (12, 0),
                (20, 0),
                (30, 0)
            ]
        );
    }
}
