//! Bounded chart series: entries of (first..=last step, min, max, sum, count, last). When full,
//! the older half merges pairwise, so memory stays fixed and a spike at any zoom stays visible.
use crate::store::rollup::Bucket;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agg {
    pub first: u64,
    pub step: u64,
    pub min: f64,
    pub max: f64,
    pub sum: f64,
    pub count: u64,
    pub last: f64,
}

impl Agg {
    pub fn point(step: u64, v: f64) -> Agg {
        Agg { first: step, step, min: v, max: v, sum: v, count: 1, last: v }
    }

    /// A stored rollup bucket (or a raw point sent as a bucket of one).
    pub fn from_bucket(b: &Bucket) -> Agg {
        let first = b.last_step.saturating_sub(b.count.saturating_sub(1));
        Agg { first, step: b.last_step, min: b.min, max: b.max, sum: b.sum, count: b.count, last: b.last }
    }

    pub fn merge(&mut self, o: &Agg) {
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.sum += o.sum;
        self.count += o.count;
        self.first = self.first.min(o.first);
        if o.step >= self.step {
            self.step = o.step;
            self.last = o.last;
        }
    }

    pub fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }
}

#[derive(Clone, Debug)]
pub struct Series {
    entries: Vec<Agg>,
    cap: usize,
}

impl Series {
    pub fn new(cap: usize) -> Series {
        Series { entries: Vec::new(), cap: cap.max(8) }
    }

    pub fn entries(&self) -> &[Agg] {
        &self.entries
    }

    pub fn last(&self) -> Option<&Agg> {
        self.entries.last()
    }

    pub fn last_step(&self) -> Option<u64> {
        self.entries.last().map(|a| a.step)
    }

    /// Adds an aggregate: merged into the entry that covers its step, else inserted in order.
    /// Non-finite values are left out (the events panel reports NaN losses).
    pub fn add(&mut self, a: Agg) {
        if !(a.min.is_finite() && a.max.is_finite() && a.sum.is_finite()) {
            return;
        }
        match self.entries.last_mut() {
            None => self.entries.push(a),
            Some(l) if l.step < a.first => self.entries.push(a),
            Some(_) => {
                let i = self.entries.partition_point(|e| e.step < a.step);
                match self.entries.get_mut(i) {
                    Some(e) if e.first <= a.step => e.merge(&a),
                    _ => self.entries.insert(i, a),
                }
            }
        }
        if self.entries.len() > self.cap {
            self.compact();
        }
    }

    /// Merges the older half pairwise.
    fn compact(&mut self) {
        let half = self.entries.len() / 2;
        let mut out = Vec::with_capacity(self.cap);
        let mut it = self.entries[..half].chunks(2);
        for pair in it.by_ref() {
            let mut a = pair[0];
            if let Some(b) = pair.get(1) {
                a.merge(b);
            }
            out.push(a);
        }
        out.extend_from_slice(&self.entries[half..]);
        self.entries = out;
    }

    /// Folds entries into `n` columns over [x0, x1] by `x_of(step)`; empty columns are None.
    pub fn columns(&self, n: usize, x0: f64, x1: f64, x_of: &dyn Fn(u64) -> f64) -> Vec<Option<Agg>> {
        let mut cols: Vec<Option<Agg>> = vec![None; n];
        if n == 0 || x1 <= x0 {
            if let (Some(c), Some(l)) = (cols.first_mut(), self.entries.last()) {
                *c = Some(*l);
            }
            return cols;
        }
        let start = self.entries.partition_point(|e| x_of(e.step) < x0);
        for e in &self.entries[start..] {
            let x = x_of(e.step);
            if x > x1 {
                break;
            }
            let c = ((x - x0) / (x1 - x0) * n as f64).floor() as usize;
            match &mut cols[c.min(n - 1)] {
                Some(agg) => agg.merge(e),
                slot => *slot = Some(*e),
            }
        }
        cols
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_keeps_the_spike_and_the_totals() {
        let mut s = Series::new(16);
        for step in 1..=100u64 {
            s.add(Agg::point(step, if step == 7 { 1000.0 } else { 1.0 }));
        }
        assert!(s.entries().len() <= 16);
        assert_eq!(s.entries().iter().map(|e| e.count).sum::<u64>(), 100);
        assert_eq!(s.entries().iter().map(|e| e.max).fold(0.0, f64::max), 1000.0);
        assert_eq!(s.last().map(|e| (e.step, e.last)), Some((100, 1.0)));
    }

    #[test]
    fn late_points_merge_into_the_entry_that_covers_their_step() {
        let mut s = Series::new(64);
        s.add(Agg::point(1, 1.0));
        s.add(Agg::point(2, 2.0));
        s.add(Agg::point(1, 3.0));
        assert_eq!(s.entries().len(), 2);
        assert_eq!(s.entries()[0].mean(), 2.0);
        s.add(Agg::point(3, f64::NAN));
        assert_eq!(s.entries().len(), 2, "NaN is left out");
    }

    #[test]
    fn columns_fold_min_and_max() {
        let mut s = Series::new(64);
        for step in 0..10u64 {
            s.add(Agg::point(step, step as f64));
        }
        let cols = s.columns(2, 0.0, 9.0, &|x| x as f64);
        let a = cols[0].expect("left column");
        let b = cols[1].expect("right column");
        assert_eq!((a.min, a.max), (0.0, 4.0));
        assert_eq!((b.min, b.max, b.last), (5.0, 9.0, 9.0));
    }
}
