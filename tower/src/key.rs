//! Key extractors: which counter a request is charged to, for a layer over one keyed `Store`.
//!
//! An extractor is a trait with one method over the request's head ([`http::request::Parts`],
//! as axum's `FromRequestParts`); the built-ins are small structs and a closure works too. A
//! [`Key`] borrows from the request, so extracting one allocates nothing.

use crate::ip::{client_ip, peer_addr, ProxyHeader, TrustedProxies};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::borrow::Cow;
use std::net::IpAddr;
use turnstile::keyed::KeyHasher;

/// A request's key: what the store counts it under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key<'r> {
    /// One counter for every request.
    Global,
    /// The shared key of requests that have none ([`NoKey::Anonymous`](crate::NoKey)).
    Anonymous,
    /// A number (customer id, account id): used as the key id as it is.
    Id(u64),
    /// An address (IPv6 grouped by the store's prefix, default /64).
    Ip(IpAddr),
    /// Text (an API key, a token, a tenant name): hashed with the store's seed.
    Text(Cow<'r, str>),
    /// Bytes (a header value that is not UTF-8): hashed with the store's seed.
    Bytes(&'r [u8]),
    /// A route template and a method (`GET /users/{id}`).
    Route(&'r str, &'r http::Method),
}

impl turnstile::keyed::Key for Key<'_> {
    #[inline]
    fn key_id(&self, h: &KeyHasher) -> u64 {
        match self {
            // Fixed ids far from small customer numbers; distinct from each other.
            Key::Global => u64::MAX,
            Key::Anonymous => u64::MAX - 1,
            Key::Id(n) => *n,
            Key::Ip(ip) => ip.key_id(h),
            Key::Text(t) => h.bytes(t.as_bytes()),
            Key::Bytes(b) => h.bytes(b),
            Key::Route(path, m) => {
                // The method's bytes mixed in by the seeded hash of the path's hash and it.
                let p = h.bytes(path.as_bytes());
                let mut buf = [0u8; 8 + 16];
                buf[..8].copy_from_slice(&p.to_le_bytes());
                let mb = m.as_str().as_bytes();
                if mb.len() <= 16 {
                    buf[8..8 + mb.len()].copy_from_slice(mb);
                    h.bytes(&buf[..8 + mb.len()])
                } else {
                    p ^ h.bytes(mb).rotate_left(17)
                }
            }
        }
    }
}

/// Which key a request counts under; `None` when it has none (see [`NoKey`](crate::NoKey)).
pub trait KeyExtractor: Send + Sync + 'static {
    /// The request's key.
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>>;
    /// A short name of the key class, for observers (`"ip"`, `"header"`...).
    fn class(&self) -> &'static str {
        "custom"
    }
}

impl<F> KeyExtractor for F
where
    F: for<'r> Fn(&'r Parts) -> Option<Key<'r>> + Send + Sync + 'static,
{
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        self(parts)
    }
}

/// One counter for every request.
#[derive(Clone, Copy, Debug, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract<'r>(&self, _: &'r Parts) -> Option<Key<'r>> {
        Some(Key::Global)
    }
    fn class(&self) -> &'static str {
        "global"
    }
}

/// The TCP peer's address: axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or a `SocketAddr` extension.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerIp;

impl KeyExtractor for PeerIp {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        peer_addr(&parts.extensions).map(|a| Key::Ip(a.ip().to_canonical()))
    }
    fn class(&self) -> &'static str {
        "ip"
    }
}

/// The client's address behind trusted proxies (see [`crate::ip`]): the rightmost address in
/// the configured header that is not a trusted proxy, read only when the peer is one.
#[derive(Clone, Debug)]
pub struct ClientIp {
    trusted: TrustedProxies,
    header: ProxyHeader,
}

impl ClientIp {
    /// Trusting `trusted`, reading `X-Forwarded-For`.
    pub fn new(trusted: TrustedProxies) -> Self {
        Self {
            trusted,
            header: ProxyHeader::XForwardedFor,
        }
    }
    /// Reads `header` instead (the one your proxy writes).
    pub fn header(mut self, header: ProxyHeader) -> Self {
        self.header = header;
        self
    }
    /// The client address of a request, if it has a peer address.
    pub fn ip(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = peer_addr(&parts.extensions)?.ip();
        if self.trusted.is_empty() {
            return Some(peer.to_canonical());
        }
        let values = parts.headers.get_all(self.header.name());
        let ip = client_ip(
            peer,
            &self.trusted,
            self.header,
            values.iter().map(|v| v.as_bytes()).collect::<SmallVals>().0,
        );
        Some(ip.to_canonical())
    }
}

/// `get_all` iterates one way only; the walk needs the values from the right. Few requests
/// carry more than a few lines of one header: up to 4 without allocating.
struct SmallVals<'a>(SmallIter<'a>);

enum SmallIter<'a> {
    Inline([&'a [u8]; 4], usize, usize),
    Heap(std::vec::IntoIter<&'a [u8]>),
}

impl<'a> FromIterator<&'a [u8]> for SmallVals<'a> {
    fn from_iter<I: IntoIterator<Item = &'a [u8]>>(it: I) -> Self {
        let mut a: [&[u8]; 4] = [&[]; 4];
        let mut n = 0;
        let mut it = it.into_iter();
        for v in it.by_ref() {
            if n == 4 {
                let mut v2: Vec<&[u8]> = a.to_vec();
                v2.push(v);
                v2.extend(it);
                return SmallVals(SmallIter::Heap(v2.into_iter()));
            }
            a[n] = v;
            n += 1;
        }
        SmallVals(SmallIter::Inline(a, 0, n))
    }
}

