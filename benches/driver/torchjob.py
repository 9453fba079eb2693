"""Real PyTorch jobs: what the shim costs, and how soon a hang is named, against PyTorch's own.

- Shim cost: assets/examples/torch_ddp.py (2 gloo ranks on CPU, DDP) under Flightdeck with
  `[command] instrument = true` (the shim dumps the flight recorder and the stacks each second)
  against `false`, alternating; the step time is the script's own `train_runtime` over its steps.
- Hang detection: the same script with `--fault sleep` (rank 1 sleeps before step 5's forward)
  under Flightdeck, from the fault's stamp to the verdict; the reference is the same faulty
  script under plain torchrun-style env:// launch with PyTorch's defaults, watched for
  REF_WATCH_S: on gloo nothing fires (no watchdog in 2.11); NCCL's defaults are quoted.
"""
import json
import os
import re
import subprocess
import tempfile
import time

from overhead import wait_server_gone
from common import MIN_REPS, ROOT, Proc, alternate, clean_env, cmd, free_port, med, repetitions, reps, spread, table

SCRIPT = os.path.join(ROOT, "assets/examples/torch_ddp.py")
# Long enough (about 10 s of training at 2 ms a step) to span several of the shim's full dumps
# (every 5 s) and its status ticks (each second): 400 steps ended before the first one.
STEPS = int(os.environ.get("BENCH_TORCH_STEPS", "5000"))
REF_WATCH_S = int(os.environ.get("BENCH_TORCH_REF_WATCH_S", "60"))


def recipe(d, name, python, argv, instrument=True):
    path = os.path.join(d, f"{name}.toml")
    words = ", ".join(json.dumps(a) for a in [python, SCRIPT] + argv)
    with open(path, "w") as f:
        f.write(
            f'name = "{name}"\nkind = "command"\n[command]\nargv = [{words}]\nlog_format = "hf"\n'
            f"instrument = {'true' if instrument else 'false'}\n[cluster]\nranks_per_node = 2\n"
        )
    return path


def step_ms(tools, python, instrument):
    """ms per step of one whole run, from rank 0's train_runtime; and, with the shim, each rank's
    shim thread's CPU time as a percentage of the rank's time since torch.distributed was up (the
    shim's own account, shim_rank_N.cost.json)."""
    d = tempfile.mkdtemp(prefix="fdtorch")
    r = recipe(d, "shim-on" if instrument else "shim-off", python, ["--steps", str(STEPS), "--log-every", "50"], instrument)
    db = os.path.join(d, "db")
    Proc.start([tools.flightdeck, "--db", db, "run", r, "--headless"], clean_env({})).wait(600, "the DDP run")
    runs = os.listdir(os.path.join(db, "runs"))
    with open(os.path.join(db, "runs", runs[0], "logs", "rank-0.log")) as f:
        m = re.search(r"'train_runtime': ([0-9.]+)", f.read())
    if not m:
        raise RuntimeError(f"no train_runtime in rank 0's log ({d})")
    wait_server_gone(db)
    shares = []
    fr = os.path.join(db, "runs", runs[0], "fr")
    for name in sorted(os.listdir(fr)) if instrument and os.path.isdir(fr) else []:
        if name.endswith(".cost.json"):
            with open(os.path.join(fr, name)) as f:
                c = json.load(f)
            shares.append(100 * c["thread_cpu_ms"] / max(c["wall_ms"], 1e-9))
    if instrument and not shares:
        raise RuntimeError(f"the shim wrote no cost file in {fr}")
    return 1000 * float(m.group(1)) / STEPS, shares


def detection_s(tools, python):
    """Seconds from rank 1's fault to Flightdeck's verdict."""
    d = tempfile.mkdtemp(prefix="fdtorchhang")
    r = recipe(d, "hang", python, ["--steps", "100000", "--log-every", "5", "--fault", "sleep"])
    db = os.path.join(d, "db")
    p = Proc.start([tools.flightdeck, "--db", db, "run", r, "--headless"], clean_env({}))
    deadline = time.monotonic() + 180
    verdict = None
    while time.monotonic() < deadline and verdict is None:
        verdict = next((line for _, line in p.lines if " verdict " in line), None)
        time.sleep(0.05)
    run = os.listdir(os.path.join(db, "runs"))[0]
    subprocess.run([tools.flightdeck, "--db", db, "kill", run], capture_output=True)
    p.popen.wait(120)
    if verdict is None:
        raise RuntimeError(f"no verdict within 180 s ({d})")
    show = json.loads(subprocess.run([tools.flightdeck, "--db", db, "show", run, "--json"], capture_output=True, text=True).stdout)
    v = show["verdicts"][0]
    with open(os.path.join(db, "runs", run, "logs", "rank-1.log")) as f:
        injected = int(re.search(r"unix ms (\d+)", f.read()).group(1))
    wait_server_gone(db)
    return (v["detected_ms"] - injected) / 1000, v["kind"]


