//! Checkpoints: their on-disk format (`disk`), how they are written (`commit`), which one a
//! resume may use (`choose`), and their index in the store (tree `checkpoints`:
//! run \0 step(u64 BE) → JSON `CheckpointRecord`).
pub mod commit;
pub mod disk;

use super::db::{Store, StoreError};
use crate::ids::RunId;
pub use crate::record::{CheckpointRecord, Skipped};
use disk::{Corrupt, Depth, Manifest};
use std::path::{Path, PathBuf};

/// `run \0 step`.
pub fn key(run: &RunId, step: u64) -> Vec<u8> {
    let mut k = super::keys::run_prefix(run);
    k.extend_from_slice(&step.to_be_bytes());
    k
}

impl Store {
    /// Every checkpoint recorded for a run, oldest first.
    pub fn checkpoints(&self, run: &RunId) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.checkpoints
            .scan_prefix(super::keys::run_prefix(run))
            .map(|kv| {
                serde_json::from_slice(&kv?.1)
                    .map_err(|e| StoreError::Corrupt { tree: "checkpoints", reason: e.to_string() })
            })
            .collect()
    }
}

/// The checkpoint directory of a run: `checkpoint.dir` under its run directory (an absolute
/// `checkpoint.dir` stands as it is).
pub fn root_of(run_dir: &Path, checkpoint_dir: &str) -> PathBuf {
    run_dir.join(checkpoint_dir)
}

/// The bytes a checkpoint of `model` takes: the weights and AdamW's two moments as f32, plus
/// the small files (a margin of 64 KiB).
pub fn estimated_bytes(model: &crate::recipe::Model) -> u64 {
    crate::mfu::total_params(model) * 4 * 3 + (64 << 10)
}

/// Bytes free to an unprivileged writer on the filesystem holding `path` (or its nearest
/// existing ancestor, for a directory not made yet).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let existing = path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::other("a path with a NUL byte"))?;
    // SAFETY: statvfs fills the struct it is given; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Whether `free` bytes hold the checkpoints a run keeps: Err (refuse) when not even one fits,
/// Ok(Some(warning)) when fewer than `keep + 1` do (the newest is written before the oldest is
/// pruned), Ok(None) when all do.
pub fn room(free: u64, bytes: u64, keep: u32, root: &Path) -> Result<Option<String>, String> {
    let (b, f) = (crate::units::bytes(bytes), crate::units::bytes(free));
    if free < bytes {
        return Err(format!(
            "no room for one checkpoint: a save needs about {b} and {} has {f} free; free space there or set \
             checkpoint.dir on a larger disk",
            root.display()
        ));
    }
    let want = bytes.saturating_mul(u64::from(keep) + 1);
    Ok((free < want).then(|| {
        format!(
            "checkpoint space is short: checkpoint.keep = {keep} needs about {} ({} saves of {b} while the newest is \
             written), {} has {f} free; saves will fail once it fills",
            crate::units::bytes(want),
            keep + 1,
            root.display()
        )
    }))
}

fn depth_name(depth: Depth) -> &'static str {
    match depth {
        Depth::Sizes => "sizes",
        Depth::Sha256 => "sha256",
    }
}

/// Checks what is on disk under `root` against what the store `known`s, to `depth`: every step
/// directory on disk (torn ones too, as not verified) and every recorded one (gone ones too).
pub fn inspect(run: &RunId, root: &Path, known: Vec<CheckpointRecord>, depth: Depth) -> Vec<CheckpointRecord> {
    let now = crate::ids::unix_ms();
    let mut out: Vec<CheckpointRecord> = Vec::new();
    let on_disk = disk::scan(root).unwrap_or_default();
    for (step, dir) in &on_disk {
        let result = disk::verify(dir, *step, depth);
        let mut rec = known.iter().find(|k| k.step == *step).cloned().unwrap_or_else(|| CheckpointRecord {
            run: run.clone(),
            step: *step,
            path: dir.display().to_string(),
            bytes: dir_bytes(dir),
            loss: None,
            saved_ms: 0,
            blocking_ms: 0.0,
            write_ms: 0.0,
            verified: false,
            checked: String::new(),
            checked_ms: 0,
            problem: None,
            nodes: Vec::new(),
        });
        if let Ok(m) = &result {
            rec.bytes = m.bytes();
            rec.loss = rec.loss.or(Some(m.loss));
            rec.saved_ms = if rec.saved_ms == 0 { m.saved_ms } else { rec.saved_ms };
        }
        let failed_hash_before = !rec.verified && rec.checked == depth_name(Depth::Sha256);
        if depth == Depth::Sizes && result.is_ok() && failed_hash_before {
            // Sizes cannot clear a checkpoint whose bytes failed their hash: the last full
            // verification's verdict stands until the next one.
            out.push(rec);
            continue;
        }
        rec.verified = result.is_ok();
        rec.problem = result.err().map(|e| e.to_string());
        rec.checked = depth_name(depth).into();
        rec.checked_ms = now;
        out.push(rec);
    }
    for mut rec in known {
        if !on_disk.iter().any(|(s, _)| *s == rec.step) {
            rec.verified = false;
            rec.problem = Some(format!("{} is gone", rec.path));
            rec.checked = depth_name(depth).into();
            rec.checked_ms = now;
            out.push(rec);
        }
    }
    out.sort_by_key(|r| r.step);
    out
}

