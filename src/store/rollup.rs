//! Rollups: min/max/mean/last per bucket of 256, 4096 and 65,536 steps, kept while compacting
//! so a chart of a long run reads a few hundred buckets instead of every point (finer charts
//! read the blocks, which decode faster than buckets of 16 could be looked up).
pub use crate::record::Bucket;
use std::collections::HashMap;

/// Bucket widths in steps, one level each.
pub const LEVELS: [u64; 3] = [256, 4096, 65_536];

impl Bucket {
    pub(super) fn new(step: u64, v: f64) -> Bucket {
        Bucket { min: v, max: v, sum: v, count: 1, last_step: step, last: v }
    }

    pub(super) fn add(&mut self, step: u64, v: f64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v;
        self.count += 1;
        if step >= self.last_step {
            self.last_step = step;
            self.last = v;
        }
    }

    pub fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        bincode::serialize(self).unwrap_or_default()
    }

    pub fn from_bytes(b: &[u8]) -> Option<Bucket> {
        bincode::deserialize(b).ok()
    }
}

/// Identifies one open bucket: (metric, rank, level index, bucket number). One accumulator per run.
pub type BucketId = (String, u32, u8, u64);

/// The open buckets of one run. Points arrive roughly in step order, so each (metric, rank,
/// level) has one open bucket; a point for an older bucket is merged by the caller from disk.
#[derive(Default)]
pub struct Accumulator {
    open: HashMap<(String, u32, u8), (u64, Bucket)>,
    dirty: Vec<BucketId>,
    /// Buckets closed since the last `take_dirty`, still to be written.
    closed: Vec<(BucketId, Bucket)>,
}

impl Accumulator {
    /// Adds a point; `load` fetches a bucket from disk when the point belongs to a closed one.
    pub fn add(
        &mut self,
        metric: &str,
        rank: u32,
        step: u64,
        v: f64,
        load: &mut dyn FnMut(&BucketId) -> Option<Bucket>,
    ) {
        for (level, width) in LEVELS.iter().enumerate() {
            let level = level as u8;
            let bucket_no = step / width;
            let slot = (metric.to_string(), rank, level);
            match self.open.get_mut(&slot) {
                Some((no, b)) if *no == bucket_no => b.add(step, v),
                _ => {
                    let id = (metric.to_string(), rank, level, bucket_no);
                    let b = match load(&id) {
                        Some(mut b) => {
                            b.add(step, v);
                            b
                        }
                        None => Bucket::new(step, v),
                    };
                    if let Some((old_no, old)) = self.open.insert(slot, (bucket_no, b)) {
                        self.closed.push(((metric.to_string(), rank, level, old_no), old));
                    }
                }
            }
            self.dirty.push((metric.to_string(), rank, level, bucket_no));
        }
    }

    /// The buckets changed since the last call, for writing.
    pub fn take_dirty(&mut self) -> Vec<(BucketId, Bucket)> {
        let mut ids = std::mem::take(&mut self.dirty);
        ids.sort();
        ids.dedup();
        let mut out = std::mem::take(&mut self.closed);
        out.extend(ids.into_iter().filter_map(|id| {
            let slot = (id.0.clone(), id.1, id.2);
            match self.open.get(&slot) {
                Some((no, b)) if *no == id.3 => Some((id, *b)),
                _ => None,
            }
        }));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_min_max_mean_last() {
        let w = LEVELS[0];
        let mut acc = Accumulator::default();
        for step in 1..=w + 20 {
            let v = if step == 5 { 1e6 } else { step as f64 };
            acc.add("loss", 0, step, v, &mut |_| None);
        }
        let dirty = acc.take_dirty();
        let level0: Vec<_> = dirty.iter().filter(|(id, _)| id.2 == 0).collect();
        // Steps 1..w are bucket 0 (closed when step w arrived), w..=w+20 bucket 1.
        assert_eq!(level0.len(), 2);
        let b0 = level0.iter().find(|(id, _)| id.3 == 0).map(|(_, b)| *b).unwrap();
        assert_eq!((b0.min, b0.max, b0.last, b0.count), (1.0, 1e6, (w - 1) as f64, w - 1));
        let b1 = level0.iter().find(|(id, _)| id.3 == 1).map(|(_, b)| *b).unwrap();
        assert_eq!((b1.min, b1.max, b1.last, b1.count), (w as f64, (w + 20) as f64, (w + 20) as f64, 21));
        assert!(acc.take_dirty().is_empty(), "nothing changed since");
        let level1 = dirty.iter().find(|(id, _)| id.2 == 1).map(|(_, b)| *b).unwrap();
        assert_eq!(level1.max, 1e6, "a spike stays visible at the coarse level");
        assert_eq!(level1.count, w + 20);
    }
}
