//! Collective bandwidth per op and message size, from the flight recorder's records in the
//! history: each completed record's time from start to end, the median over every rank and
//! step, turned into nccl-tests' algorithm and bus bandwidth.
//!
//! A rank's time inside a collective includes waiting for the slowest peer to arrive, so a
//! skewed step lowers the bandwidth: the median keeps the typical collective, and the report
//! says so beside the table.
use crate::record::{CollectiveOp, CollectiveRecord, CollectiveState};
use std::collections::BTreeMap;

/// One (op, size) of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Bandwidth {
    pub op: CollectiveOp,
    pub bytes: u64,
    /// Completed records counted (every rank's).
    pub count: usize,
    pub median_us: f64,
    pub p90_us: f64,
    /// bytes ÷ median time, GB/s of 1e9 bytes.
    pub algbw_gbps: f64,
    /// algbw × the op's bus factor (nccl-tests): what the links carried.
    pub busbw_gbps: f64,
}

/// nccl-tests' bus-bandwidth factor of an op on `world` ranks; None for an op that moves no
/// payload (a barrier).
pub fn bus_factor(op: CollectiveOp, world: u32) -> Option<f64> {
    let n = f64::from(world.max(1));
    match op {
        CollectiveOp::AllReduce => Some(2.0 * (n - 1.0) / n),
        CollectiveOp::ReduceScatter | CollectiveOp::AllGather => Some((n - 1.0) / n),
        CollectiveOp::Broadcast => Some(1.0),
        CollectiveOp::Barrier => None,
    }
}

/// Durations gathered per (op, size), one rank's records at a time (the history is read rank by
/// rank, so no rank's records are held longer than its turn).
#[derive(Default)]
pub struct Fold {
    durations_us: BTreeMap<(&'static str, u64), (CollectiveOp, Vec<f64>)>,
}

impl Fold {
    pub fn add<'a>(&mut self, records: impl IntoIterator<Item = &'a CollectiveRecord>) {
        for r in records {
            let (Some(start), Some(end)) = (r.start_us, r.end_us) else { continue };
            if r.state != CollectiveState::Completed || r.bytes == 0 || end < start {
                continue;
            }
            let entry = self.durations_us.entry((r.op.name(), r.bytes)).or_insert_with(|| (r.op, Vec::new()));
            entry.1.push((end - start) as f64);
        }
    }

    /// One row per (op, size) with a payload, by op then size.
    pub fn finish(self, world: u32) -> Vec<Bandwidth> {
        self.durations_us
            .into_iter()
            .filter_map(|((_, bytes), (op, mut us))| {
                let factor = bus_factor(op, world)?;
                us.sort_by(f64::total_cmp);
                let median_us = quantile(&us, 0.5);
                // A record's clock resolution is 1 µs: an instant collective counts as 1 µs.
                let algbw_gbps = bytes as f64 / (median_us.max(1.0) * 1e-6) / 1e9;
                Some(Bandwidth {
                    op,
                    bytes,
                    count: us.len(),
                    median_us,
                    p90_us: quantile(&us, 0.9),
                    algbw_gbps,
                    busbw_gbps: algbw_gbps * factor,
                })
            })
            .collect()
    }
}

/// The q-quantile of sorted values, nearest rank; NaN for none.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    crate::analysis::nearest_rank(sorted, q).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Step;

    fn rec(op: CollectiveOp, bytes: u64, start_us: u64, took_us: u64, state: CollectiveState) -> CollectiveRecord {
        CollectiveRecord {
            seq: 1,
            op,
            dtype: "float32".into(),
            elements: bytes / 4,
            bytes,
            enqueue_us: start_us,
            start_us: Some(start_us),
            end_us: Some(start_us + took_us),
            state,
            step: Step(1),
        }
    }

    #[test]
    fn medians_per_op_and_size_become_algorithm_and_bus_bandwidth() {
        let mut fold = Fold::default();
        let mb = 1 << 20;
        // Rank 0 then rank 1, as the history is read: 3 all-reduces of 1 MiB at 100, 200 and
        // 1000 µs, one still open, one all-gather of 4 KiB, one barrier.
        fold.add(&[
            rec(CollectiveOp::AllReduce, mb, 0, 100, CollectiveState::Completed),
            rec(CollectiveOp::AllReduce, mb, 500, 200, CollectiveState::Completed),
            rec(CollectiveOp::Barrier, 0, 900, 10, CollectiveState::Completed),
        ]);
        fold.add(&[
            rec(CollectiveOp::AllReduce, mb, 0, 1000, CollectiveState::Completed),
            rec(CollectiveOp::AllReduce, mb, 2000, 5, CollectiveState::Started),
            rec(CollectiveOp::AllGather, 4096, 0, 4, CollectiveState::Completed),
        ]);
        let rows = fold.finish(4);
        assert_eq!(rows.len(), 2, "{rows:?}");
        let all_gather = &rows[0];
        assert_eq!((all_gather.op, all_gather.bytes, all_gather.count), (CollectiveOp::AllGather, 4096, 1));
        let ar = &rows[1];
        assert_eq!((ar.op, ar.count, ar.median_us, ar.p90_us), (CollectiveOp::AllReduce, 3, 200.0, 1000.0));
        let algbw = mb as f64 / 200e-6 / 1e9;
        assert!((ar.algbw_gbps - algbw).abs() < 1e-9);
        assert!((ar.busbw_gbps - algbw * 1.5).abs() < 1e-9, "2(n-1)/n at n = 4");
        assert_eq!(bus_factor(CollectiveOp::AllGather, 4), Some(0.75));
    }
}
