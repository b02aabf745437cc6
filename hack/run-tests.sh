#!/usr/bin/env bash
# `make test`: the two layers of tests/README.md, at the same time. The control-plane layer mostly
# waits on controllers (2 cores stay largely idle), so the unit layer computes beside it, in the
# background, its output in a log printed when the control-plane layer ends. The binaries are built
# first when missing (cold: minutes; the unit layer runs meanwhile). The exit status is the first
# failure's; both layers always run to the end.
#
#   UNIT_JOBS  pytest-xdist workers of the unit layer (0: one process)
#   CP_JOBS    workers of the control-plane layer (0: one process, after the unit layer in one)
#   COMPAT     1 (default): after the control-plane layer, the compatibility lane runs the tests
#              marked `compat` again on the oldest JobSet and Kueue controllers we support
#              (MULTISLICE_CONTROLLERS=compat, hack/README.md); 0 skips it
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
UNIT_JOBS=${UNIT_JOBS:-1}
CP_JOBS=${CP_JOBS:-4}
COMPAT=${COMPAT:-1}

log=$(mktemp -t msj-unit-layer.XXXXXX.log)
started=$SECONDS
unit() {
  $PY -m pytest -q -n "$UNIT_JOBS" tests/unit tests/workload  # -n 0: in this process
}
if [ "$CP_JOBS" = 0 ]; then  # one process at a time, in order
  UNIT_JOBS=0
  unit; unit_rc=$?
  unit_pid=
else
  echo "unit layer: running beside the control-plane layer; its log: $log (printed at the end)"
  unit > "$log" 2>&1 &
  unit_pid=$!
fi

rc=0
$PY -c 'from multislice_local.controlplane import ensure_binaries as e; e()' || rc=$?
# The newest Kubernetes lane's kube-apiserver and kube-scheduler (tests using `kube_next`), after
# the main lane's: they reuse its Go build cache (hack/README.md, "The newest Kubernetes lane").
[ $rc -ne 0 ] || $PY -c 'from multislice_local.controlplane import ensure_next_binaries as e; e()' \
  || rc=$?
# The real nodes' binaries (tests/integration/test_realnodes.py), where this host can run them;
# elsewhere those tests are skipped, and this says why once.
[ $rc -ne 0 ] || $PY -m multislice_local.realnodes bins || rc=$?
if [ $rc -eq 0 ]; then
  $PY -m pytest -q -n "$CP_JOBS" --dist loadgroup tests/integration tests/e2e || rc=$?
  echo "control-plane layer: exit $rc, $((SECONDS - started)) s since make test started"
fi
if [ $rc -eq 0 ] && [ "$COMPAT" = 1 ]; then
  compat_jobs=$CP_JOBS; [ "$compat_jobs" = 0 ] || compat_jobs=3
  MULTISLICE_CONTROLLERS=compat $PY -m pytest -q -n "$compat_jobs" --dist loadgroup -m compat \
    tests/e2e || rc=$?
  echo "compatibility lane: exit $rc, $((SECONDS - started)) s since make test started"
fi

if [ -n "$unit_pid" ]; then
  wait "$unit_pid"; unit_rc=$?
  echo "---------------- unit layer (exit $unit_rc) ----------------"
  cat "$log"
fi
rm -f "$log"
[ $rc -ne 0 ] || rc=$unit_rc
echo "make test: exit $rc in $((SECONDS - started)) s"
exit $rc
