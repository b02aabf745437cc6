"""GKE dynamic slicing, simulated: sub-blocks of a reservation and the slice controller.

The GKE objects and rules are listed, with their sources, in docs/dynamic-slicing-contract.md;
the CRD is ``crds/slice.yaml`` beside this module.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

CRD_FILE = Path(__file__).with_name("crds") / "slice.yaml"

GROUP = "accelerator.gke.io"
VERSION = "v1beta1"
PLURAL = "slices"
KIND = "Slice"
FINALIZER = "accelerator.gke.io/slice-finalizer"
RETRY_ANNOTATION = "slice.gke.io/retry-on-failure"

# Node labels GKE sets on every node of a sub-block pool (create-dynamic-slices, "Verify the
# status of the nodes and the partitions"; xpk templates/kueue_super_slicing_topology.yaml.j2).
PARTITION_ID_LABEL = "cloud.google.com/gke-tpu-partition-4x4x4-id"
PARTITION_STATE_LABEL = "cloud.google.com/gke-tpu-partition-4x4x4-state"
TOPOLOGY_MODE_LABEL = "cloud.google.com/gke-accelerator-topology-mode"
BLOCK_LABEL = "cloud.google.com/gce-topology-block"
SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
# Node labels the slice controller sets on the nodes of a formed slice (same page, "Run workloads
# on dynamic slicing" and "Disable the Slice Controller").
SLICE_LABEL = "cloud.google.com/gke-tpu-slice"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"

# Partition states (the PARTITION_STATE_LABEL values).
HEALTHY = "HEALTHY"
DEGRADED = "DEGRADED"
UNHEALTHY = "UNHEALTHY"
UNSET = "UNSET"
INCOMPLETE = "INCOMPLETE"
PARTITION_STATES = (HEALTHY, DEGRADED, UNHEALTHY, UNSET, INCOMPLETE)

# Slice states: the reason of the Ready condition (create-dynamic-slices, "Monitor the status of
# the Slice custom resource"; reference/crds/slice).
READY = "Ready"
SLICE_NOT_CREATED = "SliceNotCreated"
SLICE_CREATION_FAILED = "SliceCreationFailed"
ACTIVATING = "ACTIVATING"
ACTIVE = "ACTIVE"
ACTIVE_DEGRADED = "ACTIVE_DEGRADED"
FAILED = "FAILED"
DEACTIVATING = "DEACTIVATING"
# Ready is True in these (xpk slice/internal/core/core.go, GetSliceState).
READY_STATES = (ACTIVE, ACTIVE_DEGRADED)

# A sub-block: a 4x4x4 cube of tpu7x chips on 16 VMs of 4 chips (concepts/dynamic-slicing).
CUBE_TOPOLOGY = "4x4x4"
CHIPS_PER_CUBE = 64
VMS_PER_CUBE = 16
MAX_SLICE_CHIPS = 9216
MAX_NAME_LENGTH = 49  # newer GKE pages (an older copy said 54; xpk keeps 49)
SLICE_TYPE = "tpu7x"

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_TOPOLOGY_RE = re.compile(r"^(\d+)x(\d+)x(\d+)$")


# --------------------------------------------------------------------------------------------
# Sub-blocks of an All Capacity mode reservation


def partition_id(sub_block_path: str) -> str:
    """A stable 32-hex-character partition ID for a sub-block, the form GKE shows
    (``fba785f80d18552357dcdef6d3d16c27``, create-dynamic-slices)."""
    return hashlib.sha256(sub_block_path.encode()).hexdigest()[:32]


@dataclass
class SubBlock:
    """One 4x4x4 cube of a reservation: 16 VMs, at most one node pool on it."""

    reservation: str  # projects/P/reservations/R
    block: str
    name: str
    state: str = HEALTHY  # the partition state its nodes carry (PARTITION_STATES)
    pool: str | None = None  # the node pool provisioned on it
    nodes_ready: bool = False  # all VMS_PER_CUBE nodes of that pool registered

    @property
    def path(self) -> str:
        return f"{self.reservation}/reservationBlocks/{self.block}/reservationSubBlocks/{self.name}"

    @property
    def partition_id(self) -> str:
        return partition_id(self.path)

    def node_labels(self) -> dict[str, str]:
        """What GKE labels every node of this sub-block's pool with."""
        return {
            PARTITION_ID_LABEL: self.partition_id,
            PARTITION_STATE_LABEL: self.state,
            TOPOLOGY_MODE_LABEL: "PROVISION_ONLY",
            BLOCK_LABEL: self.block,
            SUBBLOCK_LABEL: self.name,
        }


