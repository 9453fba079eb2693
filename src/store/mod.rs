//! The history: one sled database per `--db`, written only by the server's ingest task.
pub use crate::record::{
    Bucket, EventKind, EventRecord, InitPoint, Lineage, Point, RankInfo, ResumePoint, RunDetail, RunMeta, RunRecord,
    RunStatus, Summary, SweepRecord, VerdictRecord,
};

mod block;
pub mod checkpoints;
pub mod db;
mod detail;
mod journal;
pub mod keys;
mod logs;
mod migrate;
mod points;
pub mod rollup;
mod sweeps;

pub use checkpoints::CheckpointRecord;
pub use db::{Batch, Store, StoreError, Writer};
