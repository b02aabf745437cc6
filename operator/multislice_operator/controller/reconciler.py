"""One reconcile pass for one job: observe -> decide (pure) -> apply -> write the status.

Nothing here decides: what to do, and what to say, is decide()'s. This module reads the world into
plain observations, hands the actions to their appliers and writes the status decide() returned,
only when it changed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from multislice_operator.api.models import (
    MultisliceJobSpec,
    MultisliceJobStatus,
    Phase,
    RestartCause,
)
from multislice_operator.common import keys
from multislice_operator.common.errors import FieldError, SpecError
from multislice_operator.common.names import preflight_job
from multislice_operator.common.ownership import Owner, owner_of
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.controller import appliers, kueue, metrics
from multislice_operator.controller import observe as ob
from multislice_operator.controller.kube import ApiError, NotFound, retry_after
from multislice_operator.controller.runtime import JobKey, Runtime, template_key
from multislice_operator.planning.plan import Plan, load_job, plan_job
from multislice_operator.provisioning.base import GangObservation
from multislice_operator.reconcile import (
    Decision,
    JobMeta,
    Observed,
    RemoveFinalizer,
    checkpoint,
    decide,
    goodput,
    scheduling,
)
from multislice_operator.reconcile.multikueue import prebuilt_name
from multislice_operator.reconcile.reasons import SLICE_FAILURE_REASONS, Reason
from multislice_operator.reconcile.types import PreflightObservation, QueueObservation
from multislice_operator.registry import REGISTRY
from multislice_operator.render import podsecurity
from multislice_operator.render.jobset import render_pod_template

log = logging.getLogger("multislice_operator")

# Exported at 0 before the first failure (per namespace, from its first pass): every label set
# the registry can produce.
for _info in SLICE_FAILURE_REASONS.values():
    for _cause in _info.causes:
        if _info.metric:  # always, in this registry
            metrics.SLICE_FAILURES_TOTAL.preset(_info.metric, _cause)
for _restart in RestartCause:
    metrics.RESTARTS_TOTAL.preset(_restart.value)
for _source in checkpoint.SOURCES:
    metrics.CHECKPOINT_REQUESTS_TOTAL.preset(_source)

ERROR_BACKOFF_BASE, ERROR_BACKOFF_MAX = 2.0, 300.0
LEASES_RETRY = 300.0  # node Leases refused (RBAC): asked again after this long
# The node pool listing is shared by every job and kept up to a resync. A pass that sees a pool's
# nodes all Ready while that listing still says the pool is being created asks for one at most
# this old (shared too: at most two listings a second while it lasts), instead of waiting out the
# resync for Provisioned (about 1 s more in 2 of 5 gang benchmarks at 256 slices; 10 s by default).
FRESH_LISTING_SECONDS = 0.5


class ObservationError(RuntimeError):
    """The cloud could not be read; act on nothing and look again shortly."""


@dataclass
class Parsed:
    job: Any
    plan: Plan | None
    error: SpecError | None


def parse_cached(rt: Runtime, key: JobKey, body: dict[str, Any]) -> Parsed:
    """parse(), once per spec generation (and labels, and the option a provisioning.mode
    Fallback job tries: its plan is that option's): a resync or a status echo re-plans
    nothing."""
    meta = body.get("metadata") or {}
    labels = tuple(sorted((meta.get("labels") or {}).items()))
    option = ((body.get("status") or {}).get("fallback") or {}).get("option")
    version = (meta.get("uid"), meta.get("generation"), labels, option)
    cached = rt.parsed.get(key)
    if cached is not None and cached[0] == version and isinstance(cached[1], Parsed):
        return cached[1]
    parsed = parse(body)
    rt.parsed[key] = (version, parsed)
    return parsed


def parse(body: dict[str, Any]) -> Parsed:
    try:
        job = load_job(body)
        return Parsed(job, plan_job(job), None)
    except SpecError as exc:
        return Parsed(None, None, exc)
    except Exception as exc:  # a body no model can read still gets a status, not a crash
        return Parsed(None, None, SpecError([FieldError("spec", str(exc))]))


def job_meta(body: dict[str, Any]) -> JobMeta:
    meta = body.get("metadata") or {}
    created = meta.get("creationTimestamp")
    return JobMeta(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        creation_time=datetime.fromisoformat(created.replace("Z", "+00:00")) if created else None,
        labels=dict(meta.get("labels") or {}),
        # Ours only (a checkpoint request), not kubectl's last-applied copy of the whole job.
        annotations={
            k: str(v)
            for k, v in (meta.get("annotations") or {}).items()
            if k.startswith(f"{keys.PREFIX}/")
        },
        deleting=bool(meta.get("deletionTimestamp")),
        has_finalizer=keys.FINALIZER in (meta.get("finalizers") or []),
    )


def _jobset(rt: Runtime, key: JobKey) -> dict[str, Any] | None:
    indexed: dict[str, Any] | None = ob.first(rt.indexes.jobsets, key)
    if indexed is not None:
        rt.created_jobsets.pop(key, None)  # the watch caught up
    jobset = indexed or rt.strangers.get(key) or rt.created_jobsets.get(key)
    if jobset is None:
        rt.deleted_jobsets.discard(key)
    elif key in rt.deleted_jobsets:  # deleted by us; the watch has not caught up yet
        rt.created_jobsets.pop(key, None)
        jobset = {**jobset, "deleting": True}
    return jobset


def _watched(rt: Runtime, namespace: str | None) -> bool:
    patterns = rt.settings.namespaces
    return bool(namespace) and (
        not patterns or any(fnmatch.fnmatch(str(namespace), p) for p in patterns)
    )


class _LiveJobs(Mapping[JobKey, str]):
    """The uid of every job this operator watches, read from the store only when asked."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def __getitem__(self, key: JobKey) -> str:
        body = self.rt.store.get(key) if _watched(self.rt, key[0]) else None
        uid = ((body or {}).get("metadata") or {}).get("uid")
        if not uid:
            raise KeyError(key)
        return str(uid)

    def __iter__(self) -> Iterator[JobKey]:
        return (k for k in self.rt.store.bodies if _watched(self.rt, k[0]))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _owner(rt: Runtime, key: JobKey, meta: JobMeta, pool: Any) -> ob.PoolOwner:
    """Who a pool of one of our names belongs to, when its owner uid is not ours."""
    ns, name = getattr(pool, "namespace", None), getattr(pool, "job_name", None)
    job = f"{ns}/{name}"
    claim = (ns, name) if ns and name else None
    # A namespace this operator does not watch is another install's: it cannot tell.
    live = _LiveJobs(rt) if claim is None or _watched(rt, ns) else None
    whose = owner_of(
        made_by_us=True,
        claim_uid=pool.owner_uid,
        claim_key=claim,
        job_key=key,
        job_uid=meta.uid,
        live_jobs=live,
    )
    if whose == Owner.ORPHAN:
        return ob.PoolOwner(job, older=False, gone=True)
    other = rt.store.get(claim) if claim else None
    theirs = job_meta(other) if other else None
    if theirs is None or theirs.creation_time is None or meta.creation_time is None:
        return ob.PoolOwner(job, older=True, gone=False)  # cannot be told: never touched
    older = (theirs.creation_time, theirs.uid) <= (meta.creation_time, meta.uid)
    return ob.PoolOwner(job, older=older, gone=False)


async def _ownership(
    rt: Runtime, key: JobKey, meta: JobMeta, plan: Plan | None
) -> tuple[dict[str, PoolState], dict[str, ob.PoolOwner]]:
    """Pools labelled with this job's uid that the plan does not name (strays, released), and
    the owners of pools that have the plan's names but another owner (never deleted if live)."""
    own = plan is not None and bool(plan.pools)
    if rt.provisioner is None or not (own or meta.has_finalizer):
        return {}, {}  # a job that never had pools of its own never had a pool
    try:
        owned = await rt.provisioner.list_owned(max_age=rt.cfg.resync_seconds)
    except Exception as exc:  # the same shared listing observe_gang() reads: unknown, not absent
        raise ObservationError(f"node pools unknown: {exc}") from exc
    names = {p.name for p in plan.pools} if plan is not None else set()
    strays: dict[str, PoolState] = {}
    owners: dict[str, ob.PoolOwner] = {}
    for pool in owned:
        if pool.name in names:
            if pool.owner_uid and pool.owner_uid != meta.uid:
                owners[pool.name] = _owner(rt, key, meta, pool)
        elif pool.owner_uid and pool.owner_uid == meta.uid:
            strays[pool.name] = pool.status
    return strays, owners


async def _pod_security(
    rt: Runtime, key: JobKey, plan: Plan, spec: MultisliceJobSpec
) -> str | None:
    """Whether the namespace's Pod Security level refuses the job's pods (render/podsecurity.py):
    read only before the first pool, for pods that share a host namespace (host network, the
    default); the namespace's labels are cached briefly. Unknown (no RBAC, an error) is None."""
    pod = render_pod_template(plan, spec)["spec"]
    if not any(pod.get(f) for f in podsecurity.HOST_NAMESPACES):
        return None
    labels = rt.namespace_labels(key[0])
    if labels is None:
        try:
            ns = await rt.kube.get_namespace(key[0])
        except ApiError as exc:
            log.warning("namespace %s not readable (Pod Security not checked): %s", key[0], exc)
            return None
        labels = dict(((ns or {}).get("metadata") or {}).get("labels") or {})
        rt.remember_namespace_labels(key[0], labels)
    return podsecurity.refusal(key[0], labels, pod)


async def _missing_priority_class(rt: Runtime, spec: MultisliceJobSpec) -> str | None:
    """The PriorityClass the template names, when there is none of that name (the apiserver's
    Priority admission refuses every pod then: the Job controller's creates fail after the whole
    gang was provisioned). Read only before the first pool, once per name for all jobs (cached
    briefly). Unknown (no RBAC, an error) is None."""
    pod = spec.template.get("spec") or {}
    name = pod.get("priorityClassName") if isinstance(pod, dict) else None
    if not name or not isinstance(name, str):
        return None
    exists = rt.priority_class_exists(name)
    if exists is None:
        try:
            exists = await rt.kube.get_priority_class(name) is not None
        except ApiError as exc:
            log.warning("PriorityClass %s not readable (not checked): %s", name, exc)
            return None
        rt.remember_priority_class(name, exists)
    return None if exists else name


async def _workload_priority(rt: Runtime, q: QueueObservation, name: str) -> QueueObservation:
    """The WorkloadPriorityClass's value for the Workload the operator is about to create (as
    jobframework resolves it: Kueue orders and preempts by the value); read once per name for
    all jobs, briefly cached."""
    seen, value = rt.workload_priority(name)
    if not seen:
        found = await rt.kube.get_workload_priority_class(name)
        value = int(found.get("value") or 0) if found is not None else None
        rt.remember_workload_priority(name, value)
    if value is None:
        return dataclasses.replace(q, missing_priority_class=name)
    return dataclasses.replace(q, priority=value)


async def _preflight(rt: Runtime, key: JobKey, meta: JobMeta) -> PreflightObservation | None:
    """The job's compile Job (spec.preflight), and its pod once it finished (the termination
    message): read, not watched, while the job holds no capacity (decide() polls)."""
    job = await rt.kube.get_batch_job(key[0], preflight_job(key[1]))
    if job is None:
        return None
    finished = any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )
    uid = str((job.get("metadata") or {}).get("uid", ""))
    pods = await rt.kube.list_pods(key[0], f"{ob.JOB_CONTROLLER_UID}={uid}") if finished else []
    return ob.preflight_observation(job, pods, meta.uid)


