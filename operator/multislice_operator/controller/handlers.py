"""kopf wiring: watches feed small indexes; one level-based loop per MultisliceJob does the rest.

Each job has a daemon that reconciles when anything about it changes (its own object, its JobSet,
its pods, its nodes) or when its resync timer fires: observe -> decide (pure) -> act -> write the
status only if it changed. Deletion goes through a finalizer so node pools are released even if the
operator was down when the job was deleted.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import random
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import kopf

from multislice_operator import (
    keys,
    metrics,
)
from multislice_operator.api import (
    models,
)
from multislice_operator.controller import (
    observe as ob,
)
from multislice_operator.controller.kube import (
    Kube,
    load_api_client,
    owner_reference,
)
from multislice_operator.errors import (
    SpecError,
)
from multislice_operator.plan import (
    Plan,
    load_job,
    plan_job,
)
from multislice_operator.provisioning.base import (
    PoolError,
    PoolState,
    Provisioner,
)
from multislice_operator.reconcile import (
    CreateJobSet,
    CreatePools,
    DecideConfig,
    Decision,
    DeleteJob,
    DeletePools,
    JobMeta,
    Observed,
    SetJobSetSuspend,
    decide,
    parse_time,
)
from multislice_operator.render import (
    render_jobset,
)
from multislice_operator.settings import (
    Settings,
)

log = logging.getLogger("multislice_operator")

MSJ = (models.GROUP, models.VERSION, models.PLURAL)
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
MEMORY_TRIM_SECONDS = 10.0

# Events that mean a slice failed, by the metric's reason label.
SLICE_FAILURE_REASONS = {
    "RestartingAllSlices": "pod_failure",
    "SliceLost": "capacity_lost",
    "GangRolledBack": "gang_rollback",
}
for _reason in SLICE_FAILURE_REASONS.values():
    metrics.SLICE_FAILURES_TOTAL.labels(_reason)  # exported at 0 before the first failure

ProvisionerFactory = Callable[[Settings], Provisioner | None]


@dataclass
class Runtime:
    settings: Settings
    kube: Kube
    provisioner: Provisioner | None
    cfg: DecideConfig
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    strangers: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)  # uids whose pools were seen all gone
    offered: dict[str, PoolError | None] = field(default_factory=dict)
    phases: dict[tuple[str, str], str] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # The job as our last status write returned it, kept until kopf's copy catches up: a reconcile
    # woken in between (by the JobSet just created, say) must not decide again from the older
    # status, which would write the same status and post the same event a second time.
    written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakeups.setdefault((namespace, name), asyncio.Event())

    def poke(self, namespace: str | None, name: str | None) -> None:
        if namespace and name and (namespace, name) in self.wakeups:
            self.wakeups[(namespace, name)].set()

    def poke_all(self) -> None:
        for event in self.wakeups.values():
            event.set()


class ObservationError(RuntimeError):
    """The cloud could not be read; act on nothing and look again shortly."""


RUNTIME: Runtime | None = None
PROVISIONER_FACTORY: ProvisionerFactory | None = None


def runtime() -> Runtime:
    if RUNTIME is None:  # pragma: no cover - startup always runs first
        raise RuntimeError("operator not started")
    return RUNTIME


# ---------------------------------------------------------------- lifecycle


def configure(settings: Settings, factory: ProvisionerFactory | None) -> None:
    """Called by `run` before kopf starts: settings and how to build the provisioner."""
    global PROVISIONER_FACTORY, _SETTINGS
    _SETTINGS = settings
    PROVISIONER_FACTORY = factory


_SETTINGS: Settings | None = None


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    global RUNTIME
    ours = _SETTINGS or Settings()
    settings.persistence.finalizer = keys.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="multislice.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="multislice.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # our own events are explicit; no log spam as events
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    if ours.peering:
        settings.peering.name = ours.peering
        # kopf pauses a replica that sees a peer of higher *or equal* priority: distinct
        # priorities let exactly one replica work while the others stand by.
        settings.peering.priority = ours.peering_priority or random.randint(1, 2**31 - 1)
    settings.peering.stealth = True
    loop = asyncio.get_running_loop()
    from concurrent.futures import ThreadPoolExecutor

    loop.set_default_executor(ThreadPoolExecutor(max_workers=32, thread_name_prefix="msj-io"))
    provisioner = PROVISIONER_FACTORY(ours) if PROVISIONER_FACTORY else None
    RUNTIME = Runtime(
        settings=ours,
        kube=Kube(load_api_client()),
        provisioner=provisioner,
        cfg=DecideConfig(
            backoff_base_seconds=ours.backoff_base_seconds,
            backoff_max_seconds=ours.backoff_max_seconds,
            resync_seconds=ours.resync_seconds,
        ),
    )
    metrics.serve(ours.metrics_port)
    if provisioner is not None and ours.gc_interval_seconds > 0:
        RUNTIME.tasks.append(asyncio.create_task(_gc_loop(RUNTIME)))
    trim = _malloc_trim()
    if trim is not None:
        RUNTIME.tasks.append(asyncio.create_task(_trim_loop(trim)))
    log.info(
        "operator started namespaces=%s provisioner=%s metrics_port=%s",
        ",".join(ours.namespaces) or "*",
        type(provisioner).__name__ if provisioner else "none",
        ours.metrics_port,
    )


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if RUNTIME is not None:
        for task in RUNTIME.tasks:
            task.cancel()


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None where there is none (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


async def _trim_loop(trim: Callable[[], object]) -> None:
    """Hand the heap pages freed after a burst (many jobs created or changed at once) back to the
    OS: glibc keeps them otherwise, and resident memory would stay at the burst's high-water mark
    (about 30 MiB more at 100 or 1000 jobs, see docs/benchmarks.md). A trim takes milliseconds."""
    while True:
        await asyncio.sleep(MEMORY_TRIM_SECONDS)
        trim()


# ---------------------------------------------------------------- indexes and wake-ups
#
# Coroutines on purpose: kopf runs a plain function in its executor (a thread hop per watch event,
# through a pool of min(32, cpus + 4) threads shared by every object), and an asyncio.Event set
# from such a thread does not wake the event loop. These only summarize and poke: no I/O.


@kopf.index(*JOBSETS, labels={keys.MANAGED_BY: keys.MANAGED_BY_VALUE})
async def jobset_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): ob.summarize_jobset(body)}


@kopf.index("", "v1", "pods", labels={keys.JOB_NAME: kopf.PRESENT})
async def pod_index(
    namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    return {(namespace, labels[keys.JOB_NAME]): ob.summarize_pod(body)}


@kopf.index("", "v1", "nodes", labels={keys.GKE_NODEPOOL: kopf.PRESENT})
async def node_index(labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {labels[keys.GKE_NODEPOOL]: ob.summarize_node(body)}


@kopf.on.event(*JOBSETS, labels={keys.MANAGED_BY: keys.MANAGED_BY_VALUE})
async def jobset_event(namespace: str, name: str, **_: Any) -> None:
    runtime().poke(namespace, name)


@kopf.on.event("", "v1", "pods", labels={keys.JOB_NAME: kopf.PRESENT})
async def pod_event(namespace: str, labels: kopf.Labels, **_: Any) -> None:
    runtime().poke(namespace, labels[keys.JOB_NAME])


@kopf.on.event("", "v1", "nodes", labels={keys.GKE_NODEPOOL: kopf.PRESENT})
async def node_event(labels: kopf.Labels, **_: Any) -> None:
    rt = runtime()
    if keys.JOB_NAMESPACE in labels and keys.JOB_NAME in labels:
        rt.poke(labels[keys.JOB_NAMESPACE], labels[keys.JOB_NAME])
    else:  # an Existing-mode node pool may be what some job waits for
        rt.poke_all()


@kopf.on.event(*MSJ)
async def job_event(namespace: str, name: str, **_: Any) -> None:
    runtime().poke(namespace, name)


# ---------------------------------------------------------------- the per-job loop


@kopf.daemon(*MSJ, cancellation_timeout=10.0, initial_delay=0)
async def reconcile_loop(
    namespace: str,
    name: str,
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    jobset_index: kopf.Index[Any, Any],
    pod_index: kopf.Index[Any, Any],
    node_index: kopf.Index[Any, Any],
    **_: Any,
) -> None:
    rt = runtime()
    wake = rt.wakeup(namespace, name)
    try:
        while not stopped:
            wake.clear()
            delay = await reconcile_once(rt, body, jobset_index, pod_index, node_index)
            await _sleep_until(wake, stopped, delay)
            await asyncio.sleep(0.05)  # let a burst of watch events land before the next look
    finally:
        rt.wakeups.pop((namespace, name), None)
        rt.written.pop((namespace, name), None)


async def _sleep_until(wake: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> None:
    """Sleep until poked, stopped (the job is being deleted) or the resync delay passes."""
    waiters = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())}
    try:
        await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _store(index: Mapping[Any, Any], key: Any) -> list[Any]:
    store = index.get(key)
    return list(store) if store is not None else []


async def reconcile_once(
    rt: Runtime,
    body: Mapping[str, Any],
    jobset_index: Mapping[Any, Any],
    pod_index: Mapping[Any, Any],
    node_index: Mapping[Any, Any],
) -> float:
    """One observe -> decide -> act pass. Never raises: errors are logged and retried later."""
    started = time.perf_counter()
    meta = body.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    try:
        decision = await _reconcile(rt, _freshest(rt, body), jobset_index, pod_index, node_index)
    except Exception as exc:  # the operator must keep serving every other job
        log.exception("reconcile failed job=%s/%s error=%s", ns, name, exc)
        metrics.RECONCILE_TOTAL.labels("error").inc()
        return 5.0
    finally:
        metrics.RECONCILE_TIME.observe(time.perf_counter() - started)
    metrics.RECONCILE_TOTAL.labels("requeue" if decision.requeue_after else "success").inc()
    phase = decision.status.get("phase")
    idle = rt.cfg.resync_seconds * (6 if phase in models.TERMINAL_PHASES else 1)
    return decision.requeue_after if decision.requeue_after is not None else idle


def _resource_version(body: Mapping[str, Any]) -> int | None:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:  # opaque to clients in general; etcd's are integers
        return None


def _freshest(rt: Runtime, body: Mapping[str, Any]) -> dict[str, Any]:
    """kopf's copy of the job, or the one our last status write returned when that is newer."""
    current = dict(body)
    meta = current.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    written = rt.written.get(key)
    if written is None:
        return current
    ours, theirs = _resource_version(written), _resource_version(current)
    same = (written.get("metadata") or {}).get("uid") == meta.get("uid")
    if same and ours is not None and theirs is not None and ours > theirs:
        return dict(written)
    del rt.written[key]  # kopf has seen our write (or the job was replaced): back to its copy
    return current


