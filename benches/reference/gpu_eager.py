"""PyTorch eager reference for scripts/gpu-check.sh: the worker's GPT, trained the way a careful
PyTorch user would without torch.compile, on the same GPU.

Same model as src/worker/model.rs (pre-LayerNorm, fused qkv with bias, exact GELU, tied
embeddings, scaled_dot_product_attention with the causal flag), same batch and context, bf16
autocast on CUDA, AdamW(fused=True) on CUDA (foreach on CPU), global-norm clipping at 1.0, and
the loss read back every step (as the worker does). Prints one JSON line:
{"tokens_per_s", "step_ms", "steps", "params", "device", "torch"}.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, n_head, n_layer):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        resid = 0.02 / math.sqrt(2 * n_layer)
        for lin, std in ((self.c_attn, 0.02), (self.c_proj, resid), (self.c_fc, 0.02), (self.mlp_proj, resid)):
            nn.init.normal_(lin.weight, 0.0, std)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        heads = lambda z: z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, d, context, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.h = nn.ModuleList(Block(d, n_head, n_layer) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:t]
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    a = p.parse_args()

    torch.manual_seed(1337)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
    model = GPT(a.n_layer, a.n_head, a.d_model, a.context, a.vocab).to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "wpe" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "wpe" in n]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    fast = {"fused": True} if cuda else {"foreach": True}
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **fast)
    params = sum(p.numel() for p in model.parameters())

    gen = torch.Generator(device="cpu").manual_seed(0)
    step_ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        seq = torch.randint(0, 50257 if a.vocab >= 50257 else a.vocab, (a.batch, a.context + 1), generator=gen)
        seq = seq.to(dev)
        x, y = seq[:, :-1], seq[:, 1:].contiguous()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(x, y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        loss.item()  # the worker reads the loss back every step: the same synchronisation
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t0) * 1e3)

    # The worker's rule: skip the first fifth (at least one step) as warm-up, take the median.
    skip = max(len(step_ms) // 5, 1 if len(step_ms) > 1 else 0)
    ms = statistics.median(sorted(step_ms[skip:]))
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    print(json.dumps({
        "tokens_per_s": a.batch * a.context / (ms / 1e3),
        "step_ms": ms,
        "steps": a.steps,
        "params": params,
        "device": name,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
