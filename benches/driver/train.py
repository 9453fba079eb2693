"""Training throughput: `flightdeck worker` against benches/reference/train_gpt.py (PyTorch
eager; DDP over gloo for 2 processes), the default recipe's model at 1 and 2 processes."""

import json
import os
import re
import subprocess
import tempfile
import time

from common import REFERENCE, Proc, alternate, clean_env, cmd, free_port, med, rel, repetitions, reps, spread, table

STEPS = 40
# Steps 1..FIRST are warm-up (allocator, first-touch, thread pools); the clock runs from the
# line of step FIRST to the line of the last step.
FIRST = 10
TARGET = 1.1
LINE = re.compile(r"rank 0 step (\d+)/(\d+) loss ([0-9.naif-]+) step ([0-9.]+) ms")
RECIPE = "recipes/tiny-gpt.toml"


def sets(world):
    return [f"parallel.data={world}", f"cluster.ranks_per_node={world}", f"train.steps={STEPS}"]


def recipe_json(tools, world, tmp):
    path = os.path.join(tmp, f"recipe-world{world}.json")
    argv = [tools.fdbench, "recipe", RECIPE] + [a for s in sets(world) for a in ("--set", s)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    with open(path, "w") as f:
        f.write(out)
    return path, json.loads(out)


def rank_env(rank, world, port):
    env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": world}
    if world > 1:
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
    return env


def argv_for(side, tools, recipe_path, threads):
    if side == "fd":
        return [tools.flightdeck, "worker"]
    return [tools.python, os.path.join(REFERENCE, "train_gpt.py"), "--recipe", recipe_path, "--threads", str(threads)]


def start_store(tools):
    """The agent hosts the rendezvous store in real runs; here a bare store host does."""
    store = Proc.start([tools.fdbench, "store-host"], clean_env({}), stdin=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not store.lines and store.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if not store.lines:
        raise RuntimeError(f"fdbench store-host printed no port: {store.stderr()}")
    return store, json.loads(store.lines[0][1])["port"]


def one_run(side, tools, recipe_path, world, threads):
    """Launches `world` ranks of one side; returns rank 0's ms/step over steps FIRST..STEPS."""
    store, port = (start_store(tools) if side == "fd" and world > 1 else (None, free_port()))
    extra = {"FLIGHTDECK_RECIPE": recipe_path} if side == "fd" else {}
    procs = [
        Proc.start(argv_for(side, tools, recipe_path, threads), clean_env({**rank_env(r, world, port), **extra}))
        for r in range(world)
    ]
    try:
        for r, p in enumerate(procs):
            p.wait(600, f"train {side} world {world} rank {r}")
    finally:
        if store:
            store.popen.stdin.close()
            store.wait(30, "fdbench store-host")
    stamped = [(t, LINE.match(line)) for t, line in procs[0].lines]
    stamped = [(t, int(m.group(1)), float(m.group(3)), float(m.group(4))) for t, m in stamped if m]
    at = {s: t for t, s, _, _ in stamped}
    if FIRST not in at or STEPS not in at:
        raise RuntimeError(f"train {side} world {world}: no progress lines for steps {FIRST} and {STEPS}")
    ms = (at[STEPS] - at[FIRST]) / (STEPS - FIRST) * 1e3
    return {"ms": ms, "loss": stamped[-1][2]}


def check_arith_port(tools):
    """The reference's data must be the worker's: the Python port against the worker's code."""
    args = ["0", "0", "64", "65"]
    rust = subprocess.run([tools.fdbench, "arith"] + args, capture_output=True, text=True, check=True).stdout
    code = "import sys, json, arith; [print(json.dumps(arith.sequence(0, i, 65))) for i in range(64)]"
    py = subprocess.run([tools.python, "-c", code], capture_output=True, text=True, check=True, cwd=REFERENCE).stdout
    norm = lambda text: [json.loads(line) for line in text.splitlines()]  # noqa: E731
    if norm(rust) != norm(py):
        raise RuntimeError("benches/reference/arith.py no longer matches src/worker/arith.rs")


def run(tools, deadline, out=print):
    check_arith_port(tools)
    out("  synthetic:arith port: the first 64 sequences match the worker's token for token")
    n = reps("BENCH_REPS", 5)
    cores = len(os.sched_getaffinity(0))
    rows, repro = [], []
    with tempfile.TemporaryDirectory(prefix="fd-bench-train-") as tmp:
        for i, world in enumerate((1, 2)):
            # Each world size gets an equal part of the time left.
            world_deadline = time.monotonic() + (deadline - time.monotonic()) / (2 - i)
            recipe_path, recipe = recipe_json(tools, world, tmp)
            threads = max(cores // world, 1)  # the worker's rule: the node's cores shared by its ranks
            tokens = recipe["train"]["batch_per_rank"] * world * recipe["model"]["context"]
            got = {"fd": [], "ref": []}
            for rep in repetitions(n, world_deadline):
                for side in alternate(rep):
                    r = one_run(side, tools, recipe_path, world, threads)
                    got[side].append(r)
                    out(f"  train world {world} rep {rep + 1} {side}: {r['ms']:.1f} ms/step, loss {r['loss']:.4f}")
            fd_ms, ref_ms = [r["ms"] for r in got["fd"]], [r["ms"] for r in got["ref"]]
            ratio = med(ref_ms) / med(fd_ms)
            rows.append(
                [
                    f"{world} process{'es' if world > 1 else ''} × {threads} thread{'s' if threads > 1 else ''}",
                    spread(fd_ms),
                    spread(ref_ms),
                    f"{tokens / med(fd_ms) * 1e3:,.0f}",
                    f"{tokens / med(ref_ms) * 1e3:,.0f}",
                    f"**{ratio:.2f}**",
                    "met" if ratio >= TARGET else "**missed**",
                    f"{med([r['loss'] for r in got['fd']]):.4f} / {med([r['loss'] for r in got['ref']]):.4f}",
                    len(fd_ms),
                ]
            )
            rj = f"fdbench recipe {RECIPE} " + " ".join(f"--set {s}" for s in sets(world)) + " > r.json"
            store = "`fdbench store-host` (prints the port) and " if world > 1 else ""
            env0 = {k: v for k, v in rank_env(0, world, "PORT").items()}
            repro.append(
                f"- {world} process{'es' if world > 1 else ''}: `{rj}`; then {store}per rank "
                f"`{cmd(['target/release/flightdeck', 'worker'], {**env0, 'FLIGHTDECK_RECIPE': 'r.json'})}` "
                f"against `{cmd(['$FD_VENV/bin/python', rel(os.path.join(REFERENCE, 'train_gpt.py')), '--recipe', 'r.json', '--threads', threads], env0)}`"
                + (f" (RANK and LOCAL_RANK 0..{world - 1})" if world > 1 else "")
            )
    header = [
        "processes × threads each",
        "Flightdeck ms/step",
        "PyTorch ms/step",
        "Flightdeck tokens/s",
        "PyTorch tokens/s",
        "speed-up",
        f"target ≥ {TARGET}",
        f"loss at step {STEPS} (FD / PyTorch)",
        "reps",
    ]
    return table(header, rows), repro, n
