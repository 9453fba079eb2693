"""1,024 ranks through Slurm: 128 fake slurmd nodes on loopback × 8 light ranks (a perl script
printing a torchtitan step line 10 times a second), launched by Flightdeck (`cluster.launcher =
"slurm"`: sbatch holder, agents by srun, every line read and sent to the server) and by `srun`
alone. `fdbench slurm-scale` (benches/fdbench/slurm_scale.rs) runs both sides, alternating, and
prints what it measured; this tabulates it. Needs root (slurmd) and Slurm's packages
(scripts/install-deps.sh); not part of `make bench` (it takes about 15 minutes)."""

import os

from common import clean_env, cmd, med, reps, run_json, spread, table

NODES, PER_NODE, SECS = 128, 8, 60
# (steps per second per rank, repetitions): a rate this 2-core machine carries, repeated; then
# the issue's 10 steps/s once (it overloads the machine, and one repetition shows by how much).
RATES = ((1, None), (10, 1))


def run(tools, deadline, out=print):
    if os.geteuid() != 0:
        raise RuntimeError("slurm-scale needs root (slurmd and munged run as root here)")
    wanted = reps("BENCH_SLURM_REPS", 3)
    parts = []
    for rate, n in RATES:
        n = n or wanted
        argv = [tools.fdbench, "slurm-scale", tools.flightdeck, str(NODES), str(PER_NODE), str(rate), str(SECS), str(n)]
        try:
            results, _ = run_json(argv, clean_env({}), 900 * n * 2, f"fdbench slurm-scale at {rate} steps/s")
        except RuntimeError as e:
            out(f"  {rate} steps/s: {e}")
            parts.append(f"At {rate} step/s the measurement did not complete: {str(e)[-600:]}")
            continue
        parts.append(tabulate(rate, results, out))
    repro = [
        f"- `{cmd(['fdbench', 'slurm-scale', 'FD_BIN', str(NODES), str(PER_NODE), 'STEPS_PER_S', str(SECS), 'REPS'])}` "
        "(as root; benches/fdbench/slurm_scale.rs starts the fake cluster and runs both sides)"
    ]
    return "\n\n".join(parts) + NOTE, repro, wanted


def tabulate(rate, results, out):
    fd = [r for r in results if r["side"] == "fd"]
    ref = [r for r in results if r["side"] == "srun"]
    for r in results:
        out(f"  {r['side']} rep {r['rep']}: launch {r['launch_ms'] / 1e3:.1f} s (load {r['load']})")

    def col(rows, key, scale=1.0):
        return [r[key] * scale for r in rows]

    def lag(key):
        # Every window from every repetition that fell in the measured minute.
        return [w[key] for r in fd for w in r["lag"]]

    def cockpit(key):
        return [r["cockpit"][key] for r in fd]

    launch_fd, launch_ref = col(fd, "launch_ms", 1e-3), col(ref, "launch_ms", 1e-3)
    rows = [
        [
            "launch: submit → all 1,024 ranks running (s)",
            spread(launch_fd),
            spread(launch_ref),
            f"**{med(launch_ref) / med(launch_fd):.2f}**",
        ],
        [
            "collector CPU over the minute (% of one core): Flightdeck's server / srun",
            spread(col(fd, "server_cpu_pct"), "{:.0f}"),
            spread(col(ref, "srun_cpu_pct"), "{:.0f}"),
            f"{med(col(ref, 'srun_cpu_pct')) / max(med(col(fd, 'server_cpu_pct')), 1e-9):.2f}",
        ],
        [
            "collector memory (MB, proportional set size at the end): server / srun",
            spread(col(fd, "server_pss_mb"), "{:.0f}"),
            spread(col(ref, "srun_pss_mb"), "{:.0f}"),
            "",
        ],
        ["server peak RSS (MB)", spread(col(fd, "server_hwm_mb"), "{:.0f}"), "—", ""],
        [
            "node side CPU (% of one core, all 128 nodes): agents / slurmstepds",
            spread(col(fd, "agents_cpu_pct"), "{:.0f}") + " + stepds " + spread(col(fd, "stepds_cpu_pct"), "{:.0f}"),
            spread(col(ref, "stepds_cpu_pct"), "{:.0f}"),
            "",
        ],
        ["agents' memory, all 128 together (MB, proportional set size)", spread(col(fd, "agents_pss_mb"), "{:.0f}"), "—", ""],
        ["frames made durable per second (10 s windows)", spread(lag("frames_per_s"), "{:,.0f}"), "—", ""],
        [
            "store lag behind the agents, p50 / p99 / max of each 10 s window (ms)",
            f"{spread(lag('p50_ms'), '{:.0f}')} / {spread(lag('p99_ms'), '{:.0f}')} / {spread(lag('max_ms'), '{:.0f}')}",
            "—",
            "",
        ],
        [
            "live cockpit at 160×48 (`attach`): frame p50 / p99 (ms)",
            f"{spread(cockpit('p50_ms'), '{:.1f}')} / {spread(cockpit('p99_ms'), '{:.1f}')}",
            "—",
            "",
        ],
        [
            "cockpit's data backlog, first / second half of the minute (batches)",
            f"{spread(cockpit('backlog_first_half'))} / {spread(cockpit('backlog_second_half'))}",
            "—",
            "",
        ],
    ]
    resumed = sum(r.get("nodes_resumed", 0) for r in results)
    header = [f"1,024 ranks (128 nodes × 8), {rate} step/s each", "Flightdeck", "srun alone", "ratio (srun ÷ Flightdeck)"]
    offered = NODES * PER_NODE * rate * 2
    return (
        table(header, rows)
        + f"\n\n{len(fd)} repetition(s) per side at {rate} step/s: the ranks print {NODES * PER_NODE * rate:,} "
        f"lines/s, {offered:,} frames/s to the server (each line is the line and its parsed record)."
        + (f" Drained nodes returned to service after the repetitions: {resumed}." if resumed else "")
        + "".join(f" Repetition {r['rep']}'s teardown: {r['teardown_error']}." for r in fd if r.get("teardown_error"))
    )


NOTE = (
        "\n\nLaunch is from the command to the last rank's own "
        "start stamp, on both sides: Flightdeck's includes sbatch's allocation, two srun waves of "
        "agents (node 0 first: it hosts the rendezvous store) and the agents starting the ranks; "
        "srun's is one step over the same 128 nodes. The other rows cover the measured minute "
        "after launch: the collector is what gathers the ranks' output on the submitting machine "
        "(Flightdeck's server parses nothing, the agents do; srun only copies bytes to /dev/null). "
        "Every process of both sides (128 slurmd, 1,024 ranks, the agents, the server, the "
        "cockpit) shares this machine's 2 cores, so CPU percentages are of one core and the lag "
        "includes waiting for a core."
)