async def _node_leases(rt: Runtime) -> dict[str, float] | None:
    """The node Leases' renewTimes (the kubelets' heartbeats, Unix seconds), listed once for
    every job at most once a resync; None when they cannot be read (no RBAC: then heartbeats are
    not judged, and the listing is tried again only after LEASES_RETRY seconds)."""
    cached = rt.node_leases
    fresh = rt.cfg.resync_seconds if cached is None or cached[1] is not None else LEASES_RETRY
    if cached is not None and time.monotonic() - cached[0] < fresh:
        return cached[1]
    async with rt.node_leases_lock:  # one listing in flight; the others take its answer
        if rt.node_leases is not cached and rt.node_leases is not None:
            return rt.node_leases[1]
        leases: dict[str, float] | None
        try:
            renewed = await rt.kube.list_node_leases()
            leases = {n: t.timestamp() for n, s in renewed.items() if (t := ob.parse_time(s))}
        except ApiError as exc:
            log.warning("node Leases not readable (node heartbeats not checked): %s", exc)
            leases = None
        rt.node_leases = (time.monotonic(), leases)
    return leases


async def _listing(rt: Runtime, plan: Plan, max_age: float) -> GangObservation | None:
    """The plan's own pools as the cloud lists them, at most `max_age` seconds old (None: no
    pool of its own, or no GKE cluster configured); unknown: an ObservationError."""
    if not plan.pools or rt.provisioner is None:
        return None
    gang = await rt.provisioner.observe_gang(plan, max_age=max_age)
    if not gang.complete:
        raise ObservationError(f"node pools unknown: {'; '.join(map(str, gang.errors))}")
    return gang


