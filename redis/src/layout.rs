//! Where a key's records live: their Redis keys, and (packed) their field.
//!
//! * **One key per record** (the default): `<prefix>{<key>}:<i><code>`, one Redis string (a
//!   sorted set for concurrency) per limit of a key; the key is the hash tag, so a key's
//!   limits share a Cluster slot.
//! * **Packed** (`RedisStoreBuilder::capacity`): the keys are spread over 2^b buckets (b from
//!   the capacity, about 32 to 64 keys a bucket) by a SHA-1 of the key; for each limit whose
//!   record is one short value (fixed_window, sliding_window, token_bucket, leaky_bucket) a
//!   bucket is one hash, `<prefix>{<bucket hex>.<b>}#<i><code>[.<layout>]`, holding each key's
//!   record in the key's field: the key itself up to 16 bytes, else 0xFF and 15 bytes of its
//!   SHA-1 (0xFF never occurs in UTF-8, so the two cannot meet). Redis keeps such a hash as a
//!   listpack (at most 128 fields of at most 64 bytes, the defaults). The other limits keep a
//!   key each, `<prefix>{<bucket hex>.<b>}#<key>#<i><code>`, under the bucket's tag: every key
//!   of one call shares the bucket's Cluster slot. `<layout>` is a hash of what the record
//!   means and how its value is encoded (script.rs): stores whose records read differently
//!   never share a bucket.
//!
//! Every process sharing a limit must name its keys alike: the same prefix, and (packed) the
//! same capacity.

use crate::script::{packed_layout, record_layout, LimitArgs};
use turnstile::Limit;

/// Keys per bucket, at least (and fewer than twice as many): a listpack of 32 to 64 records
/// holds a record in about 26 bytes (docs/redis.md) and is scanned in a few thousand
/// instructions per access.
const PER_BUCKET: u64 = 32;

/// Field names up to this length are the key itself.
const RAW_FIELD: usize = 16;

/// The Redis names of a store's records.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    prefix: String,
    /// Bits of the bucket index when packed.
    bits: Option<u32>,
    /// Per limit: its code, whether its record is packed, its layout hash.
    parts: Vec<(&'static str, bool, Option<u32>)>,
    /// A key per record named as the rules on Redis name theirs: `.<layout>` after the code
    /// (a rule's lease tier shares the rule's records).
    suffixed: bool,
}

/// One key's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Names {
    /// Per limit, its Redis key.
    pub(crate) keys: Vec<String>,
    /// The key's field in its buckets (packed layout only).
    pub(crate) field: Option<Vec<u8>>,
}

/// Bucket bits for `capacity` keys: 2^b buckets of `PER_BUCKET` to `2 PER_BUCKET` keys each.
pub(crate) fn bucket_bits(capacity: u64) -> u32 {
    let per = (capacity / PER_BUCKET).max(1);
    (63 - per.leading_zeros()).min(40)
}

fn sha1(key: &str) -> [u8; 20] {
    sha1_smol::Sha1::from(key.as_bytes()).digest().bytes()
}

/// The key's field in a bucket.
pub(crate) fn field(key: &str) -> Vec<u8> {
    if key.len() <= RAW_FIELD {
        return key.as_bytes().to_vec();
    }
    let mut f = vec![0xFF];
    f.extend_from_slice(&sha1(key)[..RAW_FIELD - 1]);
    f
}

/// The key's bucket among 2^bits.
pub(crate) fn bucket(key: &str, bits: u32) -> u64 {
    if bits == 0 {
        return 0;
    }
    let h = sha1(key);
    let mut w = [0u8; 8];
    w.copy_from_slice(&h[..8]);
    u64::from_be_bytes(w) >> (64 - bits)
}

impl Layout {
    /// The names of `limits` (with their library arguments `args`) under `prefix`, packed for
    /// `capacity` keys if given.
    pub(crate) fn new(
        prefix: &str,
        limits: &[Limit],
        args: &[LimitArgs],
        capacity: Option<u64>,
    ) -> Self {
        let bits = capacity.map(bucket_bits);
        let parts = limits
            .iter()
            .zip(args)
            .map(|(l, a)| {
                let packed = bits.is_some() && a.packable();
                let layout = if packed {
                    packed_layout(l)
                } else {
                    record_layout(l)
                };
                (a.code, packed, layout)
            })
            .collect();
        Self {
            prefix: prefix.to_string(),
            bits,
            parts,
            suffixed: false,
        }
    }

    /// One key per record named as the rules on Redis name theirs,
    /// `<prefix>{<key>}:<i><code>[.<layout>]` (not packed).
    pub(crate) fn suffixed(mut self) -> Self {
        self.suffixed = self.bits.is_none();
        self
    }

    /// Whether records are packed in buckets.
    pub(crate) fn packed(&self) -> bool {
        self.bits.is_some()
    }

