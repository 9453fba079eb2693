# Source this to run cargo by hand with the same libtorch as `make`: `source scripts/env.sh`.
FLIGHTDECK_CACHE=${FLIGHTDECK_CACHE:-$HOME/.cache/flightdeck}
eval "$(scripts/setup-torch.sh)"
export LIBTORCH=$FD_LIBTORCH_VIEW FD_TORCH_LIB FD_VENV FLIGHTDECK_CACHE
