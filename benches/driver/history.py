"""History: 64 ranks × 10,000 steps × 4 metrics into the store through its writer (rollups,
a flush per batch) against TensorBoard event files from TensorBoard's own writer; then reopen
each and read one metric's whole series for every rank (and, for Flightdeck, draw the full-run
chart from rollups). Each phase runs in its own process, so peak RSS is that phase's."""

import os
import shutil
import tempfile

from common import REFERENCE, alternate, clean_env, cmd, med, rel, repetitions, reps, run_json, spread, table

RANKS = 64
COLUMNS = 200
BASELINE_TB = (
    "import tensorboard.summary.writer.event_file_writer, "
    "tensorboard.backend.event_processing.event_accumulator"
)


def steps():
    raw = os.environ.get("BENCH_HISTORY_STEPS", "10000")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 10000


def disk_bytes(root):
    """Bytes allocated on disk under root (st_blocks), as `du` counts them."""
    total = 0
    for d, _, files in os.walk(root):
        for f in files:
            total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


def argvs(side, tools, d, n_steps):
    if side == "fd":
        return ([tools.fdbench, "history-write", d, str(RANKS), str(n_steps)], [tools.fdbench, "history-load", d, str(COLUMNS)])
    tb = os.path.join(REFERENCE, "history_tb.py")
    return ([tools.python, tb, "write", d, str(RANKS), str(n_steps)], [tools.python, tb, "load", d])


def one_rep(side, tools, tmp, n_steps):
    d = tempfile.mkdtemp(prefix=f"{side}-", dir=tmp)
    write_argv, load_argv = argvs(side, tools, d, n_steps)
    (w,), wp = run_json(write_argv, clean_env({}), 1800, f"history write ({side})")
    size = disk_bytes(d)
    (l,), lp = run_json(load_argv, clean_env({}), 1800, f"history load ({side})")
    shutil.rmtree(d)
    want_w, want_l = RANKS * n_steps * 4, RANKS * n_steps
    if w["points"] != want_w or l["points"] != want_l:
        raise RuntimeError(f"history {side}: wrote {w['points']} (want {want_w}), read {l['points']} (want {want_l})")
    return {
        "write_s": w["seconds"],
        "load_s": l["series_s"],
        "chart_s": l.get("chart_s"),
        "bytes": size,
        "rss_write": wp.peak_rss_bytes(),
        "rss_load": lp.peak_rss_bytes(),
        "sum": l["sum"],
    }


def run(tools, deadline, out=print):
    n = reps("BENCH_HISTORY_REPS", 3)
    n_steps = steps()
    got = {"fd": [], "ref": []}
    with tempfile.TemporaryDirectory(prefix="fd-bench-history-") as tmp:
        for rep in repetitions(n, deadline):
            for side in alternate(rep):
                r = one_rep(side, tools, tmp, n_steps)
                got[side].append(r)
                out(f"  history rep {rep + 1} {side}: write {r['write_s']:.1f} s, load {r['load_s']:.2f} s, {r['bytes'] / 1e6:.0f} MB")
    fd, tb = got["fd"], got["ref"]
    # The loss values read back agree (TensorBoard keeps float32, the store float64).
    if abs(fd[0]["sum"] - tb[0]["sum"]) > 1e-5 * abs(fd[0]["sum"]):
        raise RuntimeError(f"history: the loss read back differs: {fd[0]['sum']} vs {tb[0]['sum']}")

    def col(rs, key, fmt, scale=1.0):
        return spread([r[key] * scale for r in rs], fmt)

    mb = 1e-6
    rows = [
        [
            "Flightdeck store (sled)",
            col(fd, "write_s", "{:.1f}"),
            col(fd, "load_s", "{:.2f}"),
            col(fd, "chart_s", "{:.3f}"),
            col(fd, "bytes", "{:,.0f}", mb),
            col(fd, "rss_write", "{:,.0f}", mb),
            col(fd, "rss_load", "{:,.0f}", mb),
            len(fd),
        ],
        [
            "TensorBoard event files",
            col(tb, "write_s", "{:.1f}"),
            col(tb, "load_s", "{:.2f}"),
            "— (no rollups: a chart reads every point)",
            col(tb, "bytes", "{:,.0f}", mb),
            col(tb, "rss_write", "{:,.0f}", mb),
            col(tb, "rss_load", "{:,.0f}", mb),
            len(tb),
        ],
    ]
    w_ratio = med([r["write_s"] for r in tb]) / med([r["write_s"] for r in fd])
    l_ratio = med([r["load_s"] for r in tb]) / med([r["load_s"] for r in fd])
    verdict = lambda ok: "met" if ok else "**missed**"  # noqa: E731
    bytes_ratio = med([r["bytes"] for r in fd]) / med([r["bytes"] for r in tb])
    rss_w, rss_l = max(r["rss_write"] for r in fd) / 1e6, max(r["rss_load"] for r in fd) / 1e6
    rows.append(
        [
            "speed-up (TensorBoard ÷ Flightdeck)",
            f"**{w_ratio:.1f}×** (target ≥ 20×: {verdict(w_ratio >= 20)})",
            f"**{l_ratio:.1f}×** (target ≥ 100×: {verdict(l_ratio >= 100)})",
            "",
            f"Flightdeck uses {bytes_ratio:.2f}× the bytes (target ≤ 1: {verdict(bytes_ratio <= 1)})",
            f"highest {rss_w:,.0f} (target ≤ 250: {verdict(rss_w <= 250)})",
            f"highest {rss_l:,.0f} (target ≤ 250: {verdict(rss_l <= 250)})",
            "",
        ]
    )
    header = [
        f"{RANKS} ranks × {n_steps:,} steps × 4 metrics = {RANKS * n_steps * 4 / 1e6:.2f} M points",
        "write s",
        "load s (open + loss of all ranks)",
        f"chart s ({COLUMNS} columns, all ranks)",
        "on disk MB",
        "peak RSS write MB",
        "peak RSS load MB",
        "reps",
    ]
    base_fd = run_json([tools.fdbench], clean_env({}), 60, "fdbench baseline")[1].peak_rss_bytes()
    base_tb = run_json([tools.python, "-c", BASELINE_TB], clean_env({}), 60, "python baseline")[1].peak_rss_bytes()
    tb_script = rel(os.path.join(REFERENCE, "history_tb.py"))
    repro = [
        f"- Process baselines (peak RSS of a process that only starts): fdbench {base_fd / 1e6:,.0f} MB "
        f"(it links libtorch, as the flightdeck server does), python with TensorBoard's modules imported "
        f"{base_tb / 1e6:,.0f} MB",
        f"- Flightdeck: `fdbench history-write DIR {RANKS} {n_steps}` then `fdbench history-load DIR {COLUMNS}`",
        f"- TensorBoard: `{cmd(['$FD_VENV/bin/python', tb_script, 'write', 'DIR', RANKS, n_steps])}` then "
        f"`{cmd(['$FD_VENV/bin/python', tb_script, 'load', 'DIR'])}`",
    ]
    return table(header, rows), repro, n
