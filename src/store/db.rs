//! The sled database behind `Store`: trees, schema version, writes in batches, reads by range.
use super::keys;
use super::logs::LogJournals;
use super::points::Journals;
use super::{EventRecord, Point, RankInfo, RunRecord};
use crate::ids::RunId;
use crate::record::CollectiveRecord;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Stored in `meta/schema_version`; migrations are append-only and keyed by this number.
/// 1: one key per point (`series`) and a `rollups` tree. 2: points in blocks and a journal,
/// with the rollups, in one `history` tree (`points.rs`; `migrate.rs` moves 1 to 2).
pub const SCHEMA_VERSION: u32 = 2;

pub use super::logs::LOG_TAIL_LINES;

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
    #[error("{count} live runs are named {query:?}: {candidates}; name one by its id or the id's last part")]
    AmbiguousName { query: String, count: usize, candidates: String },
    #[error("no sweep matches {query:?}; `flightdeck queue --all` lists them")]
    NoSuchSweep { query: String },
    #[error("{query:?} matches several sweeps: {candidates}; give more of the id")]
    AmbiguousSweep { query: String, candidates: String },
}

impl StoreError {
    /// Whether the disk under the database is full (ENOSPC, or a quota).
    pub fn is_no_space(&self) -> bool {
        let io = match self {
            StoreError::Open { source: sled::Error::Io(e), .. } | StoreError::Sled(sled::Error::Io(e)) => e,
            _ => return false,
        };
        matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
            || io.kind() == std::io::ErrorKind::StorageFull
            || io.to_string().contains("No space left on device")
    }
}

/// What a server that cannot write its database says, naming it and its free space; `waits`:
/// a running server that reopens the history by itself once there is room (else: one that could
/// not start, which the next command starts again).
pub fn no_space_text(root: &std::path::Path, waits: bool) -> String {
    let free = crate::store::checkpoints::free_bytes(root).map(crate::units::bytes).unwrap_or_else(|_| "?".into());
    let cure = if waits {
        "free space there and the server reopens the history by itself"
    } else {
        "free space there and run the command again"
    };
    format!(
        "no space left on device: DB {} ({free} free): the server cannot save the history; runs go on and their \
         agents keep every frame until it can: {cure}",
        root.display()
    )
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
    /// Sweeps, whole (created, or a point cancelled or failed to launch).
    pub sweeps: Vec<super::SweepRecord>,
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
            && self.sweeps.is_empty()
    }
}

/// Read access to every tree; cheap to clone (sled trees are handles).
#[derive(Clone)]
pub struct Store {
    pub(super) db: sled::Db,
    runs: sled::Tree,
    ranks: sled::Tree,
    /// Blocks, rollups and journal entries (`points.rs`).
    pub(super) history: sled::Tree,
    /// Compaction swaps journal entries for blocks and rollups in one batch, which a reader
    /// must see whole or not at all: the count of compactions begun and ended (readers redo a
    /// read it moved under), and the lock held while one is applied (readers wait on it).
    compaction: Arc<(AtomicU64, RwLock<()>)>,
    events: sled::Tree,
    collectives: sled::Tree,
    /// Each rank's last lines: chunks and a journal (`logs.rs`).
    pub(super) logs: sled::Tree,
    pub(super) checkpoints: sled::Tree,
    verdicts: sled::Tree,
    /// Sweeps by id, as JSON (`sweeps.rs`).
    pub(super) sweeps: sled::Tree,
}

