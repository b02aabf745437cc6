"""GKE node pools as the Provisioner of a Managed MultisliceJob: the I/O edge of gang provisioning.

:class:`GkeProvisioner` implements :class:`~multislice_operator.provisioning.base.Provisioner`
with the ``google-cloud-container`` client (``container_v1``, REST transport) and, for the
availability check, ``google-cloud-tpu`` (``tpu_v2``, REST). The gang decisions (all or none,
rollback, backoff) are the reconcile module's; this module only observes and starts operations.

Rules it keeps:

* Never blocks on a long-running operation: create/delete return once GKE accepted the call. The
  operation name is remembered in memory per pool only to enrich observation with the operation's
  error (``GCE_STOCKOUT``, ``GCE_QUOTA_EXCEEDED``, "does not have enough resources"). After a
  restart (empty memory) observation works from ``list_node_pools`` alone: an ERROR pool carries
  its ``statusMessage``. Level-based: nothing depends on having seen an event.
* Idempotent: create of an existing pool adopts it when it is labelled with the same owner uid;
  delete of a missing pool (or of one already STOPPING) is success. "Operation ... is currently
  deleting a node pool for cluster C" alone is not: it names the cluster's running operation.
* Every API call is retried in-process a few times (exponential backoff with jitter, see
  :class:`RetryPolicy`) on transient failures: 429 (over REST ``TooManyRequests``, which is NOT a
  ``ResourceExhausted``), 5xx, timeouts, connection errors, and "incompatible operation" /
  "currently creating ..." 400 FAILED_PRECONDITION answers of a busy cluster. What is still
  failing after that is reported as a transient :class:`PoolError` for the caller to retry later.
* Errors are classified permanent (retrying cannot help: invalid argument, unknown machine type,
  permission denied, missing cluster, missing reservation) or transient (everything else,
  stockout and quota included: capacity comes back). GKE refuses a create over quota at once
  (403 "Insufficient regional quota ..."): that slice then observes as failed once, naming the
  quota and region, so the gang is rolled back and retried with backoff.

Labels: every pool gets the plan's node labels (``multislice.dev/*`` only: GKE refuses
``kubernetes.io`` ones) plus ``multislice.dev/job-uid`` (on its nodes, and readable in
``config.labels`` through the GKE API), and GCE resource labels
(``managed-by``, ``multislice-job-namespace``, ``-name``, ``-uid``, ``-key``, ``multislice-slice``)
so the owner is recoverable from GKE alone (:meth:`GkeProvisioner.list_owned`, for the GC).

The ``google.com/tpu=present:NoSchedule`` taint is not sent by default: GKE adds it to every TPU
node itself; ``tpu_taint=True`` sends it explicitly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import requests
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import container_v1, tpu_v2
from google.cloud.container_v1.types import cluster_service as cs

from multislice_operator.common import keys
from multislice_operator.common.ownership import Owner, owner_of
from multislice_operator.common.pools import CAPACITY_CODES, PoolError, PoolState
from multislice_operator.planning.plan import (
    NodePoolSpec,
    Plan,
)
from multislice_operator.provisioning.base import ActionResult, GangObservation, PoolObservation
from multislice_operator.provisioning.executor import IdleExitThreadPool
from multislice_operator.provisioning.gke_errors import (
    CODE_ALREADY_EXISTS,
    CODE_CONFLICT,
    CODE_GKE_VERSION,
    CODE_NAME_TAKEN,
    CODE_NOT_FOUND,
    CODE_NOT_OFFERED,
    CODE_OWNED_BY_OTHER,
    CODE_QUOTA,
    CODE_UNAVAILABLE,
    CODE_WORKLOAD_POLICY,
    DELETING_RE,
    Classified,
    classify_exception,
    classify_message,
    describe_quota,
)
from multislice_operator.provisioning.gke_requests import (
    RL_JOB_UID,
    RL_MANAGED_BY,
    RL_SLICE,
    WORKLOAD_POLICY_TYPE,
    NodeOptions,
    WorkloadPolicySpec,
    build_node_pool,
    build_workload_policy,
    cluster_path,
    gce_label_value,
    workload_policies,
)
from multislice_operator.tpu import catalog

log = logging.getLogger(__name__)
T = TypeVar("T")
# The client's calls block, so they run in threads (up to max_concurrency at once, a gang's pools
# concurrently); a thread idle this long exits instead of staying for the operator's life.
IDLE_THREAD_SECONDS = 30.0

# GKE's NodePool.Status names -> the core's provider-neutral state.
_STATE = {
    "PROVISIONING": PoolState.CREATING,
    "RUNNING": PoolState.READY,
    "RUNNING_WITH_ERROR": PoolState.DEGRADED,
    "RECONCILING": PoolState.UPDATING,
    "STOPPING": PoolState.DELETING,
    "ERROR": PoolState.FAILED,
}

_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")

# --------------------------------------------------------------------------------------------
# Retry policy, metadata server, settings


@dataclass(frozen=True)
class RetryPolicy:
    """In-process retries of one API call: ``attempts`` tries, exponential delays with jitter."""

    attempts: int = 3
    initial_s: float = 0.5
    max_s: float = 4.0
    multiplier: float = 2.0
    jitter: float = 0.5  # this fraction of each delay is drawn at random

    def delay(self, retry: int) -> float:
        """Delay before retry number ``retry`` (1-based)."""
        base = min(self.max_s, self.initial_s * self.multiplier ** (retry - 1))
        return base * (1 - self.jitter) + random.uniform(0, base * self.jitter)


@dataclass(frozen=True)
class GkeMetadata:
    project: str
    cluster: str
    location: str  # the cluster's location: a region or a zone
    zone: str  # the zone of the VM the operator runs on


class MetadataError(RuntimeError):
    """The GKE metadata server could not be read (not on GKE, or no access)."""


METADATA_HOST_ENV = "GCE_METADATA_HOST"  # google-auth's own override, honoured here too
DEFAULT_METADATA_HOST = "metadata.google.internal"


def read_gke_metadata(host: str | None = None, timeout_s: float = 2.0) -> GkeMetadata:
    """Project, cluster name and location from the GKE metadata server (blocking; at startup).

    Reads ``project/project-id``, ``instance/attributes/cluster-name``,
    ``instance/attributes/cluster-location`` and ``instance/zone`` under
    ``http://HOST/computeMetadata/v1/`` with the ``Metadata-Flavor: Google`` header. HOST is
    ``host``, else ``$GCE_METADATA_HOST``, else ``metadata.google.internal``.
    """
    base = host or os.environ.get(METADATA_HOST_ENV) or DEFAULT_METADATA_HOST
    if not base.startswith(("http://", "https://")):
        base = f"http://{base}"
    root = f"{base.rstrip('/')}/computeMetadata/v1/"

    def get(path: str) -> str:
        request = urllib.request.Request(root + path, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return str(response.read().decode().strip())
        except (urllib.error.URLError, OSError) as err:
            raise MetadataError(f"metadata server {root}{path}: {err}") from err

    zone = get("instance/zone").rsplit("/", 1)[-1]
    return GkeMetadata(
        project=get("project/project-id"),
        cluster=get("instance/attributes/cluster-name"),
        location=get("instance/attributes/cluster-location"),
        zone=zone,
    )


@dataclass(frozen=True)
class OwnedPool(PoolObservation):
    """A pool this operator created, with its owner job as GKE records it (for the GC)."""

    namespace: str | None = None
    job_name: str | None = None
    job_key: str | None = None
    machine_type: str = ""
    locations: tuple[str, ...] = ()


@dataclass
class _OpRecord:
    """An operation this process started on a pool; enriches observation only."""

    path: str  # projects/P/locations/L/operations/O
    kind: str  # "create" | "delete"
    done: bool = False
    error: PoolError | None = None
    started: float = 0.0  # loop time the call starting it was answered


# --------------------------------------------------------------------------------------------
# The provisioner


class GkeProvisioner:
    """Creates, observes and deletes a plan's node pools in one GKE cluster.

    ``node_locations``: zones for the pools (a TPU slice lives in one zone: give one); default
    ``[location]`` for a zonal cluster. ``client``/``tpu_client`` may be injected; otherwise
    they are built with ``credentials`` (None: Application Default Credentials, i.e. Workload
    Identity on GKE), ``transport`` (default REST) and ``client_options``. Close with
    :meth:`close`.
    """

    def __init__(
        self,
        project: str,
        location: str,
        cluster: str,
        node_locations: list[str] | None = None,
        *,
        client: container_v1.ClusterManagerClient | None = None,
        tpu_client: tpu_v2.TpuClient | None = None,
        credentials: Credentials | None = None,
        transport: str = "rest",
        client_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        call_timeout_s: float = 30.0,
        max_concurrency: int = 32,
        idle_thread_s: float = IDLE_THREAD_SECONDS,
        offered_ttl_s: float = 600.0,
        tpu_taint: bool = False,
        node: NodeOptions | None = None,
    ) -> None:
        node_locations = resolve_node_locations(location, node_locations)
        if len(node_locations) > 1:
            log.warning(
                "gke several node locations for TPU slices locations=%s (a slice needs one zone)",
                ",".join(node_locations),
            )
        self.project, self.location, self.cluster = project, location, cluster
        self.node_locations = list(node_locations)
        self.retry = retry or RetryPolicy()
        self.call_timeout_s = call_timeout_s
        self.offered_ttl_s = offered_ttl_s
        self.tpu_taint = tpu_taint
        self.node = replace(
            node or NodeOptions(), tpu_taint=tpu_taint or bool(node and node.tpu_taint)
        )
        self._client_args: dict[str, Any] = {
            "credentials": credentials,
            "transport": transport,
            "client_options": dict(client_options) if client_options else None,
        }
        self._client = client or container_v1.ClusterManagerClient(**self._client_args)
        self._tpu_client = tpu_client
        self._executor = IdleExitThreadPool(max_concurrency, idle_thread_s, "gke-api")
        self._max_concurrency = max_concurrency
        _widen_connection_pool(self._client, max_concurrency)
        self._ops: dict[str, _OpRecord] = {}  # by pool name
        # Create refusals worth a gang rollback (permanent, or capacity: quota and stockout),
        # by pool name, until the pool is created again or deleted: what observe_gang() reports.
        self._refused: dict[str, PoolError] = {}
        # One list_node_pools shared by every job: (monotonic time it was asked, the pools).
        self._listing: tuple[float, list[cs.NodePool]] | None = None
        self._listing_task: asyncio.Task[list[cs.NodePool]] | None = None
        self._listing_task_started = 0.0
        self._mutated_at = 0.0  # when our last create/delete was answered: older listings are stale
        self.list_calls = 0
        self._offered: dict[str, tuple[float, frozenset[str]]] = {}  # zone -> (expiry, types)
        self._compute: Any = None  # compute_v1 ResourcePolicies/RegionOperations, built lazily
        self._cluster_version: tuple[float, str] | None = None  # (expiry, currentMasterVersion)

    # -- construction helpers -------------------------------------------------------------------

    @classmethod
    def from_endpoint(
        cls,
        endpoint: str,
        project: str,
        location: str,
        cluster: str,
        node_locations: list[str] | None = None,
        **kwargs: Any,
    ) -> GkeProvisioner:
        """Anonymous REST client against a local endpoint (the simulator): ``http://host:port``."""
        return cls(
            project,
            location,
            cluster,
            node_locations,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            transport="rest",
            client_options={"api_endpoint": endpoint},
            **kwargs,
        )

    @classmethod
    def from_settings(
        cls,
        project: str | None = None,
        location: str | None = None,
        cluster: str | None = None,
        node_locations: Iterable[str] | None = None,
        endpoint: str | None = None,
        metadata_host: str | None = None,
        simulator: str | None = None,
        **kwargs: Any,
    ) -> GkeProvisioner:
        """Build from operator settings; what is missing comes from the GKE metadata server.

        Credentials are Application Default Credentials (Workload Identity on GKE), also with
        ``endpoint``, an override of Google's (a private or Private Service Connect endpoint).
        Only ``simulator`` (the local one: an explicit setting of its own) is anonymous; then
        nothing is read from the metadata server and project/location/cluster must be given.
        """
        zones = [z for z in (node_locations or []) if z]
        if simulator:
            if endpoint:
                raise ValueError("give a simulator or an endpoint override, not both")
            if not (project and location and cluster):
                raise ValueError("with the simulator, give project, location and cluster")
            return cls.from_endpoint(simulator, project, location, cluster, zones, **kwargs)
        if endpoint:  # GKE's API only: the Cloud TPU client keeps Google's endpoint
            kwargs["client"] = container_v1.ClusterManagerClient(
                transport="rest", client_options={"api_endpoint": endpoint}
            )
        if not (project and location and cluster):
            meta = read_gke_metadata(metadata_host)
            project, location = project or meta.project, location or meta.location
            cluster = cluster or meta.cluster
            log.info(
                "gke settings from metadata project=%s location=%s cluster=%s",
                project,
                location,
                cluster,
            )
        return cls(project, location, cluster, zones or None, **kwargs)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for c in (self._client, self._tpu_client, *(self._compute or ())):
            transport = getattr(c, "transport", None)
            if transport is not None:
                transport.close()

    # -- paths ----------------------------------------------------------------------------------

    @property
    def cluster_path(self) -> str:
        return cluster_path(self.project, self.location, self.cluster)

    @property
    def region(self) -> str:
        """The region of the node pools' zone (quota is regional)."""
        zone = self.node_locations[0]
        return zone.rsplit("-", 1)[0] if _ZONE_RE.match(zone) else zone

    def pool_path(self, name: str) -> str:
        return f"{self.cluster_path}/nodePools/{name}"

    def operation_path(self, op_name: str) -> str:
        if op_name.startswith("projects/"):
            return op_name
        return f"projects/{self.project}/locations/{self.location}/operations/{op_name}"

    # -- calls ----------------------------------------------------------------------------------

    async def _call(
        self,
        what: str,
        fn: Callable[[], T],
        pool: str = "",
        give_up: Callable[[Classified], bool] | None = None,
    ) -> T:
        """Run a blocking client call in the worker pool, retrying transient failures."""
        loop = asyncio.get_running_loop()
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return await loop.run_in_executor(self._executor, fn)
            except Exception as exc:
                c = classify_exception(exc)
                last = attempt == self.retry.attempts
                if not c.retry_now or last or (give_up is not None and give_up(c)):
                    raise
                delay = self.retry.delay(attempt)
                log.info(
                    "gke retry call=%s pool=%s attempt=%d code=%s delay_s=%.2f msg=%r",
                    what,
                    pool,
                    attempt,
                    c.code,
                    delay,
                    c.message[:200],
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _list_pools(self, max_age: float = 0.0) -> list[cs.NodePool]:
        """The cluster's pools, from a listing at most `max_age` seconds old and asked after our
        own last create/delete was answered; concurrent callers share one call (single flight)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        oldest = max(now - max_age, self._mutated_at)
        if self._listing is not None and self._listing[0] >= oldest and max_age > 0:
            return self._listing[1]
        task = self._listing_task
        if task is None or task.done() or self._listing_task_started < oldest:
            self._listing_task_started = now
            task = self._listing_task = asyncio.ensure_future(self._fetch_pools(now))
        return await asyncio.shield(task)

    async def _fetch_pools(self, asked: float) -> list[cs.NodePool]:
        self.list_calls += 1
        pools = await self._list_pools_now()
        if self._listing is None or self._listing[0] <= asked:
            self._listing = (asked, pools)
        self._forget_finished_deletes(asked, {p.name for p in pools})
        return pools

    def _forget_finished_deletes(self, asked: float, listed: set[str]) -> None:
        """A delete whose pool a listing asked after its answer no longer holds is over. A job's
        own passes see that in _observation; this ends the deletes nobody observes (the garbage
        collector's orphans, a job's pools deleted by an earlier operator), which were otherwise
        kept for the life of the process."""
        for name, record in list(self._ops.items()):
            if record.kind == "delete" and record.started <= asked and name not in listed:
                del self._ops[name]

    def _request(self, method: Callable[..., Any], **fields: Any) -> Callable[[], Any]:
        """A client call with the options every call here takes: no retry of the library's (the
        operator retries on its own schedule, by the error's class) and the call deadline."""
        return functools.partial(method, retry=None, timeout=self.call_timeout_s, **fields)

    async def _list_pools_now(self) -> list[cs.NodePool]:
        response = await self._call(
            "list_node_pools",
            self._request(
                self._client.list_node_pools,
                parent=self.cluster_path,
                metadata=((FIELD_MASK_HEADER, LISTED_POOL_FIELDS),),
            ),
        )
        return list(response.node_pools)

    # -- Provisioner: create --------------------------------------------------------------------

    async def create(self, plan: Plan, pools: list[NodePoolSpec], owner_uid: str) -> ActionResult:
        """Start creating every pool concurrently; existing pools of the same owner are adopted.

        A pool of the same name labelled with another owner uid is reported as a transient
        ``OWNED_BY_OTHER_JOB`` error (the caller should delete it, then create again); one without
        this operator's managed-by label is a permanent ``NAME_TAKEN`` error (never touched).
        """
        policy_errors = await self._ensure_policies(plan, pools)
        errors = await asyncio.gather(
            *(self._create_one(plan, s, owner_uid, policy_errors) for s in pools)
        )
        return ActionResult(errors=[e for e in errors if e is not None])

    # -- workload policies ------------------------------------------------------------------------

    async def _ensure_policies(self, plan: Plan, pools: list[NodePoolSpec]) -> dict[str, PoolError]:
        """Find or create every workload policy these pools name; errors by policy name.

        A pool naming a policy that does not exist is refused by GKE with INVALID_ARGUMENT, which
        would fail the job: so the policy is made to exist first, and a pool whose policy is not
        ready yet is not created in this pass (a transient error; the next pass creates it).
        Policies are shared by every job of the same shape and never deleted (see
        docs/provisioning.md): a delete could race another job's create that names it."""
        names = {p.workload_policy for p in pools if p.workload_policy}
        wanted = [w for w in workload_policies(plan, self.region) if w.name in names]
        results = await asyncio.gather(*(self._ensure_policy(w) for w in wanted))
        return {w.name: e for w, e in zip(wanted, results, strict=True) if e is not None}

    async def _ensure_policy(
        self, want: WorkloadPolicySpec, may_insert: bool = True
    ) -> PoolError | None:
        policies, operations = self._compute_clients()
        get = self._request(
            policies.get,
            project=self.project,
            region=want.region,
            resource_policy=want.name,
        )
        try:
            found = await self._call("resource_policies.get", get, want.name)
        except Exception as exc:
            c = classify_exception(exc)
            if c.code != CODE_NOT_FOUND:
                return c.pool_error(want.name)
            found = None
        if found is not None:
            return _policy_mismatch(want, found) or _policy_not_ready(want, found)
        if not may_insert:
            return PoolError(None, want.name, CODE_CONFLICT, "workload policy not found", False)
        return await self._insert_policy(want, policies, operations)

    async def _insert_policy(
        self, want: WorkloadPolicySpec, policies: Any, operations: Any
    ) -> PoolError | None:
        insert = self._request(
            policies.insert,
            project=self.project,
            region=want.region,
            resource_policy_resource=build_workload_policy(want),
        )
        try:
            op = await self._call("resource_policies.insert", insert, want.name)
        except Exception as exc:
            c = classify_exception(exc)
            if c.code == CODE_ALREADY_EXISTS:  # another job (or replica) made it meanwhile
                return await self._ensure_policy(want, may_insert=False)
            log.warning("gke workload policy insert failed policy=%s code=%s", want.name, c.code)
            return c.pool_error(want.name)
        log.info("gke workload policy insert started policy=%s region=%s", want.name, want.region)
        # The client's own ExtendedOperation polls a RegionOperationsClient built without this
        # provisioner's endpoint: poll with ours, a few seconds at most, then leave it to the next
        # pass (the pool creates wait for the policy).
        wait = functools.partial(
            _wait_region_operation, operations, self.project, want.region, op.name, 5.0
        )
        done = await self._call("region_operations.get", wait, want.name)
        if done is not None:
            return done.pool_error(want.name)
        return None

    def _compute_clients(self) -> tuple[Any, Any]:
        if self._compute is None:
            from google.cloud import compute_v1  # large: loads only for workload policies

            self._compute = (
                compute_v1.ResourcePoliciesClient(**self._client_args),
                compute_v1.RegionOperationsClient(**self._client_args),
            )
            for client in self._compute:
                _widen_connection_pool(client, self._max_concurrency)
        return self._compute[0], self._compute[1]

    async def _create_one(
        self,
        plan: Plan,
        spec: NodePoolSpec,
        owner_uid: str,
        policy_errors: Mapping[str, PoolError] | None = None,
    ) -> PoolError | None:
        refused = (policy_errors or {}).get(spec.workload_policy or "")
        err = (
            replace(refused, slice_index=spec.slice_index, pool=spec.name)
            if refused is not None
            else await self._create(plan, spec, owner_uid)
        )
        if err is not None and (err.permanent or err.code in CAPACITY_CODES):
            self._refused[spec.name] = err  # observed as the slice's error (no second decide)
        return err

    async def _create(self, plan: Plan, spec: NodePoolSpec, owner_uid: str) -> PoolError | None:
        self._refused.pop(spec.name, None)
        pool = build_node_pool(plan, spec, owner_uid, self.node_locations, node=self.node)
        call = self._request(
            self._client.create_node_pool,
            parent=self.cluster_path,
            node_pool=pool,
        )
        try:
            op = await self._mutate("create_node_pool", call, spec.name)
        except Exception as exc:
            c = classify_exception(exc)
            if c.code == CODE_ALREADY_EXISTS:
                return await self._adopt(spec, owner_uid)
            if c.code == CODE_QUOTA:  # which quota, and where: the status shows this message
                c = replace(c, message=describe_quota(c.message, self.region))
            self._log_failure("create", plan, spec.name, c)
            # Capacity (quota, stockout) and permanent refusals are remembered by _create_one:
            # observe_gang() reports them, decide() rolls the gang back (this attempt only).
            return c.pool_error(spec)
        self._ops[spec.name] = _OpRecord(self.operation_path(op.name), "create")
        log.info(
            "gke create started pool=%s slice=%d job=%s/%s uid=%s op=%s machine=%s nodes=%d",
            spec.name,
            spec.slice_index,
            plan.namespace,
            plan.name,
            owner_uid,
            op.name,
            spec.machine_type,
            spec.node_count,
        )
        return None

    async def _mutate(self, what: str, call: Callable[[], T], pool: str) -> T:
        """A create or delete call. A listing asked while it was on the wire may have been
        answered before GKE applied it, so every listing asked before its answer is stale."""
        try:
            return await self._call(what, call, pool)
        finally:
            self._mutated_at = asyncio.get_running_loop().time()

    async def _adopt(self, spec: NodePoolSpec, owner_uid: str) -> PoolError | None:
        call = self._request(self._client.get_node_pool, name=self.pool_path(spec.name))
        try:
            existing = await self._call("get_node_pool", call, spec.name)
        except Exception as exc:
            c = classify_exception(exc)
            if c.code == CODE_NOT_FOUND:  # deleted since the 409: the next create will do
                return PoolError(
                    spec.slice_index,
                    spec.name,
                    CODE_CONFLICT,
                    "pool vanished while adopting",
                    False,
                )
            return c.pool_error(spec)
        labels = dict(existing.config.labels)
        owner = labels.get(keys.JOB_UID) or existing.config.resource_labels.get(RL_JOB_UID)
        managed = _is_managed(existing)
        if not managed:
            return PoolError(
                spec.slice_index,
                spec.name,
                CODE_NAME_TAKEN,
                f"a node pool named {spec.name} exists and was not created by "
                f"{keys.MANAGED_BY_VALUE}; rename the job or delete that pool",
                True,
            )
        # No uid recorded (an older operator): taken as this job's, as it always was.
        whose = owner_of(
            made_by_us=True,
            claim_uid=owner or owner_uid,
            claim_key=None,
            job_key=("", spec.name),
            job_uid=owner_uid,
        )
        if whose != Owner.MINE:
            return PoolError(
                spec.slice_index,
                spec.name,
                CODE_OWNED_BY_OTHER,
                f"node pool {spec.name} exists and belongs to job uid {owner} (a previous job of "
                "the same name); delete it, then create again",
                False,
            )
        log.info(
            "gke create adopted pool=%s slice=%d status=%s uid=%s",
            spec.name,
            spec.slice_index,
            existing.status.name,
            owner_uid,
        )
        return None

    # -- Provisioner: delete --------------------------------------------------------------------

    async def delete(self, plan: Plan, pool_names: list[str]) -> ActionResult:
        """Start deleting pools concurrently; missing ones, or ones being deleted, are success."""
        slices = {p.name: p.slice_index for p in plan.pools}
        errors = await asyncio.gather(*(self._delete_one(n, slices.get(n)) for n in pool_names))
        return ActionResult(errors=[e for e in errors if e is not None])

    async def delete_named(self, pool_names: list[str]) -> ActionResult:
        """Delete pools known only by name (the garbage collector's orphans)."""
        errors = await asyncio.gather(*(self._delete_one(n, None) for n in pool_names))
        return ActionResult(errors=[e for e in errors if e is not None])

    async def _delete_one(self, name: str, slice_index: int | None) -> PoolError | None:
        self._refused.pop(name, None)
        call = self._request(self._client.delete_node_pool, name=self.pool_path(name))
        try:
            op = await self._mutate("delete_node_pool", call, name)
        except Exception as exc:
            c = classify_exception(exc)
            if c.code == CODE_NOT_FOUND:
                self._ops.pop(name, None)
                log.info("gke delete pool=%s already gone", name)
                return None
            if DELETING_RE.search(c.message) and await self._being_deleted(name):
                log.info("gke delete pool=%s already being deleted", name)
                return None
            log.warning(
                "gke delete failed pool=%s code=%s permanent=%s msg=%r",
                name,
                c.code,
                c.permanent,
                c.message[:300],
            )
            return c.pool_error(name, slice_index)
        self._ops[name] = _OpRecord(
            self.operation_path(op.name), "delete", started=asyncio.get_running_loop().time()
        )
        log.info("gke delete started pool=%s slice=%s op=%s", name, slice_index, op.name)
        return None

    async def _being_deleted(self, name: str) -> bool:
        """Whether this pool is gone or STOPPING. "Operation ... is currently deleting a node pool
        for cluster C" names the cluster's running operation, which may be another pool's
        delete (terraform-provider-google#10366): it proves nothing about this pool."""
        call = self._request(self._client.get_node_pool, name=self.pool_path(name))
        try:
            pool = await self._call("get_node_pool", call, name)
        except Exception as exc:
            return classify_exception(exc).code == CODE_NOT_FOUND
        return bool(pool.status == cs.NodePool.Status.STOPPING)

    # -- Provisioner: observe_gang --------------------------------------------------------------

    async def observe_gang(self, plan: Plan, max_age: float = 0.0) -> GangObservation:
        """One ``list_node_pools`` call mapped to every pool of the plan (ABSENT when missing).

        When the list call fails, ``pools`` is empty and ``errors`` holds the failure: the state
        is unknown then, not absent, and the caller must not act on it.
        """
        obs = GangObservation()
        try:
            listed = {p.name: p for p in await self._list_pools(max_age)}
        except Exception as exc:
            c = classify_exception(exc)
            self._log_failure("observe", plan, "", c)
            obs.errors.append(c.pool_error("", None))
            obs.complete = False
            return obs
        await self._poll_operations(plan, listed)
        for spec in plan.pools:
            obs.pools[spec.name] = self._observation(spec, listed.get(spec.name))
            err = obs.pools[spec.name].error
            if err is not None:
                obs.errors.append(err)
        return obs

    def _observation(self, spec: NodePoolSpec, pool: cs.NodePool | None) -> PoolObservation:
        record = self._ops.get(spec.name)
        if pool is None:
            if record is not None and record.kind == "delete":
                self._ops.pop(spec.name, None)  # the delete finished
                record = None
            error = record.error if record is not None else self._refused.get(spec.name)
            pending = record is not None and not record.done
            return PoolObservation(
                spec.name,
                spec.slice_index,
                PoolState.ABSENT,
                error=error,
                operation_pending=pending,
            )
        return _map_pool(pool, spec.slice_index, record)

    async def _poll_operations(self, plan: Plan, listed: Mapping[str, cs.NodePool]) -> None:
        """Read the operations worth reading: creates whose pool is absent or in error."""
        wanted: dict[str, _OpRecord] = {}
        for spec in plan.pools:
            record = self._ops.get(spec.name)
            if record is None or record.done or record.kind != "create":
                continue
            pool = listed.get(spec.name)
            status = pool.status.name if pool is not None else "ABSENT"  # GKE's names
            if status == "RUNNING":
                self._ops.pop(spec.name, None)  # nothing left to learn from it
            elif status in ("ABSENT", "ERROR", "RUNNING_WITH_ERROR"):
                wanted[spec.name] = record
        if not wanted:
            return
        try:
            ops = await self._read_operations([r.path for r in wanted.values()])
        except Exception as exc:  # enrichment only: the pool status still tells the story
            c = classify_exception(exc)
            log.warning("gke operation poll failed code=%s msg=%r", c.code, c.message[:200])
            return
        slices = {p.name: p.slice_index for p in plan.pools}
        for name, record in wanted.items():
            op = ops.get(record.path)
            if op is not None:
                _apply_operation(record, op, name, slices.get(name))

    async def _read_operations(self, paths: list[str]) -> dict[str, cs.Operation]:
        if len(paths) == 1:
            call = self._request(self._client.get_operation, name=paths[0])
            op = await self._call("get_operation", call)
            return {paths[0]: op}
        parent = f"projects/{self.project}/locations/{self.location}"
        call_list = self._request(self._client.list_operations, parent=parent)
        response = await self._call("list_operations", call_list)
        return {self.operation_path(o.name): o for o in response.operations}

    # -- Provisioner: check_offered -------------------------------------------------------------

    async def check_offered(self, plan: Plan) -> PoolError | None:
        """A permanent error when no node zone offers the plan's accelerator type.

        Cloud TPU ``list_accelerator_types`` per zone, cached ``offered_ttl_s``. When the check
        itself fails, None (an availability check must not block provisioning) and a log line.
        """
        too_old = await self._check_version(plan)
        if too_old is not None:
            return too_old
        wanted = plan.shape.accelerator
        if not plan.shape.generation.cloud_tpu_api:
            # tpu7x has no Cloud TPU API ("not supported on TPU7x and later", Cloud TPU "Create
            # Cloud TPU VMs"): acceleratorTypes never lists it; GKE's create answers instead.
            return None
        offered: dict[str, frozenset[str]] = {}
        zones = sorted({p.zone for p in plan.pools if p.zone}) or self.node_locations
        for zone in zones:
            types = await self._offered_types(zone)
            if types is None:
                return None
            if wanted in types:
                return None
            offered[zone] = types
        message = f"{wanted} is not offered in zone(s) {', '.join(zones)}; " + (
            "; ".join(f"{z} offers {_describe_offered(wanted, t)}" for z, t in offered.items())
        )
        log.warning("gke accelerator not offered accelerator=%s zones=%s", wanted, list(offered))
        return PoolError(None, "", CODE_NOT_OFFERED, message, True)

    async def _check_version(self, plan: Plan) -> PoolError | None:
        """A permanent error when the cluster's GKE version cannot run the plan's generation
        (tpu7x: 1.34.0-gke.2201000) or its flex-start pools (GKE "About flex-start": TPUs from
        1.33.0-gke.1712000). None when it can, or when the version cannot be read."""
        gen = plan.shape.generation
        flex = any(p.flex_start for p in plan.pools)
        needs = [(gen.min_gke, f"{gen.name} node pools")] if gen.min_gke else []
        if flex and gen.flex_start_min_gke:
            needs.append((gen.flex_start_min_gke, f"flex-start {gen.name} node pools"))
        if not needs:
            return None
        version = await self._master_version()
        if not version:
            return None
        for minimum, what in needs:
            if minimum and not catalog.gke_at_least(version, minimum):
                message = (
                    f"cluster {self.cluster} runs GKE {version}; {what} need "
                    f"{minimum} or later: upgrade the cluster (or its release channel)"
                )
                return PoolError(None, "", CODE_GKE_VERSION, message, True)
        return None

    async def _master_version(self) -> str | None:
        cached = self._cluster_version
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        call = self._request(self._client.get_cluster, name=self.cluster_path)
        try:
            cluster = await self._call("get_cluster", call)
        except Exception as exc:  # a version check must not block provisioning
            c = classify_exception(exc)
            log.warning("gke version check skipped code=%s msg=%r", c.code, c.message[:200])
            return None
        version = str(cluster.current_master_version)
        self._cluster_version = (time.monotonic() + self.offered_ttl_s, version)
        return version

    async def _offered_types(self, zone: str) -> frozenset[str] | None:
        cached = self._offered.get(zone)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        parent = f"projects/{self.project}/locations/{zone}"

        def fetch() -> frozenset[str]:
            client = self._tpu()
            pager = self._request(client.list_accelerator_types, parent=parent)()
            return frozenset(t.type_ for t in pager)

        try:
            types = await self._call("list_accelerator_types", fetch)
        except Exception as exc:
            c = classify_exception(exc)
            log.warning(
                "gke accelerator check skipped zone=%s code=%s msg=%r",
                zone,
                c.code,
                c.message[:200],
            )
            return None
        self._offered[zone] = (time.monotonic() + self.offered_ttl_s, types)
        return types

    def _tpu(self) -> tpu_v2.TpuClient:
        if self._tpu_client is None:
            self._tpu_client = tpu_v2.TpuClient(**self._client_args)
            _widen_connection_pool(self._tpu_client, self._max_concurrency)
        return self._tpu_client

    # -- Provisioner: list_owned ----------------------------------------------------------------

    async def list_owned(self, max_age: float = 0.0) -> list[PoolObservation]:
        """Every pool of the cluster labelled managed-by this operator, as :class:`OwnedPool`.

        Raises the client's exception when the list call fails (the GC retries next round).
        """
        pools = await self._list_pools(max_age)
        owned: list[PoolObservation] = []
        for pool in pools:
            if not _is_managed(pool):
                continue
            record = self._ops.get(pool.name)
            base = _map_pool(pool, _slice_of(pool), record)
            labels = dict(pool.config.labels)
            owned.append(
                OwnedPool(
                    **{f: getattr(base, f) for f in PoolObservation.__dataclass_fields__},
                    namespace=labels.get(keys.JOB_NAMESPACE),
                    job_name=labels.get(keys.JOB_NAME),
                    job_key=labels.get(keys.JOB_KEY),
                    machine_type=pool.config.machine_type,
                    locations=tuple(pool.locations),
                )
            )
        return owned

    # -- logging --------------------------------------------------------------------------------

    @staticmethod
    def _log_failure(what: str, plan: Plan, pool: str, c: Classified) -> None:
        level = logging.ERROR if c.permanent else logging.WARNING
        log.log(
            level,
            "gke %s failed job=%s/%s pool=%s code=%s permanent=%s msg=%r",
            what,
            plan.namespace,
            plan.name,
            pool,
            c.code,
            c.permanent,
            c.message[:300],
        )


# --------------------------------------------------------------------------------------------
# Mapping helpers

# The listing asks only for what the helpers below read (Google APIs' response field mask, a
# system parameter of every Google API): a 256-pool listing is about 160 KB instead of 530,
# its protobuf parse a third to a half of the CPU (benchmarks/gke_listing.py). A field read
# from a listed pool must be named here; tests/unit/test_gke_listing.py fails otherwise.
FIELD_MASK_HEADER = "x-goog-fieldmask"
LISTED_POOL_FIELDS = (
    "nodePools(name,status,statusMessage,initialNodeCount,locations,autoscaling.maxNodeCount,"
    "config(labels,resourceLabels,machineType,flexStart,maxRunDuration))"
)


def _widen_connection_pool(client: Any, size: int) -> None:
    # The REST transport's requests session keeps 10 connections per host by default; concurrent
    # creates of a large gang would otherwise open and drop connections ("pool is full").
    session = getattr(getattr(client, "_transport", None), "_session", None)
    if isinstance(session, requests.Session):
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=size)
        session.mount("https://", adapter)
        session.mount("http://", adapter)


