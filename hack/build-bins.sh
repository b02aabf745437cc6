#!/usr/bin/env bash
# Build the local control-plane binaries, and the real nodes' (kubelet, containerd, runc, CNI
# plugins, CoreDNS, pause, the project's TPU device plugin and test program), from pinned Go
# modules into versioned caches outside the clone. Builds only what is missing, so a warm run is a
# no-op.
#
#   hack/build-bins.sh             build the control plane's binaries that are missing, print one
#                                  progress line per component
#   hack/build-bins.sh --nodes     the real nodes' instead (hack/README.md, "Real nodes")
#   hack/build-bins.sh --next      the newest Kubernetes lane's kube-apiserver and kube-scheduler
#                                  instead (hack/README.md, "The newest Kubernetes lane")
#   hack/build-bins.sh --all       the control plane's and the real nodes' (--all --next: and the
#                                  newest lane's)
#   hack/build-bins.sh --only NAME build that one control-plane component if missing (the image
#                                  builder asks for in-place-restart-agent so)
#   hack/build-bins.sh --print-dir print the control plane's cache dir for the pinned versions
#   hack/build-bins.sh --print-next-dir
#                                  print the newest Kubernetes lane's cache dir
#   hack/build-bins.sh --print-node-dirs
#                                  print the real nodes' cache dir, then the dir of the project's
#                                  own node programs (keyed by a hash of local/go)
#   hack/build-bins.sh --force     rebuild everything selected
#   hack/build-bins.sh --module-dirs
#                                  download the upstream modules whose files the build copies
#                                  (JobSet, Kueue) and print their directories (tests use it)
#
# Env: MULTISLICE_BIN_CACHE overrides the cache root ($HOME/.cache/multislice-operator/bin).
set -euo pipefail
# Without this a failing command inside $(...) does not stop the script: the substitution yields
# an empty string and the script carries on with it (set -u does not catch an empty value).
shopt -s inherit_errexit

HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS="$HACK/tools"

# The pinned versions come from the tools modules' go.mod files: one source of truth.
modver() { # <tools dir> <module path>
  # "m vX [// indirect]" inside a require block, or "require m vX" on one line
  awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' \
    "$TOOLS/$1/go.mod"
}
KUBE_VERSION="$(modver kube k8s.io/kubernetes)"
ETCD_VERSION="$(modver kube go.etcd.io/etcd/server/v3)"
JOBSET_VERSION="$(modver jobset sigs.k8s.io/jobset)"
KWOK_VERSION="$(modver kwok sigs.k8s.io/kwok)"
HELM_VERSION="$(modver helm helm.sh/helm/v3)"
KUEUE_VERSION="$(modver kueue sigs.k8s.io/kueue)"
# The compatibility lane: the oldest JobSet and Kueue controllers the operator supports, run on
# the same Kubernetes (tests/compat).
JOBSET_COMPAT_VERSION="$(modver jobset-compat sigs.k8s.io/jobset)"
KUEUE_COMPAT_VERSION="$(modver kueue-compat sigs.k8s.io/kueue)"
# Helm's default Kubernetes version comes from the client-go it is built with, as upstream's
# Makefile stamps it (client-go v0.X.Y -> Kubernetes 1.X); without it `helm template` assumes v1.20.
HELM_KUBE_MINOR="$(modver helm k8s.io/client-go)"
HELM_KUBE_MINOR="${HELM_KUBE_MINOR#v0.}"
HELM_KUBE_MINOR="${HELM_KUBE_MINOR%%.*}"
for v in KUBE_VERSION ETCD_VERSION JOBSET_VERSION KWOK_VERSION HELM_VERSION KUEUE_VERSION \
  JOBSET_COMPAT_VERSION KUEUE_COMPAT_VERSION HELM_KUBE_MINOR; do
  [[ -n "${!v}" ]] || { echo "build-bins: cannot read $v from hack/tools/*/go.mod" >&2; exit 1; }
done

# The newest Kubernetes lane (tests using the kube_next fixture): its kube-apiserver and
# kube-scheduler, in a cache dir of their own keyed by their version (the control plane's KEY is
# unchanged); the lane runs them with the main lane's etcd, kube-controller-manager, kubectl and
# controllers.
NEXT_KUBE_VERSION="$(modver kube-next k8s.io/kubernetes)"
[[ -n "$NEXT_KUBE_VERSION" ]] || {
  echo "build-bins: cannot read NEXT_KUBE_VERSION from hack/tools/kube-next/go.mod" >&2
  exit 1
}

