"""FSDP2 x tensor parallel as users write it: a tiny transformer-style model on a 2-D DeviceMesh
(`init_device_mesh` with dims `dp` and `tp`), DTensor's `parallelize_module` with a colwise /
rowwise plan on `tp`, FSDP2's `fully_shard` on `dp`, gloo on CPU. PyTorch only; nothing of
Flightdeck is imported. recipes/fsdp-tp.toml runs it on 4 local ranks (2 x 2).

    python fsdp_tp.py [--steps N] [--tp T] [--fault sleep-in-tp --fault-rank R --fault-step S]
    python fsdp_tp.py --reference [--steps N]

Every rank prints an HF-style dict a step whose `loss` is the whole global batch's (averaged
over `dp`), so every rank's line equals the one process that `--reference` runs over the same
batch with the same weights: the tests compare them (to 1e-5).

FSDP2 averages gradients with ReduceOp.AVG, which gloo's reduce-scatter summed in some PyTorch
versions (PyTorch issue 162338): the script asks FSDP2 for a sum and a division of its own
(`set_force_sum_reduction_for_comms`, where the method exists), and the reference comparison
checks the result.

`--fault sleep-in-tp`: at step S, rank R sleeps for an hour inside its first block, after FSDP's
all-gather of that block and before the block's tensor-parallel all-reduce, so its `mesh_tp`
peer waits in that all-reduce for a rank that never enters it.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, HIDDEN, SEQ, BATCH = 64, 32, 128, 16, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Tiny(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batch(step):
    """The global batch of a step: the same on every rank and in the reference."""
    g = torch.Generator().manual_seed(1000 + step)
    # A learnable sequence: each token is the previous plus a per-sequence stride.
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    stride = torch.randint(1, 4, (BATCH, 1), generator=g)
    return (start + stride * torch.arange(SEQ + 1)) % VOCAB


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def log(step, loss, lr, steps, elapsed_s):
    # HF Trainer's ProgressCallback prints its dicts like this; every rank prints.
    print({"loss": loss, "learning_rate": lr, "epoch": round(step / steps, 2), "step": step,
           "step_time_ms": round(1000 * elapsed_s, 2)}, flush=True)


def reference(args):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(1, args.steps + 1):
        t = time.perf_counter()
        loss = loss_of(model, batch(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        log(step, loss.item(), args.lr, args.steps, time.perf_counter() - t)


def distributed(args):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world = int(os.environ["WORLD_SIZE"])
    if world % args.tp:
        sys.exit(f"fsdp_tp.py: --tp {args.tp} does not divide the world size {world}")
    mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    dp, dp_rank = mesh["dp"], mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    model = Tiny()
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    if hasattr(model, "set_force_sum_reduction_for_comms"):
        model.set_force_sum_reduction_for_comms(True)
    if args.fault == "sleep-in-tp" and rank == args.fault_rank:
        model.blocks[0].down.register_forward_pre_hook(lambda *_: fault(args, state))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    dp_size = dp.size()
    rows = BATCH // dp_size
    state = {"step": 0}
    for step in range(1, args.steps + 1):
        state["step"] = step
        t = time.perf_counter()
        tokens = batch(step)[dp_rank * rows:(dp_rank + 1) * rows]
        loss = loss_of(model, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        # The global batch's loss: the mean of the dp ranks' means (equal shards).
        total = loss.detach().clone()
        dist.all_reduce(total, group=dp.get_group())
        log(step, (total / dp_size).item(), args.lr, args.steps, time.perf_counter() - t)
    dist.destroy_process_group()


def fault(args, state):
    if state["step"] == args.fault_step:
        print(f"injecting fault {args.fault} at step {state['step']} (unix ms {int(time.time() * 1000)})", flush=True)
        time.sleep(3600)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--reference", action="store_true", help="one process, no torch.distributed")
    p.add_argument("--fault", choices=["sleep-in-tp"])
    p.add_argument("--fault-rank", type=int, default=3)
    p.add_argument("--fault-step", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    if BATCH % max(1, int(os.environ.get("WORLD_SIZE", "1")) // args.tp):
        sys.exit(f"fsdp_tp.py: the batch of {BATCH} does not split over the data-parallel ranks")
    if args.reference:
        reference(args)
    else:
        distributed(args)


if __name__ == "__main__":
    main()