def _parse(body: dict[str, Any]) -> tuple[Any, Plan | None, SpecError | None]:
    try:
        job = load_job(body)
        return job, plan_job(job), None
    except SpecError as exc:
        return None, None, exc
    except Exception as exc:  # a body no model can read still gets a status, not a crash
        return None, None, SpecError([ob_error(str(exc))])


def ob_error(message: str) -> Any:
    from multislice_operator.errors import FieldError

    return FieldError("spec", message)


async def _observe(
    rt: Runtime,
    body: dict[str, Any],
    plan: Plan,
    jobset_index: Mapping[Any, Any],
    pod_index: Mapping[Any, Any],
    node_index: Mapping[Any, Any],
) -> Observed:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    uid = meta.get("uid", "")
    phase = (body.get("status") or {}).get("phase")
    js = _store(jobset_index, key)
    jobset = js[0] if js else rt.strangers.get(key)
    gang, provisioner_error, offered = None, None, None
    if plan.managed:
        if rt.provisioner is None:
            provisioner_error = (
                "spec.provisioning.mode is Managed but the operator has no GKE cluster configured "
                "(--gke-project/--gke-location/--gke-cluster); configure it or use mode: Existing"
            )
        elif phase in models.TERMINAL_PHASES and uid in rt.released:
            from multislice_operator.provisioning.base import GangObservation

            gang = GangObservation()
        else:
            gang = await rt.provisioner.observe(plan)
            if not gang.complete:
                raise ObservationError(f"node pools unknown: {'; '.join(map(str, gang.errors))}")
            if jobset is None and phase not in models.TERMINAL_PHASES:
                offered = await _offered(rt, plan)
    return ob.observe(
        plan,
        uid,
        datetime.now(UTC),
        jobset,
        _store(pod_index, key),
        node_index,
        gang,
        provisioner_error=provisioner_error,
        offered_error=offered,
        node_selector=((body.get("spec") or {}).get("template") or {})
        .get("spec", {})
        .get("nodeSelector")
        or {},
    )