# The real nodes' components, in a cache dir of their own (the control plane's KEY is unchanged).
CONTAINERD_VERSION="$(modver containerd github.com/containerd/containerd/v2)"
RUNC_VERSION="$(modver runc github.com/opencontainers/runc)"
CNI_VERSION="$(modver cni github.com/containernetworking/plugins)"
COREDNS_VERSION="$(modver coredns github.com/coredns/coredns)"
for v in CONTAINERD_VERSION RUNC_VERSION CNI_VERSION COREDNS_VERSION; do
  [[ -n "${!v}" ]] || { echo "build-bins: cannot read $v from hack/tools/*/go.mod" >&2; exit 1; }
done

KEY="k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_jobset-${JOBSET_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_kueue-${KUEUE_VERSION}"
KEY+="_compat-jobset-${JOBSET_COMPAT_VERSION}-kueue-${KUEUE_COMPAT_VERSION}"
ROOT="${MULTISLICE_BIN_CACHE:-$HOME/.cache/multislice-operator/bin}"
OUT="$ROOT/$KEY"

# runc is linked with libseccomp from Debian's libseccomp-dev (its version is recorded in
# VERSIONS, not keyed: Debian's security updates replace it in place).
NODE_KEY="kubelet-${KUBE_VERSION}_containerd-${CONTAINERD_VERSION}_runc-${RUNC_VERSION}-seccomp"
NODE_KEY+="_cni-${CNI_VERSION}_coredns-${COREDNS_VERSION}"
NODE_OUT="$ROOT/nodes_$NODE_KEY"
NEXT_OUT="$ROOT/next_k8s-$NEXT_KUBE_VERSION"
# The project's own Go programs (local/go: the TPU device plugin, the test image's program) are
# keyed by their sources: names and contents of every file there.
# A copy of the tree that has no local/go (an image's build context) can still ask for the other
# directories and components.
LOCAL_GO="$HACK/../local/go"
LOCAL_HASH="no-local-go"
if [[ -d "$LOCAL_GO" ]]; then
  LOCAL_GO="$(cd "$LOCAL_GO" && pwd)"
  LOCAL_HASH="$(cd "$LOCAL_GO" &&
    find . -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) | LC_ALL=C sort |
    while read -r f; do echo "$f"; sha256sum <"$f"; done | sha256sum | cut -c1-16)"
fi
LOCAL_OUT="$NODE_OUT/local-$LOCAL_HASH"

FORCE=0
MODULE_DIRS=0
BUILD_CONTROL_PLANE=1
BUILD_NODES=0
BUILD_NEXT=0
ALL=0
ONLY=""
while (($#)); do
  case "$1" in
    --print-dir) echo "$OUT"; exit 0 ;;
    --print-node-dirs) printf '%s\n' "$NODE_OUT" "$LOCAL_OUT"; exit 0 ;;
    --print-next-dir) echo "$NEXT_OUT"; exit 0 ;;
    --force) FORCE=1 ;;
    --module-dirs) MODULE_DIRS=1 ;;
    --nodes) BUILD_NODES=1 ;;
    --next) BUILD_NEXT=1 ;;
    --all) ALL=1 ;;
    --only) ONLY="${2:?usage: $0 --only COMPONENT}"; shift ;;
    *)
      echo "usage: $0 [--nodes|--next|--all|--only COMPONENT] [--force] | --print-dir" \
        "| --print-node-dirs | --print-next-dir | --module-dirs" >&2
      exit 2
      ;;
  esac
  shift
done

# --nodes and --next build those instead of the control plane's, --all builds the control plane's
# and the real nodes' (and the newest lane's with --next), whatever the order of the flags.
if [[ $ALL == 1 ]]; then
  BUILD_NODES=1
elif [[ $BUILD_NODES == 1 || $BUILD_NEXT == 1 ]]; then
  BUILD_CONTROL_PLANE=0
fi

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$OUT"

# Without these stamps /version reports v0.0.0 and clients such as Helm refuse the server.
kube_ldflags() { # <version>
  local pkg flags="-s -w" minor="${1#v1.}"
  minor="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=1"
    flags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    flags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}
KUBE_LDFLAGS="$(kube_ldflags "$KUBE_VERSION")"