def _is_managed(pool: cs.NodePool) -> bool:
    labels = pool.config.labels
    resource = pool.config.resource_labels
    return (
        labels.get(keys.NODE_MANAGED_BY) == keys.MANAGED_BY_VALUE
        # pools created before node labels left the kubernetes.io namespace
        or labels.get(keys.MANAGED_BY) == keys.MANAGED_BY_VALUE
        or resource.get(RL_MANAGED_BY) == gce_label_value(keys.MANAGED_BY_VALUE)
    )


def resolve_node_locations(location: str, node_locations: Iterable[str] | None) -> list[str]:
    """The zones for TPU pools: as given, else a zonal cluster's own zone."""
    zones = [z for z in (node_locations or []) if z]
    if zones:
        return zones
    if not _ZONE_RE.match(location):
        raise ValueError(
            f"cluster location {location!r} is a region: give node_locations (one zone)"
        )
    return [location]


def _slice_of(pool: cs.NodePool) -> int | None:
    raw = pool.config.labels.get(keys.SLICE) or pool.config.resource_labels.get(RL_SLICE)
    return int(raw) if raw and raw.isdigit() else None


def _map_pool(
    pool: cs.NodePool, slice_index: int | None, record: _OpRecord | None
) -> PoolObservation:
    status = _STATE.get(pool.status.name, PoolState.UPDATING)
    error: PoolError | None = None
    if status in (PoolState.FAILED, PoolState.DEGRADED):
        if record is not None and record.error is not None:
            error = record.error
        else:
            gke_status = pool.status.name
            message = pool.status_message or f"node pool is {gke_status} (GKE gave no message)"
            code, permanent = classify_message(message)
            error = PoolError(slice_index, pool.name, code, message, permanent)
    elif record is not None and record.error is not None and status == PoolState.CREATING:
        error = record.error
    labels = pool.config.labels
    owner = labels.get(keys.JOB_UID) or pool.config.resource_labels.get(RL_JOB_UID)
    pending = status in (PoolState.CREATING, PoolState.DELETING, PoolState.UPDATING) or (
        record is not None and not record.done
    )
    flex = bool(pool.config.flex_start)
    sized = pool.autoscaling.max_node_count if flex else pool.initial_node_count
    duration = pool.config.max_run_duration.seconds if flex else 0
    return PoolObservation(
        name=pool.name,
        slice_index=slice_index,
        status=status,
        node_count=sized * max(1, len(pool.locations)),
        owner_uid=owner or None,
        error=error,
        operation_pending=pending,
        waits_for_capacity=flex,
        max_run_duration_s=int(duration) or None,
    )


