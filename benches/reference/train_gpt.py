"""The training reference: the worker's GPT, data, AdamW and loop in idiomatic PyTorch eager.

Same model as src/worker/model.rs (pre-LN GPT, fused qkv, sdpa causal attention, exact-GELU
MLP 4x, tied embeddings, nanoGPT init drawn in the same order from the same seed, so the
initial weights are bit-identical), same data (benches/reference/arith.py, the same global
sequence indices per step and rank), same optimizer settings (torch.optim.AdamW with the
worker's decay/no-decay split, its warmup + schedule, clip_grad_norm_), fp32 on CPU. Data
parallel is DistributedDataParallel over gloo, as a PyTorch user would write it.

Run under the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and, for
WORLD_SIZE > 1, MASTER_ADDR / MASTER_PORT); prints the worker's progress line every 10 steps.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import arith  # noqa: E402

LN_EPS = 1e-5


class Gpt(nn.Module):
    """model.rs's Gpt. Parameters are created in the worker's order, so `torch.manual_seed`
    followed by the same normal_ draws gives the same weights as `tch::manual_seed`."""

    def __init__(self, m, seed):
        super().__init__()
        torch.manual_seed(seed)
        d, v, ctx, layers = m["d_model"], m["vocab"], m["context"], m["n_layer"]
        self.n_head, self.d = m["n_head"], d
        std, resid = 0.02, 0.02 / math.sqrt(2 * layers)

        def normal(*shape, s=std):
            return nn.Parameter(torch.empty(*shape).normal_(0.0, s))

        self.wte = normal(v, d)
        self.wpe = normal(ctx, d)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            b = nn.Module()
            b.ln1_w, b.ln1_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
            b.qkv_w, b.qkv_b = normal(3 * d, d), nn.Parameter(torch.zeros(3 * d))
            b.proj_w, b.proj_b = normal(d, d, s=resid), nn.Parameter(torch.zeros(d))
            b.ln2_w, b.ln2_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
            b.fc_w, b.fc_b = normal(4 * d, d), nn.Parameter(torch.zeros(4 * d))
            b.out_w, b.out_b = normal(d, 4 * d, s=resid), nn.Parameter(torch.zeros(d))
            self.blocks.append(b)
        self.lnf_w, self.lnf_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def decay_groups(self, weight_decay):
        """The worker decays the tied embedding and every weight matrix, not wpe, biases, LN."""
        decay = [self.wte] + [getattr(b, n) for b in self.blocks for n in ("qkv_w", "proj_w", "fc_w", "out_w")]
        ids = {id(p) for p in decay}
        rest = [p for p in self.parameters() if id(p) not in ids]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]

    def forward(self, idx):
        bsz, t = idx.shape
        d, h = self.d, self.n_head
        x = F.embedding(idx, self.wte) + self.wpe[:t]
        for b in self.blocks:
            a = F.layer_norm(x, (d,), b.ln1_w, b.ln1_b, LN_EPS)
            q, k, v = F.linear(a, b.qkv_w, b.qkv_b).split(d, dim=2)
            q, k, v = (z.view(bsz, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(bsz, t, d)
            x = x + F.linear(y, b.proj_w, b.proj_b)
            m = F.layer_norm(x, (d,), b.ln2_w, b.ln2_b, LN_EPS)
            x = x + F.linear(F.gelu(F.linear(m, b.fc_w, b.fc_b)), b.out_w, b.out_b)
        x = F.layer_norm(x, (d,), self.lnf_w, self.lnf_b, LN_EPS)
        return F.linear(x, self.wte)


def lr_at(train, step):
    """optim.rs's lr_at: linear warmup, then cosine / linear / constant down to min_lr."""
    if train["warmup"] > 0 and step <= train["warmup"]:
        return train["lr"] * step / train["warmup"]
    span = max(train["steps"] - train["warmup"], 0)
    if span == 0:
        return train["lr"]
    progress = min(max((step - train["warmup"]) / span, 0.0), 1.0)
    hi, lo = train["lr"], train["min_lr"]
    if train["schedule"] == "constant":
        return hi
    if train["schedule"] == "linear":
        return hi - progress * (hi - lo)
    return lo + 0.5 * (1.0 + math.cos(math.pi * progress)) * (hi - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", required=True, help="the validated recipe as JSON (fdbench recipe)")
    ap.add_argument("--threads", type=int, required=True, help="intra-op threads (the worker's count)")
    args = ap.parse_args()
    with open(args.recipe) as f:
        recipe = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_interop_threads(1)  # as the worker: a model this size gains nothing from it
    torch.set_num_threads(args.threads)
    m, train = recipe["model"], recipe["train"]
    gen = recipe["data"]["source"].get("Synthetic", {}).get("generator")
    if gen != "arith" or train["dtype"] != "fp32":
        sys.exit(f"reference: only synthetic:arith in fp32 is ported (got {recipe['data']['source']}, {train['dtype']})")
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)

    model = Gpt(m, train["seed"])
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(
        model.decay_groups(train["weight_decay"]), lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=1e-8
    )
    ctx, bpr, seed, steps = m["context"], train["batch_per_rank"], recipe["data"]["seed"], train["steps"]
    for s in range(1, steps + 1):
        t0 = time.perf_counter()
        # data.rs's Loader: global batch [(s-1)·B, s·B), this rank's contiguous slice of it.
        first = (s - 1) * bpr * world + rank * bpr
        seqs = [arith.sequence(seed, first + i, ctx + 1) for i in range(bpr)]
        x = torch.tensor([q[:ctx] for q in seqs], dtype=torch.int64)
        y = torch.tensor([q[1:] for q in seqs], dtype=torch.int64)
        t_data = time.perf_counter()
        logits = net(x)
        loss = F.nll_loss(F.log_softmax(logits.view(-1, m["vocab"]), dim=-1), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        loss_value = loss.item()
        lr = lr_at(train, s)
        for g in opt.param_groups:
            g["lr"] = lr
        if train["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        opt.step()
        step_ms = (time.perf_counter() - t0) * 1e3
        if s % 10 == 0 or s == steps:
            print(f"rank {rank} step {s}/{steps} loss {loss_value:.4f} step {step_ms:.1f} ms data {(t_data - t0) * 1e3:.2f} ms", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