async def _offered(rt: Runtime, plan: Plan) -> PoolError | None:
    accel = plan.shape.accelerator
    if accel not in rt.offered and rt.provisioner is not None:
        rt.offered[accel] = await rt.provisioner.check_offered(plan)
    return rt.offered.get(accel)


def _job_meta(body: dict[str, Any]) -> JobMeta:
    meta = body.get("metadata") or {}
    return JobMeta(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        creation_time=parse_time(meta.get("creationTimestamp")),
        labels=dict(meta.get("labels") or {}),
    )


async def _reconcile(
    rt: Runtime,
    body: dict[str, Any],
    jobset_index: Mapping[Any, Any],
    pod_index: Mapping[Any, Any],
    node_index: Mapping[Any, Any],
) -> Decision:
    job, plan, error = _parse(body)
    meta = _job_meta(body)
    old = dict(body.get("status") or {})
    if plan is None:
        decision = decide(meta, None, None, error, old, Observed(now=datetime.now(UTC)), rt.cfg)
        await _write(rt, body, old, decision)
        return decision
    obs = await _observe(rt, body, plan, jobset_index, pod_index, node_index)
    decision = decide(meta, job.spec, plan, None, old, obs, rt.cfg)
    permanent = await _act(rt, body, job, plan, decision)
    if permanent:  # the cloud refused for good: decide again with that answer observed
        errors = {e.slice_index: e for e in permanent}
        obs.slices = [replace(s, error=errors.get(s.index, s.error)) for s in obs.slices]
        decision = decide(meta, job.spec, plan, None, old, obs, rt.cfg)
        await _act(rt, body, job, plan, decision)
    terminal = decision.status.get("phase") in models.TERMINAL_PHASES
    if plan.managed and terminal and all(s.pool_status == PoolState.ABSENT for s in obs.slices):
        rt.released.add(meta.uid)
    await _write(rt, body, old, decision)
    return decision


