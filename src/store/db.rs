//! The sled database behind `Store`: trees, schema version, writes in batches, reads by range.
use super::keys;
use super::rollup::{Accumulator, Bucket};
use super::{EventRecord, Point, RankInfo, RunRecord};
use crate::ids::RunId;
use crate::record::CollectiveRecord;
use std::collections::HashMap;
use std::path::Path;

/// Stored in `meta/schema_version`; migrations are append-only and keyed by this number.
pub const SCHEMA_VERSION: u32 = 1;

/// Log lines kept per rank (the tail; the full log stays in the node's log file).
pub const LOG_TAIL_LINES: u64 = 2000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error(
        "database {path} has schema version {found}; this flightdeck reads up to {SCHEMA_VERSION}: upgrade flightdeck"
    )]
    TooNew { path: String, found: u32 },
    #[error("database: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt record in tree {tree}: {reason}")]
    Corrupt { tree: &'static str, reason: String },
    #[error("no run matches {query:?}; `flightdeck runs` lists them")]
    NoSuchRun { query: String },
    #[error("{query:?} matches several runs: {candidates}; give more of the id")]
    Ambiguous { query: String, candidates: String },
}

/// Everything one ingest batch writes; applied tree by tree, then flushed before any ack.
#[derive(Default)]
pub struct Batch {
    pub runs: Vec<RunRecord>,
    /// Metric names: the standard ones are static, a framework's own come from its log.
    pub points: Vec<(RunId, std::borrow::Cow<'static, str>, Point)>,
    pub ranks: Vec<(RunId, RankInfo)>,
    pub events: Vec<(RunId, EventRecord)>,
    pub collectives: Vec<(RunId, u32, CollectiveRecord)>,
    pub logs: Vec<(RunId, u32, u64, String)>,
    pub checkpoints: Vec<super::checkpoints::CheckpointRecord>,
    /// Checkpoints the worker pruned from disk (`keep`): their records go too.
    pub checkpoints_removed: Vec<(RunId, u64)>,
    /// Keyed by (detected ms, index) so a later rewrite (the report gains stacks) replaces it.
    pub verdicts: Vec<(RunId, (u64, u32), super::VerdictRecord)>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
            && self.points.is_empty()
            && self.ranks.is_empty()
            && self.events.is_empty()
            && self.collectives.is_empty()
            && self.logs.is_empty()
            && self.checkpoints.is_empty()
            && self.checkpoints_removed.is_empty()
            && self.verdicts.is_empty()
    }
}

/// Read access to every tree; cheap to clone (sled trees are handles).
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    runs: sled::Tree,
    ranks: sled::Tree,
    series: sled::Tree,
    rollups: sled::Tree,
    events: sled::Tree,
    collectives: sled::Tree,
    logs: sled::Tree,
    pub(super) checkpoints: sled::Tree,
    verdicts: sled::Tree,
}

/// The one writer: owned by the server's ingest thread, with the rollups it keeps open.
pub struct Writer {
    store: Store,
    acc: HashMap<RunId, Accumulator>,
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

fn parse<T: serde::de::DeserializeOwned>(tree: &'static str, b: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(b).map_err(|e| StoreError::Corrupt { tree, reason: e.to_string() })
}

impl Store {
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let p = path.display().to_string();
        let db =
            sled::Config::new().path(path).open().map_err(|source| StoreError::Open { path: p.clone(), source })?;
        let meta = db.open_tree("meta")?;
        match meta.get("schema_version")? {
            Some(v) => {
                let found = v.as_ref().try_into().map(u32::from_be_bytes).unwrap_or(u32::MAX);
                if found > SCHEMA_VERSION {
                    return Err(StoreError::TooNew { path: p, found });
                }
            }
            None => {
                meta.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())?;
            }
        }
        Ok(Store {
            runs: db.open_tree("runs")?,
            ranks: db.open_tree("ranks")?,
            series: db.open_tree("series")?,
            rollups: db.open_tree("rollups")?,
            events: db.open_tree("events")?,
            collectives: db.open_tree("collectives")?,
            logs: db.open_tree("logs")?,
            checkpoints: db.open_tree("checkpoints")?,
            verdicts: db.open_tree("verdicts")?,
            db,
        })
    }

    /// The writer for this database. Only the ingest thread may hold one.
    pub fn writer(&self) -> Writer {
        Writer { store: self.clone(), acc: HashMap::new() }
    }
}

