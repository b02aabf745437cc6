# multislice-operator: every entry point a developer or CI needs.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test fuzz lint fmt bins node-bins next-bins cluster-up cluster-down demo bench crd kube-schema clean lock images image image-test krew

install: $(STAMP)

# The image's lock first (hashes checked), so the tests run the versions the image ships. The
# workload's tpu extra is libtpu (a 213 MB wheel, kept in pip's cache like JAX's): the TPU
# compiler the compile lane (tests/workload/test_tpu_compile.py) runs on this CPU.
$(STAMP): pyproject.toml local/pyproject.toml workload/pyproject.toml image/requirements.lock
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes --no-deps -r image/requirements.lock
	$(BIN)/pip install --quiet -e '.[dev]' -e ./local -e './workload[test,tpu]'
	@touch $(STAMP)

# Two layers (tests/README.md), at the same time (hack/run-tests.sh): the unit layer on UNIT_JOBS
# pytest-xdist workers in the background, beside the control-plane layer on CP_JOBS, one group
# per worker at a time (--dist loadgroup; the groups are set in tests/conftest.py). The
# control-plane layer mostly waits on controllers, so the unit layer's computing (JAX) fits in
# the idle cores. CP_JOBS=0 runs both in one process each, one after the other. Both always run;
# the exit status is the first failure's. The binaries are built first when missing (cold: minutes).
UNIT_JOBS ?= 1
CP_JOBS ?= 4
test: install
	@UNIT_JOBS=$(UNIT_JOBS) CP_JOBS=$(CP_JOBS) hack/run-tests.sh

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

# The real nodes' binaries (kubelet, containerd, runc, CNI, CoreDNS: docs/real-nodes.md); make
# test builds them where the host can run real nodes.
node-bins:
	hack/build-bins.sh --nodes

# The newest Kubernetes lane's kube-apiserver and kube-scheduler (1.37, hack/README.md); make test
# builds them after the control plane's.
next-bins:
	hack/build-bins.sh --next

cluster-up: install bins
	$(BIN)/python -m multislice_local.controlplane up --profile $(PROFILE) --detach

cluster-down: install
	$(BIN)/python -m multislice_local.controlplane down --profile $(PROFILE)

# The local default, narrated: SCENARIO=restart|stockout|preemption|fatal|delete|queue|maintenance|elastic|preflight|fallback|inplace|ironwood|multicluster,
# KEEP=1 to stay up. SCENARIO=real: real nodes, the chart and both images (root; builds
# node-bins and the images first when missing: docs/real-nodes.md).
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

# The pod template's Kubernetes schema (api/kubeschema.json) from the OpenAPI of the Kubernetes
# version hack/tools/kube/go.mod pins (tests/integration/test_kubeschema_source.py checks it).
kube-schema: install
	$(BIN)/python -m multislice_operator.api.kubeschema hack/tools/kube/go.mod

crd: install
	$(BIN)/multislice-operator crd > crds/multislice.dev_multislicejobs.yaml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# API reference generated from the models (tests/unit/test_docs.py fails when it is stale).
.PHONY: docs
docs: install
	$(BIN)/python -m multislice_operator.api.docs > docs/api.md
	$(BIN)/python -m multislice_operator.settings docs/install.md
	$(BIN)/python -c "from multislice_operator.reconcile.reasons import write_table; write_table('docs/failures.md')"
	$(BIN)/python -c "from multislice_operator.cli.main import write_exit_codes; write_exit_codes('docs/cli.md')"
	$(BIN)/python -c "import sys; from multislice_operator.api.docs import write_cause_lists; write_cause_lists(*sys.argv[1:])" README.md docs/*.md

# The images' hash locks, from pyproject.toml's operator extra, image/build-requirements.in and
# workload/pyproject.toml with its gcs extra (tests/integration/test_image.py and
# tests/unit/test_images.py fail when they disagree). The workload's is for the image's platform
# only (CPython 3.11, manylinux with Debian bookworm's glibc). UPGRADE=1 moves unpinned ones.
UV_COMPILE = cd image && ../$(BIN)/uv pip compile --quiet --generate-hashes \
	--python-version 3.11 --custom-compile-command "make lock" $(if $(UPGRADE),--upgrade,)
lock: install
	$(UV_COMPILE) --universal ../pyproject.toml --extra operator -o requirements.lock
	$(UV_COMPILE) --universal build-requirements.in -o build-requirements.lock
	$(UV_COMPILE) --python-platform x86_64-manylinux_2_36 ../workload/pyproject.toml --extra gcs \
		-o workload-requirements.lock

# The operator and workload images, built offline into OCI archives (no Docker, no registry, no
# base image; Debian and PyPI packages, cached by content hash; hack/README.md, "Images"). Prints
# each image's reference, digest and archive; `ctr -n k8s.io images import <archive>` loads one.
images: install
	$(BIN)/multislice-local image build operator workload

# The operator image with buildah from the Dockerfile (docs/install.md; `make images` needs no
# buildah, no root and no registry, and makes both images as archives). BASE=debian (default here: the base
# registry is unreachable) builds on Debian's python3 made by debootstrap; BASE=dockerfile on the
# Dockerfile's digest-pinned python:3.11-slim. Needs root.
BASE ?= debian
IMAGE ?= localhost/multislice-operator:dev
image:
	hack/image-deps.sh
	hack/build-image.sh $(if $(filter debian,$(BASE)),--debian-base,) --tag $(IMAGE)
	@buildah images $(IMAGE)

# The built image's own tests (tests/image; not in `make test`: minutes, root, buildah).
image-test: install image
	MSJ_IMAGE=$(IMAGE) $(BIN)/python -m pytest -q -s tests/image

# The krew archive of kubectl msj (dist/) and its uri and sha256 in plugins/msj.yaml.
krew: install
	hack/krew-archive.sh
