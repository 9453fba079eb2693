//! Writing a checkpoint so that a crash at any instant leaves either a committed step or one
//! that is plainly not committed: files and their fsyncs first, then the manifest (atomically),
//! then `LATEST` (atomically), then pruning, which uncommits before it deletes.
use super::disk::{fsync_dir_of, latest_name, scan, sha256_hex, step_dir_name, verify, Depth, FileEntry, Manifest};
use super::disk::{FORMAT_VERSION, LATEST, MANIFEST};
use std::io::Write;
use std::path::Path;

/// What the manifest says about the checkpoint besides its files.
#[derive(Clone, Debug)]
pub struct CommitInfo {
    pub run: String,
    pub step: u64,
    pub world_size: u32,
    pub loss: f64,
    pub saved_ms: u64,
    /// The node whose disk this copy is on (`FLIGHTDECK_NODE`).
    pub node: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("checkpoint step {step} is already committed at {dir}")]
    Exists { step: u64, dir: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// A save that failed before its manifest: what it wrote is gone, or says why not.
    #[error("{source} ({})", cleanup_text(.dir, .cleanup))]
    Partial { dir: String, source: Box<CommitError>, cleanup: Result<(), String> },
}

fn cleanup_text(dir: &str, cleanup: &Result<(), String>) -> String {
    match cleanup {
        Ok(()) => format!("the partial {dir} was removed"),
        Err(e) => format!("the partial {dir} could not be removed: {e}"),
    }
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> CommitError + '_ {
    move |source| CommitError::Io { path: path.display().to_string(), source }
}

/// Creates (or truncates) `path`, writes `bytes` and fsyncs it.
pub fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Replaces `dir/name` atomically: write a temporary, fsync it, rename over, fsync the
/// directory. A reader sees the old file or the new one, never a part of either.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    write_synced(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(name))?;
    fsync_dir_of(dir)
}

/// Writes `files` as checkpoint `info.step` under `root` and commits it. Each file is hashed on a
/// second thread while it is written, so the hash costs no extra pass over the disk.
pub fn commit(root: &Path, info: &CommitInfo, files: &[(&str, &[u8])]) -> Result<Manifest, CommitError> {
    std::fs::create_dir_all(root).map_err(io_at(root))?;
    let dir = root.join(step_dir_name(info.step));
    if dir.exists() {
        if verify(&dir, info.step, Depth::Sizes).is_ok() {
            return Err(CommitError::Exists { step: info.step, dir: dir.display().to_string() });
        }
        // A torn leftover of an earlier attempt at this step: never committed, safe to drop.
        std::fs::remove_dir_all(&dir).map_err(io_at(&dir))?;
    }
    // The new directory's entry in `root` becomes durable with LATEST's fsync of `root`; until
    // then a power loss can only lose the whole directory, never tear it.
    std::fs::create_dir(&dir).map_err(io_at(&dir))?;
    let manifest = match write_step(&dir, info, files) {
        Ok(m) => m,
        Err(e) => {
            // Never committed: a full disk must not keep the half-written files that would make
            // the next save fail sooner.
            let cleanup = std::fs::remove_dir_all(&dir).map_err(|e| e.to_string());
            let dir = dir.display().to_string();
            return Err(CommitError::Partial { dir, source: Box::new(e), cleanup });
        }
    };
    write_atomic(root, LATEST, format!("{}\n", latest_name(info.step)).as_bytes()).map_err(io_at(root))?;
    Ok(manifest)
}

/// The step's files, their fsyncs and its manifest, in `dir` (made empty by the caller).
fn write_step(dir: &Path, info: &CommitInfo, files: &[(&str, &[u8])]) -> Result<Manifest, CommitError> {
    // Everything is written before anything is fsynced: the first fsync then commits one
    // journal transaction holding every file, and the rest find their data already down.
    let mut entries = Vec::with_capacity(files.len());
    let mut open = Vec::with_capacity(files.len());
    for (name, bytes) in files {
        let path = dir.join(name);
        let (written, sha256) = std::thread::scope(|s| {
            let hash = s.spawn(|| sha256_hex(bytes));
            let written = std::fs::File::create(&path).and_then(|mut f| f.write_all(bytes).map(|()| f));
            // The hashing thread cannot panic (it only reads the slice); fall back to hashing here.
            (written, hash.join().unwrap_or_else(|_| sha256_hex(bytes)))
        });
        open.push((written.map_err(io_at(&path))?, path));
        entries.push(FileEntry { name: name.to_string(), bytes: bytes.len() as u64, sha256 });
    }
    // Concurrent fsyncs share the disk's cache flushes instead of paying one each in turn.
    let synced: Vec<(std::io::Result<()>, &Path)> = std::thread::scope(|s| {
        let files: Vec<_> = open.iter().map(|(f, path)| (s.spawn(move || f.sync_all()), path.as_path())).collect();
        let dir_synced = (fsync_dir_of(dir), dir);
        let failed = || Err(std::io::Error::other("the fsync thread panicked"));
        files.into_iter().map(|(h, p)| (h.join().unwrap_or_else(|_| failed()), p)).chain([dir_synced]).collect()
    });
    for (result, path) in synced {
        result.map_err(io_at(path))?;
    }
    let manifest = Manifest {
        format: FORMAT_VERSION,
        run: info.run.clone(),
        step: info.step,
        world_size: info.world_size,
        saved_ms: info.saved_ms,
        loss: info.loss,
        node: info.node.clone(),
        files: entries,
    };
    let json = serde_json::to_vec_pretty(&manifest).unwrap_or_default();
    write_atomic(dir, MANIFEST, &json).map_err(io_at(dir))?;
    Ok(manifest)
}

/// Keeps the newest `keep` committed checkpoints and deletes every step directory older than
/// the oldest kept (torn leftovers included). Returns the steps deleted, oldest first.
pub fn prune(root: &Path, keep: u32) -> Result<Vec<u64>, CommitError> {
    let all = scan(root).map_err(io_at(root))?;
    let committed: Vec<u64> =
        all.iter().filter(|(step, dir)| verify(dir, *step, Depth::Sizes).is_ok()).map(|(step, _)| *step).collect();
    let keep = keep.max(1) as usize;
    if committed.len() <= keep {
        return Ok(Vec::new());
    }
    let oldest_kept = committed[committed.len() - keep];
    let mut removed = Vec::new();
    for (step, dir) in all.into_iter().filter(|(step, _)| *step < oldest_kept) {
        // Uncommit first: a crash halfway through the delete leaves a directory that is
        // plainly not a checkpoint, never one that looks committed with files missing.
        match std::fs::remove_file(dir.join(MANIFEST)) {
            Ok(()) => fsync_dir_of(&dir).map_err(io_at(&dir))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at(&dir)(e)),
        }
        std::fs::remove_dir_all(&dir).map_err(io_at(&dir))?;
        removed.push(step);
    }
    fsync_dir_of(root).map_err(io_at(root))?;
    Ok(removed)
}
