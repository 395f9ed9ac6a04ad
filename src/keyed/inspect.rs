//! Explanations of one key's record: each limit's view ([`LimitPeek`]) beside the decision a
//! check would take, recording nothing and inserting nothing. Off the check path: the views
//! are a list, allocated per call.

use super::key::Key;
use super::ops::Inspect;
use super::per_check::LimitMismatch;
use super::store::Store;
use crate::algo::{Limit, LimitPeek};
use crate::clock::{Clock, Nanos};
use crate::decision::Decision;

impl<C: Clock> Store<C> {
    /// What a check of `cost` for `key` at `now` would answer ([`Store::evaluate_at`]) and each
    /// of the store's limits' view of the key's record, in the limits' order, from one visit
    /// of the record. Records nothing, inserts nothing.
    pub fn inspect_at<K: Key + ?Sized>(
        &self,
        key: &K,
        cost: u64,
        now: Nanos,
    ) -> (Decision, Vec<LimitPeek>) {
        let mut op = Inspect {
            by: &self.limits,
            now,
            cost,
        };
        self.run(key.key_id(&self.hasher), now, false, &mut op)
    }

    /// [`Store::inspect_at`] decided by `limit` (a limit given per check): one view.
    pub fn inspect_with_at<K: Key + ?Sized>(
        &self,
        key: &K,
        limit: &Limit,
        cost: u64,
        now: Nanos,
    ) -> Result<(Decision, Vec<LimitPeek>), LimitMismatch> {
        self.accepts(limit)?;
        let mut op = Inspect {
            by: limit,
            now,
            cost,
        };
        Ok(self.run(key.key_id(&self.hasher), now, false, &mut op))
    }
}

#[cfg(test)]
mod tests {
    use crate::algo::{Limit, Limits};
    use crate::keyed::Store;
    use std::time::Duration;

    /// Each view agrees with the store's own answers, and looking records nothing.
    #[test]
    fn views_agree_and_consume_nothing() {
        let limits = Limits::new(vec![
            Limit::fixed_window(3, Duration::from_secs(1)).unwrap(),
            Limit::fixed_window(5, Duration::from_secs(10)).unwrap(),
        ])
        .unwrap();
        let s = Store::builder(limits).capacity(64).build().unwrap();
        for n in 0..7u64 {
            let now = 1_000 + n;
            let (d, views) = s.inspect_at(&7u64, 2, now);
            let again = s.inspect_at(&7u64, 2, now);
            assert_eq!((d, views.clone()), again, "inspect consumes nothing");
            assert_eq!(d, s.evaluate_at(&7u64, 2, now));
            assert_eq!(views.len(), 2);
            let used = n.min(3);
            assert_eq!(views[0].held.limit, 3);
            assert_eq!(views[0].held.remaining, 3 - used, "after {n} checks");
            assert_eq!(views[1].held.remaining, 5 - used);
            assert_eq!(views[0].asked.allowed(), used + 2 <= 3);
            assert_eq!(d.allowed(), views.iter().all(|v| v.asked.allowed()));
            s.check_at(&7u64, 1, now);
        }
    }
}
/// An explanation's verdict is built from evaluations: each answers what the check at the
/// same state answers, admission or denial, its reset included (the sliding log's evaluation
/// once reported its window where the check reports its tick-rounded expiry).
#[cfg(test)]
mod evaluate_is_the_check {
    use crate::algo::{Limit, Limits};
    use crate::clock::ManualClock;
    use crate::keyed::Store;
    use std::time::Duration;

    #[test]
    fn for_every_algorithm() {
        let s1 = Duration::from_secs(1);
        let ls = [
            Limit::fixed_window(5, s1).unwrap(),
            Limit::sliding_window(8, Duration::from_secs(10)).unwrap(),
            Limit::token_bucket(9, 9, s1).unwrap(),
            Limit::sliding_log(4, Duration::from_secs(2)).unwrap(),
            Limit::window_ring(6, Duration::from_secs(3), 6).unwrap(),
            Limit::leaky_bucket(3, s1, 2, None).unwrap(),
        ];
        for l in ls {
            let s = Store::builder(Limits::new(vec![l]).unwrap())
                .capacity(64)
                .build_with_clock(ManualClock::new(0))
                .unwrap();
            let mut now = 1000;
            for dt in [
                274_478_737,
                332_803_969,
                225_725_431,
                1,
                5,
                100_000_000,
                300_000_000,
            ] {
                now += dt;
                for cost in [0, 1, 2] {
                    let e = s.evaluate_at(&0u64, cost, now);
                    let c = s.check_at(&0u64, cost, now);
                    assert_eq!(e, c, "{:?}, cost {cost} at {now}", l.algorithm());
                }
            }
        }
    }
}
