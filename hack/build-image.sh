#!/usr/bin/env bash
# Build the operator image with buildah from the production Dockerfile (no Docker engine needed).
#
#   hack/build-image.sh [--debian-base] [--tag REF] [--base IMAGE --builder-base IMAGE]
#
# --debian-base   build on the bases hack/image-base.sh makes from Debian's packages (python3
#                 3.11 from bookworm), for machines that cannot reach the base image's registry
# default         the Dockerfile's own base, pinned by digest (python:3.11-slim@sha256:...)
# --tag           the image reference (default localhost/multislice-operator:<version>)
#
# RUN steps run with --isolation chroot (BUILDAH_ISOLATION overrides): the default OCI runtime
# needs cgroup controllers a nested sandbox does not have ("cgroups in hybrid mode not supported").
# Where downloads go through a TLS-intercepting proxy, the host's CA bundle (PIP_CERT or
# SSL_CERT_FILE) is bind-mounted over the build container's during RUN steps only: it is not in
# any layer. Prints the image reference on success; the log goes to stderr.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
tag=localhost/multislice-operator:$version
base="" builder=""
while (($#)); do
  case $1 in
    --debian-base) mapfile -t bases < <(hack/image-base.sh); base=${bases[0]} builder=${bases[1]} ;;
    --base) base=$2; shift ;;
    --builder-base) builder=$2; shift ;;
    --tag) tag=$2; shift ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

args=(--build-arg "VERSION=$version")
if git rev-parse --git-dir >/dev/null 2>&1; then
  revision=$(git rev-parse HEAD)
  epoch=$(git log -1 --format=%ct)
  git diff --quiet HEAD -- Dockerfile image operator pyproject.toml README.md || revision+="-dirty"
  args+=(--build-arg "REVISION=$revision"
         --build-arg "CREATED=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)")
fi
[[ -n $base ]] && args+=(--build-arg "PYTHON_IMAGE=$base")
[[ -n $builder ]] && args+=(--build-arg "BUILDER_IMAGE=$builder")
ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [[ -n $ca && -f $ca ]]; then
  echo "build-image: RUN steps trust $ca (bind-mounted, not stored in the image)" >&2
  args+=(--volume "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
fi

echo "build-image: buildah bud -t $tag (base ${base:-as the Dockerfile pins it})" >&2
buildah bud --isolation "${BUILDAH_ISOLATION:-chroot}" --layers --format oci \
  "${args[@]}" -f Dockerfile -t "$tag" . >&2
echo "$tag"
