//! Keys: what a limit is counted per.
//!
//! Every key becomes a 64-bit *key id*, which the store keeps as it is in the slot's key word:
//!
//! | key | id |
//! |---|---|
//! | `u64` (customer or user id), `u32` | the number itself (the notes' 8-byte UserID) |
//! | IPv4 address | its 32 bits, as a number |
//! | IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) | the IPv4 address's id |
//! | other IPv6 address | its first `ipv6_prefix` bits (default /64: one subscriber), hashed, bit 63 set |
//! | `&str`, `&[u8]` (API keys, `"user:241531"`) | a keyed hash of the bytes |
//!
//! Hashing uses foldhash (a fast, seeded, HashDoS-resistant multiply-mix hash, ~1-2 ns for
//! short keys; SipHash costs ~100 ns per lookup here) with a per-process random seed, or a
//! fixed one for reproducible tests. Where the slot goes (shard and bucket) is a second keyed
//! mix of the id, so raw numeric ids cannot be chosen to pile onto one bucket either.
//!
//! Collisions: two hashed keys share a limit iff their 64-bit ids are equal. Among n distinct
//! hashed keys that happens with probability about n² / 2^65: 2.7e-8 for a million keys,
//! 2.7e-6 for ten million. Numeric keys never collide with each other. One store holds one key
//! class (a customer id 5 and the IPv4 address 0.0.0.5 would share an id); the rules layer
//! tags classes.
//!
//! Addresses: a dual-stack listener (`[::]`) sees its IPv4 clients as `::ffff:a.b.c.d`. Their
//! /64 is `::/64`, the same for every IPv4 client (and for `::1`), so they are mapped to their
//! IPv4 address first: one client, one key, whichever socket it came through. IPv6 ids keep
//! bit 63 set and IPv4 ids are below 2^32, so the two families never share an id (the rules
//! layer does the same, `src/rules/matcher.rs`).

use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Seeded hashing of keys, and the placement mix.
#[derive(Clone, Debug)]
pub struct KeyHasher {
    state: foldhash::fast::FixedState,
    place: u64,
    ipv6_prefix: u8,
}

impl KeyHasher {
    /// A hasher with a given seed (reproducible) and IPv6 grouping prefix (0..=128 bits).
    pub fn with_seed(seed: u64, ipv6_prefix: u8) -> Self {
        Self {
            state: foldhash::fast::FixedState::with_seed(seed),
            place: seed.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15,
            ipv6_prefix: ipv6_prefix.min(128),
        }
    }

    /// A hasher with a random per-process seed.
    pub fn random(ipv6_prefix: u8) -> Self {
        // std's `RandomState` keys SipHash from the OS random source (once per thread, then a
        // counter): hashing a constant with it yields 64 unpredictable bits, the seed a
        // HashDoS-resistant table needs, without a dependency of our own on an RNG crate.
        use std::hash::{BuildHasher, RandomState};
        let seed = RandomState::new().hash_one(0x7475_726e_7374_696c_u64);
        Self::with_seed(seed, ipv6_prefix)
    }

    /// Hash of bytes.
    #[inline]
    pub fn bytes(&self, b: &[u8]) -> u64 {
        let mut h = self.state.build_hasher();
        h.write(b);
        h.finish()
    }

    /// Where an id goes: a keyed, invertible mix (so distinct ids spread as random).
    #[inline]
    pub fn place(&self, id: u64) -> u64 {
        // Two rounds of xor-shift-multiply (the murmur3 finalizer) over id ^ seed.
        let mut x = id ^ self.place;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }

    /// The IPv6 grouping prefix.
    pub fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }
}

/// Anything a limit can be keyed by. Borrowed; computing the id allocates nothing.
pub trait Key {
    /// The 64-bit key id.
    fn key_id(&self, h: &KeyHasher) -> u64;
}