# The go command's own chatter (go: downloading ..., compiler output) goes to one log per
# component under $LOGS; its tail is printed only when that step fails.
LOGS="$OUT/logs"
mkdir -p "$LOGS"
NODE_LOGS="$NODE_OUT/logs"
# The components below, in build order, with the seconds each took on a cold machine (2 cores,
# empty module and build caches; hack/README.md): the progress lines say how far along the whole
# build is, so a first build that takes half an hour does not look stuck.
CONTROL_PLANE_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok
  kwokctl jobset-controller in-place-restart-agent kueue-controller helm jobset-controller-compat
  kueue-controller-compat)
# The real nodes' (a name with a slash is a file under its cache dir; local/ is $LOCAL_OUT).
NODE_COMPONENTS=(kubelet containerd containerd-shim-runc-v2 ctr runc cni/bridge cni/loopback
  cni/host-local coredns pause local/tpu-device-plugin local/msj-probe)
# The newest Kubernetes lane's (next/ is $NEXT_OUT).
NEXT_COMPONENTS=(next/kube-apiserver next/kube-scheduler)
declare -A COLD_SECONDS=( # measured 2026-12-02: cold `make test`, 2 cores (hack/README.md)
  [etcd]=96 [kube-apiserver]=353 [kube-controller-manager]=110 [kube-scheduler]=7 [kubectl]=44
  [kwok]=169 [kwokctl]=29 [jobset-controller]=182 [in-place-restart-agent]=20
  [kueue-controller]=410 [helm]=151
  [jobset-controller-compat]=182 [kueue-controller-compat]=410 # estimates: same modules, older
  # measured 2026-12-06, 2 cores, empty Go build cache (hack/README.md, "Real nodes")
  [kubelet]=60 [containerd]=140 [containerd-shim-runc-v2]=5 [ctr]=15 [runc]=40 [cni/bridge]=20
  [cni/loopback]=3 [cni/host-local]=3 [coredns]=180 [pause]=1 [local/tpu-device-plugin]=20
  [local/msj-probe]=5
  # measured 2026-12-07, 2 cores at a load of 3-9, empty module, build and binary caches
  # (hack/README.md, "The newest Kubernetes lane")
  [next/kube-apiserver]=423 [next/kube-scheduler]=80
)
COMPONENTS=()
[[ $BUILD_CONTROL_PLANE == 1 ]] && COMPONENTS+=("${CONTROL_PLANE_COMPONENTS[@]}")
[[ $BUILD_NODES == 1 ]] && COMPONENTS+=("${NODE_COMPONENTS[@]}")
[[ $BUILD_NEXT == 1 ]] && COMPONENTS+=("${NEXT_COMPONENTS[@]}")
if [[ -n $ONLY ]]; then
  [[ " ${CONTROL_PLANE_COMPONENTS[*]} " == *" $ONLY "* ]] || {
    echo "build-bins: no component $ONLY; one of: ${CONTROL_PLANE_COMPONENTS[*]}" >&2
    exit 2
  }
  COMPONENTS=("$ONLY") BUILD_CONTROL_PLANE=1 BUILD_NODES=0 BUILD_NEXT=0
