//! The server's log (`--server-log`), read as it grows: lines per second per kind of message
//! (the message with its timestamp left out and every number made `#`, so that "accept
//! failed: ... (os error 24)" from any connection is one kind), and the `panicked` lines.
//! Each line counts in the second of its own timestamp (tracing's RFC 3339 prefix), or, when
//! it has none, in the second it was read. A server flooding its log writes hundreds of
//! thousands of lines a second: a line costs no allocation here but for a new kind.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Kinds of message told apart; the rest count as one.
const MAX_KINDS: usize = 200;
/// The longest kind kept (its start).
const KIND_CHARS: usize = 160;
/// Bytes read at most per look: a log growing faster is skipped over, and said.
const MAX_READ: u64 = 256 << 20;
/// Seconds kept open per kind: a line may come after lines of the next second (threads).
const OPEN_SECONDS: usize = 4;

/// One kind of message.
#[derive(Debug, Default, Clone)]
pub struct KindCount {
    pub lines: u64,
    pub max_per_second: u64,
    /// Its latest seconds, not yet folded into `max_per_second`.
    open: BTreeMap<u64, u64>,
}

impl KindCount {
    fn add(&mut self, second: u64) {
        self.lines += 1;
        *self.open.entry(second).or_default() += 1;
        while self.open.len() > OPEN_SECONDS {
            if let Some((_, n)) = self.open.pop_first() {
                self.max_per_second = self.max_per_second.max(n);
            }
        }
    }

    /// The most lines of one second, the open ones included.
    pub fn max(&self) -> u64 {
        self.open
            .values()
            .copied()
            .fold(self.max_per_second, u64::max)
    }
}

/// The log as read so far.
pub struct Log {
    path: PathBuf,
    offset: u64,
    /// A line not yet ended.
    partial: Vec<u8>,
    pub kinds: HashMap<String, KindCount>,
    pub lines: u64,
    pub skipped_bytes: u64,
    pub panics: Vec<String>,
    pub readable: bool,
    /// The kind of the line being counted.
    scratch: String,
}

impl Log {
    /// The log at `path`: what it holds already is only looked at for panics (at most
    /// [`MAX_READ`] of its end); lines are counted from now on.
    pub fn open(path: &Path) -> Self {
        let mut log = Self {
            path: path.to_path_buf(),
            offset: 0,
            partial: Vec::new(),
            kinds: HashMap::new(),
            lines: 0,
            skipped_bytes: 0,
            panics: Vec::new(),
            readable: false,
            scratch: String::new(),
        };
        let Ok(len) = std::fs::metadata(path).map(|m| m.len()) else {
            return log;
        };
        log.readable = true;
        log.offset = len.saturating_sub(MAX_READ);
        let _ = log.read_new(0, false);
        log.partial.clear();
        log
    }

    /// Reads what was added since the last look; `now` (s) is the second of lines without a
    /// timestamp. Returns the lines read.
    pub fn poll(&mut self, now: u64) -> u64 {
        self.read_new(now, true)
    }

    fn read_new(&mut self, now: u64, count: bool) -> u64 {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            self.readable = false;
            return 0;
        };
        let len = f.metadata().map_or(0, |m| m.len());
        if len < self.offset {
            // Truncated or replaced: from its start.
            self.offset = 0;
            self.partial.clear();
        }
        if len - self.offset > MAX_READ {
            self.skipped_bytes += len - self.offset - MAX_READ;
            self.offset = len - MAX_READ;
            self.partial.clear();
        }
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return 0;
        }
        let mut buf = Vec::new();
        let Ok(n) = f.take(len - self.offset).read_to_end(&mut buf) else {
            return 0;
        };
        self.offset += n as u64;
        let mut read = 0;
        let mut rest = &buf[..];
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            if self.partial.is_empty() {
                self.line(&String::from_utf8_lossy(&rest[..i]), now, count);
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(&rest[..i]);
                self.line(&String::from_utf8_lossy(&whole), now, count);
            }
            rest = &rest[i + 1..];
            read += 1;
        }
        self.partial.extend_from_slice(rest);
        read
    }

    fn line(&mut self, line: &str, now: u64, count: bool) {
        if line.contains("panicked") && self.panics.len() < 3 {
            self.panics.push(line.chars().take(300).collect());
        }
        if !count || line.trim().is_empty() {
            return;
        }
        self.lines += 1;
        let (second, message) = line
            .split_once(char::is_whitespace)
            .and_then(|(ts, rest)| Some((timestamp_second(ts)?, rest)))
            .unwrap_or((now, line));
        let mut kind = std::mem::take(&mut self.scratch);
        kind_into(message, &mut kind);
        if let Some(c) = self.kinds.get_mut(kind.as_str()) {
            c.add(second);
        } else if self.kinds.len() < MAX_KINDS {
            self.kinds.entry(kind.clone()).or_default().add(second);
        } else {
            let other = self.kinds.entry("(other kinds)".into()).or_default();
            other.add(second);
        }
        self.scratch = kind;
    }

    /// The kinds, the most lines in one second first.
    pub fn worst(&self) -> Vec<(&str, &KindCount)> {
        let mut v: Vec<(&str, &KindCount)> =
            self.kinds.iter().map(|(k, c)| (k.as_str(), c)).collect();
        v.sort_by(|a, b| b.1.max().cmp(&a.1.max()).then(a.0.cmp(b.0)));
        v
    }
}

