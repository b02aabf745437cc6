"""Restart strategy `InPlaceRestart`: the pods stay, their containers start again. Pure.

JobSet >= v0.11 carries it out itself (failurePolicy.restartStrategy InPlaceRestart, KEP-467,
JobSet feature gate `InPlaceRestart`; kubernetes-sigs/jobset v0.12.0
api/jobset/v1alpha2/jobset_types.go, pkg/controllers/in_place_restart.go) with the kubelet's
`RestartAllContainers` container restart rule (Kubernetes >= 1.35, KEP-5532, gate
`RestartAllContainersOnContainerExits`, beta and on by default in 1.36):

- a retryable exit of the TPU container matches its `restartPolicyRules` RestartAllContainers
  rule: the kubelet restarts every container of that pod, which keeps its name, node and UID;
- the pod's in-place restart agent (sidecar) starts again, writes the pod's attempt annotation
  `jobset.sigs.k8s.io/in-place-restart-attempt` (JobSet's current attempt + 1); the JobSet
  controller sees the attempts disagree and raises status.previousInPlaceRestartAttempt, which
  makes every other pod's agent exit with its restart code: those pods restart in place too;
- when every pod is on the same attempt the controller sets currentInPlaceRestartAttempt; each
  agent then answers its startup probe (the barrier) and the TPU container starts.

A pod that is gone (preemption, a lost node or pool, maintenance, eviction) fails its Job
through podFailurePolicy as before, and JobSet falls back to Recreate for a failed Job
(jobset_types.go: "When a Job has failed, fall back to action Recreate and execute the matching
failure policy rule"): those causes recreate under the same JobSet. render/inplace.py renders
the pod's half; nothing of it is done by a pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multislice_operator.api.models import Phase

if TYPE_CHECKING:
    from multislice_operator.reconcile.capacity import Capacity
    from multislice_operator.reconcile.context import Builder
    from multislice_operator.reconcile.facts import Facts

IN_PLACE_RESTART = "InPlaceRestart"  # JobSetRestartStrategy (jobset_types.go, enum)


class JobSetInPlace:
    """Every pod's containers restarted where the pod is, by the kubelet and JobSet."""

    name = IN_PLACE_RESTART

    def jobset_fields(self) -> dict[str, Any]:
        return {"restartStrategy": IN_PLACE_RESTART}

    def carry_out(self, f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
        return None  # the kubelet, the agents and JobSet restart the pods themselves


INPLACE = JobSetInPlace()