fi
# dest <component>: the file a component is built into
dest() {
  case "$1" in
    local/*) echo "$LOCAL_OUT/${1#local/}" ;;
    next/*) echo "$NEXT_OUT/${1#next/}" ;;
    kubelet | containerd* | ctr | runc | cni/* | coredns | pause) echo "$NODE_OUT/$1" ;;
    *) echo "$OUT/$1" ;;
  esac
}
TOTAL=${#COMPONENTS[@]}
step=0
built=0
todo_seconds=0 # expected cold seconds of the components still to build
for c in "${COMPONENTS[@]}"; do
  [[ $FORCE == 0 && -x "$(dest "$c")" ]] || todo_seconds=$((todo_seconds + COLD_SECONDS[$c]))
done
done_seconds=0
minutes() { echo $((($1 + 30) / 60)); }

fail() { # <name> <log>
  echo "build-bins: $1 FAILED; last lines of $2:" >&2
  tail -n 40 "$2" >&2
  exit 1
}

# moddir <tools dir> <module path>: the module's directory in the module cache, downloading the
# version the tools module requires first. `go list -m -f '{{.Dir}}'` prints an empty line (exit 0)
# for a module not downloaded yet, so it cannot be used here; `go mod download -json` downloads it
# and fails loudly.
moddir() {
  local log="$LOGS/go-mod-download.log" json dir
  if ! json="$(cd "$TOOLS/$1" && go mod download -json "$2" 2>>"$log")"; then
    printf '%s\n' "$json" >>"$log" # with -json the go command reports the error on stdout
    fail "go mod download $2 (in hack/tools/$1)" "$log"
  fi
  dir="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' | head -n 1)"
  if [[ -z "$dir" || ! -d "$dir" ]]; then
    echo "build-bins: go mod download $2 (in hack/tools/$1) gave no module directory:" >&2
    printf '%s\n' "$json" >&2
    exit 1
  fi
  echo "$dir"
}

# build <name> <tools dir> <package> <ldflags> [extra go build flags...]
# (<tools dir> is under hack/tools, or an absolute path)
build() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4"
  shift 4
  [[ -z $ONLY || $name == "$ONLY" ]] || return 0
  [[ $dir == /* ]] || dir="$TOOLS/$dir"
  step_start "$name" "$pkg" || return 0
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" "$@" -o "$STEP_TMP" "$pkg") \
    >"$STEP_LOG" 2>&1 || { rm -f "$STEP_TMP"; fail "$name" "$STEP_LOG"; }
  step_done
}

# step_start <name> <what>: print the step's line; false (nothing to do) when its output is there.
# Sets STEP_TMP (write the output there), STEP_LOG and STEP_NAME for step_done.
step_start() {
  step=$((step + 1))
  STEP_NAME="$1"
  STEP_TAG="[$step/$TOTAL] $1"
  STEP_DEST="$(dest "$1")"
  if [[ $FORCE == 0 && -x "$STEP_DEST" ]]; then
    echo "build-bins: $STEP_TAG up to date"
    return 1
  fi
  echo "build-bins: $STEP_TAG building ($2), about $(minutes "$done_seconds") of" \
    "$(minutes "$todo_seconds") min done ..."
  done_seconds=$((done_seconds + COLD_SECONDS[$1]))
  mkdir -p "$(dirname "$STEP_DEST")"
  STEP_START=$SECONDS
  STEP_TMP="$(dirname "$STEP_DEST")/.${STEP_DEST##*/}.tmp.$$"
  STEP_LOG="$NODE_LOGS/${1//\//-}.log"
  [[ $STEP_DEST != "$OUT"/* ]] || STEP_LOG="$LOGS/$1.log"
  [[ $STEP_DEST != "$NEXT_OUT"/* ]] || STEP_LOG="$NEXT_OUT/logs/${1#next/}.log"
  mkdir -p "$(dirname "$STEP_LOG")"
}

step_done() {
  mv -f "$STEP_TMP" "$STEP_DEST" # atomic: a half-built binary never looks warm
  echo "build-bins: $STEP_TAG built in $((SECONDS - STEP_START))s"
  built=$((built + 1))
}

if [[ $MODULE_DIRS == 1 ]]; then # one line per tools module: <tools dir> <module dir>
  for m in "jobset sigs.k8s.io/jobset" "kueue sigs.k8s.io/kueue" \
    "jobset-compat sigs.k8s.io/jobset" "kueue-compat sigs.k8s.io/kueue"; do
    # shellcheck disable=SC2086 # two words on purpose: <tools dir> <module path>
    dir="$(moddir $m)" # an assignment, so that a failed lookup stops the script (set -e)
    echo "${m%% *} $dir"
  done
  exit 0
fi

# libseccomp for runc's seccomp support, from Debian's libseccomp-dev (libseccomp.a, headers,
# pkg-config file) unpacked into the cache: no system install. Prints its root.
libseccomp() {
  local root="$NODE_OUT/libseccomp" tmp deb
  if [[ $FORCE == 1 || ! -f "$root/usr/lib/x86_64-linux-gnu/libseccomp.a" ]]; then
    tmp="$(mktemp -d "$NODE_OUT/.libseccomp.XXXXXX")"
    chmod 755 "$tmp" # apt's download user must be able to write there
    # A machine whose package lists were never fetched finds no package: fetch them, once.
    if ! (cd "$tmp" && apt-get download libseccomp-dev) >>"$NODE_LOGS/libseccomp.log" 2>&1; then
      apt-get update -qq >>"$NODE_LOGS/libseccomp.log" 2>&1 || true
      (cd "$tmp" && apt-get download libseccomp-dev) >>"$NODE_LOGS/libseccomp.log" 2>&1 ||
        { rm -rf "$tmp"; fail "apt-get download libseccomp-dev" "$NODE_LOGS/libseccomp.log"; }
    fi
    deb="$(ls "$tmp"/libseccomp-dev_*.deb)"
    rm -rf "$root"
    dpkg -x "$deb" "$root"
    dpkg-deb -f "$deb" Version >"$root/VERSION"
    rm -rf "$tmp"
  fi
  echo "$root"
}

build_nodes() {
  mkdir -p "$NODE_OUT" "$NODE_LOGS"
  build kubelet kube k8s.io/kubernetes/cmd/kubelet "$KUBE_LDFLAGS"
  local ctrd=github.com/containerd/containerd/v2
  local ctrd_ldflags="-s -w -X $ctrd/version.Version=$CONTAINERD_VERSION"
  build containerd containerd "$ctrd/cmd/containerd" "$ctrd_ldflags"
  # As upstream's Makefile builds the shim: without its gRPC server.
  build containerd-shim-runc-v2 containerd "$ctrd/cmd/containerd-shim-runc-v2" "$ctrd_ldflags" \
    -tags no_grpc
  build ctr containerd "$ctrd/cmd/ctr" "$ctrd_ldflags"
  # runc needs cgo (its nsenter) and, since the kubelet asks every sandbox for a seccomp profile,
  # the seccomp tag; linked statically as upstream's `make static`, without the libpathrs tag
  # (a Rust library; runc falls back to its Go implementation).
  local seccomp=""
  [[ $FORCE == 0 && -x "$NODE_OUT/runc" ]] || seccomp="$(libseccomp)"
  CGO_ENABLED=1 PKG_CONFIG_SYSROOT_DIR="$seccomp" \
    PKG_CONFIG_LIBDIR="$seccomp/usr/lib/x86_64-linux-gnu/pkgconfig" \
    build runc runc github.com/opencontainers/runc "-s -w -linkmode external -extldflags -static" \
    -tags "seccomp urfave_cli_no_docs netgo osusergo"
  local cni=github.com/containernetworking/plugins plugin
  for plugin in main/bridge main/loopback ipam/host-local; do
    build "cni/${plugin#*/}" cni "$cni/plugins/$plugin" \
      "-s -w -X $cni/pkg/utils/buildversion.BuildVersion=$CNI_VERSION"
  done
  build coredns coredns . "-s -w"
  # The pause container's program: Kubernetes' own pause.c (build/pause in the kubernetes
  # module), compiled as its Makefile does.
  if step_start pause "build/pause/linux/pause.c of k8s.io/kubernetes"; then
    local kube_src
    kube_src="$(moddir kube k8s.io/kubernetes)"
    gcc -Os -Wall -Werror -static -DVERSION="$KUBE_VERSION" -o "$STEP_TMP" \
      "$kube_src/build/pause/linux/pause.c" >"$STEP_LOG" 2>&1 ||
      { rm -f "$STEP_TMP"; fail pause "$STEP_LOG"; }
    step_done
  fi
  build local/tpu-device-plugin "$LOCAL_GO" ./tpu-device-plugin "-s -w"
  build local/msj-probe "$LOCAL_GO" ./msj-probe "-s -w"
  printf '%s\n' "kubelet=$KUBE_VERSION" "containerd=$CONTAINERD_VERSION" "runc=$RUNC_VERSION" \
    "libseccomp=$(cat "$NODE_OUT/libseccomp/VERSION" 2>/dev/null || echo unknown)" \
    "cni=$CNI_VERSION" "coredns=$COREDNS_VERSION" >"$NODE_OUT/VERSIONS"
}

