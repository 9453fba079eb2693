//! The points of every series, in the `history` tree.
//!
//! Writing: each ingest batch appends one journal entry per run, one key however many series
//! it touches. Once a run's journal holds enough points, or the run ends, compaction moves them
//! into blocks of consecutive steps per series (`block.rs`) and into the rollups, and drops the
//! entries, in one sled batch, so a crash leaves either the journal or the blocks, never both.
//!
//! Reading: a series is its blocks merged with the run's journal, under a lock that compaction
//! takes to swap the one for the other; a point is readable as soon as its batch is durable.
use super::block;
use super::db::{Store, StoreError};
use super::journal;
use super::keys;
use super::rollup::{Accumulator, Bucket, LEVELS};
use super::Point;
use crate::ids::RunId;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// The most points one block holds.
pub const BLOCK_MAX: usize = 4096;
/// A run's journal is compacted once it holds this many points…
const COMPACT_POINTS: usize = 65_536;
/// …and at least this many per series it touches, so that at 1,024 ranks a block still holds
/// dozens of steps rather than one.
const COMPACT_PER_SERIES: usize = 64;

type Metric = Cow<'static, str>;

/// The writer's side: each live run's journal since its last compaction.
#[derive(Default)]
pub struct Journals {
    runs: HashMap<RunId, RunJournal>,
}

#[derive(Default)]
struct RunJournal {
    keys: Vec<Vec<u8>>,
    points: Vec<(Metric, Point)>,
    series: HashSet<(Metric, u32)>,
    /// The newest stored step of each series this writer has compacted or looked up.
    last_step: HashMap<(Metric, u32), u64>,
    rollups: Accumulator,
}

impl RunJournal {
    fn full(&self) -> bool {
        self.points.len() >= COMPACT_POINTS.max(COMPACT_PER_SERIES * self.series.len())
    }
}

impl Journals {
    /// Adds a batch's points to `hist` as one journal entry per run; returns the runs whose
    /// journal is now full, for `compact`.
    pub fn append(
        &mut self,
        store: &Store,
        points: Vec<(RunId, Metric, Point)>,
        hist: &mut sled::Batch,
    ) -> Result<Vec<RunId>, StoreError> {
        let mut full = Vec::new();
        for (run, points) in keys::group_by_run(points.into_iter().map(|(run, m, p)| (run, (m, p)))) {
            let key = keys::journal_key(&run, store.db.generate_id()?);
            hist.insert(key.clone(), journal::encode(points.iter().map(|(m, p)| (m.as_ref(), p))));
            let j = self.runs.entry(run.clone()).or_default();
            j.keys.push(key);
            for (m, p) in &points {
                if !j.series.contains(&(m.clone(), p.rank)) {
                    j.series.insert((m.clone(), p.rank));
                }
            }
            j.points.extend(points);
            if j.full() {
                full.push(run);
            }
        }
        Ok(full)
    }

    /// Moves a run's journal into blocks and rollups, all within `hist`.
    pub fn compact(&mut self, store: &Store, run: &RunId, hist: &mut sled::Batch) -> Result<(), StoreError> {
        let Some(j) = self.runs.get_mut(run) else { return Ok(()) };
        let points = std::mem::take(&mut j.points);
        j.series.clear();
        for (m, p) in &points {
            j.rollups.add(m, p.rank, p.step, p.value, &mut |id| {
                let k = keys::rollup_key(run, &id.0, id.1, id.2, id.3);
                store.history.get(k).ok().flatten().and_then(|v| Bucket::from_bytes(&v))
            });
        }
        let mut by_series: HashMap<(Metric, u32), Vec<(u64, f64)>> = HashMap::new();
        for (m, p) in points {
            by_series.entry((m, p.rank)).or_default().push((p.step, p.value));
        }
        for ((m, rank), arrived) in by_series {
            let new = sorted_last_wins(arrived, |p| p.0);
            let (Some(first), Some(last_new)) = (new.first().map(|p| p.0), new.last().map(|p| p.0)) else { continue };
            let last = match j.last_step.get(&(m.clone(), rank)) {
                Some(s) => Some(*s),
                None => store.last_stored_step(run, &m, rank)?,
            };
            match last {
                Some(l) if first <= l => rewrite_series(store, hist, run, &m, rank, new)?,
                _ => put_blocks(hist, run, &m, rank, &new),
            }
            j.last_step.insert((m, rank), last.map_or(last_new, |l| l.max(last_new)));
        }
        for (id, b) in j.rollups.take_dirty() {
            hist.insert(keys::rollup_key(run, &id.0, id.1, id.2, id.3), b.to_bytes());
        }
        for k in j.keys.drain(..) {
            hist.remove(k);
        }
        Ok(())
    }

