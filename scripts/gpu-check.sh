#!/usr/bin/env bash
# gpu-check: one pass over Flightdeck's GPU path on a GPU machine, in a few minutes, ending with
# a short table: doctor (CUDA, NVML, NCCL), gpt-small-cuda trained by the worker for a fixed
# number of steps (tokens/s, step ms, MFU), NVML samples in the store, a single-rank NCCL
# all-reduce through the backend, and the same model in PyTorch eager on the same GPU.
#
# The GPU machine needs no Rust: copy the binary built here and this repository (or just
# scripts/, recipes/ and benches/). It uses that machine's own PyTorch 2.11 (its libtorch and
# NCCL): the binary's run path points at the build machine's cache, so LD_LIBRARY_PATH is set
# below from `python -c "import torch"`.
#
#   FLIGHTDECK_BIN=./flightdeck PYTHON=python3 scripts/gpu-check.sh
#
# GPU_CHECK_DRY_RUN=1 runs the same pipeline on the CPU with a tiny model (the test suite does,
# so the plumbing is proven before the one shot on a GPU). GPU_CHECK_STEPS (default 100) sets
# the steps; GPU_CHECK_OUT keeps the raw outputs in that directory.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${FLIGHTDECK_BIN:-$repo/target/release/flightdeck}
py=${PYTHON:-python3}
dry=${GPU_CHECK_DRY_RUN:-0}
steps=${GPU_CHECK_STEPS:-100}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
out=${GPU_CHECK_OUT:-$work/out}
mkdir -p "$out"
db=$work/db
running=0
cleanup() {
  # The server exits by itself when idle; kill a run left behind by an interrupted check.
  [ "$running" = 0 ] || "$bin" --db "$db" kill gpu-check >/dev/null 2>&1 || true
  rm -rf "$work/nccl-link"
  [ -n "${GPU_CHECK_OUT:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
say() { echo "gpu-check: $*" >&2; }
die() { say "$*"; exit 1; }

[ -x "$bin" ] || die "no flightdeck binary at $bin (set FLIGHTDECK_BIN)"
command -v "$py" >/dev/null || die "no python at $py (set PYTHON to one with PyTorch 2.11)"

# --- this machine's PyTorch and NVIDIA libraries on the loader path ---
torch_info=$("$py" -c 'import torch, os; print(torch.__version__); print(os.path.join(os.path.dirname(torch.__file__), "lib"))') \
  || die "$py cannot import torch"
torch_version=$(sed -n 1p <<<"$torch_info")
torch_lib=$(sed -n 2p <<<"$torch_info")
case "$torch_version" in 2.11.*) ;; *) say "warning: PyTorch $torch_version here; the binary is built for 2.11";; esac
site=$(dirname "$(dirname "$torch_lib")")
libs=$torch_lib
for d in "$site"/nvidia/*/lib; do [ -d "$d" ] && libs=$libs:$d; done
# cudarc looks for libnccl.so; PyTorch's wheel ships libnccl.so.2 only: a private link to it.
mkdir -p "$work/nccl-link"
if [ -e "$site/nvidia/nccl/lib/libnccl.so.2" ]; then
  ln -sf "$site/nvidia/nccl/lib/libnccl.so.2" "$work/nccl-link/libnccl.so"
fi
export LD_LIBRARY_PATH=$work/nccl-link:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# --- what runs: the real recipe, or its tiny CPU twin ---
recipe=$repo/recipes/gpt-small-cuda.toml
if [ "$dry" = 1 ]; then
  device=cpu
  # A 16-token vocabulary keeps the CPU run to seconds; the GPU run's synthetic:tokens source
  # has its own unit tests.
  shape=(--n-layer 2 --n-head 2 --d-model 64 --context 64 --batch 4 --vocab 16)
  sets=(--set cluster.device=cpu --set parallel.backend=ring --set train.dtype=fp32
        --set model.n_layer=2 --set model.n_head=2 --set model.d_model=64 --set model.context=64
        --set train.batch_per_rank=4 --set model.vocab=16 --set data.source=synthetic:arith)
else
  device=cuda
  shape=()
  sets=()
fi
sets+=(--set "train.steps=$steps" --set "train.warmup=$((steps / 10))" --set telemetry.sample_interval_ms=250)

say "1/4 doctor"
"$bin" doctor >"$out/doctor.txt" 2>&1 || say "doctor reported a failure (see below)"

say "2/4 flightdeck: $(basename "$recipe") for $steps steps on $device"
running=1
timeout 300 "$bin" --db "$db" run "$recipe" --headless --ranks-per-node 1 --name gpu-check "${sets[@]}" \
  >"$out/run.txt" 2>&1 || { cat "$out/run.txt" >&2; die "the flightdeck run failed"; }
running=0
"$bin" --db "$db" show gpu-check --json >"$out/show.json"
"$bin" --db "$db" metrics gpu-check --key gpu_util_pct --format jsonl >"$out/gpu_util.jsonl" 2>/dev/null || true
run_id=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run"]["id"])' "$out/show.json")
cp "$db/runs/$run_id/logs/rank-0.log" "$out/rank-0.log"

say "3/4 PyTorch eager reference on $device"
timeout 300 "$py" "$repo/benches/reference/gpu_eager.py" --device "$device" --steps "$steps" "${shape[@]}" \
  >"$out/eager.json" 2>"$out/eager.err" || { cat "$out/eager.err" >&2; die "the eager reference failed"; }

say "4/4 table"
"$py" - "$out" "$device" <<'PY'
import json, os, re, socket, sys, time
out, device = sys.argv[1], sys.argv[2]
read = lambda f: open(os.path.join(out, f)).read()
doctor = read("doctor.txt")
def doc(check):
    m = re.search(rf"^{check}\s+(\S+)\s+(.*)$", doctor, re.M)
    return f"{m.group(1)}: {m.group(2)}" if m else "absent"
show = json.loads(read("show.json"))
line = re.search(r"throughput: step_ms (\S+) tokens_per_s (\S+) mfu (.*?) on (.*?);", read("rank-0.log"))
eager = json.loads(read("eager.json").strip().splitlines()[-1])
gpu_points = [l for l in read("gpu_util.jsonl").splitlines() if l.strip()]
gpu_fields = sorted(k for k in show.get("metrics", []) if k.startswith("gpu_"))
ours_tps = float(line.group(2)) if line else float("nan")
rows = [
    ("date, host", f"{time.strftime('%Y-%m-%d %H:%M')} {socket.gethostname()}"),
    ("device", line.group(4) if line else device),
    ("torch", eager["torch"]),
    ("doctor cuda", doc("cuda")),
    ("doctor nccl", doc("nccl")),
    ("nccl all-reduce, 1 rank", doc("nccl-test")),
    ("nvml samples in store", f"{len(gpu_points)} gpu_util_pct points; fields: {', '.join(gpu_fields) or 'none'}"),
    ("run", f"{show['run']['status']}, {show['summary']['steps_done']} steps"),
    ("flightdeck step ms", line.group(1) if line else "no throughput line"),
    ("flightdeck tokens/s", f"{ours_tps:.0f}"),
    ("flightdeck MFU", line.group(3) if line else "n/a"),
    ("eager step ms", f"{eager['step_ms']:.2f}"),
    ("eager tokens/s", f"{eager['tokens_per_s']:.0f}"),
    ("ratio flightdeck/eager", f"{ours_tps / eager['tokens_per_s']:.3f}"),
]
width = max(len(k) for k, _ in rows)
print(f"| {'check'.ljust(width)} | result |")
print(f"| {'-' * width} | --- |")
for k, v in rows:
    print(f"| {k.ljust(width)} | {v} |")
PY
