# Everything a fresh machine needs goes through these targets.
SHELL := /bin/bash
FLIGHTDECK_CACHE ?= $(HOME)/.cache/flightdeck
export FLIGHTDECK_CACHE
TORCH_ENV := $(FLIGHTDECK_CACHE)/torch-env.mk

# scripts/setup-torch.sh installs PyTorch once into the cache and prints the paths.
$(TORCH_ENV): scripts/setup-torch.sh
	@mkdir -p $(FLIGHTDECK_CACHE)
	scripts/setup-torch.sh > $@.tmp && mv $@.tmp $@

-include $(TORCH_ENV)
export LIBTORCH = $(FD_LIBTORCH_VIEW)
export FD_TORCH_LIB
export FD_VENV

.PHONY: build
build: $(TORCH_ENV)
	cargo build --release
