//! Snapshots of the `CL.THROTTLE` stores: written to a temporary file, fsynced and renamed
//! over the old one (a crash leaves the old or the new file, never a mix); read whole and
//! checked before anything is restored (a bad file restores nothing).
//!
//! Format (little-endian):
//!
//! ```text
//! "TSNP" | version u32 (1) | payload length u64 | CRC-32 of the payload u32 | payload
//! payload: hash seed u64 | wall-clock ns at write u64 | stores u32 |
//!          per store: max_burst i64 | count i64 | period i64 | records u64 |
//!                     per record: key id u64 | TAT, wall-clock ns since the Unix epoch u64
//! ```
//!
//! A store's clock counts from its own process's origin (the TSC clock), so times are written
//! as wall-clock nanoseconds (`wall now + (TAT − clock now)`) and converted back on restore;
//! records already idle at restore (TAT in the past) are dropped. Key ids are hashes under
//! the seed, which the restored stores reuse.

use crate::throttle::{Params, Throttles};
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};
use turnstile::Clock;

const MAGIC: &[u8; 4] = b"TSNP";
const VERSION: u32 = 1;
const HEADER: usize = 4 + 4 + 8 + 4;

/// Why a snapshot file was refused.
#[derive(Debug)]
pub struct SnapshotError {
    /// The file.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "snapshot {}: {}", self.path, self.message)
    }
}

impl std::error::Error for SnapshotError {}

/// A snapshot read and checked, not yet restored.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The hash seed of the stores that wrote it.
    pub seed: u64,
    /// When it was written (wall-clock ns).
    pub written_ns: u64,
    /// Each store's parameters and `(key id, TAT wall-clock ns)` records.
    pub stores: Vec<(Params, Vec<(u64, u64)>)>,
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
}

/// The stores' records, times in wall-clock ns.
pub fn collect(t: &Throttles) -> Snapshot {
    let wall = wall_ns();
    let mut stores = Vec::new();
    for e in t.entries() {
        let now = e.store.clock().now();
        let mut recs = Vec::new();
        e.store.export_packed(|id, tat| {
            // Only records not yet idle carry information.
            if tat > now {
                recs.push((id, wall.saturating_add(tat - now)));
            }
        });
        stores.push((e.params, recs));
    }
    Snapshot {
        seed: t.seed(),
        written_ns: wall,
        stores,
    }
}