async def _pools(rt: Runtime, plan: Plan, gang: GangObservation | None, nodes: ob.Nodes
                 ) -> tuple[GangObservation | None, PoolError | None]:  # fmt: skip
    """The listing, fresh where it is behind `nodes` (the node index as decide() trusts it:
    ob.with_heartbeats), and whether the plan's accelerator is offered (None, None: no pool of
    its own, or no GKE cluster configured)."""
    if gang is None or rt.provisioner is None:
        return None, None
    if ob.listing_behind_nodes(plan, gang, nodes):
        gang = await _listing(rt, plan, FRESH_LISTING_SECONDS) or gang
    return gang, await rt.provisioner.check_offered(plan)  # cached by the provisioner


async def _queue(rt: Runtime, key: JobKey, body: dict[str, Any], meta: JobMeta) -> Any:
    """What Kueue says of a job that names a queue (None: it names none)."""
    queue = meta.labels.get(keys.KUEUE_QUEUE_NAME)
    if not queue:
        return None
    prebuilt = prebuilt_name(meta.labels, (body.get("metadata") or {}).get("annotations") or {})
    seen = kueue.queue_observation(rt, key, queue, meta.uid, prebuilt)
    priority = meta.labels.get(keys.KUEUE_PRIORITY_CLASS)
    if priority and seen.watching and seen.workload is None:
        seen = await _workload_priority(rt, seen, priority)
    return seen