def _policy_mismatch(want: WorkloadPolicySpec, found: Any) -> PoolError | None:
    """A permanent error when an existing policy of the wanted name cannot place the slices:
    another type or accelerator topology (cluster-toolkit#6274: an incompatible policy under the
    canonical name otherwise fails later, at MIG scale-up, with an obscure 400)."""
    policy = found.workload_policy
    if policy.type_ == WORKLOAD_POLICY_TYPE and policy.accelerator_topology == (
        want.accelerator_topology
    ):
        return None
    message = (
        f"workload policy {want.name} in {want.region} has type {policy.type_ or 'none'} and "
        f"accelerator topology {policy.accelerator_topology or 'none'}; the slices need "
        f"{WORKLOAD_POLICY_TYPE} with {want.accelerator_topology}: delete that policy (gcloud "
        f"compute resource-policies delete {want.name} --region {want.region}) so the operator "
        "can create it"
    )
    return PoolError(None, want.name, CODE_WORKLOAD_POLICY, message, True)


def _policy_not_ready(want: WorkloadPolicySpec, found: Any) -> PoolError | None:
    """A transient error while the policy's insert (ours, or another job's that won the race and
    made ours 409 alreadyExists) is still running: its pools wait for the next pass."""
    status = getattr(found.status, "name", str(found.status or ""))
    if status in ("", "READY"):
        return None
    message = f"workload policy {want.name} in {want.region} is {status}: waiting for it"
    return PoolError(None, want.name, CODE_CONFLICT, message, False)


