//! The client's address behind proxies, without trusting what the client wrote.
//!
//! Every proxy appends the address it received the request from to the right of the header
//! (`Forwarded`, RFC 7239; `X-Forwarded-For`), or replaces the header with it (`X-Real-IP`).
//! So the entries on the right were written by proxies we trust and the entries on the left by
//! whoever sent the request to the first of them — possibly an attacker. The client is the
//! *rightmost address that is not a trusted proxy*, and the header is read at all only when
//! the TCP peer itself is a trusted proxy: a header sent straight to the server is ignored.
//! (tower_governor's `SmartIp` takes the leftmost `X-Forwarded-For` entry, which the client
//! chooses.)
//!
//! The parsers are pure functions over the header bytes: they never allocate, never index out
//! of bounds, and treat anything they do not understand as an entry without an address. Such
//! an entry stops the walk: the request is keyed by the trusted proxy that wrote it (the
//! address to its right), never by anything further left.

use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// The networks whose requests may carry a client address in a header (load balancers,
/// reverse proxies). Empty: no proxy is trusted and the peer address is the client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

/// A CIDR that could not be parsed: the text and how to write it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidrError(pub String);

impl std::fmt::Display for CidrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` is not an address or a CIDR network; write e.g. 10.0.0.0/8, 192.0.2.7 or fd00::/8",
            self.0
        )
    }
}

impl std::error::Error for CidrError {}

impl TrustedProxies {
    /// No proxy trusted.
    pub fn none() -> Self {
        Self::default()
    }

    /// Parses CIDRs (`10.0.0.0/8`) or single addresses (`192.0.2.7`, `::1`).
    pub fn parse<I, S>(cidrs: I) -> Result<Self, CidrError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut nets = Vec::new();
        for c in cidrs {
            let c = c.as_ref().trim();
            let net = IpNet::from_str(c)
                .or_else(|_| IpAddr::from_str(c).map(IpNet::from))
                .map_err(|_| CidrError(c.to_string()))?;
            nets.push(net);
        }
        Ok(Self { nets })
    }

    /// Adds a network.
    pub fn with(mut self, net: IpNet) -> Self {
        self.nets.push(net);
        self
    }

    /// Whether `ip` (IPv4-mapped IPv6 compared as IPv4) is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

/// The header a trusted proxy writes the client address into. Configure the one your proxy
/// sets: a header it does not set passes through it unchanged, written by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProxyHeader {
    /// `Forwarded: for=192.0.2.60;proto=http, for="[2001:db8::1]:4711"` (RFC 7239).
    Forwarded,
    /// `X-Forwarded-For: 203.0.113.7, 10.0.0.2` (the default).
    XForwardedFor,
    /// `X-Real-IP: 203.0.113.7` (one address, set by the proxy).
    XRealIp,
}

impl ProxyHeader {
    /// The header's name.
    pub fn name(self) -> http::HeaderName {
        match self {
            ProxyHeader::Forwarded => http::header::FORWARDED,
            ProxyHeader::XForwardedFor => http::HeaderName::from_static("x-forwarded-for"),
            ProxyHeader::XRealIp => http::HeaderName::from_static("x-real-ip"),
        }
    }
}

/// One address as proxies write it: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:443`, `fe80::1%eth0` (the zone is dropped), optionally in
/// double quotes. `None` for anything else (`unknown`, `_hidden`, garbage).
pub fn parse_addr(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    let s = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s);
    if let Some(rest) = s.strip_prefix('[') {
        // `[v6]` or `[v6]:port`.
        let (inner, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        return v6(inner).map(IpAddr::V6);
    }
    if let Ok(ip) = Ipv4Addr::from_str(s) {
        return Some(IpAddr::V4(ip));
    }
    if let Some((a, port)) = s.split_once(':') {
        if !port.contains(':') {
            // `v4:port`.
            return if is_port(port) {
                Ipv4Addr::from_str(a).ok().map(IpAddr::V4)
            } else {
                None
            };
        }
    }
    v6(s).map(IpAddr::V6)
}

/// An IPv6 address, its zone (`%eth0`) dropped.
fn v6(s: &str) -> Option<Ipv6Addr> {
    let s = s.split_once('%').map_or(s, |(a, _)| a);
    Ipv6Addr::from_str(s).ok()
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// The `for=` address of one `Forwarded` element (`for=1.2.3.4;proto=https`); `None` when the
/// element has no `for` or its value is not an address.
pub fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        if k.trim().eq_ignore_ascii_case("for") {
            Some(parse_addr(v))
        } else {
            None
        }
    })?
}

