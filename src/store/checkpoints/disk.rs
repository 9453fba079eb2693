//! A checkpoint on disk: one directory per step, its files, and the manifest that commits it.
//!
//! Layout of `<checkpoint.dir>/step-00000030/`: `model.bin` (every parameter, f32
//! little-endian, in the model's parameter order), `optim.bin` (AdamW's first moments, then its
//! second moments, same order and layout), `state.json` (`State`: step, optimizer counters,
//! tensor index), `recipe.json` (the validated recipe, byte for byte), `rank-N.json` per rank
//! (`RankState`: data position, RNG streams, loss), and `MANIFEST.json` (`Manifest`: every
//! other file's size and sha256), written last. A directory without a manifest never committed.
//! `LATEST` (a sibling of the step directories) names the newest committed one.
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

pub const MANIFEST: &str = "MANIFEST.json";
pub const LATEST: &str = "LATEST";
pub const STATE: &str = "state.json";
pub const MODEL: &str = "model.bin";
pub const OPTIM: &str = "optim.bin";
pub const RECIPE: &str = "recipe.json";
/// Bumped when a file changes meaning; a checkpoint of another format is refused by name.
pub const FORMAT_VERSION: u32 = 1;

pub fn rank_file(rank: u32) -> String {
    format!("rank-{rank}.json")
}

/// `step-00000030`: zero-padded so a plain directory listing sorts by step.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

pub fn parse_step_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
}

/// The commit marker: what was written, so a reader can prove it reads the same bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub run: String,
    pub step: u64,
    pub world_size: u32,
    pub saved_ms: u64,
    /// Mean over ranks of the loss of step `step`.
    pub loss: f64,
    /// The node this copy was written on (every node of a multi-node run keeps one; empty in
    /// checkpoints written before copies were kept per node).
    #[serde(default)]
    pub node: String,
    pub files: Vec<FileEntry>,
}

impl Manifest {
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

/// `state.json`: what the whole group shares at the step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub format: u32,
    pub run: String,
    /// The last step trained: a resume trains `step + 1` onwards.
    pub step: u64,
    pub world_size: u32,
    pub recipe_sha256: String,
    /// AdamW's update count (its bias-correction exponent) and hyper-parameters.
    pub optimizer_steps: u64,
    /// Parameters in order; `offset_bytes` into `model.bin`, and into each half of `optim.bin`.
    pub tensors: Vec<TensorEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    pub shape: Vec<i64>,
    pub offset_bytes: u64,
    pub numel: u64,
}

/// `rank-N.json`: one rank's own state at the step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankState {
    pub rank: u32,
    pub step: u64,
    /// The global index of the next sequence the data stream hands out.
    pub data_position: u64,
    /// The data stream is a pure function of (seed, index): the position is its whole state.
    pub data_seed: u64,
    /// libtorch's CPU generator: seeded with this at model initialisation and drawn from by
    /// nothing else, so rebuilding the model from the seed restores it exactly (see
    /// docs/checkpoints.md: tch exposes no generator get/set).
    pub torch_seed: u64,
    pub loss: f64,
}

/// Why a checkpoint cannot be trusted. Never loaded when any of these holds.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Corrupt {
    #[error("no {MANIFEST}: the save never committed (interrupted, or the manifest was removed)")]
    NoManifest,
    #[error("{MANIFEST} is unreadable: {0}")]
    BadManifest(String),
    #[error("format {found}, this flightdeck reads format {FORMAT_VERSION}")]
    Format { found: u32 },
    #[error("{name} is missing")]
    Missing { name: String },
    #[error("{name} is {found} bytes, the manifest says {expected}")]
    Size { name: String, expected: u64, found: u64 },
    #[error(
        "{name}: sha256 {}… does not match the manifest's {}… (the file changed after it was saved)",
        short(found),
        short(expected)
    )]
    Checksum { name: String, expected: String, found: String },
    #[error("the manifest does not list {name}")]
    Incomplete { name: String },
    #[error("the manifest says step {found}, the directory step {expected}")]
    WrongStep { expected: u64, found: u64 },
    #[error("cannot read {name}: {reason}")]
    Io { name: String, reason: String },
}

