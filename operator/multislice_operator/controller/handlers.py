"""kopf wiring: watches feed a job store, small indexes and a work queue; workers do the rest.

kopf is used for what it is best at: watching (with reconnects), indexes and the liveness probe.
Every MultisliceJob handler is an on-event spy, so kopf writes nothing to the objects (no
finalizer, no `last-handled-configuration` annotation: a spec of any size is fine). The operator's
own finalizer is added by the reconcile itself, only for Managed jobs, before their first pool.
Workers take job keys from the queue: observe -> decide (pure) -> apply -> write the status if it
changed, then requeue at the delay decide() asked for. With --leader-elect only the replica holding
the Lease runs workers.
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

from multislice_operator import keys, metrics
from multislice_operator.api import models
from multislice_operator.controller import observe as ob
from multislice_operator.controller.gc import gc_loop
from multislice_operator.controller.kube import Kube
from multislice_operator.controller.leader import LeaderElector, LeaseConfig
from multislice_operator.controller.reconciler import reconcile
from multislice_operator.controller.runtime import Indexes, Runtime
from multislice_operator.provisioning.base import Provisioner
from multislice_operator.reconcile import DecideConfig
from multislice_operator.settings import Settings

log = logging.getLogger("multislice_operator")

MSJ = (models.GROUP, models.VERSION, models.PLURAL)
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
MEMORY_TRIM_SECONDS = 10.0
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

ProvisionerFactory = Callable[[Settings], Provisioner | None]

RUNTIME: Runtime | None = None
PROVISIONER_FACTORY: ProvisionerFactory | None = None
_SETTINGS: Settings | None = None


def configure(settings: Settings, factory: ProvisionerFactory | None) -> None:
    """Called by `run` before kopf starts: settings and how to build the provisioner."""
    global PROVISIONER_FACTORY, _SETTINGS
    _SETTINGS = settings
    PROVISIONER_FACTORY = factory


def runtime() -> Runtime:
    if RUNTIME is None:  # pragma: no cover - startup always runs first
        raise RuntimeError("operator not started")
    return RUNTIME


# ---------------------------------------------------------------- lifecycle


@kopf.on.startup()
async def startup(
    settings: kopf.OperatorSettings,
    jobset_index: kopf.Index[Any, Any],
    pod_index: kopf.Index[Any, Any],
    node_index: kopf.Index[Any, Any],
    **_: Any,
) -> None:
    global RUNTIME
    ours = _SETTINGS or Settings()
    settings.posting.level = logging.WARNING  # our own events are explicit; no log spam as events
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    provisioner = PROVISIONER_FACTORY(ours) if PROVISIONER_FACTORY else None
    rt = RUNTIME = Runtime(
        settings=ours,
        kube=Kube(settings),
        provisioner=provisioner,
        cfg=DecideConfig(
            backoff_base_seconds=ours.backoff_base_seconds,
            backoff_max_seconds=ours.backoff_max_seconds,
            resync_seconds=ours.resync_seconds,
            not_ready_grace_seconds=ours.node_not_ready_grace_seconds,
        ),
        indexes=Indexes(jobsets=jobset_index, pods=pod_index, nodes=node_index),
    )
    metrics.serve(ours.metrics_port, ours.metrics_bind_address)
    rt.tasks.append(asyncio.create_task(_run(rt)))
    trim = _malloc_trim()
    if trim is not None:
        rt.tasks.append(asyncio.create_task(_trim_loop(trim)))
    log.info(
        "operator started namespaces=%s provisioner=%s workers=%d leader_elect=%s",
        ",".join(ours.namespaces) or "*",
        type(provisioner).__name__ if provisioner else "none",
        ours.workers,
        ours.leader_elect,
    )


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if RUNTIME is not None:
        RUNTIME.queue.close()
        for task in RUNTIME.tasks:
            task.cancel()


async def _run(rt: Runtime) -> None:
    """Wait for the Lease if asked, then run the workers (and the GC) until cancelled."""
    if rt.settings.leader_elect:
        elector = LeaderElector(rt.kube, _lease_config(rt.settings))
        rt.tasks.append(asyncio.create_task(elector.run()))
        rt.tasks.append(asyncio.create_task(_exit_when_lost(elector)))
        await elector.leading.wait()
    if rt.provisioner is not None and rt.settings.gc_interval_seconds > 0:
        rt.tasks.append(asyncio.create_task(gc_loop(rt)))
    workers = [asyncio.create_task(_worker(rt)) for _ in range(max(1, rt.settings.workers))]
    rt.tasks.extend(workers)


def _lease_config(s: Settings) -> LeaseConfig:
    namespace = s.leader_election_namespace
    if not namespace and os.path.exists(SERVICE_ACCOUNT_NAMESPACE):
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
            namespace = f.read().strip()
    identity = f"{socket.gethostname()}_{os.getpid()}"
    return LeaseConfig(namespace or "default", s.leader_election_name, identity)


async def _exit_when_lost(elector: LeaderElector) -> None:
    await elector.lost.wait()
    log.error("leadership lost: exiting so that this replica restarts as a standby")
    logging.shutdown()
    os._exit(1)


async def _worker(rt: Runtime) -> None:
    while True:
        key = await rt.queue.get()
        try:
            delay = await reconcile(rt, key, rt.errors.get(key, 0))
        finally:
            rt.queue.done(key)
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


async def _trim_loop(trim: Callable[[], object]) -> None:
    """Hand the heap pages freed after a burst (many jobs created or changed at once) back to the
    OS: glibc keeps them otherwise, and resident memory would stay at the burst's high-water mark
    (see docs/benchmarks.md). A trim takes milliseconds."""
    while True:
        await asyncio.sleep(MEMORY_TRIM_SECONDS)
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
        metrics.JOBS.set(key, None)
        return
    raw = dict(body)
    (raw.get("metadata") or {}).pop("managedFields", None)
    rt.store.put(raw)
    rt.queue.add(key)


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
        return
    # An Existing-mode node pool: wake only the jobs waiting for pools of this node's shape.
    shape = (labels.get(keys.GKE_TPU_ACCELERATOR, ""), labels.get(keys.GKE_TPU_TOPOLOGY, ""))
    for key in list(rt.waiting_for_nodes.get(shape, ())):
        rt.poke(*key)