/// The entries of a proxy header's values, rightmost first: `Some(addr)` or `None` for an entry
/// that is not an address. Several header lines count as one list in their order. (A comma
/// inside a quoted `Forwarded` value splits it: only the client-written, untrusted part can
/// hold one, and a broken entry stops the walk.)
pub fn entries_rev<'a>(
    header: ProxyHeader,
    values: impl DoubleEndedIterator<Item = &'a [u8]> + 'a,
) -> impl Iterator<Item = Option<IpAddr>> + 'a {
    values.rev().flat_map(move |v| {
        // Not UTF-8 (obs-text): one entry, not an address.
        let s = std::str::from_utf8(v).unwrap_or("\u{0}");
        s.rsplit(',').map(move |e| match header {
            ProxyHeader::Forwarded => forwarded_for(e),
            ProxyHeader::XForwardedFor | ProxyHeader::XRealIp => parse_addr(e),
        })
    })
}

/// The client address of a request from `peer` carrying `values` of `header`: the peer if it
/// is not trusted; else the rightmost header address that is not trusted; the trusted proxy
/// to the right of the first entry that is not an address; the leftmost address if all are
/// trusted; the peer if the header is absent or empty.
pub fn client_ip<'a>(
    peer: IpAddr,
    trusted: &TrustedProxies,
    header: ProxyHeader,
    values: impl DoubleEndedIterator<Item = &'a [u8]> + 'a,
) -> IpAddr {
    if !trusted.contains(peer) {
        return peer;
    }
    let mut last = peer;
    for e in entries_rev(header, values) {
        match e {
            None => return last,
            Some(ip) if !trusted.contains(ip) => return ip.to_canonical(),
            Some(ip) => last = ip.to_canonical(),
        }
        if header == ProxyHeader::XRealIp {
            // One address only, whatever else the client appended.
            break;
        }
    }
    last
}

/// The peer address of a request: axum's `ConnectInfo<SocketAddr>`, else a `SocketAddr`
/// extension (put there by a hyper accept loop or another layer).
pub fn peer_addr(ext: &http::Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(ci) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(ci.0);
    }
    ext.get::<SocketAddr>().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_as_proxies_write_them() {
        for (s, want) in [
            ("192.0.2.1", Some("192.0.2.1")),
            (" 192.0.2.1:8080 ", Some("192.0.2.1")),
            ("\"192.0.2.1:8080\"", Some("192.0.2.1")),
            ("2001:db8::1", Some("2001:db8::1")),
            ("[2001:db8::1]", Some("2001:db8::1")),
            ("\"[2001:db8::1]:4711\"", Some("2001:db8::1")),
            ("fe80::1%eth0", Some("fe80::1")),
            ("[fe80::1%25eth0]:80", Some("fe80::1")),
            ("unknown", None),
            ("_hidden", None),
            ("192.0.2.1:http", None),
            ("[2001:db8::1]x", None),
            ("1.2.3.4:5:6", None),
            ("", None),
        ] {
            assert_eq!(parse_addr(s), want.map(ip), "{s:?}");
        }
    }

    #[test]
    fn rightmost_untrusted_address() {
        let t = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
        let xff = ProxyHeader::XForwardedFor;
        let peer = ip("10.0.0.1");
        let one = |v: &'static str| client_ip(peer, &t, xff, [v.as_bytes()].into_iter());
        assert_eq!(one("1.2.3.4, 203.0.113.9, 10.0.0.2"), ip("203.0.113.9"));
        assert_eq!(one("10.0.0.3, 10.0.0.2"), ip("10.0.0.3"));
        assert_eq!(one("1.2.3.4, garbage, 10.0.0.2"), ip("10.0.0.2"));
        assert_eq!(one(""), ip("10.0.0.1"));
        // Untrusted peer: the header is ignored.
        let p = ip("198.51.100.1");
        assert_eq!(
            client_ip(p, &t, xff, [&b"1.2.3.4"[..]].into_iter()),
            ip("198.51.100.1")
        );
        // Two header lines are one list.
        let two = [&b"1.1.1.1, 2.2.2.2"[..], &b"10.0.0.9"[..]];
        assert_eq!(client_ip(peer, &t, xff, two.into_iter()), ip("2.2.2.2"));
        let fwd = br#"for=1.2.3.4, for="[2001:db8::7]:4711";proto=https, for=10.0.0.5"#;
        assert_eq!(
            client_ip(peer, &t, ProxyHeader::Forwarded, [&fwd[..]].into_iter()),
            ip("2001:db8::7")
        );
        assert_eq!(
            client_ip(
                peer,
                &t,
                ProxyHeader::XRealIp,
                [&b"1.2.3.4"[..]].into_iter()
            ),
            ip("1.2.3.4")
        );
        // An IPv4-mapped peer is the IPv4 address.
        assert_eq!(
            client_ip(
                ip("::ffff:10.0.0.1"),
                &t,
                xff,
                [&b"5.6.7.8"[..]].into_iter()
            ),
            ip("5.6.7.8")
        );
    }
}
