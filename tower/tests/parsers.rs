//! Every header parser and key extractor on bad input: garbage bytes, 10 kB headers, IPv6
//! zones, ports in `Forwarded`, many header lines. None may panic, and the client address is
//! always the peer or an address a trusted proxy (or the peer) vouched for.

use http::request::Parts;
use proptest::prelude::*;
use std::net::{IpAddr, SocketAddr};
use turnstile_tower::ip::{client_ip, forwarded_for, parse_addr};
use turnstile_tower::key::{bearer_token, Bearer, Header, RouteMethod};
use turnstile_tower::{ClientIp, KeyExtractor, PeerIp, ProxyHeader, TrustedProxies};

fn parts(headers: &[(&'static str, Vec<u8>)], peer: Option<SocketAddr>) -> Parts {
    let mut b = http::Request::builder().uri("/x");
    for (k, v) in headers {
        if let Ok(v) = http::HeaderValue::from_bytes(v) {
            b = b.header(*k, v);
        }
    }
    let (mut p, ()) = b.body(()).unwrap().into_parts();
    if let Some(a) = peer {
        p.extensions.insert(a);
    }
    p
}

/// Header-ish bytes: pieces of addresses, separators, quotes, brackets, zones, ports.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"1.2.3.4".to_vec()),
        Just(b"10.0.0.1".to_vec()),
        Just(b"[2001:db8::1]:443".to_vec()),
        Just(b"fe80::1%eth0".to_vec()),
        Just(b"for=".to_vec()),
        Just(b"\"".to_vec()),
        Just(b";".to_vec()),
        Just(b",".to_vec()),
        Just(b":".to_vec()),
        Just(b"[".to_vec()),
        Just(b"]".to_vec()),
        Just(b"%".to_vec()),
        Just(b" ".to_vec()),
        Just(b"unknown".to_vec()),
        Just(b"Bearer ".to_vec()),
        prop::collection::vec(any::<u8>(), 0..8),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parsers_never_panic(b in header_bytes(), s in ".{0,64}") {
        let _ = parse_addr(&s);
        let _ = forwarded_for(&s);
        let _ = bearer_token(&b);
        if let Ok(t) = std::str::from_utf8(&b) {
            let _ = parse_addr(t);
            let _ = forwarded_for(t);
        }
    }

    #[test]
    fn client_ip_is_the_peer_or_vouched_for(
        lines in prop::collection::vec(header_bytes(), 0..6),
        peer_trusted in any::<bool>(),
    ) {
        let trusted = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
        let peer: IpAddr = if peer_trusted { "10.9.9.9" } else { "192.0.2.9" }.parse().unwrap();
        for h in [ProxyHeader::Forwarded, ProxyHeader::XForwardedFor, ProxyHeader::XRealIp] {
            let ip = client_ip(peer, &trusted, h, lines.iter().map(|l| l.as_slice()));
            if !peer_trusted {
                prop_assert_eq!(ip, peer);
            }
        }
        let name = ["forwarded", "x-forwarded-for", "x-real-ip"];
        for (i, h) in [ProxyHeader::Forwarded, ProxyHeader::XForwardedFor, ProxyHeader::XRealIp].into_iter().enumerate() {
            let hs: Vec<_> = lines.iter().map(|l| (name[i], l.clone())).collect();
            let p = parts(&hs, Some(SocketAddr::new(peer, 1)));
            let _ = ClientIp::new(trusted.clone()).header(h).extract(&p);
        }
    }

    #[test]
    fn extractors_never_panic(v in header_bytes(), with_peer in any::<bool>()) {
        let p = parts(
            &[("x-api-key", v.clone()), ("authorization", v.clone()), ("x-forwarded-for", v)],
            with_peer.then(|| "127.0.0.1:9".parse().unwrap()),
        );
        let _ = Header::named("x-api-key").extract(&p);
        let _ = Bearer.extract(&p);
        let _ = PeerIp.extract(&p);
        let _ = RouteMethod.extract(&p);
        let _ = ClientIp::new(TrustedProxies::parse(["127.0.0.1"]).unwrap()).extract(&p);
    }
}

/// A 10 kB header of many entries, and one of a single 10 kB token.
#[test]
fn ten_kilobyte_headers() {
    let trusted = TrustedProxies::parse(["127.0.0.0/8"]).unwrap();
    let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let many = "1.2.3.4, ".repeat(1200) + "127.0.0.2";
    let p = parts(&[("x-forwarded-for", many.into_bytes())], Some(peer));
    let ip = ClientIp::new(trusted.clone()).ip(&p).unwrap();
    assert_eq!(ip, "1.2.3.4".parse::<IpAddr>().unwrap());
    let one = "a".repeat(10_000);
    let p = parts(
        &[
            ("forwarded", one.clone().into_bytes()),
            ("x-api-key", one.into_bytes()),
        ],
        Some(peer),
    );
    let ip = ClientIp::new(trusted)
        .header(ProxyHeader::Forwarded)
        .ip(&p)
        .unwrap();
    assert_eq!(
        ip,
        peer.ip(),
        "garbage from a trusted peer: keyed by the peer"
    );
    assert!(Header::named("x-api-key").extract(&p).is_some());
    // Six lines of the header (more than the inline buffer of four).
    let hs: Vec<_> = (0..6)
        .map(|i| ("x-forwarded-for", format!("9.9.9.{i}").into_bytes()))
        .collect();
    let p = parts(&hs, Some(peer));
    assert_eq!(
        ClientIp::new(TrustedProxies::parse(["127.0.0.0/8"]).unwrap())
            .ip(&p)
            .unwrap(),
        "9.9.9.5".parse::<IpAddr>().unwrap()
    );
}
