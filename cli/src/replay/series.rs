//! Counts per minute over the log's time span, in bounded memory: one row of counters per
//! bucket, buckets of one minute while they fit in [`CELLS`] counters, then twice as wide
//! (pairs merged) each time the span outgrows them. So memory is at most 8 MiB whatever the
//! span, and a span of `d` minutes keeps one-minute resolution while `d` × columns ≤ 2^20
//! (with 10 rules, about 2 months).

/// The most counters kept (8 bytes each).
pub const CELLS: usize = 1 << 20;
const MINUTE: u64 = 60_000_000_000;

/// Columns of counters per time bucket.
pub struct Series {
    start: u64,
    width: u64,
    cols: usize,
    max_buckets: usize,
    data: Vec<u64>,
}

impl Series {
    /// `cols` counters per bucket.
    pub fn new(cols: usize) -> Series {
        Series {
            start: u64::MAX,
            width: MINUTE,
            cols,
            max_buckets: (CELLS / cols.max(1)).max(64),
            data: Vec::new(),
        }
    }

    /// Adds `n` to column `col` at time `t` (ns). Times must not go backwards by more than a
    /// bucket (the replay's merged stream never goes backwards).
    #[inline]
    pub fn add(&mut self, t: u64, col: usize, n: u64) {
        if self.start == u64::MAX {
            self.start = t - t % MINUTE;
        }
        let mut i = (t.saturating_sub(self.start) / self.width) as usize;
        while i >= self.max_buckets {
            self.coarsen();
            i = (t.saturating_sub(self.start) / self.width) as usize;
        }
        let need = (i + 1) * self.cols;
        if self.data.len() < need {
            self.data.resize(need, 0);
        }
        self.data[i * self.cols + col] += n;
    }

    fn coarsen(&mut self) {
        let rows = self.data.len() / self.cols;
        let half = rows.div_ceil(2);
        for r in 0..half {
            for c in 0..self.cols {
                let a = self.data[2 * r * self.cols + c];
                let b = self
                    .data
                    .get((2 * r + 1) * self.cols + c)
                    .copied()
                    .unwrap_or(0);
                self.data[r * self.cols + c] = a + b;
            }
        }
        self.data.truncate(half * self.cols);
        self.width *= 2;
    }

    /// The bucket width in ns.
    pub fn width(&self) -> u64 {
        self.width
    }

    /// Buckets: (start time ns, counters).
    pub fn rows(&self) -> impl Iterator<Item = (u64, &[u64])> {
        self.data
            .chunks(self.cols)
            .enumerate()
            .map(|(i, c)| (self.start + i as u64 * self.width, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_then_coarser() {
        let mut s = Series::new(2);
        let t0 = 1_000 * MINUTE + 5;
        s.add(t0, 0, 1);
        s.add(t0 + MINUTE, 1, 2);
        s.add(t0 + 3 * MINUTE, 0, 1);
        let rows: Vec<(u64, Vec<u64>)> = s.rows().map(|(t, c)| (t, c.to_vec())).collect();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[1], (1001 * MINUTE, vec![0, 2]));
        // A span past the bound: wider buckets, the totals kept.
        let far = t0 + (s.max_buckets as u64 * 3) * MINUTE;
        s.add(far, 0, 1);
        assert_eq!(s.width(), 4 * MINUTE);
        assert!(s.rows().count() <= s.max_buckets);
        let total: u64 = s.rows().map(|(_, c)| c[0] + c[1]).sum();
        assert_eq!(total, 5);
        // Minutes 0 to 3 in the first bucket of 4 minutes.
        assert_eq!(s.rows().next().unwrap().1, &[2, 2]);
    }
}
