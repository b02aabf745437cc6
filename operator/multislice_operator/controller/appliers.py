"""How each action decide() returns is carried out: one small applier per action type.

Appliers run in the order decide() listed the actions; one that raises stops the rest (the pass
is retried), so a pool is never created before the finalizer that guarantees its release exists.
Appliers act and report; they decide nothing. What they learn (a refused create, say) is what the
next observation sees.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from multislice_operator.api import models
from multislice_operator.api.models import MultisliceJob
from multislice_operator.common import keys
from multislice_operator.common.names import REPLICATED_JOB, preflight_job
from multislice_operator.common.pools import PoolError
from multislice_operator.controller import admission, kueue, metrics
from multislice_operator.controller import observe as ob
from multislice_operator.controller.kube import (
    ApiError,
    Conflict,
    NotFound,
    owner_reference,
)
from multislice_operator.controller.runtime import Runtime, template_key
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile import (
    Action,
    AddFinalizer,
    Admission,
    AdoptWorkload,
    AnnotatePods,
    CheckState,
    CreateJobSet,
    CreatePools,
    CreateWorkload,
    DeleteJob,
    DeleteJobSet,
    DeletePools,
    DeleteWorkload,
    EvictPods,
    FinishWorkload,
    ReclaimPods,
    ReleaseWorkload,
    RemoveFinalizer,
    SetAdmissionCheckState,
    SetJobSetSuspend,
    SetWorkloadActive,
    ValidateJobSet,
)
from multislice_operator.reconcile.multikueue import prebuilt_name
from multislice_operator.reconcile.preflight import CreatePreflightJob, DeletePreflightJob
from multislice_operator.reconcile.restart_strategy import rendering
from multislice_operator.registry import REGISTRY, resolve
from multislice_operator.render import kueue_workload, podgroup
from multislice_operator.render.jobset import render_jobset, render_pod_template
from multislice_operator.render.preflight import render_preflight_job

log = logging.getLogger("multislice_operator")
# Pod calls in flight at once for one action (a 256-slice job has a thousand pods).
POD_CALLS_IN_FLIGHT = 16


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
    rt.store.refresh(updated)
    t.body = updated


async def remove_finalizer(rt: Runtime, t: Target, _: RemoveFinalizer) -> None:
    await rt.kube.remove_finalizer(t.body, keys.FINALIZER)
    log.info("node pools released, finalizer removed job=%s/%s", t.namespace, t.name)


async def create_pools(rt: Runtime, t: Target, action: CreatePools) -> None:
    if rt.provisioner is None:
        return
    _, plan = t.planned()
    pools = [p for p in plan.pools if p.slice_index in action.slices]
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


def _on(t: Target, a: CreateJobSet | ValidateJobSet) -> Plan:
    """The plan the JobSet runs: on fewer slices than the spec's for an elastic job."""
    _, plan = t.planned()
    slices = a.slices if isinstance(a, CreateJobSet) else None
    return plan.running_on(slices) if slices else plan


def _jobset(rt: Runtime, t: Target, a: CreateJobSet | ValidateJobSet) -> dict[str, Any]:
    job, _ = t.planned()
    before = (a.restarts_before, a.counted_before) if isinstance(a, CreateJobSet) else (0, 0)
    gang = isinstance(a, CreateJobSet) and a.gang
    jobset = render_jobset(
        _on(t, a), job.spec, job.metadata.labels, *before, a.restart_strategy, rt.settings, gang
    )
    jobset["metadata"]["ownerReferences"] = [owner_reference(t.body)]
    return jobset


async def _apply_pod_group(rt: Runtime, t: Target, a: CreateJobSet) -> None:
    """The job's PodGroup, before the JobSet whose pods name it (a pod naming a group that does
    not exist yet waits for it; none binds without it). Applied, so a crash between the two
    and a JobSet recreated on another slice count both end with the group the JobSet needs."""
    group = podgroup.render_pod_group(_on(t, a), owner_reference(t.body))
    name = group["metadata"]["name"]
    await rt.kube.apply_object(group, podgroup.pod_group_path(t.namespace, name))


