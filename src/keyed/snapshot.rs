//! Snapshots: every live record out as `(key id, words)`, and back in, for a store of the
//! same limits, seed and timeline (`turnstile serve` persists its stores with these).

use super::ops::{Export, Import};
use super::store::Store;
use crate::clock::{Clock, Nanos};

impl<C: Clock> Store<C> {
    /// Snapshot support: visits every live record of a *packed* store (one packed limit per
    /// key, [`Store::is_inline`]) as `(key id, state)`, where `state` is the limit's packed
    /// 63-bit state (e.g. a token bucket's TAT in ns of this store's clock). A scan, not
    /// linearizable: a record updated during the scan is seen before or after the update.
    /// Returns `false` (and visits nothing) for an arena store, whose records are not one word.
    ///
    /// Ids are hashes of the keys under this store's seed: a store that imports them must be
    /// built with the same [`StoreBuilder::seed`](super::StoreBuilder::seed). Times inside the state are this store's
    /// clock's: convert them before importing into a store on another clock.
    pub fn export_packed(&self, mut f: impl FnMut(u64, u64)) -> bool {
        if self.packed.is_none() {
            return false;
        }
        self.export_records(|id, words| f(id, words[0]));
        true
    }

    /// Snapshot support: sets key id `id`'s record in a packed store to `state` (from
    /// [`Store::export_packed`], its times converted to this store's clock), inserting it if
    /// absent. `now` is this store's clock's time (a full probe range reclaims idle records
    /// as of it, then follows the store's [`FullPolicy`](super::FullPolicy)). Returns whether the record is
    /// stored; `false` for an arena store, a state using bit 63, or no room.
    pub fn import_packed(&self, id: u64, state: u64, now: Nanos) -> bool {
        if self.packed.is_none() || state >> 63 != 0 {
            return false;
        }
        self.run(id, now, false, &mut Import { words: &[state] })
    }

    /// Words of one record as [`Store::export_records`] gives them: 1 for a packed store,
    /// [`Limits::words`](crate::Limits::words) for an arena store.
    pub fn record_words(&self) -> usize {
        if self.packed.is_some() {
            1
        } else {
            self.limits.words()
        }
    }

    /// Snapshot support for any store: visits every live record as `(key id, words)`, where
    /// `words` are [`Store::record_words`] words: a packed store's state (as
    /// [`Store::export_packed`]), or an arena record's state words, read under the record's
    /// writer bit (so each record is whole). A scan, not linearizable. Ids are hashes under
    /// this store's seed and times are this store's clock's: import into a store of the same
    /// limits and seed whose clock continues this one's timeline.
    pub fn export_records(&self, mut f: impl FnMut(u64, &[u64])) {
        let words = self.record_words();
        let mut buf = Vec::with_capacity(words);
        let mut ids = Vec::new();
        for s in self.shards.iter() {
            ids.clear();
            s.for_each_live(|id| ids.push(id));
            for &id in &ids {
                // Reads the record: no CAS is made (the state is left as it is), and the arena
                // words are read under the record's writer bit.
                let mut op = Export {
                    words,
                    into: &mut buf,
                };
                if self.run(id, 0, false, &mut op) {
                    f(id, &buf);
                }
            }
        }
    }

    /// Snapshot support for any store: sets key id `id`'s record to `words` (from
    /// [`Store::export_records`] of a store with the same limits and seed, on a clock that
    /// this store's continues), inserting it if absent. `now` is this store's clock's time (a
    /// full probe range reclaims idle records as of it, then follows the store's
    /// [`FullPolicy`](super::FullPolicy)). Returns whether the record is stored; `false` if `words` is not
    /// [`Store::record_words`] long, a packed state uses bit 63, or there is no room.
    pub fn import_record(&self, id: u64, words: &[u64], now: Nanos) -> bool {
        if words.len() != self.record_words() {
            return false;
        }
        if self.packed.is_some() {
            return self.import_packed(id, words[0], now);
        }
        self.run(id, now, false, &mut Import { words })
    }
}
