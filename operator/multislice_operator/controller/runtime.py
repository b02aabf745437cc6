"""What the running operator holds: settings, adapters, the job store, the work queue, indexes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from multislice_operator.controller.kube import Kube
from multislice_operator.controller.workqueue import WorkQueue
from multislice_operator.provisioning.base import Provisioner
from multislice_operator.reconcile import Admission, DecideConfig
from multislice_operator.settings import Settings

JobKey = tuple[str, str]  # (namespace, name)


def resource_version(body: Mapping[str, Any]) -> int:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:  # opaque to clients in general; etcd's are integers
        return 0


@dataclass
class JobStore:
    """The freshest copy of every MultisliceJob: from the watch, or from our own write's answer
    when that is newer (a pass woken in between must not decide from the older status)."""

    bodies: dict[JobKey, dict[str, Any]] = field(default_factory=dict)

    def put(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        current = self.bodies.get(key)
        if current is not None:
            same = (current.get("metadata") or {}).get("uid") == meta.get("uid")
            if same and resource_version(current) > resource_version(body):
                return
        self.bodies[key] = dict(body)

    def get(self, key: JobKey) -> dict[str, Any] | None:
        return self.bodies.get(key)

    def remove(self, key: JobKey) -> None:
        self.bodies.pop(key, None)


@dataclass
class Indexes:
    """kopf's indexes (live views, updated by kopf as watch events arrive)."""

    jobsets: Mapping[Any, Any]
    pods: Mapping[Any, Any]
    nodes: Mapping[Any, Any]


@dataclass
class Runtime:
    settings: Settings
    kube: Kube
    provisioner: Provisioner | None
    cfg: DecideConfig
    indexes: Indexes
    store: JobStore = field(default_factory=JobStore)
    queue: WorkQueue[JobKey] = field(default_factory=WorkQueue)
    # JobSets of our name that are not ours (the index only holds labelled ones).
    strangers: dict[JobKey, dict[str, Any]] = field(default_factory=dict)
    # Existing-mode jobs waiting for node pools, by (accelerator label, topology): a node event
    # wakes only the jobs it could help.
    waiting_for_nodes: dict[tuple[str, str], set[JobKey]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # The apiserver's verdict on each job's JobSet, for (uid, generation): asked once before the
    # first pool (dry run), replaced by a refused create. Memory only: asked again after restart.
    admission: dict[JobKey, tuple[str, int, Admission]] = field(default_factory=dict)
    # JobSets we deleted that the index may still hold for a moment: seen as being deleted.
    deleted_jobsets: set[JobKey] = field(default_factory=set)
    # Consecutive failed passes per job (shared by every worker): the exponential backoff.
    errors: dict[JobKey, int] = field(default_factory=dict)

    def poke(self, namespace: str | None, name: str | None) -> None:
        if namespace and name and (namespace, name) in self.store.bodies:
            self.queue.add((namespace, name))

    def wait_for_nodes(self, key: JobKey, shape: tuple[str, str] | None) -> None:
        for waiting in self.waiting_for_nodes.values():
            waiting.discard(key)
        if shape is not None:
            self.waiting_for_nodes.setdefault(shape, set()).add(key)

    def forget(self, key: JobKey) -> None:
        self.store.remove(key)
        self.queue.forget(key)
        self.strangers.pop(key, None)
        self.wait_for_nodes(key, None)
        self.admission.pop(key, None)
        self.deleted_jobsets.discard(key)
        self.errors.pop(key, None)

    def admission_of(self, key: JobKey, uid: str, generation: int) -> Admission | None:
        known = self.admission.get(key)
        if known is None or known[0] != uid or known[1] != generation:
            return None
        return known[2]

    def judged(self, key: JobKey, uid: str, generation: int, verdict: Admission) -> None:
        self.admission[key] = (uid, generation, verdict)
