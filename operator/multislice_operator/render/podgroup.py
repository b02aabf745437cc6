"""The job's gang at the scheduler: one Kubernetes `PodGroup` for the pods of its JobSet. Pure.

Kubernetes 1.37 serves `scheduling.k8s.io/v1beta1` PodGroups where the `GenericWorkload` gate is
on (KEP-4671; k8s.io/api v0.37.2 scheduling/v1beta1). A pod joins one with
`spec.schedulingGroup.podGroupName`; the scheduler's GangScheduling plugin holds the group's pods
at Permit until `gang.minCount` of them have nodes (pkg/scheduler/framework/plugins/gangscheduling).
One group for the whole job, not one per slice: the JobSet has one pod template for all its
slices (one replicatedJob).

The gang is the slices' first pods, not every pod. JobSet's exclusive placement (every JobSet of
the operator's: a slice's Job alone on its node pool, or its Slice) admits a slice's other pods
only once its first pod is bound, and then pins them to that pod's pool (jobset v0.12.0
pkg/webhooks/pod_webhook.go ValidateCreate: "leader pod not yet scheduled, not creating follower
pod"). A gang of every pod would wait forever for pods that cannot exist before it binds. So
`minCount` is the number of slices: the first pod of every slice binds, claiming each slice's
pool, together or not at all; the pods that follow join the satisfied group and bind as they fit
on the pool their slice claimed. A Job whose template names a group is
left alone by the 1.37 Job controller (pkg/controller/job/job_scheduling_manager.go: "the user
brought their own PodGroup"); the JobSet controller (v0.12.0, k8s.io/api v0.36) keeps the field.
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
    """The first pod of each slice the JobSet runs (see above: the others follow once it is
    bound)."""
    return plan.slices


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


def join(pod_spec: dict[str, Any], plan: Plan) -> None:
    """Make the pod template's pods members of the job's group. A template cannot name a group
    itself: the operator's pod schema (api/kubeschema.py) refuses the field."""
    pod_spec["schedulingGroup"] = {"podGroupName": pod_group_name(plan)}