def sub_blocks(reservation: str, blocks: dict[str, int]) -> list[SubBlock]:
    """The sub-blocks of a reservation given as {block: sub-block count}, named
    ``<block>-sb-<i>`` (GKE's names are opaque; a block reports ``reservationSubBlockCount``)."""
    return [
        SubBlock(reservation, block, f"{block}-sb-{i}")
        for block, count in blocks.items()
        for i in range(count)
    ]


def pick_sub_block(cubes: list[SubBlock], target: str) -> SubBlock | None:
    """The free sub-block a node pool aimed at ``target`` gets: that sub-block, or any free one of
    the block (block targeting: "GKE places the node pool within an available sub-block in that
    block", create-dynamic-slices), or of the reservation. None when none is free. Aimed at a
    block or a reservation, an UNHEALTHY sub-block ("cannot be used") is not an available one
    (modelled: GKE does not say how it picks)."""
    for cube in cubes:
        if cube.pool is not None:
            continue
        if target == cube.path:
            return cube
        if cube.state != UNHEALTHY and target in (
            f"{cube.reservation}/reservationBlocks/{cube.block}",
            cube.reservation,
        ):
            return cube
    return None


# --------------------------------------------------------------------------------------------
# The Slice: admission (GKE's validating webhook) and state (the slice controller)


def parse_topology(topology: str) -> tuple[int, int, int] | None:
    match = _TOPOLOGY_RE.match(topology)
    if match is None:
        return None
    a, b, c = (int(d) for d in match.groups())
    return a, b, c


def admission_errors(obj: dict[str, Any]) -> list[str]:
    """What GKE's validating webhook refuses in a Slice (the CRD's CEL rules say the same, for
    the API server): reference/crds/slice (name) and create-dynamic-slices (topology, type)."""
    errors = []
    name = str(obj.get("metadata", {}).get("name", ""))
    if len(name) > MAX_NAME_LENGTH:
        errors.append(
            f"metadata.name must be {MAX_NAME_LENGTH} characters or fewer (GKE appends a hyphen "
            f"and an 8-character cluster hash to name Compute Engine resources), got {len(name)}"
        )
    if not _NAME_RE.match(name):
        errors.append(f"metadata.name {name!r} must match ^[a-z]([-a-z0-9]*[a-z0-9])?$")
    spec = obj.get("spec", {})
    if spec.get("type") != SLICE_TYPE:
        errors.append(f"spec.type must be {SLICE_TYPE}, got {spec.get('type')!r}")
    topology = str(spec.get("topology", ""))
    dims = parse_topology(topology)
    if dims is None or not all(d > 0 and d % 4 == 0 for d in dims):
        errors.append(
            f"spec.topology must be 4i x 4j x 4k (each dimension a multiple of 4), got {topology!r}"
        )
    elif not dims[0] <= dims[1] <= dims[2]:
        errors.append(
            f"spec.topology dimensions must be in non-decreasing order (A <= B <= C), got "
            f"{topology}"
        )
    elif dims[0] * dims[1] * dims[2] > MAX_SLICE_CHIPS:
        errors.append(f"spec.topology must hold at most {MAX_SLICE_CHIPS} chips, got {topology}")
    if not spec.get("partitionIds"):
        errors.append("spec.partitionIds must name at least one partition")
    return errors


def cubes_of(topology: str) -> int:
    dims = parse_topology(topology)
    if dims is None:
        return 0
    return dims[0] * dims[1] * dims[2] // CHIPS_PER_CUBE


