//! Key layouts: big-endian numbers after a run prefix, so range scans come back in step order.
//! Points, rollups and the journal share the `history` tree, each behind a tag byte.
use crate::ids::RunId;

/// `run \0` — the prefix of every key that belongs to one run.
pub fn run_prefix(run: &RunId) -> Vec<u8> {
    let mut k = run.as_str().as_bytes().to_vec();
    k.push(0);
    k
}

/// `run \0 metric \0` — all ranks of one metric.
pub fn metric_prefix(run: &RunId, metric: &str) -> Vec<u8> {
    let mut k = run_prefix(run);
    k.extend_from_slice(metric.as_bytes());
    k.push(0);
    k
}

/// `run \0 metric \0 rank` — one rank's series of one metric.
pub fn series_prefix(run: &RunId, metric: &str, rank: u32) -> Vec<u8> {
    let mut k = metric_prefix(run, metric);
    k.extend_from_slice(&rank.to_be_bytes());
    k
}

/// `run \0 metric \0 rank step`.
pub fn series_key(run: &RunId, metric: &str, rank: u32, step: u64) -> Vec<u8> {
    let mut k = series_prefix(run, metric, rank);
    k.extend_from_slice(&step.to_be_bytes());
    k
}

/// The history tree holds several kinds of key, told apart by their first byte, so one sled
/// batch can move points from the journal into blocks and rollups atomically.
pub const BLOCK: u8 = b'b';
pub const ROLLUP: u8 = b'r';
pub const JOURNAL: u8 = b'j';
/// A journal entry that could not be read, kept aside (under `q` and its own key).
pub const QUARANTINE: u8 = b'q';

/// `tag key`: a key of the history tree.
pub fn tagged(tag: u8, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(tag);
    k.extend_from_slice(key);
    k
}

/// `b run \0 metric \0 rank first_step`: a block, the points of one series from `first_step` on.
pub fn block_key(run: &RunId, metric: &str, rank: u32, first_step: u64) -> Vec<u8> {
    tagged(BLOCK, &series_key(run, metric, rank, first_step))
}

/// `j run \0 n`: one batch's points of one run, n from sled's id generator (rising).
pub fn journal_key(run: &RunId, n: u64) -> Vec<u8> {
    let mut k = tagged(JOURNAL, &run_prefix(run));
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// The run of a tagged key (`tag run \0 ...`), if it has one.
pub fn tagged_run(key: &[u8]) -> Option<RunId> {
    let rest = key.get(1..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    Some(RunId(String::from_utf8_lossy(&rest[..end]).into_owned()))
}

/// Items grouped by run, runs in order of first appearance, items in their order (a batch
/// holds one run or a few: a linear search beats hashing every item).
pub fn group_by_run<T>(items: impl IntoIterator<Item = (RunId, T)>) -> Vec<(RunId, Vec<T>)> {
    let mut out: Vec<(RunId, Vec<T>)> = Vec::new();
    for (run, item) in items {
        match out.iter_mut().find(|(r, _)| *r == run) {
            Some((_, v)) => v.push(item),
            None => out.push((run, vec![item])),
        }
    }
    out
}

/// Splits a series key (after its metric prefix) into rank and step.
pub fn rank_step(suffix: &[u8]) -> Option<(u32, u64)> {
    if suffix.len() != 12 {
        return None;
    }
    let rank = u32::from_be_bytes(suffix[..4].try_into().ok()?);
    let step = u64::from_be_bytes(suffix[4..].try_into().ok()?);
    Some((rank, step))
}

/// `r run \0 metric \0 rank level bucket` for rollups (untagged in schema 1's own tree).
pub fn rollup_key(run: &RunId, metric: &str, rank: u32, level: u8, bucket: u64) -> Vec<u8> {
    let mut k = tagged(ROLLUP, &series_prefix(run, metric, rank));
    k.push(level);
    k.extend_from_slice(&bucket.to_be_bytes());
    k
}

/// `run \0 rank` for per-rank records.
pub fn rank_key(run: &RunId, rank: u32) -> Vec<u8> {
    let mut k = run_prefix(run);
    k.extend_from_slice(&rank.to_be_bytes());
    k
}

/// `run \0 t_ms n` for events (n breaks ties within a millisecond).
pub fn event_key(run: &RunId, t_ms: u64, n: u64) -> Vec<u8> {
    let mut k = run_prefix(run);
    k.extend_from_slice(&t_ms.to_be_bytes());
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// `run \0 rank seq` for collectives and log lines.
pub fn rank_seq_key(run: &RunId, rank: u32, seq: u64) -> Vec<u8> {
    let mut k = rank_key(run, rank);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_keys_sort_by_rank_then_step() {
        let run = RunId("r".into());
        let a = series_key(&run, "loss", 0, 255);
        let b = series_key(&run, "loss", 0, 256);
        let c = series_key(&run, "loss", 1, 0);
        assert!(a < b && b < c);
        let p = metric_prefix(&run, "loss");
        assert_eq!(rank_step(&b[p.len()..]), Some((0, 256)));
    }

    #[test]
    fn a_metric_prefix_does_not_match_a_longer_metric_name() {
        let run = RunId("r".into());
        let k = series_key(&run, "loss_scale", 0, 1);
        assert!(!k.starts_with(&metric_prefix(&run, "loss")));
    }
}
