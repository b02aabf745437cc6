"""Gangs at the scheduler (issue 54 point 5): where the cluster serves Kubernetes 1.37's PodGroups
(scheduling.k8s.io/v1beta1), a job's JobSet pods join one PodGroup whose gang is every pod of
every slice, applied before the JobSet, and the pods carry the slice-per-pool placement that
JobSet's pod webhook would otherwise give them one slice's first pod at a time; elsewhere nothing
changes. The e2e on the 1.37 lane: tests/e2e/test_kube_next_gang.py."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from multislice_operator.common import keys
from multislice_operator.common.errors import SpecError
from multislice_operator.common.pools import PoolState
from multislice_operator.controller import appliers, kube, versions
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.reconcile import CreateJobSet, SliceObservation
from multislice_operator.render import podgroup
from multislice_operator.render.jobset import render_jobset
from tests.unit import jobs

NOW = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)
BODY: dict[str, Any] = {
    "apiVersion": "multislice.dev/v1alpha1",
    "kind": "MultisliceJob",
    "metadata": {"name": "train", "namespace": "team", "uid": "uid-7", "generation": 1},
    "spec": {
        "accelerator": "v5litepod-16",  # 4 hosts per slice
        "slices": 3,
        "elastic": {"minSlices": 1},
        "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
    },
}


def planned(body: dict[str, Any] = BODY) -> tuple[Any, Any]:
    job = load_job(copy.deepcopy(body))
    return job, plan_job(job)


def pod_spec(jobset: dict[str, Any]) -> dict[str, Any]:
    (rjob,) = jobset["spec"]["replicatedJobs"]
    spec: dict[str, Any] = rjob["template"]["spec"]["template"]["spec"]
    return spec


# ------------------------------------------------------------------------- render


def test_the_gang_is_every_pod_of_every_slice_and_every_pod_names_it() -> None:
    job, plan = planned()
    jobset = render_jobset(plan, job.spec, gang=True)
    assert pod_spec(jobset)["schedulingGroup"] == {"podGroupName": "train"}
    group = podgroup.render_pod_group(plan, {"uid": "uid-7"})
    assert group["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert group["kind"] == "PodGroup"
    assert (group["metadata"]["name"], group["metadata"]["namespace"]) == ("train", "team")
    # Every pod the JobSet creates: its replicas (slices) times each Job's parallelism (hosts).
    (rjob,) = jobset["spec"]["replicatedJobs"]
    pods = rjob["replicas"] * rjob["template"]["spec"]["parallelism"]
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": pods}}}
    assert pods == 3 * 4
    assert group["metadata"]["ownerReferences"] == [{"uid": "uid-7"}]


def test_a_ganged_jobset_places_its_slices_itself_not_through_jobsets_webhook() -> None:
    # JobSet's webhook holds a slice's other pods back until its first is bound: with the
    # annotation, a gang of every pod could never form.
    job, plan = planned()
    jobset = render_jobset(plan, job.spec, gang=True)
    assert keys.JOBSET_EXCLUSIVE_TOPOLOGY not in jobset["metadata"]["annotations"]
    assert (
        keys.JOBSET_EXCLUSIVE_TOPOLOGY in render_jobset(plan, job.spec)["metadata"]["annotations"]
    )
    affinity = pod_spec(jobset)["affinity"]
    (together,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (alone,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # The terms JobSet's webhook writes on a slice's first pod (v0.12.0 setExclusiveAffinities),
    # each pod's own job-key and priority filled in by the apiserver from the keys.
    assert together == {
        "labelSelector": {"matchLabels": {keys.JOB_NAME: "train"}},
        "matchLabelKeys": ["jobset.sigs.k8s.io/job-key"],
        "topologyKey": "cloud.google.com/gke-nodepool",
    }
    assert alone == {
        "labelSelector": {
            "matchExpressions": [{"key": "jobset.sigs.k8s.io/job-key", "operator": "Exists"}]
        },
        "mismatchLabelKeys": ["jobset.sigs.k8s.io/job-key"],
        "matchLabelKeys": ["jobset.sigs.k8s.io/priority"],
        "namespaceSelector": {},
        "topologyKey": "cloud.google.com/gke-nodepool",
    }


def test_the_templates_own_affinity_is_kept_beside_the_gangs() -> None:
    body = copy.deepcopy(BODY)
    mine = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}
    body["spec"]["template"]["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [mine]}
    }
    job, plan = planned(body)
    affinity = pod_spec(render_jobset(plan, job.spec, gang=True))["affinity"]
    terms = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms) == 2 and terms[0] == mine
    assert len(affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]) == 1
    assert body["spec"]["template"]["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ] == [mine], "the job's spec is not changed"


def test_an_elastic_jobset_on_fewer_slices_gangs_the_slices_it_runs() -> None:
    _, plan = planned()
    assert podgroup.gang_size(plan.running_on(2)) == 2 * 4
    assert podgroup.gang_size(plan.running_on(1)) == 1 * 4


def test_without_pod_groups_the_template_is_as_before() -> None:
    job, plan = planned()
    assert "schedulingGroup" not in pod_spec(render_jobset(plan, job.spec))
    assert render_jobset(plan, job.spec) == render_jobset(plan, job.spec, gang=False)


def test_a_template_naming_a_group_of_its_own_is_refused_naming_the_field() -> None:
    # The operator's pod schema (api/kubeschema.py) has no schedulingGroup: the job's gang is
    # the operator's to make, and a template cannot name another.
    body = copy.deepcopy(BODY)
    body["spec"]["template"]["spec"]["schedulingGroup"] = {"podGroupName": "mine"}
    with pytest.raises(SpecError, match=r"spec\.template\.spec\.schedulingGroup: unknown field"):
        planned(body)


# ------------------------------------------------------------------------- decide


SLICES = [SliceObservation(i, f"pool-{i}", PoolState.READY, 4) for i in range(3)]


@pytest.mark.parametrize("served", [True, False])
def test_the_jobset_joins_a_gang_where_the_cluster_serves_pod_groups(served: bool) -> None:
    d = jobs.run(
        obs=jobs.Observed(now=NOW, slices=list(SLICES), pod_groups=served),
        slices=3,
        accelerator="v5litepod-16",
        provisioning={"mode": "Existing"},
    )
    (created,) = [a for a in d.actions if isinstance(a, CreateJobSet)]
    assert created.gang is served


# ------------------------------------------------------------------------- apply


class RecordingKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def apply_object(self, body: dict[str, Any], url: str) -> None:
        self.calls.append(("apply", url, body))

    async def create_jobset(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", "jobsets", body))
        return body


def create(action: CreateJobSet, body: dict[str, Any] = BODY) -> RecordingKube:
    job, plan = planned(body)
    k = RecordingKube()
    rt: Any = SimpleNamespace(kube=k, settings=None, created_jobsets={})
    asyncio.run(appliers.create_jobset(rt, appliers.Target(copy.deepcopy(body), job, plan), action))
    return k


def test_the_pod_group_is_applied_before_the_jobset_whose_pods_name_it() -> None:
    k = create(CreateJobSet(gang=True))
    assert [c[0] for c in k.calls] == ["apply", "create"]
    _, url, group = k.calls[0]
    assert url == "/apis/scheduling.k8s.io/v1beta1/namespaces/team/podgroups/train"
    assert group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 3 * 4
    (owner,) = group["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("MultisliceJob", "train", "uid-7")
    jobset = k.calls[1][2]
    assert pod_spec(jobset)["schedulingGroup"] == {"podGroupName": group["metadata"]["name"]}


def test_a_jobset_on_fewer_slices_applies_its_own_min_count() -> None:
    k = create(CreateJobSet(slices=1, gang=True))
    assert k.calls[0][2]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 1 * 4


def test_no_pod_group_where_none_is_served() -> None:
    k = create(CreateJobSet())
    assert [c[0] for c in k.calls] == ["create"]
    assert "schedulingGroup" not in pod_spec(k.calls[0][2])


# ------------------------------------------------------------------------- detect


class DiscoveryKube:
    def __init__(self, resources: list[str]) -> None:
        self.resources = resources
        self.asked: list[tuple[str, str]] = []

    async def served_versions(self, group: str) -> list[str] | None:
        return None

    async def served_resources(self, group: str, version: str) -> list[str]:
        self.asked.append((group, version))
        return self.resources

    async def get_crd(self, name: str) -> dict[str, Any] | None:
        return None


@pytest.mark.parametrize(
    ("resources", "served"),
    [(["workloads", "podgroups", "podgroups/status"], True), (["workloads"], False), ([], False)],
)
def test_pod_groups_are_detected_by_discovery(resources: list[str], served: bool) -> None:
    k = DiscoveryKube(resources)
    settings = SimpleNamespace(kueue=False)
    rt: Any = SimpleNamespace(
        settings=settings, kube=k, kueue_problem=None, jobset_problem=None, support={},
        slice_api=None, pod_groups=None,
    )  # fmt: skip
    asyncio.run(versions.check(rt))
    assert k.asked == [(keys.POD_GROUP_GROUP, keys.POD_GROUP_VERSION)]
    assert rt.pod_groups is served


def test_discovery_asks_the_group_version_and_reads_its_resources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    urls: list[str] = []

    class Response:
        async def __aenter__(self) -> Response:
            return self

        async def __aexit__(self, *_: object) -> None:
            return None

        async def json(self, **_: Any) -> dict[str, Any]:  # loads= (orjson)
            return {"resources": [{"name": "podgroups"}, {"name": "workloads"}]}

    async def answer(method: str, url: str, **_: Any) -> Any:
        urls.append(url)
        if url.endswith("/v1beta1"):
            return Response()
        raise kube.NotFound({"message": "gone", "code": 404}, status=404, headers={})

    monkeypatch.setattr(kube.kopf_api, "request", answer)
    k = kube.Kube(settings=None)  # type: ignore[arg-type]
    assert asyncio.run(k.served_resources("scheduling.k8s.io", "v1beta1")) == [
        "podgroups",
        "workloads",
    ]
    assert asyncio.run(k.served_resources("scheduling.k8s.io", "v1alpha9")) == []
    assert urls == ["/apis/scheduling.k8s.io/v1beta1", "/apis/scheduling.k8s.io/v1alpha9"]