def formation(
    name: str, spec: dict[str, Any], cubes: dict[str, SubBlock], taken: dict[str, str]
) -> tuple[str, str]:
    """(state, message) of a Slice the controller forms now, from the prerequisites GKE lists
    (create-dynamic-slices, "Create a Slice custom resource"): SliceCreationFailed when a
    partition's nodes do not exist or are not all ready, a partition is used by another Slice, or
    the count is not A*B*C/64; FAILED when the partitions are not in one reservation and block,
    or one cannot be used (UNHEALTHY, UNSET, INCOMPLETE); ACTIVE_DEGRADED on a DEGRADED one;
    else ACTIVE. ``taken``: partition ID -> the Slice holding it."""
    ids = [str(p) for p in spec.get("partitionIds", [])]
    want = cubes_of(str(spec.get("topology", "")))
    if len(ids) != want or len(set(ids)) != len(ids):
        return SLICE_CREATION_FAILED, (
            f"topology {spec.get('topology')} needs {want} distinct partitions, got {len(ids)}"
        )
    missing = [p for p in ids if p not in cubes or not cubes[p].nodes_ready]
    if missing:
        return SLICE_CREATION_FAILED, f"partitions without ready nodes: {', '.join(missing)}"
    busy = [p for p in ids if taken.get(p, name) != name]
    if busy:
        return SLICE_CREATION_FAILED, (
            f"partitions used by another Slice: {', '.join(f'{p} ({taken[p]})' for p in busy)}"
        )
    members = [cubes[p] for p in ids]
    if len({(c.reservation, c.block) for c in members}) > 1:
        return FAILED, "partitions are not in the same reservation block"
    return health(members)


def health(members: list[SubBlock]) -> tuple[str, str]:
    """The state of a formed slice from its cubes' partition states; a cube whose VMs are gone
    (its pool deleted, preempted, broken) fails it too."""
    broken = [c.partition_id for c in members if c.state not in (HEALTHY, DEGRADED)]
    if broken:
        return FAILED, f"partitions cannot be used: {', '.join(broken)}"
    lost = [c.partition_id for c in members if not c.nodes_ready]
    if lost:
        return FAILED, f"partitions lost their nodes: {', '.join(lost)}"
    degraded = [c.partition_id for c in members if c.state == DEGRADED]
    if degraded:
        return ACTIVE_DEGRADED, f"degraded partitions: {', '.join(degraded)}"
    return ACTIVE, ""


def ready_condition(
    state: str, message: str, now: str, previous: dict[str, Any] | None
) -> dict[str, Any]:
    """The Ready condition for a state; lastTransitionTime moves only when the status does."""
    status = "True" if state in READY_STATES else "False"
    moved = previous is None or previous.get("status") != status
    return {
        "type": READY,
        "status": status,
        "reason": state,
        "message": message,
        "lastTransitionTime": now if moved else previous["lastTransitionTime"],  # type: ignore[index]
    }


def state_of(obj: dict[str, Any]) -> str | None:
    """A Slice's state: its Ready condition's reason (None before the controller wrote one)."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == READY:
            return str(cond.get("reason"))
    return None


# --------------------------------------------------------------------------------------------
# Where Slices live: a Kubernetes API server, or memory (unit tests)


class SliceStore(Protocol):
    """The Slice objects the controller reconciles (cluster-scoped, plain dicts)."""

    def list(self) -> list[dict[str, Any]]: ...

    def write_status(self, name: str, status: dict[str, Any]) -> None: ...

    def set_finalizer(self, name: str, on: bool) -> None: ...


class SliceAdmissionError(ValueError):
    """A Slice GKE's webhook refuses (what the API server's CEL rules refuse for the CRD)."""


class InMemorySliceStore:
    """Slices in memory, admitted as GKE's webhook admits them; what unit tests use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}
        self._serial = itertools.count()

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        errors = admission_errors(obj)
        if errors:
            raise SliceAdmissionError("; ".join(errors))
        name = str(obj["metadata"]["name"])
        with self._lock:
            if name in self._objects:
                raise SliceAdmissionError(f'slices.accelerator.gke.io "{name}" already exists')
            stored = copy.deepcopy(obj)
            stored["metadata"]["creationTimestamp"] = f"{next(self._serial):012d}"
            self._objects[name] = stored
            return copy.deepcopy(stored)

    def get(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self._objects.get(name)
            return copy.deepcopy(obj) if obj is not None else None

    def delete(self, name: str) -> None:
        """Marks the Slice deleted; it goes when the controller removes its finalizer."""
        with self._lock:
            obj = self._objects.get(name)
            if obj is None:
                return
            if obj["metadata"].get("finalizers"):
                obj["metadata"]["deletionTimestamp"] = "now"
            else:
                del self._objects[name]

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(o) for o in self._objects.values()]

    def write_status(self, name: str, status: dict[str, Any]) -> None:
        with self._lock:
            if name in self._objects:
                self._objects[name]["status"] = copy.deepcopy(status)

    def set_finalizer(self, name: str, on: bool) -> None:
        with self._lock:
            obj = self._objects.get(name)
            if obj is None:
                return
            obj["metadata"]["finalizers"] = [FINALIZER] if on else []
            if not on and obj["metadata"].get("deletionTimestamp"):
                del self._objects[name]


