"""Telemetry overhead: the default recipe run for real (`flightdeck run --headless`: server,
agent, 2 worker ranks) with full telemetry and flight-record streaming against the same run
with `--set telemetry.enabled=false`; the measure is the ranks' median step time."""

import fcntl
import glob
import os
import re
import statistics
import tempfile
import threading
import time

from common import Proc, alternate, clean_env, cmd, med, repetitions, reps, spread, table

RECIPE = "recipes/tiny-gpt.toml"
OFF = ["--set", "telemetry.enabled=false"]
# Steps below this are warm-up; every rank prints its step time every 10 steps.
FIRST = 20
LINE = re.compile(r"rank (\d+) step (\d+)/(\d+) loss \S+ step ([0-9.]+) ms")


def steps_override():
    """The default recipe with 100 steps instead of its 200 (a step costs the same either way;
    the time budget buys more repetitions instead); BENCH_OVERHEAD_STEPS changes it."""
    raw = os.environ.get("BENCH_OVERHEAD_STEPS", "")
    return ["--set", f"train.steps={int(raw) if raw.isdigit() and int(raw) > FIRST else 100}"]


def argv(tools, db, on):
    return [tools.flightdeck, "--db", db, "run", RECIPE, "--headless"] + steps_override() + ([] if on else OFF)


def wait_server_gone(db, timeout_s=60):
    """The server holds an exclusive flock on server.lock while it lives; it exits by itself
    once idle. Waiting for the lock keeps one run's server from overlapping the next run."""
    path = os.path.join(db, "server.lock")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
        except FileNotFoundError:
            return
        except BlockingIOError:
            time.sleep(0.05)
    raise RuntimeError(f"the server of {db} did not exit within {timeout_s} s")


class LogTail(threading.Thread):
    """Stamps rank 0's log lines as the agent appends them (polled every POLL_S), so the mean
    step time over the whole run is known too, not only the every-10th-step samples."""

    POLL_S = 0.02

    def __init__(self, db):
        super().__init__(daemon=True)
        self.db, self.stamped, self.done = db, [], threading.Event()

    def run(self):
        pattern = os.path.join(self.db, "runs", "*", "logs", "rank-0.log")
        f, buf = None, ""
        while True:
            finished = self.done.is_set()  # read once more after the run ended, then stop
            if f is None:
                found = glob.glob(pattern)
                f = open(found[0], errors="replace") if found else None
            if f is not None:
                buf += f.read()
                *lines, buf = buf.split("\n")
                now = time.perf_counter()
                self.stamped += [(now, line) for line in lines]
            if finished:
                break
            time.sleep(self.POLL_S)
        if f is not None:
            f.close()

    def mean_ms(self):
        at = {}
        for t, line in self.stamped:
            m = LINE.match(line)
            if m:
                at[int(m.group(2))] = t
        steps = sorted(s for s in at if s >= FIRST)
        if len(steps) < 2:
            return float("nan")
        return (at[steps[-1]] - at[steps[0]]) / (steps[-1] - steps[0]) * 1e3


def one_run(tools, on, tmp):
    db = tempfile.mkdtemp(prefix="db-", dir=tmp)
    tail = LogTail(db)
    tail.start()
    t0 = time.perf_counter()
    try:
        Proc.start(argv(tools, db, on), clean_env({"FLIGHTDECK_SERVER_IDLE_MS": 200})).wait(
            900, f"overhead run (telemetry {'on' if on else 'off'})"
        )
    finally:
        tail.done.set()
        tail.join()
    wall = time.perf_counter() - t0
    wait_server_gone(db)
    samples = []
    for log in glob.glob(os.path.join(db, "runs", "*", "logs", "rank-*.log")):
        for line in open(log, errors="replace"):
            m = LINE.match(line)
            if m and int(m.group(2)) >= FIRST:
                samples.append(float(m.group(4)))
    if not samples:
        raise RuntimeError(f"overhead: no step lines in the rank logs of {db}")
    return {"ms": statistics.median(samples), "samples": len(samples), "wall": wall, "mean_ms": tail.mean_ms()}


def run(tools, deadline, out=print):
    n = reps("BENCH_REPS", 4)
    got = {"fd": [], "ref": []}  # fd = telemetry on (A), ref = telemetry off (B)
    with tempfile.TemporaryDirectory(prefix="fd-bench-overhead-") as tmp:
        for rep in repetitions(n, deadline):
            for side in alternate(rep):
                r = one_run(tools, side == "fd", tmp)
                got[side].append(r)
                label = "on " if side == "fd" else "off"
                out(
                    f"  overhead rep {rep + 1} telemetry {label}: median {r['ms']:.1f} ms/step over "
                    f"{r['samples']} samples, mean {r['mean_ms']:.1f} ms/step, run {r['wall']:.1f} s"
                )
    on, off = [r["ms"] for r in got["fd"]], [r["ms"] for r in got["ref"]]
    overhead = (med(on) / med(off) - 1) * 100
    mean_on, mean_off = [r["mean_ms"] for r in got["fd"]], [r["mean_ms"] for r in got["ref"]]
    mean_overhead = (med(mean_on) / med(mean_off) - 1) * 100
    rows = [
        [
            "on (default: every step, phases, flight records)",
            spread(on),
            f"**{overhead:+.1f} %**",
            "met" if overhead <= 1.0 else "**missed**",
            spread(mean_on),
            f"{mean_overhead:+.1f} %",
            spread([r["wall"] for r in got["fd"]]),
            len(on),
        ],
        ["off (`--set telemetry.enabled=false`)", spread(off), "", "", spread(mean_off), "", spread([r["wall"] for r in got["ref"]]), len(off)],
    ]
    header = [
        "telemetry",
        "median step ms",
        "slower than off",
        "target ≤ 1 %",
        f"mean step ms, steps {FIRST}–last (rank 0)",
        "slower than off (mean)",
        "whole run s (start to exit)",
        "reps",
    ]
    samples = sum(r["samples"] for r in got["fd"] + got["ref"])
    repro = [
        f"- on: `{cmd(['target/release/flightdeck', '--db', 'DB', 'run', RECIPE, '--headless'] + steps_override())}`; "
        f"off: the same with `{' '.join(OFF)}`; step times from `DB/runs/RUN/logs/rank-*.log` "
        f"(each rank prints its step time every 10 steps; steps ≥ {FIRST}; {samples} samples in all); "
        "the mean is the time between rank 0's log lines for its first and last printed step ≥ "
        f"{FIRST}, stamped as they appear in the log (polled every {LogTail.POLL_S * 1000:.0f} ms)"
    ]
    return table(header, rows), repro, n
