//! What a check is asked about: a borrowed [`Request`], and its [`Priority`].

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// How important a request is, most important first (Stripe's load shedder, note 001's
/// "critical, POST, GET, test"). Under overload the least important are shed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// Must go through (payments, health checks): keeps a reserved share of capacity.
    Critical,
    /// Writes: POST, PUT, PATCH, DELETE.
    Post,
    /// Reads: GET, HEAD, OPTIONS and the rest.
    Get,
    /// Test-mode traffic: shed first.
    Test,
}

impl Priority {
    /// All, most important first (the order of [`Priority::index`]).
    pub const ALL: [Priority; 4] = [
        Priority::Critical,
        Priority::Post,
        Priority::Get,
        Priority::Test,
    ];

    /// The name used in rules files.
    pub const fn name(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Post => "post",
            Priority::Get => "get",
            Priority::Test => "test",
        }
    }

    /// 0 (critical) ..= 3 (test).
    pub const fn index(self) -> usize {
        self as usize
    }

    pub(crate) const fn bit(self) -> u8 {
        1 << self as u8
    }

    /// The default priority of a request with this method (and no explicit priority).
    pub fn of_method(method: Option<&str>) -> Priority {
        Self::of_method_bit(method_bit(method))
    }

    /// [`Priority::of_method`] from a method bit.
    #[inline]
    pub(crate) fn of_method_bit(bit: u16) -> Priority {
        const WRITES: u16 = M_POST | M_PUT | M_PATCH | M_DELETE;
        if bit & WRITES != 0 {
            Priority::Post
        } else {
            Priority::Get
        }
    }

    /// [`Priority::of_method`] from a method index ([`method_slot`]).
    #[inline]
    pub(crate) fn of_method_index(i: u8) -> Priority {
        const WRITES: u16 = M_POST | M_PUT | M_PATCH | M_DELETE;
        // Indexes 9 (other) and 10 (none) shift in zeros: not writes.
        if (WRITES >> i) & 1 != 0 {
            Priority::Post
        } else {
            Priority::Get
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Priority {
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Self, crate::UnknownName> {
        Priority::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                crate::UnknownName::new("priority", s, "one of critical, post, get, test")
            })
    }
}

/// The methods rules can name, in bit order.
pub const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];
const M_POST: u16 = 1 << 2;
const M_PUT: u16 = 1 << 3;
const M_DELETE: u16 = 1 << 4;
const M_PATCH: u16 = 1 << 8;
/// Bit of any other method.
pub(crate) const M_OTHER: u16 = 1 << 14;
/// Bit of a request without a method.
pub(crate) const M_NONE: u16 = 1 << 15;

/// The first 8 bytes (or fewer) as a big-endian word, zero-padded: ordering these words
/// and then the full strings orders strings lexicographically.
#[inline]
pub(crate) const fn word(b: &[u8]) -> u64 {
    if b.len() >= 8 {
        return u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    }
    if b.is_empty() {
        return 0;
    }
    let mut w = 0u64;
    let mut i = 0;
    while i < b.len() {
        w = w << 8 | b[i] as u64;
        i += 1;
    }
    w << (8 * (8 - b.len()))
}

/// The methods as words, in bit order.
const METHOD_WORDS: [u64; 9] = {
    let mut w = [0u64; 9];
    let mut i = 0;
    while i < 9 {
        w[i] = word(METHODS[i].as_bytes()) | METHODS[i].len() as u64;
        i += 1;
    }
    w
};

/// Index of a request without a method (after the 9 known ones and `OTHER`).
pub(crate) const METHOD_NONE: u8 = 10;
/// Index of any method not in [`METHODS`].
pub(crate) const METHOD_OTHER: u8 = 9;
/// Number of method indexes (9 known, other, none).
pub(crate) const METHOD_INDEXES: usize = 11;

/// Multiplier of the perfect hash of [`METHOD_WORDS`] into 16 slots (`w * M >> 60`), found
/// at compile time: the first odd multiplier from a fixed start that separates all nine.
const METHOD_MUL: u64 = {
    let mut m = 0x9e37_79b9_7f4a_7c15u64;
    loop {
        let mut seen = 0u16;
        let mut ok = true;
        let mut i = 0;
        while i < 9 {
            let b = 1u16 << (METHOD_WORDS[i].wrapping_mul(m) >> 60);
            if seen & b != 0 {
                ok = false;
            }
            seen |= b;
            i += 1;
        }
        if ok {
            break m;
        }
        m = m.wrapping_add(0x2545_f491_4f6c_dd1e) | 1;
    }
};

/// Slot of the perfect hash → (the method's word, its index); an empty slot holds word 0,
/// which no method's word equals (its last byte is the length, 3..=7).
const METHOD_SLOTS: [(u64, u8); 16] = {
    let mut t = [(0u64, 0u8); 16];
    let mut i = 0;
    while i < 9 {
        t[(METHOD_WORDS[i].wrapping_mul(METHOD_MUL) >> 60) as usize] = (METHOD_WORDS[i], i as u8);
        i += 1;
    }
    t
};

