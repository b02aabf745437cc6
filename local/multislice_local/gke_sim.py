"""A local GKE API simulator: a real HTTP server speaking the container v1 and Cloud TPU v2 REST.

The operator's GKE adapter (``provisioning.gke``) talks to it with the real client library over
REST, exactly as it talks to ``container.googleapis.com``; nothing in the client is patched::

    ClusterManagerClient(credentials=AnonymousCredentials(), transport="rest",
                         client_options={"api_endpoint": sim.url})

What it serves (wire format of the client library's REST transport: camelCase JSON, enums as
integers in requests, as strings in responses, errors as ``{"error": {code, message, status}}``):

* ``POST|GET /v1/projects/P/locations/L/clusters/C/nodePools`` (create, list)
* ``GET|DELETE /v1/projects/P/locations/L/clusters/C/nodePools/N`` (get, delete)
* ``GET /v1/projects/P/locations/L/operations[/O]`` (list, get)
* ``GET /v2/projects/P/locations/ZONE/acceleratorTypes`` (Cloud TPU v2; offered types per zone)

Every answer honours a response field mask (the ``fields`` / ``$fields`` system parameter or the
``X-Goog-FieldMask`` header, https://cloud.google.com/apis/docs/system-parameters; see
:mod:`multislice_local.fieldmask`); a mask naming a field the response type lacks is 400
INVALID_ARGUMENT, as the real service answers.

Behaviour modelled on GKE. The simulator is the project's only judge of GKE, so it is an
adversary: whatever it accepts GKE accepts (where a rule is unconfirmed it refuses more, never
less); each rule cites its public source where it is enforced (:meth:`GkeSimulator._validate`):

* create returns a RUNNING ``CREATE_NODE_POOL`` operation at once; the pool lists as
  PROVISIONING; after ``op_latency_s`` its nodes are registered (see :class:`NodeRegistrar`) and
  it turns RUNNING. An injected stockout/quota failure runs longer (``failed_create_latency_s``,
  default 3 x ``op_latency_s``, as GKE's instance group keeps trying) and then ends DONE with an
  error ("Not all instances running in IGM after ... Current errors: [GCE_STOCKOUT] ... does not
  have enough resources", or ``GCE_QUOTA_EXCEEDED``), the pool ERROR with that
  ``statusMessage`` and no nodes, as GKE leaves it.
* synchronous validation (400 INVALID_ARGUMENT): pool name (RFC 1035, <= 40), node labels (no
  ``kubernetes.io`` / ``k8s.io`` namespace, ``cloud.google.com`` is GKE's, label syntax), GCE
  resource labels, ``management`` with auto-upgrade or auto-repair off in a release channel
  (``SimConfig.release_channel``, REGULAR by default), ``GKE_METADATA`` without Workload
  Identity on the cluster, OAuth scopes as URLs, specific reservations (a name or
  ``projects/P/reservations/R``), known machine types, one zone per TPU pool, ``tpuTopology`` only
  on multi-host pools, topology vs machine type (dimensions, the generation's shapes, node count).
* a create over quota is refused at once: 403 PERMISSION_DENIED "Insufficient regional quota to
  satisfy request: resource ..." (``quota_sync_next``); ``permission_denied_next`` gives a real
  permission 403.
* one operation per node pool, one cluster-level operation at a time: deleting a pool whose
  create or delete runs is refused with 400 FAILED_PRECONDITION "Operation O is currently
  creating (deleting) a node pool for cluster C. Please wait and try again once it is done." (it
  names the operation, not the pool); during :meth:`GkeSimulator.start_cluster_upgrade` every
  create and delete gets "Operation O is currently upgrading cluster C ...".
* delete turns the pool STOPPING; after ``delete_latency_s`` its nodes go and the pool is gone.
* concurrent operations on different pools are allowed unless ``max_concurrent_operations`` is
  set (older clusters); past it, create/delete answer 400 FAILED_PRECONDITION: "Operation O is
  currently deleting a node pool for cluster C" when a delete runs, else "Cluster is running
  incompatible operation O".
* spot preemption (:meth:`GkeSimulator.preempt`): the pool's nodes disappear while the pool stays
  RUNNING, as when GKE's managed instance group loses its VMs; the nodes come back after
  ``preempt_recreate_s`` (None: never, the operator must replace the pool).
  :meth:`GkeSimulator.break_pool` sets ERROR (and removes the nodes).
* OAuth scopes as GKE gives them (none sent: only logging and monitoring): a TPU pool whose
  nodes could not pull an image or write gs:// is accepted, as GKE accepts it, but flagged: a
  warning in the log, ``tpuPoolsWithoutStorageAccess`` in the counters, and
  :meth:`GkeSimulator.node_access` says what its nodes can do.
* :meth:`GkeSimulator.received_creates` returns every CreateNodePoolRequest as received
  (``parent`` from the URL, the JSON body), for comparing with the operator's dry run.
* Compute Engine resource policies (workload policies): an insert takes the name at once, the
  policy reads CREATING until its operation is DONE (``policy_latency_s``), then READY; a second
  insert of the name meanwhile is 409 alreadyExists, a pool naming a policy that is not READY is
  refused. A tpu7x pool may name only its workload policy: the policy's accelerator topology is
  the slice's (GKE's Ironwood guides, xpk).
* capacity per zone, capacity type and specific reservation (:meth:`GkeSimulator.set_capacity`,
  in TPU chips; a key not set is unlimited): a create whose zone has not the chips free for its
  type (``ZONE/OnDemand``, ``ZONE/Spot``) is accepted and fails as a stockout; a flex-start one
  (``ZONE/FlexStart``) waits for capacity (RUNNING, no nodes, as Dynamic Workload Scheduler queues
  it) until :meth:`GkeSimulator.grant_flex_start`; a create on a specific reservation without the
  VMs free (``reservation/R``) is refused at once with GKE's 429 RESOURCE_EXHAUSTED "Reservation
  does not have enough resources for the request: specific reservation ..."
  (GoogleCloudPlatform/gsutil#1000). Pools that exist hold their chips until deleted (a failed
  one holds none), so a test exhausts one capacity and leaves another.
* GKE dynamic slicing (:mod:`multislice_local.slices`, docs/dynamic-slicing-contract.md):
  :meth:`GkeSimulator.add_reservation` makes All Capacity mode reservations of 4x4x4 sub-blocks
  that tpu7x pools take whole; with a ``slice_store`` a simulated slice controller forms ``Slice``
  objects, labels their nodes and follows :meth:`GkeSimulator.set_cube_state`.

Faults (settable in the constructor, with Python methods, over ``/_sim/faults`` or as CLI flags),
see :class:`Faults`: ``stockout_next`` (next N creates), ``stockout_on_create`` (the k-th
accepted creates, 1-based), ``stockout_zones``, ``quota_next``, ``quota_sync_next``,
``permission_denied_next``, ``http_429_next``, ``http_5xx_next`` (any API call),
``invalid_machine_types`` (400 INVALID_ARGUMENT), and the latency / conflict knobs of
:class:`SimConfig`.

Admin API (JSON): ``GET /_sim/state``, ``GET /_sim/counters``, ``POST /_sim/counters/reset``,
``POST /_sim/faults`` (merge the given fields), ``DELETE /_sim/faults`` (clear),
``POST /_sim/config`` (``opLatencyS``, ``failedCreateLatencyS``, ``deleteLatencyS``,
``maxConcurrentOperations``, ``preemptRecreateS``, ``releaseChannel``, ``workloadIdentity``,
``mutationDelayS``),
``POST /_sim/offered`` (``{"zone": ["v5litepod-16", ...]}``), ``POST /_sim/pools/NAME/preempt``
(``{"recreateAfterS": 2}``), ``POST /_sim/pools/NAME/break`` (``{"message": "..."}``),
``POST /_sim/reservations`` (``{"name": "R", "blocks": {"block-1": 4}}``), ``GET /_sim/cubes``,
``GET|POST /_sim/capacity`` (``{"us-east5-b/Spot": 16, "reservation/R": 0}``; null: unlimited),
``POST /_sim/cubes/ID/state`` (``{"state": "UNHEALTHY"}``), ``POST /_sim/slices/NAME/stuck``
(``{"stuck": true}``: its deletion stops at DEACTIVATING). Names are looked up across clusters.

CLI: ``python -m multislice_local.gke_sim --port 0 [--kubeconfig K]`` prints its URL
as the first line of stdout and serves until SIGINT/SIGTERM; with ``--kubeconfig`` running pools
get kwok fake TPU nodes in that cluster (see :mod:`multislice_local.nodes`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import heapq
import itertools
import json
import logging
import math
import os
import re
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Protocol, Self
from urllib.parse import parse_qs, urlsplit

from google.cloud.container_v1.types import cluster_service
from google.protobuf import json_format

from multislice_local import fieldmask, slices
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.tpu import catalog

log = logging.getLogger(__name__)

GKE_VERSION = "1.34.1-gke.1000000"
_COMPUTE_URL = "https://www.googleapis.com/compute/v1"
ZONE_LABEL = "topology.kubernetes.io/zone"
_POOL_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_GCE_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_GCE_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_K8S_LABEL_DOMAINS = ("kubernetes.io", "k8s.io")
_USER_GKE_NODE_LABELS = {
    "cloud.google.com/gke-tpu-ici-resiliency",
    "cloud.google.com/gke-location-hint",
    # xpk creates v6e (and GPU) pools with --accelerator-network-profile=auto
    # --node-labels=cloud.google.com/gke-networking-dra-driver=true (src/xpk/core/nodepool.py).
    "cloud.google.com/gke-networking-dra-driver",
}
_DNS1123_SUBDOMAIN_RE = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_NAME_RE = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^((?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_RESERVATION_RE = re.compile(models.RESERVATION_PATTERN)
# Machine types that are not TPUs but that a cluster accepts (system pools in tests).
_GENERIC_MACHINE_RE = re.compile(r"^(e2|n1|n2|n2d|c2|c3|t2d)-(standard|highmem|highcpu)-\d+$")
_TPU_CONFIG_TYPES = {"v4": "V4", "v5litepod": "V5LITE_POD", "v5p": "V5P", "v6e": "V6E"}


# --------------------------------------------------------------------------------------------
# Machine types and what GKE derives from them


@dataclass(frozen=True)
class TpuMachine:
    """What a TPU machine type means for the nodes GKE makes of it."""

    machine_type: str
    accelerator_label: str  # cloud.google.com/gke-tpu-accelerator
    chips_per_host: int
    generation: catalog.Generation | None  # None for types the catalog does not know (tpu7x)

    def single_host_topology(self) -> str:
        if self.generation is None:
            return "2x2x1"
        return catalog.topologies_for(self.generation, self.chips_per_host)[0]

    def dims(self) -> int:
        return self.generation.dims if self.generation else 3


def _tpu_machines() -> dict[str, TpuMachine]:
    return {
        mt: TpuMachine(mt, gen.gke_accelerator, chips, gen)
        for gen in catalog.GENERATIONS.values()
        for chips, mt in gen.machine_types.items()
    }


TPU_MACHINES = _tpu_machines()


def default_offered_types() -> list[str]:
    """Every accelerator type of the catalog that the Cloud TPU API serves (v4, v5litepod, v5p,
    v6e): "The Cloud TPU API is not supported on TPU7x and later TPU versions" (Cloud TPU "Create
    Cloud TPU VMs"), so acceleratorTypes never lists tpu7x."""
    return [
        f"{gen.prefix}-{size}"
        for gen in catalog.GENERATIONS.values()
        if gen.cloud_tpu_api
        for size in catalog.valid_sizes(gen)
    ]


# --------------------------------------------------------------------------------------------
# Node registration


@dataclass(frozen=True)
class NodeGroup:
    """The nodes GKE would register for one RUNNING pool."""

    pool: str
    count: int
    zone: str
    machine_type: str
    accelerator_label: str | None  # None for non-TPU machine types
    topology: str | None
    chips_per_host: int
    spot: bool
    labels: dict[str, str]  # full node labels: config.labels plus the GKE ones
    user_labels: dict[str, str]  # config.labels only


class NodeRegistrar(Protocol):
    """Makes a pool's nodes exist in some Kubernetes (or a test's memory). Called from the
    simulator's worker thread, never with its lock held; may block."""

    def register(self, group: NodeGroup) -> None: ...

    def unregister(self, pool: str) -> None: ...


class InMemoryRegistrar:
    """Records node groups; what tests and the default CLI run use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.groups: dict[str, NodeGroup] = {}
        self.events: list[tuple[str, str, int]] = []  # (register|unregister, pool, count)

    def register(self, group: NodeGroup) -> None:
        with self._lock:
            self.groups[group.pool] = group
            self.events.append(("register", group.pool, group.count))

    def label(self, pool: str, labels: dict[str, str | None]) -> None:
        """Set (None: remove) labels on a pool's nodes, as the Kubernetes registrar does."""
        with self._lock:
            group = self.groups.get(pool)
            if group is None:
                return
            merged = {k: v for k, v in {**group.labels, **labels}.items() if v is not None}
            self.groups[pool] = dataclasses.replace(group, labels=merged)
            self.events.append(("label", pool, group.count))

    def unregister(self, pool: str) -> None:
        with self._lock:
            group = self.groups.pop(pool, None)
            self.events.append(("unregister", pool, group.count if group else 0))

    def node_count(self, pool: str | None = None) -> int:
        with self._lock:
            if pool is not None:
                group = self.groups.get(pool)
                return group.count if group else 0
            return sum(g.count for g in self.groups.values())


class _RegistrarLabeler:
    """Labels a pool's nodes through the simulator's registrar (when it can label)."""

    def __init__(self, sim: GkeSimulator) -> None:
        self._sim = sim

    def label(self, pool: str, labels: dict[str, str | None]) -> None:
        label = getattr(self._sim.registrar, "label", None)
        if label is not None:
            label(pool, labels)


# How soon a node removal that failed (an apiserver error) is tried again.
UNREGISTER_RETRY_S = 0.5


class KubeNodeRegistrar:
    """Registers kwok fake GKE TPU nodes in a real (local) Kubernetes API server."""

    def __init__(self, api_client_or_kubeconfig: Any) -> None:
        self._given = api_client_or_kubeconfig
        self._client: Any = None
        self._client_lock = threading.Lock()
        # "namespace/name" of every pod a pool's deletion ended (node shutdown), in order.
        self.shut_down: list[str] = []

    @property
    def _target(self) -> Any:
        """One API client for a kubeconfig path, built on first use: one per call read the
        kubeconfig and opened a new TLS connection for each pool (a gang's 256 operations,
        completed one after the other on the simulator's worker thread)."""
        if not isinstance(self._given, str | os.PathLike):
            return self._given
        with self._client_lock:
            if self._client is None:
                from kubernetes import config as kconfig

                path = os.fspath(self._given)
                self._client = kconfig.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
            return self._client

    def register(self, group: NodeGroup) -> None:
        from multislice_local import nodes

        if group.accelerator_label is None or group.topology is None:
            log.info("gke-sim skipping nodes of non-TPU pool pool=%s", group.pool)
            return
        extra = {k: v for k, v in group.labels.items() if k not in _GKE_NODE_LABELS}
        nodes.register_tpu_nodes(
            self._target,
            group.pool,
            group.count,
            group.accelerator_label,
            group.topology,
            group.chips_per_host,
            extra_labels=extra,
            spot=group.spot,
            # New VMs, new names (GKE: gke-CLUSTER-POOL-<8 hex of the instance group>-<4>).
            instance_group=secrets.token_hex(4),
        )

    def label(self, pool: str, labels: dict[str, str | None]) -> None:
        from multislice_local import nodes

        nodes.label_nodes(self._target, pool, labels)

    def unregister(self, pool: str) -> None:
        from multislice_local import nodes

        # As GKE's graceful node shutdown does.
        self.shut_down.extend(nodes.shut_down_pods(self._target, pool))
        nodes.delete_nodes(self._target, pool)


_GKE_NODE_LABELS = {
    keys.GKE_NODEPOOL,
    keys.GKE_TPU_ACCELERATOR,
    keys.GKE_TPU_TOPOLOGY,
    keys.GKE_SPOT,
}


# --------------------------------------------------------------------------------------------
# Configuration and faults


@dataclass
class SimConfig:
    op_latency_s: float = 1.5  # create: PROVISIONING -> RUNNING
    # A create that fails (stockout, quota) runs longer than one that succeeds, as GKE's managed
    # instance group keeps retrying before it gives up; None: 3 x op_latency_s.
    failed_create_latency_s: float | None = None
    delete_latency_s: float | None = None  # STOPPING -> gone; None: same as op_latency_s
    max_concurrent_operations: int | None = None  # per cluster; None: unlimited
    preempt_recreate_s: float | None = None  # nodes come back after a preemption; None: never
    failed_create_leaves_pool: bool = True  # False: a failed create removes the pool
    allow_delete_while_creating: bool = False  # True: delete cancels a running create
    # Clusters that exist, as projects/P/locations/L/clusters/C; None: every cluster exists.
    clusters: list[str] | None = None
    # Offered accelerator types per zone; zones not listed offer default_offered (None: all).
    offered: dict[str, list[str]] = field(default_factory=dict)
    default_offered: list[str] | None = None
    # The simulated cluster: its release channel (None: no channel) and whether Workload
    # Identity is enabled (a workload pool), which node pool requests are checked against.
    release_channel: str | None = "REGULAR"
    workload_identity: bool = False
    # The cluster's GKE version (GET cluster: currentMasterVersion), checked for tpu7x and
    # flex-start pools.
    cluster_version: str = GKE_VERSION
    # The cluster's pod IPv4 range (a /14 by default for VPC-native clusters) and the
    # max-pods-per-node its pools get when a request sends no maxPodsConstraint (GKE: 110).
    pod_range_prefix: int = 14
    default_max_pods_per_node: int = 110
    # Flex-start: how long the simulated Dynamic Workload Scheduler takes to find capacity for a
    # flex-start pool once it is RUNNING and empty (None: op_latency_s); Faults.flex_start_hold
    # keeps pools waiting until grant_flex_start().
    flex_start_wait_s: float | None = None
    # Scales a flex-start pool's maxRunDuration (tests: 0.01 turns 7 days into 100 minutes).
    flex_start_run_scale: float = 1.0
    policy_latency_s: float = 0.2  # Compute Engine resource policy insert: RUNNING -> DONE
    # A node pool create or delete waits this long before GKE applies it (its round trip):
    # listings answered meanwhile do not show it yet.
    mutation_delay_s: float = 0.0
    # Dynamic slicing: a Slice stays ACTIVATING this long; the slice controller syncs this often.
    slice_activation_s: float = 0.5
    slice_sync_s: float = 0.1

    def delete_latency(self) -> float:
        return self.op_latency_s if self.delete_latency_s is None else self.delete_latency_s

    def flex_start_wait(self) -> float:
        return self.op_latency_s if self.flex_start_wait_s is None else self.flex_start_wait_s

    def failed_create_latency(self) -> float:
        if self.failed_create_latency_s is None:
            return 3 * self.op_latency_s
        return self.failed_create_latency_s


@dataclass
class Faults:
    stockout_next: int = 0  # the next N accepted creates end in GCE_STOCKOUT
    stockout_on_create: list[int] = field(default_factory=list)  # k-th accepted creates (1-based)
    stockout_zones: list[str] = field(default_factory=list)  # every create in these zones
    quota_next: int = 0  # the next N accepted creates end in GCE_QUOTA_EXCEEDED
    # The next N creates are refused at once with GKE's synchronous 403 quota answer.
    quota_sync_next: int = 0
    permission_denied_next: int = 0  # the next N creates: a real 403 permission error
    http_429_next: int = 0  # the next N API calls answer 429 RESOURCE_EXHAUSTED
    http_5xx_next: int = 0  # the next N API calls answer http_5xx_status
    http_5xx_status: int = 503
    http_fault_methods: list[str] = field(default_factory=list)  # limit 429/5xx to these methods
    invalid_machine_types: list[str] = field(default_factory=list)  # 400 INVALID_ARGUMENT
    # The next N flex-start pools wait for capacity until grant_flex_start() (or the admin call
    # POST /_sim/pools/NAME/grant): Dynamic Workload Scheduler queueing them.
    flex_start_hold: int = 0

    def to_json(self) -> dict[str, Any]:
        return {_camel(k): v for k, v in asdict(self).items()}

    def merge_json(self, data: dict[str, Any]) -> None:
        known = {_camel(f.name): f.name for f in fields(self)}
        for key, value in data.items():
            name = known.get(key) or (key if key in known.values() else None)
            if name is None:
                raise ValueError(f"unknown fault {key!r}; known: {sorted(known)}")
            setattr(self, name, value)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


class ApiError(Exception):
    """An error answer in Google's JSON error format."""

    def __init__(self, http: int, status: str, message: str) -> None:
        super().__init__(message)
        self.http = http
        self.status = status
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.http, "message": self.message, "status": self.status}}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------------------------
# Model


