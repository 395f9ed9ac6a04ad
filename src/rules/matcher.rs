//! Precompiled matching: which rules a request's route selects, and a request's key id under
//! a rule's key class. Nothing here allocates per request.
//!
//! **Routes.** Every route prefix of every rule goes into one sorted table. Each entry stores
//! the full list of rules a route gets when this entry is its longest matching prefix (its own
//! rules, those of every shorter prefix of it, and the rules without a route condition, in
//! file order), and the same lists filtered per (method index, priority) pair ([`Cands`]),
//! so that the check picks its rules by one table lookup. A lookup is one binary search plus
//! a walk up a short parent chain. The search
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
use super::request::{index_bit, method_bit, word, Priority, Request, METHOD_INDEXES};
use crate::keyed::KeyHasher;
use std::net::IpAddr;

const NONE: u32 = u32::MAX;

/// Route prefixes → candidate rules.
#[derive(Debug)]
pub(crate) struct RouteTable {
    /// First 8 bytes of each prefix as a word, sorted, padded with `u64::MAX` to a power of
    /// two (no route's word is `u64::MAX`: `0xff` never occurs in UTF-8), for a branch-free
    /// binary search.
    keys: Box<[u64]>,
    /// Per prefix: what the prefix test and the walk up the chain need, side by side.
    entries: Box<[Entry]>,
    prefixes: Box<[Box<[u8]>]>,
    unrouted: Cands,
}

/// One prefix of the table.
#[derive(Debug)]
struct Entry {
    /// First 8 bytes as a word.
    head: u64,
    /// Mask of its length in the word (all ones from 8 bytes up).
    mask: u64,
    /// Its length in bytes.
    len: u32,
    /// The longest other entry that is a proper prefix of it, or `NONE`.
    parent: u32,
    /// The rules of a route whose longest prefix in the table is this one.
    cands: Cands,
}

/// The rules a route selects, in file order: the enforcing ones (hard, soft, elastic), and
/// the shadow ones (evaluated after the enforcing ones admitted); and the same lists already
/// filtered by each (method index, priority) pair, so that the check path neither tests
/// the candidates' masks nor steps over the filtered-out ones.
#[derive(Debug)]
pub(crate) struct Cands {
    /// Every candidate of the route (filtered by [`Cand::admits`] on the check path).
    pub(crate) enforce: Box<[Cand]>,
    pub(crate) shadow: Box<[Cand]>,
    /// Per [`sel`] bit: the index in `lists` of the candidates that admit it.
    pick: [u8; SELS],
    /// The distinct filtered lists (at most [`SELS`]); when they would hold more than
    /// [`PICKED_BUDGET`] candidates, one list of every candidate instead (still filtered by
    /// the masks on the check path, never `single`).
    lists: Box<[Picked]>,
    /// Every [`sel`] picks the same list, whose candidates admit every [`sel`]: the request's
    /// method and priority need not be known to select its rules.
    pub(crate) uniform: bool,
    /// Per [`sel`] bit: the one rule of its list when that list is [`Picked::single`], else
    /// `NONE`: the one-rule check reads its rule here, one load, without reaching the list.
    one: [u32; SELS],
}

/// The candidates of a route that admit one (method index, priority) pair (or, over budget,
/// all of them).
#[derive(Debug, Default)]
pub(crate) struct Picked {
    pub(crate) enforce: Box<[Cand]>,
    pub(crate) shadow: Box<[Cand]>,
    /// Exactly one enforcing candidate, admitting this pair, and no shadow candidate.
    pub(crate) single: bool,
}

/// Number of [`sel`] bits: (method index, priority) pairs.
pub(crate) const SELS: usize = METHOD_INDEXES * 4;

/// Most candidates the filtered lists of one route may hold together (beyond it the route
/// keeps one unfiltered list): bounds their memory at 8 bytes × this per route prefix.
const PICKED_BUDGET: usize = 4096;

