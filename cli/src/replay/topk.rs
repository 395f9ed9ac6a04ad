//! The most frequent keys of a stream in bounded memory: the space-saving sketch (Metwally,
//! Agrawal and El Abbadi, 2005) with `k` counters in an indexed min-heap.
//!
//! A tracked key's count is never below its true count and overestimates it by at most its
//! `error` (the count of the key it replaced), itself at most `n / k` for `n` events: every
//! key whose true count exceeds `n / k` is tracked. A key with `error` 0 has been tracked
//! since its first event: its count and first time are exact. Memory: `k` entries of a hash,
//! three counters and the key's text (at most [`MAX_TEXT`] bytes).

use super::distinct::Prehashed;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// The longest key text kept (longer ones are cut, with `…`).
pub const MAX_TEXT: usize = 96;

/// One tracked key.
#[derive(Clone, Debug)]
pub struct Entry {
    pub hash: u64,
    pub count: u64,
    /// How much `count` may exceed the true count.
    pub error: u64,
    /// The time of its first event since it was tracked (its first ever if `error` is 0).
    pub first: u64,
    pub text: String,
}

/// A space-saving sketch of `k` counters.
pub struct TopK {
    k: usize,
    heap: Vec<Entry>,
    pos: HashMap<u64, usize, BuildHasherDefault<Prehashed>>,
    /// Events counted.
    pub total: u64,
}

impl TopK {
    pub fn new(k: usize) -> TopK {
        TopK {
            k: k.max(1),
            heap: Vec::new(),
            pos: HashMap::default(),
            total: 0,
        }
    }

    /// Counts one event of key `hash`; `text` is asked only when the key starts being tracked.
    pub fn add(&mut self, hash: u64, at: u64, text: impl FnOnce(&mut String)) {
        self.total += 1;
        if let Some(&i) = self.pos.get(&hash) {
            self.heap[i].count += 1;
            self.down(i);
            return;
        }
        if self.heap.len() < self.k {
            let mut t = String::new();
            text(&mut t);
            cut(&mut t);
            self.heap.push(Entry {
                hash,
                count: 1,
                error: 0,
                first: at,
                text: t,
            });
            let i = self.heap.len() - 1;
            self.pos.insert(hash, i);
            self.up(i);
            return;
        }
        // Replace the least counted key (the heap's root).
        let old = self.heap[0].hash;
        self.pos.remove(&old);
        let e = &mut self.heap[0];
        e.error = e.count;
        e.count += 1;
        e.hash = hash;
        e.first = at;
        e.text.clear();
        text(&mut e.text);
        cut(&mut e.text);
        self.pos.insert(hash, 0);
        self.down(0);
    }

    /// The tracked keys, most counted first.
    pub fn top(&self, n: usize) -> Vec<Entry> {
        let mut v = self.heap.clone();
        v.sort_by(|a, b| b.count.cmp(&a.count).then(a.text.cmp(&b.text)));
        v.truncate(n);
        v
    }

    /// The bound on any count's overestimate: `total / k` once full, else 0.
    pub fn max_error(&self) -> u64 {
        if self.heap.len() < self.k {
            0
        } else {
            self.heap[0].count
        }
    }

    fn up(&mut self, mut i: usize) {
        while i > 0 {
            let p = (i - 1) / 2;
            if self.heap[p].count <= self.heap[i].count {
                break;
            }
            self.swap(i, p);
            i = p;
        }
    }

    fn down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < self.heap.len() && self.heap[l].count < self.heap[m].count {
                m = l;
            }
            if r < self.heap.len() && self.heap[r].count < self.heap[m].count {
                m = r;
            }
            if m == i {
                return;
            }
            self.swap(i, m);
            i = m;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos.insert(self.heap[a].hash, a);
        self.pos.insert(self.heap[b].hash, b);
    }
}

fn cut(t: &mut String) {
    if t.len() > MAX_TEXT {
        let mut n = MAX_TEXT;
        while !t.is_char_boundary(n) {
            n -= 1;
        }
        t.truncate(n);
        t.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against exact counts: every tracked count is within [true, true + error], the
        /// error within total / k, and every key above total / k is tracked.
        #[test]
        fn bounds_hold(keys in proptest::collection::vec(0u64..40, 0..400), k in 1usize..12) {
            let mut s = TopK::new(k);
            let mut exact: HashMap<u64, u64> = HashMap::new();
            for (t, &x) in keys.iter().enumerate() {
                s.add(x, t as u64, |o| o.push_str(&x.to_string()));
                *exact.entry(x).or_default() += 1;
            }
            let n = keys.len() as u64;
            let top = s.top(usize::MAX);
            for e in &top {
                let c = exact[&e.hash];
                prop_assert!(e.count >= c && e.count - e.error <= c, "{e:?} true {c}");
                prop_assert!(e.error <= n / k as u64);
                prop_assert_eq!(&e.text, &e.hash.to_string());
                if e.error == 0 {
                    prop_assert_eq!(e.count, c);
                    let first = keys.iter().position(|&x| x == e.hash).unwrap() as u64;
                    prop_assert_eq!(e.first, first);
                }
            }
            for (x, c) in exact {
                if c > n / k as u64 {
                    prop_assert!(top.iter().any(|e| e.hash == x), "{x} ({c}) lost");
                }
            }
        }
    }
}
