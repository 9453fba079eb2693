"""Shared by the bench drivers: processes, statistics, machine and version facts, tables, and
rewriting this benchmark's section of docs/benchmarks.md between its markers."""

import datetime
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REFERENCE = os.path.join(ROOT, "benches", "reference")


@dataclass
class Tools:
    """What the drivers run: the release flightdeck binary, the fdbench binary, the venv's python."""

    flightdeck: str
    fdbench: str
    python: str

    @staticmethod
    def from_env():
        def need(var, what):
            v = os.environ.get(var, "")
            if not v or not os.path.exists(v):
                sys.exit(f"bench: environment variable {var} = {v!r} must name {what} (scripts/bench.sh sets it)")
            return v

        return Tools(
            need("FD_BIN", "the flightdeck binary"),
            need("FD_BENCH_BIN", "the fdbench binary (cargo bench --bench fdbench --no-run)"),
            need("FD_PYTHON", "the PyTorch venv's python"),
        )


def reps(var, default):
    """Repetitions wanted per side, overridable from the environment (make bench BENCH_REPS=5)."""
    raw = os.environ.get(var, "")
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        sys.exit(f"bench: {var} = {raw!r}: expected a whole number ≥ 1")
    return int(raw)


# Every benchmark runs at least this many repetitions per side, whatever its share of the time
# budget: fewer would leave no median worth quoting (issue 16: at least 3 per side). Where
# `make bench` would overrun, a repetition is made shorter instead (BENCH_HISTORY_STEPS).
MIN_REPS = 3


def repetitions(wanted, deadline, minimum=MIN_REPS):
    """Yields repetition numbers: at least `minimum` (and `wanted` when it asks fewer), up to
    `wanted` while another one, as long as the mean so far, still ends before `deadline`
    (time.monotonic()). This is how `make bench` stays inside its time budget on a loaded
    machine; the doc says how many ran."""
    start, rep = time.monotonic(), 0
    while rep < wanted:
        if rep >= minimum and time.monotonic() + (time.monotonic() - start) / rep > deadline:
            return
        yield rep
        rep += 1