impl Key for u64 {
    #[inline]
    fn key_id(&self, _: &KeyHasher) -> u64 {
        *self
    }
}
impl Key for u32 {
    #[inline]
    fn key_id(&self, _: &KeyHasher) -> u64 {
        *self as u64
    }
}
impl Key for Ipv4Addr {
    #[inline]
    fn key_id(&self, _: &KeyHasher) -> u64 {
        u32::from(*self) as u64
    }
}
impl Key for Ipv6Addr {
    #[inline]
    fn key_id(&self, h: &KeyHasher) -> u64 {
        // An IPv4 client of a dual-stack socket is that IPv4 client (module docs).
        if let Some(v4) = self.to_ipv4_mapped() {
            return v4.key_id(h);
        }
        let bits = u128::from(*self);
        let p = h.ipv6_prefix as u32;
        let masked = if p == 0 {
            0
        } else {
            bits & (u128::MAX << (128 - p))
        };
        // Bit 63 keeps IPv6 ids out of the IPv4 range (below 2^32).
        h.bytes(&masked.to_be_bytes()) | 1 << 63
    }
}
impl Key for IpAddr {
    #[inline]
    fn key_id(&self, h: &KeyHasher) -> u64 {
        match self {
            IpAddr::V4(a) => a.key_id(h),
            IpAddr::V6(a) => a.key_id(h),
        }
    }
}
impl Key for str {
    #[inline]
    fn key_id(&self, h: &KeyHasher) -> u64 {
        h.bytes(self.as_bytes())
    }
}
impl Key for [u8] {
    #[inline]
    fn key_id(&self, h: &KeyHasher) -> u64 {
        h.bytes(self)
    }
}
impl Key for String {
    #[inline]
    fn key_id(&self, h: &KeyHasher) -> u64 {
        h.bytes(self.as_bytes())
    }
}
impl<K: Key + ?Sized> Key for &K {
    #[inline]
    fn key_id(&self, h: &KeyHasher) -> u64 {
        (**self).key_id(h)
    }
}

/// A key given as text, as the CLI, a rules file or a request header would give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParsedKey<'a> {
    /// A decimal customer/user id.
    Id(u64),
    /// An IP address.
    Ip(IpAddr),
    /// Anything else: an opaque string key.
    Text(&'a str),
}

/// An error from [`parse_key`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyError {
    /// What is wrong and how to fix it.
    pub message: String,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
impl std::error::Error for KeyError {}

/// Maximum length of a text key, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Parses a key given as text: `id:42` or a bare decimal → an id; `ip:…` or anything that
/// parses as an IPv4/IPv6 address → an address; `str:…` or anything else → a text key.
/// Empty keys, keys over [`MAX_KEY_LEN`] bytes and control characters are refused.
pub fn parse_key(s: &str) -> Result<ParsedKey<'_>, KeyError> {
    let err = |m: String| Err(KeyError { message: m });
    if s.is_empty() {
        return err("empty key: give a customer id (`42`), an IP address, or a string such as `user:241531`".into());
    }
    if s.len() > MAX_KEY_LEN {
        return err(format!(
            "key of {} bytes is longer than the {MAX_KEY_LEN}-byte maximum; hash or shorten it",
            s.len()
        ));
    }
    if let Some(i) = s.find(|c: char| c.is_control()) {
        return err(format!(
            "key has a control character at byte {i}; keys are printable text"
        ));
    }
    if let Some(rest) = s.strip_prefix("id:") {
        return match rest.parse::<u64>() {
            Ok(v) => Ok(ParsedKey::Id(v)),
            Err(_) => err(format!(
                "`{s}`: after `id:` expected a decimal number 0..=18446744073709551615"
            )),
        };
    }
    if let Some(rest) = s.strip_prefix("ip:") {
        return match rest.parse::<IpAddr>() {
            Ok(a) => Ok(ParsedKey::Ip(a)),
            Err(_) => err(format!(
                "`{s}`: after `ip:` expected an IPv4 or IPv6 address"
            )),
        };
    }
    if let Some(rest) = s.strip_prefix("str:") {
        return if rest.is_empty() {
            err("`str:` with nothing after it: give the key text".into())
        } else {
            Ok(ParsedKey::Text(rest))
        };
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return match s.parse::<u64>() {
            Ok(v) => Ok(ParsedKey::Id(v)),
            Err(_) => err(format!("`{s}` is too large for a numeric id (max 18446744073709551615); prefix it with `str:` to use it as text")),
        };
    }
    if let Ok(a) = s.parse::<IpAddr>() {
        return Ok(ParsedKey::Ip(a));
    }
    Ok(ParsedKey::Text(s))
}

