"""Prometheus metrics, named in the style of the Kubernetes controller world."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

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
JOBS = Gauge("multislice_jobs", "MultisliceJobs by phase.", ["phase"], registry=REGISTRY)
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
    "From job creation to all slices running.",
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


def serve(port: int) -> None:
    """Serve /metrics on all interfaces (0 disables)."""
    if port:
        start_http_server(port, registry=REGISTRY)