async def _before_first_pool(rt: Runtime, key: JobKey, plan: Plan, spec: MultisliceJobSpec,
                             meta: JobMeta, observed: Observed) -> None:  # fmt: skip
    """Before the first pool: what refuses every pod fails the job at once (read only then)."""
    if observed.jobset is not None and observed.jobset.owned:
        return
    if plan.pools and any(s.pool_state != PoolState.ABSENT for s in observed.slices):
        return
    observed.pod_security = await _pod_security(rt, key, plan, spec)
    observed.missing_priority_class = await _missing_priority_class(rt, spec)
    observed.scheduler_absent = rt.scheduler_absent(scheduling.scheduler_name(spec))
    if spec.preflight is not None:
        observed.preflight = await _preflight(rt, key, meta)


async def observe_job(
    rt: Runtime, key: JobKey, body: dict[str, Any], plan: Plan, spec: MultisliceJobSpec
) -> Observed:
    meta = job_meta(body)
    now = datetime.now(UTC)
    listed = await _listing(rt, plan, rt.cfg.resync_seconds)  # the cloud unknown: no further
    # A Ready node whose kubelet went quiet is not Ready (its heartbeats stalled).
    nodes, stale = ob.with_heartbeats(rt.indexes.nodes, await _node_leases(rt), now)
    gang, offered = await _pools(rt, plan, listed, nodes)
    strays, owners = await _ownership(rt, key, meta, plan)
    template = ((body.get("spec") or {}).get("template") or {}).get("spec") or {}
    inputs = ob.ObserveInputs(
        plan,
        meta.uid,
        nodes,
        gang,
        owners,
        template.get("nodeSelector") or {},
        rt.indexes.watched,
    )
    observed = ob.assemble(
        inputs,
        now,
        _jobset(rt, key),
        ob.items(rt.indexes.pods, key),
        provisioner_configured=rt.provisioner is not None,
        offered_error=offered,
        admission=rt.admission_of(key, meta.uid, meta.generation, template_key(body)),
        strays=strays,
        blind_since=rt.blind_since(key),
    )
    observed.support = rt.support
    observed.pod_groups = bool(rt.pod_groups)
    observed.scheduler_working = rt.scheduler_working(scheduling.scheduler_name(spec))
    observed.stale_nodes = tuple(n for s in observed.slices for n in stale.get(str(s.pool), ()))
    observed.queue = await _queue(rt, key, body, meta)
    if observed.queue is not None:
        observed.kueue_problem = rt.kueue_problem
    await _before_first_pool(rt, key, plan, spec, meta, observed)
    return observed


