//! One checkpoint as the history indexes it, and one a resume passed over.
use crate::ids::RunId;
use serde::{Deserialize, Serialize};

/// One checkpoint of one run, as the store knows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub run: RunId,
    pub step: u64,
    /// The step directory.
    pub path: String,
    pub bytes: u64,
    /// Mean over ranks of the loss of this step.
    pub loss: Option<f64>,
    pub saved_ms: u64,
    /// How long training waited for the snapshot (and for a previous save still writing).
    pub blocking_ms: f64,
    /// How long the background writer took (write, hash, fsync, commit).
    pub write_ms: f64,
    /// The result of the last check: committed and every checked file as the manifest says.
    pub verified: bool,
    /// `sizes` or `sha256`: how deep the last check looked (`sha256` at save: the writer
    /// hashed the very bytes it wrote).
    pub checked: String,
    pub checked_ms: u64,
    /// Why it is not verified.
    pub problem: Option<String>,
    /// The nodes that committed a copy (a multi-node run keeps one per node), in the order their
    /// writers reported; empty in records from before copies were kept per node.
    #[serde(default)]
    pub nodes: Vec<String>,
}
/// A checkpoint passed over by a resume, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub step: u64,
    pub reason: String,
}
