//! `flightdeck import`: a finished run's logs (or TensorBoard events) into the history, through the same fold and tracker as a live run.
//!
//! The sources are read on a blocking thread and turned into the frames an agent would have
//! sent (each rank started, its log records, its exit, the run's end); a `Tracker` folds them
//! into batches exactly as for a live run, so an imported run has the same series, events,
//! verdicts and status rules, and opens in the cockpit like any other. A rank whose log shows a
//! failure (a failure event about it, or its own last error line) exited 1; the run failed if
//! any rank did.
use super::tracker::Tracker;
use super::Shared;
use crate::adapters::fatal::LastError;
use crate::adapters::{Choice, LogReader, Record, RecordKind};
use crate::ids::{unix_ms, Rank, RunId};
use crate::protocol::{AgentEvent, AgentFrame, ExitStatus, RunOutcome};
use crate::store::{Batch, EventKind, EventRecord, RunMeta, RunRecord, RunStatus};
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Frames per store batch.
const BATCH_FRAMES: usize = 4096;
/// An error line at most this many lines before the end of a rank's log is how it ended (a
/// traceback's last line, then torchrun's few lines of farewell).
const ENDING_LINES: u64 = 30;

/// What `flightdeck import` asks for.
pub struct ImportRequest {
    /// Absolute: the server reads it.
    pub path: PathBuf,
    pub format: Choice,
    pub name: Option<String>,
}

/// What an import made.
pub struct Imported {
    pub run: RunId,
    pub ranks: u32,
    pub records: u64,
    pub status: RunStatus,
}

/// Where each rank's lines come from.
#[derive(Debug, PartialEq)]
pub enum Sources {
    /// Per rank, its log files in order (torchrun's stdout then stderr).
    Logs(BTreeMap<u32, Vec<PathBuf>>),
    /// Per rank, TensorBoard event files, with the prefix their tags get (a non-rank subdirectory).
    TensorBoard(BTreeMap<u32, Vec<(String, PathBuf)>>),
}

pub async fn import(shared: &Shared, req: ImportRequest) -> anyhow::Result<Imported> {
    let path = req.path.clone();
    let sources = tokio::task::spawn_blocking(move || find_sources(&path)).await??;
    let ranks = match &sources {
        Sources::Logs(m) => m.keys().copied().collect::<Vec<_>>(),
        Sources::TensorBoard(m) => m.keys().copied().collect(),
    };
    let world = ranks.iter().max().map_or(1, |r| r + 1);
    let run = RunId::new_now();
    let shown = req.path.display().to_string();
    let name = req.name.clone().unwrap_or_else(|| default_name(&req.path));
    let meta = RunMeta {
        name: name.clone(),
        recipe_name: "import".into(),
        recipe_path: shown.clone(),
        recipe_json: "{}".into(),
        world_size: world,
        steps_planned: 0,
    };
    let record = RunRecord::starting(run.clone(), meta, vec!["imported".into()], Vec::new(), None);
    let mut tracker = Tracker::new(record, Vec::new());
    let mut batch = Batch::default();
    batch.runs.push(tracker.state.record.clone());
    let kind = match &sources {
        Sources::Logs(_) => "logs",
        Sources::TensorBoard(_) => "TensorBoard events",
    };
    let text = format!("imported run {name} from {kind} at {shown}: {} ranks", ranks.len());
    batch.events.push((run.clone(), EventRecord { t_ms: unix_ms(), kind: EventKind::RunStarted, rank: None, text }));
    shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;

    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<AgentEvent>>(4);
    let format = req.format;
    let reader = tokio::task::spawn_blocking(move || read_all(sources, format, tx));
    let (mut seq, mut records) = (0u64, 0u64);
    while let Some(events) = rx.recv().await {
        records += events.iter().filter(|e| matches!(e, AgentEvent::LogRecord { .. })).count() as u64;
        let frames: Vec<AgentFrame> = events
            .into_iter()
            .map(|event| {
                seq += 1;
                AgentFrame { seq, t_ms: unix_ms(), event }
            })
            .collect();
        let mut batch = Batch::default();
        tracker.apply(0, &frames, &mut batch);
        shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
    }
    reader.await??;
    let status = tracker.state.record.status;
    if status.is_live() {
        // The reader stopped before the end (it said why); the run is not left live.
        let mut batch = Batch::default();
        tracker.end_without_agent(RunStatus::Interrupted, "the import stopped before its end".into(), &mut batch);
        shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
    }
    shared.ingest.close_run(run.clone()).await;
    Ok(Imported { run, ranks: ranks.len() as u32, records, status: tracker.state.record.status })
}

