"""Prometheus metrics, named in the style of the Kubernetes controller world.

Every per-job series carries the job's `namespace` (the dashboard's $namespace filter applies to
every panel). The counters and histograms moved during a pass take it from JOB_NAMESPACE, which
the worker sets for the job it reconciles (controller/handlers.py), so that the code observing a
restart need not pass it along; the by-job collectors take it from the job's key.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar, Token
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from multislice_operator.api.models import (
    BUDGET_OF_CAUSE,
    Budget,
    RestartCause,
    causes_charged_to,
    word_list,
)

REGISTRY = CollectorRegistry(auto_describe=True)
# process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ... and python_info.
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

# The namespace of the job the current pass reconciles ("" outside a pass).
JOB_NAMESPACE: ContextVar[str] = ContextVar("multislice_job_namespace", default="")
_PER_NAMESPACE: list[PerNamespace] = []
_SEEN_NAMESPACES: set[str] = set()


def enter_namespace(namespace: str) -> Token[str]:
    """Charge this pass's metrics to `namespace` (JOB_NAMESPACE.reset(token) ends it); the first
    pass in a namespace exports its preset label sets at 0."""
    if namespace not in _SEEN_NAMESPACES:
        _SEEN_NAMESPACES.add(namespace)
        for metric in _PER_NAMESPACE:
            for values in metric.presets:
                metric.metric.labels(namespace, *metric.full(values))
    return JOB_NAMESPACE.set(namespace)


class PerNamespace:
    """A counter or histogram whose first label is the namespace of the job being reconciled
    (JOB_NAMESPACE): `.labels(cause)` is `.labels(namespace, cause)`, `.inc()` and `.observe()`
    need no labels at all, as the unlabelled metric's would. `.preset(cause)` names a label set
    exported at 0 in each namespace from its first pass on (enter_namespace), so that rate()
    and increase() see the first failure; no series is made for the "" of no pass. `derived`
    gives the last labels from the others (a restart's budget from its cause), so that no caller
    can pair them wrongly."""

    def __init__(
        self,
        metric: Counter | Histogram,
        derived: Callable[[tuple[str, ...]], tuple[str, ...]] | None = None,
    ) -> None:
        self.metric = metric
        self.derived = derived
        self.presets: list[tuple[str, ...]] = []
        _PER_NAMESPACE.append(self)

    def full(self, values: tuple[str, ...]) -> tuple[str, ...]:
        """The label values after the namespace: those given, then the derived ones."""
        return (*values, *self.derived(values)) if self.derived else values

    def labels(self, *values: str) -> Any:
        return self.metric.labels(JOB_NAMESPACE.get(), *self.full(values))

    def preset(self, *values: str) -> None:
        if values not in self.presets:
            self.presets.append(values)
            for namespace in _SEEN_NAMESPACES:
                self.metric.labels(namespace, *self.full(values))

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def observe(self, value: float) -> None:
        self.labels().observe(value)


class Gauges(Collector):
    """Gauge families made fresh at each scrape from what the operator knows then: `families`
    names them (describe yields them empty), `fill` adds the samples."""

    def families(self) -> list[GaugeMetricFamily]:
        raise NotImplementedError

    def fill(self, families: list[GaugeMetricFamily]) -> None:
        raise NotImplementedError

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self.families()
        self.fill(families)
        yield from families

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self.families()


class JobPhases(Gauges):
    """`multislice_jobs{phase}` computed at scrape time from the jobs the operator knows now, so
    a deleted job simply stops counting (a gauge moved by inc/dec drifts when a dec is missed)."""

    def __init__(self) -> None:
        self.phases: dict[Any, str] = {}

    def set(self, key: Any, phase: str | None) -> None:
        if phase:
            self.phases[key] = phase
        else:
            self.phases.pop(key, None)

    def families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "multislice_jobs",
                "MultisliceJobs by namespace and phase.",
                labels=["namespace", "phase"],
            )
        ]

    def fill(self, families: list[GaugeMetricFamily]) -> None:
        (family,) = families
        counts: dict[tuple[str, str], int] = {}
        for key, phase in self.phases.items():
            where = (str(key[0]), phase)
            counts[where] = counts.get(where, 0) + 1
        for (namespace, phase), n in sorted(counts.items()):
            family.add_metric([namespace, phase], n)


JOBS = JobPhases()
REGISTRY.register(JOBS)

RECONCILE_TOTAL = Counter(
    "multislice_reconcile_total",
    "Reconciles of MultisliceJobs by result (success, error).",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_TIME = Histogram(
    "multislice_reconcile_time_seconds",
    "Time one reconcile takes, observation to status write.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)


def _budget_of(values: tuple[str, ...]) -> tuple[str, ...]:
    """A restart's `budget` label from its `cause` (alerts select by budget, not by cause)."""
    (cause,) = values
    return (BUDGET_OF_CAUSE[RestartCause(cause)].value,)


RESTARTS_TOTAL = PerNamespace(
    Counter(
        "multislice_restarts_total",
        "Restarts of all slices (one per JobSet restart observed), by cause "
        f"({word_list(RestartCause)}) and budget, the failurePolicy field the cause is charged "
        "to (" + "; ".join(f"{b}: {word_list(causes_charged_to(b))}" for b in Budget) + ").",
        ["namespace", "cause", "budget"],
        registry=REGISTRY,
    ),
    derived=_budget_of,
)
SLICE_FAILURES_TOTAL = PerNamespace(
    Counter(
        "multislice_slice_failures_total",
        "Slice failures by reason (pod failure, capacity lost, gang rollback, startup deadline) "
        "and cause (disruption, workload, hang, startup, provisioning).",
        ["namespace", "reason", "cause"],
        registry=REGISTRY,
    )
)
CHECKPOINT_REQUESTS_TOTAL = PerNamespace(
    Counter(
        "multislice_checkpoint_requests_total",
        "Checkpoints requested from the workload on demand, by source (user, maintenance, "
        "flex-start).",
        ["namespace", "source"],
        registry=REGISTRY,
    )
)
# Seconds, for what takes from seconds (a local run) to an hour (a TPU slice at a stockout).
SLOW_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)
PROVISIONING_DURATION = PerNamespace(
    Histogram(
        "multislice_provisioning_duration_seconds",
        "From job start to every slice's node pool running and ready (Managed).",
        buckets=SLOW_BUCKETS,
        labelnames=["namespace"],
        registry=REGISTRY,
    )
)
TIME_TO_RUNNING = PerNamespace(
    Histogram(
        "multislice_time_to_running_seconds",
        "From the job becoming active (status.startTime) to all slices first running.",
        buckets=SLOW_BUCKETS,
        labelnames=["namespace"],
        registry=REGISTRY,
    )
)
GANG_ATTEMPTS_TOTAL = PerNamespace(
    Counter(
        "multislice_gang_attempts_total",
        "Gang provisioning attempts started (Managed): every slice's node pool created together.",
        labelnames=["namespace"],
        registry=REGISTRY,
    )
)
RESTART_RECOVERY = PerNamespace(
    Histogram(
        "multislice_restart_recovery_seconds",
        "From the failure behind a restart to every slice running again.",
        buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
        labelnames=["namespace"],
        registry=REGISTRY,
    )
)
RESTART_LOST_STEPS = PerNamespace(
    Histogram(
        "multislice_restart_lost_steps",
        "Training steps a restart threw away (last step - last checkpoint step), where the "
        "workload's termination message said.",
        buckets=(0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
        labelnames=["namespace"],
        registry=REGISTRY,
    )
)
STATE_SECONDS = Counter(
    "multislice_job_state_seconds_total",
    "Seconds MultisliceJobs spent in each goodput state, summed over the namespace's jobs.",
    ["namespace", "state"],
    registry=REGISTRY,
)
STATE_CHIP_SECONDS = Counter(
    "multislice_job_state_chip_seconds_total",
    "TPU chip-seconds MultisliceJobs held in each goodput state, summed over the namespace's "
    "jobs; state=running is the productive part.",
    ["namespace", "state"],
    registry=REGISTRY,
)
PROCESS_START = time.time()


class JobGoodput(Gauges):
    """Per-job goodput gauges (labels namespace, name) as of each job's last pass, and the
    by-state counters moved by what each pass added. A deleted job's gauges go with it."""

    GAUGES = (
        ("multislice_job_goodput_ratio", "Running chip-seconds / held chip-seconds, per job."),
        (
            "multislice_job_wall_goodput_ratio",
            "Running seconds / seconds since the job was first admitted, per job.",
        ),
        ("multislice_job_held_chips", "TPU chips the job holds now (its node pools exist)."),
        (
            "multislice_job_held_node_pools",
            "Node pools the job holds now (slices, or cubes with dynamic slicing).",
        ),
    )

    def __init__(self) -> None:
        self.values: dict[Any, tuple[float | None, float | None, int, int]] = {}
        self.counted: dict[Any, tuple[dict[str, int], dict[str, int]]] = {}

    def update(
        self,
        key: Any,
        seconds: Mapping[str, int],
        chip_seconds: Mapping[str, int],
        ratios: tuple[float | None, float | None],
        held: tuple[int, int],
        from_zero: bool,
    ) -> None:
        """`seconds` and `chip_seconds`: the job's live totals now. The counters move by what was
        added since this process last counted the job; a job it meets for the first time counts
        from zero only if it was created after the process started (Prometheus sees a restarted
        operator's counters reset, as any counter's)."""
        self.values[key] = (ratios[0], ratios[1], held[0], held[1])
        before = self.counted.get(key)
        if before is None:
            before = ({}, {}) if from_zero else (dict(seconds), dict(chip_seconds))
        for counter, now, prev in (
            (STATE_SECONDS, seconds, before[0]),
            (STATE_CHIP_SECONDS, chip_seconds, before[1]),
        ):
            for state, value in now.items():
                if value > prev.get(state, 0):
                    counter.labels(str(key[0]), state).inc(value - prev.get(state, 0))
        self.counted[key] = (
            {k: max(v, before[0].get(k, 0)) for k, v in seconds.items()},
            {k: max(v, before[1].get(k, 0)) for k, v in chip_seconds.items()},
        )

    def forget(self, key: Any) -> None:
        self.values.pop(key, None)
        self.counted.pop(key, None)

    def families(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(n, h, labels=["namespace", "name"]) for n, h in self.GAUGES]

    def fill(self, families: list[GaugeMetricFamily]) -> None:
        for key, values in sorted(self.values.items()):
            for family, value in zip(families, values, strict=True):
                if value is not None:
                    family.add_metric([str(key[0]), str(key[1])], value)


GOODPUT = JobGoodput()
REGISTRY.register(GOODPUT)


class JobGauge(Gauges):
    """A per-job gauge `NAME{namespace,name}` read from the job's status; no series when unset."""

    def __init__(self, name: str, help_text: str) -> None:
        self.NAME, self.HELP = name, help_text
        self.times: dict[Any, float] = {}

    def set(self, key: Any, when: float | None) -> None:
        if when is None:
            self.times.pop(key, None)
        else:
            self.times[key] = when

    def families(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.NAME, self.HELP, labels=["namespace", "name"])]

    def fill(self, families: list[GaugeMetricFamily]) -> None:
        (family,) = families
        for key, when in sorted(self.times.items()):
            family.add_metric([str(key[0]), str(key[1])], when)


