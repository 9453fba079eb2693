"""All-reduce: the ring backend (fdbench allreduce) against torch.distributed gloo
(benches/reference/allreduce_gloo.py), 2 and 4 processes on this machine, float32 4 KiB–64 MiB,
with one core's memcpy of the same sizes (fdbench memcpy) measured in the same repetitions as
the bound a loopback all-reduce works against."""

import json
import os

import time

from common import REFERENCE, Proc, alternate, clean_env, cmd, free_port, med, rel, repetitions, reps, spread, table

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
# Per size about BUDGET bytes are all-reduced, within MIN..MAX iterations (same on both sides).
MIN_ITERS, MAX_ITERS, BUDGET = 5, 400, 256 << 20
TARGET = 1.5


def human(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def args():
    return [",".join(map(str, SIZES)), str(MIN_ITERS), str(MAX_ITERS), str(BUDGET)]


def one_run(side, tools, world):
    """All ranks of one side in fresh processes; returns {bytes: seconds per all-reduce}."""
    port = free_port()
    argv = [tools.fdbench, "allreduce"] if side == "fd" else [tools.python, os.path.join(REFERENCE, "allreduce_gloo.py")]
    procs = []
    for r in range(world):
        env = {"RANK": r, "WORLD_SIZE": world, "LOCAL_RANK": r, "LOCAL_WORLD_SIZE": world}
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        procs.append(Proc.start(argv + args(), clean_env(env)))
    for r, p in enumerate(procs):
        p.wait(600, f"allreduce {side} world {world} rank {r}")
    rows = [json.loads(line) for _, line in procs[0].lines if line.startswith("{")]
    if [row["bytes"] for row in rows] != SIZES:
        raise RuntimeError(f"allreduce {side} world {world}: expected one line per size, got {rows}")
    return {row["bytes"]: row["seconds"] / row["iters"] for row in rows}


def memcpy_run(tools):
    """{bytes: seconds per copy} of one core copying each size (fdbench memcpy)."""
    p = Proc.start([tools.fdbench, "memcpy"] + args(), clean_env({}))
    p.wait(600, "memcpy")
    rows = [json.loads(line) for _, line in p.lines if line.startswith("{")]
    if [row["bytes"] for row in rows] != SIZES:
        raise RuntimeError(f"memcpy: expected one line per size, got {rows}")
    return {row["bytes"]: row["seconds"] / row["iters"] for row in rows}


def busbw_gbps(size, seconds, world):
    """nccl-tests' all-reduce bus bandwidth: algbw × 2(n−1)/n, GB/s of 1e9 bytes."""
    return size / seconds / 1e9 * 2 * (world - 1) / world


def run(tools, deadline, out=print):
    n = reps("BENCH_REPS", 5)
    rows, repro = [], []
    for i, world in enumerate((2, 4)):
        # 4 processes take about twice as long as 2: a third of the time left, then the rest.
        world_deadline = time.monotonic() + (deadline - time.monotonic()) / (3 - 2 * i)
        got = {"fd": [], "ref": [], "memcpy": []}
        for rep in repetitions(n, world_deadline):
            got["memcpy"].append(memcpy_run(tools))
            for side in alternate(rep):
                got[side].append(one_run(side, tools, world))
                r = got[side][-1]
                out(f"  allreduce world {world} rep {rep + 1} {side}: 1 MiB {r[1 << 20] * 1e6:.0f} µs, 64 MiB {r[64 << 20] * 1e3:.1f} ms")
        for size in SIZES:
            fd = [r[size] * 1e6 for r in got["fd"]]
            ref = [r[size] * 1e6 for r in got["ref"]]
            copy_gbps = [size / r[size] / 1e9 for r in got["memcpy"]]
            ratio = med(ref) / med(fd)
            target = "met" if ratio >= TARGET else "**missed**"
            rows.append(
                [
                    world,
                    human(size),
                    spread(fd, "{:,.0f}"),
                    spread(ref, "{:,.0f}"),
                    f"{busbw_gbps(size, med(fd) / 1e6, world):.2f}",
                    f"{busbw_gbps(size, med(ref) / 1e6, world):.2f}",
                    f"{med(copy_gbps):.2f}",
                    f"**{ratio:.2f}**",
                    target,
                    len(fd),
                ]
            )
        env = {"RANK": "R", "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "PORT"}
        repro.append(
            f"- {world} processes, every size: per rank R in 0..{world - 1} "
            f"`{cmd(['fdbench', 'allreduce'] + args(), env)}` against "
            f"`{cmd(['$FD_VENV/bin/python', rel(os.path.join(REFERENCE, 'allreduce_gloo.py'))] + args(), env)}`"
        )
    repro.append(f"- memcpy, every size, one core: `{cmd(['fdbench', 'memcpy'] + args())}`")
    header = [
        "processes",
        "size (float32)",
        "ring µs",
        "gloo µs",
        "ring busbw GB/s",
        "gloo busbw GB/s",
        "memcpy GB/s",
        "speed-up",
        f"target ≥ {TARGET}",
        "reps",
    ]
    return table(header, rows), repro, n
