//! One rank of the all-reduce benchmark: the TCP ring over loopback, as a worker would use it.
//!
//! Mirrors `benches/reference/allreduce_gloo.py` step for step: rank 0 hosts the rendezvous
//! store in its own process (as torch's TCPStore does for gloo), every rank checks one sum,
//! then per size: warm-up, barrier, `iters` back-to-back all-reduces timed on rank 0.
use anyhow::{bail, Context};
use flightdeck::collective::rendezvous::{StoreClient, StoreServer};
use flightdeck::collective::ring::Ring;
use flightdeck::collective::Collective;
use flightdeck::ids::Rank;
use std::time::{Duration, Instant};

const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
const WARMUP_ITERS: u64 = 2;

fn env_u32(var: &str) -> anyhow::Result<u32> {
    let raw = std::env::var(var).with_context(|| format!("environment variable {var} is not set"))?;
    raw.trim().parse().with_context(|| format!("environment variable {var}: {raw:?} is not a whole number"))
}

/// Iterations for one size: about `budget_bytes` moved, within `min_iters..=max_iters`.
pub fn iters_for(size_bytes: u64, iters: (u64, u64), budget_bytes: u64) -> u64 {
    (budget_bytes / size_bytes.max(1)).clamp(iters.0, iters.1.max(iters.0))
}

pub fn main(sizes: &[u64], iters: (u64, u64), budget_bytes: u64) -> anyhow::Result<()> {
    let (rank, world) = (env_u32("RANK")?, env_u32("WORLD_SIZE")?);
    let host = std::env::var("MASTER_ADDR").context("environment variable MASTER_ADDR is not set")?;
    let addr = format!("{host}:{}", env_u32("MASTER_PORT")?);
    let gate = crate::roles::gate_from_env()?;
    if rank == 0 {
        StoreServer::bind(&addr, gate.clone()).with_context(|| format!("rank 0: hosting the store at {addr}"))?.spawn();
    }
    let mut store = StoreClient::connect(&addr, &gate, JOIN_TIMEOUT)?;
    let mut ring = Ring::connect(&mut store, Rank(rank), world, "127.0.0.1", JOIN_TIMEOUT, &gate)?;

    // One checked sum first: a benchmark of a wrong answer is worth nothing.
    let mut probe = vec![(rank + 1) as f32; 1000];
    ring.all_reduce_sum(&mut probe)?;
    let want = (world * (world + 1) / 2) as f32;
    if probe.iter().any(|&x| x != want) {
        bail!("rank {rank}: all-reduce of rank+1 gave {:?}, expected {want}", &probe[..4]);
    }
    for &size in sizes {
        let mut buf = vec![0f32; (size / 4) as usize];
        let iters = iters_for(size, iters, budget_bytes);
        for _ in 0..WARMUP_ITERS {
            ring.all_reduce_sum(&mut buf)?;
        }
        ring.barrier()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            ring.all_reduce_sum(&mut buf)?;
        }
        let seconds = t0.elapsed().as_secs_f64();
        if rank == 0 {
            println!("{{\"bytes\": {size}, \"iters\": {iters}, \"seconds\": {seconds}, \"world\": {world}}}");
        }
    }
    ring.barrier()?;
    Ok(())
}

/// One core copying a buffer of each size into another, as often as an all-reduce of that size
/// runs: the bandwidth a loopback all-reduce is bounded by, since every byte is copied at least
/// into a peer's reach and back out. Prints one JSON line per size, as `main` does.
pub fn memcpy(sizes: &[u64], iters: (u64, u64), budget_bytes: u64) {
    for &size in sizes {
        let (src, mut dst) = (vec![1u8; size as usize], vec![0u8; size as usize]);
        let iters = iters_for(size, iters, budget_bytes);
        for _ in 0..WARMUP_ITERS {
            dst.copy_from_slice(std::hint::black_box(&src));
        }
        let t0 = Instant::now();
        for _ in 0..iters {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        let seconds = t0.elapsed().as_secs_f64();
        println!("{{\"bytes\": {size}, \"iters\": {iters}, \"seconds\": {seconds}}}");
    }
}
