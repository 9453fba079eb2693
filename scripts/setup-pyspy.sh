#!/usr/bin/env bash
# Installs py-spy (Python stacks of live ranks: `flightdeck stacks`, `s`/`S` in the cockpit) from
# the Python package index into the PyTorch venv, once, and links it into the cache's bin
# directory, which `make` puts first on PATH for the demos and the tests. Idempotent.
set -euo pipefail
cache=${FLIGHTDECK_CACHE:-$HOME/.cache/flightdeck}
venv=${FD_VENV:?FD_VENV is not set: run scripts/setup-torch.sh first (make does)}
version=0.4.3
if ! "$venv/bin/py-spy" --version 2>/dev/null | grep -q "py-spy $version"; then
  echo "setup-pyspy: installing py-spy==$version into $venv (one time)" >&2
  "$venv/bin/pip" install --quiet "py-spy==$version" >&2
fi
mkdir -p "$cache/bin"
ln -sfn "$venv/bin/py-spy" "$cache/bin/py-spy"
