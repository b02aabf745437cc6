"""Operator settings from flags and environment variables (flags win).

Every setting has an environment variable `MSJ_<NAME>` so the Helm chart can set it without
rewriting the command line.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the GKE client library loads only where GKE is used
    from multislice_operator.provisioning.gke_requests import NodeOptions


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"MSJ_{name}", default)


def _env_list(name: str) -> list[str]:
    raw = _env(name) or ""
    return [v.strip() for v in raw.split(",") if v.strip()]


@dataclass
class Settings:
    namespaces: list[str] = field(default_factory=list)  # empty: all namespaces
    gke_project: str | None = None
    gke_location: str | None = None
    gke_cluster: str | None = None
    gke_node_locations: list[str] = field(default_factory=list)
    gke_endpoint: str | None = None  # e.g. http://127.0.0.1:PORT for the local simulator
    gke_from_metadata: bool = False
    # How TPU nodes reach Google APIs (provisioning.gke_requests.NodeOptions).
    gke_workload_identity: bool = False
    gke_node_service_account: str | None = None
    gke_node_scopes: list[str] = field(default_factory=list)  # empty: the default for the mode
    metrics_port: int = 8000
    liveness_endpoint: str | None = None
    log_format: str = "text"  # text | json
    verbose: bool = False
    resync_seconds: float = 10.0  # timer: level-based resync even without events
    gc_interval_seconds: float = 300.0  # orphaned node-pool sweep
    peering: str | None = None  # kopf peering name for standby replicas; None: standalone
    # Among peers the highest priority works and the others stand by; equal priorities all pause,
    # so each replica gets its own (random unless set).
    peering_priority: int | None = None
    backoff_base_seconds: float = 30.0
    backoff_max_seconds: float = 600.0

    @property
    def gke_configured(self) -> bool:
        return bool(self.gke_project and self.gke_location and self.gke_cluster)

    def node_options(self) -> NodeOptions:
        from multislice_operator.provisioning.gke_requests import NodeOptions

        return NodeOptions(
            workload_identity=self.gke_workload_identity,
            service_account=self.gke_node_service_account or None,
            oauth_scopes=tuple(self.gke_node_scopes) if self.gke_node_scopes else None,
        )


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        default=None,
        help="namespace to watch (repeatable, globs allowed); env MSJ_NAMESPACES (comma list)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    p.add_argument("-v", "--verbose", action="store_true", default=_env("VERBOSE") == "1")
    p.add_argument("--log-format", choices=["text", "json"], default=_env("LOG_FORMAT", "text"))
    p.add_argument(
        "--liveness",
        default=_env("LIVENESS"),
        metavar="URL",
        help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
    )
    p.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", "8000") or 8000))
    add_gke_arguments(p)
    p.add_argument(
        "--gke-endpoint",
        default=_env("GKE_ENDPOINT"),
        help="GKE API endpoint override (the local simulator); default: Google's",
    )
    p.add_argument(
        "--gke-from-metadata",
        action="store_true",
        default=_env("GKE_FROM_METADATA") == "1",
        help="read project, location and cluster from the GKE metadata server",
    )
    p.add_argument(
        "--resync-seconds", type=float, default=float(_env("RESYNC_SECONDS", "10") or 10)
    )
    p.add_argument(
        "--gc-interval-seconds",
        type=float,
        default=float(_env("GC_INTERVAL_SECONDS", "300") or 300),
    )
    p.add_argument(
        "--backoff-base-seconds",
        type=float,
        default=float(_env("BACKOFF_BASE_SECONDS", "30") or 30),
    )
    p.add_argument("--peering", default=_env("PEERING"), help="kopf peering name (HA standby)")
    p.add_argument(
        "--peering-priority",
        type=int,
        default=int(_env("PEERING_PRIORITY") or 0) or None,
        help="this replica's peering priority (default: random, so exactly one replica works)",
    )


def add_gke_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that decide what the operator asks GKE for (shared by run and render)."""
    p.add_argument("--gke-project", default=_env("GKE_PROJECT"))
    p.add_argument("--gke-location", default=_env("GKE_LOCATION"))
    p.add_argument("--gke-cluster", default=_env("GKE_CLUSTER"))
    p.add_argument(
        "--gke-node-location",
        action="append",
        dest="gke_node_locations",
        default=None,
        help="zone for TPU node pools (repeatable); env MSJ_GKE_NODE_LOCATIONS",
    )
    p.add_argument(
        "--gke-workload-identity",
        action="store_true",
        default=_env("GKE_WORKLOAD_IDENTITY") == "1",
        help="the cluster uses Workload Identity: TPU nodes get workloadMetadataConfig "
        "GKE_METADATA and GKE's default scopes (else storage-full,gke-default,cloud-platform)",
    )
    p.add_argument(
        "--gke-node-service-account",
        default=_env("GKE_NODE_SERVICE_ACCOUNT"),
        metavar="EMAIL",
        help="service account of the TPU nodes (default: the Compute Engine default one)",
    )
    p.add_argument(
        "--gke-node-scope",
        action="append",
        dest="gke_node_scopes",
        default=None,
        metavar="URL",
        help="OAuth scope of the TPU nodes (repeatable; replaces the default); "
        "env MSJ_GKE_NODE_SCOPES",
    )


def gke_settings(args: argparse.Namespace) -> dict[str, object]:
    """The Settings fields add_gke_arguments defines, from parsed arguments."""
    return {
        "gke_project": args.gke_project,
        "gke_location": args.gke_location,
        "gke_cluster": args.gke_cluster,
        "gke_node_locations": list(args.gke_node_locations or _env_list("GKE_NODE_LOCATIONS")),
        "gke_workload_identity": args.gke_workload_identity,
        "gke_node_service_account": args.gke_node_service_account,
        "gke_node_scopes": list(args.gke_node_scopes or _env_list("GKE_NODE_SCOPES")),
    }


def from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        namespaces=list(args.namespaces or _env_list("NAMESPACES")),
        **gke_settings(args),  # type: ignore[arg-type]
        gke_endpoint=args.gke_endpoint,
        gke_from_metadata=args.gke_from_metadata,
        metrics_port=args.metrics_port,
        liveness_endpoint=args.liveness,
        log_format=args.log_format,
        verbose=args.verbose,
        resync_seconds=args.resync_seconds,
        gc_interval_seconds=args.gc_interval_seconds,
        backoff_base_seconds=args.backoff_base_seconds,
        peering=args.peering,
        peering_priority=args.peering_priority,
    )
