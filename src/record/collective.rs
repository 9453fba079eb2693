//! The flight recorder's record of one collective, as the wire carries it and the store keeps it.
use crate::ids::Step;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveOp {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Barrier,
}

impl CollectiveOp {
    pub fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllReduce => "all_reduce",
            CollectiveOp::ReduceScatter => "reduce_scatter",
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::Broadcast => "broadcast",
            CollectiveOp::Barrier => "barrier",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectiveState {
    Scheduled,
    Started,
    Completed,
}

/// The flight recorder's record of one collective on one rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveRecord {
    /// Per-rank sequence number, from 1; equal across ranks for the same collective.
    pub seq: u64,
    pub op: CollectiveOp,
    pub dtype: String,
    pub elements: u64,
    pub bytes: u64,
    pub enqueue_us: u64,
    pub start_us: Option<u64>,
    pub end_us: Option<u64>,
    pub state: CollectiveState,
    /// The training step the collective belongs to (0 outside training).
    pub step: Step,
}