build_next() {
  mkdir -p "$NEXT_OUT/logs"
  local flags
  flags="$(kube_ldflags "$NEXT_KUBE_VERSION")"
  build next/kube-apiserver kube-next k8s.io/kubernetes/cmd/kube-apiserver "$flags"
  build next/kube-scheduler kube-next k8s.io/kubernetes/cmd/kube-scheduler "$flags"
  echo "kube=$NEXT_KUBE_VERSION" >"$NEXT_OUT/VERSIONS"
}

# Only the real nodes' (--nodes) or the newest lane's (--next): the control plane's steps below
# are skipped.
if [[ $BUILD_CONTROL_PLANE == 0 ]]; then
  where=""
  [[ $BUILD_NODES == 0 ]] || { build_nodes; where+="; real-node binaries in $NODE_OUT"; }
  [[ $BUILD_NEXT == 0 ]] || { build_next; where+="; the newest lane's in $NEXT_OUT"; }
  echo "build-bins: $built built$where"
  exit 0
fi

build etcd kube go.etcd.io/etcd/server/v3 "-s -w"
build kube-apiserver kube k8s.io/kubernetes/cmd/kube-apiserver "$KUBE_LDFLAGS"
build kube-controller-manager kube k8s.io/kubernetes/cmd/kube-controller-manager "$KUBE_LDFLAGS"
build kube-scheduler kube k8s.io/kubernetes/cmd/kube-scheduler "$KUBE_LDFLAGS"
build kubectl kube k8s.io/kubernetes/cmd/kubectl "$KUBE_LDFLAGS"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
build kwokctl kwok sigs.k8s.io/kwok/cmd/kwokctl "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
build jobset-controller jobset sigs.k8s.io/jobset \
  "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION"
