"""kopf wiring: watches feed a job store, small indexes and a work queue; workers do the rest.

kopf is used for what it is best at: watching (with reconnects) and indexes; /healthz, /readyz
and /metrics are the operator's own (controller/serving.py).
Every MultisliceJob handler is an on-event spy, so kopf writes nothing to the objects (no
finalizer, no `last-handled-configuration` annotation: a spec of any size is fine). The operator's
own finalizer is added by the reconcile itself, only for Managed jobs, before their first pool.
Workers take job keys from the queue: observe -> decide (pure) -> apply -> write the status if it
changed, then requeue at the delay decide() asked for. With --leader-elect only the replica holding
the Lease runs workers, and only it is ready.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import kopf

from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.controller import (
    apisession,  # noqa: F401  (the login handler)
    kueue,
    metrics,
    relist,
    serving,
    versions,
)
from multislice_operator.controller import observe as ob
from multislice_operator.controller.gc import gc_loop, list_watched_jobs
from multislice_operator.controller.heartbeat import SUFFIX as HEARTBEAT_SUFFIX
from multislice_operator.controller.heartbeat import Heartbeat, HeartbeatConfig
from multislice_operator.controller.kube import ApiError, Kube
from multislice_operator.controller.leader import LeaderElector, LeaseConfig
from multislice_operator.controller.reconciler import reconcile
from multislice_operator.controller.runtime import Indexes, Runtime
from multislice_operator.provisioning.base import Provisioner
from multislice_operator.reconcile import DecideConfig
from multislice_operator.reconcile.multikueue import prebuilt_name
from multislice_operator.registry import REGISTRY, Watch, resolve
from multislice_operator.render.identity import node_identity
from multislice_operator.settings import Settings

log = logging.getLogger("multislice_operator")

MSJ = (models.GROUP, models.VERSION, models.PLURAL)
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
MEMORY_TRIM_SECONDS = 10.0
# kopf keeps a worker per watched object until no event came for this long, and the worker holds
# the object's last body meanwhile: after a burst of many jobs, kopf's 5 s default kept hundreds
# of job and JobSet bodies alive at once, a peak the allocator never hands back whole (+22 MiB
# left after 200 jobs, against +10 with this; docs/benchmarks.md). The handlers keep nothing
# between events, so the worker may go at once; the object's next event starts a new one.
KOPF_WORKER_IDLE_SECONDS = 0.5
# How long events of a job's JobSet, pods and nodes may wait to be handled together. A job's own
# events are handled at once; a restart's hundreds of pod events would otherwise each cost a pass
# and a status write while the JobSet controller needs the same two cores. The pass comes a quiet
# moment after a burst's last event, not up to a whole window after it: a gang's last node is
# seen at once (the operator's share of a 256-slice gang was 0.07-1.04 s, the phase of the window;
# docs/benchmarks.md). Events a quiet moment apart are a burst: a gang's nodes, a restart's pods.
DEPENDENT_EVENT_BATCH_SECONDS = 1.0
DEPENDENT_EVENT_QUIET_SECONDS = 0.05
# The JobSets, pods and nodes the operator watches, by label. Asked of the apiserver (kopf's
# server-side label selectors, configure_kopf) as well as filtered on by the handlers: kopf keeps
# a memory (memo, error throttler, index state) for every object a watch delivers, for the
# object's life, whether a handler matches it or not, so a cluster's other pods and JobSets
# would each cost the process one, and each of their events a parse.
JOBSET_LABELS: dict[str, Any] = {keys.MANAGED_BY: keys.MANAGED_BY_VALUE}
POD_LABELS: dict[str, Any] = {keys.JOB_NAME: kopf.PRESENT}
NODE_LABELS: dict[str, Any] = {keys.GKE_NODEPOOL: kopf.PRESENT}
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

ProvisionerFactory = Callable[[Settings], Provisioner | None]

SYNC_POLL_SECONDS = 1.0

RUNTIME: Runtime | None = None
PROVISIONER_FACTORY: ProvisionerFactory | None = None
_SETTINGS: Settings | None = None
_KUEUE_WATCHED = False  # the Kueue handlers are registered once per process (tests configure twice)
_PLUGIN_WATCHES: dict[str, Watch] = {}  # what capacity models watch, by name, once registered
_RUNNERS: list[Any] = []  # the aiohttp servers, cleaned up at exit


def configure(settings: Settings, factory: ProvisionerFactory | None) -> None:
    """Called by `run` before kopf starts: settings and how to build the provisioner."""
    global PROVISIONER_FACTORY, _SETTINGS
    _SETTINGS = settings
    PROVISIONER_FACTORY = factory
    _watch_plugins()
    if settings.kueue:
        _watch_kueue()


def runtime() -> Runtime:
    if RUNTIME is None:  # pragma: no cover - startup always runs first
        raise RuntimeError("operator not started")
    return RUNTIME


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: kopf builds one on every watch event of every watched kind (a deep copy of
    the body, then its annotations' progress stanzas cleared) for change handlers to diff
    against, and the operator registers none (only on-event spies and indexes). That was about
    12% of the operator's CPU in a 1000-job burst. An empty essence is an empty diff."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


# ---------------------------------------------------------------- lifecycle


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """kopf's settings for this operator (called by the startup handler)."""
    settings.posting.level = logging.WARNING  # our own events are explicit; no log spam as events
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.queueing.idle_timeout = KOPF_WORKER_IDLE_SECONDS
    for (group, version, plural), labels in (
        (JOBSETS, JOBSET_LABELS),
        (("", "v1", "pods"), POD_LABELS),
        (("", "v1", "nodes"), NODE_LABELS),
    ):
        settings.watching.label_selectors[group, version, plural] = label_selector(labels)


