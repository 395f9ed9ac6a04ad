//! `parse_key` on any text: never panics, refuses exactly what it documents, and what it
//! accepts round-trips through its canonical spellings with the same key id.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr};
use turnstile::keyed::key::MAX_KEY_LEN;
use turnstile::keyed::{parse_key, Key, KeyHasher, ParsedKey};

fn id(k: &ParsedKey<'_>, h: &KeyHasher) -> u64 {
    k.key_id(h)
}

fn check(s: &str) {
    let h = KeyHasher::with_seed(7, 64);
    let parsed = parse_key(s);
    // Deterministic: the same text gives the same answer and the same id.
    assert_eq!(parsed, parse_key(s));
    let k = match parsed {
        Err(e) => {
            assert!(!e.message.is_empty(), "an error says what is wrong: {s:?}");
            return;
        }
        Ok(k) => k,
    };
    assert!(!s.is_empty(), "the empty key is refused");
    assert!(
        s.len() <= MAX_KEY_LEN,
        "a key over {MAX_KEY_LEN} bytes is refused"
    );
    assert!(
        !s.chars().any(char::is_control),
        "a key with a control character is refused: {s:?}"
    );
    assert_eq!(id(&k, &h), id(&k, &KeyHasher::with_seed(7, 64)));
    match k {
        ParsedKey::Id(v) => {
            assert_eq!(id(&k, &h), v, "a numeric key is its own id");
            assert_eq!(parse_key(&v.to_string()), Ok(ParsedKey::Id(v)));
            assert_eq!(parse_key(&format!("id:{v}")), Ok(ParsedKey::Id(v)));
        }
        ParsedKey::Ip(a) => {
            assert_eq!(id(&k, &h), a.key_id(&h));
            let text = a.to_string();
            let again = parse_key(&text).expect("an address's display form parses");
            assert_eq!(again, ParsedKey::Ip(a), "{s:?} → {text:?}");
            assert_eq!(parse_key(&format!("ip:{text}")), Ok(ParsedKey::Ip(a)));
            match a {
                IpAddr::V4(v4) => assert_eq!(id(&k, &h), u32::from(v4) as u64),
                IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                    // An IPv4 client of a dual-stack socket is its IPv4 address, alone.
                    Some(v4) => {
                        assert_eq!(id(&k, &h), u32::from(v4) as u64, "{a} is {v4}");
                        // Its neighbour is another client, not the same `::/64`.
                        let next = Ipv4Addr::from_bits(v4.to_bits().wrapping_add(1));
                        let next = IpAddr::V6(next.to_ipv6_mapped());
                        assert_ne!(a.key_id(&h), next.key_id(&h), "{a} and {next}");
                    }
                    None => {
                        // Kept apart from every IPv4 id.
                        assert!(id(&k, &h) >= 1 << 63, "{a}: an IPv6 id sets bit 63");
                        // Grouped by /64: the same id for any interface id in the prefix
                        // (`::1234` is not IPv4-mapped, so the whole of `::/64` stays IPv6).
                        let other = (u128::from(v6) & !0xffff_ffff_ffff_ffff) | 0x1234;
                        let other = IpAddr::V6(other.into());
                        assert_eq!(
                            a.key_id(&h),
                            other.key_id(&h),
                            "{a} and {other} share a /64"
                        );
                    }
                },
            }
        }
        ParsedKey::Text(t) => {
            assert!(!t.is_empty(), "a text key is never empty");
            assert_eq!(id(&k, &h), t.key_id(&h));
            if let Some(rest) = s.strip_prefix("str:") {
                assert_eq!(t, rest);
            } else {
                assert_eq!(t, s, "an unprefixed text key is the whole text");
                assert!(!s.starts_with("id:") && !s.starts_with("ip:"));
                // Not a bare decimal (`+9` is text: only digits make an id) nor an address.
                assert!(!s.bytes().all(|b| b.is_ascii_digit()));
                assert!(s.parse::<IpAddr>().is_err());
            }
            // `str:` always makes a text key of the same text, and so the same id.
            let prefixed = format!("str:{t}");
            if prefixed.len() <= MAX_KEY_LEN {
                assert_eq!(parse_key(&prefixed), Ok(ParsedKey::Text(t)));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    match std::str::from_utf8(data) {
        Ok(s) => check(s),
        // Invalid UTF-8 never reaches `parse_key` (it takes `&str`); its lossy form does.
        Err(_) => check(&String::from_utf8_lossy(data)),
    }
});
