"""The all-reduce reference: torch.distributed gloo all_reduce (sum) of float32 CPU tensors.

Mirrors benches/fdbench/allreduce.rs step for step: rank 0 hosts the TCPStore (torch's
env:// rendezvous), every rank checks one sum, then per size: 2 warm-up calls, a barrier,
`iters` back-to-back all-reduces timed on rank 0, one JSON line per size.
Usage (torchrun environment): allreduce_gloo.py SIZES_BYTES MIN_ITERS MAX_ITERS BUDGET_BYTES
"""

import os
import sys
import time

import torch
import torch.distributed as dist

WARMUP_ITERS = 2


def iters_for(size, min_iters, max_iters, budget):
    """allreduce.rs's iters_for: about `budget` bytes moved, within min_iters..=max_iters."""
    return min(max(budget // max(size, 1), min_iters), max(max_iters, min_iters))


def main():
    sizes = [int(s) for s in sys.argv[1].split(",")]
    min_iters, max_iters, budget = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # One intra-op thread per rank, as the ring's single-threaded data path; gloo's reduction
    # runs on its own threads either way.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    probe = torch.full((1000,), float(rank + 1))
    dist.all_reduce(probe)
    want = world * (world + 1) / 2
    if not bool((probe == want).all()):
        sys.exit(f"rank {rank}: all-reduce of rank+1 gave {probe[:4].tolist()}, expected {want}")
    for size in sizes:
        buf = torch.zeros(size // 4, dtype=torch.float32)
        iters = iters_for(size, min_iters, max_iters, budget)
        for _ in range(WARMUP_ITERS):
            dist.all_reduce(buf)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        seconds = time.perf_counter() - t0
        if rank == 0:
            print(f'{{"bytes": {size}, "iters": {iters}, "seconds": {seconds}, "world": {world}}}', flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
