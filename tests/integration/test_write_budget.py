"""A write budget per job, counted by the apiserver (apiserver_request_total by verb and resource):
counts are deterministic where times are not, so this runs in `make test` and fails at the merge
that makes a job cost more writes (issue 23: a dry run and a status written only to be replaced
doubled the writes per job after they were measured).

The api profile (etcd + apiserver) and an operator that watches only this module's namespaces;
the test plays the JobSet controller (it patches the JobSet's status) and subtracts its own writes.
Each lifecycle runs a small batch of jobs and divides by the batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from multislice_local.apimetrics import count_diff, request_counts, settle, writes
from multislice_local.controlplane import KUEUE_CRDS_FILE, bin_dir
from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar, SimConfig
from multislice_local.harness import OperatorProcess, install_crds, install_kueue_crds, wait_for
from multislice_local.nodes import register_tpu_nodes
from multislice_local.stack import CLUSTER, LOCATION, PROJECT, ZONE
from multislice_operator.api import models
from multislice_operator.common import keys
from tests import msj

JS = ("jobset.x-k8s.io", "v1alpha2")
BATCH = 4
RESOURCES = frozenset(
    {
        "multislicejobs",
        "multislicejobs/status",
        "jobsets",
        "jobsets/status",
        "jobs",
        "events",
        "pods",
        "workloads",
        "workloads/status",
    }
)
# Writes per job, by lifecycle (docs/benchmarks.md says what each one spends them on). The
# cluster here has no in-place restart (no agent image): that is said by the job's RestartInPlace
# condition, in the status write it gets anyway, not by an event per job (issue 57).
BUDGET = {
    "existing-start": 2,  # the JobSet, the Starting status
    "existing-lifecycle": 6,  # + Running, Succeeded: a status and an event each; delete: none
    "restart": 5,  # Restarting and Running: a status and an event each; RestartingAllSlices
    "managed-start": 2.5,  # the finalizer, the Provisioning status; one dry run per template
    "managed-delete": 2,  # "releasing node pools" in the status; the finalizer comes off
    "queued-start": 3,  # the job's Workload, its JobSet (suspended), the Queued status
}
# Of those, events per job: each names a change the user asked to hear of (budget's comments).
EVENTS = {
    "existing-start": 0,
    "existing-lifecycle": 2,
    "restart": 3,
    "managed-start": 0,
    "managed-delete": 0,
    "queued-start": 0,
}


@pytest.fixture(scope="module")
def api(kube_api) -> Iterator[client.ApiClient]:
    api_client = kube_api.api_client()
    install_crds(api_client, bin_dir() / "jobset.x-k8s.io_jobsets.yaml")
    install_kueue_crds(api_client, bin_dir() / KUEUE_CRDS_FILE)  # no Kueue: its API only
    core = client.CoreV1Api(api_client)
    for p in range(2):
        for name in register_tpu_nodes(
            api_client, f"budget-v5e-{p}", 4, "tpu-v5-lite-podslice", "4x4", 4
        ):
            core.patch_node_status(
                name, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            )
    yield api_client
    api_client.close()


@pytest.fixture(scope="module")
def sim() -> Iterator[GkeSimulator]:
    with GkeSimulator(SimConfig(op_latency_s=0.2), registrar=InMemoryRegistrar()) as s:
        yield s


@pytest.fixture(scope="module")
def ns(kube_api, api) -> Iterator[str]:
    name = "budget"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    yield name
    client.CoreV1Api(api).delete_namespace(name)


@pytest.fixture(scope="module")
def op(kube_api, api, sim, ns, tmp_path_factory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(
        kube_api.kubeconfig,
        [
            "--resync-seconds", "2", "--gke-project", PROJECT, "--gke-location", LOCATION,
            "--gke-cluster", CLUSTER, "--gke-node-location", ZONE, "--gke-simulator", sim.url,
            "--kueue", "--kueue-workload-wait-seconds", "3600",
        ],
        namespaces=[ns],
        log_path=tmp_path_factory.mktemp("budget") / "operator.log",
    ).start()  # fmt: skip
    yield proc
    proc.stop()


class Batch:
    """BATCH jobs of one kind; the apiserver's write count across what the test does."""

    def __init__(self, api: client.ApiClient, ns: str, op: OperatorProcess, prefix: str) -> None:
        self.api, self.ns, self.op = api, ns, op
        self.custom = client.CustomObjectsApi(api)
        self.names = [f"{prefix}-{i}" for i in range(BATCH)]
        self.own_writes = 0  # the test's own writes in the window being counted

    def start(self) -> None:
        settle(self.api)
        self.before = request_counts(self.api)
        self.own_writes = 0

    def spent(self) -> tuple[float, dict[str, int]]:
        """Writes per job by the operator since start(), and what they were."""
        settle(self.api, quiet_s=3.0)
        diff = count_diff(request_counts(self.api), self.before)
        return (writes(diff, RESOURCES) - self.own_writes) / BATCH, diff

    def create(self, body_of: Any) -> None:
        for name in self.names:
            msj.create(self.api, self.ns, body_of(name))
            self.own_writes += 1

    def delete(self) -> None:
        for name in self.names:
            self.custom.delete_namespaced_custom_object(
                models.GROUP, models.VERSION, self.ns, models.PLURAL, name
            )
            self.own_writes += 1

    def jobset_status(self, status: dict[str, Any]) -> None:
        """As the JobSet controller writes it (every count of replicatedJobsStatus is required)."""
        counts = {"ready": 0, "active": 0, "succeeded": 0, "failed": 0, "suspended": 0}
        status = {
            **status,
            "replicatedJobsStatus": [
                {**counts, **rj} for rj in status.get("replicatedJobsStatus", [])
            ],
        }
        for name in self.names:
            msj.wait_jobset(self.api, self.ns, name, 30, log=self.op.log_tail)
            self.custom.patch_namespaced_custom_object_status(
                *JS, self.ns, "jobsets", name, {"status": status}
            )
            self.own_writes += 1

    def phase(self, phase: str, timeout: float = 60) -> None:
        for name in self.names:
            msj.wait_phase(self.api, self.ns, name, phase, timeout, log=self.op.log_tail)

    def events(self, *needles: str) -> None:
        """Until every job's events hold `needles`: a pass posts its events after the status
        write a phase wait saw, so a window started at the phase alone may count them."""
        for name in self.names:
            msj.wait_events(self.api, self.ns, name, *needles, log=self.op.log_tail)

    def gone(self, timeout: float = 60) -> None:
        for name in self.names:
            wait_for(
                lambda n=name: msj.get(self.api, self.ns, n, missing_ok=True) is None,
                timeout,
                f"{name} deleted",
                on_timeout=self.op.log_tail,
            )