fn dir_bytes(dir: &Path) -> u64 {
    let files = std::fs::read_dir(dir).into_iter().flatten().flatten();
    files.filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
}

/// Why a run has no checkpoint, as far as its record and recipe tell: it ended before its first
/// save, or it saves only on a graceful stop and did not get one.
pub fn why_none(stopped_at: u64, every: u64, dir: &str) -> String {
    match every {
        0 => format!(
            "it stopped at step {stopped_at} without a checkpoint: checkpoint.every = 0 saves only on a graceful \
             stop (`flightdeck stop`), and this run did not get one (nothing in {dir})"
        ),
        n if stopped_at < n => format!(
            "it stopped at step {stopped_at}, before its first save at step {n} (checkpoint.every = {n}): there \
             is no checkpoint to resume from"
        ),
        n => format!(
            "there are no checkpoints in {dir}, though it reached step {stopped_at} with checkpoint.every = {n}: \
             they were removed, or every save failed (`flightdeck show` lists the save events)"
        ),
    }
}

/// The checkpoint a resume will load: verified to the last byte. Serialized by `agent
/// checkpoint`, which chooses on an SSH node for the server.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Chosen {
    pub step: u64,
    pub path: PathBuf,
    pub manifest: Manifest,
    /// Newer checkpoints that failed verification, newest first.
    pub skipped: Vec<Skipped>,
}

#[derive(Debug, thiserror::Error)]
pub enum ChooseError {
    #[error("there are no checkpoints in {dir}")]
    NoCheckpoints { dir: String },
    #[error("there is no checkpoint at step {step} in {dir}; steps there: {available}")]
    NoSuchStep { step: u64, dir: String, available: String },
    #[error("checkpoint step {step} ({path}) cannot be trusted: {reason}")]
    Corrupt { step: u64, path: String, reason: Corrupt },
    #[error("no checkpoint in {dir} can be trusted: {}", list(skipped))]
    NoneVerified { dir: String, skipped: Vec<Skipped> },
    #[error("reading {dir}: {reason}")]
    Io { dir: String, reason: String },
}

pub fn list(skipped: &[Skipped]) -> String {
    skipped.iter().map(|s| format!("step {}: {}", s.step, s.reason)).collect::<Vec<_>>().join("; ")
}

/// The checkpoint at `step`, or the newest one that verifies (sha256 of every file). Never
/// returns one that fails: `--step` on a bad one is refused with the reason.
pub fn choose(root: &Path, step: Option<u64>) -> Result<Chosen, ChooseError> {
    let dir = root.display().to_string();
    let all = disk::scan(root).map_err(|e| ChooseError::Io { dir: dir.clone(), reason: e.to_string() })?;
    if all.is_empty() {
        return Err(ChooseError::NoCheckpoints { dir });
    }
    if let Some(step) = step {
        let Some((_, path)) = all.iter().find(|(s, _)| *s == step) else {
            let available = all.iter().map(|(s, _)| s.to_string()).collect::<Vec<_>>().join(", ");
            return Err(ChooseError::NoSuchStep { step, dir, available });
        };
        return match disk::verify(path, step, Depth::Sha256) {
            Ok(manifest) => Ok(Chosen { step, path: path.clone(), manifest, skipped: Vec::new() }),
            Err(reason) => Err(ChooseError::Corrupt { step, path: path.display().to_string(), reason }),
        };
    }
    let mut skipped = Vec::new();
    for (step, path) in all.into_iter().rev() {
        match disk::verify(&path, step, Depth::Sha256) {
            Ok(manifest) => return Ok(Chosen { step, path, manifest, skipped }),
            Err(reason) => skipped.push(Skipped { step, reason: reason.to_string() }),
        }
    }
    Err(ChooseError::NoneVerified { dir, skipped })
}

#[cfg(test)]
#[path = "checkpoints/tests.rs"]
mod tests;