async def validate_jobset(rt: Runtime, t: Target, a: ValidateJobSet) -> None:
    """One dry run per template at a time: jobs of a template being judged wait for its
    verdict (a burst of a thousand identical jobs costs two requests, not two thousand)."""
    template = template_key(t.body)
    pending = rt.judging.get(template)
    if pending is not None:
        verdict = await asyncio.shield(pending)
    else:
        future: asyncio.Future[Admission] = asyncio.get_running_loop().create_future()
        rt.judging[template] = future
        try:
            verdict = await admission.judge(rt.kube, _jobset(rt, t, a))
            future.set_result(verdict)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: the waiters raise it, nobody logs it twice
            raise
        finally:
            rt.judging.pop(template, None)
    rt.judged(t.key, t.uid, t.generation, verdict, template)
    rt.queue.add(t.key)  # what was learned is the next pass's observation: now, not at resync


async def create_preflight_job(rt: Runtime, t: Target, _: CreatePreflightJob) -> None:
    """The compile Job, owned by the job (deleted with it); one that exists is left as it is."""
    job, plan = t.planned()
    body = render_preflight_job(plan, job.spec, t.generation, owner_reference(t.body))
    if await rt.kube.create_batch_job(body):
        log.info("preflight job created job=%s/%s", t.namespace, t.name)


async def delete_preflight_job(rt: Runtime, t: Target, _: DeletePreflightJob) -> None:
    name = preflight_job(t.name)
    found = await rt.kube.get_batch_job(t.namespace, name)
    uid = ((found or {}).get("metadata") or {}).get("uid")
    if uid:  # the one decide() looked at: ours (its owner uid), by its own uid
        await rt.kube.delete_batch_job(t.namespace, name, str(uid))
        log.info("preflight job deleted job=%s/%s", t.namespace, t.name)


async def create_jobset(rt: Runtime, t: Target, a: CreateJobSet) -> None:
    body = _jobset(rt, t, a)
    if a.gang:
        await _apply_pod_group(rt, t, a)
    strategy = rendering(a.restart_strategy)
    if strategy is not None:  # what its pods need first (in-place restart: the agents' RBAC)
        pod = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        for path, obj in strategy.companions(t.namespace, pod):
            await rt.kube.apply_object(obj, path)
    try:
        created = await rt.kube.create_jobset(body)
    except ApiError as exc:
        refused = admission.refusal(exc)
        if refused is None:
            raise
        log.warning("jobset create refused job=%s/%s: %s", t.namespace, t.name, refused)
        rt.judged(t.key, t.uid, t.generation, Admission(refused=refused))
        rt.queue.add(t.key)
        return
    if created is not None:
        # Seen as it is until the watch brings it: a pass in between must not create it again.
        rt.created_jobsets[t.key] = ob.summarize_jobset(created)
        log.info("jobset created job=%s/%s", t.namespace, t.name)
        return
    existing = await rt.kube.get_jobset(t.namespace, t.name)
    if existing is not None:
        owners = (existing.get("metadata") or {}).get("ownerReferences") or []
        if not any(o.get("uid") == t.uid for o in owners):
            # Not labelled ours (the index holds those): assemble() judges whose it is.
            rt.strangers[(t.namespace, t.name)] = ob.summarize_jobset(existing)


async def delete_jobset(rt: Runtime, t: Target, a: DeleteJobSet) -> None:
    await rt.kube.delete_jobset(t.namespace, t.name, a.uid, foreground=a.foreground)
    rt.deleted_jobsets.add(t.key)
    what = f" (an earlier job's, uid {a.uid})" if a.uid else ""
    log.info("jobset deleted%s job=%s/%s", what, t.namespace, t.name)


async def set_jobset_suspend(rt: Runtime, t: Target, action: SetJobSetSuspend) -> None:
    await rt.kube.set_jobset_suspend(t.namespace, t.name, action.suspend)


async def _each_pod(
    what: str, t: Target, pods: Iterable[str], call: Callable[[str], Awaitable[bool]]
) -> int:
    """`call` on every pod, a few at a time; best effort: a refusal (RBAC, a disruption
    budget) is logged and the pass goes on (the next one tries again)."""
    gate = asyncio.Semaphore(POD_CALLS_IN_FLIGHT)
    refused: list[str] = []

    async def one(pod: str) -> bool:
        async with gate:
            try:
                return await call(pod)
            except ApiError as exc:
                refused.append(f"{pod} ({exc.status})")
                return False

    done = sum(await asyncio.gather(*(one(p) for p in pods)))
    if refused:
        log.warning(
            "%s refused job=%s/%s pods=%s", what, t.namespace, t.name, ", ".join(refused[:5])
        )
    return done