def label_selector(labels: dict[str, Any]) -> str:
    """A handler's label filter as the apiserver's selector: `k=v`, or `k` for kopf.PRESENT."""
    return ",".join(k if v is kopf.PRESENT else f"{k}={v}" for k, v in labels.items())


@kopf.on.startup()
async def startup(
    settings: kopf.OperatorSettings,
    jobset_index: kopf.Index[Any, Any],
    pod_index: kopf.Index[Any, Any],
    node_index: kopf.Index[Any, Any],
    **kwargs: Any,
) -> None:
    global RUNTIME
    ours = _SETTINGS or Settings()
    configure_kopf(settings)
    provisioner = PROVISIONER_FACTORY(ours) if PROVISIONER_FACTORY else None
    rt = RUNTIME = Runtime(
        settings=ours,
        kube=Kube(settings),
        provisioner=provisioner,
        cfg=DecideConfig.from_settings(ours),
        indexes=Indexes(
            jobsets=jobset_index,
            pods=pod_index,
            nodes=node_index,
            # Present only with --kueue (an empty index is falsy: no `or` here).
            workloads=kwargs.get("workload_index", {}),
            local_queues=kwargs.get("local_queue_index", {}),
            admission_checks=kwargs.get("admission_check_index", {}),
            watched={w: kwargs.get(_index_id(x), {}) for w, x in _PLUGIN_WATCHES.items()},
        ),
    )
    relist.track(_indexed_kinds(rt.indexes, kwargs))
    rt.readiness.leader_elect = ours.leader_elect
    rt.readiness.standby_ready = ours.ready_standby
    _bind_metrics(rt)
    await _serve(rt)
    rt.tasks.append(asyncio.create_task(_run(rt)))
    rt.tasks.append(asyncio.create_task(_await_sync(rt)))
    rt.tasks.append(asyncio.create_task(_housekeeping(rt, _malloc_trim())))
    log.info(
        "operator started namespaces=%s provisioner=%s workers=%d leader_elect=%s kueue=%s",
        ",".join(ours.namespaces) or "*",
        type(provisioner).__name__ if provisioner else "none",
        ours.workers,
        ours.leader_elect,
        ours.kueue,
    )
    if provisioner is not None:
        # Who the training pods are to Google APIs follows from this (render/identity.py,
        # docs/install.md).
        log.info(
            "tpu nodes: %s",
            node_identity(
                ours.gke_workload_identity, ours.gke_node_service_account, ours.gke_node_scopes
            ),
        )


