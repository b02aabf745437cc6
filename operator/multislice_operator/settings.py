"""Operator settings: the one place each setting, its default, flag and environment variable live.

Every field of :class:`Settings` is a command-line flag ``--name-with-dashes`` and an environment
variable ``MSJ_NAME_IN_CAPS`` (flags win), both derived from the field here, so the Helm chart, the
docs and the parser cannot drift from the defaults (tests/unit/test_docs.py checks the settings
table of docs/install.md, that the chart sets only variables read here, and that the docs name
only flags, variables and defaults defined here).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the GKE client library loads only where GKE is used
    from multislice_operator.provisioning.gke_requests import NodeOptions

ENV_PREFIX = "MSJ_"


def _opt(
    help: str,
    default: Any = None,
    *,
    flag: str | None = None,
    env: str | None = None,
    **extra: Any,
) -> Any:
    """A setting: its help text, default and (rarely) a flag or variable name of its own."""
    meta = {"help": help, "flag": flag, "env": env, **extra}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Settings:
    namespaces: list[str] = _opt(  # noqa: RUF009 - _opt returns a field()
        "namespace to watch (repeatable, globs allowed); default: every namespace",
        [],
        flag="namespace",
    )
    gke_project: str | None = _opt(
        "GKE project of the cluster whose node pools the operator manages"
    )
    gke_location: str | None = _opt("the cluster's location (region or zone)")
    gke_cluster: str | None = _opt("the cluster's name")
    gke_node_locations: list[str] = _opt(  # noqa: RUF009
        "zone for TPU node pools (repeatable; a slice lives in one zone)",
        [],
        flag="gke-node-location",
    )
    gke_endpoint: str | None = _opt(
        "GKE API endpoint override, e.g. a private or Private Service Connect endpoint "
        "(https://HOST); requests still carry the operator's Google credentials; default: Google's"
    )
    gke_simulator: str | None = _opt(
        "URL of the local GKE simulator (multislice-local, http://127.0.0.1:PORT): anonymous "
        "credentials, for local runs and tests only; excludes --gke-endpoint"
    )
    gke_from_metadata: bool = _opt(
        "read project, location and cluster from the GKE metadata server", False
    )
    # How TPU nodes reach Google APIs (provisioning.gke_requests.NodeOptions).
    gke_workload_identity: bool = _opt(
        "the cluster uses Workload Identity: TPU nodes get workloadMetadataConfig GKE_METADATA "
        "(pods off the host network act as their Kubernetes service account; host-network pods, "
        "the default, still act as the nodes' service account)",
        False,
    )
    gke_node_service_account: str | None = _opt(
        "service account of the TPU nodes (default: the Compute Engine default one)"
    )
    gke_node_scopes: list[str] = _opt(  # noqa: RUF009
        "OAuth scope URL of the TPU nodes (repeatable; replaces the default: storage-full, "
        "gke-default and cloud-platform, as xpk)",
        [],
        flag="gke-node-scope",
    )
    gke_max_pods_per_node: int = _opt(
        "maxPodsConstraint of TPU node pools: each node reserves a pod-range block of twice this, "
        "rounded up to a power of two (GKE's default 110 takes a /24 per VM); 15, as xpk sends",
        15,
    )
    metrics_port: int = _opt("port of the Prometheus /metrics endpoint (0 disables it)", 8000)
    metrics_bind_address: str = _opt(
        "address the metrics endpoint binds (0.0.0.0: every interface, for scraping)", "127.0.0.1"
    )
    metrics_auth: str = _opt(
        "kubernetes: HTTPS, each scrape's bearer token checked by a TokenReview and a "
        "SubjectAccessReview (get on the non-resource URL /metrics), as controller-runtime's "
        "secure metrics; none: plain HTTP without authentication, on a loopback address only",
        "kubernetes",
        choices=["kubernetes", "none"],
    )
    metrics_cert_dir: str | None = _opt(
        "directory holding tls.crt and tls.key for the metrics endpoint (e.g. a cert-manager "
        "Secret); default: a self-signed certificate made at start"
    )
    health_port: int = _opt(
        "port of /healthz (liveness) and /readyz (readiness: caches synced and, with "
        "--leader-elect, the Lease held); 0 disables them",
        8080,
    )
    health_bind_address: str = _opt(
        "address the health endpoints bind (the kubelet probes the pod's IP)", "0.0.0.0"
    )
    ready_standby: bool = _opt(
        "with --leader-elect, a standby (caches synced, Lease held by another replica) is ready "
        "too: for tools that wait for every replica (helm --wait, Argo CD's Deployment health)",
        False,
    )
    log_format: str = _opt("log format", "text", choices=["text", "json"])
    verbose: bool = _opt("debug logging", False)
    resync_seconds: float = _opt("level-based resync of every job, even without events", 10.0)
    workers: int = _opt("jobs reconciled concurrently", 16)
    gc_interval_seconds: float = _opt(
        "sweep for node pools whose job no longer exists (0 disables it)", 300.0
    )
    backoff_base_seconds: float = _opt("first gang-provisioning retry delay (doubles)", 30.0)
    backoff_max_seconds: float = _opt("longest gang-provisioning retry delay", 600.0)
    node_not_ready_grace_seconds: float = _opt(
        "how long a running slice's nodes may be NotReady (still there) before the slice counts "
        "as lost and its node pool is replaced; shorter NotReady spells are only an event",
        300.0,
    )
    scheduler_grace_seconds: float = _opt(
        "how long a job's pods may wait with no scheduler having looked at any of them (no "
        "PodScheduled condition: spec.template.spec.schedulerName names a scheduler that is not "
        "running) before the job fails and releases its node pools, unless a pod of another "
        "job naming that scheduler was looked at within it (behind, not absent: the "
        "unschedulable deadline judges); for 10 minutes then a job naming that scheduler (not "
        "default-scheduler) fails before its first pool",
        60.0,
    )
    kueue: bool = _opt(
        "watch Kueue Workloads, LocalQueues and AdmissionChecks (kueue.x-k8s.io/v1beta2): run "
        "the multislice.dev/gang-provisioning admission check for jobs that name a queue",
        False,
    )
    in_place_agent_image: str = _opt(
        "an image with JobSet's in-place restart agent at /in-place-restart-agent (the "
        "operator's own image carries it; the chart passes that by default): with it, on a "
        "cluster that restarts pods in place (JobSet >= v0.11 with its InPlaceRestart gate, "
        "Kubernetes >= 1.35), the program's failures restart the pods in place; without it "
        "every restart recreates them",
        "",
    )
    kueue_workload_wait_seconds: float = _opt(
        "how long a queued job's JobSet may go without a Kueue Workload before its status says "
        "that none exists",
        60.0,
    )
    multikueue_lost_cooldown_seconds: float = _opt(
        "on a MultiKueue worker: after this cluster could not provision a dispatched job's gang "
        "(it handed the job back), how long its check stays Pending on that job's next copy, so "
        "that another worker takes it",
        600.0,
    )
    leader_elect: bool = _opt(
        "take a coordination.k8s.io Lease before reconciling, so that two processes never "
        "reconcile at once (the Helm chart always sets it, whatever its replicaCount)",
        False,
    )
    leader_election_namespace: str | None = _opt(
        "namespace of the Leases (leader election, and the heartbeat NAME-heartbeat that a "
        "restarted operator reads: goodput's blind time, MultiKueue hand-backs); default: the "
        "operator pod's namespace"
    )
    leader_election_name: str = _opt(
        "name of the leader-election Lease (the heartbeat Lease is NAME-heartbeat)",
        "multislice-operator",
    )

    @property
    def gke_configured(self) -> bool:
        return bool(self.gke_project and self.gke_location and self.gke_cluster)

    def problems(self) -> list[str]:
        """Combinations `run` refuses before it starts, each naming the setting and the fix."""
        out = []
        if (
            self.metrics_auth == "none"
            and self.metrics_port
            and not is_loopback(self.metrics_bind_address)
        ):
            out.append(
                f"--metrics-auth none serves every job's metrics to anyone who can reach "
                f"{self.metrics_bind_address}: bind a loopback address (--metrics-bind-address "
                "127.0.0.1) or keep --metrics-auth kubernetes"
            )
        if self.gke_simulator and self.gke_endpoint:
            out.append(
                "--gke-simulator and --gke-endpoint exclude each other: the simulator is a local "
                "endpoint without credentials, --gke-endpoint a real one with them"
            )
        if self.gke_endpoint and self.gke_endpoint.startswith("http://"):
            out.append(
                f"--gke-endpoint {self.gke_endpoint}: plain HTTP would send the operator's Google "
                "credentials in clear; give https://HOST (for the local simulator: --gke-simulator)"
            )
        return out

    def node_options(self) -> NodeOptions:
        from multislice_operator.provisioning.gke_requests import NodeOptions

        return NodeOptions(
            workload_identity=self.gke_workload_identity,
            service_account=self.gke_node_service_account or None,
            oauth_scopes=tuple(self.gke_node_scopes) if self.gke_node_scopes else None,
            max_pods_per_node=self.gke_max_pods_per_node,
        )


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _fields() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(Settings))


def flag_of(f: dataclasses.Field[Any]) -> str:
    return "--" + (f.metadata.get("flag") or f.name.replace("_", "-"))


def env_of(f: dataclasses.Field[Any]) -> str:
    return ENV_PREFIX + (f.metadata.get("env") or f.name.upper())


def _kind(f: dataclasses.Field[Any]) -> str:
    return str(f.type).replace(" ", "").split("|")[0]


def _from_env(f: dataclasses.Field[Any]) -> Any:
    raw = os.environ.get(env_of(f))
    if raw is None:
        return None
    kind = _kind(f)
    if kind == "list[str]":
        return [v.strip() for v in raw.split(",") if v.strip()]
    if kind == "bool":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return raw


# The settings that decide what the operator asks GKE for: shared by `run` and `render`.
GKE_REQUEST_SETTINGS = (
    "gke_project",
    "gke_location",
    "gke_cluster",
    "gke_node_locations",
    "gke_workload_identity",
    "gke_node_service_account",
    "gke_node_scopes",
    "gke_max_pods_per_node",
)


def add_gke_arguments(p: argparse.ArgumentParser) -> None:
    _add_arguments(p, [f for f in _fields() if f.name in GKE_REQUEST_SETTINGS])


def gke_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The GKE request settings from parsed arguments (flags, then env, then defaults)."""
    values = dataclasses.asdict(from_args(args))
    return {k: values[k] for k in GKE_REQUEST_SETTINGS}


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per setting; defaults stay None so from_args can tell flag, env and default."""
    _add_arguments(p, _fields())
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    p.add_argument("-v", dest="verbose", action="store_true", default=None, help="--verbose")


def _add_arguments(p: argparse.ArgumentParser, fields: list[dataclasses.Field[Any]]) -> None:
    for f in fields:
        kind = _kind(f)
        help_text = f"{f.metadata['help']} (env {env_of(f)})"
        names = [flag_of(f)]
        if f.name == "namespaces":
            names = ["-n", *names]
        if kind == "bool":
            p.add_argument(*names, dest=f.name, action="store_true", default=None, help=help_text)
        elif kind == "list[str]":
            p.add_argument(*names, dest=f.name, action="append", default=None, help=help_text)
        else:
            conv = {"int": int, "float": float}.get(kind, str)
            p.add_argument(
                *names,
                dest=f.name,
                type=conv,
                default=None,
                choices=f.metadata.get("choices"),
                help=help_text,
            )


def from_args(args: argparse.Namespace) -> Settings:
    """Flags win over MSJ_* environment variables, which win over the defaults above."""
    values: dict[str, Any] = {}
    for f in _fields():
        given = getattr(args, f.name, None)
        if given is None:
            given = _from_env(f)
        if given is not None:
            values[f.name] = given
    return Settings(**values)


def _shown(value: Any) -> str:
    if value in (None, [], ""):
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


def settings_table() -> str:
    """The settings table of docs/install.md, generated from this module (tests keep it fresh)."""
    rows = ["| Variable | Flag | Default | Meaning |", "|---|---|---|---|"]
    for f in _fields():
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        flag = f"`{flag_of(f)}`" + (" (repeatable)" if _kind(f) == "list[str]" else "")
        rows.append(f"| `{env_of(f)}` | {flag} | {_shown(default)} | {f.metadata['help']} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # `make docs`: rewrite the table in docs/install.md
    import re
    import sys
    from pathlib import Path

    path = Path(sys.argv[1])
    begin, end = "(make docs) -->\n", "<!-- end of settings table -->"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    path.write_text(pattern.sub(lambda _: begin + settings_table() + end, path.read_text()))