/// The one writer: owned by the server's ingest thread, with each live run's journal.
pub struct Writer {
    store: Store,
    journals: Journals,
    log_journals: LogJournals,
    /// A write failed: memory may hold what the disk does not, so the journal is read again.
    stale: bool,
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(tree: &'static str, b: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(b).map_err(|e| StoreError::Corrupt { tree, reason: e.to_string() })
}

impl Store {
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let p = path.display().to_string();
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(std::env::var("FD_CACHE_MB").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(1024) << 20)
            .open()
            .map_err(|source| StoreError::Open { path: p.clone(), source })?;
        let meta = db.open_tree("meta")?;
        let found = match meta.get("schema_version")? {
            Some(v) => v.as_ref().try_into().map(u32::from_be_bytes).unwrap_or(u32::MAX),
            None => {
                meta.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())?;
                SCHEMA_VERSION
            }
        };
        if found > SCHEMA_VERSION {
            return Err(StoreError::TooNew { path: p, found });
        }
        let history = db.open_tree("history")?;
        if found < 2 {
            super::migrate::v1_to_v2(&db, &history)?;
            meta.insert("schema_version", &2u32.to_be_bytes())?;
            db.flush()?;
        }
        super::migrate::drop_v1_trees(&db)?;
        let store = Store {
            runs: db.open_tree("runs")?,
            ranks: db.open_tree("ranks")?,
            history,
            compaction: Arc::new((AtomicU64::new(0), RwLock::new(()))),
            events: db.open_tree("events")?,
            collectives: db.open_tree("collectives")?,
            logs: db.open_tree("logs")?,
            checkpoints: db.open_tree("checkpoints")?,
            verdicts: db.open_tree("verdicts")?,
            sweeps: db.open_tree("sweeps")?,
            db,
        };
        // A journal left by a server that stopped is folded into blocks before anyone reads.
        store.writer().fold_journals()?;
        Ok(store)
    }

    /// The writer for this database. Only the ingest thread may hold one.
    pub fn writer(&self) -> Writer {
        Writer { store: self.clone(), journals: Journals::default(), log_journals: LogJournals::default(), stale: true }
    }

    /// How many compactions have started and finished: odd while one is being applied.
    pub(super) fn generation(&self) -> u64 {
        self.compaction.0.load(Ordering::SeqCst)
    }

    /// The generation once no compaction is being applied (waiting on the lock while one is).
    pub(super) fn settled_generation(&self) -> u64 {
        loop {
            let g = self.generation();
            if g.is_multiple_of(2) {
                return g;
            }
            drop(self.compaction.1.read().unwrap_or_else(|poisoned| poisoned.into_inner()));
        }
    }
}

impl Writer {
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Applies a batch and flushes it to disk: when this returns Ok, the data survives kill -9.
    /// After an error, the next call first reads the journal back from disk.
    pub fn write(&mut self, batch: Batch) -> Result<(), StoreError> {
        let r = self.write_inner(batch);
        self.stale |= r.is_err();
        r
    }

    /// Moves every run's journal on disk into blocks (at open; after a failed write).
    fn fold_journals(&mut self) -> Result<(), StoreError> {
        let mut hist = sled::Batch::default();
        let runs = self.journals.load(&self.store, &mut hist)?;
        for run in &runs {
            self.journals.close(&self.store, run, &mut hist)?;
        }
        self.apply_compaction(hist)?;
        let mut logs = sled::Batch::default();
        for run in self.log_journals.load(&self.store, &mut logs)? {
            self.log_journals.close(&self.store, &run, &mut logs)?;
        }
        self.store.logs.apply_batch(logs)?;
        self.store.db.flush()?;
        self.stale = false;
        Ok(())
    }

    fn apply_compaction(&self, hist: sled::Batch) -> Result<(), StoreError> {
        let (count, lock) = &*self.store.compaction;
        let _exclusive = lock.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        count.fetch_add(1, Ordering::SeqCst);
        let applied = self.store.history.apply_batch(hist);
        count.fetch_add(1, Ordering::SeqCst);
        Ok(applied?)
    }

