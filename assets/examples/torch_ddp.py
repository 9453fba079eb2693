"""A small DDP job as users write them: PyTorch only, gloo on CPU, the default env://
rendezvous, and HF Trainer's log lines on rank 0... and on every rank here, so the cockpit shows
each rank's loss. Nothing of Flightdeck is imported: Flightdeck reads the printed dicts
(docs/adapters.md). recipes/torch-ddp.toml runs it on 2 local ranks (`make demo-torch`).

    python torch_ddp.py [--steps N] [--log-every K] [--hidden H] [--fault KIND --fault-rank R --fault-step S]

`--fault` is for the tests of verdicts: at step S, rank R sleeps for an hour before its
forward (`sleep`: its peers wait in DDP's all-reduce), or broadcasts a tensor of its own where
its peers all-reduce (`op`: a collective mismatch, which gloo leaves hanging), or raises
(`raise`: the rank fails, and its peers are stopped by whoever launched them), or raises
PyTorch's `DistBackendError` as a failed NCCL communicator does (`backend-error`), or prints
what PyTorch's NCCL watchdog prints when a collective times out and aborts as it does
(`nccl-timeout`: there is no GPU here, so the script prints the lines itself).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--fault", choices=["sleep", "op", "raise", "backend-error", "nccl-timeout"])
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=5)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # A regression anyone can check: y = sin(x · w) for a fixed random w.
    d = 32
    target_w = torch.randn(d, 1, generator=torch.Generator().manual_seed(1))
    model = DDP(nn.Sequential(nn.Linear(d, args.hidden), nn.GELU(), nn.Linear(args.hidden, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    data = torch.Generator().manual_seed(100 + rank)
    t_start = t_log = time.perf_counter()
    losses = []
    for step in range(1, args.steps + 1):
        if args.fault and rank == args.fault_rank and step == args.fault_step:
            inject(args.fault, step, rank)
        x = torch.randn(args.batch, d, generator=data)
        y = torch.sin(x @ target_w)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % args.log_every == 0:
            elapsed = time.perf_counter() - t_log
            # HF Trainer's ProgressCallback prints the log dict like this (4 significant digits).
            logs = {
                "loss": round(sum(losses) / len(losses), 4),
                "grad_norm": round(grad_norm.item(), 4),
                "learning_rate": sched.get_last_lr()[0],
                "epoch": round(step / args.steps, 2),
                "step": step,
                "step_time_ms": round(1000 * elapsed / args.log_every, 2),
            }
            print(logs, flush=True)
            t_log, losses = time.perf_counter(), []
    if rank == 0:
        print({"train_runtime": round(time.perf_counter() - t_start, 2), "train_loss": round(loss.item(), 4)}, flush=True)
    dist.destroy_process_group()


def inject(fault, step, rank):
    print(f"injecting fault {fault} at step {step} (unix ms {int(time.time() * 1000)})", flush=True)
    if fault == "sleep":
        time.sleep(3600)
    elif fault == "raise":
        raise RuntimeError(f"injected failure at step {step}")
    elif fault == "backend-error":
        raise dist.DistBackendError(
            f"[Rank {rank}] NCCL communicator was aborted on rank {rank}. "
            f"Original reason for failure was: injected at step {step}"
        )
    elif fault == "nccl-timeout":
        nccl_watchdog_timeout(step, rank)
    else:
        dist.broadcast(torch.zeros(7), src=0)


def nccl_watchdog_timeout(step, rank):
    """What ProcessGroupNCCL's watchdog prints (PyTorch 2.4-2.11, c10 log format behind torchrun's
    rank prefix) when DDP's all-reduce of this step times out, then the process abort it ends in."""
    seq = 2 * step  # DDP's start-up broadcasts, then one bucket's all-reduce a step
    t = time.strftime("%m%d %H:%M:%S", time.localtime())
    pid = os.getpid()
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
    work = f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=8513, NumelOut=8513, Timeout(ms)=600000)"
    lines = [
        f"[E{t}.862779498 {pid} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation timeout: {work} ran for 600050 milliseconds before timing out.",
        f"[E{t}.863139058 {pid} ProcessGroupNCCL.cpp:2271] {pg} failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, last completed work: {seq - 1}",
        f"[E{t}.863150738 {pid} ProcessGroupNCCL.cpp:670] Stack trace of the failed collective not found, potentially because FlightRecorder is disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.",
        f"[E{t}.863155818 {pid} ProcessGroupNCCL.cpp:684] {pg} To avoid data inconsistency, we are taking the entire process down.",
        f"[E{t}.864368298 {pid} ProcessGroupNCCL.cpp:1899] {pg} Process group watchdog thread terminated with exception: [Rank {rank}] Watchdog caught collective operation timeout: {work} ran for 600050 milliseconds before timing out.",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  {pg} Process group watchdog thread terminated with exception: [Rank {rank}] Watchdog caught collective operation timeout: {work} ran for 600050 milliseconds before timing out.",
    ]
    for line in lines:
        sys.stderr.write(f"[rank{rank}]:{line}\n")
    sys.stderr.flush()
    os.abort()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
