//! The most denied keys (`GET /v1/top-denied`): a space-saving sketch per thread, merged when
//! read — never a metric label per key.
//!
//! Each thread that denies a request records the key in its own sketch of `4 × K` slots
//! (`--top-denied K`): a key already in the sketch adds one to its count; a new key takes the
//! slot with the least count `c`, starting at `c + 1` with an error bound of `c`
//! (Metwally, Agrawal, El Abbadi, "Efficient computation of frequent and top-k elements in data
//! streams", 2005). A key denied more than `N / (4K)` times of the `N` denials a thread
//! recorded is in its sketch; each count over-estimates by at most its error bound.
//!
//! Only the owning thread writes a sketch: a count is a relaxed store, no read-modify-write
//! and no lock; a slot taken by a new key is written under a sequence number (a seqlock: the
//! writer never waits, the reader retries a slot it saw changing). The writer finds a key's
//! slot through its own index, and the least count in its own contiguous copy of the counts. A
//! thread finds its sketch in a thread-local; the registry's lock is taken when a thread
//! denies for the first time (and when the endpoint reads), not per request. A thread that
//! ends gives its sketch back for the next new thread, so there are at most as many sketches as
//! threads alive at once that denied: memory is `threads × 4K × 136` bytes (K = 10: 5.4 KiB a
//! thread).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of a key kept (a longer key is cut, at a character boundary when shown).
pub(crate) const MAX_TEXT: usize = 96;
const WORDS: usize = MAX_TEXT / 8;
/// The most keys `--top-denied` may ask for.
pub(crate) const MAX_K: usize = 1000;
/// Slots per thread for each key asked for.
const SLOTS_PER_K: usize = 4;

/// What denied a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Source {
    /// `CL.THROTTLE`: the key as sent.
    Throttle = 0,
    /// A rules check (`TURNSTILE.CHECK`, `POST /v1/check`): the denying rule, the key class
    /// and the key as sent.
    Rules = 1,
    /// Envoy's `ShouldRateLimit`: the descriptor's counter key (the domain and its entries, as
    /// the Envoy rate limit service names it).
    Envoy = 2,
}

/// Separates the parts of a rules key in a slot's text (never in a rule name: names are one
/// line of printable text, and the separator is a control character).
const SEP: u8 = 0x1f;

/// One counted key.
struct Slot {
    /// Odd while the slot is being given to a new key.
    seq: AtomicU64,
    hash: AtomicU64,
    count: AtomicU64,
    err: AtomicU64,
    /// The text's length, and the source above it (`len | source << 32`).
    meta: AtomicU64,
    text: [AtomicU64; WORDS],
}

