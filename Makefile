# multislice-operator: every entry point a developer or CI needs.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test fuzz lint fmt bins cluster-up cluster-down demo bench crd clean

install: $(STAMP)

$(STAMP): pyproject.toml local/pyproject.toml workload/pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./local -e './workload[test]'
	@touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

# The decide() state machine (tests/unit/test_decide_machine.py), searched much longer than
# make test does, from a fresh seed each run (a failure prints how to reproduce it):
# FUZZ_EXAMPLES for the Managed job (the queued job gets 40%), FUZZ_STEPS per example.
FUZZ_EXAMPLES ?= 20000
FUZZ_STEPS ?= 30
fuzz: install
	MACHINE_EXAMPLES=$(FUZZ_EXAMPLES) MACHINE_STEPS=$(FUZZ_STEPS) MACHINE_RANDOM=1 \
		MACHINE_SHRINK_SECONDS=300 $(BIN)/python -m pytest -q --timeout=0 \
		tests/unit/test_decide_machine.py

lint: install
	$(BIN)/ruff check operator local workload tests benchmarks
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff format operator local workload tests benchmarks

# Local Kubernetes built from Go modules (hack/README.md). PROFILE=api|cluster|kueue.
PROFILE ?= cluster

bins:
	hack/build-bins.sh

cluster-up: install bins
	$(BIN)/python -m multislice_local.controlplane up --profile $(PROFILE) --detach

cluster-down: install
	$(BIN)/python -m multislice_local.controlplane down --profile $(PROFILE)

# The local default, narrated: SCENARIO=restart|stockout|preemption|fatal|delete|queue|maintenance, KEEP=1
# to stay up.
# CLUSTER=kind runs the same demo on a kind cluster (needs Docker and kind; see docs/demo.md).
SCENARIO ?= restart
CLUSTER ?= local
demo: install bins
	$(BIN)/multislice-local demo --scenario $(SCENARIO) --cluster $(CLUSTER) \
		$(if $(KEEP),--keep,) $(DEMO_ARGS)

# Operator benchmarks against local control planes (docs/benchmarks.md), then the workload's.
# BENCH_ARGS="--quick" for a few minutes; "--skip-workload", "--only reconcile,gang".
bench: install bins
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

crd: install
	$(BIN)/multislice-operator crd > crds/multislice.dev_multislicejobs.yaml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# API reference generated from the models (tests/unit/test_docs.py fails when it is stale).
.PHONY: docs
docs: install
	$(BIN)/python -m multislice_operator.api.docs > docs/api.md
	$(BIN)/python -m multislice_operator.settings docs/install.md