fn default_name(path: &Path) -> String {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "import".into());
    let clean: String =
        stem.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    let clean: String = clean.chars().take(64).collect();
    if clean.is_empty() {
        "import".into()
    } else {
        clean
    }
}

/// A file is rank 0's log; a directory holds per-rank logs (`rank-N.log`, or torchrun's
/// `--log-dir` layout `RUN/attempt_K/N/{stdout,stderr}.log`, the last attempt) or TensorBoard
/// event files (`events.out.tfevents.*`, a `rankN` subdirectory per rank).
pub fn find_sources(path: &Path) -> anyhow::Result<Sources> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if meta.is_file() {
        return Ok(Sources::Logs(BTreeMap::from([(0, vec![path.to_path_buf()])])));
    }
    let mut files = Vec::new();
    walk(path, 0, &mut files).with_context(|| format!("listing {}", path.display()))?;
    let events: Vec<&PathBuf> = files.iter().filter(|f| file_name(f).starts_with("events.out.tfevents.")).collect();
    if !events.is_empty() {
        let mut ranks: BTreeMap<u32, Vec<(String, PathBuf)>> = BTreeMap::new();
        for f in events {
            let dir = f.parent().and_then(|d| d.strip_prefix(path).ok()).map(|d| d.to_string_lossy().into_owned());
            let dir = dir.unwrap_or_default();
            let (rank, prefix) = match rank_of(&dir) {
                Some(r) => (r, String::new()),
                None if dir.is_empty() => (0, String::new()),
                None => (0, format!("{dir}/")),
            };
            ranks.entry(rank).or_default().push((prefix, f.clone()));
        }
        return Ok(Sources::TensorBoard(ranks));
    }
    // torchrun --log-dir: RUN/attempt_K/LOCAL_RANK/{stdout,stderr}.log; the last attempt wins.
    let mut torchrun: BTreeMap<u32, (u32, Vec<PathBuf>)> = BTreeMap::new();
    for f in &files {
        let name = file_name(f);
        if name != "stdout.log" && name != "stderr.log" {
            continue;
        }
        let rank_dir = f.parent();
        let attempt_dir = rank_dir.and_then(Path::parent);
        let rank = rank_dir.map(file_name).and_then(|d| d.parse::<u32>().ok());
        let attempt =
            attempt_dir.map(file_name).and_then(|d| d.strip_prefix("attempt_").and_then(|a| a.parse::<u32>().ok()));
        if let (Some(rank), Some(attempt)) = (rank, attempt) {
            let slot = torchrun.entry(rank).or_insert((attempt, Vec::new()));
            if attempt > slot.0 {
                *slot = (attempt, Vec::new());
            }
            if attempt == slot.0 {
                slot.1.push(f.clone());
            }
        }
    }
    if !torchrun.is_empty() {
        let mut ranks = BTreeMap::new();
        for (rank, (_, mut fs)) in torchrun {
            // stdout before stderr: the metrics first, the traceback last.
            fs.sort_by_key(|f| file_name(f) != "stdout.log");
            ranks.insert(rank, fs);
        }
        return Ok(Sources::Logs(ranks));
    }
    let mut ranks: BTreeMap<u32, Vec<PathBuf>> = BTreeMap::new();
    for f in &files {
        let name = file_name(f);
        let stem = name.strip_suffix(".log").or_else(|| name.strip_suffix(".txt"));
        if let Some(rank) = stem.and_then(rank_of) {
            ranks.entry(rank).or_default().push(f.clone());
        }
    }
    if ranks.is_empty() {
        anyhow::bail!(
            "{} holds no logs to import: give a log file, a directory of rank-N.log files, torchrun's --log-dir \
             (RUN/attempt_K/N/stdout.log), or a TensorBoard directory (events.out.tfevents.*)",
            path.display()
        );
    }
    Ok(Sources::Logs(ranks))
}