impl Slot {
    fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            hash: AtomicU64::new(0),
            count: AtomicU64::new(0),
            err: AtomicU64::new(0),
            meta: AtomicU64::new(0),
            text: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// What the slot holds, read consistently (`None`: empty, or changing on every try).
    fn read(&self) -> Option<Entry> {
        for _ in 0..64 {
            // Acquire: pairs with the writer's Release store of the even number, so that the
            // fields read below are at least those it wrote before.
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            // Relaxed: validated by the sequence number around them.
            let count = self.count.load(Ordering::Relaxed);
            let hash = self.hash.load(Ordering::Relaxed);
            let err = self.err.load(Ordering::Relaxed);
            let meta = self.meta.load(Ordering::Relaxed);
            let mut bytes = [0u8; MAX_TEXT];
            for (i, w) in self.text.iter().enumerate() {
                bytes[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
            // Acquire fence: the loads above happen before the re-read of the number (the
            // seqlock's reader side: a writer that began meanwhile is seen).
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            if count == 0 {
                return None;
            }
            let len = ((meta & 0xffff_ffff) as usize).min(MAX_TEXT);
            return Some(Entry {
                hash,
                source: (meta >> 32) as u8,
                text: bytes[..len].to_vec(),
                count,
                err,
            });
        }
        None
    }
}

/// One thread's sketch.
struct Sketch {
    /// Whether a live thread writes it.
    owned: AtomicBool,
    slots: Box<[Slot]>,
}

/// A key as read from a sketch.
struct Entry {
    hash: u64,
    source: u8,
    text: Vec<u8>,
    count: u64,
    err: u64,
}

/// The sketches of the threads (see the module docs).
pub(crate) struct Denied {
    /// Keys the endpoint answers (0: nothing recorded).
    k: AtomicUsize,
    sketches: Mutex<Vec<Arc<Sketch>>>,
}

/// The process's: a thread's sketch is found through a thread-local.
pub(crate) static DENIED: Denied = Denied {
    k: AtomicUsize::new(0),
    sketches: Mutex::new(Vec::new()),
};

/// A thread's handle on its sketch, with the writer's own copy of each slot's hash and count
/// (contiguous, so that the least count is found by a short scan) and an index from hash to
/// slot (so that a key is found without one). Sized once, when the thread first denies: the
/// index holds at most one entry per slot and never grows.
struct Local {
    sketch: Arc<Sketch>,
    hashes: Box<[u64]>,
    counts: Box<[u64]>,
    index: HashMap<u64, u16, BuildHasherDefault<Prehashed>>,
    /// No count is below `least`, and none before `cursor` equals it. Counts only grow, so
    /// the next slot of the least count is found from the cursor on, and the least is
    /// recomputed only once the cursor has passed every slot: amortized, a slot or so per new
    /// key instead of a scan of all of them.
    least: u64,
    cursor: usize,
}

/// The index's hasher: its keys are already hashes ([`hash`]).
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 << 8) | u64::from(x);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // Release: the next owner sees this thread's last writes.
        self.sketch.owned.store(false, Ordering::Release);
    }
}

thread_local! {
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
}

/// A key's identity in the sketch: the source and the parts, eight bytes at a step (FxHash's
/// step, each part's length mixed in), then a final avalanche (murmur3's) so that every bit
/// depends on every byte. Denials only; a collision of 64-bit hashes merges two keys' counts.
/// Never 0 (an empty slot's hash).
fn hash(source: Source, parts: &[&[u8]]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = source as u64;
    let mut mix = |w: u64| h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    for p in parts {
        let mut chunks = p.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            mix(u64::from_le_bytes(w));
        }
        let mut w = [0u8; 8];
        w[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        mix(u64::from_le_bytes(w));
        mix(p.len() as u64);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h | 1
}

impl Denied {
    /// Sets K (clamped to [`MAX_K`]; 0: record nothing).
    pub(crate) fn set_k(&self, k: usize) {
        // Relaxed: a setting; a thread that reads the old one records one more or one fewer
        // denial.
        self.k.store(k.min(MAX_K), Ordering::Relaxed);
    }

    pub(crate) fn k(&self) -> usize {
        // Relaxed: as in `set_k`.
        self.k.load(Ordering::Relaxed)
    }

    /// Records one denial of the key made of `parts` (joined by a separator) in this
    /// thread's sketch. Out of line: the admitting path carries only the call.
    #[inline(never)]
    pub(crate) fn record(&self, source: Source, parts: &[&[u8]]) {
        let k = self.k();
        if k == 0 {
            return;
        }
        let h = hash(source, parts);
        // A thread being torn down has no thread-local left: its denial is not recorded.
        let _ = LOCAL.try_with(|l| {
            let mut l = l.borrow_mut();
            let l = l.get_or_insert_with(|| self.claim(k));
            update(l, h, source, parts);
        });
    }

    /// A sketch for this thread: one a finished thread gave back, or a new one.
    #[cold]
    fn claim(&self, k: usize) -> Local {
        let mut all = self.sketches.lock().unwrap_or_else(|e| e.into_inner());
        // Acquire: the last owner's writes (its Release in `Local::drop`) are seen.
        let free = all.iter().find(|s| {
            s.owned
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        });
        let sketch = match free {
            Some(s) => s.clone(),
            None => {
                let s = Arc::new(Sketch {
                    owned: AtomicBool::new(true),
                    slots: (0..k * SLOTS_PER_K).map(|_| Slot::new()).collect(),
                });
                all.push(s.clone());
                s
            }
        };
        // A reused sketch's slots keep their keys: the copies and the index start from them.
        let m = sketch.slots.len();
        let mut l = Local {
            hashes: vec![0; m].into(),
            counts: vec![0; m].into(),
            // Twice the slots: with at most `m` entries, removals are cleaned up in place, never
            // by growing (no allocation after this one).
            index: HashMap::with_capacity_and_hasher(2 * m, Default::default()),
            least: 0,
            cursor: 0,
            sketch,
        };
        for (i, s) in l.sketch.slots.iter().enumerate() {
            // Relaxed: this thread owns the sketch now (the Acquire above saw the last owner's
            // writes).
            let (h, c) = (
                s.hash.load(Ordering::Relaxed),
                s.count.load(Ordering::Relaxed),
            );
            if c > 0 && l.index.insert(h, i as u16).is_none() {
                (l.hashes[i], l.counts[i]) = (h, c);
            }
        }
        l.least = l.counts.iter().copied().min().unwrap_or(0);
        l
    }

    /// The `k` keys with the highest counts, every thread's sketch summed (a key counted by two
    /// threads has both counts and both error bounds).
    fn top(&self, k: usize) -> Vec<Entry> {
        let all: Vec<Arc<Sketch>> = self
            .sketches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut by: HashMap<u64, Entry> = HashMap::new();
        for s in &all {
            for e in s.slots.iter().filter_map(Slot::read) {
                match by.get_mut(&e.hash) {
                    Some(x) => {
                        x.count += e.count;
                        x.err += e.err;
                    }
                    None => {
                        by.insert(e.hash, e);
                    }
                }
            }
        }
        let mut v: Vec<Entry> = by.into_values().collect();
        v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.text.cmp(&b.text)));
        v.truncate(k);
        v
    }

    /// `GET /v1/top-denied`'s body: `{"k", "denied": [{"source", "rule"?, "key_class"?, "key",
    /// "count", "error"}]}`, most denied first.
    pub(crate) fn json(&self) -> serde_json::Value {
        let k = self.k();
        let rows: Vec<serde_json::Value> = self.top(k).iter().map(row).collect();
        serde_json::json!({ "k": k, "denied": rows })
    }
}

