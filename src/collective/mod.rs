//! Collectives behind one trait: the TCP `ring` backend (CPU ranks, tests) today, `nccl` later.
//!
//! Every collective goes through the flight recorder (`recorder`), which gives it a sequence
//! number and a record that is streamed to the agent, so a hang can be placed exactly.
pub mod recorder;
pub mod rendezvous;
pub mod ring;
pub mod solo;

use crate::ids::Rank;

#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    #[error("rendezvous at {addr}: {reason}")]
    Rendezvous { addr: String, reason: String },
    #[error("peer rank {peer} ({addr}): {source}")]
    Peer { peer: u32, addr: String, source: std::io::Error },
    #[error("collective #{seq} {op}: {reason}")]
    Protocol { seq: u64, op: &'static str, reason: String },
}

/// A process group of `world_size` ranks that can average buffers.
pub trait Collective: Send {
    fn rank(&self) -> Rank;
    fn world_size(&self) -> u32;
    /// Sums `buf` element-wise across all ranks, in place; every rank ends with the same values.
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError>;
    /// Blocks until every rank has entered.
    fn barrier(&mut self) -> Result<(), CollectiveError>;
    /// Test-only fault injection (`fault.kind = "hang-in-collective"`): the next collective
    /// stops mid-way. Backends without a data path of their own ignore it.
    fn inject(&mut self, _fault: InjectedFault) {}
}

/// Faults a backend can play inside a collective, for the hang analysis' tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedFault {
    /// Enter the next collective, send the first chunk, then stop sending forever (the thread
    /// parks with its sockets open, as a rank whose GPU kernel never finishes would).
    StallAfterFirstChunk,
}