    /// The Redis names of `key`'s records.
    pub(crate) fn names(&self, key: &str) -> Names {
        let p = &self.prefix;
        let Some(bits) = self.bits else {
            let keys = (self.parts.iter().enumerate())
                .map(|(i, &(code, _, layout))| match layout {
                    Some(h) if self.suffixed => format!("{p}{{{key}}}:{i}{code}.{h:08x}"),
                    _ => format!("{p}{{{key}}}:{i}{code}"),
                })
                .collect();
            return Names { keys, field: None };
        };
        let tag = format!("{:x}.{bits}", bucket(key, bits));
        let keys = (self.parts.iter().enumerate())
            .map(|(i, &(code, packed, layout))| match (packed, layout) {
                (true, Some(h)) => format!("{p}{{{tag}}}#{i}{code}.{h:08x}"),
                (true, None) => format!("{p}{{{tag}}}#{i}{code}"),
                (false, Some(h)) => format!("{p}{{{tag}}}#{key}#{i}{code}.{h:08x}"),
                (false, None) => format!("{p}{{{tag}}}#{key}#{i}{code}"),
            })
            .collect();
        let field = self.parts.iter().any(|p| p.1).then(|| field(key));
        Names { keys, field }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::limit_args;
    use std::time::Duration;

    fn layout(limits: &[Limit], capacity: Option<u64>) -> Layout {
        let args: Vec<LimitArgs> = limits.iter().map(|l| limit_args(l).unwrap()).collect();
        Layout::new("ts:", limits, &args, capacity)
    }

    #[test]
    fn buckets_hold_32_to_64_keys() {
        assert_eq!(bucket_bits(0), 0);
        assert_eq!(bucket_bits(63), 0);
        assert_eq!(bucket_bits(64), 1);
        assert_eq!(bucket_bits(20_000), 9); // 512 buckets of 39
        assert_eq!(bucket_bits(100_000_000), 21); // 2 M buckets of 48
        for c in [64u64, 100, 20_000, 1 << 30, 100_000_000] {
            let per = c as f64 / (1u64 << bucket_bits(c)) as f64;
            assert!((32.0..64.0).contains(&per), "{c}: {per}");
        }
    }

    #[test]
    fn fields_are_short_keys_or_digests() {
        assert_eq!(field("user12345"), b"user12345");
        assert_eq!(field("0123456789abcdef"), b"0123456789abcdef");
        let long = field("an API key that is longer than sixteen bytes");
        assert_eq!(long.len(), 16);
        assert_eq!(long[0], 0xFF);
        assert_ne!(long, field("an API key that is longer than sixteen bytez"));
    }

    #[test]
    fn buckets_are_stable_and_spread() {
        // Stable across processes and versions: a fixed SHA-1.
        assert_eq!(bucket("user0", 9), bucket("user0", 9));
        assert_eq!(bucket("abc", 8), 0xa9);
        let mut counts = vec![0u32; 512];
        for i in 0..20_000 {
            counts[bucket(&format!("user{i}"), 9) as usize] += 1;
        }
        let max = *counts.iter().max().unwrap();
        assert!(max < 100, "{max} keys in one bucket");
    }

    #[test]
    fn rules_names_carry_the_record_layout() {
        let h = Duration::from_secs(3600);
        let limits = [
            Limit::fixed_window(500, h).unwrap(),
            Limit::token_bucket(5, 5, h).unwrap(),
        ];
        let n = layout(&limits, None).suffixed().names("2a");
        let fw = format!("{:08x}", record_layout(&limits[0]).unwrap());
        assert_eq!(
            n.keys,
            [format!("ts:{{2a}}:0fw.{fw}"), "ts:{2a}:1tb".into()]
        );
        // Packed records keep their buckets' names.
        let p = layout(&limits, Some(20_000));
        assert_eq!(p.clone().suffixed().names("2a"), p.names("2a"));
    }

    #[test]
    fn a_keys_names_share_one_hash_tag() {
        let h = Duration::from_secs(3600);
        let limits = [
            Limit::fixed_window(500, h).unwrap(),
            Limit::token_bucket(5, 5, h).unwrap(),
            Limit::sliding_log(10, h).unwrap(),
        ];
        let n = layout(&limits, None).names("u1");
        assert_eq!(n.keys, ["ts:{u1}:0fw", "ts:{u1}:1tb", "ts:{u1}:2sl"]);
        assert_eq!(n.field, None);
        let n = layout(&limits, Some(20_000)).names("u1");
        let tag = format!("{{{:x}.9}}", bucket("u1", 9));
        let fw = format!("{:08x}", packed_layout(&limits[0]).unwrap());
        let sl = n.keys[2].clone();
        assert_eq!(n.keys[0], format!("ts:{tag}#0fw.{fw}"));
        assert_eq!(n.keys[1], format!("ts:{tag}#1tb"));
        let slh = format!("{:08x}", record_layout(&limits[2]).unwrap());
        assert_eq!(sl, format!("ts:{tag}#u1#2sl.{slh}"));
        assert_eq!(n.field.as_deref(), Some(&b"u1"[..]));
        // Concurrency alone, packed: a key of its own under the bucket's tag, no field.
        let cc = [Limit::concurrency(5, h).unwrap()];
        let n = layout(&cc, Some(20_000)).names("u1");
        assert_eq!(n.keys, [format!("ts:{tag}#u1#0cc")]);
        assert_eq!(n.field, None);
    }
}
