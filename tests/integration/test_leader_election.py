"""High availability: replicas with --leader-elect share one coordination.k8s.io Lease; only the
holder reconciles, and a standby takes over when the holder dies (real apiserver, api profile)."""

from __future__ import annotations

import os
import signal
import time

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.controlplane import bin_dir
from multislice_local.harness import OperatorProcess, install_crds, wait_for
from tests import msj

LEASE = "msj-ha-test"


def _job(name: str) -> dict:
    return msj.job(name, existing=True, image="img:1")


def _holder(coord: client.CoordinationV1Api, ns: str) -> str | None:
    try:
        return coord.read_namespaced_lease(LEASE, ns).spec.holder_identity
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _phase(api: client.ApiClient, ns: str, name: str) -> str | None:
    return msj.status(api, ns, name).get("phase")


def test_one_leader_reconciles_and_a_standby_takes_over(kube_api, namespace, tmp_path) -> None:
    api = kube_api.api_client()
    install_crds(api, bin_dir() / "jobset.x-k8s.io_jobsets.yaml")
    ns = namespace(kube_api, "ha")
    coord = client.CoordinationV1Api(api)
    args = ["--leader-elect", "--leader-election-namespace", ns, "--leader-election-name", LEASE]
    first = OperatorProcess(kube_api.kubeconfig, args, namespaces=[ns], log_path=tmp_path / "a.log")
    second = OperatorProcess(
        kube_api.kubeconfig, args, namespaces=[ns], log_path=tmp_path / "b.log"
    )
    try:
        first.start()
        leader = wait_for(lambda: _holder(coord, ns), 30, "the first replica to take the lease")
        assert leader.endswith(f"_{first.proc.pid}")
        second.start()
        msj.create(api, ns, _job("one"))
        wait_for(lambda: _phase(api, ns, "one"), 30, "the leader to reconcile job one")
        time.sleep(3)  # several renew periods: the standby must still be waiting
        assert _holder(coord, ns) == leader
        assert "reconcile" not in second.log_tail(200) and "jobset created" not in second.log_tail(
            200
        )

        os.killpg(first.proc.pid, signal.SIGKILL)  # no goodbye: the lease must expire
        first.proc.wait(10)
        wait_for(
            lambda: (_holder(coord, ns) or "").endswith(f"_{second.proc.pid}"),
            40,
            "the standby to take the expired lease",
            on_timeout=second.log_tail,
        )
        msj.create(api, ns, _job("two"))
        wait_for(lambda: _phase(api, ns, "two"), 30, "the new leader to reconcile job two")
    finally:
        first.stop()
        second.stop()
        api.close()