def _wait_region_operation(
    operations: Any, project: str, region: str, name: str, timeout_s: float
) -> Classified | None:
    """Poll a Compute Engine region operation until DONE (blocking, bounded): its error, a
    transient 'still running' past ``timeout_s``, or None when it succeeded."""
    deadline = time.monotonic() + timeout_s
    while True:
        op = operations.get(project=project, region=region, operation=name, timeout=timeout_s)
        if getattr(op.status, "name", str(op.status)) == "DONE":
            if op.error and op.error.errors:
                first = op.error.errors[0]
                message = f"{first.code}: {first.message}"
                code, permanent = classify_message(message)
                return Classified(code, message, permanent, False)
            return None
        if time.monotonic() >= deadline:
            return Classified(CODE_UNAVAILABLE, f"operation {name} still running", False, False)
        time.sleep(0.2)


def _apply_operation(
    record: _OpRecord, op: cs.Operation, pool: str, slice_index: int | None
) -> None:
    if op.status != cs.Operation.Status.DONE:
        return
    record.done = True
    message = op.error.message or op.status_message
    if message:
        code, permanent = classify_message(message, op.error.code or None)
        record.error = PoolError(slice_index, pool, code, message, permanent)
        log.info("gke operation failed pool=%s op=%s code=%s", pool, op.name, code)


def _describe_offered(wanted: str, types: frozenset[str]) -> str:
    family = wanted.rsplit("-", 1)[0]
    same = sorted(
        (t for t in types if t.rsplit("-", 1)[0] == family),
        key=lambda t: int(t.rsplit("-", 1)[1]) if t.rsplit("-", 1)[1].isdigit() else 0,
    )
    if same:
        return f"{family} sizes {', '.join(same)}"
    families = sorted({t.rsplit("-", 1)[0] for t in types})
    return f"no {family}; families {', '.join(families) or 'none'}"


__all__ = [
    "GkeMetadata",
    "GkeProvisioner",
    "MetadataError",
    "OwnedPool",
    "RetryPolicy",
    "read_gke_metadata",
]
