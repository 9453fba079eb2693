"""A tiny job on the Hugging Face Trainer's own loop (CPU, gloo under torchrun, or one process).

It imports nothing of Flightdeck: the Trainer logs every `--log-every` steps, prints its dicts on
rank 0, and writes TensorBoard events; Flightdeck's shim reports each rank's `Trainer.log` calls
(docs/real-jobs.md). Needs `transformers` and `accelerate` (`make python-deps`).

    torchrun --nproc-per-node 2 assets/examples/hf_trainer.py --steps 20
"""
import argparse

import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x, labels=None):
        y = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y}


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = self.x.sum(-1).sin()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--out", default="hf-out")
    p.add_argument("--history", help="write the Trainer's log_history as JSON here ({rank} is the rank)")
    a = p.parse_args()
    args = TrainingArguments(
        output_dir=a.out,
        use_cpu=True,
        max_steps=a.steps,
        logging_steps=a.log_every,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        report_to=["tensorboard"],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        ddp_backend="gloo",
    )
    trainer = Trainer(model=Regression(), args=args, train_dataset=Data(512))
    trainer.train()
    if a.history:
        import json
        import os

        with open(a.history.format(rank=os.environ.get("RANK", "0")), "w") as f:
            json.dump(trainer.state.log_history, f)
    # The Trainer leaves its process group to the interpreter's exit, where gloo's teardown can
    # abort ("terminate called without an active exception"); PyTorch asks programs to end it.
    # Seen here: a rank whose peer had already exited hung for good in ~ProcessGroupGloo
    # (joining a gloo worker thread) when the DDP Reducer was freed at exit. So the ranks meet
    # first, and leave without running the destructors once the group is down.
    import os
    import sys

    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