# JobSet's in-place restart agent (cmd/in-place-restart-agent, the sidecar that holds the barrier
# and restarts its pod's containers): the operator image carries it at /in-place-restart-agent,
# where JobSet's own agent image puts it (local/multislice_local/images.py). Same module and
# flags as the controller, so it links from the controller's build cache in seconds.
build in-place-restart-agent jobset sigs.k8s.io/jobset/cmd/in-place-restart-agent \
  "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION"
# Kueue's main.go hard-codes /etc/kueue/metrics/certs (read at startup when its internal cert
# management is off, as it is for a local process). The go command may not overlay files in the
# module cache, so the overlay adds upstream's cmd/kueue (one file, importing only public
# packages) to our tools module as ./cmd/kueue with that one path made overridable by
# KUEUE_METRICS_CERT_DIR. Nothing is written into the clone. See
# hack/tools/kueue/overlay/metrics_cert_dir.go.in.
kueue_overlay() { # <dir for the overlay files> <tools dir>; prints the -overlay flag
  local src main pin='metricsCertPath := "/etc/kueue/metrics/certs"' pkg="$TOOLS/$2/cmd/kueue"
  src="$(moddir "$2" sigs.k8s.io/kueue)"
  main="$src/cmd/kueue/main.go"
  if [[ "$(ls "$src/cmd/kueue")" != main.go || "$(grep -cF "$pin" "$main")" != 1 ]]; then
    echo "build-bins: $src/cmd/kueue is no longer one main.go with one '$pin';" \
      "update the kueue overlay in hack/build-bins.sh" >&2
    exit 1
  fi
  sed "s|$pin|metricsCertPath := localMetricsCertDir()|" "$main" >"$1/main.go"
  cp "$TOOLS/kueue/overlay/metrics_cert_dir.go.in" "$1/metrics_cert_dir.go" # one overlay for both
  printf '{"Replace": {"%s": "%s", "%s": "%s"}}\n' "$pkg/main.go" "$1/main.go" \
    "$pkg/zz_metrics_cert_dir.go" "$1/metrics_cert_dir.go" >"$1/overlay.json"
  echo "-overlay=$1/overlay.json"
}
# -mod=readonly: with -mod=mod the go command would rewrite tools/kueue/go.mod to list the
# overlaid package's imports as direct requirements.
OVERLAYS=() # this run's overlay dirs only: another build of the same cache dir may be running
trap 'rm -rf ${OVERLAYS[@]+"${OVERLAYS[@]}"}' EXIT
build_kueue() { # <binary name> <tools dir> <version>
  local flags=()
  [[ -z $ONLY || $1 == "$ONLY" ]] || return 0
  if [[ $FORCE == 1 || ! -x "$OUT/$1" ]]; then
    local overlay
    overlay="$(mktemp -d "$OUT/.kueue-overlay.XXXXXX")"
    OVERLAYS+=("$overlay")
    flags=("$(kueue_overlay "$overlay" "$2")" -mod=readonly)
  fi
  build "$1" "$2" ./cmd/kueue "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$3" \
    ${flags[@]+"${flags[@]}"}
}
build_kueue kueue-controller kueue "$KUEUE_VERSION"
HELM_LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  HELM_LDFLAGS+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$HELM_KUBE_MINOR"
done
build helm helm helm.sh/helm/v3/cmd/helm "$HELM_LDFLAGS"
build jobset-controller-compat jobset-compat sigs.k8s.io/jobset \
  "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_COMPAT_VERSION"