impl Writer {
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Applies a batch and flushes it to disk: when this returns Ok, the data survives kill -9.
    pub fn write(&mut self, batch: Batch) -> Result<(), StoreError> {
        // A batch of many nodes' frames carries a run's record (and a rank's info) once per
        // node: only the newest of each is encoded and written.
        let mut b = sled::Batch::default();
        let mut seen = std::collections::HashSet::new();
        for r in batch.runs.iter().rev().filter(|r| seen.insert(&r.id)) {
            b.insert(r.id.as_str().as_bytes(), json(r));
        }
        self.store.runs.apply_batch(b)?;

        let mut series = sled::Batch::default();
        for (run, metric, p) in &batch.points {
            series.insert(keys::series_key(run, metric, p.rank, p.step), &p.value.to_le_bytes());
            let rollups = &self.store.rollups;
            let acc = self.acc.entry(run.clone()).or_default();
            acc.add(metric, p.rank, p.step, p.value, &mut |id| {
                let k = keys::rollup_key(run, &id.0, id.1, id.2, id.3);
                rollups.get(k).ok().flatten().and_then(|v| Bucket::from_bytes(&v))
            });
        }
        self.store.series.apply_batch(series)?;
        let mut rollups = sled::Batch::default();
        for (run, acc) in self.acc.iter_mut() {
            for (id, bucket) in acc.take_dirty() {
                rollups.insert(keys::rollup_key(run, &id.0, id.1, id.2, id.3), bucket.to_bytes());
            }
        }
        self.store.rollups.apply_batch(rollups)?;

        let mut ranks = sled::Batch::default();
        let mut seen = std::collections::HashSet::new();
        for (run, info) in batch.ranks.iter().rev().filter(|(run, info)| seen.insert((run, info.rank))) {
            ranks.insert(keys::rank_key(run, info.rank), json(info));
        }
        self.store.ranks.apply_batch(ranks)?;

        let mut events = sled::Batch::default();
        for (run, e) in &batch.events {
            // sled's persistent id generator breaks ties within a millisecond across restarts.
            let n = self.store.db.generate_id()?;
            events.insert(keys::event_key(run, e.t_ms, n), json(e));
        }
        self.store.events.apply_batch(events)?;

        let mut colls = sled::Batch::default();
        for (run, rank, rec) in &batch.collectives {
            colls.insert(keys::rank_seq_key(run, *rank, rec.seq), bincode::serialize(rec).unwrap_or_default());
        }
        self.store.collectives.apply_batch(colls)?;

        let mut logs = sled::Batch::default();
        for (run, rank, n, line) in &batch.logs {
            logs.insert(keys::rank_seq_key(run, *rank, *n), line.as_bytes());
            if *n >= LOG_TAIL_LINES {
                logs.remove(keys::rank_seq_key(run, *rank, n - LOG_TAIL_LINES));
            }
        }
        self.store.logs.apply_batch(logs)?;

        let mut ckpts = sled::Batch::default();
        for c in &batch.checkpoints {
            ckpts.insert(super::checkpoints::key(&c.run, c.step), json(c));
        }
        for (run, step) in &batch.checkpoints_removed {
            ckpts.remove(super::checkpoints::key(run, *step));
        }
        self.store.checkpoints.apply_batch(ckpts)?;
        let mut verdicts = sled::Batch::default();
        for (run, (ms, n), v) in &batch.verdicts {
            verdicts.insert(keys::event_key(run, *ms, u64::from(*n)), json(v));
        }
        self.store.verdicts.apply_batch(verdicts)?;

        self.store.db.flush()?;
        Ok(())
    }

    /// Forgets the open rollup buckets of a run that has ended (they are on disk).
    pub fn close_run(&mut self, run: &RunId) {
        self.acc.remove(run);
    }
}

impl Store {
    pub fn get_run(&self, run: &RunId) -> Result<Option<RunRecord>, StoreError> {
        self.runs.get(run.as_str().as_bytes())?.map(|v| parse("runs", &v)).transpose()
    }