async def annotate_pods(rt: Runtime, t: Target, a: AnnotatePods) -> None:
    value = {a.key: a.value}
    n = await _each_pod(
        "annotate", t, a.pods, lambda pod: rt.kube.annotate_pod(t.namespace, pod, value)
    )
    log.info("pods annotated job=%s/%s %s=%s pods=%d", t.namespace, t.name, a.key, a.value, n)


async def evict_pods(rt: Runtime, t: Target, a: EvictPods) -> None:
    n = await _each_pod("evict", t, a.pods, lambda pod: rt.kube.evict_pod(t.namespace, pod))
    log.info("pods evicted job=%s/%s pods=%d", t.namespace, t.name, n)


async def delete_job(rt: Runtime, t: Target, _: DeleteJob) -> None:
    log.info("ttl expired, deleting job=%s/%s", t.namespace, t.name)
    await rt.kube.delete_job(t.namespace, t.name)


async def set_admission_check_state(rt: Runtime, t: Target, a: SetAdmissionCheckState) -> None:
    """Our check's state on the Workload decide() looked at: our own entry of
    status.admissionChecks, server-side applied (Kueue's entries and fields stay Kueue's). Written
    against the resourceVersion decided on: if the Workload moved since (Kueue evicted it, say),
    nothing is written and the watch event of that change brings the next pass."""
    labels = t.body["metadata"].get("labels") or {}
    prebuilt = prebuilt_name(labels, t.body["metadata"].get("annotations") or {})
    summary = kueue.workload_summary(rt, t.namespace, t.name, prebuilt)
    if summary is None or summary["name"] != a.workload:
        return
    written = await kueue.write_check(rt, summary, a, f"job={t.namespace}/{t.name}")
    if written and a.state == CheckState.RETRY and keys.MULTIKUEUE_ORIGIN in labels:
        rt.multikueue_lost[(t.namespace, a.workload)] = datetime.now(UTC)
        if rt.heartbeat is not None:  # remembered now, not at the next beat: a crash keeps it
            await rt.heartbeat.beat()


async def set_workload_active(rt: Runtime, t: Target, a: SetWorkloadActive) -> None:
    await rt.kube.set_workload_active(t.namespace, a.workload, a.active)
    log.info("workload %s active=%s job=%s/%s", a.workload, a.active, t.namespace, t.name)


async def create_workload(rt: Runtime, t: Target, a: CreateWorkload) -> None:
    job, plan = t.planned()
    labels = job.metadata.labels
    body = kueue_workload.render_workload(
        plan,
        render_pod_template(plan, job.spec),
        uid=t.uid,
        queue=labels[keys.KUEUE_QUEUE_NAME],
        priority_class=labels.get(keys.KUEUE_PRIORITY_CLASS),
        priority=a.priority,
    )
    try:
        created = await rt.kube.create_workload(body)
    except NotFound:  # no Workload API: decide() says so once its bound passed
        log.warning("no Kueue Workload API here job=%s/%s", t.namespace, t.name)
        return
    if created is not None:
        kueue.remember_created(rt, t.key, created)
        log.info(
            "workload %s created job=%s/%s tpu=%d",
            body["metadata"]["name"], t.namespace, t.name, kueue_workload.quota_chips(plan),
        )  # fmt: skip


async def delete_workload(rt: Runtime, t: Target, a: DeleteWorkload) -> None:
    await rt.kube.delete_workload(t.namespace, a.workload, a.resource_version)
    log.info("workload %s deleted (another option's) job=%s/%s", a.workload, *t.key)


async def _workload_status(
    rt: Runtime, t: Target, name: str, resource_version: str | None,
    status: Callable[[dict[str, Any]], dict[str, Any] | None],
) -> bool:  # fmt: skip
    """Write `status(workload)` on the Workload as read now (conditions carried back whole),
    guarded by its resourceVersion; nothing if it moved from `resource_version` or is gone."""
    found = await rt.kube.get_workload(t.namespace, name)
    if found is None:
        return False
    rv = str(found["metadata"].get("resourceVersion", ""))
    if resource_version is not None and rv != resource_version:
        log.info("workload moved, not written job=%s/%s", t.namespace, t.name)
        return False
    body = status(found)
    if body is None:
        return False
    try:
        await rt.kube.patch_workload_status(t.namespace, name, rv, body)
    except Conflict:
        log.info("workload changed under us, not written job=%s/%s", t.namespace, t.name)
        return False
    return True