    /// Compacts what is left of a run that has ended and forgets it.
    pub fn close(&mut self, store: &Store, run: &RunId, hist: &mut sled::Batch) -> Result<(), StoreError> {
        self.compact(store, run, hist)?;
        self.runs.remove(run);
        Ok(())
    }

    /// Reads every journal entry on disk into memory (after an open, or after a failed write
    /// left memory and disk apart); returns the runs found. An entry that cannot be read is
    /// moved aside in `hist` under the quarantine tag, said in the log, and kept.
    pub fn load(&mut self, store: &Store, hist: &mut sled::Batch) -> Result<Vec<RunId>, StoreError> {
        self.runs.clear();
        for kv in store.history.scan_prefix([keys::JOURNAL]) {
            let (k, v) = kv?;
            let read =
                keys::tagged_run(&k).ok_or_else(|| no_run(&k)).and_then(|run| Ok((decode_entry(&run, &v)?, run)));
            let (points, run) = match read {
                Ok(read) => read,
                Err(e) => {
                    tracing::error!("{e}; the entry is kept aside under its key with the tag q");
                    hist.remove(k.clone());
                    hist.insert(keys::tagged(keys::QUARANTINE, &k), v);
                    continue;
                }
            };
            let j = self.runs.entry(run).or_default();
            j.keys.push(k.to_vec());
            for (m, p) in points {
                j.series.insert((m.clone(), p.rank));
                j.points.push((m, p));
            }
        }
        Ok(self.runs.keys().cloned().collect())
    }
}

/// Sorts by key, keeping the last of equal keys (a point written again replaces the first).
fn sorted_last_wins<T, K: Ord>(mut v: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    v.sort_by_key(|p| key(p));
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    for p in v {
        match out.last_mut() {
            Some(prev) if key(prev) == key(&p) => *prev = p,
            _ => out.push(p),
        }
    }
    out
}

fn put_blocks(hist: &mut sled::Batch, run: &RunId, metric: &str, rank: u32, points: &[(u64, f64)]) {
    for chunk in points.chunks(BLOCK_MAX) {
        hist.insert(keys::block_key(run, metric, rank, chunk[0].0), block::encode(chunk));
    }
}

/// The slow path, for points at or before a series' newest stored step (a framework counting
/// again, a replay): the series' blocks are read, merged with the new points and written anew.
fn rewrite_series(
    store: &Store,
    hist: &mut sled::Batch,
    run: &RunId,
    metric: &str,
    rank: u32,
    new: Vec<(u64, f64)>,
) -> Result<(), StoreError> {
    let mut merged: BTreeMap<u64, f64> = BTreeMap::new();
    for kv in store.history.scan_prefix(keys::tagged(keys::BLOCK, &keys::series_prefix(run, metric, rank))) {
        let (k, v) = kv?;
        merged.extend(block::decode(&v).map_err(|e| corrupt_block(&k, e))?);
        hist.remove(k);
    }
    merged.extend(new);
    put_blocks(hist, run, metric, rank, &merged.into_iter().collect::<Vec<_>>());
    Ok(())
}

fn corrupt_block(key: &[u8], e: block::Malformed) -> StoreError {
    StoreError::Corrupt { tree: "history", reason: format!("block {}: {}", String::from_utf8_lossy(key), e.0) }
}

fn no_run(key: &[u8]) -> StoreError {
    StoreError::Corrupt { tree: "history", reason: format!("journal key {} has no run", String::from_utf8_lossy(key)) }
}