    /// Every run, oldest first (ids sort by start time).
    pub fn list_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.runs.iter().map(|kv| parse("runs", &kv?.1)).collect()
    }

    /// A full id, a unique id prefix, or a run name (the newest run of that name wins).
    pub fn resolve(&self, query: &str) -> Result<RunId, StoreError> {
        if self.runs.contains_key(query.as_bytes())? {
            return Ok(RunId(query.to_string()));
        }
        let by_prefix: Vec<RunId> = self
            .runs
            .scan_prefix(query.as_bytes())
            .keys()
            .map(|k| k.map(|k| RunId(String::from_utf8_lossy(&k).into_owned())))
            .collect::<Result<_, _>>()?;
        match by_prefix.len() {
            1 => return Ok(by_prefix[0].clone()),
            n if n > 1 => {
                let candidates = by_prefix.iter().map(|r| r.0.as_str()).collect::<Vec<_>>().join(", ");
                return Err(StoreError::Ambiguous { query: query.to_string(), candidates });
            }
            _ => {}
        }
        let by_name = self.list_runs()?.into_iter().rev().find(|r| r.name == query);
        by_name.map(|r| r.id).ok_or_else(|| StoreError::NoSuchRun { query: query.to_string() })
    }

    pub fn ranks(&self, run: &RunId) -> Result<Vec<RankInfo>, StoreError> {
        self.ranks.scan_prefix(keys::run_prefix(run)).map(|kv| parse("ranks", &kv?.1)).collect()
    }

    pub fn events(&self, run: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        self.events.scan_prefix(keys::run_prefix(run)).map(|kv| parse("events", &kv?.1)).collect()
    }

    /// The points of one metric, every rank or one, ordered by rank then step.
    pub fn series(&self, run: &RunId, metric: &str, rank: Option<u32>) -> Result<Vec<Point>, StoreError> {
        let prefix = match rank {
            Some(r) => keys::series_prefix(run, metric, r),
            None => keys::metric_prefix(run, metric),
        };
        let skip = keys::metric_prefix(run, metric).len();
        let mut out = Vec::new();
        for kv in self.series.scan_prefix(&prefix) {
            let (k, v) = kv?;
            let (rank, step) = keys::rank_step(&k[skip..])
                .ok_or_else(|| StoreError::Corrupt { tree: "series", reason: format!("key of {} bytes", k.len()) })?;
            let value = v
                .as_ref()
                .try_into()
                .map(f64::from_le_bytes)
                .map_err(|_| StoreError::Corrupt { tree: "series", reason: "value is not 8 bytes".into() })?;
            out.push(Point { step, rank, value });
        }
        Ok(out)
    }

    /// The metric names recorded for a run (from the first rank's keys, then deduplicated).
    pub fn metric_names(&self, run: &RunId) -> Result<Vec<String>, StoreError> {
        let prefix = keys::run_prefix(run);
        let mut names: Vec<String> = Vec::new();
        let mut from = prefix.clone();
        // Skip from one metric to the next instead of reading every point.
        while let Some((k, _)) = self.series.range(from.clone()..).next().transpose()? {
            if !k.starts_with(&prefix) {
                break;
            }
            let rest = &k[prefix.len()..];
            let Some(end) = rest.iter().position(|&b| b == 0) else {
                break;
            };
            let name = String::from_utf8_lossy(&rest[..end]).into_owned();
            from = keys::metric_prefix(run, &name);
            from.push(0xff);
            names.push(name);
        }
        Ok(names)
    }

    /// Rollup buckets of one rank's metric at a level (index into `rollup::LEVELS`).
    pub fn rollups(&self, run: &RunId, metric: &str, rank: u32, level: u8) -> Result<Vec<(u64, Bucket)>, StoreError> {
        let mut prefix = keys::series_prefix(run, metric, rank);
        prefix.push(level);
        let mut out = Vec::new();
        for kv in self.rollups.scan_prefix(&prefix) {
            let (k, v) = kv?;
            let no = k[prefix.len()..].try_into().map(u64::from_be_bytes).unwrap_or(0);
            let b =
                Bucket::from_bytes(&v).ok_or(StoreError::Corrupt { tree: "rollups", reason: "bad bucket".into() })?;
            out.push((no, b));
        }
        Ok(out)
    }

    pub fn collectives(&self, run: &RunId, rank: u32) -> Result<Vec<CollectiveRecord>, StoreError> {
        self.collectives
            .scan_prefix(keys::rank_key(run, rank))
            .map(|kv| {
                bincode::deserialize(&kv?.1)
                    .map_err(|e| StoreError::Corrupt { tree: "collectives", reason: e.to_string() })
            })
            .collect()
    }

    pub fn log_tail(&self, run: &RunId, rank: u32) -> Result<Vec<String>, StoreError> {
        self.logs
            .scan_prefix(keys::rank_key(run, rank))
            .map(|kv| Ok(String::from_utf8_lossy(&kv?.1).into_owned()))
            .collect()
    }

    /// Every verdict of a run, oldest first.
    pub fn verdicts(&self, run: &RunId) -> Result<Vec<super::VerdictRecord>, StoreError> {
        let mut out: Vec<super::VerdictRecord> = self
            .verdicts
            .scan_prefix(keys::run_prefix(run))
            .map(|kv| parse("verdicts", &kv?.1))
            .collect::<Result<_, _>>()?;
        out.sort_by_key(|v| v.verdict.detected_ms);
        Ok(out)
    }
}