/// Records a denied rules check: the denying rule (none: shed by priority), the key class
/// and the key as sent.
pub(crate) fn record_rules(rule: Option<&str>, class: &str, key: &str) {
    let rule = rule.unwrap_or("");
    DENIED.record(
        Source::Rules,
        &[rule.as_bytes(), class.as_bytes(), key.as_bytes()],
    );
}

/// Records one denial of an Envoy descriptor in `domain` ([`Denied::record_envoy`]).
pub(crate) fn record_envoy(domain: &str, entries: &[u8]) {
    DENIED.record_envoy(domain, entries);
}

impl Denied {
    /// Records one denial of an Envoy descriptor in `domain`: its entries as its counter key
    /// holds them (each key and value after its length as four little-endian bytes), as many
    /// as the 96 bytes kept of a key can show.
    pub(crate) fn record_envoy(&self, domain: &str, entries: &[u8]) {
        let mut parts: [&[u8]; 17] = [&[]; 17];
        parts[0] = domain.as_bytes();
        let (mut n, mut rest) = (1, entries);
        while n < parts.len() {
            let Some((len, tail)) = rest.split_first_chunk::<4>() else {
                break;
            };
            let len = (u32::from_le_bytes(*len) as usize).min(tail.len());
            (parts[n], rest) = tail.split_at(len);
            n += 1;
        }
        self.record(Source::Envoy, &parts[..n]);
    }
}

