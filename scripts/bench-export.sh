#!/usr/bin/env bash
# Export and report of the history benchmark's 2.56 M points (64 ranks x 10,000 steps x 4
# metrics, written by `fdbench history-write` as `make bench-history` does): wall time and the
# client's peak RSS per format, the output's size, and the server's peak RSS. Prints only; the
# numbers go into docs/benchmarks.md by hand (`make bench-export`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
FDB=$(fdbench_bin)
B=$PWD/target/release/flightdeck
work=$(mktemp -d /tmp/fd-bench-export.XXXX)
trap 'rm -rf "$work"' EXIT
D=$work/db
mkdir -p "$D"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
"$FDB" history-write "$D/history.sled" 64 10000 | tail -1
id=$("$B" --db "$D" runs --json | "$FD_VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["runs"][0]["id"])')
/usr/bin/time -f "baseline (runs --json): %e s wall, %M KB max RSS" "$B" --db "$D" runs --json > /dev/null
for f in csv jsonl tensorboard parquet; do
  /usr/bin/time -f "export $f: %e s wall, %M KB max RSS (client)" "$B" --db "$D" export "$id" --format $f --out "$work/$f" > /dev/null
  echo "  on disk: $(du -sh "$work/$f" | cut -f1)"
done
/usr/bin/time -f "report: %e s wall, %M KB max RSS (client)" "$B" --db "$D" report "$id" --out "$work/report" > /dev/null
echo "server peak RSS: $(grep VmHWM /proc/"$(cat "$D/server.lock")"/status | tr -s ' ' | cut -d' ' -f2-)"
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