/// `rank-3`, `rank_3`, `rank3`, `3` → 3.
fn rank_of(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("rank").map(|r| r.trim_start_matches(['-', '_'])).unwrap_or(name);
    digits.parse().ok().filter(|_| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// Files under `dir`, sorted, at most 4 levels down (torchrun's layout is 3).
fn walk(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() && depth < 4 {
            walk(&p, depth + 1, out)?;
        } else if p.is_file() {
            out.push(p);
        }
    }
    Ok(())
}

/// Reads every source and sends the run's events in chunks: the ranks' starts, each rank's
/// records, the exits (failed ranks last, so the others are not left "waiting" on them), the end.
fn read_all(sources: Sources, format: Choice, tx: tokio::sync::mpsc::Sender<Vec<AgentEvent>>) -> anyhow::Result<()> {
    let send =
        |events: Vec<AgentEvent>| tx.blocking_send(events).map_err(|_| anyhow::anyhow!("the import was dropped"));
    let ranks: Vec<u32> = match &sources {
        Sources::Logs(m) => m.keys().copied().collect(),
        Sources::TensorBoard(m) => m.keys().copied().collect(),
    };
    let started = ranks.iter().map(|&r| AgentEvent::RankStarted {
        rank: Rank(r),
        local_rank: r,
        pid: 0,
        host: "imported".into(),
    });
    send(started.collect())?;
    let mut ends: Vec<(u32, Option<String>, bool)> = Vec::new();
    let mut failures: BTreeMap<u32, String> = BTreeMap::new();
    match sources {
        Sources::Logs(m) => {
            for (rank, files) in m {
                let mut fatal = LastError::default();
                let mut reader = LogReader::new(format);
                let mut chunk = Vec::new();
                let mut line_base = 0u64;
                for file in files {
                    let f = std::fs::File::open(&file).with_context(|| format!("cannot read {}", file.display()))?;
                    let lines = crate::cli::parse_log::read_lines(f, &file, |n, line| {
                        fatal.line(&String::from_utf8_lossy(line));
                        for record in reader.push(line_base + n, line) {
                            note_failure(&record, rank, &mut failures);
                            chunk.push(AgentEvent::LogRecord { rank: Rank(rank), record });
                        }
                        if chunk.len() >= BATCH_FRAMES {
                            let full = std::mem::take(&mut chunk);
                            // A dropped receiver ends the import at the next send below.
                            let _ = tx.blocking_send(full);
                        }
                    })?;
                    line_base += lines.lines;
                }
                for record in reader.finish() {
                    note_failure(&record, rank, &mut failures);
                    chunk.push(AgentEvent::LogRecord { rank: Rank(rank), record });
                }
                send(chunk)?;
                // An error line near the end is how the rank ended; one in mid-log was survived.
                let last_error = fatal.get().map(str::to_string);
                let failed = fatal.lines_since().is_some_and(|n| n <= ENDING_LINES);
                ends.push((rank, last_error, failed));
            }
        }
        Sources::TensorBoard(m) => {
            for (rank, files) in m {
                let mut chunk = Vec::new();
                for (prefix, file) in files {
                    for (step, metrics) in by_step(&prefix, tensorboard_scalars(&file)?) {
                        let record = Record {
                            line: 0,
                            end_line: None,
                            step: Some(step),
                            kind: RecordKind::Step,
                            metrics,
                            labels: Vec::new(),
                        };
                        chunk.push(AgentEvent::LogRecord { rank: Rank(rank), record });
                    }
                }
                send(chunk)?;
                ends.push((rank, None, false));
            }
        }
    }
    for (rank, said) in &failures {
        if let Some(end) = ends.iter_mut().find(|(r, ..)| r == rank) {
            end.2 = true;
            if end.1.is_none() {
                end.1 = Some(said.clone());
            }
        }
    }
    ends.sort_by_key(|(rank, _, failed)| (*failed, *rank));
    let mut last = Vec::new();
    for (rank, last_error, failed) in &ends {
        let status = if *failed { ExitStatus::Code(1) } else { ExitStatus::Code(0) };
        last.push(AgentEvent::RankExited { rank: Rank(*rank), pid: 0, status, last_error: last_error.clone() });
    }
    let failed: Vec<&(u32, Option<String>, bool)> = ends.iter().filter(|e| e.2).collect();
    let (outcome, reason) = match failed.first() {
        None => (RunOutcome::Succeeded, format!("imported: {} ranks, no failure in their logs", ends.len())),
        Some((rank, said, _)) => {
            let said = said.as_deref().map(|s| format!(": {s}")).unwrap_or_default();
            (RunOutcome::Failed, format!("imported: rank {rank} failed{said}"))
        }
    };
    last.push(AgentEvent::RunEnded { outcome, reason });
    send(last)
}

/// A failure event's words, kept for the rank it is about.
fn note_failure(record: &Record, printer: u32, failures: &mut BTreeMap<u32, String>) {
    match record.failure(printer) {
        Some(("nan_loss", _)) | None => {}
        Some((name, about)) => {
            failures.entry(about).or_insert_with(|| name.replace('_', " "));
        }
    }
}

/// One TensorBoard scalar: (tag, step, value).
type Scalar = (String, i64, f64);

fn tensorboard_scalars(file: &Path) -> anyhow::Result<Vec<Scalar>> {
    let events = crate::tensorboard::read_file(file)?;
    if events.bad_crc > 0 {
        tracing::warn!("{}: a record failed its CRC at byte {:?}; read up to it", file.display(), events.bad_at);
    }
    Ok(events.scalars.into_iter().map(|s| (s.tag, s.step, s.value)).collect())
}

/// TensorBoard scalars grouped into one record per step, tags as the metric names.
fn by_step(prefix: &str, scalars: Vec<Scalar>) -> Vec<(u64, Vec<(String, f64)>)> {
    let mut steps: BTreeMap<u64, Vec<(String, f64)>> = BTreeMap::new();
    for (tag, step, value) in scalars {
        let step = u64::try_from(step).unwrap_or(0);
        let metrics = steps.entry(step).or_default();
        let name = format!("{prefix}{tag}");
        match metrics.iter_mut().find(|(n, _)| *n == name) {
            // The same tag twice at one step (a restart): the later value wins.
            Some(m) => m.1 = value,
            None => metrics.push((name, value)),
        }
    }
    steps.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, "x\n").expect("write");
    }

    #[test]
    fn per_rank_logs_torchrun_layouts_and_tensorboard_dirs_are_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        touch(&d.join("a/rank-0.log"));
        touch(&d.join("a/rank-1.log"));
        touch(&d.join("a/notes.md"));
        let Sources::Logs(m) = find_sources(&d.join("a")).expect("a") else { panic!("logs") };
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), vec![0, 1]);

        for f in
            ["attempt_0/0/stdout.log", "attempt_1/0/stderr.log", "attempt_1/0/stdout.log", "attempt_1/1/stdout.log"]
        {
            touch(&d.join("b/run42").join(f));
        }
        let Sources::Logs(m) = find_sources(&d.join("b")).expect("b") else { panic!("logs") };
        let names =
            |r: u32| m[&r].iter().map(|p| p.strip_prefix(d).expect("under").display().to_string()).collect::<Vec<_>>();
        assert_eq!(names(0), vec!["b/run42/attempt_1/0/stdout.log", "b/run42/attempt_1/0/stderr.log"]);
        assert_eq!(names(1), vec!["b/run42/attempt_1/1/stdout.log"]);

        touch(&d.join("c/rank1/events.out.tfevents.1.host.2.0"));
        touch(&d.join("c/eval/events.out.tfevents.1.host.2.0"));
        let Sources::TensorBoard(m) = find_sources(&d.join("c")).expect("c") else { panic!("tb") };
        assert_eq!(m[&1][0].0, "");
        assert_eq!(m[&0][0].0, "eval/", "a subdirectory that is not a rank prefixes its tags");

        let err = find_sources(&d.join("a/notes.md").with_file_name("missing")).expect_err("missing");
        assert!(format!("{err:#}").contains("cannot read"), "{err:#}");
        std::fs::create_dir_all(d.join("empty")).expect("mkdir");
        let err = find_sources(&d.join("empty")).expect_err("empty");
        assert!(format!("{err:#}").contains("holds no logs to import"), "{err:#}");
    }

    #[test]
    fn rank_names_and_run_names() {
        assert_eq!(rank_of("rank-3"), Some(3));
        assert_eq!(rank_of("rank_12"), Some(12));
        assert_eq!(rank_of("rank0"), Some(0));
        assert_eq!(rank_of("7"), Some(7));
        assert_eq!(rank_of("rankx"), None);
        assert_eq!(rank_of("rank"), None);
        assert_eq!(default_name(Path::new("/x/megatron run.log")), "megatron-run");
    }
}
