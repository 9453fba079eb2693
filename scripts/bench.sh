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
FD_BENCH_BIN=$(fdbench_bin)
export FD_BENCH_BIN FD_PYTHON="$FD_VENV/bin/python" PYTHONDONTWRITEBYTECODE=1
exec "$FD_PYTHON" benches/driver/bench.py "${@:-all}"
