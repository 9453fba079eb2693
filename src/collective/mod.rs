//! Collectives behind one trait: the TCP `ring` backend (CPU ranks, tests) and `nccl` (GPUs).
//!
//! Every collective goes through the flight recorder (`recorder`), which gives it a sequence
//! number and a record that is streamed to the agent, so a hang can be placed exactly.
pub mod auth;
pub mod nccl;
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
    #[error("{op} is not supported by the {backend} backend")]
    Unsupported { op: &'static str, backend: &'static str },
    #[error(transparent)]
    Nccl(#[from] nccl::NcclError),
}

/// A buffer in GPU memory: a raw CUDA device address and its length (the worker takes them
/// from a tch tensor; the collective layer stays free of tch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBuf {
    pub ptr: u64,
    pub elements: usize,
    pub dtype: DeviceDtype,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceDtype {
    F32,
    Bf16,
}

impl DeviceDtype {
    pub fn name(self) -> &'static str {
        match self {
            DeviceDtype::F32 => "f32",
            DeviceDtype::Bf16 => "bf16",
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DeviceDtype::F32 => 4,
            DeviceDtype::Bf16 => 2,
        }
    }
}

/// A process group of `world_size` ranks that can average buffers.
pub trait Collective: Send {
    fn rank(&self) -> Rank;
    fn world_size(&self) -> u32;
    /// Sums `buf` element-wise across all ranks, in place; every rank ends with the same values.
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError>;
    /// Blocks until every rank has entered.
    fn barrier(&mut self) -> Result<(), CollectiveError>;
    /// Sums a GPU buffer element-wise across all ranks, in place, and returns when it is done.
    /// Only GPU backends can.
    fn all_reduce_sum_device(&mut self, _buf: DeviceBuf) -> Result<(), CollectiveError> {
        Err(CollectiveError::Unsupported { op: "all_reduce of GPU memory", backend: "ring" })
    }
    /// When the last completed collective really ran on the device (unix µs, start and end), for
    /// backends that queue work on a GPU stream; None = the host's own timing is the truth.
    fn last_device_span_us(&self) -> Option<(u64, u64)> {
        None
    }
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