# The earliest host maintenance announced on a node of the job (Unix seconds): status.maintenance.
MAINTENANCE = JobGauge(
    "multislice_job_maintenance_time_seconds",
    "Earliest host maintenance announced on a node of the job (GKE's schedule, or since its "
    "MaintenancePlanned condition), in Unix seconds.",
)
REGISTRY.register(MAINTENANCE)
# status.activeSlices: fewer than spec.slices while an elastic job runs shrunk.
ACTIVE_SLICES = JobGauge(
    "multislice_job_active_slices",
    "Slices the job's JobSet runs on (status.activeSlices): spec.slices, or fewer while an "
    "elastic job (spec.elastic) is degraded.",
)
REGISTRY.register(ACTIVE_SLICES)


def forget_job(key: Any) -> None:
    """A deleted job: every per-job series goes."""
    JOBS.set(key, None)
    GOODPUT.forget(key)
    MAINTENANCE.set(key, None)
    ACTIVE_SLICES.set(key, None)


GKE_CALLS_TOTAL = Counter(
    "multislice_gke_node_pool_actions_total",
    "Node-pool actions the operator took, by action (create, delete) and result: one per "
    "batch of pools (a gang's creates, one job's deletes, one orphan sweep's deletes), "
    "result error when a request for any pool of the batch failed; not one per GKE API call.",
    ["action", "result"],
    registry=REGISTRY,
)
ORPHANS_DELETED_TOTAL = Counter(
    "multislice_orphaned_node_pools_deleted_total",
    "Node pools the garbage collector deleted because their job no longer exists.",
    registry=REGISTRY,
)


