//! The snapshot file's format (the parent module's docs): encoded whole, decoded and checked
//! whole.

use super::{RuleStore, Snapshot};

const MAGIC: &[u8; 4] = b"TSNP";
const VERSION: u32 = 3;
/// The most state words of one rule store's record accepted from a file.
const MAX_WORDS: u32 = 1 << 16;
const HEADER: usize = 4 + 4 + 8 + 4;

/// Encodes a snapshot, header included.
pub fn encode(s: &Snapshot) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&s.seed.to_le_bytes());
    p.extend_from_slice(&s.written_ns.to_le_bytes());
    p.extend_from_slice(&(s.throttle.len() as u64).to_le_bytes());
    for (id, t) in &s.throttle {
        p.extend_from_slice(&id.to_le_bytes());
        p.extend_from_slice(&t.to_le_bytes());
    }
    p.extend_from_slice(&s.rules_now.to_le_bytes());
    p.extend_from_slice(&(s.rules.len() as u32).to_le_bytes());
    for r in &s.rules {
        p.extend_from_slice(&(r.describe.len() as u32).to_le_bytes());
        p.extend_from_slice(r.describe.as_bytes());
        p.extend_from_slice(&r.words.to_le_bytes());
        let n = r.data.len() / (1 + r.words as usize);
        p.extend_from_slice(&(n as u64).to_le_bytes());
        for w in &r.data[..n * (1 + r.words as usize)] {
            p.extend_from_slice(&w.to_le_bytes());
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
    let (version, p) = payload(b)?;
    let mut r = Reader { b: p, at: 0 };
    let seed = r.u64()?;
    let written_ns = r.u64()?;
    let throttle = throttle_records(&mut r, version)?;
    let (mut rules_now, mut rules) = (0, Vec::new());
    if version >= 2 {
        rules_now = r.u64()?;
        let n = r.u32()?;
        for i in 0..n {
            rules.push(rule_store(&mut r, i)?);
        }
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
        throttle,
        rules_now,
        rules,
    })
}

/// The header checked: the format's version, and the payload the checksum vouches for.
fn payload(b: &[u8]) -> Result<(u32, &[u8]), String> {
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
    if version == 0 || version > VERSION {
        return Err(format!(
            "format version {version}; this server reads versions 1 to {VERSION}"
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
    Ok((version, p))
}

/// The `CL.THROTTLE` records: one list (versions 1 and 2: a list per parameter set, all read
/// into the one).
fn throttle_records(r: &mut Reader, version: u32) -> Result<Vec<(u64, u64)>, String> {
    let mut throttle = Vec::new();
    let lists = if version >= 3 { 1 } else { r.u32()? as usize };
    for _ in 0..lists {
        if version < 3 {
            // The parameters of a list of version 1 or 2: every key is in one store now.
            r.take(24)?;
        }
        let k = r.u64()?;
        if k > r.left() as u64 / 16 {
            return Err(format!(
                "the CL.THROTTLE records announce {k}, more than the file holds"
            ));
        }
        throttle.reserve(k as usize);
        for _ in 0..k {
            throttle.push((r.u64()?, r.u64()?));
        }
    }
    Ok(throttle)
}

/// The `i`th rule store.
fn rule_store(r: &mut Reader, i: u32) -> Result<RuleStore, String> {
    let len = r.u32()? as usize;
    let describe = std::str::from_utf8(r.take(len)?)
        .map_err(|_| format!("rule store {i}: its description is not UTF-8"))?
        .to_string();
    let words = r.u32()?;
    if words == 0 || words > MAX_WORDS {
        return Err(format!(
            "rule store {describe}: {words} words per record (1 to {MAX_WORDS})"
        ));
    }
    let k = r.u64()?;
    let per = 8 * (1 + u64::from(words));
    if k > r.left() as u64 / per {
        return Err(format!(
            "rule store {describe} announces {k} records, more than the file holds"
        ));
    }
    let n = k as usize * (1 + words as usize);
    let mut data = Vec::with_capacity(n);
    for _ in 0..n {
        data.push(r.u64()?);
    }
    Ok(RuleStore {
        describe,
        words,
        data,
    })
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    /// Bytes not yet read.
    fn left(&self) -> usize {
        self.b.len() - self.at
    }
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let s = self
            .b
            .get(self.at..self.at.saturating_add(n))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        Snapshot {
            seed: 7,
            written_ns: 123,
            throttle: vec![(1, 2), (3, 4)],
            rules_now: 99,
            rules: vec![
                RuleStore {
                    describe: "rule=\"a\"".into(),
                    words: 2,
                    data: vec![5, 6, 7, 8, 9, 10],
                },
                RuleStore {
                    describe: String::new(),
                    words: 1,
                    data: vec![],
                },
            ],
        }
    }

    /// A file of `version` around payload `p`: its header, its checksum right.
    fn seal(version: u32, p: &[u8]) -> Vec<u8> {
        let mut out = Vec::from(&MAGIC[..]);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(p).to_le_bytes());
        out.extend_from_slice(p);
        out
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
        // Versions 1 and 2: a list of CL.THROTTLE records per parameter set (version 1
        // without the rules part), read into the one list.
        let mut old = Vec::new();
        for w in [7u64, 123] {
            old.extend_from_slice(&w.to_le_bytes());
        }
        old.extend_from_slice(&2u32.to_le_bytes());
        for (params, recs) in [
            ((4u64, 1u64, 1u64), &[(1u64, 2u64), (3, 4)][..]),
            ((0, 5, 60), &[(9, 9)][..]),
        ] {
            for v in [params.0, params.1, params.2, recs.len() as u64] {
                old.extend_from_slice(&v.to_le_bytes());
            }
            for (id, t) in recs {
                old.extend_from_slice(&id.to_le_bytes());
                old.extend_from_slice(&t.to_le_bytes());
            }
        }
        let v1 = decode(&seal(1, &old)).unwrap();
        assert_eq!(v1.throttle, vec![(1, 2), (3, 4), (9, 9)]);
        assert!(v1.rules.is_empty());
        old.extend_from_slice(&99u64.to_le_bytes());
        old.extend_from_slice(&0u32.to_le_bytes());
        let v2 = decode(&seal(2, &old)).unwrap();
        assert_eq!((v2.throttle.len(), v2.rules_now), (3, 99));
        let mut c = b;
        c[0] = b'X';
        assert!(decode(&c).unwrap_err().contains("magic"));
    }

    /// A payload whose checksum is right but whose counts are not (a writer's bug, not
    /// corruption) is refused too, whole.
    #[test]
    fn lying_counts_are_refused() {
        let good = encode(&sample());
        let p = good[HEADER..].to_vec();
        // The first rule store's record count (after seed, time, 2 CL.THROTTLE records, the
        // rules clock, the store count, its description and its words).
        let at = 8 + 8 + (8 + 32) + 8 + 4 + 4 + 8 + 4;
        assert_eq!(p[at..at + 8], 2u64.to_le_bytes());
        for n in [u64::MAX, 3, 1, 0] {
            let mut q = p.clone();
            q[at..at + 8].copy_from_slice(&n.to_le_bytes());
            let e = decode(&seal(VERSION, &q)).unwrap_err();
            if n > 2 {
                assert!(e.contains("more than the file holds"), "{n}: {e}");
            }
        }
        let mut q = p.clone();
        q[at - 4..at].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode(&seal(VERSION, &q))
            .unwrap_err()
            .contains("words per record"));
    }
}
