"""TRL's GRPO on a tiny model built here (CPU, gloo under torchrun, or one process).

It imports nothing of Flightdeck and downloads nothing: each rank makes a character-level
tokenizer and a two-layer Llama (the same weights from the same seed) in a temporary directory,
the prompts are sums (`3+4=`), and two rule rewards score each completion (`correct`: the sum's
digits then `;`, `short`: the fewer characters the better). TRL's `GRPOTrainer` logs every step:
the reward and each function's, the reward's spread, the KL to the reference, the completion
lengths, the clipped ratios and the entropy; Flightdeck's shim reports each rank's `Trainer.log`
calls (docs/real-jobs.md, "TRL"). Needs `trl` (`make python-deps`).

    torchrun --nproc-per-node 2 assets/examples/trl_grpo.py --steps 8
"""
import argparse
import os
import random
import shutil
import sys
import tempfile

# Nothing leaves the machine: no Hub look-ups, and no telemetry ping from TRL's trainer (read
# when huggingface_hub is imported, so set first).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

CHARS = list("0123456789+=;")
SPECIAL = ["<pad>", "<eos>", "<unk>"]


def tokenizer(path):
    """One token per character, saved to `path` and loaded back as transformers would load it."""
    vocab = {t: i for i, t in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(path)
    return PreTrainedTokenizerFast.from_pretrained(path)


def model(tok, seed, path):
    """A two-layer Llama, saved to `path`: TRL loads the policy and its frozen reference from it."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def sums(n, seed):
    rng = random.Random(seed)
    pairs = [(rng.randrange(10), rng.randrange(10)) for _ in range(n)]
    return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]})


def correct(completions, answer, **kwargs):
    """1 for the sum's digits then `;`, 0.5 for the digits alone, else 0."""
    return [1.0 if c.startswith(a + ";") else 0.5 if c.startswith(a) else 0.0 for c, a in zip(completions, answer)]


def short(completions, **kwargs):
    """The fewer characters the better: 1 for an empty completion, 0 at 8 or more."""
    return [max(0.0, 1.0 - len(c) / 8.0) for c in completions]


def train(a, work):
    """TRL's GRPO on the model and tokenizer made in `work`: the trainer, trained."""
    # Before GRPOConfig, which starts the process group: once it is up, transformers saves a model
    # on rank 0 only, and every rank loads its own copy.
    tok = tokenizer(os.path.join(work, "tokenizer"))
    policy = model(tok, a.seed, os.path.join(work, "model"))
    args = GRPOConfig(
        output_dir=a.out or os.path.join(work, "out"),
        use_cpu=True,
        # gloo under torchrun; one process alone has no process group to make.
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        max_steps=a.steps,
        logging_steps=1,
        per_device_train_batch_size=4,
        num_generations=4,
        # One generation per optimizer step (TRL's default), so every step logs every metric. The
        # update is then on-policy (ratio 1) and TRL's clipped ratios stay 0;
        # `steps_per_generation=2` makes them live, with the reward and completion metrics on
        # every other step only.
        max_completion_length=6,
        temperature=1.0,
        learning_rate=1e-3,
        # A KL penalty to the reference (TRL's default is none), so `kl` is logged.
        beta=0.04,
        use_vllm=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        log_completions=a.log_completions,
        num_completions_to_print=2,
        seed=a.seed,
    )
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[correct, short],
        args=args,
        train_dataset=sums(256, a.seed),
        processing_class=tok,
    )
    trainer.train()
    return trainer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", help="TRL's output directory (default: a temporary one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--history", help="write the Trainer's log_history as JSON here ({rank} is the rank)")
    p.add_argument("--log-completions", action="store_true", help="TRL's table of samples on rank 0 every step")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="trl-grpo-")
    try:
        trainer = train(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.history:
        import json

        with open(a.history.format(rank=os.environ.get("RANK", "0")), "w") as f:
            json.dump(trainer.state.log_history, f)
    # As in hf_trainer.py: the ranks meet, end the process group themselves and leave without
    # running gloo's destructors (a rank whose peer had exited could hang in them).
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
