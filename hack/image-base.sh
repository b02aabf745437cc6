#!/usr/bin/env bash
# Base images for building the operator image where the usual base registry is not reachable:
# Debian bookworm's own python3 (3.11, as python:3.11-slim), made with debootstrap from Debian's
# packages and imported into buildah's storage. Two of them, as the Dockerfile's two stages want:
#   localhost/msj-base/python:3.11-bookworm        runtime: python3, ca-certificates, no pip
#   localhost/msj-base/python-build:3.11-bookworm  builder: the same plus python3-venv (ensurepip)
# Reused when present (--force rebuilds). Prints the two references, one a line.
# Needs root (debootstrap, buildah); hack/image-deps.sh installs the tools.
set -euo pipefail
shopt -s inherit_errexit

SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${MSJ_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multislice-operator/image}
RUNTIME_REF=localhost/msj-base/python:3.11-$SUITE
BUILD_REF=localhost/msj-base/python-build:3.11-$SUITE
FORCE=0
[[ ${1:-} == --force ]] && FORCE=1

log() { echo "image-base: $*" >&2; }

# debootstrap once (the runtime package set), then the builder's extra packages into a copy.
rootfs() {
  local dir=$CACHE/rootfs-runtime
  if [[ $FORCE == 1 || ! -f $dir/.done ]]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    log "debootstrap $SUITE (minbase + python3) into $dir"
    debootstrap --variant=minbase --include=python3,ca-certificates \
      "$SUITE" "$dir" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    touch "$dir/.done"
  fi
}

# A rootfs as an image: /dev, /proc, /sys stay empty (the runtime mounts them), apt lists go.
import() {
  local dir=$1 ref=$2 tar=$CACHE/$3.tar
  tar --numeric-owner --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* \
    --exclude=./var/lib/apt/lists/* --exclude=./var/cache/apt/* --exclude=./.done \
    -C "$dir" -cf "$tar" .
  local ctr
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 \
    --label "org.opencontainers.image.description=Debian $SUITE python3 from debootstrap" "$ctr"
  buildah commit --quiet --rm "$ctr" "$ref" >/dev/null
  rm -f "$tar"
}

have() { buildah inspect --type image "$1" >/dev/null 2>&1; }

mkdir -p "$CACHE"
if [[ $FORCE == 1 ]] || ! have "$RUNTIME_REF" || ! have "$BUILD_REF"; then
  rootfs
  import "$CACHE/rootfs-runtime" "$RUNTIME_REF" runtime
  build=$CACHE/rootfs-build
  rm -rf "$build"
  cp -a "$CACHE/rootfs-runtime" "$build"
  log "apt-get install python3-venv in a copy (the builder base)"
  mount --bind /proc "$build/proc"
  trap 'umount "$build/proc" 2>/dev/null || true' EXIT
  chroot "$build" apt-get install -y -qq --no-install-recommends python3-venv \
    >"$CACHE/apt-build.log" 2>&1 || { tail -20 "$CACHE/apt-build.log" >&2; exit 1; }
  umount "$build/proc"
  trap - EXIT
  import "$build" "$BUILD_REF" build
  rm -rf "$build"
fi
echo "$RUNTIME_REF"
echo "$BUILD_REF"
