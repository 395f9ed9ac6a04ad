//! Precompiled matching: which rules a request's route selects, and a request's key id under
//! a rule's key class. Nothing here allocates per request.
//!
//! **Routes.** Every route prefix of every rule goes into one sorted table. Each entry stores
//! the full list of rules a route gets when this entry is its longest matching prefix (its own
//! rules, those of every shorter prefix of it, and the rules without a route condition, in
//! file order). A lookup is one binary search plus a walk up a short parent chain. The search
//! compares the first 8 bytes as one word (big-endian, zero-padded: the same order) and the
//! full strings only on a tie; a prefix test of up to 8 bytes is one masked compare.
//!
//! * let `e` be the greatest entry ≤ the route. The longest prefix `m` of the route in the
//!   table is ≤ the route, and every string between `m` and the route starts with `m` (the
//!   strings starting with `m` are one contiguous range of the order), so `m` is a prefix of
//!   `e`: it is `e` or one of `e`'s ancestors in the prefix chain, and the first of those
//!   that is a prefix of the route.
//!
//! **Keys.** A one-part key is that part's id, as the keyed store would make it (a customer id
//! as is, an IPv4 group as its 32 bits, an IPv6 group hashed and kept above 2^32 so that it
//! never equals an IPv4 id, strings hashed). A composite key hashes its parts' ids, written
//! to a stack buffer in canonical order.

use super::model::{KeyClass, KeyPart, Rule};
use super::request::{method_bit, word, Request};
use crate::keyed::KeyHasher;
use std::net::IpAddr;

const NONE: u32 = u32::MAX;

/// Route prefixes → candidate rules.
#[derive(Debug)]
pub(crate) struct RouteTable {
    /// First 8 bytes of each prefix as a word, and the mask of its length (if ≤ 8).
    heads: Box<[(u64, u64)]>,
    prefixes: Box<[Box<[u8]>]>,
    parent: Box<[u32]>,
    rules: Box<[Box<[Cand]>]>,
    unrouted: Box<[Cand]>,
}

impl RouteTable {
    pub(crate) fn build(rules: &[Rule]) -> Self {
        let mut prefixes: Vec<Box<[u8]>> = rules
            .iter()
            .flat_map(|r| r.when.route_prefixes.iter())
            .map(|p| p.as_bytes().into())
            .collect();
        prefixes.sort();
        prefixes.dedup();
        let cand = |i: u32| Cand::new(i, &rules[i as usize]);
        let unrouted: Box<[Cand]> = (0..rules.len() as u32)
            .filter(|&i| rules[i as usize].when.route_prefixes.is_empty())
            .map(cand)
            .collect();
        // Parent: the longest other entry that is a proper prefix. Entries are sorted, so a
        // prefix of entry k sorts before it; walk back along the previous entry's chain.
        let mut parent = vec![NONE; prefixes.len()];
        for k in 1..prefixes.len() {
            let mut j = (k - 1) as u32;
            while j != NONE && !prefixes[k].starts_with(&prefixes[j as usize]) {
                j = parent[j as usize];
            }
            parent[k] = j;
        }
        let lists = prefixes
            .iter()
            .map(|e| {
                (0..rules.len() as u32)
                    .filter(|&i| {
                        let w = &rules[i as usize].when.route_prefixes;
                        w.is_empty() || w.iter().any(|p| e.starts_with(p.as_bytes()))
                    })
                    .map(cand)
                    .collect()
            })
            .collect();
        let heads = prefixes
            .iter()
            .map(|p| {
                let mask = match p.len() {
                    0 => 0,
                    n if n >= 8 => u64::MAX,
                    n => u64::MAX << (8 * (8 - n)),
                };
                (word(p), mask)
            })
            .collect();
        Self {
            heads,
            prefixes: prefixes.into(),
            parent: parent.into(),
            rules: lists,
            unrouted,
        }
    }

    /// The rules (in file order) whose route condition the route meets.
    #[inline]
    pub(crate) fn candidates(&self, route: Option<&str>) -> &[Cand] {
        let Some(r) = route else {
            return &self.unrouted;
        };
        let r = r.as_bytes();
        let rh = word(r);
        let i = self.heads.partition_point(|&(h, _)| h <= rh);
        // Entries with an equal head sort among themselves by their full bytes.
        let mut i = i;
        while i > 0 && self.heads[i - 1].0 == rh && *self.prefixes[i - 1] > *r {
            i -= 1;
        }
        if i == 0 {
            return &self.unrouted;
        }
        let mut j = (i - 1) as u32;
        while j != NONE {
            let k = j as usize;
            let (h, mask) = self.heads[k];
            let p = &self.prefixes[k];
            let hit = if p.len() <= 8 {
                r.len() >= p.len() && rh & mask == h
            } else {
                rh == h && r.starts_with(p)
            };
            if hit {
                return &self.rules[k];
            }
            j = self.parent[k];
        }
        &self.unrouted
    }
}

