"""The generation reference: Hugging Face `transformers` `GPT2LMHeadModel.generate` (sampling,
its KV cache) on the GPT-2 configuration of the recipe's model, randomly initialised (nothing is
downloaded), against `fdbench generate` (src/worker/grpo.rs::sample_group).

The same work as the worker's GPT (src/worker/model.rs): pre-LayerNorm blocks with biases,
learned position embeddings, fused qkv, exact GELU in a 4x MLP, LayerNorm eps 1e-5, tied
embeddings, fp32; attention through `scaled_dot_product_attention` (attn_implementation="sdpa").
Each prompt is one `generate` call of `num_return_sequences` = the recipe's group_size rows,
exactly NEW_TOKENS new tokens each (no eos, so no early stop), as the worker samples a group.
The prompts are the same random tokens as fdbench's (splitmix64 of the seed, prompt and
position). Prints one JSON line per repetition: tokens generated, seconds, tokens/s.
"""

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.utils import logging  # noqa: E402

MASK = (1 << 64) - 1
PROMPT_SEED = 0x9E3779B97F4A7C15


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def prompt(p, length, vocab):
    """benches/fdbench/generate.rs's `prompt`: token i of prompt p."""
    return [splitmix64(PROMPT_SEED ^ ((p << 32) & MASK) ^ i) % vocab for i in range(length)]


def model_for(m, seed):
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=m["vocab"],
        n_positions=m["context"],
        n_embd=m["d_model"],
        n_layer=m["n_layer"],
        n_head=m["n_head"],
        n_inner=4 * m["d_model"],
        activation_function="gelu",  # exact GELU, as model.rs (GPT-2's own is the tanh form)
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = GPT2LMHeadModel(cfg).eval()
    if model.config._attn_implementation != "sdpa":
        raise SystemExit(f"generate_hf: attention is {model.config._attn_implementation!r}, expected 'sdpa'")
    return model


def generate(model, prompts, group, new_tokens):
    for p in prompts:
        ids = torch.tensor([p], dtype=torch.long)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            num_return_sequences=group,
            use_cache=True,
            pad_token_id=0,
            eos_token_id=None,
        )
        if out.shape != (group, len(p) + new_tokens):
            raise SystemExit(f"generate_hf: got {tuple(out.shape)}, expected ({group}, {len(p) + new_tokens})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", required=True, help="the recipe as JSON (fdbench recipe FILE)")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, required=True)
    ap.add_argument("--prompts", type=int, required=True, help="groups per repetition")
    ap.add_argument("--prompt-len", type=int, required=True)
    ap.add_argument("--new-tokens", type=int, required=True)
    a = ap.parse_args()
    logging.set_verbosity_error()
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    recipe = json.load(open(a.recipe))
    m, group = recipe["model"], recipe["grpo"]["group_size"]
    if a.prompt_len + a.new_tokens > m["context"]:
        raise SystemExit(f"generate_hf: prompt {a.prompt_len} + {a.new_tokens} new tokens exceed the context {m['context']}")
    model = model_for(m, recipe["train"]["seed"])
    with torch.inference_mode():
        # Warm-up: thread pool, allocator, the first generate's setup.
        generate(model, [prompt(p, a.prompt_len, m["vocab"]) for p in range(2)], group, a.new_tokens)
        for rep in range(a.reps):
            prompts = [prompt(rep * a.prompts + p, a.prompt_len, m["vocab"]) for p in range(a.prompts)]
            t0 = time.perf_counter()
            generate(model, prompts, group, a.new_tokens)
            s = time.perf_counter() - t0
            tokens = a.prompts * group * a.new_tokens
            print(json.dumps({"rep": rep, "tokens": tokens, "seconds": s, "tokens_per_s": tokens / s}), flush=True)


if __name__ == "__main__":
    main()
