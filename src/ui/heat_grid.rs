//! The step-time heatmap's state, kept as frames arrive: every rank's step times summed into
//! buckets of a power-of-two number of steps, the same buckets for every rank. A frame then
//! reads 8 bytes per rank and bucket (at most `MAX_BUCKETS`), not every rank's chart series
//! (4,096 ranks × 128 entries × 56 bytes was 29 MB a frame). When a step lands past the last
//! bucket the buckets double in width, pairs merging, so memory stays fixed and a long run's
//! start stays on the map.

/// Buckets per rank; the heatmap draws at most this many columns.
pub const MAX_BUCKETS: usize = 256;

#[derive(Clone, Debug, Default)]
pub struct HeatGrid {
    /// The first step of bucket 0, once a point has arrived.
    base: Option<u64>,
    /// Steps per bucket: a power of two.
    width: u64,
    /// Buckets in use: up to the newest point's.
    used: usize,
    ranks: usize,
    /// rank × MAX_BUCKETS, by rank.
    sums: Vec<f32>,
    counts: Vec<u32>,
}

impl HeatGrid {
    /// Adds `count` points of `rank` whose values sum to `sum`, at `step`.
    pub fn add(&mut self, rank: usize, step: u64, sum: f64, count: u64) {
        if !sum.is_finite() || count == 0 {
            return;
        }
        if rank >= self.ranks {
            self.ranks = rank + 1;
            self.sums.resize(self.ranks * MAX_BUCKETS, 0.0);
            self.counts.resize(self.ranks * MAX_BUCKETS, 0);
        }
        let b = self.bucket_of(step);
        self.used = self.used.max(b + 1);
        let i = rank * MAX_BUCKETS + b;
        self.sums[i] += sum as f32;
        self.counts[i] = self.counts[i].saturating_add(count.min(u64::from(u32::MAX)) as u32);
    }

    /// The bucket `step` falls in, widening or moving the buckets first where it lies outside.
    fn bucket_of(&mut self, step: u64) -> usize {
        let Some(mut base) = self.base else {
            (self.base, self.width) = (Some(step), 1);
            return 0;
        };
        if step < base {
            // An earlier step (history arriving after live frames): shift every rank's buckets
            // right by whole buckets, widening first if they would not fit.
            loop {
                let shift = (base - step).div_ceil(self.width) as usize;
                if self.used + shift <= MAX_BUCKETS {
                    self.shift_right(shift);
                    base -= shift as u64 * self.width;
                    self.base = Some(base);
                    break;
                }
                self.double();
            }
        }
        while step - base >= self.width * MAX_BUCKETS as u64 {
            self.double();
        }
        ((step - base) / self.width) as usize
    }

    fn double(&mut self) {
        for r in 0..self.ranks {
            let row = r * MAX_BUCKETS;
            for b in 0..MAX_BUCKETS / 2 {
                let (a, c) = (row + 2 * b, row + 2 * b + 1);
                (self.sums[row + b], self.counts[row + b]) =
                    (self.sums[a] + self.sums[c], self.counts[a].saturating_add(self.counts[c]));
            }
            self.sums[row + MAX_BUCKETS / 2..row + MAX_BUCKETS].fill(0.0);
            self.counts[row + MAX_BUCKETS / 2..row + MAX_BUCKETS].fill(0);
        }
        self.width *= 2;
        self.used = self.used.div_ceil(2);
    }

    fn shift_right(&mut self, by: usize) {
        for r in 0..self.ranks {
            let row = r * MAX_BUCKETS;
            self.sums.copy_within(row..row + self.used, row + by);
            self.counts.copy_within(row..row + self.used, row + by);
            self.sums[row..row + by].fill(0.0);
            self.counts[row..row + by].fill(0);
        }
        self.used += by;
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Buckets in use (the map's width in buckets).
    pub fn used(&self) -> usize {
        self.used
    }

    /// Rank `rank`'s mean over buckets `range`, None where it has no point there.
    pub fn mean(&self, rank: usize, range: std::ops::Range<usize>) -> Option<f64> {
        let row = rank * MAX_BUCKETS;
        let end = range.end.min(MAX_BUCKETS);
        let (mut sum, mut count) = (0.0f64, 0u64);
        for b in range.start.min(end)..end {
            sum += f64::from(self.sums[row + b]);
            count += u64::from(self.counts[row + b]);
        }
        (count > 0).then(|| sum / count as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_runs_get_a_bucket_per_step_and_long_ones_widen_without_losing_points() {
        let mut g = HeatGrid::default();
        for step in 1..=10u64 {
            g.add(0, step, step as f64, 1);
            g.add(2, step, 2.0 * step as f64, 1);
        }
        assert_eq!((g.used(), g.ranks()), (10, 3));
        assert_eq!(g.mean(0, 4..5), Some(5.0));
        assert_eq!(g.mean(1, 0..10), None, "rank 1 sent nothing");
        for step in 11..=1000u64 {
            g.add(0, step, 1.0, 1);
        }
        assert!(g.used() <= MAX_BUCKETS && g.used() > MAX_BUCKETS / 4, "{}", g.used());
        // Every point is still there: 1+…+10 and 990 ones, over 1000 points.
        let all = g.mean(0, 0..g.used()).unwrap();
        assert!((all - (55.0 + 990.0) / 1000.0).abs() < 1e-9, "{all}");
        assert_eq!(g.mean(2, 0..g.used()), Some(11.0));
    }

    #[test]
    fn an_earlier_step_moves_the_buckets_instead_of_being_lost() {
        let mut g = HeatGrid::default();
        g.add(0, 100, 4.0, 1);
        g.add(1, 40, 2.0, 1);
        assert_eq!(g.mean(1, 0..1), Some(2.0));
        assert_eq!(g.mean(0, 0..g.used()), Some(4.0));
        assert_eq!(g.used(), 61);
        assert_eq!(g.mean(0, 60..61), Some(4.0));
        // Far earlier than 256 buckets of one step reach: they widen first.
        let mut far = HeatGrid::default();
        far.add(0, 1000, 4.0, 1);
        far.add(1, 1, 6.0, 2);
        assert!(far.used() <= MAX_BUCKETS && far.used() > 1, "{}", far.used());
        assert_eq!((far.mean(0, 0..far.used()), far.mean(1, 0..far.used())), (Some(4.0), Some(3.0)));
        assert_eq!(far.mean(1, 0..1), Some(3.0), "step 1 is in the first bucket");
        // Nothing finite, nothing counted.
        g.add(0, 5, f64::NAN, 1);
        assert_eq!(g.mean(0, 0..g.used()), Some(4.0));
    }
}