/// A candidate rule of a route: its index and what can be filtered without touching it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cand {
    /// Index of the rule.
    pub(crate) rule: u32,
    /// Its method and priority conditions.
    pub(crate) cond: Conditions,
    /// Whether it is a shadow rule (evaluated after the enforcing ones).
    pub(crate) shadow: bool,
}

impl Cand {
    fn new(i: u32, r: &Rule) -> Self {
        Self {
            rule: i,
            cond: Conditions::build(r),
            shadow: matches!(r.mode, super::model::Mode::Shadow),
        }
    }
}

/// A rule's method and priority conditions as bit masks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Conditions {
    methods: u16,
    priorities: u8,
}

impl Conditions {
    pub(crate) fn build(rule: &Rule) -> Self {
        let methods = if rule.when.methods.is_empty() {
            u16::MAX
        } else {
            rule.when
                .methods
                .iter()
                .fold(0, |m, s| m | method_bit(Some(s)))
        };
        let priorities = if rule.when.priorities.is_empty() {
            u8::MAX
        } else {
            rule.when.priorities.iter().fold(0, |m, p| m | p.bit())
        };
        Self {
            methods,
            priorities,
        }
    }

    /// Whether a request with this method bit and priority bit meets them.
    #[inline]
    pub(crate) fn admit(&self, method: u16, priority: u8) -> bool {
        self.methods & method != 0 && self.priorities & priority != 0
    }
}

#[inline]
fn ip_id(a: IpAddr, class: KeyClass, h: &KeyHasher) -> u64 {
    let v4 = |x: std::net::Ipv4Addr| {
        let p = class.ipv4_prefix() as u32;
        let m = if p == 0 { 0 } else { u32::MAX << (32 - p) };
        (u32::from(x) & m) as u64
    };
    match a {
        IpAddr::V4(x) => v4(x),
        IpAddr::V6(x) => match x.to_ipv4_mapped() {
            Some(x4) => v4(x4),
            None => {
                let p = class.ipv6_prefix() as u32;
                let m = if p == 0 { 0 } else { u128::MAX << (128 - p) };
                let id = h.bytes(&(u128::from(x) & m).to_be_bytes());
                // Keep IPv6 ids out of the IPv4 range.
                id | 1 << 63
            }
        },
    }
}

#[inline]
fn part_id(p: KeyPart, class: KeyClass, req: &Request<'_>, h: &KeyHasher) -> Option<u64> {
    Some(match p {
        KeyPart::Customer => req.customer?,
        KeyPart::Ip => ip_id(req.ip?, class, h),
        KeyPart::ApiKey => h.bytes(req.api_key?.as_bytes()),
        KeyPart::Route => h.bytes(req.route?.as_bytes()),
        KeyPart::Method => {
            let m = req.method?;
            match method_bit(Some(m)) {
                super::request::M_OTHER => h.bytes(m.as_bytes()) | 1 << 63,
                b => b as u64,
            }
        }
    })
}

/// A key class compiled for the check path: one-part classes need no loop.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KeyPlan {
    Global,
    Customer,
    Ip(KeyClass),
    ApiKey,
    Route,
    Method,
    Composite(KeyClass),
}

impl KeyPlan {
    pub(crate) fn new(class: KeyClass) -> Self {
        let bits = class.bits();
        if bits == 0 {
            return KeyPlan::Global;
        }
        if !bits.is_power_of_two() {
            return KeyPlan::Composite(class);
        }
        match KeyPart::ALL[bits.trailing_zeros() as usize] {
            KeyPart::Customer => KeyPlan::Customer,
            KeyPart::Ip => KeyPlan::Ip(class),
            KeyPart::ApiKey => KeyPlan::ApiKey,
            KeyPart::Route => KeyPlan::Route,
            KeyPart::Method => KeyPlan::Method,
        }
    }

    /// The key id of `req`; `None` if the request lacks a part (the rule does not apply).
    #[inline]
    pub(crate) fn id(self, req: &Request<'_>, h: &KeyHasher) -> Option<u64> {
        match self {
            KeyPlan::Global => Some(0),
            KeyPlan::Customer => req.customer,
            KeyPlan::Ip(c) => Some(ip_id(req.ip?, c, h)),
            KeyPlan::ApiKey => Some(h.bytes(req.api_key?.as_bytes())),
            KeyPlan::Route => Some(h.bytes(req.route?.as_bytes())),
            KeyPlan::Method => part_id(KeyPart::Method, KeyClass::global(), req, h),
            KeyPlan::Composite(c) => composite_id(c, req, h),
        }
    }
}

#[inline(never)]
fn composite_id(class: KeyClass, req: &Request<'_>, h: &KeyHasher) -> Option<u64> {
    let mut buf = [0u8; 8 * KeyPart::ALL.len() + 1];
    buf[0] = class.bits();
    let mut n = 1;
    for p in class.parts() {
        buf[n..n + 8].copy_from_slice(&part_id(p, class, req, h)?.to_le_bytes());
        n += 8;
    }
    Some(h.bytes(&buf[..n]))
}

