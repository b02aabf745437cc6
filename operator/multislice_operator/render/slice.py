"""The GKE `Slice` of one slice of a dynamic-slicing job (accelerator.gke.io/v1beta1). Pure.

Fields as GKE's Slice reference gives them (spec.type, spec.topology, spec.partitionIds: the
cubes' cloud.google.com/gke-tpu-partition-4x4x4-id values), all immutable;
https://docs.cloud.google.com/kubernetes-engine/docs/reference/crds/slice. A Slice is
cluster-scoped, so it cannot be owned by the namespaced job: it carries the job's labels, which
the operator's watch maps back to the job, and the job's finalizer releases it.
"""

from __future__ import annotations

from typing import Any

from multislice_operator.common import keys
from multislice_operator.planning.plan import Plan


def render_slice(plan: Plan, name: str, topology: str, partitions: tuple[str, ...]
                 ) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": f"{keys.SLICE_GROUP}/{keys.SLICE_VERSION}",
        "kind": keys.SLICE_KIND,
        "metadata": {
            "name": name,
            "labels": {
                keys.MANAGED_BY: keys.MANAGED_BY_VALUE,
                keys.JOB_KEY: plan.job_key,
                keys.JOB_NAMESPACE: plan.namespace,
                keys.JOB_NAME: plan.name,
            },
        },
        "spec": {
            "type": plan.shape.generation.gke_accelerator,
            "topology": topology,
            "partitionIds": list(partitions),
        },
    }