async def reconcile(rt: Runtime, key: JobKey, errors: int = 0) -> float | None:
    """One pass; the delay before the next (None: nothing left to look at). Never raises."""
    body = rt.store.get(key)
    if body is None:
        return None
    started = time.perf_counter()
    try:
        decision = await _reconcile(rt, key, body)
    except ObservationError as exc:
        delay = min(ERROR_BACKOFF_MAX, ERROR_BACKOFF_BASE * 2.0**errors)
        log.warning("observe failed job=%s/%s retry_in=%.0fs error=%s", *key, delay, exc)
        metrics.RECONCILE_TOTAL.labels("error").inc()
        return -delay  # negative: an error delay, the caller counts consecutive errors
    except ApiError as exc:  # the apiserver said no for now (429, 5xx, 409...): no traceback
        delay = min(ERROR_BACKOFF_MAX, ERROR_BACKOFF_BASE * 2.0**errors)
        # An overloaded apiserver's 429 says when to come back: not sooner.
        delay = min(ERROR_BACKOFF_MAX, max(delay, retry_after(exc) or 0.0))
        log.warning(
            "kubernetes call failed job=%s/%s retry_in=%.0fs status=%s error=%s",
            *key,
            delay,
            exc.status,
            exc,
        )
        metrics.RECONCILE_TOTAL.labels("error").inc()
        return -delay
    except Exception as exc:  # the operator must keep serving every other job
        delay = min(ERROR_BACKOFF_MAX, ERROR_BACKOFF_BASE * 2.0**errors)
        log.exception("reconcile failed job=%s/%s retry_in=%.0fs error=%s", *key, delay, exc)
        metrics.RECONCILE_TOTAL.labels("error").inc()
        return -delay
    finally:
        metrics.RECONCILE_TIME.observe(time.perf_counter() - started)
    metrics.RECONCILE_TOTAL.labels("success").inc()
    for why in decision.violations:  # a bug in decide(): the action was dropped
        log.error("invariant violated, action dropped job=%s/%s: %s", *key, why)
    return decision.requeue_after