/// One key's JSON object.
fn row(e: &Entry) -> serde_json::Value {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut parts = e.text.split(|&b| b == SEP);
    let mut o = serde_json::Map::new();
    let mut take = |o: &mut serde_json::Map<_, _>, name: &str| {
        o.insert(name.into(), text(parts.next().unwrap_or_default()).into());
    };
    // The key's parts: one as sent (a separator in it is its own byte), or an Envoy
    // descriptor's entries as its service writes them, `key_value_...`.
    let (source, join) = if e.source == Source::Rules as u8 {
        take(&mut o, "rule");
        take(&mut o, "key_class");
        ("rules", "\u{1f}")
    } else if e.source == Source::Envoy as u8 {
        take(&mut o, "domain");
        ("envoy", "_")
    } else {
        ("throttle", "\u{1f}")
    };
    o.insert("source".into(), source.into());
    let key: Vec<String> = parts.map(text).collect();
    o.insert("key".into(), key.join(join).into());
    o.insert("count".into(), e.count.into());
    o.insert("error".into(), e.err.into());
    serde_json::Value::Object(o)
}

impl Local {
    /// A slot of the least count (see `Local::least`).
    #[inline]
    fn victim(&mut self) -> usize {
        loop {
            while let Some(&c) = self.counts.get(self.cursor) {
                if c == self.least {
                    return self.cursor;
                }
                self.cursor += 1;
            }
            self.least = self.counts.iter().copied().min().unwrap_or(0);
            self.cursor = 0;
        }
    }
}

/// One denial of key `h` in this thread's sketch: its slot's count up by one, or, for a key
/// not in the sketch, the slot of the least count given to it.
#[inline]
fn update(l: &mut Local, h: u64, source: Source, parts: &[&[u8]]) {
    let i = match l.index.get(&h) {
        Some(&i) => usize::from(i),
        None => {
            let i = l.victim();
            let least = l.counts[i];
            if least > 0 {
                l.index.remove(&l.hashes[i]);
            }
            l.index.insert(h, i as u16);
            l.hashes[i] = h;
            take(&l.sketch.slots[i], h, least, source, parts);
            l.counts[i] = least + 1;
            return;
        }
    };
    l.counts[i] += 1;
    // Relaxed: this thread is the slot's only writer; a reader takes the count as it finds it.
    l.sketch.slots[i]
        .count
        .store(l.counts[i], Ordering::Relaxed);
}

