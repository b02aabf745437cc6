"""High availability: replicas with --leader-elect share one coordination.k8s.io Lease; only the
holder reconciles, and a standby takes over when the holder dies (real apiserver, api profile)."""

from __future__ import annotations

import os
import signal

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
    a = OperatorProcess(kube_api.kubeconfig, args, namespaces=[ns], log_path=tmp_path / "a.log")
    b = OperatorProcess(kube_api.kubeconfig, args, namespaces=[ns], log_path=tmp_path / "b.log")
    try:
        # Both replicas start at once (an operator's start is most of this test's time): the one
        # that takes the lease is the leader, the other the standby.
        for replica in (a, b):
            replica.start(wait=False)
        leader = wait_for(lambda: _holder(coord, ns), 60, "a replica to take the lease")
        first, second = (a, b) if leader.endswith(f"_{a.proc.pid}") else (b, a)
        assert leader.endswith(f"_{first.proc.pid}"), leader
        second.wait_live()
        msj.create(api, ns, _job("one"))
        wait_for(lambda: _phase(api, ns, "one"), 30, "the leader to reconcile job one")
        # Several renewals by the leader: the standby must still be waiting, having reconciled
        # nothing.
        renewals: list[object] = []

        def renewed(times: int = 3) -> bool:
            at = coord.read_namespaced_lease(LEASE, ns).spec.renew_time
            if not renewals or renewals[-1] != at:
                renewals.append(at)
            return len(renewals) > times

        wait_for(renewed, 60, "three renewals of the lease", on_timeout=first.log_tail)
        assert _holder(coord, ns) == leader
        assert msj.reconciles(second) == 0
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
        a.stop()
        b.stop()
        api.close()
