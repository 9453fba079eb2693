"""`make bench*`: runs benchmarks side by side with their references, prints each table, and
rewrites each one's section of docs/benchmarks.md (between `<!-- bench:NAME:begin/end -->`).

usage: bench.py [train|allreduce|overhead|history|fanout|parselog|torch|handshake|generate|all]...   (scripts/bench.sh sets the tools)
Time: BENCH_BUDGET_S (default 1080 s for all four) is shared out by weight; each benchmark
runs the repetitions it wants (BENCH_REPS, BENCH_HISTORY_REPS) while they fit in its share,
and never fewer than its minimum. The doc's reps column says how many ran.
"""

import os
import sys
import time

import allreduce
import fanout
import generate
import handshake
import history
import overhead
import parselog
import torchjob
import train
from common import Tools, loadavg, stamp, write_section

# name: (title, module, extra versions to report, share of the time budget)
BENCHES = {
    "train": ("Training throughput", train, (), 0.15),
    "allreduce": ("All-reduce", allreduce, (), 0.12),
    "overhead": ("Telemetry overhead", overhead, (), 0.20),
    "history": ("History: write and load", history, ("tensorboard",), 0.48),
    "fanout": ("SSH fan-out", fanout, (), 0.05),
    "parselog": ("Log adapters: parse-log and the live path", parselog, (), 0.06),
    "torch": ("Real PyTorch jobs: the shim's cost and hang detection", torchjob, (), 0.12),
    "handshake": ("The run secret's handshake: ring forming and store latency", handshake, (), 0.02),
    "generate": ("GRPO generation against transformers' generate", generate, ("transformers",), 0.05),
}
DEFAULT_BUDGET_S = 1080


def budget_s(names):
    raw = os.environ.get("BENCH_BUDGET_S", "")
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            sys.exit(f"bench: BENCH_BUDGET_S = {raw!r}: expected whole seconds ≥ 1")
        return int(raw)
    return DEFAULT_BUDGET_S * sum(BENCHES[n][3] for n in names)


def main(argv):
    names = [n for a in argv for n in (BENCHES if a == "all" else [a])]
    unknown = [n for n in names if n not in BENCHES]
    if not names or unknown:
        sys.exit(f"bench: unknown benchmark {unknown or argv}; valid: {', '.join(BENCHES)}, all")
    tools = Tools.from_env()
    t_all = time.monotonic()
    end = t_all + budget_s(names)
    for i, name in enumerate(names):
        title, module, extra_versions, weight = BENCHES[name]
        left = sum(BENCHES[n][3] for n in names[i:])
        deadline = time.monotonic() + max(end - time.monotonic(), 0) * weight / left
        print(f"== {title} ({name}): until +{deadline - t_all:.0f} s", flush=True)
        started, t0 = loadavg(), time.monotonic()
        tbl, repro, wanted = module.run(tools, deadline, out=lambda s: print(s, flush=True))
        took = time.monotonic() - t0
        facts = stamp(tools, started, extra_versions)
        body = "\n\n".join(
            [
                f"{facts} A and B alternate (AB, then BA, ...); {wanted} repetitions wanted per side, "
                f"fewer where this benchmark's share of the time budget ran out (reps column); "
                f"median (min–max) over repetitions. This benchmark took {took:.0f} s.",
                tbl,
                f"Reproduce with `make bench-{name}`, or by hand (`fdbench` is "
                "`cargo bench --bench fdbench -- ARGS`):\n" + "\n".join(repro),
            ]
        )
        write_section(name, body)
        print(f"\n{tbl}\n\n({facts})\nwritten to docs/benchmarks.md, section bench:{name}\n", flush=True)
    print(f"bench: done in {time.monotonic() - t_all:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
