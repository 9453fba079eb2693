#!/usr/bin/env bash
# Installs PyTorch 2.11.0 from the Python package index into a cache outside the repo (once),
# and lays out a CPU link view of its libtorch for tch's build. Idempotent: a second run does
# nothing but check. Prints the paths as shell assignments for the Makefile.
set -euo pipefail
cache=${FLIGHTDECK_CACHE:-$HOME/.cache/flightdeck}
torch_version=2.11.0
venv=$cache/venv-torch-$torch_version
py=${PYTHON:-python3}
mkdir -p "$cache"
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  echo "setup-torch: installing torch==$torch_version into $venv (one time)" >&2
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet "torch==$torch_version" numpy >&2
fi
torch_dir=$("$venv/bin/python" -c "import torch, os; print(os.path.dirname(torch.__file__))")
# The link view: tch links libtorch, which pulls libtorch_cuda and every CUDA library. We link
# only the CPU library (libtorch.so -> libtorch_cpu.so) and load libtorch_cuda.so at run time
# when a recipe asks for CUDA, so the binary builds and starts on machines without a GPU stack.
view=$cache/libtorch-cpu-link-$torch_version
mkdir -p "$view/lib"
ln -sfn "$torch_dir/include" "$view/include"
ln -sfn "$torch_dir/lib/libtorch_cpu.so" "$view/lib/libtorch.so"
ln -sfn "$torch_dir/lib/libtorch_cpu.so" "$view/lib/libtorch_cpu.so"
ln -sfn "$torch_dir/lib/libc10.so" "$view/lib/libc10.so"
ln -sfn "$torch_dir/lib/libgomp.so.1" "$view/lib/libgomp.so"
echo "$torch_version" > "$view/build-version"
echo "FD_VENV=$venv"
echo "FD_TORCH_LIB=$torch_dir/lib"
echo "FD_LIBTORCH_VIEW=$view"