fn decode_entry(run: &RunId, bytes: &[u8]) -> Result<Vec<(Metric, Point)>, StoreError> {
    journal::decode(bytes)
        .map_err(|e| StoreError::Corrupt { tree: "history", reason: format!("journal entry of run {run}: {}", e.0) })
}

impl Store {
    /// The points of one metric, every rank or one, ordered by rank then step.
    pub fn series(&self, run: &RunId, metric: &str, rank: Option<u32>) -> Result<Vec<Point>, StoreError> {
        self.run_points(run)?.series(metric, rank)
    }

    /// The metric names recorded for a run, sorted.
    pub fn metric_names(&self, run: &RunId) -> Result<Vec<String>, StoreError> {
        self.run_points(run)?.metric_names()
    }

    /// Rollup buckets of one rank's metric at a level (index into `rollup::LEVELS`).
    pub fn rollups(&self, run: &RunId, metric: &str, rank: u32, level: u8) -> Result<Vec<(u64, Bucket)>, StoreError> {
        self.run_points(run)?.rollups(metric, rank, level)
    }

    /// A reader of one run's points that decodes its journal once, for callers that read many
    /// series (a snapshot reads every metric of every rank).
    pub fn run_points(&self, run: &RunId) -> Result<RunPoints<'_>, StoreError> {
        let mut r = RunPoints { store: self, run: run.clone(), generation: u64::MAX, recent: HashMap::new() };
        r.refresh()?;
        Ok(r)
    }

    /// The newest step in a series' blocks.
    fn last_stored_step(&self, run: &RunId, metric: &str, rank: u32) -> Result<Option<u64>, StoreError> {
        let prefix = keys::tagged(keys::BLOCK, &keys::series_prefix(run, metric, rank));
        let Some((k, v)) = self.history.scan_prefix(prefix).next_back().transpose()? else { return Ok(None) };
        Ok(block::decode(&v).map_err(|e| corrupt_block(&k, e))?.last().map(|p| p.0))
    }
}

/// One run's points as of one compaction generation: the journal decoded once, per series,
/// and the blocks and rollups read on demand. A read that a compaction overtook (the
/// generation moved) is done again over the new journal, so no point is missed or counted
/// twice, and no lock is held while reading.
pub struct RunPoints<'a> {
    store: &'a Store,
    run: RunId,
    generation: u64,
    /// The journal's points per (metric, rank), sorted by step, the newest write of a step kept.
    recent: HashMap<(String, u32), Vec<Point>>,
}