/// Encodes a snapshot, header included.
pub fn encode(s: &Snapshot) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&s.seed.to_le_bytes());
    p.extend_from_slice(&s.written_ns.to_le_bytes());
    p.extend_from_slice(&(s.stores.len() as u32).to_le_bytes());
    for ((b, c, per), recs) in &s.stores {
        for v in [*b, *c, *per] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        p.extend_from_slice(&(recs.len() as u64).to_le_bytes());
        for (id, t) in recs {
            p.extend_from_slice(&id.to_le_bytes());
            p.extend_from_slice(&t.to_le_bytes());
        }
    }
    let mut out = Vec::with_capacity(HEADER + p.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(p.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
    out.extend_from_slice(&p);
    out
}

/// Decodes and checks a whole file's bytes. Never panics; every length is checked against
/// what is there.
pub fn decode(b: &[u8]) -> Result<Snapshot, String> {
    if b.len() < HEADER {
        return Err(format!(
            "truncated: {} bytes, shorter than the {HEADER}-byte header",
            b.len()
        ));
    }
    if &b[..4] != MAGIC {
        return Err("not a turnstile snapshot (bad magic)".into());
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let version = u32_at(4);
    if version != VERSION {
        return Err(format!(
            "format version {version}; this server reads version {VERSION}"
        ));
    }
    let len = u64_at(8);
    let have = (b.len() - HEADER) as u64;
    if len != have {
        return Err(format!(
            "truncated or padded: the header announces {len} payload bytes, the file has {have}"
        ));
    }
    let p = &b[HEADER..];
    if crc32fast::hash(p) != u32_at(16) {
        return Err("checksum mismatch: the file is corrupt".into());
    }
    let mut r = Reader { b: p, at: 0 };
    let seed = r.u64()?;
    let written_ns = r.u64()?;
    let n = r.u32()? as usize;
    let mut stores = Vec::new();
    for _ in 0..n {
        let params = (r.u64()? as i64, r.u64()? as i64, r.u64()? as i64);
        let k = r.u64()?;
        if k > (r.b.len() - r.at) as u64 / 16 {
            return Err(format!(
                "store {params:?} announces {k} records, more than the file holds"
            ));
        }
        let mut recs = Vec::with_capacity(k as usize);
        for _ in 0..k {
            recs.push((r.u64()?, r.u64()?));
        }
        stores.push((params, recs));
    }
    if r.at != p.len() {
        return Err(format!(
            "{} bytes left over after the last store",
            p.len() - r.at
        ));
    }
    Ok(Snapshot {
        seed,
        written_ns,
        stores,
    })
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or("ends inside a record")?;
        self.at += n;
        Ok(s)
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
}

/// Writes `s` to `path`: a temporary file beside it, fsynced, renamed over it, the directory
/// fsynced.
pub fn write(path: &Path, s: &Snapshot) -> std::io::Result<()> {
    let bytes = encode(s);
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .map_or("snapshot".into(), |n| n.to_string_lossy())
    ));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads `path`: `Ok(None)` if there is no file, the checked snapshot, or why it is refused.
pub fn read(path: &Path) -> Result<Option<Snapshot>, SnapshotError> {
    let err = |message: String| SnapshotError {
        path: path.display().to_string(),
        message,
    };
    match std::fs::read(path) {
        Ok(b) => decode(&b).map(Some).map_err(err),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(err(format!("cannot read: {e}"))),
    }
}

/// Restores a checked snapshot into `t` (built with the snapshot's seed). Returns the records
/// restored; idle ones are dropped.
pub fn restore(t: &Throttles, s: Snapshot) -> u64 {
    let wall = wall_ns();
    let mut n = 0;
    for (params, recs) in s.stores {
        let store = match t.store(params) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(?params, error = %e, "snapshot store not restored");
                continue;
            }
        };
        let now = store.clock().now();
        for (id, tat_wall) in recs {
            if tat_wall <= wall {
                continue;
            }
            let tat = now.saturating_add(tat_wall - wall);
            if tat >> 63 == 0 && store.import_packed(id, tat, now) {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        Snapshot {
            seed: 7,
            written_ns: 123,
            stores: vec![((4, 1, 1), vec![(1, 2), (3, 4)]), ((0, 5, 60), vec![])],
        }
    }

    #[test]
    fn roundtrip_and_refusals() {
        let b = encode(&sample());
        assert_eq!(decode(&b).unwrap(), sample());
        for cut in 0..b.len() {
            let e = decode(&b[..cut]).unwrap_err();
            assert!(e.contains("truncated"), "{cut}: {e}");
        }
        for i in HEADER..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(decode(&c).unwrap_err().contains("checksum"), "{i}");
        }
        let mut c = b.clone();
        c[4] = 9;
        assert!(decode(&c).unwrap_err().contains("version 9"));
        let mut c = b;
        c[0] = b'X';
        assert!(decode(&c).unwrap_err().contains("magic"));
    }

    #[test]
    fn restore_keeps_counts_and_drops_idle() {
        let a = Throttles::new(usize::MAX, 1000, 42);
        let st = a.store((9, 1, 60)).unwrap();
        for _ in 0..4 {
            st.check("busy", 1);
        }
        st.check("once", 1);
        let snap = collect(&a);
        assert_eq!(snap.stores[0].1.len(), 2);
        let b = Throttles::new(usize::MAX, 1000, snap.seed);
        assert_eq!(restore(&b, decode(&encode(&snap)).unwrap()), 2);
        let st2 = b.store((9, 1, 60)).unwrap();
        // 4 of 10 taken: 5 left after this one.
        assert_eq!(st2.check("busy", 1).remaining, 5);
        assert_eq!(st2.check("once", 1).remaining, 8);
        assert_eq!(st2.check("new", 1).remaining, 9);
        // A snapshot whose records are all in the past restores nothing.
        let mut old = collect(&a);
        for (_, r) in &mut old.stores {
            for x in r.iter_mut() {
                x.1 = 1;
            }
        }
        let c = Throttles::new(usize::MAX, 1000, old.seed);
        assert_eq!(restore(&c, old), 0);
    }
}