/// The index (bit position in [`METHODS`]) of a known method, ASCII case-insensitive. No
/// allocation.
///
/// The method's bytes (3..=7 of them) are packed into one word (two overlapping 4-byte loads)
/// with bit 5 of each byte cleared (upper case) and the length in the free last byte. Clearing
/// bit 5 maps exactly `A-Z` and `a-z` onto the upper-case letters the method names consist of,
/// so a match is exact; a perfect hash picks the one name to compare the word with.
#[inline]
pub(crate) fn method_index(m: &str) -> Option<u8> {
    let b = m.as_bytes();
    let n = b.len();
    if !(3..=7).contains(&n) {
        return None;
    }
    let w = if n >= 4 {
        let hi = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64;
        let lo = u32::from_be_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]) as u64;
        hi << 32 | lo << (8 * (8 - n))
    } else {
        (b[0] as u64) << 56 | (b[1] as u64) << 48 | (b[2] as u64) << 40
    };
    let w = (w & 0xdfdf_dfdf_dfdf_df00) | n as u64;
    let (mw, i) = METHOD_SLOTS[(w.wrapping_mul(METHOD_MUL) >> 60) as usize];
    if mw == w {
        Some(i)
    } else {
        None
    }
}

/// The bit of a known method (ASCII case-insensitive), 0 if unknown. No allocation.
#[inline]
pub(crate) fn method_code(m: &str) -> u16 {
    method_index(m).map_or(0, |i| 1 << i)
}

/// A request's method index: 0..=8 for [`METHODS`], [`METHOD_OTHER`], or [`METHOD_NONE`].
#[inline]
pub(crate) fn method_slot(m: Option<&str>) -> u8 {
    match m {
        None => METHOD_NONE,
        Some(m) => method_index(m).unwrap_or(METHOD_OTHER),
    }
}

/// The bit of a method index in a rule's method mask.
#[inline]
pub(crate) const fn index_bit(i: u8) -> u16 {
    match i {
        METHOD_NONE => M_NONE,
        METHOD_OTHER => M_OTHER,
        i => 1 << i,
    }
}

/// The bit a request's method sets in a rule's method mask.
#[inline]
pub(crate) fn method_bit(m: Option<&str>) -> u16 {
    index_bit(method_slot(m))
}

/// One request, borrowed: everything a rule can match on or be keyed by. Building one and
/// checking it allocates nothing.
///
/// ```
/// use turnstile::rules::{Priority, Request};
/// let r = Request::new()
///     .customer(241_531)
///     .ip("203.0.113.9".parse::<std::net::IpAddr>().unwrap())
///     .route("/v1/charges")
///     .method("POST");
/// assert_eq!(r.effective_priority(), Priority::Post);
/// assert_eq!(r.cost, 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// Customer or user id.
    pub customer: Option<u64>,
    /// Client address.
    pub ip: Option<IpAddr>,
    /// API key.
    pub api_key: Option<&'a str>,
    /// Route (path, or a route template such as `/v1/customers/:id`).
    pub route: Option<&'a str>,
    /// HTTP method.
    pub method: Option<&'a str>,
    /// Priority; `None`: from the method ([`Priority::of_method`]).
    pub priority: Option<Priority>,
    /// Units this request takes (1 by default; 0 looks without consuming).
    pub cost: u64,
}

impl Default for Request<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> Request<'a> {
    /// An empty request of cost 1.
    pub const fn new() -> Self {
        Self {
            customer: None,
            ip: None,
            api_key: None,
            route: None,
            method: None,
            priority: None,
            cost: 1,
        }
    }
    /// With a customer id.
    pub const fn customer(mut self, id: u64) -> Self {
        self.customer = Some(id);
        self
    }
    /// With a client address.
    pub fn ip(mut self, ip: impl Into<IpAddr>) -> Self {
        self.ip = Some(ip.into());
        self
    }
    /// With an API key.
    pub const fn api_key(mut self, key: &'a str) -> Self {
        self.api_key = Some(key);
        self
    }
    /// With a route.
    pub const fn route(mut self, route: &'a str) -> Self {
        self.route = Some(route);
        self
    }
    /// With a method.
    pub const fn method(mut self, method: &'a str) -> Self {
        self.method = Some(method);
        self
    }
    /// With an explicit priority.
    pub const fn priority(mut self, p: Priority) -> Self {
        self.priority = Some(p);
        self
    }
    /// With a cost.
    pub const fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }
    /// The priority, explicit or from the method.
    #[inline]
    pub fn effective_priority(&self) -> Priority {
        match self.priority {
            Some(p) => p,
            None => Priority::of_method(self.method),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods() {
        for (i, m) in METHODS.iter().enumerate() {
            assert_eq!(method_code(m), 1 << i);
            assert_eq!(method_code(&m.to_ascii_lowercase()), 1 << i);
        }
        assert_eq!(method_code("PURGE"), 0);
        assert_eq!(method_code("GETX"), 0);
        assert_eq!(method_code("GE"), 0);
        assert_eq!(method_code("G\u{5}T"), 0);
        assert_eq!(method_code("gEt"), 1);
        assert_eq!(method_code("POSTS"), 0);
        assert_eq!(method_code(""), 0);
        assert_eq!(method_code("CONNECTX"), 0);
        assert_eq!(method_code("GET\0"), 0);
        assert_eq!(method_code("get\0\0\0\0"), 0);
        assert_eq!(method_code("Patch"), 1 << 8);
        assert_eq!(method_code("OPTION"), 0);
        assert_eq!(method_code("OPTIONs"), 1 << 6);
        assert_eq!(method_code("PUT "), 0);
        for i in 0..METHOD_INDEXES as u8 {
            assert_eq!(index_bit(i).count_ones(), 1);
        }
        assert_eq!(method_bit(Some("PURGE")), M_OTHER);
        assert_eq!(method_bit(None), M_NONE);
        assert_eq!(Priority::of_method(Some("delete")), Priority::Post);
        assert_eq!(Priority::of_method(Some("GET")), Priority::Get);
        assert_eq!(Priority::of_method(None), Priority::Get);
    }
}
