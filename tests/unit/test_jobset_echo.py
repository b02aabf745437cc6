"""Issue 23 (operator CPU per job): the JobSet a pass just created, coming back through the watch
as it was created, is no news: every pass since the create already observed exactly it (the
created copy stands in until the index has it), and the status was written as the next pass would
see it. So its ADDED event costs no pass; any change, or its deletion, still does."""

from __future__ import annotations

import asyncio
from typing import Any

from multislice_operator.controller import handlers
from multislice_operator.controller import observe as ob
from multislice_operator.controller.runtime import JobKey, Runtime
from tests.unit.test_forget import NAMESPACE, Apiserver, event, job, runtime, until

KEY: JobKey = (NAMESPACE, "echo")
BATCH = handlers.DEPENDENT_EVENT_BATCH_SECONDS


async def created(api: Apiserver) -> tuple[Runtime, dict[str, Any]]:
    """One Existing job through its first pass: JobSet created, status Starting."""
    rt = handlers.RUNTIME = runtime(api)
    api.jobs[KEY] = job(KEY[1])
    await event(rt, api, "ADDED", KEY)
    worker = asyncio.create_task(handlers._worker(rt))
    try:
        await until(lambda: (api.jobs[KEY].get("status") or {}).get("phase") == "Starting", "up")
        await until(lambda: not rt.queue._processing, "the pass done")
    finally:
        worker.cancel()
    assert KEY in rt.created_jobsets
    return rt, api.jobsets[KEY]


async def watched(rt: Runtime, type_: str, body: dict[str, Any]) -> None:
    """What kopf does with a JobSet event: the index first, then the event handler."""
    jobsets: dict[Any, Any] = rt.indexes.jobsets  # type: ignore[assignment]
    if type_ == "DELETED":
        jobsets.pop(KEY, None)
    else:
        jobsets[KEY] = [ob.summarize_jobset(body)]
    await handlers.jobset_event(type=type_, namespace=KEY[0], name=KEY[1], body=body)


def due_within(rt: Runtime, seconds: float) -> bool:
    due = rt.queue._due.get(KEY)
    return due is not None and due <= asyncio.get_running_loop().time() + seconds


def test_our_own_jobset_coming_back_unchanged_costs_no_pass() -> None:
    asyncio.run(_unchanged())


def test_a_jobset_that_changed_since_we_created_it_is_looked_at() -> None:
    asyncio.run(_changed())


def test_a_deleted_jobset_is_looked_at() -> None:
    asyncio.run(_deleted())


async def _unchanged() -> None:
    rt, jobset = await created(Apiserver())
    assert not due_within(rt, BATCH + 0.5)  # next: the resync only
    await watched(rt, "ADDED", jobset)
    assert not due_within(rt, BATCH + 0.5)
    assert KEY not in rt.created_jobsets  # the index holds it now: nothing kept twice


async def _changed() -> None:
    rt, jobset = await created(Apiserver())
    running = {**jobset, "status": {"replicatedJobsStatus": [{"name": "slice", "ready": 2}]}}
    await watched(rt, "MODIFIED", running)
    assert due_within(rt, BATCH + 0.5)


async def _deleted() -> None:
    rt, jobset = await created(Apiserver())
    await watched(rt, "DELETED", jobset)
    assert due_within(rt, BATCH + 0.5)