@dataclass
class _Pool:
    cluster: str  # projects/P/locations/L/clusters/C
    name: str
    spec: dict[str, Any]  # the NodePool as created (camelCase JSON, enums as strings)
    status: str = "PROVISIONING"
    status_message: str = ""
    nodes: int = 0  # nodes currently registered
    op: str | None = None  # name of the running operation on this pool
    pod_cidr_size: int = 24  # the per-node block of the pod range (podIpv4CidrSize)
    flex_held: bool = False  # flex-start: DWS holds it waiting until grant_flex_start()
    flex_epoch: int = 0  # flex-start grants/expiries belong to one provisioning
    topology: str | None = None  # the slice's: tpuTopology or its workload policy's
    cubes: list[str] = field(default_factory=list)  # sub-block paths it holds (All Capacity)
    extra_labels: dict[str, str] = field(default_factory=dict)  # GKE's labels of its sub-block
    full_target: str = ""  # the reservation path it aimed at when it found no free sub-block
    stock_key: str | None = None  # the capacity it takes (GkeSimulator.set_capacity's key)
    holds_stock: bool = False  # it holds its chips of that capacity (accepted, not failed)

    @property
    def flex_start(self) -> bool:
        return bool(self.spec.get("config", {}).get("flexStart"))

    @property
    def slice_nodes(self) -> int:
        """Nodes the pool is for: its node count, or a flex-start pool's autoscaling maximum."""
        if self.flex_start:
            return int(self.spec.get("autoscaling", {}).get("maxNodeCount", 0))
        zones = self.spec.get("locations") or [""]
        return int(self.spec.get("initialNodeCount", 0)) * len(zones)

    @property
    def reserved_addresses(self) -> int:
        """Pod-range addresses the pool's nodes take: one /pod_cidr_size block per node."""
        return int(self.slice_nodes * 2 ** (32 - self.pod_cidr_size))

    @property
    def path(self) -> str:
        return f"{self.cluster}/nodePools/{self.name}"

    def to_json(self) -> dict[str, Any]:
        body = dict(self.spec)
        location = self.cluster.split("/clusters/")[0]
        body.update(
            name=self.name,
            status=self.status,
            selfLink=f"https://container.googleapis.com/v1/{self.path}",
            version=GKE_VERSION,
            etag=f"{abs(hash((self.name, self.status))):x}",
            instanceGroupUrls=[
                f"https://www.googleapis.com/compute/v1/{location.replace('locations', 'zones')}"
                f"/instanceGroupManagers/gke-{self.name}-grp"
            ],
        )
        body["podIpv4CidrSize"] = self.pod_cidr_size
        if self.status_message:
            body["statusMessage"] = self.status_message
        return body


@dataclass
class _ResourcePolicy:
    """A Compute Engine resource policy (regional), as inserted."""

    project: str
    region: str
    name: str
    body: dict[str, Any]  # the ResourcePolicy JSON as received (camelCase)
    created: str = field(default_factory=lambda: _now())
    status: str = "READY"  # CREATING until its insert operation is DONE (ResourcePolicy.status)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/regions/{self.region}/resourcePolicies/{self.name}"

    @property
    def workload(self) -> dict[str, Any]:
        workload: dict[str, Any] = self.body.get("workloadPolicy", {})
        return workload

    def to_json(self) -> dict[str, Any]:
        return {
            **self.body,
            "kind": "compute#resourcePolicy",
            "id": str(abs(hash(self.path)) % 10**18),
            "creationTimestamp": self.created,
            "name": self.name,
            "region": f"{_COMPUTE_URL}/projects/{self.project}/regions/{self.region}",
            "selfLink": f"{_COMPUTE_URL}/{self.path}",
            "status": self.status,
        }


@dataclass
class _ComputeOperation:
    """A Compute Engine region operation (compute#operation)."""

    project: str
    region: str
    name: str
    op_type: str  # insert | delete
    target: str  # projects/P/regions/R/resourcePolicies/N
    status: str = "RUNNING"
    start: str = field(default_factory=lambda: _now())
    end: str = ""

    def to_json(self) -> dict[str, Any]:
        region = f"{_COMPUTE_URL}/projects/{self.project}/regions/{self.region}"
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(abs(hash(self.name)) % 10**18),
            "name": self.name,
            "operationType": self.op_type,
            "targetLink": f"{_COMPUTE_URL}/{self.target}",
            "status": self.status,
            "progress": 100 if self.status == "DONE" else 0,
            "insertTime": self.start,
            "startTime": self.start,
            "region": region,
            "selfLink": f"{region}/operations/{self.name}",
        }
        if self.end:
            body["endTime"] = self.end
        return body


@dataclass
class _Operation:
    location: str  # projects/P/locations/L
    name: str  # operation-<ms>-<hex>, as GKE names them
    op_type: str  # CREATE_NODE_POOL | DELETE_NODE_POOL
    target: str  # projects/P/locations/L/clusters/C/nodePools/N
    status: str = "RUNNING"
    start: str = field(default_factory=_now)
    end: str = ""
    error: dict[str, Any] | None = None
    failure: str | None = None  # planned outcome of a create: None, "stockout" or "quota"

    @property
    def path(self) -> str:
        return f"{self.location}/operations/{self.name}"

    def to_json(self) -> dict[str, Any]:
        loc = self.location.rsplit("/", 1)[1]
        body: dict[str, Any] = {
            "name": self.name,
            "zone": loc,
            "location": loc,
            "operationType": self.op_type,
            "status": self.status,
            "selfLink": f"https://container.googleapis.com/v1/{self.path}",
            "targetLink": f"https://container.googleapis.com/v1/{self.target}",
            "startTime": self.start,
        }
        if self.end:
            body["endTime"] = self.end
        if self.error:
            body["error"] = self.error
            body["statusMessage"] = self.error["message"]
        return body