impl Key for ParsedKey<'_> {
    #[inline]
    fn key_id(&self, h: &KeyHasher) -> u64 {
        match self {
            ParsedKey::Id(v) => *v,
            ParsedKey::Ip(a) => a.key_id(h),
            ParsedKey::Text(t) => t.key_id(h),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_classes() {
        assert_eq!(parse_key("42").unwrap(), ParsedKey::Id(42));
        assert_eq!(parse_key("id:7").unwrap(), ParsedKey::Id(7));
        assert!(matches!(parse_key("10.0.0.1").unwrap(), ParsedKey::Ip(_)));
        assert!(matches!(
            parse_key("2001:db8::1").unwrap(),
            ParsedKey::Ip(_)
        ));
        assert_eq!(
            parse_key("user:241531").unwrap(),
            ParsedKey::Text("user:241531")
        );
        assert!(parse_key("").is_err());
        assert!(parse_key("id:x").is_err());
        assert!(parse_key("99999999999999999999").is_err());
        assert!(parse_key("a\nb").is_err());
    }

    #[test]
    fn ipv6_grouped_by_prefix() {
        let h = KeyHasher::with_seed(1, 64);
        let a: Ipv6Addr = "2001:db8:1:2::1".parse().unwrap();
        let b: Ipv6Addr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: Ipv6Addr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(a.key_id(&h), b.key_id(&h));
        assert_ne!(a.key_id(&h), c.key_id(&h));
    }

    /// A dual-stack listener's IPv4 clients (`::ffff:a.b.c.d`) are their IPv4 addresses, each
    /// its own key, not one shared `::/64`; `::1` is not an IPv4 client; the families never
    /// share an id.
    #[test]
    fn ipv4_mapped_ipv6_is_the_ipv4_key() {
        for prefix in [0, 32, 64, 128] {
            let h = KeyHasher::with_seed(1, prefix);
            let id = |s: &str| parse_key(s).unwrap().key_id(&h);
            assert_eq!(id("::ffff:203.0.113.9"), id("203.0.113.9"));
            assert_eq!(id("::ffff:10.0.0.1"), id("10.0.0.1"));
            assert_ne!(id("::ffff:10.0.0.1"), id("::ffff:10.0.0.2"));
            let ip: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
            let v6: Ipv6Addr = "::ffff:10.0.0.1".parse().unwrap();
            assert_eq!(ip.key_id(&h), 0x0a00_0001);
            assert_eq!(v6.key_id(&h), 0x0a00_0001);
            // IPv6 ids (loopback included) are never an IPv4 id.
            for a in ["::1", "::", "2001:db8::1", "::a00:1", "64:ff9b::a00:1"] {
                let x = id(a);
                assert!(x >= 1 << 63, "{a}: {x:#x}");
                assert_ne!(x, id("10.0.0.1"));
                assert_ne!(x, id("::ffff:10.0.0.1"));
            }
        }
    }

    #[test]
    fn seeds_differ() {
        let a = KeyHasher::with_seed(1, 64);
        let b = KeyHasher::with_seed(2, 64);
        assert_ne!("user:1".key_id(&a), "user:1".key_id(&b));
        assert_eq!(
            "user:1".key_id(&a),
            "user:1".key_id(&KeyHasher::with_seed(1, 64))
        );
    }
}
