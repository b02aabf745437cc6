"""Prometheus metrics, named in the style of the Kubernetes controller world."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)


class JobPhases(Collector):
    """`multislice_jobs{phase}` computed at scrape time from the jobs the operator knows now, so
    a deleted job simply stops counting (a gauge moved by inc/dec drifts when a dec is missed)."""

    def __init__(self) -> None:
        self.phases: dict[Any, str] = {}

    def set(self, key: Any, phase: str | None) -> None:
        if phase:
            self.phases[key] = phase
        else:
            self.phases.pop(key, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("multislice_jobs", "MultisliceJobs by phase.", labels=["phase"])
        counts: dict[str, int] = {}
        for phase in self.phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        for phase, n in sorted(counts.items()):
            family.add_metric([phase], n)
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("multislice_jobs", "MultisliceJobs by phase.", labels=["phase"])


JOBS = JobPhases()
REGISTRY.register(JOBS)

RECONCILE_TOTAL = Counter(
    "multislice_reconcile_total",
    "Reconciles of MultisliceJobs by result (success, error, requeue).",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_TIME = Histogram(
    "multislice_reconcile_time_seconds",
    "Time one reconcile takes, observation to status write.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
RESTARTS_TOTAL = Counter(
    "multislice_restarts_total",
    "Restarts of all slices (one per JobSet restart observed), by cause.",
    ["cause"],
    registry=REGISTRY,
)
SLICE_FAILURES_TOTAL = Counter(
    "multislice_slice_failures_total",
    "Slice failures by reason (pod failure, capacity lost, gang rollback, startup deadline) "
    "and cause (disruption, workload, hang, startup, provisioning).",
    ["reason", "cause"],
    registry=REGISTRY,
)
CHECKPOINT_REQUESTS_TOTAL = Counter(
    "multislice_checkpoint_requests_total",
    "Checkpoints requested from the workload on demand, by source (user, maintenance).",
    ["source"],
    registry=REGISTRY,
)
PROVISIONING_DURATION = Histogram(
    "multislice_provisioning_duration_seconds",
    "From job start to every slice's node pool running and ready (Managed).",
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
    registry=REGISTRY,
)
TIME_TO_RUNNING = Histogram(
    "multislice_time_to_running_seconds",
    "From the job becoming active (status.startTime) to all slices first running.",
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
    registry=REGISTRY,
)
GANG_ATTEMPTS_TOTAL = Counter(
    "multislice_gang_attempts_total",
    "Gang provisioning attempts started (Managed): every slice's node pool created together.",
    registry=REGISTRY,
)
RESTART_RECOVERY = Histogram(
    "multislice_restart_recovery_seconds",
    "From the failure behind a restart to every slice running again.",
    buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
    registry=REGISTRY,
)
RESTART_LOST_STEPS = Histogram(
    "multislice_restart_lost_steps",
    "Training steps a restart threw away (last step - last checkpoint step), where the "
    "workload's termination message said.",
    buckets=(0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
    registry=REGISTRY,
)
STATE_SECONDS = Counter(
    "multislice_job_state_seconds_total",
    "Seconds MultisliceJobs spent in each goodput state, summed over jobs.",
    ["state"],
    registry=REGISTRY,
)
STATE_CHIP_SECONDS = Counter(
    "multislice_job_state_chip_seconds_total",
    "TPU chip-seconds MultisliceJobs held in each goodput state, summed over jobs; "
    "state=running is the productive part.",
    ["state"],
    registry=REGISTRY,
)
PROCESS_START = time.time()


class JobGoodput(Collector):
    """Per-job goodput gauges (labels namespace, name) as of each job's last pass, and the
    by-state counters moved by what each pass added. A deleted job's gauges go with it."""

    GAUGES = (
        ("multislice_job_goodput_ratio", "Running chip-seconds / held chip-seconds, per job."),
        (
            "multislice_job_wall_goodput_ratio",
            "Running seconds / seconds since the job was first admitted, per job.",
        ),
        ("multislice_job_held_chips", "TPU chips the job holds now (its node pools exist)."),
        ("multislice_job_held_node_pools", "Node pools (slices) the job holds now."),
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
                    counter.labels(state).inc(value - prev.get(state, 0))
        self.counted[key] = (
            {k: max(v, before[0].get(k, 0)) for k, v in seconds.items()},
            {k: max(v, before[1].get(k, 0)) for k, v in chip_seconds.items()},
        )

    def forget(self, key: Any) -> None:
        self.values.pop(key, None)
        self.counted.pop(key, None)

    def _families(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(n, h, labels=["namespace", "name"]) for n, h in self.GAUGES]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        for key, values in sorted(self.values.items()):
            for family, value in zip(families, values, strict=True):
                if value is not None:
                    family.add_metric([str(key[0]), str(key[1])], value)
        yield from families

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()


GOODPUT = JobGoodput()
REGISTRY.register(GOODPUT)


class JobMaintenance(Collector):
    """`multislice_job_maintenance_time_seconds{namespace,name}`: the earliest host maintenance
    GKE scheduled on a node of the job (Unix seconds); no series when none is announced."""

    NAME = "multislice_job_maintenance_time_seconds"
    HELP = "Earliest host maintenance GKE scheduled on a node of the job, in Unix seconds."

    def __init__(self) -> None:
        self.times: dict[Any, float] = {}

    def set(self, key: Any, when: float | None) -> None:
        if when is None:
            self.times.pop(key, None)
        else:
            self.times[key] = when

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.NAME, self.HELP, labels=["namespace", "name"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for key, when in sorted(self.times.items()):
            family.add_metric([str(key[0]), str(key[1])], when)
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()


MAINTENANCE = JobMaintenance()
REGISTRY.register(MAINTENANCE)


def forget_job(key: Any) -> None:
    """A deleted job: every per-job series goes."""
    JOBS.set(key, None)
    GOODPUT.forget(key)
    MAINTENANCE.set(key, None)


GKE_CALLS_TOTAL = Counter(
    "multislice_gke_node_pool_actions_total",
    "Node-pool create/delete requests sent, by action and result.",
    ["action", "result"],
    registry=REGISTRY,
)
ORPHANS_DELETED_TOTAL = Counter(
    "multislice_orphaned_node_pools_deleted_total",
    "Node pools the garbage collector deleted because their job no longer exists.",
    registry=REGISTRY,
)


def serve(port: int, address: str = "127.0.0.1") -> None:
    """Serve /metrics on `address` (0.0.0.0: every interface); port 0 disables it."""
    if port:
        start_http_server(port, addr=address, registry=REGISTRY)