impl Cands {
    fn new(rules: &[Rule], select: impl Fn(u32) -> bool) -> Self {
        let pick = |shadow: bool| -> Box<[Cand]> {
            (0..rules.len() as u32)
                .filter(|&i| {
                    matches!(rules[i as usize].mode, super::model::Mode::Shadow) == shadow
                        && select(i)
                })
                .map(|i| Cand::new(i, &rules[i as usize]))
                .collect()
        };
        let (enforce, shadow) = (pick(false), pick(true));
        let filter = |l: &[Cand], s: u32| -> Box<[Cand]> {
            l.iter().copied().filter(|c| c.admits(s)).collect()
        };
        let mut lists: Vec<Picked> = Vec::new();
        let mut pick = [0u8; SELS];
        for s in 0..SELS as u32 {
            let (e, sh) = (filter(&enforce, s), filter(&shadow, s));
            let same = |p: &Picked| {
                p.enforce
                    .iter()
                    .map(|c| c.rule)
                    .eq(e.iter().map(|c| c.rule))
                    && p.shadow
                        .iter()
                        .map(|c| c.rule)
                        .eq(sh.iter().map(|c| c.rule))
            };
            let k = match lists.iter().position(same) {
                Some(k) => k,
                None => {
                    lists.push(Picked {
                        single: e.len() == 1 && sh.is_empty(),
                        enforce: e,
                        shadow: sh,
                    });
                    lists.len() - 1
                }
            };
            pick[s as usize] = k as u8;
        }
        let held: usize = lists.iter().map(|p| p.enforce.len() + p.shadow.len()).sum();
        if held > PICKED_BUDGET {
            lists = vec![Picked {
                enforce: enforce.clone(),
                shadow: shadow.clone(),
                single: false,
            }];
            pick = [0; SELS];
        }
        let all = u64::MAX >> (64 - SELS);
        let uniform = lists.len() == 1
            && lists[0]
                .enforce
                .iter()
                .chain(lists[0].shadow.iter())
                .all(|c| c.mask & all == all);
        let one = std::array::from_fn(|s| {
            let p = &lists[pick[s] as usize];
            if p.single {
                p.enforce[0].rule
            } else {
                NONE
            }
        });
        Self {
            enforce,
            shadow,
            pick,
            lists: lists.into(),
            uniform,
            one,
        }
    }

    /// The rule of the request when exactly one enforcing rule and no shadow rule admit
    /// [`sel`] bit `s` (the picked list is [`Picked::single`]), else `None`.
    #[inline(always)]
    pub(crate) fn single(&self, s: u32) -> Option<u32> {
        match self.one.get(s as usize) {
            Some(&r) if r != NONE => Some(r),
            _ => None,
        }
    }

    /// The candidates that admit [`sel`] bit `s` (`s < SELS`).
    #[inline(always)]
    pub(crate) fn picked(&self, s: u32) -> &Picked {
        &self.lists[self.pick[s as usize % SELS] as usize]
    }
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
        let unrouted = Cands::new(rules, |i| rules[i as usize].when.route_prefixes.is_empty());
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
        let entries: Box<[Entry]> = prefixes
            .iter()
            .zip(&parent)
            .map(|(p, &parent)| Entry {
                cands: Cands::new(rules, |i| {
                    let w = &rules[i as usize].when.route_prefixes;
                    w.is_empty() || w.iter().any(|q| p.starts_with(q.as_bytes()))
                }),
                head: word(p),
                mask: match p.len() {
                    0 => 0,
                    n if n >= 8 => u64::MAX,
                    n => u64::MAX << (8 * (8 - n)),
                },
                len: p.len() as u32,
                parent,
            })
            .collect();
        let mut keys: Vec<u64> = entries.iter().map(|e| e.head).collect();
        keys.resize(keys.len().max(1).next_power_of_two(), u64::MAX);
        Self {
            keys: keys.into(),
            entries,
            prefixes: prefixes.into(),
            unrouted,
        }
    }

    /// The longest list of enforcing candidates.
    pub(crate) fn max_enforcing(&self) -> usize {
        self.entries
            .iter()
            .map(|e| &e.cands)
            .chain(std::iter::once(&self.unrouted))
            .map(|c| c.enforce.len())
            .max()
            .unwrap_or(0)
    }

    /// The rules (in file order) whose route condition the route meets.
    #[inline(always)]
    pub(crate) fn candidates(&self, route: Option<&str>) -> &Cands {
        let Some(r) = route else {
            return &self.unrouted;
        };
        let r = r.as_bytes();
        let rh = word(r);
        // The number of heads ≤ `rh`: a binary search over the power-of-two `keys` (the
        // padding is never ≤ `rh`), unrolled for the common sizes.
        let keys = &*self.keys;
        let i = match keys.len() {
            1 => count_le::<1>(keys, rh),
            2 => count_le::<2>(keys, rh),
            4 => count_le::<4>(keys, rh),
            8 => count_le::<8>(keys, rh),
            16 => count_le::<16>(keys, rh),
            32 => count_le::<32>(keys, rh),
            64 => count_le::<64>(keys, rh),
            _ => keys.partition_point(|&h| h <= rh),
        };
        match keys.get(i.wrapping_sub(1)) {
            None => &self.unrouted,
            Some(&k) if k == rh => self.tied(r, rh, i),
            Some(_) => self.walk(r, rh, (i - 1) as u32),
        }
    }

    /// [`RouteTable::candidates`] when the greatest head ≤ the route's equals its first 8
    /// bytes: entries with an equal head sort among themselves by their full bytes.
    #[cold]
    #[inline(never)]
    fn tied(&self, r: &[u8], rh: u64, mut i: usize) -> &Cands {
        while i > 0 && self.keys[i - 1] == rh && *self.prefixes[i - 1] > *r {
            i -= 1;
        }
        if i == 0 {
            return &self.unrouted;
        }
        self.walk(r, rh, (i - 1) as u32)
    }

    /// From entry `j`, the greatest entry ≤ the route, up its prefix chain to the first entry
    /// that is a prefix of the route.
    #[inline]
    fn walk(&self, r: &[u8], rh: u64, mut j: u32) -> &Cands {
        while let Some(e) = self.entries.get(j as usize) {
            let hit = if e.len <= 8 {
                r.len() >= e.len as usize && rh & e.mask == e.head
            } else {
                rh == e.head && r.starts_with(&self.prefixes[j as usize])
            };
            if hit {
                return &e.cands;
            }
            j = e.parent;
        }
        &self.unrouted
    }
}

