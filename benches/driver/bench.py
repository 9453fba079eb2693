"""`make bench*`: runs benchmarks side by side with their references, prints each table, and
rewrites each one's section of docs/benchmarks.md (between `<!-- bench:NAME:begin/end -->`).

usage: bench.py [train|allreduce|overhead|history|fanout|parselog|torch|handshake|generate|slurm|all]...   (scripts/bench.sh sets the tools)
       bench.py charts   only redraw the charts from the doc's tables (make bench-charts)
After each section is written, `fdbench charts` redraws docs/benchmarks/*.svg|png from the doc's
tables and the `bench:charts` section that embeds them is refreshed.
Time: BENCH_BUDGET_S (default 1080 s for all of them) is shared out by weight; each benchmark
runs the repetitions it wants (BENCH_REPS, BENCH_HISTORY_REPS) while they fit in its share,
and never fewer than 3 per side (common.MIN_REPS). The doc's reps column says how many ran.
"""

import os
import subprocess
import sys
import time

import allreduce
import fanout
import generate
import handshake
import history
import overhead
import parselog
import slurm_scale
import torchjob
import train
from common import DOC, ROOT, Tools, loadavg, rel, stamp, write_section

# name: (title, module, extra versions to report, share of the time budget); the shares of
# `all` add up to 1, so `make bench` plans for DEFAULT_BUDGET_S (18 minutes) in all.
BENCHES = {
    "train": ("Training throughput", train, (), 0.10),
    "allreduce": ("All-reduce", allreduce, (), 0.12),
    "overhead": ("Telemetry overhead", overhead, (), 0.15),
    "history": ("History: write and load", history, ("tensorboard",), 0.25),
    "fanout": ("SSH fan-out", fanout, (), 0.08),
    "parselog": ("Log adapters: parse-log and the live path", parselog, (), 0.04),
    "torch": ("Real PyTorch jobs: the shim's cost and hang detection", torchjob, (), 0.17),
    "handshake": ("The run secret's handshake: ring forming and store latency", handshake, (), 0.01),
    "generate": ("GRPO generation against transformers' generate", generate, ("transformers",), 0.08),
    "slurm": ("1,024 ranks through Slurm", slurm_scale, (), 1.0),
}
# Not in `all`: as root only, and about 15 minutes of its own (make bench-slurm).
NOT_IN_ALL = {"slurm"}
# `make bench` (all) makes the history benchmark's repetitions a quarter as long (64 ranks ×
# 2,500 steps = 0.64 M points) so that its 3 repetitions per side fit the 20 minutes with the
# rest: TensorBoard alone spends about 270 s per repetition on the full 2.56 M points. The
# ratios hold at either size (docs/benchmarks.md); `make bench-history` runs the full size.
ALL_DEFAULTS = {"BENCH_HISTORY_STEPS": "2500"}
DEFAULT_BUDGET_S = 1080
CHART_DIR = os.path.join(ROOT, "docs", "benchmarks")
# The charts section: each PNG links to its SVG; paths are relative to docs/benchmarks.md.
CHARTS = """\
[![Speed-up of every benchmark against its reference, on a log axis around 1.0](benchmarks/ratios.png)](benchmarks/ratios.svg)

[![All-reduce bus bandwidth against message size: ring and gloo, 2 and 4 processes, with one core's memcpy of the same size](benchmarks/allreduce_busbw.png)](benchmarks/allreduce_busbw.svg)

Drawn by `fdbench charts` from the tables below whenever `make bench*` rewrites one (`make
bench-charts` redraws them alone); click a chart for its SVG. Each table's stamp says when and
under what load it was measured: the bars of different benchmarks come from different runs."""


def budget_s(names):
    raw = os.environ.get("BENCH_BUDGET_S", "")
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            sys.exit(f"bench: BENCH_BUDGET_S = {raw!r}: expected whole seconds ≥ 1")
        return int(raw)
    return DEFAULT_BUDGET_S * sum(BENCHES[n][3] for n in names)


def draw_charts(tools):
    """Redraws the charts from the doc's tables and refreshes the section that embeds them. A
    failure (no font, a table the parser rejects) is a warning: the tables are already written."""
    argv = [tools.fdbench, "charts", DOC, CHART_DIR]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        why = (p.stderr.strip() or f"exit code {p.returncode}") if p.returncode != 0 else ""
    except (OSError, subprocess.SubprocessError) as e:
        why = str(e)
    if why:
        print(f"bench: warning: charts not redrawn ({why}); the tables are written", file=sys.stderr, flush=True)
        return
    write_section("charts", CHARTS, before="## ")
    print(f"charts redrawn in {rel(CHART_DIR)}/ from docs/benchmarks.md's tables", flush=True)


def main(argv):
    if argv == ["charts"]:
        draw_charts(Tools.from_env())
        return
    names = [n for a in argv for n in ([b for b in BENCHES if b not in NOT_IN_ALL] if a == "all" else [a])]
    unknown = [n for n in names if n not in BENCHES]
    if not names or unknown:
        sys.exit(f"bench: unknown benchmark {unknown or argv}; valid: {', '.join(BENCHES)}, all")
    if "all" in argv:
        for k, v in ALL_DEFAULTS.items():
            os.environ.setdefault(k, v)
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
        draw_charts(tools)
    print(f"bench: done in {time.monotonic() - t_all:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