def _parts(wl: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    st = wl.get("status") or {}
    return (list(st.get("conditions") or []), list(st.get("admissionChecks") or []),
            int(wl["metadata"].get("generation") or 0))  # fmt: skip


async def adopt_workload(rt: Runtime, t: Target, a: AdoptWorkload) -> None:
    owner = {
        "apiVersion": f"{models.GROUP}/{models.VERSION}",
        "kind": models.KIND,
        "name": t.name,
        "uid": t.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    try:
        await rt.kube.adopt_workload(t.namespace, a.workload, a.resource_version, owner)
    except (Conflict, NotFound):
        log.info("workload moved or gone, not adopted job=%s/%s", t.namespace, t.name)
        return
    log.info("workload %s adopted job=%s/%s", a.workload, t.namespace, t.name)


async def release_workload(rt: Runtime, t: Target, a: ReleaseWorkload) -> None:
    def status(wl: dict[str, Any]) -> dict[str, Any] | None:
        conditions, checks, generation = _parts(wl)
        return kueue_workload.released_status(conditions, checks, generation, datetime.now(UTC))

    if await _workload_status(rt, t, a.workload, a.resource_version, status):
        log.info("workload %s quota released job=%s/%s", a.workload, t.namespace, t.name)


async def reclaim_pods(rt: Runtime, t: Target, a: ReclaimPods) -> None:
    def status(_: dict[str, Any]) -> dict[str, Any]:
        return {"reclaimablePods": [{"name": REPLICATED_JOB, "count": a.count}]}

    if await _workload_status(rt, t, a.workload, a.resource_version, status):
        log.info("workload %s reclaimable pods=%d job=%s/%s", a.workload, a.count, *t.key)


async def finish_workload(rt: Runtime, t: Target, a: FinishWorkload) -> None:
    def status(wl: dict[str, Any]) -> dict[str, Any] | None:
        conditions, _, generation = _parts(wl)
        return kueue_workload.finished_status(
            conditions, a.succeeded, a.message, generation, datetime.now(UTC)
        )

    if await _workload_status(rt, t, a.workload, None, status):
        log.info("workload %s finished job=%s/%s", a.workload, t.namespace, t.name)


APPLIERS: dict[type[Any], Applier] = {
    AddFinalizer: add_finalizer,
    RemoveFinalizer: remove_finalizer,
    CreatePools: create_pools,
    DeletePools: delete_pools,
    CreateJobSet: create_jobset,
    ValidateJobSet: validate_jobset,
    CreatePreflightJob: create_preflight_job,
    DeletePreflightJob: delete_preflight_job,
    DeleteJobSet: delete_jobset,
    SetJobSetSuspend: set_jobset_suspend,
    DeleteJob: delete_job,
    SetAdmissionCheckState: set_admission_check_state,
    SetWorkloadActive: set_workload_active,
    CreateWorkload: create_workload,
    DeleteWorkload: delete_workload,
    ReleaseWorkload: release_workload,
    AdoptWorkload: adopt_workload,
    ReclaimPods: reclaim_pods,
    FinishWorkload: finish_workload,
    AnnotatePods: annotate_pods,
    EvictPods: evict_pods,
}


def applier(action: Action) -> Applier:
    """The action's applier: the core's, or the one its capacity model registered (a reference
    `module:function`, loaded on first use)."""
    kind = type(action)
    found = APPLIERS.get(kind)
    if found is None:
        ref = next((m.appliers[kind] for m in REGISTRY.models().values() if kind in m.appliers),
                   None)  # fmt: skip
        if ref is None:
            raise TypeError(f"no applier for {kind.__name__}: no capacity model registers one")
        found = APPLIERS[kind] = resolve(ref)
    return found


async def apply(rt: Runtime, target: Target, actions: Iterable[Action]) -> None:
    for action in actions:
        await applier(action)(rt, target, action)
