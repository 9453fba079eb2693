//! The rank's process group: `Solo` for one rank, else rendezvous → TCP ring or NCCL → flight
//! recorder.
use super::env::WorkerEnv;
use super::telemetry::TelemetryTx;
use crate::collective::auth::{Gate, RunSecret};
use crate::collective::nccl::Nccl;
use crate::collective::recorder::FlightRecorder;
use crate::collective::rendezvous::StoreClient;
use crate::collective::ring::Ring;
use crate::collective::solo::Solo;
use crate::collective::{Collective, CollectiveError};
use crate::ids::{Rank, Step};
use crate::recipe::{CollectiveBackend, FaultKind, Recipe};

/// The store key a `fault.kind = "hold-join"` rank waits for before it joins the ring.
pub const RELEASE_KEY: &str = "fault/release";
/// Records kept for the hang analysis: a few hundred steps of buckets.
const RECORDER_CAPACITY: usize = 1024;

/// A collective that can be told which training step its next operations belong to, so flight
/// records carry the step.
pub trait StepCollective: Collective {
    fn set_step(&mut self, _step: Step) {}
}

impl StepCollective for Solo {}

impl<C: Collective> StepCollective for FlightRecorder<C> {
    fn set_step(&mut self, step: Step) {
        FlightRecorder::<C>::set_step(self, step)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("rank {rank}: world size {world} needs MASTER_ADDR and MASTER_PORT")]
    NoMaster { rank: u32, world: u32 },
    #[error("rank {rank}: joining the group of {world} ranks: {source}")]
    Collective { rank: u32, world: u32, source: CollectiveError },
    #[error("rank {rank}: {reason}")]
    Secret { rank: u32, reason: String },
}

/// The run's gate: its secret, with refused peers reported as the rank's telemetry.
fn gate(env: &WorkerEnv, tele: &TelemetryTx) -> Result<Gate, GroupError> {
    let Some(path) = &env.secret_file else {
        return Ok(Gate::open());
    };
    let secret = RunSecret::read_file(path).map_err(|reason| GroupError::Secret { rank: env.rank, reason })?;
    let tele = tele.clone();
    Ok(Gate::new(secret, std::sync::Arc::new(move |refusal| tele.refused(refusal))))
}

/// Builds this rank's group. Every collective of a multi-rank group goes through the flight
/// recorder, whose records stream to the agent through `tele`.
pub fn connect(env: &WorkerEnv, recipe: &Recipe, tele: &TelemetryTx) -> Result<Box<dyn StepCollective>, GroupError> {
    if env.world_size == 1 {
        return Ok(Box::new(Solo));
    }
    let (rank, world) = (env.rank, env.world_size);
    let Some((host, port)) = &env.master else {
        return Err(GroupError::NoMaster { rank, world });
    };
    let wrap = |source| GroupError::Collective { rank, world, source };
    let addr = format!("{host}:{port}");
    let gate = gate(env, tele)?;
    let mut store = StoreClient::connect(&addr, &gate, env.rendezvous_timeout).map_err(wrap)?;
    if recipe.parallel.backend == CollectiveBackend::Nccl {
        // The unique id travels through the store; LOCAL_RANK is the GPU (as in `cuda::init`).
        let nccl =
            Nccl::connect(&mut store, Rank(rank), world, env.local_rank, env.rendezvous_timeout).map_err(wrap)?;
        return Ok(Box::new(FlightRecorder::new(nccl, RECORDER_CAPACITY, tele.sink())));
    }
    if recipe.faults.iter().any(|f| f.kind == FaultKind::HoldJoin && f.rank == rank) {
        // Test-only: the others' ring listeners stay open until the test says go.
        store.get(RELEASE_KEY, env.rendezvous_timeout).map_err(wrap)?;
    }
    let advertise = env.advertise_host.clone().unwrap_or_else(|| route_to(host, *port));
    let ring = Ring::connect(&mut store, Rank(rank), world, &advertise, env.rendezvous_timeout, &gate).map_err(wrap)?;
    Ok(Box::new(FlightRecorder::new(ring, RECORDER_CAPACITY, tele.sink())))
}

/// The local address the kernel would use to reach the master: the interface peers on the same
/// network can dial back (127.0.0.1 for a single-machine run). Connecting a UDP socket sends
/// nothing; it only picks the route.
fn route_to(host: &str, port: u16) -> String {
    let probe = || -> std::io::Result<String> {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
        s.connect((host, port))?;
        Ok(s.local_addr()?.ip().to_string())
    };
    probe().unwrap_or_else(|_| "127.0.0.1".to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_master_advertises_loopback() {
        assert_eq!(super::route_to("127.0.0.1", 29500), "127.0.0.1");
    }
}