/// A [`Log`] read on a thread of its own (reading a flooded log takes seconds, which the
/// sampler must not wait for) every `every` until [`Follower::finish`].
pub struct Follower {
    /// Lines read so far.
    pub lines: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Log>,
}

impl Follower {
    /// Follows `log`, its lines without a timestamp counted in the second since `t0`.
    pub fn start(mut log: Log, t0: Instant, every: Duration) -> std::io::Result<Self> {
        let lines = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (n, st) = (lines.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("soak-log".into())
            .spawn(move || {
                // Relaxed: a flag and a count; the Log itself comes back through join.
                while !st.load(Ordering::Relaxed) {
                    std::thread::sleep(every);
                    log.poll(t0.elapsed().as_secs());
                    n.store(log.lines, Ordering::Relaxed);
                }
                log
            })?;
        Ok(Self {
            lines,
            stop,
            thread,
        })
    }

    /// Stops following: the log as read (one last look included).
    pub async fn finish(self) -> Option<Log> {
        self.stop.store(true, Ordering::Relaxed);
        while !self.thread.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.thread.join().ok()
    }
}

/// A message's kind: every run of digits made `#`, spaces collapsed, its start kept.
#[cfg(test)]
fn kind_of(message: &str) -> String {
    let mut k = String::new();
    kind_into(message, &mut k);
    k
}

/// A message's kind into `k` (cleared first): every run of digits made `#`, spaces collapsed,
/// its start kept.
fn kind_into(message: &str, k: &mut String) {
    k.clear();
    let mut digits = false;
    let mut space = true;
    for c in message.chars() {
        if k.len() >= KIND_CHARS {
            break;
        }
        if c.is_ascii_digit() {
            if !digits {
                k.push('#');
            }
            digits = true;
            space = false;
            continue;
        }
        digits = false;
        if c.is_whitespace() {
            if !space {
                k.push(' ');
            }
            space = true;
            continue;
        }
        space = false;
        k.push(c);
    }
    k.truncate(k.trim_end().len());
}

/// The second of an RFC 3339 timestamp (`2025-03-01T12:00:07.123456Z`) as a number that
/// grows by one a second within a day, or `None` if `ts` is not one.
pub fn timestamp_second(ts: &str) -> Option<u64> {
    let b = ts.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| ts.get(r)?.parse::<u64>().ok();
    let day = (num(0..4)? * 12 + num(5..7)?) * 31 + num(8..10)?;
    Some(day * 86_400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn kinds_strip_numbers() {
        assert_eq!(
            kind_of(
                " WARN turnstile_server::workers: accept failed: Too many open files (os error 24)"
            ),
            "WARN turnstile_server::workers: accept failed: Too many open files (os error #)"
        );
        assert_eq!(kind_of("from 127.0.0.1:4242  now"), "from #.#.#.#:# now");
    }

    #[test]
    fn timestamps() {
        let a = timestamp_second("2025-03-01T12:00:07.123456Z").unwrap();
        let b = timestamp_second("2025-03-01T12:00:08Z").unwrap();
        assert_eq!(b - a, 1);
        assert_eq!(timestamp_second("WARN"), None);
        assert_eq!(timestamp_second("2025-03-01 12:00:07"), None);
    }

    #[test]
    fn counts_lines_per_second_per_kind_from_where_it_starts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.log");
        let mut f = std::fs::File::create(&path).unwrap();
        writeln!(f, "2025-03-01T12:00:00.1Z  WARN x: old, before the soak").unwrap();
        writeln!(f, "thread 'main' panicked at src/x.rs:1:1").unwrap();
        let mut log = Log::open(&path);
        assert_eq!(log.panics.len(), 1);
        for i in 0..25 {
            let s = if i < 15 { 1 } else { 2 };
            writeln!(
                f,
                "2025-03-01T12:00:0{s}.{i:06}Z  WARN x: accept failed (fd {i})"
            )
            .unwrap();
        }
        write!(f, "2025-03-01T12:00:02.9Z  INFO x: reloaded").unwrap();
        f.flush().unwrap();
        assert_eq!(log.poll(0), 25);
        writeln!(f, " in 3 ms").unwrap();
        assert_eq!(log.poll(0), 1);
        assert_eq!(log.lines, 26);
        let worst = log.worst();
        assert_eq!(worst[0].0, "WARN x: accept failed (fd #)");
        assert_eq!((worst[0].1.lines, worst[0].1.max()), (25, 15));
        assert_eq!(worst[1].0, "INFO x: reloaded in # ms");
        assert!(!log.kinds.keys().any(|k| k.contains("old")));
    }
}