impl<'a> Iterator for SmallIter<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        match self {
            SmallIter::Inline(a, i, n) => (*i < *n).then(|| {
                *i += 1;
                a[*i - 1]
            }),
            SmallIter::Heap(v) => v.next(),
        }
    }
}

impl DoubleEndedIterator for SmallIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            SmallIter::Inline(a, i, n) => (*i < *n).then(|| {
                *n -= 1;
                a[*n]
            }),
            SmallIter::Heap(v) => v.next_back(),
        }
    }
}

impl KeyExtractor for ClientIp {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        self.ip(parts).map(Key::Ip)
    }
    fn class(&self) -> &'static str {
        "ip"
    }
}

/// A header's value (`x-api-key`): the first line, as bytes; absent or empty: no key.
#[derive(Clone, Debug)]
pub struct Header(pub http::HeaderName);

impl Header {
    /// The header named `name` (`"x-api-key"`); panics on a name that is not a valid header
    /// name, like `HeaderName::from_static`.
    pub fn named(name: &'static str) -> Self {
        Header(http::HeaderName::from_static(name))
    }
}

/// The first value of header `name`, as `HeaderMap::get` gives it. Most requests carry a
/// few headers: comparing their names is cheaper than hashing `name` byte by byte (the
/// map's hash of a custom name, a third of the extractor's instructions under callgrind).
pub(crate) fn first_value<'r>(h: &'r HeaderMap, name: &HeaderName) -> Option<&'r HeaderValue> {
    if h.keys_len() <= SCAN_HEADERS {
        // `iter` visits each name's first value before its others: the first match is `get`'s.
        h.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    } else {
        h.get(name)
    }
}

/// Up to this many header names, [`first_value`] scans rather than hashes.
const SCAN_HEADERS: usize = 8;

impl KeyExtractor for Header {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let v = first_value(&parts.headers, &self.0)?.as_bytes();
        (!v.is_empty()).then_some(Key::Bytes(v))
    }
    fn class(&self) -> &'static str {
        "header"
    }
}

/// The token of `Authorization: Bearer <token>`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bearer;

/// The token of an `Authorization: Bearer <token>` value (scheme case-insensitive).
pub fn bearer_token(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let start = rest.iter().position(|b| *b != b' ')?;
    let end = rest.iter().rposition(|b| *b != b' ')? + 1;
    Some(&rest[start..end])
}

impl KeyExtractor for Bearer {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let v = parts.headers.get(http::header::AUTHORIZATION)?.as_bytes();
        bearer_token(v).map(Key::Bytes)
    }
    fn class(&self) -> &'static str {
        "bearer"
    }
}

/// A value an earlier layer (authentication) put in the request's extensions, e.g. a customer
/// id: `Extension::<CustomerId>::new(|c| Key::Id(c.0))`.
pub struct Extension<T> {
    to_key: fn(&T) -> Key<'_>,
}

impl<T> Clone for Extension<T> {
    fn clone(&self) -> Self {
        Self {
            to_key: self.to_key,
        }
    }
}

impl<T: Send + Sync + 'static> Extension<T> {
    /// Keys a request by its `T` extension through `to_key`.
    pub fn new(to_key: fn(&T) -> Key<'_>) -> Self {
        Self { to_key }
    }
}

impl<T: Send + Sync + 'static> KeyExtractor for Extension<T> {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        parts.extensions.get::<T>().map(self.to_key)
    }
    fn class(&self) -> &'static str {
        "extension"
    }
}

/// The matched route template (axum's `MatchedPath`, e.g. `/users/{id}`; the URI path when
/// there is none, as under `Router::layer` for an unmatched request) and the method.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteMethod;

/// The route template of a request: axum's `MatchedPath` if set, else the URI path.
pub fn route(parts: &Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(m) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return m.as_str();
    }
    parts.uri.path()
}

impl KeyExtractor for RouteMethod {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        Some(Key::Route(route(parts), &parts.method))
    }
    fn class(&self) -> &'static str {
        "route"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile::keyed::Key as _;

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer   abc  "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bear"), None);
    }

    #[test]
    fn first_value_is_gets() {
        // Below and above the scan threshold, names repeated, the name first, last, absent.
        for n in [
            0,
            1,
            3,
            SCAN_HEADERS - 1,
            SCAN_HEADERS,
            SCAN_HEADERS + 1,
            40,
        ] {
            for at in [0, n / 2, n] {
                let mut h = HeaderMap::new();
                for i in 0..n {
                    let name = HeaderName::try_from(format!("h-{i}")).unwrap();
                    h.append(&name, HeaderValue::from(i));
                    h.append(name, HeaderValue::from(i + 1000));
                    if i == at {
                        h.append("x-key", HeaderValue::from(7 + i));
                        h.append("x-key", HeaderValue::from(8 + i));
                    }
                }
                for name in ["x-key", "h-0", "absent"] {
                    let name = HeaderName::from_static(name);
                    assert_eq!(first_value(&h, &name), h.get(&name), "{n} {at} {name}");
                }
            }
        }
    }

    #[test]
    fn keys_are_distinct() {
        let h = KeyHasher::with_seed(7, 64);
        let get = http::Method::GET;
        let post = http::Method::POST;
        let ids = [
            Key::Global.key_id(&h),
            Key::Anonymous.key_id(&h),
            Key::Route("/a", &get).key_id(&h),
            Key::Route("/a", &post).key_id(&h),
            Key::Route("/b", &get).key_id(&h),
            Key::Text("x".into()).key_id(&h),
        ];
        for i in 0..ids.len() {
            for j in 0..i {
                assert_ne!(ids[i], ids[j], "{i} {j}");
            }
        }
        assert_eq!(
            Key::Text("x".into()).key_id(&h),
            Key::Bytes(b"x").key_id(&h)
        );
    }
}
