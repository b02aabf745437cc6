"""Restart strategy `Recreate`: JobSet deletes every slice's Job and creates them again. Pure.

JobSet carries it out itself (failurePolicy.restartStrategy Recreate): a pod failure fails its
Job (podFailurePolicy), JobSet's failure policy restarts every slice, and every pod resumes from
the last checkpoint. The operator renders the field and only counts and explains the restart
(restarts.py, running.py); nothing of it is done by a pass. Every cause JobSet restarts.
"""

from __future__ import annotations

from multislice_operator.api.models import RestartCause
from multislice_operator.reconcile.restart_strategy import JobSetStrategy
from multislice_operator.registry import Registry


class JobSetRecreate(JobSetStrategy):
    """Every slice's Job deleted and created again, by JobSet."""

    name = "Recreate"
    jobset_value = "Recreate"
    causes = frozenset(
        {RestartCause.DISRUPTION, RestartCause.WORKLOAD, RestartCause.HANG, RestartCause.STARTUP}
    )
    precedence = 10


RECREATE = JobSetRecreate()


def register(r: Registry) -> None:
    r.add_strategy(RECREATE)
