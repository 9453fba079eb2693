#!/usr/bin/env bash
# Benchmarks against their references: scripts/bench.sh [train|allreduce|overhead|history|all]...
# `make bench*` calls it after `make build`; it builds the fdbench binary (benches/fdbench),
# then runs the driver (benches/driver/bench.py) on the PyTorch venv's python, which prints
# each table and rewrites that benchmark's section of docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
export FD_BIN=${FD_BIN:-$PWD/target/release/flightdeck}
[ -x "$FD_BIN" ] || { echo "bench: $FD_BIN is missing: run make build first" >&2; exit 2; }
# The bench executable's name carries a hash; cargo says which it built.
FD_BENCH_BIN=$(cargo bench --bench fdbench --no-run --message-format=json-render-diagnostics |
    "$FD_VENV/bin/python" -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "fdbench" and m.get("executable"):
        print(m["executable"])')
export FD_BENCH_BIN FD_PYTHON="$FD_VENV/bin/python" PYTHONDONTWRITEBYTECODE=1
exec "$FD_PYTHON" benches/driver/bench.py "${@:-all}"