build_kueue kueue-controller-compat kueue-compat "$KUEUE_COMPAT_VERSION"

if [[ -n $ONLY ]]; then
  echo "build-bins: $built built; $ONLY in $OUT"
  exit 0
fi

# CRDs and webhook manifests ship with the JobSet and Kueue modules; copy them next to the
# binaries. Each file is written to a tmp name and moved into place, like the binaries.
# copy_manifest <tools dir> <module path> <name in the cache dir> <file under config/components>...
# (several files are concatenated into one multi-document YAML)
copy_manifest() {
  local dir="$1" mod="$2" name="$3"
  shift 3
  [[ $FORCE == 0 && -f "$OUT/$name" ]] && return
  local src f tmp="$OUT/$name.tmp.$$"
  src="$(moddir "$dir" "$mod")"
  : >"$tmp"
  for f in "$@"; do
    # One "---" between documents (the CRD files already start with one).
    [[ -s "$tmp" && "$(head -n 1 "$src/config/components/$f")" != "---" ]] && echo "---" >>"$tmp"
    cat "$src/config/components/$f" >>"$tmp"
  done
  chmod 0644 "$tmp"
  mv -f "$tmp" "$OUT/$name"
  echo "build-bins: copied $name ($# file(s) from $mod)"
}
copy_manifest jobset sigs.k8s.io/jobset jobset.x-k8s.io_jobsets.yaml crd/bases/jobset.x-k8s.io_jobsets.yaml
copy_manifest jobset sigs.k8s.io/jobset jobset-webhook-manifests.yaml webhook/manifests.yaml
KUEUE_CRDS=()
if [[ $FORCE == 1 || ! -f "$OUT/kueue-crds.yaml" ]]; then
  KUEUE_SRC="$(moddir kueue sigs.k8s.io/kueue)"
  for f in "$KUEUE_SRC"/config/components/crd/bases/*.yaml; do
    KUEUE_CRDS+=("crd/bases/${f##*/}")
  done
fi
copy_manifest kueue sigs.k8s.io/kueue kueue-crds.yaml ${KUEUE_CRDS[@]+"${KUEUE_CRDS[@]}"}
copy_manifest kueue sigs.k8s.io/kueue kueue-webhook-manifests.yaml webhook/manifests.yaml
mkdir -p "$OUT/compat"
copy_manifest jobset-compat sigs.k8s.io/jobset compat/jobset.x-k8s.io_jobsets.yaml \
  crd/bases/jobset.x-k8s.io_jobsets.yaml
copy_manifest jobset-compat sigs.k8s.io/jobset compat/jobset-webhook-manifests.yaml \
  webhook/manifests.yaml
KUEUE_COMPAT_CRDS=()
if [[ $FORCE == 1 || ! -f "$OUT/compat/kueue-crds.yaml" ]]; then
  KUEUE_COMPAT_SRC="$(moddir kueue-compat sigs.k8s.io/kueue)"
  for f in "$KUEUE_COMPAT_SRC"/config/components/crd/bases/*.yaml; do
    KUEUE_COMPAT_CRDS+=("crd/bases/${f##*/}")
  done
fi
copy_manifest kueue-compat sigs.k8s.io/kueue compat/kueue-crds.yaml \
  ${KUEUE_COMPAT_CRDS[@]+"${KUEUE_COMPAT_CRDS[@]}"}
copy_manifest kueue-compat sigs.k8s.io/kueue compat/kueue-webhook-manifests.yaml \
  webhook/manifests.yaml

printf '%s\n' "kube=$KUBE_VERSION" "etcd=$ETCD_VERSION" "jobset=$JOBSET_VERSION" \
  "kwok=$KWOK_VERSION" "helm=$HELM_VERSION" "kueue=$KUEUE_VERSION" \
  "jobset-compat=$JOBSET_COMPAT_VERSION" "kueue-compat=$KUEUE_COMPAT_VERSION" > "$OUT/VERSIONS"
[[ $BUILD_NODES == 0 ]] || build_nodes
[[ $BUILD_NEXT == 0 ]] || build_next
echo "build-bins: $built built; binaries in $OUT"
