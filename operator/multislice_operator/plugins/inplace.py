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

from multislice_operator.api.models import ConditionType, MultisliceJobSpec, RestartCause
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.restart_strategy import Chosen, JobSetStrategy
from multislice_operator.reconcile.types import Observed
from multislice_operator.registry import Registry
from multislice_operator.render import inplace

if TYPE_CHECKING:
    from multislice_operator.reconcile.context import Builder
    from multislice_operator.reconcile.facts import Facts
    from multislice_operator.settings import Settings

IN_PLACE_RESTART = "InPlaceRestart"  # JobSetRestartStrategy (jobset_types.go, enum)
USED = "program failures, hangs and asked restarts (exit 42) restart the pods in place"


class JobSetInPlace(JobSetStrategy):
    """Every pod's containers restarted where the pod is, by the kubelet and JobSet: the
    program's own failures, a hang and a restart it asks for (exit 42, cause workload). Causes
    whose pods are gone or must move (disruption, startup) recreate under the same JobSet."""

    name = IN_PLACE_RESTART
    description = "the pods kept, their containers started again"
    jobset_value = IN_PLACE_RESTART
    causes = frozenset({RestartCause.WORKLOAD, RestartCause.HANG})
    precedence = 20  # wherever the cluster has it
    includes = frozenset({"Recreate"})  # JobSet recreates a failed Job under it
    when = (
        "where the cluster has it (JobSet >= v0.11 with its InPlaceRestart gate, Kubernetes "
        ">= 1.35, --in-place-agent-image)"
    )

    probe: str | None = "multislice_operator.plugins.inplace_shell:probe_in_place"
    said = "in-place restart"

    def available(self, spec: MultisliceJobSpec | None, obs: Observed) -> bool:
        """The cluster restarts pods in place (its probe found it at start-up)."""
        support = obs.support.get(self.name)
        return support is not None and support.usable

    def render_job(self, job_spec: dict[str, Any], spec: MultisliceJobSpec,
                   settings: Settings | None) -> None:  # fmt: skip
        image = settings.in_place_agent_image if settings is not None else ""
        if not image:
            raise ValueError("InPlaceRestart needs the in-place restart agent's image")
        inplace.apply_to_job(job_spec)
        inplace.apply_to_pod(job_spec["template"]["spec"], spec, image)

    def companions(self, namespace: str, pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The agents' service account and its binding: their pods use them at once."""
        return inplace.render_rbac(namespace, inplace.service_account(pod))

    def announce(self, f: Facts, b: Builder, chosen: Chosen) -> None:
        """Whether the program's failures restart in place (condition RestartInPlace), and why
        not (the condition's message). No event: a cluster without it is a fact about the
        cluster, said once by the operator (its log), not a write per job (issue 57)."""
        support = f.obs.support.get(self.name)
        if support is None:
            return  # not found out (yet): JobSets recreate, and the job says nothing of it
        if any(s.name == self.name for s in chosen.values()):
            b.cond(ConditionType.RESTART_IN_PLACE, "True", Reason.IN_PLACE_RESTART, USED)
            return
        why = support.why if not support.usable else "another restart strategy was chosen"
        text = f"every restart recreates the pods: {why}"
        b.cond(ConditionType.RESTART_IN_PLACE, "False", Reason.IN_PLACE_UNAVAILABLE, text)


INPLACE = JobSetInPlace()


def register(r: Registry) -> None:
    r.add_strategy(INPLACE)
