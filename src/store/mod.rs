//! The history: one sled database per `--db`, written only by the server's ingest task.
pub use crate::record::{
    Bucket, EventKind, EventRecord, InitPoint, Lineage, Point, RankInfo, ResumePoint, RunDetail, RunMeta, RunRecord,
    RunStatus, Summary, VerdictRecord,
};

pub mod checkpoints;
pub mod db;
mod detail;
pub mod keys;
pub mod rollup;

pub use checkpoints::CheckpointRecord;
pub use db::{Batch, Store, StoreError, Writer};
