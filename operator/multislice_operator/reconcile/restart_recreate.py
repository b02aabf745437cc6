"""Restart strategy `Recreate`: JobSet deletes every slice's Job and creates them again. Pure.

JobSet carries it out itself (failurePolicy.restartStrategy Recreate): a pod failure fails its
Job (podFailurePolicy), JobSet's failure policy restarts every slice, and every pod resumes from
the last checkpoint. The operator renders the field and only counts and explains the restart
(restarts.py, running.py); nothing of it is done by a pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multislice_operator.api.models import Phase

if TYPE_CHECKING:
    from multislice_operator.reconcile.capacity import Capacity
    from multislice_operator.reconcile.context import Builder
    from multislice_operator.reconcile.facts import Facts


class JobSetRecreate:
    """Every slice's Job deleted and created again, by JobSet."""

    name = "Recreate"

    def jobset_fields(self) -> dict[str, Any]:
        return {"restartStrategy": "Recreate"}

    def carry_out(self, f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
        return None  # JobSet restarts the slices itself


RECREATE = JobSetRecreate()