async def _reconcile(rt: Runtime, key: JobKey, body: dict[str, Any]) -> Decision:
    parsed = parse_cached(rt, key, body)
    meta = job_meta(body)
    raw_old = dict(body.get("status") or {})
    old = MultisliceJobStatus.from_dict(raw_old)
    if parsed.plan is None:
        # No plan, but the job's own pools (by uid) and JobSet are still known and released.
        strays, _ = await _ownership(rt, key, meta, None)
        js = ob.jobset_observation(_jobset(rt, key), key, meta.uid)
        obs = Observed(
            now=datetime.now(UTC), strays=strays, jobset=js, blind_since=rt.blind_since(key)
        )
        decision = decide(meta, None, None, parsed.error, old, obs, rt.cfg)
    else:
        obs = await observe_job(rt, key, body, parsed.plan, parsed.job.spec)
        decision = decide(meta, parsed.job.spec, parsed.plan, None, old, obs, rt.cfg)
        _learn_scheduler(rt, key, parsed.job.spec, old, obs, decision)
    target = appliers.Target(body, parsed.job, parsed.plan)
    if meta.deleting and not meta.has_finalizer:
        await appliers.apply(rt, target, decision.actions)
        return decision  # going away with nothing of ours attached: nothing to write
    # Our finalizer comes off in this pass: the job goes (its DELETED event may be handled while
    # this pass still runs), so nothing of it is stored, tracked or counted again.
    gone = meta.deleting and any(isinstance(a, RemoveFinalizer) for a in decision.actions)
    # The status first: it says why before anything is done (a verdict's JobSet delete, a new
    # pool), so a crash between the two never loses the reason; the actions then start from the
    # object the write returned (its resourceVersion guards the finalizer patch).
    if not gone:  # a job whose finalizer comes off is gone a moment later: no status to write
        target.body = await _write_status(rt, key, body, raw_old, decision)
    await appliers.apply(rt, target, decision.actions)
    await _post_events(rt, key, target.body, decision)
    if gone or key not in rt.store.bodies:  # deleted while this pass ran: no series comes back
        rt.forget_events(key)
        return decision
    _record_metrics(key, decision)
    _track(rt, key, parsed.plan, decision)
    rt.watched.add(key)
    _record_goodput(key, meta, decision.status, obs.now, parsed.plan)
    return decision


def _learn_scheduler(rt: Runtime, key: JobKey, spec: MultisliceJobSpec,
                     old: MultisliceJobStatus, obs: Observed, d: Decision) -> None:  # fmt: skip
    """What this pass shows of the scheduler the job's pods name, for the jobs that name it
    next: it looked at one of them (it runs), or none within the grace (it does not)."""
    name = scheduling.scheduler_name(spec)
    if any(p.looked_at for p in obs.pods):
        rt.remember_scheduler(name, None)
        return
    was, now = old.condition("Failed"), d.status.condition("Failed")
    fresh = was is None or was.reason != Reason.SCHEDULER_NOT_RUNNING
    failed = now is not None and now.reason == Reason.SCHEDULER_NOT_RUNNING
    # Its own pods' evidence, not this memory's. The cluster's own scheduler is not remembered
    # absent: its outage passes, and no job would be left to show that it did.
    if fresh and failed and obs.scheduler_absent is None and name != scheduling.DEFAULT_SCHEDULER:
        rt.remember_scheduler(name, key)