# Jobs as the docs write them: with a checkpoint directory (one without one costs one more write,
# its NoCheckpoint warning event, counted by test_a_job_without_a_checkpoint_is_warned_once).
CHECKPOINT = {"directory": "gs://bkt/run"}


def existing(name: str) -> dict[str, Any]:
    return msj.job(
        name,
        existing=True,
        image="img:1",
        failure_policy={"maxRestarts": 3},
        checkpoint=CHECKPOINT,
    )


def managed(name: str) -> dict[str, Any]:
    return msj.job(name, image="img:1", checkpoint=CHECKPOINT)


def queued(name: str) -> dict[str, Any]:
    return msj.job(
        name,
        existing=True,
        image="img:1",
        labels={keys.KUEUE_QUEUE_NAME: "team-a"},
        checkpoint=CHECKPOINT,
    )


def check(lifecycle: str, spent: tuple[float, dict[str, int]]) -> None:
    per_job, diff = spent
    print(f"write budget {lifecycle}: {per_job:.2f} writes/job (budget {BUDGET[lifecycle]}) {diff}")
    assert per_job <= BUDGET[lifecycle], (lifecycle, per_job, diff)
    events = diff.get("POST events", 0) + diff.get("PATCH events", 0)
    assert events == EVENTS[lifecycle] * BATCH, (lifecycle, "events", events / BATCH, diff)


