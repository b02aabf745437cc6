"""The optional steps a job's spec selects, chosen once per pass (`Facts.steps`). Pure.

Kueue, MultiKueue, the preflight compile, an elastic slice count and hot spares are features a
job asks for; a job that asks for none runs none of their code: decide() enters a step's module
(kueue_gate.py, multikueue.py, preflight.py, elastic.py) only when the job selected it, and
tests/unit/test_steps.py traces a plain job's passes to hold that. A capacity model says whether
it accepts a feature at all (registry.CapacityPlugin.accepts: the spec rules refuse the others).
"""

from __future__ import annotations

from dataclasses import dataclass

from multislice_operator.api.models import MultisliceJobSpec
from multislice_operator.common import keys
from multislice_operator.reconcile.types import JobMeta


@dataclass(frozen=True)
class Steps:
    kueue: bool = False  # the job names a queue (label kueue.x-k8s.io/queue-name)
    # On a MultiKueue manager (spec.managedBy), or a worker's copy it dispatched (the origin label).
    multikueue: bool = False
    preflight: bool = False  # spec.preflight: compiled before any capacity
    elastic: bool = False  # spec.elastic: the slice count follows the pools
    spares: bool = False  # spec.spares: hot spares its capacity model keeps

    @property
    def names(self) -> list[str]:
        return [k for k, v in vars(self).items() if v]


NONE = Steps()


def select(meta: JobMeta, spec: MultisliceJobSpec | None) -> Steps:
    """The steps this job asks for (a job without a spec asks for none)."""
    if spec is None:
        return NONE
    labels = meta.labels
    return Steps(
        kueue=bool(labels.get(keys.KUEUE_QUEUE_NAME)),
        multikueue=spec.managed_by == keys.MULTIKUEUE_MANAGED_BY
        or keys.MULTIKUEUE_ORIGIN in labels,
        preflight=spec.preflight is not None,
        elastic=spec.elastic is not None,
        spares=spec.spares > 0,
    )
