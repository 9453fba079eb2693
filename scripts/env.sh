# Source this to run cargo by hand with the same libtorch as `make`: `source scripts/env.sh`.
FLIGHTDECK_CACHE=${FLIGHTDECK_CACHE:-$HOME/.cache/flightdeck}
eval "$(scripts/setup-torch.sh)"
export LIBTORCH=$FD_LIBTORCH_VIEW FD_TORCH_LIB FD_VENV FLIGHTDECK_CACHE

# The benchmarks' fdbench executable (its name carries a hash; cargo says which it built).
fdbench_bin() {
  cargo bench --bench fdbench --no-run --message-format=json-render-diagnostics |
    "$FD_VENV/bin/python" -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "fdbench" and m.get("executable"):
        print(m["executable"])'
}