    fn write_inner(&mut self, batch: Batch) -> Result<(), StoreError> {
        if self.stale {
            self.fold_journals()?;
        }
        let mut hist = sled::Batch::default();
        let full = self.journals.append(&self.store, batch.points, &mut hist)?;
        if full.is_empty() {
            self.store.history.apply_batch(hist)?;
        } else {
            for run in &full {
                self.journals.compact(&self.store, run, &mut hist)?;
            }
            self.apply_compaction(hist)?;
        }

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
        for run in self.log_journals.append(&self.store, batch.logs, &mut logs)? {
            self.log_journals.compact(&self.store, &run, &mut logs)?;
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
        let mut sweeps = sled::Batch::default();
        for sweep in &batch.sweeps {
            sweeps.insert(sweep.id.as_bytes(), json(sweep));
        }
        self.store.sweeps.apply_batch(sweeps)?;

        // The run records go last: they hold each node's acknowledged sequence number, and sled
        // persists its log in order, so an acknowledgement that reached the disk (a background
        // flush, a flush that failed half-way on a full disk) never covers frames whose data did
        // not. A batch of many nodes' frames carries a run's record (and a rank's info) once per
        // node: only the newest of each is encoded and written.
        let mut b = sled::Batch::default();
        let mut seen = std::collections::HashSet::new();
        for r in batch.runs.iter().rev().filter(|r| seen.insert(&r.id)) {
            b.insert(r.id.as_str().as_bytes(), json(r));
        }
        self.store.runs.apply_batch(b)?;

        self.store.db.flush()?;
        Ok(())
    }

    /// Compacts the journal of a run that has ended, and forgets its open rollup buckets.
    pub fn close_run(&mut self, run: &RunId) -> Result<(), StoreError> {
        if self.stale {
            return self.fold_journals();
        }
        let mut hist = sled::Batch::default();
        let mut logs = sled::Batch::default();
        let r = self.journals.close(&self.store, run, &mut hist).and_then(|()| self.apply_compaction(hist));
        let r = r.and_then(|()| self.log_journals.close(&self.store, run, &mut logs));
        let r = r.and_then(|()| Ok(self.store.logs.apply_batch(logs)?));
        let r = r.and_then(|()| Ok(self.store.db.flush().map(|_| ())?));
        self.stale |= r.is_err();
        r
    }
}

/// Which run a name means when several share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The newest (reading commands: `show`, `metrics`, `attach`).
    Newest,
    /// The one live run of that name, refusing when several are (`stop`, `kill`).
    Live,
}