def _indexed_kinds(indexes: Indexes, kwargs: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """Each kopf index with the kind whose watch feeds it: (API group, plural, index)."""
    kinds = [
        (JOBSETS[0], JOBSETS[2], indexes.jobsets),
        ("", "pods", indexes.pods),
        ("", "nodes", indexes.nodes),
    ]
    for (group, _, plural), index_id in (
        (kueue.WORKLOADS, "workload_index"),
        (kueue.LOCAL_QUEUES, "local_queue_index"),
        (kueue.ADMISSION_CHECKS, "admission_check_index"),
    ):
        if index_id in kwargs:
            kinds.append((group, plural, kwargs[index_id]))
    kinds += [(x.group, x.plural, indexes.watched[w]) for w, x in _PLUGIN_WATCHES.items()]
    return kinds


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if RUNTIME is not None:
        RUNTIME.readiness.started = False
        RUNTIME.queue.close()
        for task in RUNTIME.tasks:
            task.cancel()
    # The Lease is not released: a GKE call may still run in a thread of this process; the next
    # leader waits for the Lease to expire (15 s) instead.
    while _RUNNERS:
        await _RUNNERS.pop().cleanup()


def _bind_metrics(rt: Runtime) -> None:
    metrics.RUNTIME.depth = rt.queue.due
    metrics.RUNTIME.active_workers = lambda: rt.active_workers
    metrics.RUNTIME.workers = lambda: max(1, rt.settings.workers)
    metrics.RUNTIME.leader = lambda: not rt.settings.leader_elect or rt.readiness.leading


def _alive(rt: Runtime) -> str | None:
    """Why the operator is not alive: a task of its own ended (they run forever)."""
    for task in rt.tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            return f"task {task.get_name()} failed: {task.exception()!r}"
    return None


async def _serve(rt: Runtime) -> None:
    """Health (always plain HTTP: the kubelet's probes carry no token) and metrics."""
    s = rt.settings
    if s.health_port:
        app = serving.health_app(rt.readiness, lambda: _alive(rt))
        _RUNNERS.append(await serving.start(app, s.health_bind_address, s.health_port))
    if not s.metrics_port:
        return
    if s.metrics_auth == "none":
        app = serving.metrics_app(None)
        _RUNNERS.append(await serving.start(app, s.metrics_bind_address, s.metrics_port))
        return
    ctx = serving.tls_context(s.metrics_cert_dir, [socket.gethostname(), "localhost", "127.0.0.1"])
    if s.metrics_cert_dir:
        rt.tasks.append(asyncio.create_task(serving.reload_certificates(ctx, s.metrics_cert_dir)))
    app = serving.metrics_app(serving.KubernetesAuth(rt.kube).check)
    _RUNNERS.append(await serving.start(app, s.metrics_bind_address, s.metrics_port, ctx))


async def _await_sync(rt: Runtime) -> None:
    """Ready once the caches are synced: a first MultisliceJob has come through the watch (kopf
    hands over no event before every index, JobSets, pods, nodes and Kueue's, has listed), or no
    MultisliceJob exists in the watched namespaces (the first one created will wait for those
    indexes likewise). Asked of the apiserver until one is true."""
    rt.readiness.started = True
    while not rt.store.bodies:
        try:
            if not await list_watched_jobs(rt):
                break
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("readiness: listing MultisliceJobs failed error=%r", exc)
        await asyncio.sleep(SYNC_POLL_SECONDS)
    rt.readiness.synced = True
    log.info("caches synced")


async def _run(rt: Runtime) -> None:
    """Wait for the Lease if asked, then run the workers (and the GC) until cancelled."""
    # Before any pass, and after start-up (kopf logs in once the startup handlers are done): a
    # Kueue or JobSet this operator cannot work with is named at once, then looked at again.
    try:
        await versions.check(rt)
    except Exception as exc:  # the loop tries again
        log.warning("versions not checked: %s", exc)
    rt.tasks.append(asyncio.create_task(versions.check_loop(rt)))
    if rt.settings.leader_elect:
        elector = LeaderElector(rt.kube, _lease_config(rt.settings))
        rt.tasks.append(asyncio.create_task(elector.run()))
        rt.tasks.append(asyncio.create_task(_exit_when_lost(elector)))
        await elector.leading.wait()
        rt.readiness.leading = True
    if rt.provisioner is not None and rt.settings.gc_interval_seconds > 0:
        rt.tasks.append(asyncio.create_task(gc_loop(rt)))
    # Before any pass: when the previous operator was last alive (goodput's blind time).
    # And the MultiKueue hand-backs a previous operator remembered (their cooldown goes on).
    heartbeat = Heartbeat(rt.kube, _heartbeat_config(rt.settings), rt.multikueue_lost)
    rt.heartbeat = heartbeat
    rt.previous_alive = await heartbeat.start()
    rt.tasks.append(asyncio.create_task(heartbeat.run()))
    if rt.settings.kueue:
        rt.tasks.append(asyncio.create_task(kueue.activation_loop(rt)))
    workers = [asyncio.create_task(_worker(rt)) for _ in range(max(1, rt.settings.workers))]
    rt.tasks.extend(workers)


def _lease_namespace(s: Settings) -> str:
    namespace = s.leader_election_namespace
    if not namespace and os.path.exists(SERVICE_ACCOUNT_NAMESPACE):
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
            namespace = f.read().strip()
    return namespace or "default"


def _identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


def _lease_config(s: Settings) -> LeaseConfig:
    return LeaseConfig(_lease_namespace(s), s.leader_election_name, _identity())


def _heartbeat_config(s: Settings) -> HeartbeatConfig:
    return HeartbeatConfig(
        _lease_namespace(s),
        s.leader_election_name + HEARTBEAT_SUFFIX,
        _identity(),
        interval_seconds=min(max(s.resync_seconds, 1.0), 30.0),
    )


async def _exit_when_lost(elector: LeaderElector) -> None:
    await elector.lost.wait()
    log.error("leadership lost: exiting so that this replica restarts as a standby")
    logging.shutdown()
    os._exit(1)


async def _worker(rt: Runtime) -> None:
    while True:
        key = await rt.queue.get()
        rt.active_workers += 1
        scope = metrics.enter_namespace(key[0])  # the per-namespace metrics of this pass
        try:
            delay = await reconcile(rt, key, rt.errors.get(key, 0))
        finally:
            metrics.JOB_NAMESPACE.reset(scope)
            rt.active_workers -= 1
            rt.queue.done(key)
        if not rt.passed(key):  # deleted during the pass: nothing to requeue, nothing kept
            continue
        if delay is None:
            rt.errors.pop(key, None)
            continue
        if delay < 0:  # an error: back off per job (whichever worker runs it), exponentially
            rt.errors[key] = rt.errors.get(key, 0) + 1
            delay = -delay
        else:
            rt.errors.pop(key, None)
        rt.queue.add(key, delay)


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


async def _housekeeping(rt: Runtime, trim: Callable[[], object] | None) -> None:
    """Drop what the shared caches hold past its time (Runtime.expire: no pass reads them once a
    load is gone), then hand the heap pages freed after a burst (many jobs created or changed at
    once) back to the OS: glibc keeps them otherwise, and resident memory would stay at the
    burst's high-water mark (see docs/benchmarks.md). A round takes milliseconds."""
    while True:
        await asyncio.sleep(MEMORY_TRIM_SECONDS)
        rt.expire()
        if trim is not None:
            trim()


# ---------------------------------------------------------------- watches
#
# Coroutines on purpose: kopf runs a plain function in its executor (a thread hop per watch event),
# and these only summarize and enqueue: no I/O.


@kopf.on.event(*MSJ)
async def job_event(type: str, namespace: str, name: str, body: kopf.Body, **_: Any) -> None:
    rt = runtime()
    key = (namespace, name)
    if type == "DELETED":
        rt.forget(key)
        return
    raw = dict(body)
    (raw.get("metadata") or {}).pop("managedFields", None)
    if rt.store.put(raw):  # our own status write echoed back needs no second look
        rt.queue.add(key)


@kopf.index(*JOBSETS, labels=JOBSET_LABELS)
async def jobset_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): ob.summarize_jobset(body)}


