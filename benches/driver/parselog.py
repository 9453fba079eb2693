"""Log adapters: `flightdeck parse-log` on a mixed log of 1 M lines (every framework's fixture
lines, torchrun failures and plain noise) against GNU grep finding the candidate lines of the
same file (`grep -cE`, C speed, no parsing: the floor of reading the file); and the agent CPU the
live path adds to a rank printing 10 k lines/s (log_format = "auto" against "none")."""

import glob
import os
import resource
import subprocess
import tempfile
import time

from common import MIN_REPS, ROOT, Proc, alternate, clean_env, cmd, med, repetitions, reps, spread, table

LINES = int(os.environ.get("BENCH_PARSELOG_LINES", "1000000"))
NOISE = [
    "[INFO|trainer.py:2345] 2026-12-03 10:00:00,123 >> ***** Running training *****",
    "  Num examples = 50,000",
    "Loading checkpoint shards: done",
    "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py:617: UserWarning: This DataLoader will create 4 worker processes",
    "wandb: Tracking run with wandb version 0.19.1",
]
GREP = "loss|iteration|step|Error|memory"
LIVE_RATE = 10_000
LIVE_SECONDS = 5


def mixed_log(path):
    fixture_lines = []
    for f in sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/logs/**/*.log"), recursive=True)):
        with open(f, errors="replace") as fh:
            fixture_lines += [line.rstrip("\n") for line in fh]
    if not fixture_lines:
        raise RuntimeError("no fixtures in tests/fixtures/logs")
    with open(path, "w") as out:
        n = i = 0
        while n < LINES:
            # Two noise lines per fixture line: real logs are mostly not metrics.
            for line in (fixture_lines[i % len(fixture_lines)], NOISE[i % len(NOISE)], NOISE[(i + 2) % len(NOISE)]):
                out.write(line + "\n")
                n += 1
            i += 1
    return n


def timed(argv):
    """(wall s, CPU s of the child)"""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def agent_cpu_s(db):
    """CPU seconds of the run's agent (`flightdeck agent --run-dir DB/runs/...`) so far."""
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"agent" in argv and any(a.startswith(db.encode()) for a in argv):
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
    return None


def live(tools, fmt):
    """Agent CPU per second of a rank printing LIVE_RATE HF-style lines a second."""
    d = tempfile.mkdtemp(prefix="fdlive")
    script = os.path.join(d, "print.py")
    total = LIVE_RATE * LIVE_SECONDS
    with open(script, "w") as f:
        f.write(
            "import time, sys\n"
            f"rate, total = {LIVE_RATE}, {total}\n"
            "t0 = time.monotonic()\n"
            "for i in range(total):\n"
            "    print({'loss': 2.0 - i * 1e-6, 'grad_norm': 0.5, 'learning_rate': 5e-05, 'epoch': i / total})\n"
            "    if i % 100 == 99:\n"
            "        sys.stdout.flush()\n"
            "        ahead = (i + 1) / rate - (time.monotonic() - t0)\n"
            "        if ahead > 0:\n"
            "            time.sleep(ahead)\n"
            "sys.stdout.flush()\n"
            "open(sys.argv[1], 'w').close()\n"
            "time.sleep(3)\n"
        )
    recipe = os.path.join(d, "r.toml")
    done = os.path.join(d, "printed")
    with open(recipe, "w") as f:
        f.write(
            f'name = "live-{fmt}"\nkind = "command"\n[command]\nargv = ["python3", "{script}", "{done}"]\n'
            f'log_format = "{fmt}"\n[cluster]\nranks_per_node = 1\n'
        )
    db = os.path.join(d, "db")
    p = Proc.start([tools.flightdeck, "--db", db, "run", recipe, "--headless"], clean_env({}))
    cpu = None
    deadline = time.monotonic() + LIVE_SECONDS * 10 + 60
    while time.monotonic() < deadline and cpu is None:
        if os.path.exists(done):
            cpu = agent_cpu_s(db)
            break
        time.sleep(0.05)
    p.wait(120, f"the live run ({fmt})")
    if cpu is None:
        raise RuntimeError(f"the live run ({fmt}) did not print its lines, or its agent was not found")
    return cpu / LIVE_SECONDS


def run(tools, deadline, out=print):
    wanted = reps("BENCH_REPS", 5)
    d = tempfile.mkdtemp(prefix="fdparse")
    log = os.path.join(d, "mixed.log")
    n = mixed_log(log)
    fd_argv = [tools.flightdeck, "parse-log", log]
    ref_argv = ["grep", "-cE", GREP, log]
    got = {"fd": [], "fd_cpu": [], "ref": []}
    half = time.monotonic() + (deadline - time.monotonic()) * 0.6
    for rep in repetitions(wanted, half):
        for side in alternate(rep):
            wall, cpu = timed(fd_argv if side == "fd" else ref_argv)
            got[side].append(n / wall)
            if side == "fd":
                got["fd_cpu"].append(n / cpu if cpu > 0 else float("nan"))
        out(f"  parse-log rep {rep + 1}: {got['fd'][-1]:,.0f} lines/s, grep {got['ref'][-1]:,.0f} lines/s")
    live_got = {"auto": [], "none": []}
    for rep in repetitions(max(wanted // 2, MIN_REPS), deadline):
        for fmt in ("auto", "none") if rep % 2 == 0 else ("none", "auto"):
            live_got[fmt].append(live(tools, fmt) * 100)
        out(f"  live rep {rep + 1}: agent {live_got['auto'][-1]:.1f} % CPU (auto), {live_got['none'][-1]:.1f} % (none)")
    fd_cpu = med(got["fd_cpu"])
    rows = [
        [
            f"parse-log, {n:,} mixed lines",
            spread(got["fd"], "{:,.0f}"),
            spread(got["fd_cpu"], "{:,.0f}"),
            spread(got["ref"], "{:,.0f}"),
            f"**{med(got['fd']) / med(got['ref']):.2f}**",
            "met" if fd_cpu >= 1_000_000 else "**missed**",
            len(got["fd"]),
        ]
    ]
    added = [a - b for a, b in zip(live_got["auto"], live_got["none"])]
    live_rows = [
        [
            f"agent CPU, a rank printing {LIVE_RATE:,} lines/s",
            spread(live_got["auto"], "{:.1f}"),
            spread(live_got["none"], "{:.1f}"),
            spread(added, "{:.1f}"),
            len(added),
        ]
    ]
    body = (
        table(
            ["what", "Flightdeck lines/s (wall)", "lines/s per CPU second", "grep -cE lines/s", "ratio (fd ÷ grep)", "target (≥ 1 M/s on one core)", "reps"],
            rows,
        )
        + "\n\n"
        + table(["live path", "% of a core, log_format = auto", "% of a core, none", "added by the adapters", "reps"], live_rows)
        + "\n\ngrep only finds the lines that could hold a metric; parse-log reads every line through "
        "every adapter (`--format auto`) and writes each record as JSON. The live rows are the node "
        "agent's CPU over the seconds the rank prints (log file, forwarding upstream, and with `auto` "
        "the adapters), as a percentage of one core."
    )
    repro = [
        f"- Flightdeck: `{cmd(['flightdeck', 'parse-log', 'mixed.log'])}`; reference: `{cmd(ref_argv[:-1] + ['mixed.log'])}` "
        "(benches/driver/parselog.py writes mixed.log from tests/fixtures/logs/)",
        "- live: a `kind = \"command\"` run of one rank printing HF dict lines at 10 k/s, `[command] log_format` auto vs none",
    ]
    return body, repro, wanted