/// The run `query` names among `runs` (oldest first): its whole id, a unique id prefix, the
/// id's unique last part (`0397` of `20261207T171025-0397`, as users copy it from a list), else
/// a run name as `pick` says. One rule for the server and the CLI.
pub fn pick(runs: &[RunRecord], query: &str, pick: Pick) -> Result<RunId, StoreError> {
    let ambiguous = |ids: Vec<&RunRecord>| StoreError::Ambiguous {
        query: query.to_string(),
        candidates: ids.iter().map(|r| r.id.0.as_str()).collect::<Vec<_>>().join(", "),
    };
    if let Some(r) = runs.iter().find(|r| r.id.0 == query) {
        return Ok(r.id.clone());
    }
    let by_prefix: Vec<&RunRecord> = runs.iter().filter(|r| r.id.0.starts_with(query)).collect();
    match by_prefix.len() {
        1 => return Ok(by_prefix[0].id.clone()),
        n if n > 1 => return Err(ambiguous(by_prefix)),
        _ => {}
    }
    if !query.is_empty() && query.bytes().all(|b| b.is_ascii_alphanumeric()) {
        let by_suffix: Vec<&RunRecord> = runs.iter().filter(|r| r.id.0.rsplit('-').next() == Some(query)).collect();
        match by_suffix.len() {
            1 => return Ok(by_suffix[0].id.clone()),
            n if n > 1 => return Err(ambiguous(by_suffix)),
            _ => {}
        }
    }
    // Newest by creation time: two runs started in one second (a recovery restart) have ids
    // whose order is their random suffix's.
    let mut named: Vec<&RunRecord> = runs.iter().filter(|r| r.name == query).collect();
    named.sort_by(|a, b| (b.created_ms, &b.id.0).cmp(&(a.created_ms, &a.id.0)));
    let live: Vec<&RunRecord> = named.iter().copied().filter(|r| r.status.is_live()).collect();
    match (pick, live.len()) {
        (Pick::Live, 1) => Ok(live[0].id.clone()),
        (Pick::Live, count) if count > 1 => Err(StoreError::AmbiguousName {
            query: query.to_string(),
            count,
            candidates: live.iter().map(|r| r.id.0.as_str()).collect::<Vec<_>>().join(", "),
        }),
        _ => named.first().map(|r| r.id.clone()).ok_or_else(|| StoreError::NoSuchRun { query: query.to_string() }),
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

    /// A full id, a unique id prefix, the id's distinctive last part (`0397` of
    /// `20261207T171025-0397`), or a run name (the newest run of that name wins).
    pub fn resolve(&self, query: &str) -> Result<RunId, StoreError> {
        self.resolve_as(query, Pick::Newest)
    }

    /// `resolve`, a name meaning what `how` says (`Pick::Live` for stop and kill).
    pub fn resolve_as(&self, query: &str, how: Pick) -> Result<RunId, StoreError> {
        if self.runs.contains_key(query.as_bytes())? {
            return Ok(RunId(query.to_string()));
        }
        pick(&self.list_runs()?, query, how)
    }

    pub fn ranks(&self, run: &RunId) -> Result<Vec<RankInfo>, StoreError> {
        self.ranks.scan_prefix(keys::run_prefix(run)).map(|kv| parse("ranks", &kv?.1)).collect()
    }

    pub fn events(&self, run: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        self.events.scan_prefix(keys::run_prefix(run)).map(|kv| parse("events", &kv?.1)).collect()
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

#[cfg(test)]
mod pick_tests {
    use super::*;

    #[test]
    fn a_run_is_named_by_its_id_a_prefix_its_last_part_or_its_name() {
        use crate::record::RunStatus::*;
        let run = RunRecord::for_test;
        let runs = vec![
            run("20261207T171025-0397", "tiny-gpt", Succeeded, 1_000),
            run("20261207T171126-a1b2", "tiny-gpt", Running, 2_000),
            run("20261207T171227-c3d4", "tiny-gpt", Running, 3_000),
            run("20261207T171328-e5f6", "sft", Failed, 4_000),
            // A recovery restart in the same second as its parent: its id sorts first.
            run("20261207T171429-ffff", "budget", Failed, 5_000),
            run("20261207T171429-0000", "budget", Failed, 5_400),
        ];
        let got = |q: &str, p| pick(&runs, q, p).map(|id| id.0).map_err(|e| e.to_string());
        assert_eq!(got("20261207T171025-0397", Pick::Newest), Ok("20261207T171025-0397".into()));
        assert_eq!(got("20261207T1713", Pick::Newest), Ok("20261207T171328-e5f6".into()));
        assert_eq!(got("0397", Pick::Newest), Ok("20261207T171025-0397".into()), "the distinctive last part");
        assert_eq!(got("tiny-gpt", Pick::Newest), Ok("20261207T171227-c3d4".into()), "the newest of the name");
        let e = got("tiny-gpt", Pick::Live).expect_err("two live runs of the name");
        assert!(e.contains("2 live runs are named \"tiny-gpt\"") && e.contains("20261207T171126-a1b2"), "{e}");
        assert_eq!(got("sft", Pick::Live), Ok("20261207T171328-e5f6".into()), "none live: the newest (then: not live)");
        assert!(got("20261207T17", Pick::Newest).expect_err("a shared prefix").contains("matches several runs"));
        assert!(got("nope", Pick::Newest).expect_err("nothing").contains("no run matches"));
        assert_eq!(got("budget", Pick::Newest), Ok("20261207T171429-0000".into()), "newest by creation, not id");
    }
}
