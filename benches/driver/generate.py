"""GRPO generation: `fdbench generate` (src/worker/grpo.rs::sample_group, the worker's KV-cached
sampling) against benches/reference/generate_hf.py (`transformers` `GPT2LMHeadModel.generate`
with its KV cache) on the grpo-arith recipe's model, one CPU thread each, at the shape GRPO
trains with and at a longer generation."""

import json
import os
import subprocess
import tempfile
import time

from common import REFERENCE, alternate, clean_env, cmd, med, rel, repetitions, reps, run_json, spread, table

RECIPE = "recipes/grpo-arith.toml"
THREADS = 1
# Timed passes inside each process (after its warm-up); a process's figure is their median.
INNER = 5
# (what, prompts per pass, prompt tokens, new tokens). grpo-arith: a rank's step (batch_per_rank
# 16 prompts), prompts of 12 tokens (the median arith-qa prompt; 4 to 28), max_new_tokens 4.
SHAPES = (
    ("grpo-arith step: 16 prompts × 8 rows, prompt 12, 4 new tokens", 16, 12, 4),
    ("longer: 4 prompts × 8 rows, prompt 16, 48 new tokens", 4, 16, 48),
)


def argv_for(side, tools, recipe_path, prompts, prompt_len, new_tokens):
    nums = [THREADS, INNER, prompts, prompt_len, new_tokens]
    if side == "fd":
        return [tools.fdbench, "generate", recipe_path] + [str(n) for n in nums]
    flags = ("--threads", "--reps", "--prompts", "--prompt-len", "--new-tokens")
    return [tools.python, os.path.join(REFERENCE, "generate_hf.py"), "--recipe", recipe_path] + [
        str(x) for pair in zip(flags, nums) for x in pair
    ]


def one_run(side, tools, recipe_path, shape):
    _, prompts, prompt_len, new_tokens = shape
    argv = argv_for(side, tools, recipe_path, prompts, prompt_len, new_tokens)
    lines, _ = run_json(argv, clean_env({"HF_HUB_OFFLINE": 1}), 600, f"generate {side}")
    if len(lines) != INNER:
        raise RuntimeError(f"generate {side}: {len(lines)} repetition lines, expected {INNER}")
    return med([r["tokens_per_s"] for r in lines])


def split(tools, recipe_path, shape):
    """Flightdeck's time per position, by part (`fdbench generate-split`)."""
    _, prompts, prompt_len, new_tokens = shape
    argv = [tools.fdbench, "generate-split", recipe_path] + [str(n) for n in (THREADS, INNER, prompts, prompt_len, new_tokens)]
    lines, _ = run_json(argv, clean_env({}), 600, "generate-split")
    s = lines[-1]
    return (
        f"{s['total_us']:.0f} µs per position of {s['rows']} rows: prefill {s['prefill_us']:.0f}, "
        f"forward_cached {s['forward_us']:.0f}, logits to host {s['to_host_us']:.1f}, pick {s['pick_us']:.1f}; "
        f"the prompt's forward on one row alone {s['prefill_one_row_us']:.0f}"
    )


def run(tools, deadline, out=print):
    n = reps("BENCH_REPS", 5)
    rows, repro, splits = [], [], []
    with tempfile.TemporaryDirectory(prefix="fd-bench-generate-") as tmp:
        recipe_path = os.path.join(tmp, "grpo-arith.json")
        with open(recipe_path, "w") as f:
            f.write(subprocess.run([tools.fdbench, "recipe", RECIPE], capture_output=True, text=True, check=True).stdout)
        group = json.load(open(recipe_path))["grpo"]["group_size"]
        for i, shape in enumerate(SHAPES):
            what, prompts, prompt_len, new_tokens = shape
            shape_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(SHAPES) - i)
            got = {"fd": [], "ref": []}
            for rep in repetitions(n, shape_deadline):
                for side in alternate(rep):
                    got[side].append(one_run(side, tools, recipe_path, shape))
                    out(f"  generate {what} rep {rep + 1} {side}: {got[side][-1]:,.0f} tokens/s")
            ratio = med(got["fd"]) / med(got["ref"])
            rows.append(
                [
                    what,
                    spread(got["fd"], "{:,.0f}"),
                    spread(got["ref"], "{:,.0f}"),
                    f"**{ratio:.2f}**",
                    "met" if ratio >= 2.0 else "**missed**",
                    len(got["fd"]),
                ]
            )
            splits.append(f"- {what}: {split(tools, recipe_path, shape)}")
            out(f"  {splits[-1]}")
            nums = [THREADS, INNER, prompts, prompt_len, new_tokens]
            repro.append(
                f"- {what}: `{cmd(['fdbench', 'generate', 'r.json'] + nums)}` against "
                f"`{cmd(['$FD_VENV/bin/python', rel(os.path.join(REFERENCE, 'generate_hf.py')), '--recipe', 'r.json', '--threads', THREADS, '--reps', INNER, '--prompts', prompts, '--prompt-len', prompt_len, '--new-tokens', new_tokens])}`"
            )
    header = ["shape (one thread each)", "Flightdeck tokens/s", "transformers tokens/s", "speed-up", "target ≥ 2.0", "reps"]
    body = (
        table(header, rows)
        + f"\n\nA repetition is one process per side: a warm-up of 2 groups, then {INNER} timed passes "
        f"(the median is the repetition's figure); tokens/s = prompts × {group} rows × new tokens ÷ "
        "wall time, the prompt's forward included. Where Flightdeck's time goes (`fdbench "
        "generate-split`, the same loop with a clock around each part, µs per generated position "
        "of the whole group; the last figure is what prefill would cost if the group's rows shared one "
        "forward of their common prompt):\n" + "\n".join(splits)
    )
    repro.insert(0, f"- `fdbench recipe {RECIPE} > r.json`; then per shape:")
    return body, repro, n
