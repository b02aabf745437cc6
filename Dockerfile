# syntax=docker/dockerfile:1
# The operator image: slim Python, the operator's wheel plus its pinned dependencies, non-root.
#   docker build -t multislice-operator:0.1.0 .
#   docker run --rm multislice-operator:0.1.0 --help
# Runs with a read-only root filesystem: nothing is written outside /tmp (mount an emptyDir
# there, as the Helm chart does). Health: the operator serves /healthz and /readyz on
# MSJ_HEALTH_PORT, by default http://0.0.0.0:8080/healthz; metrics over HTTPS with Kubernetes
# authentication on MSJ_METRICS_PORT (8000).
ARG PYTHON_IMAGE=python:3.11-slim

# ---- builder: the wheel only (setuptools and wheel stay in this stage)
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---- runtime
FROM ${PYTHON_IMAGE}

# Must equal the pins in pyproject.toml [project].dependencies: tests/integration/test_image.py
# checks them.
ARG KOPF_VERSION=1.45.2
ARG PYDANTIC_VERSION=2.14.4
ARG PYYAML_VERSION=6.0.4
ARG PROMETHEUS_CLIENT_VERSION=0.26.0
ARG GOOGLE_CLOUD_CONTAINER_VERSION=2.67.0
ARG GOOGLE_CLOUD_TPU_VERSION=1.28.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies in their own layer (binary wheels only: no compiler in this image), so a code
# change does not reinstall them.
RUN pip install --only-binary=:all: \
      "kopf==${KOPF_VERSION}" \
      "pydantic==${PYDANTIC_VERSION}" \
      "PyYAML==${PYYAML_VERSION}" \
      "prometheus-client==${PROMETHEUS_CLIENT_VERSION}" \
      "google-cloud-container==${GOOGLE_CLOUD_CONTAINER_VERSION}" \
      "google-cloud-tpu==${GOOGLE_CLOUD_TPU_VERSION}"

# The package alone; `pip check` fails the build if a pin above drifted from pyproject.toml.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-deps /wheels/*.whl && pip check

# A passwd entry for uid 65532 (getpass and kopf's peer identity look the user up).
RUN groupadd --gid 65532 operator \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin operator
USER 65532:65532
WORKDIR /tmp

EXPOSE 8000 8080
ENTRYPOINT ["multislice-operator", "run"]