/// Gives slot `s` (least count `c`) to key `h`: count `c + 1`, error bound `c`.
#[inline(never)]
fn take(s: &Slot, h: u64, c: u64, source: Source, parts: &[&[u8]]) {
    let mut bytes = [0u8; MAX_TEXT];
    let mut len = 0;
    for (j, p) in parts.iter().enumerate() {
        if j > 0 && len < MAX_TEXT {
            bytes[len] = SEP;
            len += 1;
        }
        let n = p.len().min(MAX_TEXT - len);
        bytes[len..len + n].copy_from_slice(&p[..n]);
        len += n;
    }
    // The seqlock's writer side: an odd number, a Release fence (the field stores below are not
    // seen before it), the fields, then the even number with Release (the fields are seen
    // before it). Relaxed stores: this thread is the only writer.
    let seq = s.seq.load(Ordering::Relaxed);
    s.seq.store(seq + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    s.hash.store(h, Ordering::Relaxed);
    s.count.store(c + 1, Ordering::Relaxed);
    s.err.store(c, Ordering::Relaxed);
    s.meta
        .store(len as u64 | (source as u64) << 32, Ordering::Relaxed);
    for (i, w) in s.text.iter().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
    s.seq.store(seq + 2, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(k: usize) -> Denied {
        let d = Denied {
            k: AtomicUsize::new(0),
            sketches: Mutex::new(Vec::new()),
        };
        d.set_k(k);
        d
    }

    /// Runs `f` on a new thread (its own thread-local sketch).
    fn on_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().unwrap();
    }

    #[test]
    fn envoy_denials_are_shown_by_domain_and_entries() {
        let d: &'static Denied = Box::leak(Box::new(fresh(4)));
        let mut key = Vec::new();
        for part in ["client", "gold", "route", "api"] {
            crate::envoy::matcher::push_part(&mut key, part);
        }
        on_thread(move || {
            d.record_envoy("edge", &key);
            d.record_envoy("edge", &key);
            d.record_envoy("edge", &key[..key.len() - 2]); // cut: "ap"
        });
        let j = d.json();
        assert_eq!(j["denied"][0]["source"], "envoy", "{j}");
        assert_eq!(j["denied"][0]["domain"], "edge", "{j}");
        assert_eq!(j["denied"][0]["key"], "client_gold_route_api", "{j}");
        assert_eq!(j["denied"][0]["count"], 2, "{j}");
        assert_eq!(j["denied"][1]["key"], "client_gold_route_a", "{j}");
    }

    #[test]
    fn heavy_hitters_found_in_a_skewed_stream() {
        let d: &'static Denied = Box::leak(Box::new(fresh(4)));
        on_thread(move || {
            // 3 hot keys among 10 000 cold ones, interleaved.
            for i in 0..10_000u32 {
                let cold = format!("cold{i}");
                d.record(Source::Throttle, &[cold.as_bytes()]);
                if i % 4 == 0 {
                    d.record(Source::Throttle, &[b"hot-a"]);
                }
                if i % 5 == 0 {
                    d.record(Source::Throttle, &[b"hot-b"]);
                }
                if i % 8 == 0 {
                    d.record(Source::Rules, &[b"r1", b"customer", b"7"]);
                }
            }
        });
        let top = d.top(3);
        let keys: Vec<Vec<u8>> = top.iter().map(|e| e.text.clone()).collect();
        assert_eq!(keys[0], b"hot-a");
        assert_eq!(keys[1], b"hot-b");
        assert_eq!(keys[2], b"r1\x1fcustomer\x1f7");
        // Space-saving: the true count is within [count - err, count].
        assert!(top[0].count >= 2500 && top[0].count - top[0].err <= 2500);
        let j = d.json();
        assert_eq!(j["denied"][2]["rule"], "r1");
        assert_eq!(j["denied"][2]["key_class"], "customer");
        assert_eq!(j["denied"][2]["key"], "7");
    }

    #[test]
    fn threads_sum_and_sketches_are_reused() {
        let d: &'static Denied = Box::leak(Box::new(fresh(2)));
        for _ in 0..3 {
            on_thread(move || {
                for _ in 0..10 {
                    d.record(Source::Throttle, &[b"k"]);
                }
            });
        }
        // Each thread ended before the next began: one sketch, reused.
        assert_eq!(d.sketches.lock().unwrap().len(), 1);
        let top = d.top(2);
        assert_eq!(top.len(), 1);
        assert_eq!((top[0].count, top[0].err), (30, 0));
    }

    #[test]
    fn off_records_nothing_and_long_keys_are_cut() {
        let d: &'static Denied = Box::leak(Box::new(fresh(0)));
        on_thread(move || d.record(Source::Throttle, &[b"k"]));
        assert!(d.sketches.lock().unwrap().is_empty());
        d.set_k(1);
        let long = vec![b'x'; 500];
        on_thread(move || d.record(Source::Throttle, &[&long]));
        assert_eq!(d.top(1)[0].text.len(), MAX_TEXT);
    }

    /// A reader never sees a key's text with another key's hash while the writer replaces
    /// slots as fast as it can (1 000 keys over 4 slots: nearly every record takes a slot).
    #[test]
    fn reads_are_consistent_under_writes() {
        let d: &'static Denied = Box::leak(Box::new(fresh(1)));
        let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
        let w = std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && i < 50_000_000 {
                let t = format!("key{}", i % 1000);
                d.record(Source::Throttle, &[t.as_bytes()]);
                i += 1;
            }
        });
        // A second of reads (the threads overlap on a loaded machine too), at least 200 000.
        let (mut seen, t0) = (0usize, std::time::Instant::now());
        let long = |t: std::time::Duration| t > std::time::Duration::from_secs(1);
        while (seen < 200_000 || !long(t0.elapsed())) && t0.elapsed().as_secs() < 10 {
            for e in d.top(8) {
                assert_eq!(e.hash, hash(Source::Throttle, &[&e.text]));
                seen += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        w.join().unwrap();
        assert!(seen >= 200_000, "only {seen} entries read in 10 s");
    }
}