async def _act(
    rt: Runtime, body: dict[str, Any], job: Any, plan: Plan, decision: Decision
) -> list[PoolError]:
    """Apply the actions in order; return permanent cloud errors met on the way."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    permanent: list[PoolError] = []
    for action in decision.actions:
        if isinstance(action, CreatePools) and rt.provisioner is not None:
            pools = [p for p in plan.node_pools if p.slice_index in action.slices]
            result = await rt.provisioner.create(plan, pools, meta.get("uid", ""))
            _count("create", result.errors)
            permanent += result.permanent
            for err in result.errors:
                if not err.permanent:
                    log.warning("create retry later job=%s/%s %s", ns, name, err)
        elif isinstance(action, DeletePools) and rt.provisioner is not None:
            result = await rt.provisioner.delete(plan, list(action.pools))
            _count("delete", result.errors)
        elif isinstance(action, CreateJobSet):
            await _create_jobset(rt, body, job, plan)
        elif isinstance(action, SetJobSetSuspend):
            await rt.kube.set_jobset_suspend(ns, name, action.suspend)
        elif isinstance(action, DeleteJob):
            log.info("ttl expired, deleting job=%s/%s", ns, name)
            await rt.kube.delete_job(ns, name)
    return permanent


def _count(action: str, errors: Iterable[PoolError]) -> None:
    errs = list(errors)
    metrics.GKE_CALLS_TOTAL.labels(action, "error" if errs else "ok").inc()


async def _create_jobset(rt: Runtime, body: dict[str, Any], job: Any, plan: Plan) -> None:
    meta = body["metadata"]
    jobset = render_jobset(plan, job.spec, job.metadata.labels)
    jobset["metadata"]["ownerReferences"] = [owner_reference(body)]
    created = await rt.kube.create_jobset(jobset)
    if created:
        log.info("jobset created job=%s/%s", meta["namespace"], meta["name"])
        return
    existing = await rt.kube.get_jobset(meta["namespace"], meta["name"])
    if existing is not None:
        summary = ob.summarize_jobset(existing)
        owners = (existing.get("metadata") or {}).get("ownerReferences") or []
        if not any(o.get("uid") == meta.get("uid") for o in owners):
            summary["owned"] = False
            rt.strangers[(meta["namespace"], meta["name"])] = summary


def _status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """A merge patch turning old into new (None deletes a key); None when nothing changed."""
    clean = {k: v for k, v in new.items() if v is not None}
    patch: dict[str, Any] = {k: v for k, v in clean.items() if old.get(k) != v}
    patch.update({k: None for k in old if k not in clean})
    return patch or None


async def _write(rt: Runtime, body: dict[str, Any], old: dict[str, Any], d: Decision) -> None:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    patch = _status_patch(old, d.status)
    if patch is not None:
        updated = await rt.kube.patch_job_status(ns, name, patch)
        if isinstance(updated, dict):
            (updated.get("metadata") or {}).pop("managedFields", None)  # the bulk; never read
            rt.written[(ns, name)] = updated
    for event in d.events:
        if event.reason in SLICE_FAILURE_REASONS:
            metrics.SLICE_FAILURES_TOTAL.labels(SLICE_FAILURE_REASONS[event.reason]).inc()
        log.info(
            "event job=%s/%s type=%s reason=%s %s",
            ns,
            name,
            event.type,
            event.reason,
            event.message,
        )
        await rt.kube.post_event(body, event.type, event.reason, event.message)
    _record_metrics(rt, (ns, name), old, d.status)


def _record_metrics(
    rt: Runtime, key: tuple[str, str], old: dict[str, Any], new: dict[str, Any]
) -> None:
    phase = new.get("phase")
    previous = rt.phases.get(key)
    if phase != previous:
        if previous:
            metrics.JOBS.labels(previous).dec()
        if phase:
            metrics.JOBS.labels(phase).inc()
            rt.phases[key] = phase
    added = int(new.get("restarts") or 0) - int(old.get("restarts") or 0)
    if added > 0:
        metrics.RESTARTS_TOTAL.inc(added)
    if new.get("provisionedTime") and new.get("provisionedTime") != old.get("provisionedTime"):
        start = parse_time(new.get("startTime"))
        done = parse_time(new.get("provisionedTime"))
        if start and done:
            metrics.PROVISIONING_DURATION.observe((done - start).total_seconds())
    if new.get("runningTime") and not old.get("runningTime"):
        start = parse_time(new.get("startTime"))
        running = parse_time(new.get("runningTime"))
        if start and running:
            metrics.TIME_TO_RUNNING.observe((running - start).total_seconds())


# ---------------------------------------------------------------- deletion


@kopf.on.delete(*MSJ)
async def on_delete(body: kopf.Body, namespace: str, name: str, **_: Any) -> None:
    """Release every node pool before the finalizer lets the job go (retried until done)."""
    rt = runtime()
    rt.phases.pop((namespace, name), None)
    rt.strangers.pop((namespace, name), None)
    rt.written.pop((namespace, name), None)
    plan = _parse(dict(body))[1]
    if plan is None or not plan.managed or rt.provisioner is None:
        return
    gang = await rt.provisioner.observe(plan)
    if not gang.complete:
        raise kopf.TemporaryError("cannot read node pools yet; retrying", delay=5)
    present = [n for n, p in gang.pools.items() if p.status != PoolState.ABSENT]
    if not present:
        log.info("node pools released job=%s/%s", namespace, name)
        return
    deletable = [n for n in present if gang.pools[n].status != PoolState.DELETING]
    if deletable:
        await rt.provisioner.delete(plan, deletable)
        await rt.kube.post_event(
            dict(body),
            "Normal",
            "ReleasingNodePools",
            f"deleting {len(present)} node pools before the job is removed",
        )
    raise kopf.TemporaryError(
        f"waiting for node pools to be deleted: {', '.join(present)}", delay=3
    )


# ---------------------------------------------------------------- orphan garbage collection


async def _gc_loop(rt: Runtime) -> None:
    while True:
        await asyncio.sleep(rt.settings.gc_interval_seconds)
        try:
            await collect_orphans(rt)
        except Exception as exc:  # keep sweeping on the next interval
            log.warning("orphan sweep failed error=%s", exc)


async def collect_orphans(rt: Runtime) -> list[str]:
    """Delete pools labelled as ours whose job is gone or is another incarnation (other uid)."""
    if rt.provisioner is None:
        return []
    jobs = {
        (j["metadata"]["namespace"], j["metadata"]["name"]): j["metadata"].get("uid")
        for j in await rt.kube.list_jobs()
    }
    pools = await rt.provisioner.list_owned()
    orphans = []
    for pool in pools:
        ns, name = getattr(pool, "namespace", None), getattr(pool, "job_name", None)
        if ns is None or name is None or pool.status in (PoolState.ABSENT, PoolState.DELETING):
            continue
        uid = jobs.get((ns, name))
        if uid is None or (pool.owner_uid and uid != pool.owner_uid):
            orphans.append(pool.name)
    if orphans:
        log.warning("deleting orphaned node pools pools=%s", ",".join(orphans))
        await _delete_orphans(rt, orphans)
        metrics.ORPHANS_DELETED_TOTAL.inc(len(orphans))
    return orphans


async def _delete_orphans(rt: Runtime, names: list[str]) -> None:
    assert rt.provisioner is not None
    result = await rt.provisioner.delete_named(names)
    _count("delete", result.errors)