/// How hard to look: sizes only (cheap, for listings), or every byte's sha256.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    Sizes,
    Sha256,
}

fn short(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads and checks the manifest of the checkpoint in `dir` (for step `step`) and every file it
/// lists, to `depth`. Ok only for a checkpoint that is safe to load.
pub fn verify(dir: &Path, step: u64, depth: Depth) -> Result<Manifest, Corrupt> {
    let manifest = read_manifest(dir)?;
    if manifest.step != step {
        return Err(Corrupt::WrongStep { expected: step, found: manifest.step });
    }
    let required = [STATE, MODEL, OPTIM, RECIPE].map(String::from).into_iter();
    for name in required.chain((0..manifest.world_size).map(rank_file)) {
        if !manifest.files.iter().any(|f| f.name == name) {
            return Err(Corrupt::Incomplete { name });
        }
    }
    for f in &manifest.files {
        check_file(dir, f, depth)?;
    }
    Ok(manifest)
}

pub fn read_manifest(dir: &Path) -> Result<Manifest, Corrupt> {
    let text = match std::fs::read(dir.join(MANIFEST)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Corrupt::NoManifest),
        Err(e) => return Err(Corrupt::Io { name: MANIFEST.into(), reason: e.to_string() }),
    };
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| Corrupt::BadManifest(e.to_string()))?;
    if manifest.format != FORMAT_VERSION {
        return Err(Corrupt::Format { found: manifest.format });
    }
    Ok(manifest)
}

fn check_file(dir: &Path, f: &FileEntry, depth: Depth) -> Result<(), Corrupt> {
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => Corrupt::Missing { name: f.name.clone() },
        _ => Corrupt::Io { name: f.name.clone(), reason: e.to_string() },
    };
    // A name from the manifest must not reach outside the checkpoint directory.
    if f.name.contains('/') || f.name.starts_with('.') {
        return Err(Corrupt::BadManifest(format!("file name {:?} is not a plain file name", f.name)));
    }
    let path = dir.join(&f.name);
    let found = std::fs::metadata(&path).map_err(io)?.len();
    if found != f.bytes {
        return Err(Corrupt::Size { name: f.name.clone(), expected: f.bytes, found });
    }
    if depth == Depth::Sha256 {
        let mut file = std::fs::File::open(&path).map_err(io)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let found = hex(&hasher.finalize());
        if found != f.sha256 {
            return Err(Corrupt::Checksum { name: f.name.clone(), expected: f.sha256.clone(), found });
        }
    }
    Ok(())
}

/// Reads one listed file whole and proves it is the saved one: the loader hashes exactly the
/// bytes it then parses, so nothing can change between check and use.
pub fn read_verified(dir: &Path, manifest: &Manifest, name: &str) -> Result<Vec<u8>, Corrupt> {
    let entry = manifest.files.iter().find(|f| f.name == name).ok_or(Corrupt::Incomplete { name: name.into() })?;
    let bytes = std::fs::read(dir.join(name)).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Corrupt::Missing { name: name.into() },
        _ => Corrupt::Io { name: name.into(), reason: e.to_string() },
    })?;
    if bytes.len() as u64 != entry.bytes {
        return Err(Corrupt::Size { name: name.into(), expected: entry.bytes, found: bytes.len() as u64 });
    }
    let found = sha256_hex(&bytes);
    if found != entry.sha256 {
        return Err(Corrupt::Checksum { name: name.into(), expected: entry.sha256.clone(), found });
    }
    Ok(bytes)
}

/// The step directories under `root`, oldest first. A missing `root` has none.
pub fn scan(root: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        if let Some(step) = entry.file_name().to_str().and_then(parse_step_dir) {
            if entry.file_type()?.is_dir() {
                found.push((step, entry.path()));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// What `LATEST` holds for a step: its directory's name.
pub fn latest_name(step: u64) -> String {
    step_dir_name(step)
}

/// Makes a directory's entries (creates, renames, deletes) durable.
pub fn fsync_dir_of(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The step `LATEST` names, if it is there and well formed.
pub fn latest(root: &Path) -> Option<u64> {
    std::fs::read_to_string(root.join(LATEST)).ok().and_then(|s| parse_step_dir(s.trim()))
}