def clean_env(extra):
    """The parent environment without anything that would change a side's threads or role."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTDECK_", "OMP_", "MKL_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    """A child whose stdout lines are read as they come, each stamped with time.perf_counter()."""

    popen: subprocess.Popen
    lines: list = field(default_factory=list)
    err: list = field(default_factory=list)
    threads: list = field(default_factory=list)
    rusage: object = None

    @staticmethod
    def start(argv, env, stdin=subprocess.DEVNULL):
        p = subprocess.Popen(argv, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc = Proc(p)
        proc.threads = [
            threading.Thread(target=proc._read, args=(p.stdout, proc.lines), daemon=True),
            threading.Thread(target=proc._read, args=(p.stderr, proc.err), daemon=True),
        ]
        for t in proc.threads:
            t.start()
        return proc

    @staticmethod
    def _read(stream, out):
        for line in stream:
            out.append((time.perf_counter(), line.rstrip("\n")))

    def wait(self, timeout_s, what):
        """Waits for exit (wait4, so peak RSS is known); a child past its time is killed by pid."""
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, usage = os.wait4(self.popen.pid, os.WNOHANG)
            if pid:
                self.popen.returncode = os.waitstatus_to_exitcode(status)
                self.rusage = usage
                break
            if time.monotonic() > deadline:
                self.popen.kill()
                _, status, self.rusage = os.wait4(self.popen.pid, 0)
                self.popen.returncode = os.waitstatus_to_exitcode(status)
                for t in self.threads:
                    t.join(5)
                raise RuntimeError(f"{what}: still running after {timeout_s} s, killed; stderr: {self.stderr()[-800:]}")
            time.sleep(0.01)
        for t in self.threads:
            t.join(5)
        if self.popen.returncode != 0:
            raise RuntimeError(f"{what}: exit code {self.popen.returncode}; stderr: {self.stderr()[-1500:]}")
        return self

    def stderr(self):
        return "\n".join(line for _, line in self.err)

    def peak_rss_bytes(self):
        return self.rusage.ru_maxrss * 1024 if self.rusage else 0


def run_json(argv, env, timeout_s, what):
    """Runs a child to completion; returns (the JSON objects it printed, the Proc)."""
    import json

    p = Proc.start(argv, env).wait(timeout_s, what)
    out = [json.loads(line) for _, line in p.lines if line.startswith("{")]
    return out, p


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs, fmt="{:.1f}"):
    """'median (min–max)' of a list."""
    if not xs:
        return "—"
    return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def alternate(rep):
    """A before B on even repetitions, B before A on odd ones, so drift in the machine's load
    falls on both sides alike."""
    return ("fd", "ref") if rep % 2 == 0 else ("ref", "fd")


def sh(*argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kib = int(re.search(r"MemTotal:\s+(\d+)", open("/proc/meminfo").read()).group(1))
        mem = f"{kib / 2**20:.1f} GiB"
    except (OSError, AttributeError):
        pass
    return {
        "cpus": str(len(os.sched_getaffinity(0))),
        "cpu": cpu,
        "memory": mem,
        "kernel": sh("uname", "-r"),
    }


def versions(tools, extra=()):
    rev = sh("git", "rev-parse", "--short=12", "HEAD")
    # The doc and charts these runs rewrite do not make the code under test dirty.
    dirty = sh("git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/benchmarks.md", ":!docs/benchmarks")
    py = subprocess.run(
        [tools.python, "-c", "import sys, torch; print(torch.__version__, sys.version.split()[0])"],
        capture_output=True,
        text=True,
    ).stdout.split()
    out = {
        "flightdeck": rev + ("-dirty" if dirty else ""),
        "rustc": sh("rustc", "--version").removeprefix("rustc "),
        "torch": py[0] if py else "?",
        "python": py[1] if len(py) > 1 else "?",
    }
    for name in extra:
        out[name] = subprocess.run(
            [tools.python, "-c", f"import {name}; print({name}.__version__)"], capture_output=True, text=True
        ).stdout.strip()
    return out


def stamp(tools, started_load, extra_versions=()):
    """One line saying when, on what, with which versions, and how loaded the machine was."""
    m, v = machine(), versions(tools, extra_versions)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    vs = ", ".join(f"{k} {val}" for k, val in v.items())
    return (
        f"Measured {when} on {m['cpus']} CPUs ({m['cpu']}), {m['memory']} RAM, Linux {m['kernel']}; "
        f"{vs}. Load average (1/5/15 min) {started_load} at the start, {loadavg()} at the end."
    )


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def cmd(argv, env=None):
    """A command line to paste, with the environment it needs first."""
    pre = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items())
    # $FD_VENV stays unquoted so that it expands when pasted.
    line = " ".join(str(a) if str(a).startswith("$") else shlex.quote(str(a)) for a in argv)
    return f"{pre} {line}".strip()


def rel(path):
    """A path as the doc shows it: relative to the repository where it lies inside it."""
    p = os.path.abspath(path)
    return os.path.relpath(p, ROOT) if p.startswith(ROOT + os.sep) else p


DOC = os.path.join(ROOT, "docs", "benchmarks.md")


def write_section(name, body, before=None):
    """Replaces the text between `<!-- bench:NAME:begin -->` and `<!-- bench:NAME:end -->` in
    docs/benchmarks.md; nothing else changes. When the markers are absent they are added before
    the first line that starts with `before` (if given and found), else at the end."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    text = open(DOC).read() if os.path.exists(DOC) else "# Benchmarks\n"
    block = f"{begin}\n{body.strip()}\n{end}"
    at = text.find("\n" + before) + 1 if before and ("\n" + before) in text else -1
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    elif at > 0:
        text = text[:at] + block + "\n\n" + text[at:]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(DOC + ".tmp", "w") as f:
        f.write(text)
    os.replace(DOC + ".tmp", DOC)