class RuntimeState(Gauges):
    """What the running operator is doing, read at scrape time from callables the controller
    binds (metrics knows nothing of it): workqueue depth, active workers, leadership."""

    def __init__(self) -> None:
        self.depth: Callable[[], int] = lambda: 0
        self.active_workers: Callable[[], int] = lambda: 0
        self.workers: Callable[[], int] = lambda: 0
        self.leader: Callable[[], bool] = lambda: False

    def families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "multislice_workqueue_depth",
                "Jobs due for a reconcile and waiting for a worker (client-go's workqueue_depth).",
            ),
            GaugeMetricFamily("multislice_active_workers", "Workers reconciling a job right now."),
            GaugeMetricFamily("multislice_max_workers", "Workers the operator runs (--workers)."),
            GaugeMetricFamily(
                "multislice_leader",
                "1 while this process reconciles (it holds the leader-election Lease, or runs "
                "without leader election), else 0 (a standby).",
            ),
        ]

    def fill(self, families: list[GaugeMetricFamily]) -> None:
        values = (self.depth(), self.active_workers(), self.workers(), int(self.leader()))
        for family, value in zip(families, values, strict=True):
            family.add_metric([], value)


RUNTIME = RuntimeState()
REGISTRY.register(RUNTIME)


class BuildInfo(Gauges):
    """`multislice_build_info{version,python_version,kopf_version} 1`, as Kubernetes components'
    build-info metrics: which build each scraped process runs."""

    def families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "multislice_build_info",
                "The operator's version, with the Python and kopf versions it runs on; always 1.",
                labels=["version", "python_version", "kopf_version"],
            )
        ]

    def fill(self, families: list[GaugeMetricFamily]) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from multislice_operator import __version__

        try:
            kopf_version = version("kopf")
        except PackageNotFoundError:  # pragma: no cover - kopf is a dependency
            kopf_version = ""
        (family,) = families
        family.add_metric([__version__, platform.python_version(), kopf_version], 1)


REGISTRY.register(BuildInfo())