def test_an_existing_job_from_create_to_deleted(api, ns, op) -> None:
    b = Batch(api, ns, op, "ex")
    b.start()
    b.create(existing)
    b.phase("Starting")
    check("existing-start", b.spent())
    b.start()  # the same batch, counted again from Starting
    b.jobset_status({"replicatedJobsStatus": [{"name": "slice", "ready": 2, "active": 2}]})
    b.phase("Running")
    b.jobset_status(
        {
            "replicatedJobsStatus": [{"name": "slice", "succeeded": 2}],
            "conditions": [
                {
                    "type": "Completed",
                    "status": "True",
                    "reason": "AllJobsCompleted",
                    "message": "done",
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }
            ],
            "terminalState": "Completed",
        }
    )
    b.phase("Succeeded")
    b.delete()
    b.gone()
    per_job, diff = b.spent()
    check("existing-lifecycle", (per_job + BUDGET["existing-start"], diff))


def test_a_restart_of_all_slices(api, ns, op) -> None:
    b = Batch(api, ns, op, "rs")
    b.create(existing)
    b.phase("Starting")
    b.jobset_status({"replicatedJobsStatus": [{"name": "slice", "ready": 2, "active": 2}]})
    b.phase("Running")
    b.events("Running: Starting -> Running")
    b.start()
    b.jobset_status(
        {"restarts": 1, "restartsCountTowardsMax": 1,
         "replicatedJobsStatus": [{"name": "slice", "ready": 0, "active": 2}]}
    )  # fmt: skip
    b.phase("Restarting")
    b.jobset_status(
        {"restarts": 1, "restartsCountTowardsMax": 1,
         "replicatedJobsStatus": [{"name": "slice", "ready": 2, "active": 2}]}
    )  # fmt: skip
    b.phase("Running")
    check("restart", b.spent())


@pytest.mark.parametrize("round_trip", [0.0, 1.0], ids=["quick", "slow-creates"])
def test_a_managed_job_to_provisioning(api, ns, op, sim, round_trip) -> None:
    # Creates take an hour: counted to Provisioning only. A slow create call (a loaded machine,
    # a far region) lets other jobs' passes list the pools while it is on the wire: a listing
    # that predates a job's create must not show it its pools absent (a second status write).
    sim.configure(op_latency_s=3600, mutation_delay_s=round_trip)
    try:
        b = Batch(api, ns, op, f"mg{int(round_trip)}")
        b.start()
        b.create(managed)
        b.phase("Provisioning")
        msj.wait_reconciles(op, passes=2)  # passes after the creates, which judge from a listing
        check("managed-start", b.spent())
    finally:  # the module's later tests get quick calls whatever happened here
        sim.configure(mutation_delay_s=0.0)


def test_a_managed_job_deleted(api, ns, op, sim) -> None:
    sim.configure(op_latency_s=0.2)
    b = Batch(api, ns, op, "md")
    b.create(managed)
    b.phase("Provisioning")

    def created() -> bool:
        mine = [p for name, p in sim.pools().items() if name.startswith("msj-md-")]
        return len(mine) == 2 * BATCH and all(p["status"] == "RUNNING" for p in mine)

    wait_for(created, 60, "the batch's pools created")

    def seen(name: str) -> bool:  # the operator's write for its pools seen is not counted
        slices = (msj.get(api, ns, name) or {}).get("status", {}).get("slices") or []
        return bool(slices) and all(s.get("phase") != "Pending" for s in slices)

    for name in b.names:
        wait_for(lambda n=name: seen(n), 60, f"{name}'s pools seen", on_timeout=op.log_tail)
    # A slice leaves Pending while its pool is still being created: passes after that see the
    # pools running and write it, before the window, not in it.
    msj.wait_reconciles(op, passes=2)
    b.start()
    b.delete()
    b.gone()
    check("managed-delete", b.spent())


def test_a_queued_job_to_queued(api, ns, op) -> None:
    b = Batch(api, ns, op, "qu")
    b.start()
    b.create(queued)
    b.phase("Queued")
    check("queued-start", b.spent())


def test_a_job_without_a_checkpoint_is_warned_once(api, ns, op) -> None:
    b = Batch(api, ns, op, "nc")
    b.start()
    b.create(lambda name: msj.job(name, existing=True, image="img:1"))
    b.phase("Starting")
    per_job, diff = b.spent()
    # exactly one write more than a job with one: its NoCheckpoint event, not one per pass
    assert per_job - 1 <= BUDGET["existing-start"], (per_job, diff)
    assert diff.get("POST events", 0) == BATCH, diff
