//! Flightdeck: a terminal cockpit for distributed training runs, with an embedded local runtime.
//!
//! One binary plays every part (see `docs/ARCHITECTURE.md`, which has a row for every file).
//! The module map, with imports pointing down the list:
//!
//! - `cli` (the command line) and `ui` (the cockpit): clients of the server, through `client`.
//! - `server`: one per database; launches runs over a placement (`server/placement.rs`: local
//!   SSH or Slurm), folds their frames into the history, serves clients.
//! - `ssh` (hosts, trust, deploy, the all-or-nothing launch), `slurm` (the allocation, the
//!   agent steps, and the agent's start on a compute node) and `agent` (one per node: ranks,
//!   telemetry, the outbox); `worker` (the tch ranks) over `collective` (ring, NCCL, recorder).
//! - `analysis` (hang and straggler verdicts) and `fold` (frames into state and events, the one
//!   fold the server and the cockpit share): pure.
//! - `protocol` (the wire: frames, messages, the agent spec) and `store` (the sled history).
//! - Leaves: `adapters` (framework log lines into metric records, pure), `record` (the records
//!   wire and store share), `recipe`, `ids`, `paths`, `sync`, `mfu`, `detach`, `tensorboard`
//!   (event files read in Rust), `torchfr` (PyTorch's flight-recorder dumps, parsed), `tools`
//!   (where this node's py-spy, eu-stack, NVML and NCCL are, from a plain shell too).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod adapters;
pub mod agent;
pub mod analysis;
pub mod cli;
pub mod client;
pub mod collective;
pub mod detach;
pub mod export;
pub mod fold;
pub mod goodput;
pub mod history;
pub mod ids;
pub mod mfu;
pub mod paths;
pub mod private_files;
pub mod protocol;
pub mod recipe;
pub mod record;
pub mod report;
pub mod server;
pub mod slurm;
pub mod ssh;
pub mod store;
pub mod sync;
pub mod tensorboard;
pub mod tools;
pub mod torchfr;
pub mod ui;
pub mod units;
#[cfg(feature = "torch")]
pub mod worker;
