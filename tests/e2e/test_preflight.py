"""spec.preflight end to end (issue 42, section 2): the compile Job before any node pool.

Managed mode on the real apiserver, Job controller, JobSet controller, kwok and the GKE simulator.
kwok runs no pod, so the compile pod is played as the demo plays it (multislice_local/preflight:
terminated with an exit code and a termination message, as the kubelet reports it); the Job
controller, the operator's reading of the Job and everything after it are real.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from multislice_local.harness import wait_for
from multislice_local.preflight import compile_pod, finish_compile_pod
from multislice_operator.reconcile.reasons import Reason
from tests import msj

GIB = 1024**3


@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    log = tmp_path_factory.mktemp("preflight") / "operator.log"
    with msj.local_stack(kube_cluster, log) as s:
        yield s


@pytest.fixture
def env(stack, namespace, kube_cluster):
    ns = namespace(kube_cluster, "preflight")
    stack.sim.clear_faults()
    stack.sim.reset_counters()
    return stack, ns


def said(fits: bool, need_gib: float) -> str:
    return json.dumps({"fits": fits, "hbm_bytes_per_device": int(need_gib * GIB),
                       "hbm_capacity_bytes": 16 * 10**9, "step_time_s": 0.25})  # fmt: skip


def the_compile_pod(stack, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def seen() -> bool:
        found.update(compile_pod(stack.api, ns, f"{name}-preflight") or {})
        return bool(found)

    wait_for(seen, 60, f"{name}'s compile pod", interval=0.5,
             on_timeout=lambda: stack.op.log_tail(30))  # fmt: skip
    return found


def batch_job(stack, ns: str, name: str) -> Any:
    jobs = client.BatchV1Api(stack.api).list_namespaced_job(ns).items
    return next((j for j in jobs if j.metadata.name == f"{name}-preflight"), None)


def gone(stack, ns: str, name: str) -> None:
    wait_for(lambda: batch_job(stack, ns, name) is None, 60, "the compile Job deleted",
             interval=0.5, on_timeout=lambda: stack.op.log_tail(30))  # fmt: skip


def calls(stack, method: str) -> int:
    return int(stack.sim.counters()["calls"].get(method, 0))


def test_a_program_that_does_not_fit_fails_the_job_with_no_pool(env):
    stack, ns = env
    msj.create(stack.api, ns, msj.job("big", run="1h", preflight={}))
    pod = the_compile_pod(stack, ns, "big")
    (c,) = pod["spec"]["containers"]
    assert c["command"][:3] == ["multislice_workload", "compile", "--topology"]
    assert "google.com/tpu" not in json.dumps(c.get("resources") or {})
    assert msj.status(stack.api, ns, "big").get("phase") == "Pending"
    assert calls(stack, "create_node_pool") == 0

    finish_compile_pod(stack.api, ns, pod, 78, said(False, 20.5))
    st = msj.wait_phase(stack.api, ns, "big", "Failed", 60, log=stack.op.log_tail)["status"]
    failed = {c["type"]: c for c in st["conditions"]}["Failed"]
    assert failed["reason"] == Reason.PREFLIGHT_FAILED
    assert "20.50 GiB of HBM per device" in failed["message"], failed["message"]
    assert st["preflight"]["state"] == "Failed"
    assert st["preflight"]["hbmBytesPerDevice"] == int(20.5 * GIB)
    assert st.get("restarts", 0) == 0
    assert calls(stack, "create_node_pool") == 0, stack.sim.counters()
    assert msj.jobset(stack.api, ns, "big") is None
    gone(stack, ns, "big")  # nothing of it is left


def test_a_program_that_fits_gets_its_pools_and_runs(env):
    stack, ns = env
    msj.create(stack.api, ns, msj.job("fits", run="5s", preflight={}))
    pod = the_compile_pod(stack, ns, "fits")
    finish_compile_pod(stack.api, ns, pod, 0, said(True, 9.25))
    log = stack.op.log_tail
    st = msj.wait_phase(stack.api, ns, "fits", "Succeeded", 240, log=log)["status"]
    pre = st["preflight"]
    assert pre["state"] == "Passed" and pre["hbmBytesPerDevice"] == int(9.25 * GIB)
    assert pre["stepTimeSeconds"] == pytest.approx(0.25)
    assert calls(stack, "create_node_pool") >= 2
    lines = msj.event_lines(stack.api, ns, "fits")
    assert any(Reason.PREFLIGHT_PASSED in line and "9.25 GiB" in line for line in lines), lines
    gone(stack, ns, "fits")