def reference_watch(python):
    """The faulty script under PyTorch alone for REF_WATCH_S: what, if anything, it reports."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = clean_env({"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": rank, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        argv = [python, SCRIPT, "--steps", "100000", "--log-every", "5", "--fault", "sleep"]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    time.sleep(REF_WATCH_S)
    alive = [p.poll() is None for p in procs]
    for p in procs:
        p.kill()
    out = "".join(p.communicate()[0] for p in procs)
    said = [l for l in out.splitlines() if re.search(r"(?i)timeout|watchdog|hang|error", l)]
    return all(alive), said


def run(tools, deadline, out=print):
    wanted = reps("BENCH_REPS", 5)
    python = tools.python
    got = {"on": [], "off": []}
    shares = []
    half = time.monotonic() + (deadline - time.monotonic()) * 0.6
    for rep in repetitions(wanted, half):
        for side in alternate(rep):
            ms, share = step_ms(tools, python, side == "fd")
            got["on" if side == "fd" else "off"].append(ms)
            shares.extend(share)
        out(f"  shim rep {rep + 1}: {got['on'][-1]:.2f} ms/step with the shim, {got['off'][-1]:.2f} without; "
            f"shim thread {shares[-1]:.3f} % of rank 1's time")
    cost = [100 * (a - b) / b for a, b in zip(got["on"], got["off"])]
    det = []
    for rep in repetitions(max(wanted // 2, MIN_REPS), deadline - REF_WATCH_S - 30):
        s, kind = detection_s(tools, python)
        det.append(s)
        out(f"  hang rep {rep + 1}: {kind} after {s:.1f} s")
    alive, said = reference_watch(python)
    ref = f"nothing in {REF_WATCH_S} s (both ranks still blocked, no line printed)" if alive and not said else f"{said[:2]}"
    rows = [
        [f"step time, torch_ddp.py, 2 gloo ranks, {STEPS} steps", spread(got["on"], "{:.2f}"), spread(got["off"], "{:.2f}"),
         f"**{med(cost):+.2f} %** ({min(cost):+.2f} to {max(cost):+.2f})", "met" if med(cost) <= 1.0 else "**missed**", len(cost)],
        ["the shim thread's CPU time in each rank, % of the rank's time (its own account)", "", "",
         f"**{med(shares):.3f} %** ({min(shares):.3f} to {max(shares):.3f})", "met" if med(shares) <= 1.0 else "**missed**",
         len(shares)],
    ]
    hang_rows = [
        ["rank 1 sleeps before step 5's forward (gloo)", spread(det, "{:.1f}") + " s", ref,
         "NCCL: watchdog timeout 600 s (the process group's default), heartbeat monitor 480 s", len(det)],
    ]
    body = (
        table(["what", "ms/step, shim on", "ms/step, shim off", "shim cost (median, min to max)", "target (≤ 1 %)", "reps"], rows)
        + "\n\n"
        + table(["hang", "Flightdeck: fault to verdict", "PyTorch 2.11 alone (same run)", "PyTorch's defaults elsewhere", "reps"], hang_rows)
        + "\n\nThe shim's cost: each second, in a daemon thread, the recorder's status (a few hundred "
        "bytes); a full dump (the whole 2000-entry ring with its frames, 17 to 28 ms holding the GIL, "
        "and the Python stacks) at the first tick, every 5 s or as rarely as keeps the dumps within "
        "0.2 % of the rank's time, and once when a rank's recorder stops moving; the agent reads and "
        "forwards the dumps and the default group's entries as collective records. Compare the "
        "shim-on median with the shim-off side's min-to-max (its noise). The second row is the part "
        "inside the rank, which has no such noise: the CPU time of the shim's thread over the rank's "
        "time, as the shim counts it (`shim_rank_N.cost.json`); the agent's reading of the dumps "
        "is outside it (on this 2-core machine it shares the ranks' cores; on a GPU node it does not)."
    )
    repro = [
        f"- shim: `flightdeck run` of `{cmd(['python', 'assets/examples/torch_ddp.py', '--steps', str(STEPS), '--log-every', '50'])}` "
        "on 2 ranks, `[command] instrument` true vs false (benches/driver/torchjob.py writes the recipes)",
        "- hang: the same with `--fault sleep`; the reference runs the two ranks with env:// and no Flightdeck",
    ]
    return body, repro, wanted
