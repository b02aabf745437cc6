"""Optional steps a job's spec selects (reconcile/steps.py): a plain Existing or Managed job runs
no Kueue, MultiKueue, preflight or elastic code on any pass (traced: no function of those
modules is entered), and a job that asks for one does enter it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import pytest

from multislice_operator.common import keys
from multislice_operator.common.pools import PoolState
from multislice_operator.reconcile import JobMeta, JobSetObservation, SliceObservation
from multislice_operator.reconcile.steps import Steps, select
from tests.unit import jobs

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)
OPTIONAL = ("kueue_gate", "multikueue", "preflight", "elastic")
PKG = "multislice_operator.reconcile."


def entered(run: Callable[[], Any]) -> set[str]:
    """The optional steps' modules (reconcile/<step>.py) whose functions `run` enters."""
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, _: Any) -> None:
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith(PKG) and module[len(PKG) :] in OPTIONAL:
            seen.add(module[len(PKG) :])

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


RUNNING = {
    "phase": "Running",
    "jobSet": "job",
    "startTime": "2026-12-06T11:00:00Z",
    "slices": [{"index": i, "hosts": 4, "seenReady": True, "phase": "Running"} for i in (0, 1)],
}


def passes(meta: JobMeta = jobs.META, **spec: Any) -> list[Callable[[], Any]]:
    """A job's passes: before its JobSet, running steadily, a restart counted, succeeded, being
    deleted."""
    s, plan = jobs.spec_and_plan(**spec)
    names = [p.name for p in plan.node_pools] or ["pool-0", "pool-1"]
    slices = [SliceObservation(i, n, PoolState.READY, 4) for i, n in enumerate(names)]
    up = JobSetObservation(ready_jobs=2, replicas=2)
    restarted = JobSetObservation(ready_jobs=0, replicas=2, restarts=1, restarts_counted=1)
    done = JobSetObservation(completed=True, replicas=2)
    pods = jobs.running({0: 4, 1: 4})
    deleting = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True, deleting=True)
    cases: list[tuple[Any, Any, JobMeta]] = [
        (None, jobs.Observed(now=NOW, slices=slices), meta),
        (RUNNING, jobs.Observed(now=NOW, slices=slices, jobset=up, pods=pods), meta),
        (RUNNING, jobs.Observed(now=NOW, slices=slices, jobset=restarted), meta),
        (RUNNING, jobs.Observed(now=NOW, slices=slices, jobset=done), meta),
        (RUNNING, jobs.Observed(now=NOW, slices=slices, jobset=up), deleting),
    ]
    return [
        lambda old=old, obs=obs, m=m: jobs.run(old, obs, plan=(s, plan), meta=m)
        for old, obs, m in cases
    ]


@pytest.mark.parametrize("mode", ["Existing", "Managed"])
def test_a_plain_job_runs_no_optional_step_on_any_pass(mode: str) -> None:
    for run in passes(provisioning={"mode": mode}):
        assert entered(run) == set()


QUEUED = JobMeta("ns", "job", "uid-1", 1, labels={keys.KUEUE_QUEUE_NAME: "q"}, has_finalizer=True)


@pytest.mark.parametrize(
    ("meta", "spec", "step"),
    [
        (QUEUED, {}, "kueue_gate"),
        (jobs.META, {"preflight": {}}, "preflight"),
        (jobs.META, {"elastic": {"minSlices": 1}}, "elastic"),
        (QUEUED, {"managedBy": "kueue.x-k8s.io/multikueue"}, "multikueue"),
    ],
)
def test_a_job_that_asks_for_a_step_runs_it(meta: JobMeta, spec: dict[str, Any], step: str
                                            ) -> None:  # fmt: skip
    assert any(step in entered(run) for run in passes(meta, **spec))


def test_the_spec_and_labels_select_the_steps() -> None:
    plain, _ = jobs.spec_and_plan()
    assert select(jobs.META, plain) == Steps() and Steps().names == []
    every, _ = jobs.spec_and_plan(
        preflight={}, elastic={"minSlices": 1}, spares=1, managedBy="kueue.x-k8s.io/multikueue"
    )
    assert select(QUEUED, every).names == ["kueue", "multikueue", "preflight", "elastic", "spares"]
    worker = JobMeta("ns", "job", "u", 1, labels={keys.MULTIKUEUE_ORIGIN: "manager"})
    assert select(worker, plain).multikueue
    assert select(jobs.META, None) == Steps()  # an invalid spec asks for nothing
