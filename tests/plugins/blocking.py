"""Restart strategy `BlockingRecreate`, a plugin written outside the package (issue 53's proof):
JobSet's own BlockingRecreate (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go, since
v0.8: "Ensures that all Jobs (and their Pods) from the previous iteration are deleted before
creating new Jobs"). JobSet carries it out; the operator renders it and counts its restarts from
the JobSet, as it does Recreate's. Loaded, it restarts every cause JobSet restarts, for every job
(its precedence is above Recreate's and InPlaceRestart's).
"""

from __future__ import annotations

from multislice_operator.api.models import RestartCause
from multislice_operator.reconcile.restart_strategy import JobSetStrategy
from multislice_operator.registry import Registry


class BlockingRecreate(JobSetStrategy):
    name = "BlockingRecreate"
    description = "every pod deleted, none created again until all are gone"
    jobset_value = "BlockingRecreate"
    causes = frozenset(
        {RestartCause.DISRUPTION, RestartCause.WORKLOAD, RestartCause.HANG, RestartCause.STARTUP}
    )
    precedence = 30


BLOCKING = BlockingRecreate()


def register(r: Registry) -> None:
    r.add_strategy(BLOCKING)
