"""The job's gang at the scheduler: one Kubernetes `PodGroup` for the pods of its JobSet. Pure.

Kubernetes 1.37 serves `scheduling.k8s.io/v1beta1` PodGroups where the `GenericWorkload` gate is
on (KEP-4671; k8s.io/api v0.37.2 scheduling/v1beta1). A pod joins one with
`spec.schedulingGroup.podGroupName`; the scheduler's GangScheduling plugin holds the group's pods
at Permit until `gang.minCount` of them have nodes (pkg/scheduler/framework/plugins/gangscheduling).
One group for the whole job, not one per slice: the JobSet has one pod template for all its
slices (one replicatedJob), and a pod names its group in that template. The group's gang is
every pod of every slice (`minCount` = slices x hosts), so each slice's pods bind together, and
all slices together, or none: what a CompositePodGroup of one gang per slice would say (KEP-6012,
alpha), without the alpha gate.

Such a job does not use JobSet's exclusive-placement annotation. Its pod webhook admits a slice's
other pods only once the slice's first pod is bound (jobset v0.12.0 pkg/webhooks/pod_webhook.go
ValidateCreate: "leader pod not yet scheduled, not creating follower pod"), so a gang of every
pod would wait forever for pods that cannot exist before it binds, and a gang of the first pods
only lets a slice's others bind one by one after it. The template carries the same placement
instead, written once for every slice with `matchLabelKeys` / `mismatchLabelKeys` (GA since
Kubernetes 1.33; the apiserver fills in each pod's own `job-key` when it creates the pod): a
slice's pods share one pool (or Slice), which no pod of another slice or JobSet of the same
priority shares. The webhook wrote those same two terms on each slice's first pod. A Job whose
template names a group is left alone by the 1.37 Job controller
(pkg/controller/job/job_scheduling_manager.go: "the user brought their own PodGroup"); the JobSet
controller (v0.12.0, k8s.io/api v0.36) keeps the field.
"""

from __future__ import annotations

from typing import Any

from multislice_operator.common import keys
from multislice_operator.planning.plan import Plan

POD_GROUP_API_VERSION = f"{keys.POD_GROUP_GROUP}/{keys.POD_GROUP_VERSION}"


def pod_group_name(plan: Plan) -> str:
    """The JobSet's name: one group per JobSet, so a JobSet recreated on fewer slices
    (spec.elastic) re-applies it with its own minCount."""
    return plan.name


def pod_group_path(namespace: str, name: str) -> str:
    return f"/apis/{POD_GROUP_API_VERSION}/namespaces/{namespace}/{keys.POD_GROUP_PLURAL}/{name}"


def gang_size(plan: Plan) -> int:
    """Every pod of every slice the JobSet runs."""
    return plan.slices * plan.shape.hosts


def render_pod_group(plan: Plan, owner: dict[str, Any]) -> dict[str, Any]:
    """The job's PodGroup, owned by the job (the garbage collector removes it with the job)."""
    return {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": keys.POD_GROUP_KIND,
        "metadata": {
            "name": pod_group_name(plan),
            "namespace": plan.namespace,
            "labels": {keys.JOB_NAME: plan.name, keys.MANAGED_BY: keys.MANAGED_BY_VALUE},
            "ownerReferences": [owner],
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": gang_size(plan)}}},
    }


def join(pod_spec: dict[str, Any], plan: Plan, topology: str) -> None:
    """Make the pod template's pods members of the job's group, each slice's alone on one
    domain of the node label `topology` (its pool, or its Slice). A template cannot name a group
    itself: the operator's pod schema (api/kubeschema.py) refuses the field."""
    pod_spec["schedulingGroup"] = {"podGroupName": pod_group_name(plan)}
    affinity = pod_spec.setdefault("affinity", {}) or {}
    pod_spec["affinity"] = affinity
    for kind, term in (("podAffinity", _together(plan, topology)),
                       ("podAntiAffinity", _alone(topology))):  # fmt: skip
        rules = affinity.setdefault(kind, {}) or {}
        affinity[kind] = rules
        required = "requiredDuringSchedulingIgnoredDuringExecution"
        rules[required] = [*(rules.get(required) or []), term]


def _together(plan: Plan, topology: str) -> dict[str, Any]:
    """The slice's pods on one domain: the job's pods with this pod's job-key (a selector of
    its own beside `matchLabelKeys`: the apiserver refuses a key in both)."""
    return {
        "labelSelector": {"matchLabels": {keys.JOB_NAME: plan.name}},
        "matchLabelKeys": [keys.JOBSET_JOB_KEY],
        "topologyKey": topology,
    }


def _alone(topology: str) -> dict[str, Any]:
    """No pod of another slice or JobSet on the domain, but of another priority (which may
    preempt it), in any namespace: JobSet's own exclusive terms."""
    return {
        "labelSelector": {"matchExpressions": [{"key": keys.JOBSET_JOB_KEY, "operator": "Exists"}]},
        "mismatchLabelKeys": [keys.JOBSET_JOB_KEY],
        "matchLabelKeys": [keys.JOBSET_PRIORITY],
        "namespaceSelector": {},
        "topologyKey": topology,
    }
