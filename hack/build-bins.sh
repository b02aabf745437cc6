#!/usr/bin/env bash
# Build the local control-plane binaries from pinned Go modules into a versioned cache outside the
# clone. Builds only what is missing, so a warm run is a no-op.
#
#   hack/build-bins.sh             build what is missing, print one progress line per component
#   hack/build-bins.sh --print-dir print the cache dir for the pinned versions and exit
#   hack/build-bins.sh --force     rebuild everything
#   hack/build-bins.sh --only NAME build that one component if missing (the image builder asks
#                                  for in-place-restart-agent so)
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

KEY="k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_jobset-${JOBSET_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_kueue-${KUEUE_VERSION}"
KEY+="_compat-jobset-${JOBSET_COMPAT_VERSION}-kueue-${KUEUE_COMPAT_VERSION}"
ROOT="${MULTISLICE_BIN_CACHE:-$HOME/.cache/multislice-operator/bin}"
OUT="$ROOT/$KEY"

FORCE=0
MODULE_DIRS=0
ONLY=""
case "${1:-}" in
  --print-dir) echo "$OUT"; exit 0 ;;
  --force) FORCE=1 ;;
  --module-dirs) MODULE_DIRS=1 ;;
  --only) ONLY="${2:?usage: $0 --only COMPONENT}" ;;
  "") ;;
  *) echo "usage: $0 [--print-dir|--force|--module-dirs|--only COMPONENT]" >&2; exit 2 ;;
esac

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$OUT"

kube_minor="${KUBE_VERSION#v1.}"; kube_minor="${kube_minor%%.*}"
KUBE_LDFLAGS="-s -w"
# Without these stamps /version reports v0.0.0 and clients such as Helm refuse the server.
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  KUBE_LDFLAGS+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1"
  KUBE_LDFLAGS+=" -X $pkg.gitMinor=$kube_minor -X $pkg.gitTreeState=clean"
  KUBE_LDFLAGS+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# The go command's own chatter (go: downloading ..., compiler output) goes to one log per
# component under $LOGS; its tail is printed only when that step fails.
LOGS="$OUT/logs"
mkdir -p "$LOGS"
# The components below, in build order, with the seconds each took on a cold machine (2 cores,
# empty module and build caches; hack/README.md): the progress lines say how far along the whole
# build is, so a first build that takes half an hour does not look stuck.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwokctl
  jobset-controller in-place-restart-agent kueue-controller helm jobset-controller-compat
  kueue-controller-compat)
declare -A COLD_SECONDS=( # measured 2026-12-02: cold `make test`, 2 cores (hack/README.md)
  [etcd]=96 [kube-apiserver]=353 [kube-controller-manager]=110 [kube-scheduler]=7 [kubectl]=44
  [kwok]=169 [kwokctl]=29 [jobset-controller]=182 [in-place-restart-agent]=20
  [kueue-controller]=410 [helm]=151
  [jobset-controller-compat]=182 [kueue-controller-compat]=410 # estimates: same modules, older
)
if [[ -n $ONLY ]]; then
  [[ " ${COMPONENTS[*]} " == *" $ONLY "* ]] ||
    { echo "build-bins: no component $ONLY; one of: ${COMPONENTS[*]}" >&2; exit 2; }
  COMPONENTS=("$ONLY")
fi
TOTAL=${#COMPONENTS[@]}
step=0
built=0
todo_seconds=0 # expected cold seconds of the components still to build
for c in "${COMPONENTS[@]}"; do
  [[ $FORCE == 0 && -x "$OUT/$c" ]] || todo_seconds=$((todo_seconds + COLD_SECONDS[$c]))
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
build() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4"
  shift 4
  [[ -z $ONLY || $name == "$ONLY" ]] || return 0
  step=$((step + 1))
  local tag="[$step/$TOTAL] $name"
  if [[ $FORCE == 0 && -x "$OUT/$name" ]]; then
    echo "build-bins: $tag up to date"
    return
  fi
  echo "build-bins: $tag building ($pkg), about $(minutes "$done_seconds") of" \
    "$(minutes "$todo_seconds") min done ..."
  done_seconds=$((done_seconds + COLD_SECONDS[$name]))
  local start=$SECONDS tmp="$OUT/.$name.tmp.$$" log="$LOGS/$name.log"
  (cd "$TOOLS/$dir" && go build -trimpath -ldflags "$ldflags" "$@" -o "$tmp" "$pkg") >"$log" 2>&1 ||
    { rm -f "$tmp"; fail "$name" "$log"; }
  mv -f "$tmp" "$OUT/$name" # atomic: a half-built binary never looks warm
  echo "build-bins: $tag built in $((SECONDS - start))s"
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
echo "build-bins: $built built; binaries in $OUT"