impl RunPoints<'_> {
    fn refresh(&mut self) -> Result<(), StoreError> {
        loop {
            let generation = self.store.settled_generation();
            let mut recent: HashMap<(String, u32), Vec<Point>> = HashMap::new();
            for kv in self.store.history.scan_prefix(keys::tagged(keys::JOURNAL, &keys::run_prefix(&self.run))) {
                for (m, p) in decode_entry(&self.run, &kv?.1)? {
                    recent.entry((m.into_owned(), p.rank)).or_default().push(p);
                }
            }
            if self.store.generation() == generation {
                for points in recent.values_mut() {
                    *points = sorted_last_wins(std::mem::take(points), |p| p.step);
                }
                (self.generation, self.recent) = (generation, recent);
                return Ok(());
            }
        }
    }

    /// Runs `read` until no compaction overtook it.
    fn consistent<T>(&mut self, read: impl Fn(&Self) -> Result<T, StoreError>) -> Result<T, StoreError> {
        loop {
            if self.store.generation() != self.generation {
                self.refresh()?;
            }
            let out = read(self)?;
            if self.store.generation() == self.generation {
                return Ok(out);
            }
        }
    }

    /// The points of one metric, every rank or one, ordered by rank then step.
    pub fn series(&mut self, metric: &str, rank: Option<u32>) -> Result<Vec<Point>, StoreError> {
        self.consistent(|me| {
            let mut recent: Vec<&Vec<Point>> = me
                .recent
                .iter()
                .filter(|((m, r), _)| m == metric && rank.is_none_or(|want| *r == want))
                .map(|(_, v)| v)
                .collect();
            recent.sort_by_key(|v| v.first().map(|p| p.rank));
            let stored = me.blocks(metric, rank)?;
            if recent.is_empty() {
                return Ok(stored);
            }
            // Both sorted by (rank, step); the journal is newer, so it wins a tie.
            let mut out = Vec::with_capacity(stored.len() + recent.iter().map(|v| v.len()).sum::<usize>());
            let mut stored = stored.into_iter().peekable();
            for p in recent.into_iter().flatten() {
                while let Some(s) = stored.next_if(|s| (s.rank, s.step) < (p.rank, p.step)) {
                    out.push(s);
                }
                stored.next_if(|s| (s.rank, s.step) == (p.rank, p.step));
                out.push(*p);
            }
            out.extend(stored);
            Ok(out)
        })
    }

    fn blocks(&self, metric: &str, rank: Option<u32>) -> Result<Vec<Point>, StoreError> {
        let prefix = match rank {
            Some(r) => keys::series_prefix(&self.run, metric, r),
            None => keys::metric_prefix(&self.run, metric),
        };
        let skip = 1 + keys::metric_prefix(&self.run, metric).len();
        let mut out = Vec::new();
        for kv in self.store.history.scan_prefix(keys::tagged(keys::BLOCK, &prefix)) {
            let (k, v) = kv?;
            let (rank, _) = keys::rank_step(&k[skip..]).ok_or_else(|| StoreError::Corrupt {
                tree: "history",
                reason: format!("block key of {} bytes", k.len()),
            })?;
            block::decode_into(&v, rank, &mut out).map_err(|e| corrupt_block(&k, e))?;
        }
        Ok(out)
    }

    /// The metric names recorded for the run, sorted.
    pub fn metric_names(&mut self) -> Result<Vec<String>, StoreError> {
        self.consistent(|me| {
            let mut names: BTreeSet<String> = me.recent.keys().map(|(m, _)| m.clone()).collect();
            let prefix = keys::tagged(keys::BLOCK, &keys::run_prefix(&me.run));
            let mut from = prefix.clone();
            // Skip from one metric to the next instead of reading every block.
            while let Some((k, _)) = me.store.history.range(from.clone()..).next().transpose()? {
                if !k.starts_with(&prefix) {
                    break;
                }
                let rest = &k[prefix.len()..];
                let Some(end) = rest.iter().position(|&b| b == 0) else {
                    break;
                };
                let name = String::from_utf8_lossy(&rest[..end]).into_owned();
                from = keys::tagged(keys::BLOCK, &keys::metric_prefix(&me.run, &name));
                from.push(0xff);
                names.insert(name);
            }
            Ok(names.into_iter().collect())
        })
    }

    /// Rollup buckets of one rank's metric at a level (index into `rollup::LEVELS`), with the
    /// journal's points folded in.
    pub fn rollups(&mut self, metric: &str, rank: u32, level: u8) -> Result<Vec<(u64, Bucket)>, StoreError> {
        self.consistent(|me| {
            let mut prefix = keys::tagged(keys::ROLLUP, &keys::series_prefix(&me.run, metric, rank));
            prefix.push(level);
            let mut out = BTreeMap::new();
            for kv in me.store.history.scan_prefix(&prefix) {
                let (k, v) = kv?;
                let no = k[prefix.len()..].try_into().map(u64::from_be_bytes).unwrap_or(0);
                let b = Bucket::from_bytes(&v)
                    .ok_or(StoreError::Corrupt { tree: "history", reason: "bad rollup bucket".into() })?;
                out.insert(no, b);
            }
            let width = LEVELS.get(usize::from(level)).copied().unwrap_or(LEVELS[LEVELS.len() - 1]);
            for p in me.recent.get(&(metric.to_string(), rank)).into_iter().flatten() {
                match out.entry(p.step / width) {
                    std::collections::btree_map::Entry::Occupied(mut b) => b.get_mut().add(p.step, p.value),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        e.insert(Bucket::new(p.step, p.value));
                    }
                }
            }
            Ok(out.into_iter().collect())
        })
    }
}
