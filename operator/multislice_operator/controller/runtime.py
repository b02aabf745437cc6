"""What the running operator holds: settings, adapters, the job store, the work queue, indexes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from multislice_operator.controller import metrics
from multislice_operator.controller.heartbeat import Heartbeat
from multislice_operator.controller.kube import Kube
from multislice_operator.controller.serving import Readiness
from multislice_operator.controller.workqueue import WorkQueue
from multislice_operator.provisioning.base import Provisioner
from multislice_operator.reconcile import Admission, DecideConfig, StrategySupport
from multislice_operator.settings import Settings

JobKey = tuple[str, str]  # (namespace, name)
EVENTS_KEPT_PER_JOB = 32
TEMPLATE_VERDICTS_KEPT = 1024
TEMPLATE_VERDICT_TTL_SECONDS = 600.0
NAMESPACE_LABELS_TTL_SECONDS = 30.0
# How long a scheduler that looked at none of a job's pods is known not to run (jobs naming it
# then fail before their first pool), unless a pod naming it is looked at sooner.
SCHEDULER_ABSENT_SECONDS = 600.0
SCHEDULERS_KEPT = 64


def template_key(body: Mapping[str, Any]) -> str:
    """What the apiserver's dry run judges, less the job's name: its namespace (quotas,
    webhooks, Pod Security apply per namespace), spec and labels (they reach the JobSet). The
    name-dependent rules (DNS labels, lengths) are the plan's, checked for every job."""
    meta = body.get("metadata") or {}
    what = {
        "namespace": meta.get("namespace"),
        "labels": meta.get("labels") or {},
        "spec": body.get("spec") or {},
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


K = TypeVar("K")
V = TypeVar("V")


def _drop_older(cache: dict[Any, tuple[float, Any]], oldest: float) -> None:
    for key in [k for k, (when, _) in cache.items() if when < oldest]:
        del cache[key]


def _remember_bounded(cache: dict[K, V], key: K, value: V, kept: int) -> None:
    """Insert as the newest; the oldest go first once `kept` are held (dicts keep order)."""
    cache.pop(key, None)
    while len(cache) >= kept:
        del cache[next(iter(cache))]
    cache[key] = value


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

    def put(self, body: Mapping[str, Any]) -> bool:
        """Keep `body` unless the copy held is as new; True when it is news (not our own write
        coming back through the watch, nor an older event)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        current = self.bodies.get(key)
        if current is not None:
            same = (current.get("metadata") or {}).get("uid") == meta.get("uid")
            if same and resource_version(current) >= resource_version(body) > 0:
                return False
        self.bodies[key] = dict(body)
        return True

    def get(self, key: JobKey) -> dict[str, Any] | None:
        return self.bodies.get(key)

    def refresh(self, body: Mapping[str, Any]) -> None:
        """Our own write's answer: newer than the copy held, but never a job that is not held
        (deleted while the write was on the wire: no DELETED event would release it again)."""
        meta = body.get("metadata") or {}
        current = self.bodies.get((meta.get("namespace", ""), meta.get("name", "")))
        if current is not None and (current.get("metadata") or {}).get("uid") == meta.get("uid"):
            self.put(body)

    def remove(self, key: JobKey) -> None:
        self.bodies.pop(key, None)


@dataclass
class Indexes:
    """kopf's indexes (live views, updated by kopf as watch events arrive)."""

    jobsets: Mapping[Any, Any]
    pods: Mapping[Any, Any]
    nodes: Mapping[Any, Any]
    # Kueue's (with --kueue only): see controller/kueue.py.
    workloads: Mapping[Any, Any] = field(default_factory=dict)
    local_queues: Mapping[Any, Any] = field(default_factory=dict)
    admission_checks: Mapping[Any, Any] = field(default_factory=dict)
    # The kinds capacity models watch (registry.Watch), by watch name (GKE Slices: "slices").
    watched: Mapping[str, Mapping[Any, Any]] = field(default_factory=dict)


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
    # The dry run's verdicts by template_key (oldest first): a thousand jobs of one template in
    # one namespace are judged once, not a thousand times.
    template_verdicts: dict[str, tuple[float, Admission]] = field(default_factory=dict)
    judging: dict[str, asyncio.Future[Admission]] = field(default_factory=dict)  # in flight
    # Namespaces' labels (Pod Security's level), read before a job's first pool; kept briefly.
    _namespaces: dict[str, tuple[float, dict[str, str]]] = field(default_factory=dict)
    # Whether a PriorityClass exists, by name, read before the first pool of a job that names
    # one; kept as briefly (one read per name, not one per job or pass).
    _priority_classes: dict[str, tuple[float, bool]] = field(default_factory=dict)
    # Schedulers (spec.schedulerName) known not to run: no scheduler looked at any pod of a
    # job naming one within --scheduler-grace-seconds (SchedulerNotRunning). Name -> (monotonic
    # time, that job); forgotten once a pod naming it is looked at, or SCHEDULER_ABSENT_SECONDS on.
    _absent_schedulers: dict[str, tuple[float, str]] = field(default_factory=dict)
    # Schedulers seen at work: a pod naming one (any job's, any attempt's) looked at (bound, or
    # given a verdict). Name -> (monotonic time last seen, None). Within
    # --scheduler-grace-seconds of that, the pods of a job that it has not looked at yet are
    # its backlog (a busy or starved scheduler), judged by the unschedulable deadline: not
    # SchedulerNotRunning.
    _working_schedulers: dict[str, tuple[float, None]] = field(default_factory=dict)
    # Node Leases' renewTime by node (the heartbeat check, controller/observe.py), listed at
    # most once a resync for every job: (monotonic time, leases; None: not readable).
    node_leases: tuple[float, dict[str, float] | None] | None = None
    node_leases_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Kueue WorkloadPriorityClass values by name (None: no such class), read as briefly.
    _workload_priorities: dict[str, tuple[float, int | None]] = field(default_factory=dict)
    # JobSets we created that the index may not hold yet (summaries): seen as they were made.
    created_jobsets: dict[JobKey, dict[str, Any]] = field(default_factory=dict)
    # Workloads we created that the index may not hold yet: (when, summary), seen as they were
    # made for a while (kueue.WORKLOAD_ECHO_SECONDS), so the next pass does not create it again.
    created_workloads: dict[JobKey, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    # JobSets we deleted that the index may still hold for a moment: seen as being deleted.
    deleted_jobsets: set[JobKey] = field(default_factory=set)
    # Consecutive failed passes per job (shared by every worker): the exponential backoff.
    errors: dict[JobKey, int] = field(default_factory=dict)
    # The last parse of each job's spec, by (uid, generation, labels): see reconciler.parse_cached.
    parsed: dict[JobKey, tuple[Any, Any]] = field(default_factory=dict)
    # Goodput: the jobs this process has completed a pass of (it watches them since), and when
    # the previous operator was last known alive (its heartbeat): a job's first pass here was
    # blind since then, and that time is charged to the state it sees.
    watched: set[JobKey] = field(default_factory=set)
    previous_alive: datetime | None = None
    # The events posted per job, by (type, reason, message): a repeat updates the first one's
    # count (bounded per job; released with the job).
    events: dict[JobKey, dict[tuple[str, str, str], tuple[str, int]]] = field(default_factory=dict)
    # Set by AdmissionCheck watch events: the activation loop looks again (controller/kueue.py).
    kueue_checks_changed: asyncio.Event = field(default_factory=asyncio.Event)
    # MultiKueue worker: the dispatched jobs (namespace, Workload) whose gang this cluster could
    # not provision, and when it handed them back; the heartbeat Lease keeps them across a
    # restart (controller/heartbeat.py), and a hand-back writes it at once.
    multikueue_lost: dict[tuple[str, str], datetime] = field(default_factory=dict)
    heartbeat: Heartbeat | None = None
    # What /readyz answers; workers reconciling a job right now (a metric).
    readiness: Readiness = field(default_factory=Readiness)
    active_workers: int = 0
    # What is installed, as controller/versions.py last found it: why the installed Kueue (with
    # --kueue) or JobSet cannot work with this operator, naming the installed and needed
    # versions; None when it can (or is not installed at all).
    kueue_problem: str | None = None
    jobset_problem: str | None = None
    # What the restart strategies' probes found about this cluster, by strategy name
    # (versions.py; decide()'s fact, Observed.support).
    support: dict[str, StrategySupport] = field(default_factory=dict)
    # Whether GKE's Slice API (dynamic slicing) is served; None: not looked yet (versions.py).
    slice_api: bool | None = None
    # Whether Kubernetes PodGroups (scheduling.k8s.io/v1beta1) are served; None: not looked yet.
    pod_groups: bool | None = None

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        seen = self._namespaces.get(namespace)
        if seen is None or time.monotonic() - seen[0] > NAMESPACE_LABELS_TTL_SECONDS:
            return None
        return seen[1]

    def remember_namespace_labels(self, namespace: str, labels: dict[str, str]) -> None:
        self._namespaces[namespace] = (time.monotonic(), labels)

    def priority_class_exists(self, name: str) -> bool | None:
        """Whether the PriorityClass was there when last read; None: not read lately."""
        seen = self._priority_classes.get(name)
        if seen is None or time.monotonic() - seen[0] > NAMESPACE_LABELS_TTL_SECONDS:
            return None
        return seen[1]

    def remember_priority_class(self, name: str, exists: bool) -> None:
        self._priority_classes[name] = (time.monotonic(), exists)

    def scheduler_absent(self, name: str) -> str | None:
        """Why the scheduler of this name is known not to run; None: it is not known."""
        seen = self._absent_schedulers.get(name)
        if seen is None:
            return None
        ago = time.monotonic() - seen[0]
        if ago > SCHEDULER_ABSENT_SECONDS:
            del self._absent_schedulers[name]
            return None
        return (
            f"job {seen[1]} failed {ago:.0f}s ago as no scheduler looked at any of its pods, and "
            f"none has looked at a pod naming it since (known for "
            f"{SCHEDULER_ABSENT_SECONDS / 60:.0f} minutes)"
        )

    def scheduler_working(self, name: str) -> bool:
        """A pod naming this scheduler was looked at within the scheduler grace: it runs."""
        seen = self._working_schedulers.get(name)
        return seen is not None and time.monotonic() - seen[0] < self.cfg.scheduler_grace_seconds

    def remember_scheduler(self, name: str, job: JobKey | None) -> None:
        """A job's pods naming this scheduler were not looked at within the grace (`job`), or
        one was looked at (None): it runs."""
        now = time.monotonic()
        if job is None:
            self._absent_schedulers.pop(name, None)
            _remember_bounded(self._working_schedulers, name, (now, None), SCHEDULERS_KEPT)
        else:
            _remember_bounded(self._absent_schedulers, name, (now, "/".join(job)), SCHEDULERS_KEPT)

    def workload_priority(self, name: str) -> tuple[bool, int | None]:
        """(read lately, the WorkloadPriorityClass's value or None when there is none)."""
        seen = self._workload_priorities.get(name)
        if seen is None or time.monotonic() - seen[0] > NAMESPACE_LABELS_TTL_SECONDS:
            return False, None
        return True, seen[1]

    def remember_workload_priority(self, name: str, value: int | None) -> None:
        self._workload_priorities[name] = (time.monotonic(), value)

    def expire(self, now: float | None = None) -> None:
        """Drop what the shared caches hold past its time (the housekeeping loop, every few
        seconds). Each is read only while fresh, and once the jobs that read it are gone no pass
        comes to replace it: a load's last node Lease listing (every node of every pool) and the
        verdicts and labels it read would otherwise stay for the process's life."""
        now = time.monotonic() if now is None else now
        for brief in (self._namespaces, self._priority_classes, self._workload_priorities):
            _drop_older(brief, now - NAMESPACE_LABELS_TTL_SECONDS)
        _drop_older(self.template_verdicts, now - TEMPLATE_VERDICT_TTL_SECONDS)
        _drop_older(self._absent_schedulers, now - SCHEDULER_ABSENT_SECONDS)
        _drop_older(self._working_schedulers, now - self.cfg.scheduler_grace_seconds)
        leases = self.node_leases
        # An unreadable listing (None) holds nothing and says when to ask again: kept.
        if (
            leases is not None
            and leases[1] is not None
            and now - leases[0] >= self.cfg.resync_seconds
        ):
            self.node_leases = None

    def poke(
        self, namespace: str | None, name: str | None, batch: float = 0.0, quiet: float = 0.0
    ) -> None:
        """Reconcile the job soon: `quiet` seconds after the last of a burst of events, within
        `batch` seconds of its first, so that a burst (a restart of 256 pods, a gang's 512 nodes
        registering) costs one pass per `batch` at most, and its last event is seen at once."""
        key = (namespace or "", name or "")
        if not (namespace and name and key in self.store.bodies):
            return
        if batch > 0:
            self.queue.debounce(key, quiet, batch)
        else:
            self.queue.add(key)

    def created_echo(self, key: JobKey, summary: dict[str, Any]) -> bool:
        """Whether a watched JobSet is the one a pass created, as it was created: every pass
        since has observed exactly it (the created copy stands in until the index holds it),
        so it is no news and costs no pass (one pass less per job created). Forgotten then:
        the index holds it."""
        if self.created_jobsets.get(key) != summary:
            return False
        del self.created_jobsets[key]
        return True

    def wait_for_nodes(self, key: JobKey, shape: tuple[str, str] | None) -> None:
        for waited in [s for s, waiting in self.waiting_for_nodes.items() if key in waiting]:
            self.waiting_for_nodes[waited].discard(key)
            if not self.waiting_for_nodes[waited]:  # no shape is kept for jobs long gone
                del self.waiting_for_nodes[waited]
        if shape is not None:
            self.waiting_for_nodes.setdefault(shape, set()).add(key)

    def forget(self, key: JobKey) -> None:
        """The job is deleted: everything held for it goes, its metric series too. The one place
        a job is released (its DELETED event, and the end of a pass it did not outlive)."""
        self.store.remove(key)
        self.queue.forget(key)
        self.strangers.pop(key, None)
        self.parsed.pop(key, None)
        self.wait_for_nodes(key, None)
        self.watched.discard(key)
        self.admission.pop(key, None)
        self.deleted_jobsets.discard(key)
        self.created_jobsets.pop(key, None)
        self.created_workloads.pop(key, None)
        self.errors.pop(key, None)
        self.forget_events(key)
        metrics.forget_job(key)

    def passed(self, key: JobKey) -> bool:
        """After a pass of `key` (not in flight any more): False when its job is gone, and then
        what the pass recorded after the DELETED event (an event, a created JobSet, a series)
        goes too."""
        if key in self.store.bodies:
            return True
        self.forget(key)
        return False

    def event_seen(
        self, key: JobKey, type_: str, reason: str, message: str
    ) -> tuple[str, int] | None:
        return self.events.get(key, {}).get((type_, reason, message))

    def event_posted(
        self, key: JobKey, type_: str, reason: str, message: str, name: str, count: int
    ) -> None:
        posted = self.events.setdefault(key, {})
        posted.pop((type_, reason, message), None)  # re-inserted last: the newest is kept
        posted[(type_, reason, message)] = (name, count)
        while len(posted) > EVENTS_KEPT_PER_JOB:
            posted.pop(next(iter(posted)))

    def forget_events(self, key: JobKey) -> None:
        self.events.pop(key, None)

    def blind_since(self, key: JobKey) -> datetime | None:
        return None if key in self.watched else self.previous_alive

    def admission_of(
        self, key: JobKey, uid: str, generation: int, template: str = ""
    ) -> Admission | None:
        """The apiserver's verdict on this job's JobSet: its own, or that of an identical
        template in the same namespace (`template_key`) judged a moment ago."""
        known = self.admission.get(key)
        if known is not None and known[0] == uid and known[1] == generation:
            return known[2]
        cached = self.template_verdicts.get(template) if template else None
        if cached is None or time.monotonic() - cached[0] > TEMPLATE_VERDICT_TTL_SECONDS:
            return None
        return cached[1]

    def judged(
        self, key: JobKey, uid: str, generation: int, verdict: Admission, template: str = ""
    ) -> None:
        self.admission[key] = (uid, generation, verdict)
        if template:
            self.template_verdicts.pop(template, None)
            self.template_verdicts[template] = (time.monotonic(), verdict)
            while len(self.template_verdicts) > TEMPLATE_VERDICTS_KEPT:
                self.template_verdicts.pop(next(iter(self.template_verdicts)))
