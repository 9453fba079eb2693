//! Flightdeck: a terminal cockpit for distributed training runs, with an embedded local runtime.
//!
//! One binary plays every part (see `docs/ARCHITECTURE.md`): the CLI and its clients, the
//! `server` that owns the sled history, the per-node `agent`, and the tch `worker` ranks.
pub mod agent;
pub mod analysis;
pub mod cli;
pub mod client;
pub mod collective;
pub mod detach;
pub mod fold;
pub mod ids;
pub mod mfu;
pub mod paths;
pub mod protocol;
pub mod recipe;
pub mod record;
pub mod server;
pub mod ssh;
pub mod store;
pub mod sync;
pub mod ui;
#[cfg(feature = "torch")]
pub mod worker;
