"""How each action decide() returns is carried out: one small applier per action type.

Appliers run in the order decide() listed the actions; one that raises stops the rest (the pass
is retried), so a pool is never created before the finalizer that guarantees its release exists.
Appliers act and report; they decide nothing. What they learn (a refused create, say) is what the
next observation sees.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from multislice_operator import keys, metrics
from multislice_operator.api.models import MultisliceJob
from multislice_operator.controller import admission
from multislice_operator.controller import observe as ob
from multislice_operator.controller.kube import ApiError, owner_reference
from multislice_operator.controller.runtime import Runtime
from multislice_operator.plan import Plan
from multislice_operator.provisioning.base import PoolError
from multislice_operator.reconcile import (
    Action,
    AddFinalizer,
    Admission,
    CreateJobSet,
    CreatePools,
    DeleteJob,
    DeleteJobSet,
    DeletePools,
    RemoveFinalizer,
    SetJobSetSuspend,
    ValidateJobSet,
)
from multislice_operator.render import render_jobset

log = logging.getLogger("multislice_operator")


@dataclass
class Target:
    """The job an action is for: its body as last read, the parsed job and its plan (None for a
    job whose spec no longer parses: only its pools and finalizer can be acted on)."""

    body: dict[str, Any]
    job: MultisliceJob | None
    plan: Plan | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def generation(self) -> int:
        return int(self.body["metadata"].get("generation") or 0)

    def planned(self) -> tuple[MultisliceJob, Plan]:
        if self.job is None or self.plan is None:  # decide() asks this of valid jobs only
            raise RuntimeError(f"no plan for {self.namespace}/{self.name}")
        return self.job, self.plan

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.body["metadata"].get("uid", ""))


Applier = Callable[[Runtime, Target, Any], Awaitable[None]]


def _count(action: str, errors: Iterable[PoolError]) -> None:
    metrics.GKE_CALLS_TOTAL.labels(action, "error" if list(errors) else "ok").inc()


async def add_finalizer(rt: Runtime, t: Target, _: AddFinalizer) -> None:
    updated = await rt.kube.add_finalizer(t.body, keys.FINALIZER)
    rt.store.put(updated)
    t.body = updated


async def remove_finalizer(rt: Runtime, t: Target, _: RemoveFinalizer) -> None:
    await rt.kube.remove_finalizer(t.body, keys.FINALIZER)
    log.info("node pools released, finalizer removed job=%s/%s", t.namespace, t.name)


async def create_pools(rt: Runtime, t: Target, action: CreatePools) -> None:
    if rt.provisioner is None:
        return
    _, plan = t.planned()
    pools = [p for p in plan.node_pools if p.slice_index in action.slices]
    result = await rt.provisioner.create(plan, pools, t.uid)
    _count("create", result.errors)
    for err in result.errors:
        log.warning("create refused job=%s/%s %s", t.namespace, t.name, err)


async def delete_pools(rt: Runtime, t: Target, action: DeletePools) -> None:
    if rt.provisioner is None:
        return
    if t.plan is not None:
        result = await rt.provisioner.delete(t.plan, list(action.pools))
    else:
        result = await rt.provisioner.delete_named(list(action.pools))
    _count("delete", result.errors)


def _jobset(t: Target) -> dict[str, Any]:
    job, plan = t.planned()
    jobset = render_jobset(plan, job.spec, job.metadata.labels)
    jobset["metadata"]["ownerReferences"] = [owner_reference(t.body)]
    return jobset


async def validate_jobset(rt: Runtime, t: Target, _: ValidateJobSet) -> None:
    verdict = await admission.judge(rt.kube, _jobset(t))
    rt.judged(t.key, t.uid, t.generation, verdict)
    rt.queue.add(t.key)  # what was learned is the next pass's observation: now, not at resync


async def create_jobset(rt: Runtime, t: Target, _: CreateJobSet) -> None:
    try:
        created = await rt.kube.create_jobset(_jobset(t))
    except ApiError as exc:
        refused = admission.refusal(exc)
        if refused is None:
            raise
        log.warning("jobset create refused job=%s/%s: %s", t.namespace, t.name, refused)
        rt.judged(t.key, t.uid, t.generation, Admission(refused=refused))
        rt.queue.add(t.key)
        return
    if created:
        log.info("jobset created job=%s/%s", t.namespace, t.name)
        return
    existing = await rt.kube.get_jobset(t.namespace, t.name)
    if existing is not None:
        owners = (existing.get("metadata") or {}).get("ownerReferences") or []
        if not any(o.get("uid") == t.uid for o in owners):
            summary = ob.summarize_jobset(existing)
            summary["owned"] = False
            rt.strangers[(t.namespace, t.name)] = summary


async def delete_jobset(rt: Runtime, t: Target, _: DeleteJobSet) -> None:
    await rt.kube.delete_jobset(t.namespace, t.name)
    rt.deleted_jobsets.add(t.key)
    log.info("jobset deleted job=%s/%s", t.namespace, t.name)


async def set_jobset_suspend(rt: Runtime, t: Target, action: SetJobSetSuspend) -> None:
    await rt.kube.set_jobset_suspend(t.namespace, t.name, action.suspend)


async def delete_job(rt: Runtime, t: Target, _: DeleteJob) -> None:
    log.info("ttl expired, deleting job=%s/%s", t.namespace, t.name)
    await rt.kube.delete_job(t.namespace, t.name)


APPLIERS: dict[type[Any], Applier] = {
    AddFinalizer: add_finalizer,
    RemoveFinalizer: remove_finalizer,
    CreatePools: create_pools,
    DeletePools: delete_pools,
    CreateJobSet: create_jobset,
    ValidateJobSet: validate_jobset,
    DeleteJobSet: delete_jobset,
    SetJobSetSuspend: set_jobset_suspend,
    DeleteJob: delete_job,
}


async def apply(rt: Runtime, target: Target, actions: Iterable[Action]) -> None:
    for action in actions:
        await APPLIERS[type(action)](rt, target, action)