@kopf.index("", "v1", "pods", labels=POD_LABELS)
async def pod_index(
    namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    return {(namespace, labels[keys.JOB_NAME]): ob.summarize_pod(body)}


@kopf.index("", "v1", "nodes", labels=NODE_LABELS)
async def node_index(labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {labels[keys.GKE_NODEPOOL]: ob.summarize_node(body)}


@kopf.on.event(*JOBSETS, labels=JOBSET_LABELS)
async def jobset_event(type: str, namespace: str, name: str, body: kopf.Body, **_: Any) -> None:
    rt = runtime()
    if type != "DELETED" and rt.created_echo((namespace, name), ob.summarize_jobset(body)):
        return
    _dependent(rt, namespace, name)


@kopf.on.event("", "v1", "pods", labels=POD_LABELS)
async def pod_event(namespace: str, labels: kopf.Labels, **_: Any) -> None:
    _dependent(runtime(), namespace, labels[keys.JOB_NAME])


@kopf.on.event("", "v1", "nodes", labels=NODE_LABELS)
async def node_event(labels: kopf.Labels, **_: Any) -> None:
    rt = runtime()
    if keys.JOB_NAMESPACE in labels and keys.JOB_NAME in labels:
        _dependent(rt, labels[keys.JOB_NAMESPACE], labels[keys.JOB_NAME])
        return
    # An Existing-mode node pool: wake only the jobs waiting for pools of this node's shape.
    shape = (labels.get(keys.GKE_TPU_ACCELERATOR, ""), labels.get(keys.GKE_TPU_TOPOLOGY, ""))
    for key in list(rt.waiting_for_nodes.get(shape, ())):
        _dependent(rt, *key)


# ---------------------------------------------------------------- what capacity models watch
#
# Registered by configure() before kopf starts, one index and one event handler per kind a
# registered capacity model watches (registry.Watch: GKE Slices for dynamic slicing). kopf starts
# a watch when its CRD is served, so a kind that is not installed costs nothing.


def _index_id(w: Watch) -> str:
    return f"{w.name}_index"


def _watch_one(w: Watch) -> None:
    summarize = resolve(w.summarize)
    where = (w.group, w.version, w.plural)

    async def index(name: str, namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {name if w.cluster_scoped else (namespace, name): summarize(body)}

    async def event(labels: kopf.Labels, **_: Any) -> None:
        _dependent(runtime(), labels.get(keys.JOB_NAMESPACE), labels.get(keys.JOB_NAME))

    kopf.index(*where, labels=dict(w.labels), id=_index_id(w))(index)
    kopf.on.event(*where, labels=dict(w.labels), id=f"{w.name}_event")(event)


def _watch_plugins() -> None:
    for w in _plugin_watches():
        if w.name not in _PLUGIN_WATCHES:  # configured twice in one process (tests)
            _PLUGIN_WATCHES[w.name] = w
            _watch_one(w)


def _plugin_watches() -> list[Watch]:
    return [w for m in REGISTRY.models().values() for w in m.watches]


def _dependent(rt: Runtime, namespace: str | None, name: str | None) -> None:
    """An event of one of the job's dependents (its JobSet, pods, nodes): batched."""
    rt.poke(namespace, name, DEPENDENT_EVENT_BATCH_SECONDS, DEPENDENT_EVENT_QUIET_SECONDS)


# ---------------------------------------------------------------- Kueue (--kueue only)
#
# Registered by configure() before kopf starts, so that an operator without --kueue neither
# watches Kueue's resources nor needs RBAC for them. kopf starts these watches when Kueue's CRDs
# appear (it follows CRDs), so an operator started before Kueue picks it up.


async def workload_index(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return kueue.summarize_workload(body)


async def local_queue_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): kueue.summarize_local_queue(body)}


async def admission_check_index(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {name: kueue.summarize_admission_check(body)}


async def workload_event(namespace: str, name: str, body: kopf.Body, **_: Any) -> None:
    rt = runtime()
    meta = body.get("metadata", {})
    owners = meta.get("ownerReferences") or []
    for owner in owners:
        # Ours (the job's own), or Kueue's JobSet integration's (the JobSet has the job's name).
        if owner.get("kind") in (models.KIND, "JobSet"):
            rt.poke(namespace, owner.get("name"))
    if not owners and keys.MULTIKUEUE_ORIGIN in (meta.get("labels") or {}):
        # MultiKueue's copy: our check on it (activation loop), and the job waiting for it.
        rt.kueue_checks_changed.set()
        for (ns, job), job_body in list(rt.store.bodies.items()):
            m = job_body.get("metadata") or {}
            if ns == namespace and prebuilt_name(m.get("labels") or {},
                                                 m.get("annotations") or {}) == name:  # fmt: skip
                rt.poke(ns, job)


async def admission_check_event(**_: Any) -> None:
    rt = runtime()
    rt.kueue_checks_changed.set()
    for key, body in list(rt.store.bodies.items()):  # which checks are ours may have changed
        if keys.KUEUE_QUEUE_NAME in ((body.get("metadata") or {}).get("labels") or {}):
            rt.queue.add(key)


def api_groups() -> set[str]:
    """The API groups of the CRDs the registered handlers watch (controller/discovery.py)."""
    plugins = {w.group for w in _PLUGIN_WATCHES.values()}
    return {MSJ[0], JOBSETS[0]} | plugins | ({kueue.GROUP} if _KUEUE_WATCHED else set())


def optional_api_groups() -> set[str]:
    """Groups of `api_groups()` a cluster may well not serve: the operator says so itself
    (controller/versions.py) and kopf's warning is quieted (controller/discovery.py)."""
    return {w.group for w in _PLUGIN_WATCHES.values() if w.optional}


def _watch_kueue() -> None:
    global _KUEUE_WATCHED
    if _KUEUE_WATCHED:
        return  # configured twice in one process (tests)
    _KUEUE_WATCHED = True
    kopf.index(*kueue.WORKLOADS)(workload_index)
    kopf.index(*kueue.LOCAL_QUEUES)(local_queue_index)
    kopf.index(*kueue.ADMISSION_CHECKS)(admission_check_index)
    kopf.on.event(*kueue.WORKLOADS)(workload_event)
    kopf.on.event(*kueue.ADMISSION_CHECKS)(admission_check_event)
