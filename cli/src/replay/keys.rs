//! A request's key under a rule's key class, for the report: a 64-bit hash (to count keys)
//! and the text a user recognises (`42`, `203.0.113.0/24`, `42 /v1/search`). The hash is the
//! report's own (fixed seed), not the engine's key id: the same text, the same key.

use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use turnstile::rules::{KeyClass, KeyPart, Request};

/// The parts of a request a key is made of, with the customer as the log wrote it.
pub struct View<'a> {
    pub req: Request<'a>,
    pub customer_text: &'a str,
}

/// `ip` grouped by the class's prefixes (IPv4-mapped IPv6 as IPv4), and the prefix length if
/// shorter than the address.
fn group(class: KeyClass, ip: IpAddr) -> (IpAddr, Option<u8>) {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(a) => {
            let p = class.ipv4_prefix().min(32);
            let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            (
                IpAddr::V4((u32::from(a) & mask).into()),
                (p < 32).then_some(p),
            )
        }
        IpAddr::V6(a) => {
            let p = class.ipv6_prefix().min(128);
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            (
                IpAddr::V6((u128::from(a) & mask).into()),
                (p < 128).then_some(p),
            )
        }
    }
}

/// The key's hash under `class`; `None` if the request lacks a part (the rule does not apply).
#[inline]
pub fn hash(class: KeyClass, v: &View<'_>) -> Option<u64> {
    let mut h = foldhash::fast::FixedState::with_seed(0x6b65_7973).build_hasher();
    for p in class.parts() {
        match p {
            KeyPart::Customer => h.write_u64(v.req.customer?),
            KeyPart::Ip => match group(class, v.req.ip?).0 {
                IpAddr::V4(a) => h.write_u32(a.into()),
                IpAddr::V6(a) => h.write_u128(a.into()),
            },
            KeyPart::ApiKey => h.write(v.req.api_key?.as_bytes()),
            KeyPart::Route => h.write(v.req.route?.as_bytes()),
            KeyPart::Method => h.write(v.req.method?.as_bytes()),
        }
        h.write_u8(0xff);
    }
    Some(h.finish())
}

/// The key's text under `class`, into `out`.
pub fn text(class: KeyClass, v: &View<'_>, out: &mut String) {
    use std::fmt::Write;
    if class.is_global() {
        out.push_str("(global)");
        return;
    }
    for (i, p) in class.parts().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        match p {
            KeyPart::Customer => out.push_str(v.customer_text),
            KeyPart::Ip => {
                if let Some(ip) = v.req.ip {
                    let (a, p) = group(class, ip);
                    let _ = write!(out, "{a}");
                    if let Some(p) = p {
                        let _ = write!(out, "/{p}");
                    }
                }
            }
            KeyPart::ApiKey => out.push_str(v.req.api_key.unwrap_or("")),
            KeyPart::Route => out.push_str(v.req.route.unwrap_or("")),
            KeyPart::Method => out.push_str(v.req.method.unwrap_or("")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_text_and_hash() {
        let class = KeyClass::ip().ip_prefix(24, 48).and(KeyPart::Route);
        let view = |ip: &str| View {
            req: Request::new().ip(ip.parse::<IpAddr>().unwrap()).route("/a"),
            customer_text: "",
        };
        let mut s = String::new();
        text(class, &view("203.0.113.9"), &mut s);
        assert_eq!(s, "203.0.113.0/24 /a");
        assert_eq!(
            hash(class, &view("203.0.113.9")),
            hash(class, &view("203.0.113.200"))
        );
        assert_ne!(
            hash(class, &view("203.0.113.9")),
            hash(class, &view("203.0.114.9"))
        );
        assert_eq!(
            hash(class, &view("::ffff:203.0.113.9")),
            hash(class, &view("203.0.113.1"))
        );
        let no_route = View {
            req: Request::new().customer(1),
            customer_text: "1",
        };
        assert_eq!(hash(class, &no_route), None);
    }
}
