# Everything a fresh machine needs goes through these targets: `make demo`, `make test`.
SHELL := /bin/bash
FLIGHTDECK_CACHE ?= $(HOME)/.cache/flightdeck
export FLIGHTDECK_CACHE
# Cargo's build directory lives in the cache too, so a fresh clone (CI) reuses compiled
# dependencies; `make build` copies the binary to target/release/flightdeck.
export CARGO_TARGET_DIR ?= $(FLIGHTDECK_CACHE)/target
TORCH_ENV := $(FLIGHTDECK_CACHE)/torch-env.mk
BIN := target/release/flightdeck
DEMO_DB ?= $(FLIGHTDECK_CACHE)/demo-db

.PHONY: all build demo demo-rl demo-torch demo-headless test check deps torch python-deps clean-cache fmt fmt-check lint

all: build

# PyTorch 2.11.0 from the Python package index, installed once into the cache.
$(TORCH_ENV): scripts/setup-torch.sh
	@mkdir -p $(FLIGHTDECK_CACHE)
	scripts/setup-torch.sh > $@.tmp && mv $@.tmp $@

torch: $(TORCH_ENV)

-include $(TORCH_ENV)
export LIBTORCH = $(FD_LIBTORCH_VIEW)
export FD_TORCH_LIB
export FD_VENV

# Debian packages the build and the tests need, installed only when missing.
deps:
	@scripts/install-deps.sh

# py-spy for Python ranks' stacks, linked into $(FLIGHTDECK_CACHE)/bin, first on PATH below.
PYSPY := $(FLIGHTDECK_CACHE)/bin/py-spy
$(PYSPY): scripts/setup-pyspy.sh $(TORCH_ENV)
	FD_VENV=$(FD_VENV) scripts/setup-pyspy.sh
export PATH := $(FLIGHTDECK_CACHE)/bin:$(PATH)

build: deps $(TORCH_ENV) $(PYSPY)
	cargo build --release
	@mkdir -p target/release
	@if [ "$$(realpath -m $(CARGO_TARGET_DIR))" != "$$(realpath -m target)" ]; then \
		cp -f $(CARGO_TARGET_DIR)/release/flightdeck $(BIN).tmp && mv -f $(BIN).tmp $(BIN); fi
	@echo "built $(BIN)"

# The main job: the cockpit on a local 2-rank run of the default recipe (q goes back to the
# runs list, q again quits; the run goes on without the cockpit). Outside a terminal it follows
# the run headless.
demo: build
	$(BIN) --db $(DEMO_DB) run recipes/tiny-gpt.toml --ranks-per-node 2

# A real PyTorch DDP job (gloo, CPU, the build's PyTorch) in the cockpit: its printed log dicts
# become each rank's loss and step time (docs/real-jobs.md, docs/adapters.md).
demo-torch: build
	$(BIN) --db $(DEMO_DB) run recipes/torch-ddp.toml \
		--set 'command.argv=["$(FD_VENV)/bin/python", "../assets/examples/torch_ddp.py", "--steps", "200"]'

# Post-training as a chain on 2 local ranks: pretrain tiny-gpt, fine-tune it on arithmetic
# questions (sft-arith), then GRPO from that checkpoint in the cockpit (the rl layout: reward,
# KL, completion length, the time split, samples). Each stage starts from the newest run of the
# one before (init.from names a run); the history shows the chain. The fine-tune stops at 150
# of its 400 steps so that GRPO has answers left to learn (docs/decisions.md, GRPO).
demo-rl: build
	$(BIN) --db $(DEMO_DB) run recipes/tiny-gpt.toml --headless
	$(BIN) --db $(DEMO_DB) run recipes/sft-arith.toml --headless --set train.steps=150 --set checkpoint.every=50
	$(BIN) --db $(DEMO_DB) run recipes/grpo-arith.toml

# The same run with one progress line per interval instead of the cockpit.
demo-headless: build
	$(BIN) --db $(DEMO_DB) run recipes/tiny-gpt.toml --headless --ranks-per-node 2

# The whole suite: unit tests, then the end-to-end tests that drive the real binary.
test: build bench-tensorboard python-deps
	cargo test --release -- --test-threads=2
	cargo test --release --bench fdbench_tests

# The quick loop: format, lints (warnings are errors; `unwrap` is denied outside tests in
# src/lib.rs), and the unit tests, without the end-to-end suite.
check: fmt-check lint
	cargo test --release --lib
	cargo test --release --bench fdbench_tests

fmt:
	cargo fmt --all

fmt-check:
	cargo fmt --all --check

lint: deps $(TORCH_ENV)
	cargo clippy --release --all-targets -- -D warnings

# Benchmarks against their references; results land in docs/benchmarks.md. Never part of
# `make test`. BENCH_REPS / BENCH_HISTORY_REPS change the repetitions per side.
.PHONY: bench bench-train bench-allreduce bench-overhead bench-history bench-fanout bench-slurm bench-tensorboard bench-parselog bench-torch bench-handshake bench-generate bench-transformers bench-export bench-charts
bench: build bench-tensorboard bench-transformers
	scripts/bench.sh all

# Only redraw docs/benchmarks/*.svg|png from docs/benchmarks.md's tables (every bench target
# does this after writing its section).
bench-charts: build
	scripts/bench.sh charts

bench-train: build
	scripts/bench.sh train

bench-parselog: build
	scripts/bench.sh parselog

bench-torch: build
	scripts/bench.sh torch

bench-allreduce: build
	scripts/bench.sh allreduce

bench-handshake: build
	scripts/bench.sh handshake

bench-overhead: build
	scripts/bench.sh overhead

bench-history: build bench-tensorboard
	scripts/bench.sh history

bench-generate: build bench-transformers
	scripts/bench.sh generate

# export and report of the history benchmark's 2.56 M points: time and peak memory (printed).
bench-export: build
	scripts/bench-export.sh

# pdsh and sshd come from scripts/install-deps.sh (make deps, which make build runs).
bench-fanout: build
	scripts/bench.sh fanout

# 1,024 light ranks on 128 fake Slurm nodes, Flightdeck against srun alone (as root; ~15 min;
# not part of make bench).
bench-slurm: build
	scripts/bench.sh slurm

# The Hugging Face Trainer and TRL, for the tests of real Trainer and GRPO jobs
# (assets/examples/hf_trainer.py, trl_grpo.py): into the PyTorch venv, once. TRL 1.16.0 needs
# transformers >= 4.56.2, accelerate >= 1.10.1 and pyarrow >= 21, which these pins meet.
python-deps: $(TORCH_ENV)
	@$(FD_VENV)/bin/python -c 'import transformers, accelerate, pyarrow, trl' 2>/dev/null || \
		$(FD_VENV)/bin/pip install --quiet 'transformers==5.25.0' 'accelerate==1.16.0' 'pyarrow==26.0.1' 'trl==1.16.0'

# TensorBoard's own writer and loader, for the history reference: into the PyTorch venv, once.
bench-tensorboard: $(TORCH_ENV)
	@$(FD_VENV)/bin/python -c 'import tensorboard' 2>/dev/null || $(FD_VENV)/bin/pip install --quiet 'tensorboard==2.21.0'

# transformers' generate, the generation reference: into the PyTorch venv, once (the same pin
# as python-deps).
bench-transformers: $(TORCH_ENV)
	@$(FD_VENV)/bin/python -c 'import transformers' 2>/dev/null || $(FD_VENV)/bin/pip install --quiet 'transformers==5.25.0'
