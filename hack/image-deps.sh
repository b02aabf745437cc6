#!/usr/bin/env bash
# The tools `make image` needs, from Debian's packages: buildah (builds the Dockerfile without a
# Docker engine) and debootstrap (the Debian-made base, hack/image-base.sh). Says what it
# installs; does nothing when both are present.
set -euo pipefail
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap)
((${#missing[@]})) || exit 0
echo "image-deps: apt-get install ${missing[*]}" >&2
if [[ $(id -u) != 0 ]]; then
  echo "image-deps: needs root (apt-get); install ${missing[*]} and rerun" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
