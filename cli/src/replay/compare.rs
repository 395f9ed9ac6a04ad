//! `--compare OTHER_RULES`: the same requests through a second rules file, in the same pass,
//! and what changes: requests denied by one and allowed by the other, and the keys they
//! belong to (the key of the rule that denied, under that rule's key class), in bounded
//! memory (a space-saving sketch per direction, a distinct count of the keys that changed).

use super::distinct::Distinct;
use super::keys::{self, View};
use super::tally::{Outcome, Tally, TOP_K};
use super::topk::TopK;
use std::hash::{BuildHasher, Hasher};

/// The changes between the base rules' decisions and the other rules'.
pub struct Diff {
    /// Allowed by the base rules, denied by the other.
    pub newly_denied: u64,
    /// Denied by the base rules, allowed by the other.
    pub newly_allowed: u64,
    pub denied_keys: TopK,
    pub allowed_keys: TopK,
    /// Keys with at least one change.
    pub changed: Distinct,
    text: String,
}

impl Default for Diff {
    fn default() -> Self {
        Diff {
            newly_denied: 0,
            newly_allowed: 0,
            denied_keys: TopK::new(TOP_K),
            allowed_keys: TopK::new(TOP_K),
            changed: Distinct::default(),
            text: String::new(),
        }
    }
}

impl Diff {
    /// Counts request `v`'s decisions: `a` by the base rules (`ta`), `b` by the other (`tb`).
    #[inline]
    pub fn add(&mut self, v: &View<'_>, now: u64, a: Outcome, ta: &Tally, b: Outcome, tb: &Tally) {
        if a.allowed == b.allowed {
            return;
        }
        // The rule that denied, in whichever run denied.
        let (t, o) = if a.allowed { (tb, b) } else { (ta, a) };
        let Some(rule) = o.denier.map(|i| &t.rules[i]) else {
            // Denied by no rule (shed): nothing to name.
            return;
        };
        let Some(h) = keys::hash(rule.class, v) else {
            return;
        };
        let mut x = foldhash::fast::FixedState::with_seed(3).build_hasher();
        x.write(rule.name.as_bytes());
        x.write_u64(h);
        let h = x.finish();
        self.changed.add(h);
        let text = &mut self.text;
        let label = |out: &mut String| {
            text.clear();
            keys::text(rule.class, v, text);
            out.push_str(&format!("{} ({})", text, rule.name));
        };
        if a.allowed {
            self.newly_denied += 1;
            self.denied_keys.add(h, now, label);
        } else {
            self.newly_allowed += 1;
            self.allowed_keys.add(h, now, label);
        }
    }
}
