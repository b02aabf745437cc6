"""`watchNamespaces` naming a namespace that does not exist yet (the chart's `watchNamespaces`,
the operator's `-n`): once it is created, its jobs are handled, with no operator restart.

kopf learns of a new namespace from its namespace watch; a namespace created while that watch
(re)lists was dropped (controller/discovery.py, pinned in tests/unit/test_discovery.py). Here the
whole path runs: the real apiserver, the operator process, its RBAC-free admin kubeconfig."""

from __future__ import annotations

import uuid

from kubernetes import client

from multislice_local.harness import OperatorProcess, install_crds
from multislice_operator.api import models
from tests import msj


def test_a_job_in_a_watched_namespace_created_after_the_operator_started_gets_a_status(
    kube_cluster, namespace, kube_client, tmp_path
):
    api = kube_client(kube_cluster)
    core = client.CoreV1Api(api)
    first = namespace(kube_cluster, "wns")
    later = f"wns-later-{uuid.uuid4().hex[:6]}"
    install_crds(api)
    op = OperatorProcess(
        kube_cluster.kubeconfig,
        ["--resync-seconds", "2"],
        namespaces=[first, later],
        log_path=tmp_path / "operator.log",
    ).start()
    try:
        # The operator is up (start() waits for its health endpoint) and watches `first`.
        msj.create(api, first, msj.job("early", run="600s", existing=True))
        msj.wait_status(api, first, "early", "early has a status", bool, 60, log=op.log_tail)
        core.create_namespace({"metadata": {"name": later}})
        try:
            msj.create(api, later, msj.job("late", run="600s", existing=True))
            late = msj.wait_status(
                api, later, "late", "the job in the later namespace has a status", bool, 60,
                log=op.log_tail,
            )  # fmt: skip
            assert late["status"]["phase"] in {"Pending", "Starting"}, late["status"]
            # ... and the operator goes on handling it: a spec change is seen there too.
            msj.custom(api).patch_namespaced_custom_object(
                models.GROUP, models.VERSION, later, models.PLURAL, "late",
                {"spec": {"suspend": True}},
            )  # fmt: skip
            msj.wait_phase(api, later, "late", "Suspended", 60, log=op.log_tail)
        finally:
            core.delete_namespace(later)
    finally:
        op.stop()