class KubeSliceStore:
    """Slices in a Kubernetes API server where the CRD (:data:`CRD_FILE`) is installed."""

    def __init__(self, api_client_or_kubeconfig: Any) -> None:
        from kubernetes import client

        self._api = client.CustomObjectsApi(_api_client(api_client_or_kubeconfig))

    def list(self) -> list[dict[str, Any]]:
        found: Any = self._api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        items: list[dict[str, Any]] = found["items"]
        return items

    def write_status(self, name: str, status: dict[str, Any]) -> None:
        self._api.patch_cluster_custom_object_status(
            GROUP, VERSION, PLURAL, name, {"status": status}
        )

    def set_finalizer(self, name: str, on: bool) -> None:
        body = {"metadata": {"finalizers": [FINALIZER] if on else None}}
        self._api.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, body)


def _api_client(api_client_or_kubeconfig: Any) -> Any:
    from kubernetes import client, config

    if isinstance(api_client_or_kubeconfig, client.ApiClient):
        return api_client_or_kubeconfig
    return config.new_client_from_config(config_file=str(api_client_or_kubeconfig))  # type: ignore[no-untyped-call]


def install_crd(api_client_or_kubeconfig: Any) -> None:
    """Create the Slice CRD (as enabling GKE's slice controller does); no-op when present."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = yaml.safe_load(CRD_FILE.read_text())
    api = client.ApiextensionsV1Api(_api_client(api_client_or_kubeconfig))
    try:
        api.create_custom_resource_definition(body)
    except ApiException as err:
        if err.status != 409:
            raise


# --------------------------------------------------------------------------------------------
# The slice controller


class NodeLabeler(Protocol):
    def label(self, pool: str, labels: dict[str, str | None]) -> None: ...


@dataclass
class _Tracked:
    state: str
    since: float  # monotonic time of entering it


class SliceController:
    """GKE's slice controller, simulated: one :meth:`sync` pass forms, watches and dismantles
    Slices over the simulator's sub-blocks (``cubes``: partition ID -> sub-block, a snapshot).

    Formation: the checks of GKE's SliceNotCreated step (not written: one pass does them), then
    SliceCreationFailed or FAILED (:func:`formation`), or ACTIVATING for ``activation_s`` and
    then ACTIVE / ACTIVE_DEGRADED / FAILED; a formed slice labels its nodes
    ``cloud.google.com/gke-tpu-slice`` = its name and ``cloud.google.com/gke-tpu-topology`` = its
    topology. Afterwards it follows its cubes: a DEGRADED cube makes it ACTIVE_DEGRADED (HEALTHY
    again: ACTIVE), an UNHEALTHY one (or one that lost its nodes) FAILED, which stays until the
    Slice is deleted. Deleting removes the node labels, shows DEACTIVATING for one pass (its
    partitions still held) and then frees them (the finalizer goes); with
    :attr:`unlabel_delay_s` the deleted Slice's nodes keep its name that long first (GKE's
    controller takes its time: a restarted pod may still see them labelled); a Slice named in
    :attr:`stuck` stays DEACTIVATING until someone removes its finalizer (GKE's troubleshooting
    page names Slices stuck so; its guide deletes a Slice by removing the finalizer).
    ``slice.gke.io/retry-on-failure: "true"`` retries SliceCreationFailed.
    """

    def __init__(
        self,
        store: SliceStore,
        labeler: NodeLabeler,
        activation_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.labeler = labeler
        self.activation_s = activation_s
        self._clock = clock
        self._tracked: dict[str, _Tracked] = {}
        self._lock = threading.Lock()  # one pass at a time (the simulator's timer, a test)
        self.stuck: set[str] = set()  # Slices whose deletion never completes
        self.unlabel_delay_s = 0.0  # how long a deleted Slice's nodes keep its name
        # (time, Slice, what the controller did): a test's evidence when it waited in vain.
        self.history: collections.deque[tuple[str, str, str]] = collections.deque(maxlen=500)

    def sync(self, cubes: dict[str, SubBlock]) -> None:
        with self._lock:
            self._sync(cubes)

    def _sync(self, cubes: dict[str, SubBlock]) -> None:
        objs = sorted(
            self.store.list(),
            key=lambda o: (str(o["metadata"].get("creationTimestamp", "")), o["metadata"]["name"]),
        )
        taken = self._taken(objs)
        for obj in objs:
            try:
                self._sync_one(obj, cubes, taken)
            except Exception:  # one Slice's failed call must not hold up the others' passes
                log.exception("slice-controller slice=%s pass failed", obj["metadata"]["name"])
        live = {o["metadata"]["name"] for o in objs}
        self._tracked = {k: v for k, v in self._tracked.items() if k in live}

    def _taken(self, objs: list[dict[str, Any]]) -> dict[str, str]:
        """Partition ID -> the Slice holding it: every Slice past formation checks."""
        taken: dict[str, str] = {}
        for obj in objs:
            if state_of(obj) in (ACTIVATING, ACTIVE, ACTIVE_DEGRADED, FAILED, DEACTIVATING):
                for p in obj.get("spec", {}).get("partitionIds", []):
                    taken.setdefault(str(p), obj["metadata"]["name"])
        return taken

    def _sync_one(
        self, obj: dict[str, Any], cubes: dict[str, SubBlock], taken: dict[str, str]
    ) -> None:
        name = str(obj["metadata"]["name"])
        spec = obj.get("spec") or {}
        members = [cubes[p] for p in spec.get("partitionIds") or [] if p in cubes]
        state = state_of(obj)
        if obj["metadata"].get("deletionTimestamp"):
            if state in (ACTIVATING, ACTIVE, ACTIVE_DEGRADED, FAILED):
                if self._clock() - self._since(name, "deleted") < self.unlabel_delay_s:
                    return
                self._unlabel(members)
            if state != DEACTIVATING and FINALIZER in (obj["metadata"].get("finalizers") or []):
                self._write(obj, DEACTIVATING, "the Slice is being deleted")
            elif name not in self.stuck:
                self.store.set_finalizer(name, False)
                self._note(name, "finalizer removed")
            return
        if FINALIZER not in (obj["metadata"].get("finalizers") or []):
            self.store.set_finalizer(name, True)
        retry = (obj["metadata"].get("annotations") or {}).get(RETRY_ANNOTATION) == "true"
        if state is None or (state == SLICE_CREATION_FAILED and retry):
            new, message = formation(name, spec, cubes, taken)
            if new in READY_STATES:
                new, message = ACTIVATING, ""
                for p in spec.get("partitionIds", []):
                    taken[str(p)] = name
            self._write(obj, new, message)
        elif state == ACTIVATING:
            if self._clock() - self._since(name, state) >= self.activation_s:
                new, message = health(members)
                if new in READY_STATES:
                    self._label(members, name, str(spec.get("topology")))
                self._write(obj, new, message)
        elif state in READY_STATES:
            new, message = health(members)
            if new != state:
                self._write(obj, new, message)

    def _since(self, name: str, state: str) -> float:
        tracked = self._tracked.get(name)
        if tracked is None or tracked.state != state:
            tracked = self._tracked[name] = _Tracked(state, self._clock())
        return tracked.since

    def _write(self, obj: dict[str, Any], state: str, message: str) -> None:
        name = str(obj["metadata"]["name"])
        previous = next(
            (
                c
                for c in (obj.get("status") or {}).get("conditions") or []
                if c.get("type") == READY
            ),
            None,
        )
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.store.write_status(
            name, {"conditions": [ready_condition(state, message, now, previous)]}
        )
        self._tracked[name] = _Tracked(state, self._clock())
        self._note(name, state)
        log.info("slice-controller slice=%s state=%s %s", name, state, message)

    def _note(self, name: str, what: str) -> None:
        self.history.append((datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3], name, what))

    def _label(self, members: list[SubBlock], name: str, topology: str) -> None:
        for cube in members:
            if cube.pool:
                self.labeler.label(cube.pool, {SLICE_LABEL: name, GKE_TPU_TOPOLOGY: topology})

    def _unlabel(self, members: list[SubBlock]) -> None:
        for cube in members:
            if cube.pool:
                self.labeler.label(cube.pool, {SLICE_LABEL: None, GKE_TPU_TOPOLOGY: CUBE_TOPOLOGY})
