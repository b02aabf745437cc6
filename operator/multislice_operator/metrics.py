"""Prometheus metrics, named in the style of the Kubernetes controller world."""

from __future__ import annotations

from collections.abc import Iterator
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
    "Restarts of all slices (one per JobSet restart observed).",
    registry=REGISTRY,
)
SLICE_FAILURES_TOTAL = Counter(
    "multislice_slice_failures_total",
    "Slice failures by reason (pod exit, capacity lost, gang rollback).",
    ["reason"],
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