class _Scheduler:
    """One worker thread running callbacks at their due time (operation completions)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._stopped = False
        self._held = 0  # held(): due callbacks wait
        self._thread = threading.Thread(target=self._run, name="gke-sim-ops", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def after(self, delay_s: float, fn: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay_s), next(self._seq), fn))
            self._cv.notify_all()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """No callback runs inside (those due run at its end): a test sees an operation's
        intermediate state however long the machine takes, not within a latency."""
        with self._cv:
            self._held += 1
        try:
            yield
        finally:
            with self._cv:
                self._held -= 1
                self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopped:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now and not self._held:
                        break
                    wait = self._heap[0][0] - now if self._heap and not self._held else None
                    self._cv.wait(wait)
                if self._stopped:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:  # a failing callback must not stop the simulated cloud
                log.exception("gke-sim scheduled callback failed")


# --------------------------------------------------------------------------------------------
# The simulator


class _Server(ThreadingHTTPServer):
    """A client that goes away mid-request (an operator killed by the crash harness) is no
    error of the simulator's: not printed as a traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class GkeSimulator:
    """A GKE + Cloud TPU REST endpoint on 127.0.0.1 with fault injection. Thread-safe.

    Use as a context manager, or ``start()`` / ``stop()``; ``url`` is the ``api_endpoint``.
    """

    def __init__(
        self,
        config: SimConfig | None = None,
        faults: Faults | None = None,
        registrar: NodeRegistrar | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        slice_store: slices.SliceStore | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.faults = faults or Faults()
        self.registrar: NodeRegistrar = registrar or InMemoryRegistrar()
        self._host, self._port = host, port
        self._lock = threading.RLock()
        self._pools: dict[str, _Pool] = {}  # by pool path
        self._ops: dict[str, _Operation] = {}  # by operation path
        self._creates_accepted = 0
        self._policy_inserts_accepted = 0
        # TPU pools accepted whose nodes could not pull an image or write gs:// (node_access).
        self._crippled_pools = 0
        self._calls: Counter[str] = Counter()
        self._responses: Counter[str] = Counter()
        self._injected: Counter[str] = Counter()
        self._ops_running: Counter[str] = Counter()  # by cluster
        self._peak_ops = 0
        # Every CreateNodePoolRequest received, as on the wire: parent (the URL) + the JSON body.
        self._received: list[dict[str, Any]] = []
        # Compute Engine: resource policies by path, their operations, inserts as received.
        self._policies: dict[str, _ResourcePolicy] = {}
        self._compute_ops: dict[str, _ComputeOperation] = {}
        self._received_policies: list[dict[str, Any]] = []
        # Dynamic slicing: sub-blocks of All Capacity mode reservations by path; the slice
        # controller when Slices are served (``slice_store``).
        self._cubes: dict[str, slices.SubBlock] = {}
        # Chips per capacity (set_capacity): ZONE/TYPE or reservation/PATH; absent: unlimited.
        self._stock: dict[str, int] = {}
        self.slice_controller = (
            slices.SliceController(
                slice_store, _RegistrarLabeler(self), self.config.slice_activation_s
            )
            if slice_store is not None
            else None
        )
        self._scheduler = _Scheduler()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        handler = type("Handler", (_Handler,), {"sim": self})
        self._server = _Server((self._host, self._port), handler)
        self._server.daemon_threads = True
        self._scheduler.start()
        self._thread = threading.Thread(
            # A short poll interval keeps stop() fast (shutdown waits for one poll).
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="gke-sim-http",
            daemon=True,
        )
        self._thread.start()
        if self.slice_controller is not None:
            self._scheduler.after(self.config.slice_sync_s, self._slice_tick)
        log.info("gke-sim listening url=%s", self.url)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._scheduler.stop()
        self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("simulator not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    # -- Python admin API -----------------------------------------------------------------------

    def set_faults(self, **kwargs: Any) -> None:
        """Set fault fields by name (``stockout_next=2``, ``http_429_next=3``, ...)."""
        with self._lock:
            for key, value in kwargs.items():
                if not hasattr(self.faults, key):
                    raise ValueError(f"unknown fault {key!r}")
                setattr(self.faults, key, value)

    def clear_faults(self) -> None:
        with self._lock:
            self.faults = Faults()

    def configure(self, **kwargs: Any) -> None:
        """Change SimConfig fields at run time (``op_latency_s=5``, ...)."""
        with self._lock:
            for key, value in kwargs.items():
                if not hasattr(self.config, key):
                    raise ValueError(f"unknown config field {key!r}")
                setattr(self.config, key, value)

    def set_offered(self, zone: str, types: Iterable[str]) -> None:
        with self._lock:
            self.config.offered[zone] = list(types)

    def set_capacity(self, key: str, chips: int | None, project: str = "p") -> None:
        """The TPU chips the cloud has for ``key``: ``ZONE/OnDemand``, ``ZONE/Spot`` or
        ``ZONE/FlexStart`` (the zone's VMs of that provisioning model), or ``reservation/R`` (a
        specific reservation: a name in ``project``, or projects/P/reservations/R). None:
        unlimited (the default for every key). Pools that exist keep what they hold."""
        norm = _stock_key(key, project)
        with self._lock:
            if chips is None:
                self._stock.pop(norm, None)
            else:
                self._stock[norm] = int(chips)

    def capacity(self) -> dict[str, dict[str, int]]:
        """Every limited capacity: its chips and the chips its pools hold now."""
        with self._lock:
            return {k: {"chips": v, "held": self._held(k)} for k, v in self._stock.items()}

    def counters(self) -> dict[str, Any]:
        """Calls by method, responses by HTTP code, injected faults, pools, peak operations."""
        with self._lock:
            return {
                "calls": dict(self._calls),
                "responses": dict(self._responses),
                "injected": dict(self._injected),
                "createsAccepted": self._creates_accepted,
                "policyInsertsAccepted": self._policy_inserts_accepted,
                "tpuPoolsWithoutStorageAccess": self._crippled_pools,
                "livePools": len(self._pools),
                "runningOperations": sum(self._ops_running.values()),
                "peakConcurrentOperations": self._peak_ops,
            }

    def reset_counters(self) -> None:
        with self._lock:
            self._calls.clear()
            self._responses.clear()
            self._injected.clear()
            self._peak_ops = sum(self._ops_running.values())

    def pools(self) -> dict[str, dict[str, Any]]:
        """Every pool by name (across clusters), as the list endpoint returns it."""
        with self._lock:
            return {p.name: p.to_json() for p in self._pools.values()}

    def pool(self, name: str) -> dict[str, Any] | None:
        return self.pools().get(name)

    def pool_operation(self, name: str) -> str | None:
        """The type and status of the last operation on pool `name` (a test's diagnosis)."""
        with self._lock:
            pool = next((p for p in self._pools.values() if p.name == name), None)
            op = self._ops.get(pool.op or "") if pool is not None else None
            return None if op is None else f"{op.op_type} {op.status}"

    def node_access(self, name: str) -> dict[str, bool] | None:
        """What the nodes of pool `name` can do with Google APIs as their service account,
        from the scopes GKE gives them (:func:`node_access`); None when no such pool."""
        with self._lock:
            pool = next((p for p in self._pools.values() if p.name == name), None)
            return None if pool is None else node_access(pool.spec.get("config", {}))

    def received_creates(self) -> list[dict[str, Any]]:
        """Every create_node_pool request received, accepted or not: ``parent`` and the body."""
        with self._lock:
            received: list[dict[str, Any]] = json.loads(json.dumps(self._received))
        return received

    def received_policy_inserts(self) -> list[dict[str, Any]]:
        """Every resourcePolicies.insert received: ``project``, ``region`` (the URL) and the body
        as ``resourcePolicyResource`` (the InsertResourcePolicyRequest's JSON form)."""
        with self._lock:
            received: list[dict[str, Any]] = json.loads(json.dumps(self._received_policies))
        return received

    def policies(self) -> dict[str, dict[str, Any]]:
        """Every resource policy by name (across projects and regions), as GET returns it."""
        with self._lock:
            return {rp.name: rp.to_json() for rp in self._policies.values()}

    def add_policy(self, project: str, region: str, body: dict[str, Any]) -> None:
        """Make a resource policy exist as if someone else had inserted it (tests)."""
        with self._lock:
            rp = _ResourcePolicy(project, region, str(body["name"]), dict(body))
            self._policies[rp.path] = rp

    def grant_flex_start(self, name: str) -> None:
        """Dynamic Workload Scheduler found capacity for a waiting flex-start pool: its whole
        slice is provisioned now."""
        pool = self._find(name)
        with self._lock:
            pool.flex_held = False
            epoch = pool.flex_epoch
        self._flex_provision(pool, epoch)

    def start_cluster_upgrade(self, cluster: str, duration_s: float) -> str:
        """Start an UPGRADE_MASTER operation on ``projects/P/locations/L/clusters/C``: node pool
        creates and deletes are refused while it runs, as GKE refuses them. Returns its name."""
        project, location = cluster.split("/")[1], cluster.split("/")[3]
        with self._lock:
            op = self._start_op(location, project, "UPGRADE_MASTER", cluster)

        def finish() -> None:
            with self._lock:
                self._end_op(op)

        self._scheduler.after(duration_s, finish)
        log.info("gke-sim cluster upgrade started cluster=%s op=%s", cluster, op.name)
        return op.name

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "pools": [
                    p.to_json() | {"nodes": p.nodes, "flexHeld": p.flex_held}
                    for p in self._pools.values()
                ],
                "resourcePolicies": [rp.to_json() for rp in self._policies.values()],
                "operations": [o.to_json() for o in self._ops.values()],
                "cubes": self.cubes(),
                "counters": self.counters(),
                "faults": self.faults.to_json(),
            }

    def operations_held(self) -> contextlib.AbstractContextManager[None]:
        """Tests: no operation finishes inside (each due one finishes at its end)."""
        return self._scheduler.held()

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Wait until no operation is running (tests); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not any(o.status == "RUNNING" for o in self._ops.values()):
                    return True
            time.sleep(0.02)
        return False

    def preempt(self, name: str, recreate_after_s: float | str | None = "config") -> None:
        """Spot preemption: the pool's nodes disappear, the pool stays RUNNING (GKE's managed
        instance group recreates the VMs); they come back after ``recreate_after_s`` (default
        ``config.preempt_recreate_s``; None: never)."""
        pool = self._find(name)
        delay = self.config.preempt_recreate_s if recreate_after_s == "config" else recreate_after_s
        self.registrar.unregister(pool.name)
        with self._lock:
            pool.nodes = 0
            self._set_nodes_ready(pool, False)
        log.info("gke-sim preempted pool=%s recreate_after_s=%s", name, delay)
        if delay is not None:
            self._scheduler.after(float(delay), lambda: self._recreate_nodes(pool))

    def break_pool(self, name: str, message: str = "", remove_nodes: bool = True) -> None:
        """Put a pool in ERROR (e.g. a failed repair), with a status message."""
        pool = self._find(name)
        if remove_nodes:
            self.registrar.unregister(pool.name)
        with self._lock:
            pool.status = "ERROR"
            pool.status_message = message or (
                "Google Compute Engine: Instance group is unhealthy: nodes failed repair"
            )
            if remove_nodes:
                pool.nodes = 0
                self._set_nodes_ready(pool, False)
        log.info("gke-sim broke pool=%s", name)

    # -- dynamic slicing: sub-blocks and the slice controller ------------------------------------

    def add_reservation(self, name: str, blocks: dict[str, int], project: str = "p") -> list[str]:
        """An All Capacity mode reservation with ``blocks`` ({block: sub-block count}); returns
        the partition IDs of its sub-blocks (4x4x4 cubes of 16 tpu7x VMs). Node pools aimed at it
        (at the reservation, a block or a sub-block) take whole free sub-blocks."""
        reservation = (
            name if name.startswith("projects/") else f"projects/{project}/reservations/{name}"
        )
        with self._lock:
            added = slices.sub_blocks(reservation, blocks)
            for cube in added:
                self._cubes.setdefault(cube.path, cube)
            return [c.partition_id for c in added]

    def cubes(self) -> list[dict[str, Any]]:
        """Every sub-block: path, block, partition ID, partition state, its pool, nodes ready."""
        with self._lock:
            return [
                {
                    "path": c.path,
                    "block": c.block,
                    "subBlock": c.name,
                    "partitionId": c.partition_id,
                    "state": c.state,
                    "pool": c.pool,
                    "nodesReady": c.nodes_ready,
                }
                for c in self._cubes.values()
            ]

    def set_cube_state(self, key: str, state: str) -> None:
        """Set a cube's partition state (``slices.PARTITION_STATES``): by partition ID, sub-block
        name or path, or the pool on it. Its nodes' ``cloud.google.com/gke-tpu-partition-4x4x4-
        state`` label follows, and the slice controller's next pass the Slice holding it
        (DEGRADED: ACTIVE_DEGRADED; UNHEALTHY: FAILED). Raises KeyError for an unknown cube."""
        if state not in slices.PARTITION_STATES:
            raise ValueError(f"state must be one of {slices.PARTITION_STATES}, got {state!r}")
        with self._lock:
            found = [
                c
                for c in self._cubes.values()
                if key in (c.partition_id, c.name, c.path) or (c.pool is not None and key == c.pool)
            ]
            if not found:
                raise KeyError(f"no sub-block {key!r}")
            cube = found[0]
            cube.state = state
            pool = next((p for p in self._pools.values() if cube.path in p.cubes), None)
            if pool is not None and len(pool.cubes) == 1:
                pool.extra_labels[slices.PARTITION_STATE_LABEL] = state
        if pool is not None and len(pool.cubes) == 1:
            _RegistrarLabeler(self).label(pool.name, {slices.PARTITION_STATE_LABEL: state})
        log.info("gke-sim cube %s (%s) is %s", cube.partition_id, cube.name, state)

    def set_slice_stuck(self, name: str, stuck: bool = True) -> None:
        """Make a Slice's deletion stop at DEACTIVATING (GKE's troubleshooting page names Slices
        stuck so): its finalizer stays until someone removes it."""
        if self.slice_controller is None:
            raise RuntimeError("no slice store: construct the simulator with slice_store")
        if stuck:
            self.slice_controller.stuck.add(name)
        else:
            self.slice_controller.stuck.discard(name)

    def set_slice_unlabel_delay(self, seconds: float) -> None:
        """Make the slice controller take `seconds` to take a deleted Slice's name off its
        nodes (GKE's does not do it at once)."""
        if self.slice_controller is None:
            raise RuntimeError("no slice store: construct the simulator with slice_store")
        self.slice_controller.unlabel_delay_s = seconds

    def sync_slices(self) -> None:
        """One pass of the slice controller now (it also runs every ``slice_sync_s``)."""
        if self.slice_controller is None:
            raise RuntimeError("no slice store: construct the simulator with slice_store")
        with self._lock:
            snapshot = {c.partition_id: dataclasses.replace(c) for c in self._cubes.values()}
        self.slice_controller.sync(snapshot)

    def _slice_tick(self) -> None:
        try:
            self.sync_slices()
        except Exception:  # the API server may be briefly away; the next pass retries
            log.exception("gke-sim slice controller pass failed")
        self._scheduler.after(self.config.slice_sync_s, self._slice_tick)

    def _claim_cubes(self, pool: _Pool, project: str) -> str | None:
        """Take the sub-blocks a pool on an All Capacity reservation needs: one per 64 chips of
        its slice (a PROVISION_ONLY sub-block pool: one). None when it got them (or is not on
        such a reservation), else the failure ``reservation_full``: more cubes than the
        reservation (block, sub-block) has free."""
        target = _reservation_target(pool.spec, project)
        if target is None or not any(
            c.path == target or c.path.startswith(target + "/") for c in self._cubes.values()
        ):
            return None
        chips = catalog.topology_chips(pool.topology) if pool.topology else 0
        want = max(1, chips // slices.CHIPS_PER_CUBE)
        taken: list[slices.SubBlock] = []
        for _ in range(want):
            cube = slices.pick_sub_block(
                [c for c in self._cubes.values() if not taken or c.block == taken[0].block],
                target,
            )
            if cube is None:
                for c in taken:
                    c.pool = None
                pool.full_target = target
                return "reservation_full"
            cube.pool = pool.name
            taken.append(cube)
        pool.cubes = [c.path for c in taken]
        if len(taken) == 1:  # its nodes are that cube's: GKE labels them with it
            pool.extra_labels.update(taken[0].node_labels())
        return None

    def _set_nodes_ready(self, pool: _Pool, ready: bool) -> None:
        for path in pool.cubes:
            self._cubes[path].nodes_ready = ready

    def _release_cubes(self, pool: _Pool) -> None:
        for path in pool.cubes:
            cube = self._cubes.get(path)
            if cube is not None and cube.pool == pool.name:
                cube.pool, cube.nodes_ready = None, False
        pool.cubes = []

    def _find(self, name: str) -> _Pool:
        with self._lock:
            for pool in self._pools.values():
                if pool.name == name or pool.path == name:
                    return pool
        raise KeyError(f"no node pool {name!r}")

    # -- request dispatch -----------------------------------------------------------------------

    def handle(
        self, method: str, path: str, body: bytes, fields: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Answer one HTTP request: (status, JSON body). `fields`: the response field mask the
        request gave (the ``fields`` system parameter or the ``X-Goog-FieldMask`` header)."""
        try:
            if path.startswith("/_sim/"):
                return 200, self._admin(method, path, body)
            route = _route(method, path)
            if route is None:
                raise ApiError(404, "NOT_FOUND", f"unknown method or path: {method} {path}")
            name, args = route
            mask = _response_mask(name, fields)
            if name in ("create_node_pool", "delete_node_pool") and self.config.mutation_delay_s:
                time.sleep(self.config.mutation_delay_s)  # outside the lock: others are answered
            with self._lock:
                self._calls[name] += 1
                self._inject_http_fault(name)
                result: dict[str, Any] = getattr(self, f"_api_{name}")(*args, body=body)
            with self._lock:
                self._responses["200"] += 1
            return 200, fieldmask.apply(result, mask)
        except ApiError as err:
            with self._lock:
                self._responses[str(err.http)] += 1
            return err.http, err.body()
        except (ValueError, TypeError) as err:  # admin API input errors
            return 400, ApiError(400, "INVALID_ARGUMENT", str(err)).body()
        except Exception as err:  # a simulator bug: answer 500 rather than drop the connection
            log.exception("gke-sim internal error on %s %s", method, path)
            return 500, ApiError(500, "INTERNAL", f"gke-sim internal error: {err}").body()

    def _inject_http_fault(self, method: str) -> None:
        f = self.faults
        if f.http_fault_methods and method not in f.http_fault_methods:
            return
        if f.http_429_next > 0:
            f.http_429_next -= 1
            self._injected["http429"] += 1
            raise ApiError(
                429,
                "RESOURCE_EXHAUSTED",
                "Quota exceeded for quota metric 'Requests' and limit 'Requests per minute' of "
                "service 'container.googleapis.com' (injected by gke-sim).",
            )
        if f.http_5xx_next > 0:
            f.http_5xx_next -= 1
            self._injected["http5xx"] += 1
            status = HTTPStatus(f.http_5xx_status)
            grpc = "UNAVAILABLE" if status == HTTPStatus.SERVICE_UNAVAILABLE else "INTERNAL"
            raise ApiError(status.value, grpc, f"{status.phrase} (injected by gke-sim).")

    # -- container v1 ---------------------------------------------------------------------------

    def _cluster(self, project: str, location: str, cluster: str) -> str:
        path = f"projects/{project}/locations/{location}/clusters/{cluster}"
        if self.config.clusters is not None and path not in self.config.clusters:
            raise ApiError(404, "NOT_FOUND", f"Not found: {path}.")
        return path

    def _api_create_node_pool(
        self, project: str, location: str, cluster: str, *, body: bytes
    ) -> dict[str, Any]:
        cluster_path = self._cluster(project, location, cluster)
        self._received.append({"parent": cluster_path, **json.loads(body or b"{}")})
        spec = _parse_create(body)
        name = str(spec.get("name", ""))
        self._validate(spec, location, project)
        self._refuse_if_faulted(spec, location, project)
        path = f"{cluster_path}/nodePools/{name}"
        if path in self._pools:
            raise ApiError(409, "ALREADY_EXISTS", f"Already exists: {path}.")
        self._check_cluster_operation(cluster_path)
        self._check_conflict(cluster_path)
        stock = self._stock_of(spec, location, project)
        self._refuse_if_reservation_full(spec, stock, location)
        self._creates_accepted += 1
        access = node_access(spec.get("config", {}))
        if spec.get("config", {}).get("machineType") in TPU_MACHINES and not all(access.values()):
            # GKE accepts it (no refusal to model), but the job will not run: flag it.
            self._crippled_pools += 1
            log.warning(
                "gke-sim TPU pool %s has scopes %s: its nodes cannot %s", name,
                effective_scopes(spec.get("config", {})),
                " or ".join(k for k, ok in (("pull images", access["pullImages"]),
                            ("write Cloud Storage", access["writeStorage"])) if not ok),
            )  # fmt: skip
        pool = _Pool(
            cluster_path, name, spec, topology=self._slice_topology(spec, location, project)
        )
        pool.stock_key = stock
        reservation_full = self._claim_cubes(pool, project)
        max_pods = int(spec.get("maxPodsConstraint", {}).get("maxPodsPerNode", 0))
        pool.pod_cidr_size = pod_cidr_size(max_pods or self.config.default_max_pods_per_node)
        if pool.flex_start and self.faults.flex_start_hold > 0:
            self.faults.flex_start_hold -= 1
            pool.flex_held = True
        op = self._start_op(location, project, "CREATE_NODE_POOL", path)
        op.failure = (
            self._placement_failure(pool)
            or reservation_full
            or self._ip_space_failure(pool)
            or self._take_stock(pool)
            or self._planned_failure(spec, location)
        )
        pool.op = op.path
        self._pools[path] = pool
        log.info(
            "gke-sim create accepted pool=%s op=%s failure=%s", name, op.name, op.failure or "-"
        )
        latency = self.config.op_latency_s
        if op.failure is not None:
            latency = self.config.failed_create_latency()
        self._scheduler.after(latency, lambda: self._finish_create(op.path))
        return op.to_json()

    def _api_list_node_pools(
        self, project: str, location: str, cluster: str, *, body: bytes
    ) -> dict[str, Any]:
        cluster_path = self._cluster(project, location, cluster)
        pools = [p.to_json() for p in self._pools.values() if p.cluster == cluster_path]
        return {"nodePools": pools} if pools else {}

    def _api_get_node_pool(
        self, project: str, location: str, cluster: str, name: str, *, body: bytes
    ) -> dict[str, Any]:
        return self._get_pool(self._cluster(project, location, cluster), name).to_json()

    def _api_delete_node_pool(
        self, project: str, location: str, cluster: str, name: str, *, body: bytes
    ) -> dict[str, Any]:
        pool = self._get_pool(self._cluster(project, location, cluster), name)
        self._check_cluster_operation(pool.cluster)
        # One operation per node pool at a time (GKE "Troubleshoot concurrent operations"); the
        # answer names the running operation, not the pool.
        running = self._ops.get(pool.op or "")
        if running is not None and running.status == "RUNNING":
            if running.op_type == "DELETE_NODE_POOL":
                raise _busy(running)
            if not self.config.allow_delete_while_creating:
                raise _busy(running)
            self._end_op(running, error={"code": 1, "message": "Operation was cancelled."})
        self._check_conflict(pool.cluster)
        op = self._start_op(location, project, "DELETE_NODE_POOL", pool.path)
        pool.op = op.path
        pool.status = "STOPPING"
        log.info("gke-sim delete accepted pool=%s op=%s", name, op.name)
        self._scheduler.after(self.config.delete_latency(), lambda: self._finish_delete(op.path))
        return op.to_json()

    def _api_get_operation(
        self, project: str, location: str, name: str, *, body: bytes
    ) -> dict[str, Any]:
        op = self._ops.get(f"projects/{project}/locations/{location}/operations/{name}")
        if op is None:
            raise ApiError(404, "NOT_FOUND", f"Not found: operation {name}.")
        return op.to_json()

    def _api_list_operations(self, project: str, location: str, *, body: bytes) -> dict[str, Any]:
        prefix = f"projects/{project}/locations/{location}"
        ops = [o.to_json() for o in self._ops.values() if o.location == prefix]
        return {"operations": ops} if ops else {}

    def _api_get_cluster(
        self, project: str, location: str, cluster: str, *, body: bytes
    ) -> dict[str, Any]:
        path = self._cluster(project, location, cluster)
        channel = self.config.release_channel
        out: dict[str, Any] = {
            "name": cluster,
            "location": location,
            "selfLink": f"https://container.googleapis.com/v1/{path}",
            "currentMasterVersion": self.config.cluster_version,
            "currentNodeVersion": self.config.cluster_version,
            "status": "RUNNING",
            "clusterIpv4Cidr": f"10.0.0.0/{self.config.pod_range_prefix}",
        }
        if channel:
            out["releaseChannel"] = {"channel": channel}
        if self.config.workload_identity:
            out["workloadIdentityConfig"] = {"workloadPool": f"{project}.svc.id.goog"}
        return out

    # -- Compute Engine v1: resource policies and region operations ------------------------------

    def _api_insert_resource_policy(
        self, project: str, region: str, *, body: bytes
    ) -> dict[str, Any]:
        self._received_policies.append(
            {
                "resourcePolicyResource": json.loads(body or b"{}"),
                "region": region,
                "project": project,
            }
        )
        spec = _parse_policy(body)
        name = str(spec.get("name", ""))
        _validate_policy(spec)
        rp = _ResourcePolicy(project, region, name, spec, status="CREATING")
        if rp.path in self._policies:
            # GCE: 409 alreadyExists "The resource '...' already exists", also while the first
            # insert's operation runs: the name is taken at insert (piercefreeman/
            # cloud-gpu-reliability#5: 409 on an insert "twice in the same second").
            raise ApiError(409, "ALREADY_EXISTS", f"The resource '{rp.path}' already exists")
        self._policies[rp.path] = rp
        self._policy_inserts_accepted += 1
        op = self._compute_op(project, region, "insert", rp.path)

        def finish() -> None:
            with self._lock:
                rp.status = "READY"
                op.status, op.end = "DONE", _now()

        if self.config.policy_latency_s <= 0:
            finish()
        else:
            self._scheduler.after(self.config.policy_latency_s, finish)
        log.info("gke-sim resource policy insert policy=%s region=%s", name, region)
        return op.to_json()

    def _api_get_resource_policy(
        self, project: str, region: str, name: str, *, body: bytes
    ) -> dict[str, Any]:
        return self._policy(project, region, name).to_json()

    def _api_list_resource_policies(
        self, project: str, region: str, *, body: bytes
    ) -> dict[str, Any]:
        prefix = f"projects/{project}/regions/{region}/"
        items = [rp.to_json() for path, rp in self._policies.items() if path.startswith(prefix)]
        return {"kind": "compute#resourcePolicyList", "items": items}

    def _api_delete_resource_policy(
        self, project: str, region: str, name: str, *, body: bytes
    ) -> dict[str, Any]:
        rp = self._policy(project, region, name)
        if rp.status != "READY":
            # GCE: 400 resourceNotReady "The resource '...' is not ready" (Compute Engine error
            # reasons). Wording UNCONFIRMED for resource policies.
            raise ApiError(400, "FAILED_PRECONDITION", f"The resource '{rp.path}' is not ready")
        users = [p for p in self._pools.values() if _policy_of(p) == (project, region, name)]
        if users:
            # GCE refuses to delete a resource in use: 400 resourceInUseByAnotherResource "The
            # resource_policy resource '...' is already being used by '...'" (Compute Engine
            # error reasons; wording UNCONFIRMED for workload policies).
            raise ApiError(
                400,
                "FAILED_PRECONDITION",
                f"The resource_policy resource '{rp.path}' is already being used by "
                f"'{users[0].path}'",
            )
        del self._policies[rp.path]
        op = self._compute_op(project, region, "delete", rp.path)
        op.status, op.end = "DONE", _now()
        return op.to_json()

    def _api_get_region_operation(
        self, project: str, region: str, name: str, *, body: bytes
    ) -> dict[str, Any]:
        op = self._compute_ops.get(f"projects/{project}/regions/{region}/operations/{name}")
        if op is None:
            raise ApiError(404, "NOT_FOUND", f"The resource 'operations/{name}' was not found")
        return op.to_json()

    def _policy(self, project: str, region: str, name: str) -> _ResourcePolicy:
        rp = self._policies.get(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        if rp is None:
            raise ApiError(
                404,
                "NOT_FOUND",
                f"The resource 'projects/{project}/regions/{region}/resourcePolicies/{name}' "
                "was not found",
            )
        return rp

    def _compute_op(self, project: str, region: str, kind: str, target: str) -> _ComputeOperation:
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}"
        op = _ComputeOperation(project, region, name, kind, target)
        self._compute_ops[f"projects/{project}/regions/{region}/operations/{name}"] = op
        return op

    # -- Cloud TPU v2 ---------------------------------------------------------------------------

    def _api_list_accelerator_types(
        self, project: str, zone: str, *, body: bytes
    ) -> dict[str, Any]:
        offered = self.config.offered.get(zone)
        if offered is None:
            offered = self.config.default_offered or default_offered_types()
        parent = f"projects/{project}/locations/{zone}"
        return {"acceleratorTypes": [_accelerator_type(parent, t) for t in offered]}

    # -- model helpers (called with the lock held) ---------------------------------------------

    def _get_pool(self, cluster_path: str, name: str) -> _Pool:
        pool = self._pools.get(f"{cluster_path}/nodePools/{name}")
        if pool is None:
            raise ApiError(404, "NOT_FOUND", f"Not found: {cluster_path}/nodePools/{name}.")
        return pool

    def _validate(self, spec: dict[str, Any], location: str, project: str = "") -> None:
        """GKE's synchronous validation of a CreateNodePoolRequest: each refusal is 400
        INVALID_ARGUMENT unless noted, with its public source; wording marked UNCONFIRMED is
        ours where no public copy of GKE's message was found."""
        name = str(spec.get("name", ""))
        # Node pool names: RFC 1035, at most 40 characters (GKE API reference, NodePool.name;
        # facts.md section 6). Wording UNCONFIRMED.
        if not _POOL_NAME_RE.match(name):
            raise _invalid(
                f'Invalid node pool name "{name}": must be 1-40 lowercase letters, digits or '
                "hyphens, start with a letter and not end with a hyphen."
            )
        config = spec.get("config", {})
        machine = str(config.get("machineType", ""))
        if machine in self.faults.invalid_machine_types or not (
            machine in TPU_MACHINES or _GENERIC_MACHINE_RE.match(machine)
        ):
            raise _invalid(
                f"Invalid machine type \"{machine}\": Machine type '{machine}' does not exist in "
                f"zone '{self._zones(spec, location)[0]}'."
            )
        _validate_node_labels(config.get("labels", {}))
        _validate_resource_labels(config.get("resourceLabels", {}))
        self._validate_management(spec.get("management"), flex_start=bool(config.get("flexStart")))
        self._validate_identity(config)
        _validate_reservation(config.get("reservationAffinity"))
        _validate_max_pods(spec.get("maxPodsConstraint"))
        self._validate_version(machine, bool(config.get("flexStart")))
        self._validate_flex_start(spec, machine)
        self._validate_tpu(spec, location, machine, project)
        self._validate_placement(spec, location, machine, project)

    def _validate_version(self, machine: str, flex_start: bool) -> None:
        tpu = TPU_MACHINES.get(machine)
        gen = tpu.generation if tpu is not None else None
        if gen is None:
            return
        version = self.config.cluster_version
        # tpu7x: GKE Standard 1.34.0-gke.2201000 and later (GKE "About Ironwood (TPU7x) in GKE");
        # flex-start TPU pools: 1.33.0-gke.1712000 and later (GKE "About flex-start"). Wording
        # UNCONFIRMED.
        if gen.min_gke and not catalog.gke_at_least(version, gen.min_gke):
            raise _invalid(
                f"Machine type {machine} requires GKE version {gen.min_gke} or later; the cluster "
                f"runs {version}."
            )
        if (
            flex_start
            and gen.flex_start_min_gke
            and not catalog.gke_at_least(version, gen.flex_start_min_gke)
        ):
            raise _invalid(
                f"Flex-start node pools with machine type {machine} require GKE version "
                f"{gen.flex_start_min_gke} or later; the cluster runs {version}."
            )

    def _validate_flex_start(self, spec: dict[str, Any], machine: str) -> None:
        config = spec.get("config", {})
        duration = _seconds(config.get("maxRunDuration"))
        if duration is not None and duration <= 0:
            # A run bound must be a positive duration. Wording UNCONFIRMED.
            raise _invalid(f"maxRunDuration must be positive, got {config.get('maxRunDuration')}.")
        if not config.get("flexStart"):
            # maxRunDuration is not tied to flex-start: "The maximum duration for the nodes to
            # exist. If unspecified, the nodes can exist indefinitely." (container v1
            # NodeConfig.max_run_duration).
            return
        tpu = TPU_MACHINES.get(machine)
        gen = tpu.generation if tpu is not None else None
        if tpu is not None and (gen is None or gen.flex_start_min_gke is None):
            # GKE "About flex-start provisioning mode": "TPU v3 and v4 are not supported".
            raise _invalid(f"Flex-start is not supported for machine type {machine}.")
        if config.get("spot") or config.get("preemptible"):
            # One provisioning model per VM: flex-start, spot or standard (Compute Engine
            # "Provisioning models"). Wording UNCONFIRMED.
            raise _invalid("flexStart cannot be combined with spot or preemptible.")
        affinity = config.get("reservationAffinity", {}).get("consumeReservationType")
        if affinity not in (None, "NO_RESERVATION"):
            # Flex-start capacity is not reserved: xpk and GKE's guides create the pools with
            # --reservation-affinity=none. Wording UNCONFIRMED.
            raise _invalid("Flex-start node pools require reservationAffinity NO_RESERVATION.")
        if duration is not None and duration > models.FLEX_START_MAX_RUN_S:
            # "for up to seven days" (GKE "About flex-start"). Wording UNCONFIRMED.
            raise _invalid(
                f"maxRunDuration must be at most {models.FLEX_START_MAX_RUN_S}s (7 days), got "
                f"{config.get('maxRunDuration')}."
            )
        scaling = spec.get("autoscaling", {})
        if tpu is not None and (
            not scaling.get("enabled")
            or int(spec.get("initialNodeCount", 0)) != 0
            or int(scaling.get("minNodeCount", 0)) != 0
        ):
            # Flex-start TPU pools start empty and scale to the slice when capacity comes: xpk
            # (--flex-start --enable-autoscaling --num-nodes=0) and cluster-toolkit's gke-tpu-7x
            # DWS blueprint ("autoscaling_min_node_count: Must be 0"). Refused otherwise here;
            # wording UNCONFIRMED.
            raise _invalid(
                "Flex-start TPU node pools need autoscaling enabled with minNodeCount 0 and "
                "initialNodeCount 0."
            )

    def _validate_placement(
        self, spec: dict[str, Any], location: str, machine: str, project: str
    ) -> None:
        tpu = TPU_MACHINES.get(machine)
        gen = tpu.generation if tpu is not None else None
        placement = spec.get("placementPolicy", {})
        name = placement.get("policyName")
        if name:
            # "The resource policy must be in the same project and region as the node pool. If
            # not found, InvalidArgument error is returned." (container v1 NodePool
            # .PlacementPolicy.policy_name). Wording UNCONFIRMED.
            region = _region(self._zones(spec, location)[0])
            path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
            if path not in self._policies:
                raise _invalid(
                    f"Placement policy {name} was not found: resource policy {path} does not exist."
                )
            if self._policies[path].status != "READY":
                # A policy whose insert has not finished cannot place instances yet. Refused
                # here (GKE's answer is not public); wording UNCONFIRMED.
                raise _invalid(
                    f"Placement policy {name} is not ready: resource policy {path} is "
                    f"{self._policies[path].status}."
                )
        if gen is None or gen.placement != catalog.Placement.WORKLOAD_POLICY:
            return
        policy = self._policies.get(
            f"projects/{project}/regions/{_region(self._zones(spec, location)[0])}"
            f"/resourcePolicies/{name}"
        )
        workload = policy.workload if policy is not None else {}
        if workload.get("acceleratorTopologyMode") == "PROVISION_ONLY" and (
            workload.get("acceleratorTopology") != slices.CUBE_TOPOLOGY
        ):
            # Incremental provisioning: "Always set the accelerator-topology field to 4x4x4 to
            # match the total number of chips within a single sub-block" (GKE "Use dynamic
            # slicing with a custom scheduler"). Wording UNCONFIRMED.
            raise _invalid(
                f"Workload policy {name} has acceleratorTopologyMode PROVISION_ONLY: its "
                f"acceleratorTopology must be {slices.CUBE_TOPOLOGY} (one sub-block), got "
                f"{workload.get('acceleratorTopology')}."
            )
        if workload.get("acceleratorTopologyMode") == "PROVISION_ONLY" and (
            _reservation_target(spec, project) is None
        ):
            # "Dynamic slicing features are available exclusively on TPUs that use All Capacity
            # mode" (GKE "About GKE dynamic slicing"): a sub-block pool consumes a specific
            # reservation. Wording UNCONFIRMED.
            raise _invalid(
                f"Workload policy {name} has acceleratorTopologyMode PROVISION_ONLY: the node "
                "pool must consume a specific All Capacity mode reservation "
                "(reservationAffinity SPECIFIC_RESERVATION)."
            )
        if placement.get("tpuTopology") and not name and placement.get("type") != "COMPACT":
            # A multi-host tpu7x pool names its workload policy ("This policy replaces the
            # --tpu-topology flag used by other TPU versions", GKE "About Ironwood (TPU7x) in
            # GKE"). Refused without one; wording UNCONFIRMED.
            raise _invalid(
                f"Multi-host TPU slice node pools with machine type {machine} need "
                "placementPolicy.policyName, a HIGH_THROUGHPUT workload policy."
            )

    def _validate_management(
        self, management: dict[str, Any] | None, flex_start: bool = False
    ) -> None:
        # "Auto_upgrade cannot be false when release_channel REGULAR is set." (400 badRequest;
        # GitHub nkoson/gke-tutorial#8, Percona-Lab/jenkins-pipelines#471 for RAPID) and GKE
        # "Release channels": node auto-upgrade and auto-repair are enabled and cannot be
        # disabled in a release channel. A request without `management` gets GKE's defaults
        # (both on); proto3 JSON omits a false bool, so a sent `management` without
        # `autoUpgrade` means false. The auto-repair wording is UNCONFIRMED.
        channel = self.config.release_channel
        if channel is None or management is None:
            return
        for key, label in (("autoUpgrade", "Auto_upgrade"), ("autoRepair", "Auto_repair")):
            # Flex-start pools run without auto-repair (xpk --no-enable-autorepair; GKE's
            # flex-start guides), which GKE accepts in a release channel.
            if key == "autoRepair" and flex_start:
                continue
            if not management.get(key):
                raise _invalid(f"{label} cannot be false when release_channel {channel} is set.")

    def _validate_identity(self, config: dict[str, Any]) -> None:
        # GKE_METADATA needs a cluster with Workload Identity (a workload pool): GKE "Use
        # Workload Identity Federation for GKE". Wording UNCONFIRMED.
        mode = config.get("workloadMetadataConfig", {}).get("mode")
        if mode == "GKE_METADATA" and not self.config.workload_identity:
            raise _invalid(
                "Workload Identity must be enabled on the cluster (workloadPool) to set "
                "workloadMetadataConfig mode GKE_METADATA on a node pool."
            )
        # The API takes scope URLs; short names (storage-full, gke-default) are gcloud aliases.
        # Wording UNCONFIRMED.
        for scope in config.get("oauthScopes", []):
            if not str(scope).startswith("https://www.googleapis.com/auth/"):
                raise _invalid(f"Invalid OAuth scope {scope!r}: give the scope's full URL.")

    def _slice_topology(self, spec: dict[str, Any], location: str, project: str) -> str | None:
        """The slice topology a pool asks for: its tpuTopology or, on a generation placed by
        workload policy, the accelerator topology of the policy it names. GKE's Ironwood guides
        and xpk create multi-host tpu7x pools with the policy alone (xpk
        src/xpk/core/nodepool.py: "--tpu-topology should also not be passed when workload policy
        is used"; GKE "Use dynamic slicing with a custom scheduler": --placement-policy, no
        --tpu-topology)."""
        placement = spec.get("placementPolicy", {})
        if placement.get("tpuTopology"):
            return str(placement["tpuTopology"])
        tpu = TPU_MACHINES.get(str(spec.get("config", {}).get("machineType", "")))
        gen = tpu.generation if tpu is not None else None
        name = placement.get("policyName")
        if gen is None or gen.placement != catalog.Placement.WORKLOAD_POLICY or not name:
            return None
        region = _region(self._zones(spec, location)[0])
        rp = self._policies.get(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        topology = rp.workload.get("acceleratorTopology") if rp is not None else None
        return str(topology) if topology else None

    def _validate_tpu(
        self, spec: dict[str, Any], location: str, machine: str, project: str
    ) -> None:
        topology = self._slice_topology(spec, location, project)
        tpu = TPU_MACHINES.get(machine)
        if tpu is None:
            if topology:
                raise _invalid(f"tpuTopology needs a TPU machine type, not {machine}.")
            return
        # One zone per TPU slice pool: a slice's VMs share one ICI domain (GKE "Deploy TPU
        # workloads in GKE Standard": --node-locations takes the single zone; xpk passes one).
        if len(self._zones(spec, location)) != 1:
            raise _invalid(f"A TPU node pool ({machine}) must be in one zone.")
        if not topology:
            return  # single-host slices: one VM each, any number of nodes
        dims = topology.split("x")
        valid = tpu.generation.topologies if tpu.generation else ()
        if (
            len(dims) != tpu.dims()
            or not all(d.isdigit() and int(d) > 0 for d in dims)
            or (valid and topology not in valid)
        ):
            # Machine type vs topology: v4/v5p take 3D shapes, v5e/v6e 2D ones (GKE "Plan TPUs
            # in GKE"; xpk system_characteristics.py). Wording UNCONFIRMED.
            raise _invalid(f"Invalid TPU topology {topology} for machine type {machine}.")
        chips = catalog.topology_chips(topology)
        nodes, rest = divmod(chips, tpu.chips_per_host)
        if rest or nodes <= 1:
            # tpuTopology is for multi-host slice pools only: xpk src/xpk/core/nodepool.py
            # ("--tpu-topology should not be set for single-host node pools"); ai-on-gke
            # tpu-provisioner #965 ("tpuTopology being present will be rejected by the control
            # plane" for a 1x1). Wording UNCONFIRMED.
            raise _invalid(
                f"TPU topology {topology} with machine type {machine} is a single-host slice: "
                "tpuTopology is only valid for multi-host TPU slice node pools."
            )
        sized = (
            int(spec.get("autoscaling", {}).get("maxNodeCount", 0))
            if spec.get("config", {}).get("flexStart")
            else int(spec.get("initialNodeCount", 0))
        )
        if sized != nodes:
            raise _invalid(
                f"Node pool with TPU topology {topology} and machine type {machine} needs "
                f"initialNodeCount {nodes}, got {spec.get('initialNodeCount', 0)}."
            )

    def _refuse_if_faulted(self, spec: dict[str, Any], location: str, project: str) -> None:
        f = self.faults
        if f.quota_sync_next > 0:
            f.quota_sync_next -= 1
            self._injected["quotaSync"] += 1
            raise ApiError(403, "PERMISSION_DENIED", _quota_message(spec, project))
        if f.permission_denied_next > 0:
            f.permission_denied_next -= 1
            self._injected["permissionDenied"] += 1
            raise ApiError(
                403,
                "PERMISSION_DENIED",
                'Required "container.clusters.update" permission(s) for '
                f'"projects/{project}/locations/{location}".',
            )

    def _check_cluster_operation(self, cluster_path: str) -> None:
        # A cluster-level operation (an upgrade) blocks node pool operations: "Operation
        # operation-... is currently upgrading cluster C. Please wait and try again once it is
        # done." (400 failedPrecondition; terraform-provider-google#3650, #1643).
        for op in self._ops.values():
            if op.status == "RUNNING" and op.target == cluster_path:
                raise _busy(op)

    @staticmethod
    def _zones(spec: dict[str, Any], location: str) -> list[str]:
        return list(spec.get("locations") or [location])

    def _check_conflict(self, cluster_path: str) -> None:
        limit = self.config.max_concurrent_operations
        if limit is None or self._ops_running[cluster_path] < limit:
            return
        busy = next(
            o
            for o in self._ops.values()
            if o.status == "RUNNING" and o.target.startswith(cluster_path + "/")
        )
        self._injected["incompatibleOperation"] += 1
        if busy.op_type == "DELETE_NODE_POOL":
            # Names the cluster's running delete, whichever pool it deletes (GitHub
            # hashicorp/terraform-provider-google#10366).
            raise _busy(busy)
        # rancher/gke-operator#509: "Cluster is running incompatible operation operation-...".
        raise ApiError(
            400,
            "FAILED_PRECONDITION",
            f"Cluster is running incompatible operation {busy.name}. Please wait and try again "
            "once it is done.",
        )

    def _placement_failure(self, pool: _Pool) -> str | None:
        """How GKE fails a create it accepted because of its placement: a tpu7x pool with COMPACT
        goes to ERROR (vllm-project/ci-infra#547); one whose workload policy has another type or
        accelerator topology fails at managed-instance-group creation (cluster-toolkit#6274)."""
        tpu = TPU_MACHINES.get(str(pool.spec.get("config", {}).get("machineType", "")))
        gen = tpu.generation if tpu is not None else None
        placement = pool.spec.get("placementPolicy", {})
        workload_gen = gen is not None and gen.placement == catalog.Placement.WORKLOAD_POLICY
        if workload_gen and placement.get("type") == "COMPACT":
            return "placement"
        where = _policy_of(pool)
        if where is None:
            return None
        project, region, name = where
        rp = self._policies.get(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        if rp is None:
            return None
        workload = rp.workload
        if workload_gen and (
            workload.get("type") != "HIGH_THROUGHPUT"
            or workload.get("acceleratorTopology") != pool.topology
        ):
            return "policy_mismatch"
        return None

    def _ip_space_failure(self, pool: _Pool) -> str | None:
        """Node creation is limited by the free addresses of the pod range (GKE "Configure
        maximum Pods per node"): each node takes a /podIpv4CidrSize block; past the range the
        instance group fails with [IP_SPACE_EXHAUSTED]."""
        capacity = 2 ** (32 - self.config.pod_range_prefix)
        used = sum(
            p.reserved_addresses
            for p in self._pools.values()
            if p.cluster == pool.cluster and p.status != "ERROR"  # failed VMs hold no addresses
        )
        if used + pool.reserved_addresses > capacity:
            self._injected["ipSpaceExhausted"] += 1
            return "ip_space"
        return None

    def _stock_of(self, spec: dict[str, Any], location: str, project: str) -> str | None:
        """The capacity a TPU pool takes (set_capacity's key): its specific reservation, else
        its zone's VMs of its provisioning model; None for a pool of other machines."""
        config = spec.get("config", {})
        if str(config.get("machineType", "")) not in TPU_MACHINES:
            return None
        target = _reservation_target(spec, project)
        if target is not None:
            return _stock_key(f"reservation/{target}")
        kind = "OnDemand"
        if config.get("flexStart"):
            kind = "FlexStart"
        elif config.get("spot") or config.get("preemptible"):
            kind = "Spot"
        return f"{self._zones(spec, location)[0]}/{kind}"

    def _held(self, key: str) -> int:
        return sum(_chips(p) for p in self._pools.values() if p.stock_key == key and p.holds_stock)

    def _short(self, key: str | None, chips: int) -> int:
        """Chips a request of `chips` lacks of capacity `key` (0: enough, or unlimited)."""
        if key is None or key not in self._stock:
            return 0
        return max(0, chips - max(0, self._stock[key] - self._held(key)))

    def _refuse_if_reservation_full(self, spec: dict[str, Any], key: str | None,
                                    location: str) -> None:  # fmt: skip
        """A specific reservation without the VMs free refuses the create at once: 429
        RESOURCE_EXHAUSTED, "Reservation does not have enough resources for the request:
        specific reservation "R" is insufficient for node pool "N" at zone "Z": required 4 and
        short of 4 VM count of machine type M." (GoogleCloudPlatform/gsutil#1000)."""
        if key is None or not key.startswith("reservation/"):
            return
        config = spec.get("config", {})
        machine = str(config.get("machineType", ""))
        per_vm = TPU_MACHINES[machine].chips_per_host
        vms = int(spec.get("initialNodeCount", 0)) * len(self._zones(spec, location))
        short = self._short(key, vms * per_vm)
        if not short:
            return
        self._injected["reservationExhausted"] += 1
        name = config.get("reservationAffinity", {}).get("values", ["?"])[0]
        raise ApiError(
            429,
            "RESOURCE_EXHAUSTED",
            "Reservation does not have enough resources for the request: specific reservation "
            f'"{name}" is insufficient for node pool "{spec.get("name", "")}" at zone '
            f'"{self._zones(spec, location)[0]}": required {vms} and short of '
            f"{math.ceil(short / per_vm)} VM count of machine type {machine}.",
        )

    def _take_stock(self, pool: _Pool) -> str | None:
        """The pool takes its chips of its capacity: None when it got them (or that capacity is
        unlimited); a flex-start pool without them waits for capacity (held, holding nothing)
        as Dynamic Workload Scheduler queues it; any other fails as a stockout."""
        if not self._short(pool.stock_key, _chips(pool)):
            pool.holds_stock = True
            return None
        if pool.flex_start:
            pool.flex_held = True
            return None
        self._injected["stockout"] += 1
        return "stockout"

    def _planned_failure(self, spec: dict[str, Any], location: str) -> str | None:
        f = self.faults
        k = self._creates_accepted
        zones = self._zones(spec, location)
        if k in f.stockout_on_create or any(z in f.stockout_zones for z in zones):
            self._injected["stockout"] += 1
            return "stockout"
        if f.stockout_next > 0:
            f.stockout_next -= 1
            self._injected["stockout"] += 1
            return "stockout"
        if f.quota_next > 0:
            f.quota_next -= 1
            self._injected["quota"] += 1
            return "quota"
        return None

    def _start_op(self, location: str, project: str, op_type: str, target: str) -> _Operation:
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(4)}"
        op = _Operation(f"projects/{project}/locations/{location}", name, op_type, target)
        self._ops[op.path] = op
        cluster = target.split("/nodePools/")[0]
        self._ops_running[cluster] += 1
        self._peak_ops = max(self._peak_ops, sum(self._ops_running.values()))
        return op

    def _end_op(self, op: _Operation, error: dict[str, Any] | None = None) -> None:
        if op.status != "RUNNING":
            return
        op.status, op.end, op.error = "DONE", _now(), error
        self._ops_running[op.target.split("/nodePools/")[0]] -= 1

    # -- operation completion (scheduler thread) ------------------------------------------------

    def _finish_create(self, op_path: str) -> None:
        with self._lock:
            op = self._ops[op_path]
            pool = self._pools.get(op.target)
            if op.status != "RUNNING" or pool is None or pool.op != op_path:
                return
            if op.failure is not None:
                self._fail_create(op, pool)
                return
            if pool.flex_start:
                self._flex_wait(op, pool)
                return
            group = _node_group(pool)
        error = self._register(group)
        with self._lock:
            if self._pools.get(op.target) is not pool or pool.op != op_path:
                return  # deleted meanwhile (allow_delete_while_creating); delete unregisters
            pool.nodes = group.count
            pool.status = "RUNNING_WITH_ERROR" if error else "RUNNING"
            pool.status_message = error or ""
            pool.op = None
            self._end_op(op)
            self._set_nodes_ready(pool, error is None)
        log.info("gke-sim pool running pool=%s nodes=%d", pool.name, group.count)

    def _flex_wait(self, op: _Operation, pool: _Pool) -> None:
        """A flex-start pool is created empty (RUNNING, no nodes) and waits for Dynamic Workload
        Scheduler to find capacity for the whole slice: waiting is not an error (GKE "About
        flex-start provisioning mode"). Real GKE scales up for the pending pods (or a
        ProvisioningRequest); the simulator grants after flex_start_wait_s, or when
        grant_flex_start() is called for a held pool. Called with the lock held."""
        pool.status, pool.status_message, pool.nodes, pool.op = "RUNNING", "", 0, None
        self._end_op(op)
        log.info("gke-sim flex-start pool waiting for capacity pool=%s", pool.name)
        if not pool.flex_held:
            epoch = pool.flex_epoch
            self._scheduler.after(
                self.config.flex_start_wait(), lambda: self._flex_provision(pool, epoch)
            )

    def _flex_provision(self, pool: _Pool, epoch: int) -> None:
        with self._lock:
            current = self._pools.get(pool.path)
            if (
                current is not pool
                or pool.flex_held
                or pool.flex_epoch != epoch
                or pool.nodes
                or pool.status != "RUNNING"
            ):
                return
            group = _node_group(pool)
        error = self._register(group)
        with self._lock:
            if self._pools.get(pool.path) is not pool or pool.flex_epoch != epoch:
                return
            pool.nodes = group.count
            pool.holds_stock = True  # its capacity came (granted past a set_capacity limit too)
            if error:
                pool.status, pool.status_message = "RUNNING_WITH_ERROR", error
            duration = _seconds(pool.spec.get("config", {}).get("maxRunDuration"))
            run_s = (duration or models.FLEX_START_MAX_RUN_S) * self.config.flex_start_run_scale
        log.info("gke-sim flex-start capacity granted pool=%s nodes=%d", pool.name, group.count)
        self._scheduler.after(run_s, lambda: self._flex_expire(pool, epoch))

    def _flex_expire(self, pool: _Pool, epoch: int) -> None:
        """maxRunDuration reached: GKE removes the flex-start VMs (the pool stays, empty)."""
        with self._lock:
            if self._pools.get(pool.path) is not pool or pool.flex_epoch != epoch:
                return
            pool.flex_epoch += 1
        self.registrar.unregister(pool.name)
        with self._lock:
            pool.nodes = 0
            pool.holds_stock = False
        log.info("gke-sim flex-start max run duration reached pool=%s", pool.name)

    def _fail_create(self, op: _Operation, pool: _Pool) -> None:
        zone = self._zones(pool.spec, op.location.rsplit("/", 1)[1])[0]
        message = _failure_message(op.failure or "", pool, zone)
        # google.rpc codes: INVALID_ARGUMENT (3) for what the request got wrong, else
        # RESOURCE_EXHAUSTED (8): capacity that may come back.
        code = 3 if op.failure in ("placement", "policy_mismatch") else 8
        self._end_op(op, error={"code": code, "message": message})
        pool.op = None
        pool.holds_stock = False
        self._release_cubes(pool)
        if self.config.failed_create_leaves_pool:
            pool.status, pool.status_message = "ERROR", message
        else:
            del self._pools[pool.path]
        log.info("gke-sim create failed pool=%s failure=%s", pool.name, op.failure)

    def _register(self, group: NodeGroup) -> str | None:
        try:
            self.registrar.register(group)
        except Exception as exc:  # surfaced as RUNNING_WITH_ERROR, like nodes failing to join
            log.exception("gke-sim node registration failed pool=%s", group.pool)
            return f"Nodes failed to register: {exc}"
        return None

    def _finish_delete(self, op_path: str) -> None:
        with self._lock:
            op = self._ops[op_path]
            pool = self._pools.get(op.target)
            if op.status != "RUNNING":
                return
        if pool is not None:
            try:
                self.registrar.unregister(pool.name)
            except Exception:
                # GKE's instance group retries deleting its VMs: the pool stays STOPPING and its
                # operation RUNNING until they are gone. Going on would drop a pool whose nodes
                # are still there (fake nodes left on the cluster after the demo's delete).
                log.exception("gke-sim node removal failed, retrying pool=%s", pool.name)
                self._scheduler.after(UNREGISTER_RETRY_S, lambda: self._finish_delete(op_path))
                return
        with self._lock:
            gone = self._pools.pop(op.target, None)
            self._end_op(op)
            if gone is not None:
                self._release_cubes(gone)
        log.info("gke-sim pool deleted pool=%s", op.target.rsplit("/", 1)[1])

    def _recreate_nodes(self, pool: _Pool) -> None:
        with self._lock:
            # Identity, not name: the pool may have been deleted and created again meanwhile.
            current = self._pools.get(pool.path)
            if (
                current is not pool
                or pool.nodes
                or pool.status not in ("RUNNING", "RUNNING_WITH_ERROR")
            ):
                return
            group = _node_group(pool)
        if self._register(group) is None:
            with self._lock:
                pool.nodes = group.count
                self._set_nodes_ready(pool, True)

    # -- admin HTTP API -------------------------------------------------------------------------

    def _admin(self, method: str, path: str, body: bytes) -> dict[str, Any]:
        data = json.loads(body) if body.strip() else {}
        parts = path.strip("/").split("/")[1:]
        if method == "GET" and parts == ["state"]:
            return self.state()
        if method == "GET" and parts == ["counters"]:
            return self.counters()
        if method == "POST" and parts == ["counters", "reset"]:
            self.reset_counters()
            return self.counters()
        if parts == ["faults"] and method in ("POST", "DELETE"):
            with self._lock:
                if method == "DELETE":
                    self.faults = Faults()
                else:
                    self.faults.merge_json(data)
                return self.faults.to_json()
        if method == "POST" and parts == ["config"]:
            names = {_camel(f.name): f.name for f in fields(self.config)}
            unknown = set(data) - set(names)
            if unknown:
                raise ValueError(f"unknown config fields {sorted(unknown)}")
            self.configure(**{names[k]: v for k, v in data.items()})
            return asdict(self.config)
        if method == "POST" and parts == ["offered"]:
            for zone, types in data.items():
                self.set_offered(zone, types)
            return {"offered": self.config.offered}
        if method == "POST" and len(parts) == 3 and parts[0] == "pools":
            return self._admin_pool(parts[1], parts[2], data)
        if method == "POST" and parts == ["reservations"]:
            blocks = {str(k): int(v) for k, v in data["blocks"].items()}
            ids = self.add_reservation(data["name"], blocks, project=data.get("project", "p"))
            return {"partitionIds": ids}
        if parts == ["capacity"] and method in ("GET", "POST"):
            for key, chips in data.items():
                self.set_capacity(key, None if chips is None else int(chips))
            return self.capacity()
        if method == "GET" and parts == ["cubes"]:
            return {"cubes": self.cubes()}
        if method == "POST" and len(parts) == 3 and parts[:1] + parts[2:] == ["slices", "stuck"]:
            self.set_slice_stuck(parts[1], bool(data.get("stuck", True)))
            return {"stuck": parts[1]}
        if method == "POST" and len(parts) == 3 and parts[0] == "cubes" and parts[2] == "state":
            try:
                self.set_cube_state(parts[1], str(data["state"]))
            except KeyError as err:
                raise ApiError(404, "NOT_FOUND", str(err)) from None
            return {"cubes": self.cubes()}
        raise ApiError(404, "NOT_FOUND", f"unknown admin call {method} {path}")

    def _admin_pool(self, name: str, action: str, data: dict[str, Any]) -> dict[str, Any]:
        try:
            if action == "preempt":
                self.preempt(name, data.get("recreateAfterS", "config"))
            elif action == "break":
                self.break_pool(name, data.get("message", ""), data.get("removeNodes", True))
            elif action == "grant":
                self.grant_flex_start(name)
            else:
                raise ApiError(404, "NOT_FOUND", f"unknown pool action {action!r}")
        except KeyError as err:
            raise ApiError(404, "NOT_FOUND", str(err)) from None
        return self._find(name).to_json()


SCOPE = "https://www.googleapis.com/auth/"
# NodeConfig.oauth_scopes (container v1 API reference): "If unspecified, no scopes are added,
# unless Cloud Logging or Cloud Monitoring are enabled, in which case their required scopes will
# be added" (both are on by default in GKE clusters). gcloud's "default scopes" are its own alias.
LOGGING_MONITORING_SCOPES = (f"{SCOPE}logging.write", f"{SCOPE}monitoring")
# Scopes that let a node's service account read (pull an image from Artifact Registry or
# Container Registry: "devstorage.read_only is required for communicating with gcr.io", same
# docstring) and write Cloud Storage (a gs:// checkpoint); cloud-platform covers every API.
READ_STORAGE = {f"{SCOPE}devstorage.{s}" for s in ("read_only", "read_write", "full_control")}
WRITE_STORAGE = {f"{SCOPE}devstorage.{s}" for s in ("read_write", "full_control")}
CLOUD_PLATFORM = f"{SCOPE}cloud-platform"


def effective_scopes(config: dict[str, Any]) -> list[str]:
    """The scopes GKE gives the nodes of a pool created with `config`."""
    return list(config.get("oauthScopes") or LOGGING_MONITORING_SCOPES)


def node_access(config: dict[str, Any]) -> dict[str, bool]:
    """Whether the nodes' service account may pull images and write gs:// (IAM aside: the
    scopes cap what any role grants, GKE "Service accounts: access scopes")."""
    scopes = set(effective_scopes(config))
    everything = CLOUD_PLATFORM in scopes
    return {
        "pullImages": everything or bool(scopes & READ_STORAGE),
        "writeStorage": everything or bool(scopes & WRITE_STORAGE),
    }


def _invalid(message: str) -> ApiError:
    return ApiError(400, "INVALID_ARGUMENT", message)


def _validate_node_labels(labels: dict[str, Any]) -> None:
    for key, value in labels.items():
        prefix, _, label = key.rpartition("/")
        namespace = prefix.lower()
        # Kubernetes' reserved namespaces: GKE refuses them as node labels ("Applying kubernetes
        # label is not allowed", issue 12) and the kubelet refuses to start with them (kubernetes
        # cmd/kubelet/app/options/options.go ValidateKubeletFlags: "unknown 'kubernetes.io' or
        # 'k8s.io' labels specified with --node-labels").
        if any(namespace == d or namespace.endswith("." + d) for d in _K8S_LABEL_DOMAINS):
            raise _invalid(f"Applying kubernetes label is not allowed: {key}.")
        # cloud.google.com/* node labels are GKE's own; the ones a user may set are those
        # ai-on-gke tpu-provisioner sets (internal/cloud/gke.go). Wording UNCONFIRMED.
        if namespace == "cloud.google.com" and key not in _USER_GKE_NODE_LABELS:
            raise _invalid(f"Label {key} is reserved for GKE and cannot be set on a node pool.")
        # Label syntax (Kubernetes "Labels and Selectors"; the kubelet checks IsQualifiedName and
        # IsValidLabelValue). Wording UNCONFIRMED.
        if (
            (prefix and not _DNS1123_SUBDOMAIN_RE.match(prefix))
            or not _LABEL_NAME_RE.match(label)
            or not _LABEL_VALUE_RE.match(str(value))
        ):
            raise _invalid(f"Invalid node label {key}={value}.")


def _validate_resource_labels(labels: dict[str, Any]) -> None:
    # GCE resource labels: at most 64; keys [a-z][a-z0-9_-]{0,62}, values [a-z0-9_-]{0,63}
    # (Compute Engine "Organize resources using labels", requirements; lowercase ASCII only
    # here, stricter than GCE's international letters). Wording UNCONFIRMED.
    if len(labels) > 64:
        raise _invalid(f"Too many resource labels ({len(labels)}): at most 64.")
    for key, value in labels.items():
        if not _GCE_LABEL_KEY_RE.match(key) or not _GCE_LABEL_VALUE_RE.match(str(value)):
            raise _invalid(
                f"Invalid resource label {key}={value}: keys and values must be at most 63 "
                "lowercase letters, digits, '_' or '-' (keys start with a letter)."
            )


def _seconds(duration: Any) -> float | None:
    """A protobuf Duration in JSON ("604800s") as seconds; None when absent."""
    if duration in (None, ""):
        return None
    return float(str(duration).rstrip("s") or 0)


def _validate_max_pods(constraint: dict[str, Any] | None) -> None:
    # Max pods per node: 8 to 256 on Standard clusters (GKE "Configure maximum Pods per node").
    # Wording UNCONFIRMED.
    if not constraint:
        return
    value = int(constraint.get("maxPodsPerNode", 0))
    if not 8 <= value <= 256:
        raise _invalid(f"maxPodsPerNode must be between 8 and 256, got {value}.")


def pod_cidr_size(max_pods: int) -> int:
    """The per-node pod range block GKE reserves: the smallest power of two holding twice the
    max pods per node (GKE "Configure maximum Pods per node": 110 -> /24, 8 -> /28, 15 -> /27)."""
    return 32 - math.ceil(math.log2(2 * max_pods))


def _validate_reservation(affinity: dict[str, Any] | None) -> None:
    # SPECIFIC_RESERVATION names one reservation under compute.googleapis.com/reservation-name,
    # by name or as projects/P/reservations/R for a shared one (GKE "Consume reserved zonal
    # resources"; tpu-provisioner internal/cloud/gke.go), optionally down to a block or
    # sub-block, R/reservationBlocks/B[/reservationSubBlocks/S], as xpk sends it
    # (src/xpk/core/capacity.py to_reservation_path). Wording UNCONFIRMED.
    if not affinity or affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
        return
    values = affinity.get("values", [])
    if (
        affinity.get("key") != "compute.googleapis.com/reservation-name"
        or len(values) != 1
        or not _RESERVATION_RE.match(str(values[0]))
    ):
        raise _invalid(
            "SPECIFIC_RESERVATION needs key compute.googleapis.com/reservation-name and one "
            "value, a reservation name or projects/PROJECT/reservations/NAME, optionally followed "
            f"by /reservationBlocks/BLOCK[/reservationSubBlocks/SUB_BLOCK]; got {affinity}."
        )


_DOING = {
    "CREATE_NODE_POOL": "creating a node pool for cluster",
    "DELETE_NODE_POOL": "deleting a node pool for cluster",
    "UPGRADE_MASTER": "upgrading cluster",
}


def _busy(op: _Operation) -> ApiError:
    """GKE's answer while another operation runs: it names that operation and the cluster
    ("Operation operation-... is currently deleting a node pool for cluster C. Please wait and
    try again once it is done.", terraform-provider-google#10366; "... is currently upgrading
    cluster C ...", #3650), never the pool the caller asked about."""
    cluster = op.target.split("/clusters/")[1].split("/")[0]
    return ApiError(
        400,
        "FAILED_PRECONDITION",
        f"Operation {op.name} is currently {_DOING.get(op.op_type, 'operating on cluster')} "
        f"{cluster}. Please wait and try again once it is done.",
    )


def quota_metric(spec: dict[str, Any]) -> str:
    """The Compute Engine quota a pool's chips count against: the generation's on-demand metric,
    or its preemptible one for spot and flex-start VMs ("When you create a Flex-start VM,
    preemptible quota is consumed", Compute Engine "Provisioning models"). Names per generation:
    catalog.Generation.quota_metric / spot_quota_metric, sources in docs/provisioning.md."""
    config = spec.get("config", {})
    tpu = TPU_MACHINES.get(str(config.get("machineType", "")))
    if tpu is None or tpu.generation is None:
        return "CPUS"
    preemptible = config.get("spot") or config.get("preemptible") or config.get("flexStart")
    gen = tpu.generation
    return gen.spot_quota_metric if preemptible else gen.quota_metric


def _quota_message(spec: dict[str, Any], project: str) -> str:
    """GKE's synchronous 403 for a create over quota: "Insufficient regional quota to satisfy
    request: resource "CPUS": request requires '72.0' and is short '48.0'. project has a quota of
    '24.0' with '24.0' available. View and manage quotas at ..." (GitHub
    kaiwaehner/hivemq-mqtt-tensorflow-kafka-realtime-iot-machine-learning-training-inference#48)."""
    machine = str(spec.get("config", {}).get("machineType", ""))
    tpu = TPU_MACHINES.get(machine)
    nodes = int(spec.get("initialNodeCount", 0)) or int(
        spec.get("autoscaling", {}).get("maxNodeCount", 0)
    )
    chips = float(nodes * (tpu.chips_per_host if tpu else 1))
    metric = quota_metric(spec)
    return (
        f'Insufficient regional quota to satisfy request: resource "{metric}": request requires '
        f"'{chips}' and is short '{chips}'. project has a quota of '0.0' with '0.0' available. "
        "View and manage quotas at "
        f"https://console.cloud.google.com/iam-admin/quotas?usage=USED&project={project}."
    )


def _failure_message(failure: str, pool: _Pool, zone: str) -> str:
    cluster = pool.cluster.rsplit("/", 1)[1]
    instance = f"gke-{cluster}-{pool.name}-{secrets.token_hex(4)}-{secrets.token_hex(2)}"
    project = pool.cluster.split("/")[1]
    machine = pool.spec.get("config", {}).get("machineType", "")
    nodes = pool.slice_nodes
    if failure == "placement":
        # vllm-project/ci-infra#547: the pool "created and then went straight to ERROR".
        return (
            f"Creation of a managed instance group with {machine} machine type with placement "
            "policy is not supported. Use workload policy instead."
        )
    if failure == "policy_mismatch":
        # cluster-toolkit#6274: an incompatible policy fails at MIG creation with a GCE 400.
        # Wording UNCONFIRMED.
        policy = pool.spec.get("placementPolicy", {})
        return (
            f"Google Compute Engine: Invalid value for field 'resource.resourcePolicies[0]': "
            f"workload policy {policy.get('policyName')} does not match the TPU topology "
            f"{policy.get('tpuTopology')} of machine type {machine}."
        )
    if failure == "reservation_full":
        # More cubes than the reservation (block, sub-block) has free: GKE accepts the create and
        # its instance group cannot place the VMs. Wording UNCONFIRMED.
        target = pool.full_target or "the reservation"
        return (
            f"Not all instances running in IGM after 0s. Current errors: "
            f"[GCE_STOCKOUT]: Instance '{instance}' creation failed: Reservation {target} has no "
            f"free sub-block: {nodes} tpu7x VMs need "
            f"{max(1, nodes // slices.VMS_PER_CUBE)} free 4x4x4 sub-blocks."
        )
    if failure == "ip_space":
        # "Not all instances running in IGM after ... Current errors: [IP_SPACE_EXHAUSTED]:
        # Instance '...' creation failed: IP space of '...' is exhausted." (hashicorp/
        # terraform-cdk#1964).
        region = zone.rsplit("-", 1)[0]
        return (
            f"Not all instances running in IGM after 31.2s. Expected {nodes}, running 0, "
            f"transitioning {nodes}. Current errors: [IP_SPACE_EXHAUSTED]: Instance '{instance}' "
            f"creation failed: IP space of 'projects/{project}/regions/{region}/subnetworks/"
            f"gke-{cluster}-pods' is exhausted."
        )
    if failure == "quota":
        return (
            f"Google Compute Engine: Instance '{instance}' creation failed: Code: "
            f"'GCE_QUOTA_EXCEEDED' Message: 'Quota 'TPU_CHIPS' exceeded. Limit: 0.0 in region "
            f"{zone.rsplit('-', 1)[0]}.'"
        )
    # The managed instance group gives up on a stockout: "Not all instances running in IGM after
    # ... Current errors: [GCE_STOCKOUT]" (facts.md section 10; issue 12).
    return (
        f"Not all instances running in IGM after 1h0m0.5s. Expected {nodes}, running 0, "
        f"transitioning {nodes}. Current errors: [GCE_STOCKOUT]: Instance '{instance}' creation "
        f"failed: The zone 'projects/{project}/zones/{zone}' does not have enough resources "
        "available to fulfill the request. Try a different zone, or try again later."
    )


def _node_group(pool: _Pool) -> NodeGroup:
    config = pool.spec.get("config", {})
    machine = str(config.get("machineType", ""))
    zones = pool.spec.get("locations") or [pool.cluster.split("/")[3]]
    count = pool.slice_nodes
    user = {str(k): str(v) for k, v in config.get("labels", {}).items()}
    labels = dict(user)
    labels.update(pool.extra_labels)
    labels[keys.GKE_NODEPOOL] = pool.name
    labels[ZONE_LABEL] = zones[0]
    labels[keys.INSTANCE_TYPE] = machine  # the kubelet's well-known label, from the VM
    spot = bool(config.get("spot") or config.get("preemptible"))
    if spot:
        labels[keys.GKE_SPOT] = "true"
    tpu = TPU_MACHINES.get(machine)
    accelerator = topology = None
    chips = 0
    if tpu is not None:
        accelerator, chips = tpu.accelerator_label, tpu.chips_per_host
        topology = pool.topology or tpu.single_host_topology()
        labels[keys.GKE_TPU_ACCELERATOR] = accelerator
        labels[keys.GKE_TPU_TOPOLOGY] = topology
    return NodeGroup(
        pool=pool.name,
        count=count,
        zone=zones[0],
        machine_type=machine,
        accelerator_label=accelerator,
        topology=topology,
        chips_per_host=chips,
        spot=spot,
        labels=labels,
        user_labels=user,
    )


def _accelerator_type(parent: str, accel: str) -> dict[str, Any]:
    body: dict[str, Any] = {"name": f"{parent}/acceleratorTypes/{accel}", "type": accel}
    with contextlib.suppress(catalog.CatalogError):
        shape = catalog.slice_shape(accel)
        config_type = _TPU_CONFIG_TYPES.get(shape.generation.prefix)
        if config_type:
            body["acceleratorConfigs"] = [{"type": config_type, "topology": shape.topology}]
    return body


def _reservation_target(spec: dict[str, Any], project: str) -> str | None:
    """The reservation path a SPECIFIC_RESERVATION pool aims at, as projects/P/reservations/R
    [/reservationBlocks/B[/reservationSubBlocks/S]]; a bare name is in the pool's project."""
    affinity = spec.get("config", {}).get("reservationAffinity", {})
    if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
        return None
    values = affinity.get("values", [])
    if not values:
        return None
    value = str(values[0])
    return value if value.startswith("projects/") else f"projects/{project}/reservations/{value}"


STOCK_TYPES = ("OnDemand", "Spot", "FlexStart")
_ZONE_RE = re.compile(models.ZONE_PATTERN)


def _stock_key(key: str, project: str = "p") -> str:
    """set_capacity's key as kept: ZONE/TYPE, or reservation/projects/P/reservations/R (a bare
    name is `project`'s; a block or sub-block counts against its reservation)."""
    head, _, rest = key.partition("/")
    if head == "reservation" and rest:
        path = rest if rest.startswith("projects/") else f"projects/{project}/reservations/{rest}"
        parts = path.split("/")
        if len(parts) >= 4 and parts[2] == "reservations" and _RESERVATION_RE.match(parts[3]):
            return "reservation/" + "/".join(parts[:4])
    elif _ZONE_RE.match(head) and rest in STOCK_TYPES:
        return key
    raise ValueError(
        f"capacity key {key!r}: one of ZONE/OnDemand, ZONE/Spot, ZONE/FlexStart (e.g. "
        "us-east5-b/Spot) or reservation/NAME (or reservation/projects/P/reservations/NAME)"
    )


def _chips(pool: _Pool) -> int:
    tpu = TPU_MACHINES.get(str(pool.spec.get("config", {}).get("machineType", "")))
    return pool.slice_nodes * tpu.chips_per_host if tpu is not None else 0


def _region(zone: str) -> str:
    parts = zone.split("-")
    return "-".join(parts[:-1]) if len(parts) == 3 and len(parts[-1]) == 1 else zone


def _policy_of(pool: _Pool) -> tuple[str, str, str] | None:
    """(project, region, name) of the resource policy a pool names, if any: a bare name is
    looked up "in the same project and region as the node pool" (NodePool.PlacementPolicy
    .policy_name)."""
    name = pool.spec.get("placementPolicy", {}).get("policyName")
    if not name:
        return None
    zones = pool.spec.get("locations") or [pool.cluster.split("/")[3]]
    return pool.cluster.split("/")[1], _region(zones[0]), str(name)


def _parse_policy(body: bytes) -> dict[str, Any]:
    """Parse a ResourcePolicy body with the API's own schema (unknown fields: 400)."""
    from google.cloud import compute_v1

    message = compute_v1.ResourcePolicy.pb()()
    try:
        json_format.Parse(body or b"{}", message)
    except json_format.ParseError as err:
        raise ApiError(400, "INVALID_ARGUMENT", f"Invalid JSON payload received. {err}") from None
    spec: dict[str, Any] = json_format.MessageToDict(message)
    return spec


_GCE_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def _validate_policy(spec: dict[str, Any]) -> None:
    # GCE resource names: RFC 1035, at most 63 ("Invalid value for field 'resource.name'").
    name = str(spec.get("name", ""))
    if not _GCE_NAME_RE.match(name):
        raise _invalid(
            f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
            "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
        )
    workload = spec.get("workloadPolicy")
    if workload is None:
        return
    # gcloud compute resource-policies create workload-policy: --type HIGH_AVAILABILITY or
    # HIGH_THROUGHPUT is required; the accelerator topology "can be set only when the workload
    # policy type is HIGH_THROUGHPUT and cannot be set if max topology distance is set"
    # (google_compute_resource_policy workload_policy). Wording UNCONFIRMED.
    kind = workload.get("type")
    if kind not in ("HIGH_AVAILABILITY", "HIGH_THROUGHPUT"):
        raise _invalid(
            "Invalid value for field 'resource.workloadPolicy.type': "
            f"'{kind}'. Must be HIGH_AVAILABILITY or HIGH_THROUGHPUT."
        )
    topology = workload.get("acceleratorTopology")
    if topology and (kind != "HIGH_THROUGHPUT" or workload.get("maxTopologyDistance")):
        raise _invalid(
            "acceleratorTopology can be set only with type HIGH_THROUGHPUT and without "
            "maxTopologyDistance."
        )


# The response type of each route whose fields a mask is checked against (unknown: 400).
_RESPONSES: dict[str, Any] = {
    "create_node_pool": cluster_service.Operation,
    "delete_node_pool": cluster_service.Operation,
    "get_operation": cluster_service.Operation,
    "list_operations": cluster_service.ListOperationsResponse,
    "list_node_pools": cluster_service.ListNodePoolsResponse,
    "get_node_pool": cluster_service.NodePool,
    "get_cluster": cluster_service.Cluster,
}


@functools.lru_cache(maxsize=64)  # a client sends the same few masks: parsed once each
def _response_mask(route: str, fields: str | None) -> fieldmask.Mask | None:
    if not fields:
        return None
    try:
        mask = fieldmask.parse(fields)
        response = _RESPONSES.get(route)
        return mask if response is None else fieldmask.resolve(mask, response.pb().DESCRIPTOR)
    except fieldmask.FieldMaskError as err:
        raise ApiError(400, "INVALID_ARGUMENT", str(err)) from None


def _parse_create(body: bytes) -> dict[str, Any]:
    """Parse a CreateNodePoolRequest body with the API's own schema (unknown fields: 400)."""
    request = cluster_service.CreateNodePoolRequest.pb()()
    try:
        json_format.Parse(body or b"{}", request)
    except json_format.ParseError as err:
        raise ApiError(400, "INVALID_ARGUMENT", f"Invalid JSON payload received. {err}") from None
    spec: dict[str, Any] = json_format.MessageToDict(request.node_pool)
    if not spec.get("name"):
        raise ApiError(400, "INVALID_ARGUMENT", "Node pool name must be specified.")
    return spec


# Routes: (HTTP method, regex) -> handler name.
_SEG = r"([^/:?]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = (
    [
        (m, re.compile(rf"^/v1/projects/{_SEG}/locations/{_SEG}{p}$"), h)
        for m, p, h in (
            ("POST", rf"/clusters/{_SEG}/nodePools", "create_node_pool"),
            ("GET", rf"/clusters/{_SEG}/nodePools", "list_node_pools"),
            ("GET", rf"/clusters/{_SEG}/nodePools/{_SEG}", "get_node_pool"),
            ("DELETE", rf"/clusters/{_SEG}/nodePools/{_SEG}", "delete_node_pool"),
            ("GET", rf"/operations/{_SEG}", "get_operation"),
            ("GET", r"/operations", "list_operations"),
        )
    ]
    + [
        (
            "GET",
            re.compile(rf"^/v2/projects/{_SEG}/locations/{_SEG}/acceleratorTypes$"),
            "list_accelerator_types",
        ),
        (
            "GET",
            re.compile(rf"^/v1/projects/{_SEG}/locations/{_SEG}/clusters/{_SEG}$"),
            "get_cluster",
        ),
    ]
    + [
        (m, re.compile(rf"^/compute/v1/projects/{_SEG}/regions/{_SEG}{p}$"), h)
        for m, p, h in (
            ("POST", "/resourcePolicies", "insert_resource_policy"),
            ("GET", "/resourcePolicies", "list_resource_policies"),
            ("GET", rf"/resourcePolicies/{_SEG}", "get_resource_policy"),
            ("DELETE", rf"/resourcePolicies/{_SEG}", "delete_resource_policy"),
            ("GET", rf"/operations/{_SEG}", "get_region_operation"),
        )
    ]
)


def _route(method: str, path: str) -> tuple[str, tuple[str, ...]] | None:
    for m, pattern, name in _ROUTES:
        match = pattern.match(path)
        if match and m == method:
            return name, match.groups()
    return None


class _Handler(BaseHTTPRequestHandler):
    sim: GkeSimulator
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's requests session expects

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        asked = query.get("fields") or query.get("$fields") or [""]
        fields = self.headers.get("X-Goog-FieldMask") or asked[0]
        status, payload = self.sim.handle(self.command, url.path, body, fields)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("gke-sim http " + format, *args)


# --------------------------------------------------------------------------------------------
# CLI


def _parse_offered(items: list[str]) -> dict[str, list[str]]:
    offered = {}
    for item in items:
        zone, _, types = item.partition("=")
        offered[zone] = [t for t in types.split(",") if t]
    return offered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m multislice_local.gke_sim",
        description="Local GKE node-pool + Cloud TPU API simulator (prints its URL).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig", help="register kwok fake TPU nodes in this cluster")
    parser.add_argument("--op-latency", type=float, default=1.5, help="seconds per create")
    parser.add_argument("--delete-latency", type=float, default=None)
    parser.add_argument("--max-concurrent-ops", type=int, default=None)
    parser.add_argument("--preempt-recreate", type=float, default=None)
    parser.add_argument(
        "--cluster",
        action="append",
        default=None,
        help="projects/P/locations/L/clusters/C that exists (default: any)",
    )
    parser.add_argument("--offered", action="append", default=[], metavar="ZONE=T1,T2")
    parser.add_argument("--stockout-next", type=int, default=0)
    parser.add_argument("--stockout-on-create", type=int, action="append", default=[])
    parser.add_argument("--stockout-zone", action="append", default=[])
    parser.add_argument("--quota-next", type=int, default=0)
    parser.add_argument("--quota-sync-next", type=int, default=0, help="403 quota at create")
    parser.add_argument("--failed-create-latency", type=float, default=None)
    parser.add_argument(
        "--release-channel", default="REGULAR", help="the cluster's channel; 'none' for none"
    )
    parser.add_argument("--workload-identity", action="store_true")
    parser.add_argument("--http-429-next", type=int, default=0)
    parser.add_argument("--http-5xx-next", type=int, default=0)
    parser.add_argument("--invalid-machine-type", action="append", default=[])
    parser.add_argument(
        "--reservation",
        action="append",
        default=[],
        metavar="[projects/P/reservations/]R=BLOCK:N[,BLOCK:N]",
        help="an All Capacity mode reservation of N 4x4x4 sub-blocks per block (dynamic slicing)",
    )
    parser.add_argument("--reservation-project", default="local-project")
    parser.add_argument(
        "--capacity",
        action="append",
        default=[],
        metavar="KEY=CHIPS",
        help="TPU chips of ZONE/OnDemand, ZONE/Spot, ZONE/FlexStart or reservation/R (a name in "
        "--reservation-project); a key not given is unlimited",
    )
    parser.add_argument(
        "--slices",
        action="store_true",
        help="serve GKE's Slice CRD in the --kubeconfig cluster and run the slice controller",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.slices and not args.kubeconfig:
        parser.error("--slices needs --kubeconfig (the cluster the Slices live in)")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    config = SimConfig(
        op_latency_s=args.op_latency,
        delete_latency_s=args.delete_latency,
        max_concurrent_operations=args.max_concurrent_ops,
        preempt_recreate_s=args.preempt_recreate,
        clusters=args.cluster,
        offered=_parse_offered(args.offered),
        failed_create_latency_s=args.failed_create_latency,
        release_channel=None if args.release_channel.lower() == "none" else args.release_channel,
        workload_identity=args.workload_identity,
    )
    faults = Faults(
        stockout_next=args.stockout_next,
        stockout_on_create=args.stockout_on_create,
        stockout_zones=args.stockout_zone,
        quota_next=args.quota_next,
        quota_sync_next=args.quota_sync_next,
        http_429_next=args.http_429_next,
        http_5xx_next=args.http_5xx_next,
        invalid_machine_types=args.invalid_machine_type,
    )
    registrar: NodeRegistrar | None = None
    if args.kubeconfig:
        registrar = KubeNodeRegistrar(os.fspath(args.kubeconfig))
    store: slices.SliceStore | None = None
    if args.slices:
        slices.install_crd(os.fspath(args.kubeconfig))
        store = slices.KubeSliceStore(os.fspath(args.kubeconfig))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with GkeSimulator(
        config, faults, registrar, host=args.host, port=args.port, slice_store=store
    ) as sim:
        for name, blocks in _parse_reservations(args.reservation):
            sim.add_reservation(name, blocks, project=args.reservation_project)
        for value in args.capacity:
            key, _, chips = value.rpartition("=")
            sim.set_capacity(key, int(chips), project=args.reservation_project)
        print(sim.url, flush=True)
        stop.wait()
    return 0


def _parse_reservations(values: list[str]) -> list[tuple[str, dict[str, int]]]:
    """``R=block-1:4,block-2:4`` -> [("R", {"block-1": 4, "block-2": 4})]."""
    out = []
    for value in values:
        name, _, spec = value.partition("=")
        blocks = {b: int(n) for b, _, n in (part.partition(":") for part in spec.split(","))}
        out.append((name, blocks))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
