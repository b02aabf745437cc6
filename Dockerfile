# syntax=docker/dockerfile:1
# The operator image: Python 3.11, the operator's wheel and its hash-locked dependencies in a
# virtualenv, no pip, no compiler, non-root, with an SBOM (CycloneDX) and OCI labels.
#   docker build -t multislice-operator:0.1.0 .
#   docker run --rm multislice-operator:0.1.0 --help
#   make image    # buildah, where there is no Docker engine (docs/install.md, "The image")
# Runs with a read-only root filesystem: nothing is written outside /tmp (mount an emptyDir
# there, as the Helm chart does). Health: the operator serves /healthz and /readyz on
# MSJ_HEALTH_PORT, by default http://0.0.0.0:8080/healthz; metrics over HTTPS with Kubernetes
# authentication on MSJ_METRICS_PORT (8000).
#
# The base, pinned by digest (the multi-arch index of python:3.11-slim; a tag moves, a digest
# does not). Both stages must be the same Python at the same path: the virtualenv made in the
# builder links to the base's interpreter. BUILDER_IMAGE is the runtime base plus pip and venv
# (the official image has both already); hack/image-base.sh makes a pair from Debian's packages.
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
ARG BUILDER_IMAGE=docker.io/library/python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
# The Go toolchain for JobSet's in-place restart agent (the agent stage): the Go that
# hack/tools/jobset/go.mod names.
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm

# ---- builder: build tools, the wheel, the runtime virtualenv, the SBOM (nothing here but the
# virtualenv and the SBOM reaches the runtime stage)
FROM ${BUILDER_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src

# Build tools in a virtualenv of their own, from their hash lock (pip, setuptools, wheel,
# cyclonedx-bom): `--require-hashes` refuses any file whose sha256 the lock does not list.
COPY image/build-requirements.lock image/
RUN python3 -m venv /opt/build \
    && /opt/build/bin/python -m pip install --require-hashes --no-deps --only-binary=:all: \
       -r image/build-requirements.lock

# The runtime virtualenv, without pip: the operator's dependencies from image/requirements.lock
# (generated from pyproject.toml by `make lock`), binary wheels only, hashes checked.
COPY image/requirements.lock image/
RUN python3 -m venv --without-pip /opt/multislice-operator \
    && /opt/build/bin/pip --python /opt/multislice-operator/bin/python install \
       --require-hashes --no-deps --only-binary=:all: -r image/requirements.lock

# The package, as a wheel built with the locked setuptools (no build isolation: nothing
# unlocked is fetched); `pip check` fails the build if the lock drifted from pyproject.toml.
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && /opt/build/bin/pip --python /opt/multislice-operator/bin/python install \
       --no-deps --no-index /wheels/*.whl \
    && /opt/build/bin/pip --python /opt/multislice-operator/bin/python check

# jemalloc (Debian's libjemalloc2, the base's own Debian release) for the runtime stage, which
# installs nothing itself: the library and its licence are copied there.
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libjemalloc2 \
    && mkdir -p /opt/jemalloc \
    && cp "$(find /usr/lib -name libjemalloc.so.2 -print -quit)" /opt/jemalloc/libjemalloc.so.2 \
    && cp /usr/share/doc/libjemalloc2/copyright /opt/jemalloc/copyright \
    && rm -rf /var/lib/apt/lists/*

# The SBOM of what the runtime stage ships: every Python distribution in the virtualenv, with
# versions, licences and hashes (CycloneDX JSON). The OS packages are the base's (its digest
# is in the labels).
RUN mkdir -p /sbom \
    && /opt/build/bin/cyclonedx-py environment --output-format JSON --output-reproducible \
       --mc-type application --pyproject pyproject.toml --output-file /sbom/multislice-operator.cdx.json \
       /opt/multislice-operator/bin/python

# ---- agent: JobSet's in-place restart agent (sigs.k8s.io/jobset/cmd/in-place-restart-agent, at
# the version hack/tools/jobset/go.mod requires), built as hack/build-bins.sh builds it: static,
# trimmed, version-stamped. The runtime stage puts it where JobSet's own agent image does
# (/in-place-restart-agent), so the operator can run its own image as the pods' agent sidecar.
FROM ${GO_IMAGE} AS agent
WORKDIR /src
COPY hack/tools/jobset/go.mod hack/tools/jobset/go.sum ./
RUN version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/jobset" { print $3 }' go.mod)" \
    && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
       -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=${version}" \
       -o /in-place-restart-agent sigs.k8s.io/jobset/cmd/in-place-restart-agent

# ---- runtime
FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=https://github.com/multislice-operator/multislice-operator
LABEL org.opencontainers.image.title="multislice-operator" \
      org.opencontainers.image.description="Kubernetes operator that runs Cloud TPU Multislice training on GKE" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}" \
      dev.multislice.sbom="/usr/share/doc/multislice-operator/sbom.cdx.json"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/multislice-operator/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# The operator never installs anything at run time: the base's pip, setuptools and wheel go,
# and so do the wheels ensurepip would reinstall them from. No apt-get here: no compiler.
RUN if python3 -c "import pip" 2>/dev/null; then \
      python3 -m pip uninstall --yes --no-input pip setuptools wheel; \
    fi \
    && rm -rf "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')/ensurepip/_bundled" \
    && if python3 -c "import pip" 2>/dev/null || python3 -c "import setuptools" 2>/dev/null; then \
      echo "pip or setuptools is still importable" >&2; exit 1; \
    fi

COPY --from=builder /opt/multislice-operator /opt/multislice-operator
COPY --from=builder /sbom/multislice-operator.cdx.json /usr/share/doc/multislice-operator/sbom.cdx.json

COPY --from=builder /opt/jemalloc/libjemalloc.so.2 /usr/local/lib/libjemalloc.so.2
COPY --from=builder /opt/jemalloc/copyright /usr/share/doc/libjemalloc2/copyright

# The in-place restart agent, for the pods' agent sidecar (command: ["/in-place-restart-agent"]).
COPY --from=agent /in-place-restart-agent /in-place-restart-agent

# Memory that comes back after a burst: every Python object in jemalloc (PYTHONMALLOC=malloc),
# which returns a freed page to the kernel within a second (dirty_decay_ms, from a background
# thread), instead of CPython's 1 MiB arenas, which stay resident while one object in them
# lives. A 200-job load left +17.2 and +18.0 MiB over idle this way against +26.5 MiB with
# glibc's malloc and two arenas, +37.5 MiB with its defaults (docs/benchmarks.md, "Memory after
# a Managed lifecycle load"; benchmarks/lifecycle_memory.py runs the operator with this ENV).
ENV LD_PRELOAD=/usr/local/lib/libjemalloc.so.2 \
    PYTHONMALLOC=malloc \
    MALLOC_CONF=background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0

# A passwd entry for uid 65532 (getpass and kopf's peer identity look the user up). Not named
# "operator": Debian's base-passwd already has that group (gid 37), and groupadd fails on it.
RUN groupadd --gid 65532 multislice \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin multislice
USER 65532:65532
WORKDIR /tmp

EXPOSE 8000 8080
ENTRYPOINT ["multislice-operator", "run"]