/// The key id of `req` under `class` (see [`KeyPlan::id`]).
pub(crate) fn key_id(class: KeyClass, req: &Request<'_>, h: &KeyHasher) -> Option<u64> {
    KeyPlan::new(class).id(req, h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::model::Rule;

    fn rule(prefixes: &[&str]) -> Rule {
        let mut r = Rule::new("r", KeyClass::global());
        r.when.route_prefixes = prefixes.iter().map(|s| s.to_string()).collect();
        r
    }

    #[test]
    fn longest_prefix_lists() {
        let rules = vec![
            rule(&[]),
            rule(&["/v1/"]),
            rule(&["/v1/charges"]),
            rule(&["/v1/charges/refunds", "/v2/"]),
            rule(&["/v1/cust"]),
            rule(&["/v1/\0\0", "/v1/charges/refunds/x/y"]),
        ];
        let t = RouteTable::build(&rules);
        let c = |r: Option<&str>| t.candidates(r).iter().map(|c| c.rule).collect::<Vec<_>>();
        assert_eq!(c(None), vec![0]);
        assert_eq!(c(Some("/health")), vec![0]);
        assert_eq!(c(Some("/v1")), vec![0]);
        assert_eq!(c(Some("/v1/")), vec![0, 1]);
        assert_eq!(c(Some("/v1/balance")), vec![0, 1]);
        assert_eq!(c(Some("/v1/charges")), vec![0, 1, 2]);
        assert_eq!(c(Some("/v1/charges/x")), vec![0, 1, 2]);
        assert_eq!(c(Some("/v1/charges/refunds/9")), vec![0, 1, 2, 3]);
        assert_eq!(c(Some("/v1/customers")), vec![0, 1, 4]);
        assert_eq!(c(Some("/v1/d")), vec![0, 1]);
        assert_eq!(c(Some("/v2/x")), vec![0, 3]);
        assert_eq!(c(Some("/zzz")), vec![0]);
        assert_eq!(c(Some("")), vec![0]);
        assert_eq!(c(Some("/v1/charges/refund")), vec![0, 1, 2]);
        assert_eq!(c(Some("/v1/c")), vec![0, 1]);
        assert_eq!(c(Some("/v1/\0")), vec![0, 1]);
        assert_eq!(c(Some("/v2/")), vec![0, 3]);
        assert_eq!(c(Some("/v2")), vec![0]);
    }

    proptest::proptest! {
        /// The table against the definition: rule i is a candidate iff it has no route
        /// condition or one of its prefixes is a prefix of the route.
        #[test]
        fn table_matches_naive(
            sets in proptest::collection::vec(proptest::collection::vec("[/ab\\x00]{0,10}", 0..3), 1..8),
            routes in proptest::collection::vec("[/ab\\x00]{0,12}", 1..20),
        ) {
            let rules: Vec<Rule> = sets
                .iter()
                .map(|ps| rule(&ps.iter().filter(|p| !p.is_empty()).map(|s| s.as_str()).collect::<Vec<_>>()))
                .collect();
            let t = RouteTable::build(&rules);
            for r in &routes {
                let want: Vec<u32> = (0..rules.len() as u32)
                    .filter(|&i| {
                        let w = &rules[i as usize].when.route_prefixes;
                        w.is_empty() || w.iter().any(|p| r.starts_with(p.as_str()))
                    })
                    .collect();
                let got: Vec<u32> = t.candidates(Some(r)).iter().map(|c| c.rule).collect();
                proptest::prop_assert_eq!(got, want, "route {:?}", r);
            }
        }
    }

    #[test]
    fn composite_ids_differ_by_part() {
        let h = KeyHasher::with_seed(7, 64);
        let cr = KeyClass::customer().and(KeyPart::Route);
        let a = Request::new().customer(1).route("/a");
        let b = Request::new().customer(1).route("/b");
        assert_ne!(key_id(cr, &a, &h), key_id(cr, &b, &h));
        assert_eq!(key_id(cr, &Request::new().customer(1), &h), None);
        assert_eq!(key_id(KeyClass::customer(), &a, &h), Some(1));
        let ip = KeyClass::ip().ip_prefix(24, 48);
        let x = Request::new().ip("10.1.2.3".parse::<IpAddr>().unwrap());
        let y = Request::new().ip("10.1.2.200".parse::<IpAddr>().unwrap());
        assert_eq!(key_id(ip, &x, &h), Some(0x0a01_0200));
        assert_eq!(key_id(ip, &x, &h), key_id(ip, &y, &h));
        let m = Request::new().ip("::ffff:10.1.2.9".parse::<IpAddr>().unwrap());
        assert_eq!(key_id(ip, &m, &h), Some(0x0a01_0200));
    }
}
