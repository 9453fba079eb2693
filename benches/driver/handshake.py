"""The run secret's cost (docs/security.md): the time to form the TCP ring of 2 and 4 ranks, a
store client's connect with its first request, and a store request on an open connection,
without a secret (`Gate::open`: every connection taken, as before secrets; the "before") and
with one (every connection's HMAC-SHA256 challenge-response; the "after"), in one process over
loopback (`fdbench handshake`), the two sides alternating round by round."""

from common import clean_env, cmd, med, reps, run_json, spread, table

METRICS = (
    ("ring2_ms", "form the ring, 2 ranks", "ms", "{:.2f}"),
    ("ring4_ms", "form the ring, 4 ranks", "ms", "{:.2f}"),
    ("connect_us", "store: connect and first set", "µs", "{:.0f}"),
    ("request_us", "store: one request on an open connection", "µs", "{:.1f}"),
)


def run(tools, deadline, out=print):
    wanted = reps("BENCH_REPS", 30)
    argv = [tools.fdbench, "handshake", str(wanted)]
    rows_out, _ = run_json(argv, clean_env({}), 600, "fdbench handshake")
    by_side = {"open": [r for r in rows_out if r["side"] == "open"], "secret": [r for r in rows_out if r["side"] == "secret"]}
    rounds = min(len(by_side["open"]), len(by_side["secret"]))
    rows = []
    for key, what, unit, fmt in METRICS:
        before = [r[key] for r in by_side["open"]]
        after = [r[key] for r in by_side["secret"]]
        added = [a - b for a, b in zip(after, before)]
        ratio = med(after) / med(before) if med(before) else float("nan")
        rows.append([f"{what} ({unit})", spread(before, fmt), spread(after, fmt), spread(added, fmt), f"**{ratio:.2f}**", rounds])
        out(f"  {what}: {med(before):.3f} {unit} open, {med(after):.3f} {unit} with the secret")
    body = (
        table(["what", "no secret (before)", "with the secret (after)", "added, per round", "ratio (after ÷ before)", "rounds"], rows)
        + "\n\nThe handshake is three small messages and two HMAC-SHA256s per side, once per "
        "connection: forming a ring opens one store connection per rank and one ring link per "
        "rank; a request on an open connection pays nothing more (its row is the control)."
    )
    repro = [f"- `{cmd(['fdbench', 'handshake', str(wanted)])}` (one JSON line per round and side)"]
    return body, repro, wanted