/// The number of `keys` ≤ `x`, for sorted `keys` of length `N` (a power of two): `log2 N`
/// halvings, each a compare and a conditional move (the masks keep every index provably in
/// bounds, so there are no bounds checks).
#[inline(always)]
fn count_le<const N: usize>(keys: &[u64], x: u64) -> usize {
    let Ok(keys) = <&[u64; N]>::try_from(keys) else {
        return keys.partition_point(|&h| h <= x);
    };
    let mut base = 0;
    let mut half = N / 2;
    while half > 0 {
        if keys[(base + half - 1) & (N - 1)] <= x {
            base += half;
        }
        half /= 2;
    }
    base + (keys[base & (N - 1)] <= x) as usize
}

/// A candidate rule of a route: its index and its method and priority conditions as one mask
/// over (method index, priority) pairs, so that filtering it is one bit test.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cand {
    /// Bit `sel(method index, priority)` is set if a request with that method and priority
    /// meets the rule's conditions.
    mask: u64,
    /// Index of the rule.
    pub(crate) rule: u32,
}

/// The bit of a (method index, priority) pair in [`Cand`]'s mask: 11 × 4 = 44 bits.
#[inline]
pub(crate) fn sel(method: u8, p: Priority) -> u32 {
    method as u32 * 4 + p.index() as u32
}

const _: () = assert!(METHOD_INDEXES * 4 <= 64);

impl Cand {
    fn new(i: u32, r: &Rule) -> Self {
        let cond = Conditions::build(r);
        let mut mask = 0u64;
        for m in 0..METHOD_INDEXES as u8 {
            for p in Priority::ALL {
                if cond.admit(index_bit(m), p.bit()) {
                    mask |= 1 << sel(m, p);
                }
            }
        }
        Self { mask, rule: i }
    }

    /// Whether a request with this [`sel`] bit meets the rule's conditions.
    #[inline]
    pub(crate) fn admits(&self, sel: u32) -> bool {
        self.mask >> sel & 1 != 0
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

/// An IPv4 address's group under a /`prefix` mask.
#[inline]
fn v4_mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix as u32)
    }
}

#[inline(never)]
fn ip_id(a: IpAddr, class: KeyClass, h: &KeyHasher) -> u64 {
    let v4 = |x: std::net::Ipv4Addr| (u32::from(x) & v4_mask(class.ipv4_prefix())) as u64;
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

/// A key class compiled for the check path: one-part classes need no loop; customer, global
/// and IPv4 ids are derived inline, anything that hashes out of line.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KeyPlan {
    Global,
    Customer,
    /// The class, and its IPv4 group mask.
    Ip(KeyClass, u32),
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
            KeyPart::Ip => KeyPlan::Ip(class, v4_mask(class.ipv4_prefix())),
            KeyPart::ApiKey => KeyPlan::ApiKey,
            KeyPart::Route => KeyPlan::Route,
            KeyPart::Method => KeyPlan::Method,
        }
    }

    /// The key id of `req`; `None` if the request lacks a part (the rule does not apply).
    #[inline]
    pub(crate) fn id(self, req: &Request<'_>, h: &KeyHasher) -> Option<u64> {
        match self {
            KeyPlan::Customer => req.customer,
            KeyPlan::Global => Some(0),
            KeyPlan::Ip(c, m) => match req.ip? {
                IpAddr::V4(x) => Some((u32::from(x) & m) as u64),
                a => Some(ip_id(a, c, h)),
            },
            _ => self.id_hashed(req, h),
        }
    }

    /// [`KeyPlan::id`] of the classes that hash.
    #[inline(never)]
    fn id_hashed(self, req: &Request<'_>, h: &KeyHasher) -> Option<u64> {
        match self {
            KeyPlan::Global | KeyPlan::Customer | KeyPlan::Ip(..) => self.id(req, h),
            KeyPlan::ApiKey => Some(h.bytes(req.api_key?.as_bytes())),
            KeyPlan::Route => Some(h.bytes(req.route?.as_bytes())),
            KeyPlan::Method => part_id(KeyPart::Method, KeyClass::global(), req, h),
            KeyPlan::Composite(c) => composite_id(c, req, h),
        }
    }
}

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
mod tests;