def _stale(stored: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """Keys the apiserver still has that `new` has not (another field manager's, e.g. a status
    written by an operator before server-side apply): a merge patch of nulls, or None."""
    patch: dict[str, Any] = {}
    for k, v in stored.items():
        if k not in new:
            patch[k] = None
        elif isinstance(v, dict) and isinstance(new[k], dict):
            inner = _stale(v, new[k])
            if inner:
                patch[k] = inner
    return patch or None


async def _write_status(
    rt: Runtime,
    key: JobKey,
    body: dict[str, Any],
    old: dict[str, Any],
    d: Decision,
    record: bool = True,
) -> dict[str, Any]:
    """Apply the status decide() returned when it differs from the stored one (an unchanged
    status costs no write); the job as stored after it."""
    if d.keep_status:
        return body
    new = d.status.to_dict()
    if new == old:
        return body
    try:
        updated = await rt.kube.apply_job_status(key[0], key[1], new)
        stale = _stale(dict(updated.get("status") or {}), new)
        if stale is not None:
            updated = await rt.kube.merge_job_status(key[0], key[1], stale)
    except NotFound:  # deleted meanwhile (our finalizer just came off): nothing to record
        return body
    (updated.get("metadata") or {}).pop("managedFields", None)  # the bulk; never read
    if record:
        rt.store.refresh(updated)
    return updated


async def _post_events(rt: Runtime, key: JobKey, body: dict[str, Any], d: Decision) -> None:
    """After the status write succeeded: the events, a repeat aggregated into its first post
    (count and lastTimestamp, as client-go's event correlator does)."""
    for event in d.events:
        log.info(
            "event job=%s/%s type=%s reason=%s %s", *key, event.type, event.reason, event.message
        )
        seen = rt.event_seen(key, event.type, event.reason, event.message)
        if seen is not None:
            name, count = seen
            if await rt.kube.repeat_event(key[0], name, count + 1):
                rt.event_posted(key, event.type, event.reason, event.message, name, count + 1)
                continue
        posted = await rt.kube.post_event(body, event.type, event.reason, event.message)
        if posted is not None:
            rt.event_posted(key, event.type, event.reason, event.message, posted, 1)


def _track(rt: Runtime, key: JobKey, plan: Plan | None, d: Decision) -> None:
    """Jobs waiting for node pools they do not create (Existing) are woken by node events of
    their shape."""
    waits = plan is not None and REGISTRY.model(plan.mode).waits_for_nodes
    waiting = waits and d.status.phase == Phase.PENDING
    shape = (plan.shape.generation.gke_accelerator, plan.shape.topology) if plan else None
    rt.wait_for_nodes(key, shape if waiting else None)


def _record_metrics(key: JobKey, d: Decision) -> None:
    """The gauges from the status; the counters and histograms by the decision's deltas."""
    new, m = d.status, d.metrics
    metrics.JOBS.set(key, str(new.phase) if new.phase else None)
    maint = new.maintenance
    metrics.MAINTENANCE.set(key, maint.time.timestamp() if maint and maint.time else None)
    metrics.ACTIVE_SLICES.set(key, new.active_slices)
    for label, cause in m.slice_failures:
        metrics.SLICE_FAILURES_TOTAL.labels(label, cause).inc()
    for cause, added in m.restarts.items():
        metrics.RESTARTS_TOTAL.labels(cause).inc(added)
    for source in m.checkpoint_requests:
        metrics.CHECKPOINT_REQUESTS_TOTAL.labels(source).inc()
    if m.gang_attempts:
        metrics.GANG_ATTEMPTS_TOTAL.inc(m.gang_attempts)
    for steps in m.lost_steps:
        metrics.RESTART_LOST_STEPS.observe(steps)
    for seconds in m.recovery_seconds:
        metrics.RESTART_RECOVERY.observe(seconds)
    for elapsed in m.provisioning_seconds:
        metrics.PROVISIONING_DURATION.observe(elapsed)
    for elapsed in m.time_to_running_seconds:
        metrics.TIME_TO_RUNNING.observe(elapsed)


def _record_goodput(
    key: JobKey, meta: JobMeta, st: MultisliceJobStatus, now: datetime, plan: Plan | None
) -> None:
    """The goodput metrics, live as of this pass (the status holds them as of the last change)."""
    if st.goodput is None:
        return
    view = goodput.live(st.goodput, now)
    pools = view.held_chips // plan.pool_chips if plan is not None and plan.pool_chips else 0
    created = meta.creation_time
    fresh = created is not None and created.timestamp() >= int(metrics.PROCESS_START)
    metrics.GOODPUT.update(
        key,
        view.seconds,
        view.chip_seconds,
        (view.chip_goodput, view.wall_goodput),
        (view.held_chips, pools),
        from_zero=fresh,
    )
