"""A state machine over decide() (issue 22): a small world, every decision fed back into it.

The world is what the operator observes of one Managed job of 2 slices: its node pools (create
and delete take time; a create fails: stockout, quota, a permanent error; a pool vanishes: spot
preemption or a delete out of band; nodes vanish or go NotReady; the pool errors; another job's
pool takes one of our names; a stray pool with our uid), its JobSet (restarts charged or not,
completion and failure, as render/jobset.py's failure policy makes JobSet act), the pods of the
current attempt (retryable, fatal, hang and disruption failures), Kueue (quota reserved, this
operator's admission check, admission, preemption), the user (a terminal phase written by hand, the
finalizer removed, suspend, delete) and the operator itself (a restart loses its memory: the
apiserver's dry-run verdict, and it did not watch the job meanwhile; a crash between the status
write and the actions: the status written, none or only the first few of its actions applied,
then a restart; armed, it hits the next pass that ends the job, so that every verdict the
machine reaches is also crashed on).

An elastic job (spec.elastic, minSlices 1: ElasticJob) has the same world, whose JobSet has
its replicas and the restart counters it was created with (CreateJobSet's slices,
restarts_before, counted_before: the observation adds them to its own counters and its pods'
attempts, as controller/observe.py does); a smaller JobSet's slices are placed on the pools that
can take them, one each; a resize delete is in the foreground (its pods terminate, then it is
gone); the workload saves a checkpoint requested on its pods (AnnotatePods) after a while, or
when a rule says so, or never. It starts cold, running, shrunk to 1 slice, or about to grow back.

A pass (`reconcile`; `tick` runs the passes the decisions asked for) is what the shell does
(controller/reconciler.py): observe, decide(), check, write the status (read back through JSON:
the next pass's old status), apply the actions to the world. World changes are seen by the next
pass, together with whatever else changed meanwhile. Checked on every decision:

- the core's invariants of one decision (reconcile/invariants.py, the one checker: decide()
  raises on a broken one in tests, and each is reported by its key); `violations` runs it on a
  decision made elsewhere;
- failed-runs-again: a job the operator failed (it wrote phase Failed with a Failed condition
  whose reason sticks, reasons.py) never creates a pool or its JobSet, resumes, or leaves a
  terminal phase again, whatever happens after (a crash before the verdict's actions, its
  evidence gone, a phase written by hand);
- `resize_violations(plan, old_status, decision, observed)`: the JobSet's slice count and the
  restart counters (elastic or not): sizes within minSlices..slices, all slices first, one
  JobSet at a time, a recreated JobSet continuing the job's counters, a resize delete only when
  the size changes (a grow only after its checkpoint, 300 s, or with nothing running),
  status.restarts never down and restartsByCause adding up to it, no create of a pool that
  exists;
- late verdict: a pool created by a pass is not deleted by the next one unless the world changed
  in between (any rule but a pass or an operator restart; time passing counts as a change);
- fixpoint: a pass without actions leaves the world as it was; deciding again on it (the same
  observation, the time advanced 0 s, the job now watched, the status just written as the old
  status) writes the same status and returns no action and no event.

After every step the world keeps its own promise: a JobSet's pods are its replicas', one pool
each.

The world -> Observed translation is one function, `observed`. `make test` runs a bounded,
derandomized search (MACHINE_EXAMPLES for the Managed job, QUEUED_SHARE and ELASTIC_SHARE of
them for the others; MACHINE_STEPS); `make fuzz` a long one from a fresh seed
(MACHINE_RANDOM=1). Each broken invariant is an exception class of its own, so that hypothesis
reports and shrinks each as a bug of its own.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from multislice_operator.api.models import (
    MultisliceJobSpec,
    MultisliceJobStatus,
    Phase,
    RestartCause,
)
from multislice_operator.common import keys
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.planning.plan import Plan, load_job, plan_job
from multislice_operator.reconcile import (
    AddFinalizer,
    Admission,
    AnnotatePods,
    CheckObservation,
    CheckState,
    CreateJobSet,
    CreatePools,
    CreateWorkload,
    DecideConfig,
    Decision,
    DeleteJob,
    DeleteJobSet,
    DeletePools,
    Event,
    EvictPods,
    FinishWorkload,
    JobMeta,
    JobSetObservation,
    Observed,
    QueueObservation,
    ReclaimPods,
    ReleaseWorkload,
    RemoveFinalizer,
    SetAdmissionCheckState,
    SetJobSetSuspend,
    SetWorkloadActive,
    SliceObservation,
    ValidateJobSet,
    WorkloadObservation,
    decide,
    invariants,
    reasons,
)
from multislice_operator.reconcile import (
    Pod as PodRecord,
)
from multislice_operator.reconcile.elastic import GROW_PREFIX
from multislice_operator.reconcile.elastic import GROW_SAVE_SECONDS as GROW_WAIT
from multislice_operator.reconcile.facts import derive
from multislice_operator.reconcile.reasons import Reason
from tests.unit.jobs import spec_and_plan as plain_job

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings()
SLICES, HOSTS = 2, 4  # 2 x v5litepod-16: 4 hosts (VMs, nodes) per slice
MIN_SLICES = 1  # spec.elastic.minSlices of the elastic job (sizes 2 and 1: dcn.data 2 or 1)
NAMESPACE, NAME, UID = "ns", "job", "uid-1"
QUEUE, CLUSTER_QUEUE, CHECK = "tpu-queue", "tpu-cq", "gang"
TERMINAL = (Phase.SUCCEEDED, Phase.FAILED)
PASSES_PER_TICK = 10
# A suspended JobSet's pods terminate this long (their grace period: the SIGTERM checkpoint),
# well inside the operator's bound (the template's 30 s + STOP_MARGIN_SECONDS).
POD_STOP_SECONDS = 20
HELD = (Phase.QUEUED, Phase.SUSPENDED)
QUEUED_SHARE = 0.4  # of MACHINE_EXAMPLES, for the queued job's machine
ELASTIC_SHARE = 0.3  # of MACHINE_EXAMPLES, for the elastic job's machine

# ---------------------------------------------------------------- the invariants of one decision


def violations(
    meta_before: JobMeta,
    decision: Decision,
    observed: Observed,
    old: MultisliceJobStatus | None = None,
    plan: Plan | None = None,
) -> list[str]:
    """What one decision must never do, whatever branch made it: the core's own invariants
    (reconcile/invariants.py) on a decision made elsewhere, each line starting with the
    invariant's key (`kind(line)`); empty: the decision is sound.

    `meta_before`: the job as the pass read it; `observed`: what the pass saw; `old`: the status
    it read; `plan`: the job's (by default the 2-slice job every test here plans: its pools)."""
    plan = plan or plain_job()[1]
    f = derive(meta_before, None, plan, None, old or MultisliceJobStatus(), observed, CFG)
    return [why for _, why in invariants.violations(f, decision)]


def sticky_failure(status: MultisliceJobStatus) -> str | None:
    """The reason, when the status says the operator failed the job with a verdict that sticks
    (the registry's word, reasons.py): phase Failed and its Failed condition's reason."""
    cond = status.condition("Failed")
    if status.phase != Phase.FAILED or cond is None or cond.status != "True":
        return None
    return cond.reason if reasons.sticky(cond.reason) else None


def resize_violations(
    plan: Plan, old: MultisliceJobStatus, decision: Decision, observed: Observed
) -> list[str]:
    """The promises around the JobSet's slice count (spec.elastic) and the job's restart
    counters, for one decision; as `violations`, each line starts with its key.

    - create-size: a JobSet is created on minSlices..spec.slices slices, and a job that is not
      elastic only ever creates the plain one;
    - first-gang-shrunk: the job's first JobSet has all its slices (all or none);
    - create-twice: one CreateJobSet at most, and none while a JobSet exists (even deleting);
    - restarts-before: a recreated JobSet continues the job's counters (status.restarts + 1,
      the resize itself, and the restarts charged to maxRestarts); the first starts at 0;
    - resize-same-size: DeleteJobSet(foreground=True) only on an elastic job's live JobSet and only
      when the slice count changes: a shrink (ShrinkingSlices) with fewer pools Ready than the
      JobSet's replicas, a grow (GrowingSlices) with more pools up;
    - grow-unsaved: a grow goes once the workload saved the grow checkpoint, or did not within
      GROW_SAVE_SECONDS, or nothing of the JobSet runs;
    - restarts-down: status.restarts never goes down (across JobSet recreations too);
    - by-cause-sum: status.restartsByCause adds up to status.restarts;
    - active-slices: status.activeSlices is a size the job can run at;
    - create-live-pool: CreatePools never targets a pool that exists (only absent ones)."""
    out: list[str] = []
    actions, status = decision.actions, decision.status
    el, js = plan.elastic, observed.jobset
    low = el.min_slices if el is not None else plan.slices
    resized = old.active_slices is not None
    creates = [a for a in actions if isinstance(a, CreateJobSet)]
    if len(creates) > 1 or (creates and js is not None):
        where = "while a JobSet exists" if js is not None else "in one decision"
        out.append(f"create-twice: {creates} {where} ({js})")
    for create in creates:
        k = plan.slices if create.slices is None else create.slices
        if el is None and create != CreateJobSet():
            out.append(f"create-size: {create} for a job that is not elastic")
        elif not low <= k <= plan.slices:
            out.append(f"create-size: {create}: {k} slices, not within {low}..{plan.slices}")
        elif k < plan.slices and not resized:
            out.append(f"first-gang-shrunk: the job's first JobSet on {k} of {plan.slices}")
        so_far = old.restarts_by_cause
        charged = so_far.program() if so_far is not None else 0
        want = (old.restarts + 1, charged) if el and resized else (0, 0)
        if (create.restarts_before, create.counted_before) != want:
            out.append(
                f"restarts-before: {create} after restarts {old.restarts} ({so_far}): want "
                f"restarts_before, counted_before {want}"
            )
    reasons = {e.reason for e in decision.events}
    shrink, grow = Reason.SHRINKING_SLICES in reasons, Reason.GROWING_SLICES in reasons
    for a in actions:
        if not (isinstance(a, DeleteJobSet) and a.foreground):
            continue
        if el is None or js is None or js.deleting:
            out.append(f"resize-same-size: {a} with elastic {el} and JobSet {js}")
            continue
        replicas = js.replicas or plan.slices
        ok = [
            s
            for s in observed.slices
            if s.pool_state in (PoolState.READY, PoolState.DEGRADED, PoolState.UPDATING)
            and not s.taken_by
        ]
        ready = sum(1 for s in ok if s.ready_hosts >= HOSTS)
        up = sum(1 for s in ok if s.hosts_present >= HOSTS)
        if shrink == grow:
            out.append(f"resize-same-size: {a} with events {sorted(reasons)}")
        elif shrink and not ready < replicas:
            out.append(f"resize-same-size: shrink of {replicas} slices with {ready} pools Ready")
        elif grow and not up > replicas:
            out.append(f"resize-same-size: grow of {replicas} slices with {up} pools up")
        elif grow:
            cp = old.checkpoint
            rid = (cp.request_id if cp is not None else None) or ""
            mine = rid.startswith(GROW_PREFIX) and rid.endswith(f"-{js.restarts}")
            acks = {p.checkpoint_saved[0] for p in observed.pods if p.checkpoint_saved}
            saved = mine and cp is not None and (cp.saved_step is not None or rid in acks)
            asked = cp.request_time if mine and cp is not None else None
            late = asked is not None and (observed.now - asked).total_seconds() >= GROW_WAIT
            running = any(p.running for p in observed.pods if p.attempt == js.restarts)
            if not (saved or late or not running):
                out.append(
                    f"grow-unsaved: grow of a running JobSet (attempt {js.restarts}) with "
                    f"checkpoint {cp}"
                )
    if status.restarts < old.restarts:
        out.append(f"restarts-down: status.restarts {old.restarts} -> {status.restarts}")
    by = status.restarts_by_cause
    if by is not None and sum(by.get(c) for c in list(RestartCause)) != status.restarts:
        out.append(f"by-cause-sum: restartsByCause {by} for restarts {status.restarts}")
    active = status.active_slices
    if el is not None and active is not None and not low <= active <= plan.slices:
        out.append(f"active-slices: status.activeSlices {active}")
    state = {s.index: s.pool_state for s in observed.slices}
    for a in actions:
        if isinstance(a, CreatePools):
            live = [i for i in a.slices if state.get(i, PoolState.ABSENT) != PoolState.ABSENT]
            if live:
                shown = {i: str(state[i]) for i in live}
                out.append(f"create-live-pool: {a} while the pools exist: {shown}")
    return out


def creates(a: Any) -> bool:
    """Creates capacity or runs the job: what a failed job never does again."""
    return (
        isinstance(a, CreatePools | CreateJobSet | ValidateJobSet)
        or a == SetJobSetSuspend(False)
        or (isinstance(a, SetWorkloadActive) and a.active)
    )


def _decision(phase: Phase | None, *actions: Any) -> Decision:
    return Decision(MultisliceJobStatus(phase=phase), list(actions))


P0, P1 = (p.name for p in plain_job()[1].node_pools)


def _seen_pools(taken: bool = False) -> Observed:
    return Observed(
        now=T0,
        slices=[
            SliceObservation(0, P0, PoolState.READY, HOSTS),
            SliceObservation(1, P1, PoolState.READY, HOSTS, taken_by="ns/other" if taken else None),
        ],
        strays={"old": PoolState.READY},
    )


@pytest.mark.parametrize(
    ("finalizer", "decision", "taken", "expected"),
    [
        (True, _decision(Phase.RUNNING, DeletePools((P0,)), DeletePools(("old",))), False, []),
        (False, _decision(None, AddFinalizer(), CreatePools((0,))), False, []),
        (True, _decision(Phase.FAILED, CreatePools((1,))), False, ["terminal-create"]),
        (True, _decision(Phase.SUCCEEDED, CreateJobSet()), False, ["terminal-create"]),
        (True, _decision(Phase.FAILED, SetJobSetSuspend(False)), False, ["terminal-create"]),
        (True, _decision(Phase.FAILED, SetJobSetSuspend(True)), False, []),
        (False, _decision(None, CreatePools((0,))), False, ["create-without-finalizer"]),
        (
            False,
            _decision(None, CreatePools((0,)), AddFinalizer()),
            False,
            ["create-without-finalizer"],
        ),
        (
            True,
            _decision(None, DeletePools((P0,)), DeletePools((P0,))),
            False,
            ["duplicate-delete"],
        ),
        (
            True,
            _decision(None, CreatePools((0,)), DeletePools((P0,))),
            False,
            ["create-and-delete"],
        ),
        (True, _decision(None, DeletePools((P1,))), True, ["not-ours"]),
        (True, _decision(None, CreatePools((1,))), True, ["not-ours"]),
        (True, _decision(None, DeletePools(("someone-elses",))), False, ["not-ours"]),
    ],
)
def test_violations_name_each_broken_invariant(finalizer, decision, taken, expected):
    meta = JobMeta(NAMESPACE, NAME, UID, 1, has_finalizer=finalizer)
    assert [kind(v) for v in violations(meta, decision, _seen_pools(taken))] == expected


def test_violations_name_a_create_on_a_job_the_operator_failed():
    failed = MultisliceJobStatus.from_dict(
        {
            "phase": "Failed",
            "conditions": [
                {"type": "Failed", "status": "True", "reason": "Unschedulable",
                 "observedGeneration": 1},
            ],
        }
    )  # fmt: skip
    meta = JobMeta(NAMESPACE, NAME, UID, 1, has_finalizer=True)
    for d in (_decision(Phase.RUNNING, CreatePools((1,))), _decision(None, CreateJobSet())):
        assert [kind(v) for v in violations(meta, d, _seen_pools(), failed)] == ["terminal-create"]
    assert sticky_failure(failed) == "Unschedulable"
    hand = failed.model_copy(deep=True)
    hand.conditions[0].reason = "ReachedMaxRestarts"  # JobSet's own: not the registry's
    assert sticky_failure(hand) is None


def kind(violation: str) -> str:
    return violation.split(":", 1)[0]


class Violation(AssertionError):
    """An invariant broken; one subclass per invariant, so that hypothesis reports (and shrinks)
    each broken invariant as a bug of its own."""


_VIOLATIONS: dict[str, type[Violation]] = {}


def violation(key: str, message: str) -> Violation:
    cls = _VIOLATIONS.get(key)
    if cls is None:
        name = "".join(part.title() for part in key.split("-"))
        cls = _VIOLATIONS[key] = type(name, (Violation,), {})
    return cls(message)


# ---------------------------------------------------------------- the world


@dataclass
class Pool:
    """One slice's node pool as GKE has it (ABSENT with an error: a create GKE refused)."""

    state: PoolState
    until: datetime | None = None  # when the operation in flight (create, delete) ends
    fate: str = "ok"  # how the create in flight ends: ok | stockout | permanent
    ready: int = 0  # nodes Ready
    present: int = 0  # nodes that exist
    error: PoolError | None = None
    taken_by: str | None = None  # another live job's pool with our pool's name
    taken_by_older: bool = True

    @property
    def up(self) -> bool:
        return self.state in (PoolState.READY, PoolState.DEGRADED, PoolState.UPDATING)


@dataclass
class Pod:
    """One pod record with every field (what issue 22's one Pod record will hold)."""

    name: str
    slice: int
    attempt: int
    phase: str  # Pending | Running | Succeeded | Failed
    since: datetime  # created (Pending: unschedulable since)
    ready: bool = False
    node: str | None = None
    pool: str | None = None
    exit_code: int | None = None
    reason: str = ""
    disruption: str | None = None
    deleting: bool = False  # its JobSet is being deleted in the foreground, or suspended
    ends_at: datetime | None = None  # terminating (its JobSet suspended): gone then
    checkpoint_request: str | None = None  # multislice.dev/checkpoint-request (AnnotatePods)
    asked_at: datetime | None = None  # when that annotation was put on it
    checkpoint_saved: tuple[str, int] | None = None  # the workload's ack (process 0's pod)


@dataclass
class JobSet:
    """What the JobSet itself says: its own counters (restarts, restartsCountTowardsMax) and
    attempts (its pods' restart-attempt label) count from 0; a JobSet the operator recreated for
    a resize carries the job's restarts before it (`base`, `counted_base`: the annotations), and
    the observation adds them, as controller/observe.py does."""

    created: datetime
    suspended: bool
    replicas: int = SLICES  # spec.replicatedJobs[slice].replicas
    base: int = 0  # multislice.dev/restarts-before
    counted_base: int = 0  # multislice.dev/restarts-counted-before
    restarts: int = 0
    counted: int = 0  # restartsCountTowardsMax
    foreground: bool = False  # deleted in the foreground: it stays while its pods go
    completed: bool = False
    failed: bool = False
    failure_reason: str = ""
    failure_message: str = ""
    gone_at: datetime | None = None  # being deleted (its pods terminate) until then
    suspended_at: datetime | None = None  # condition Suspended=True since


@dataclass
class Workload:
    check: str | None  # our AdmissionCheck's state; None: the ClusterQueue lists no check of ours
    rv: int = 1
    active: bool = True
    reserved: bool = False
    admitted: bool = False
    finished: bool = False
    evicted: bool = False
    eviction_reason: str = ""
    eviction_time: datetime | None = None
    check_message: str = ""
    retry_count: int = 0
    reclaimable: int = 0


@dataclass
class World:
    now: datetime
    create_latency: int
    delete_latency: int
    pools: dict[int, Pool] = field(default_factory=dict)
    strays: dict[str, Pool] = field(default_factory=dict)  # ours by uid, named by no plan
    jobset: JobSet | None = None
    pods: list[Pod] = field(default_factory=list)
    workload: Workload | None = None
    armed: dict[int, str] = field(default_factory=dict)  # the next create of slice i fails so
    # Slice i's new pods are "unschedulable" (a nodeSelector its nodes lack) or "not created"
    # (a pod webhook or a quota refuses the Job controller's pods).
    refused: dict[int, str] = field(default_factory=dict)
    # The operator's memory: the dry-run verdict by generation, and since when it was blind.
    verdict: tuple[int, Admission] | None = None
    blind_since: datetime | None = None
    # The job object, as far as the observation depends on it.
    generation: int = 1
    queued: bool = False  # it names a queue (Kueue's objects are observed)


@dataclass(frozen=True)
class Job:
    """The knobs drawn once per example."""

    spot: bool
    queue: str | None  # None | "quota" (a ClusterQueue without our check) | "check"
    max_restarts: int
    max_disruption_restarts: int
    ttl: int | None
    startup_timeout: int | None
    keep_node_pools: bool
    refused: bool  # the apiserver refuses the rendered JobSet
    # spec.elastic {minSlices: MIN_SLICES, waitSeconds: this}; None: not elastic.
    elastic_wait: int | None = None
    # The workload saves a checkpoint requested on its pods this many seconds later (None:
    # only when the rule `workload_saves_checkpoint` says so, if ever).
    saves_after: int | None = None

    def body(self, suspend: bool) -> dict[str, Any]:
        failure_policy: dict[str, Any] = {
            "maxRestarts": self.max_restarts,
            "maxDisruptionRestarts": self.max_disruption_restarts,
        }
        if self.startup_timeout is not None:
            failure_policy["startupTimeoutSeconds"] = self.startup_timeout
        spec: dict[str, Any] = {
            "accelerator": "v5litepod-16",
            "slices": SLICES,
            "capacity": {"type": "Spot" if self.spot else "OnDemand"},
            "provisioning": {"keepNodePools": self.keep_node_pools},
            "failurePolicy": failure_policy,
            "suspend": suspend,
            "template": {"spec": {"containers": [{"name": "train", "image": "i"}]}},
        }
        if self.ttl is not None:
            spec["ttlSecondsAfterFinished"] = self.ttl
        if self.elastic_wait is not None:
            spec["elastic"] = {"minSlices": MIN_SLICES, "waitSeconds": self.elastic_wait}
        labels = {keys.KUEUE_QUEUE_NAME: QUEUE} if self.queue else {}
        return {
            "apiVersion": "multislice.dev/v1alpha1",
            "kind": "MultisliceJob",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
            "spec": spec,
        }


@functools.lru_cache(maxsize=512)
def spec_and_plan(job: Job, suspend: bool) -> tuple[MultisliceJobSpec, Plan]:
    """Planned once per knob set (decide() only reads them)."""
    parsed = load_job(job.body(suspend))
    plan = plan_job(parsed)
    assert plan.mode == "Managed" and plan.shape.hosts == HOSTS and plan.slices == SLICES
    return parsed.spec, plan


def _elastic_plan(elastic: bool = True) -> Plan:
    job = Job(False, None, 3, 30, None, None, False, False, elastic_wait=30 if elastic else None)
    return spec_and_plan(job, False)[1]


def _pools_seen(*states: PoolState) -> list[SliceObservation]:
    names = [p.name for p in _elastic_plan().node_pools]
    return [
        SliceObservation(
            i,
            names[i],
            s,
            HOSTS if s == PoolState.READY else 0,
            present_hosts=HOSTS if s == PoolState.READY else 0,
        )
        for i, s in enumerate(states)
    ]


def _running_pods(slices: int, attempt: int) -> list[PodRecord]:
    return [
        PodRecord(f"p-{i}-{h}", i, attempt, "Running", ready=True)
        for i in range(slices)
        for h in range(HOSTS)
    ]


_READY2 = (PoolState.READY, PoolState.READY)
_RESIZED = {"activeSlices": 2, "restarts": 1, "restartsByCause": {"disruption": 1}}
_SHRUNK = {"activeSlices": 1, "restarts": 2, "restartsByCause": {"disruption": 1, "resize": 1}}
_GROW_ASKED = {"requestId": "grow-2-2", "source": "elastic", "requestTime": "2026-11-30T11:59:00Z"}


def _resize_case(
    old: dict[str, Any],
    actions: list[Any],
    events: tuple[str, ...] = (),
    pools: tuple[PoolState, ...] = _READY2,
    jobset: JobSetObservation | None = None,
    pods: list[PodRecord] | None = None,
    status: dict[str, Any] | None = None,
    elastic: bool = True,
) -> tuple[Plan, MultisliceJobStatus, Decision, Observed]:
    new = MultisliceJobStatus.from_dict({**old, **(status or {})})
    d = Decision(new, actions, [Event("Normal", r, "") for r in events])
    obs = Observed(now=T0, slices=_pools_seen(*pools), jobset=jobset, pods=pods or [])
    return _elastic_plan(elastic), MultisliceJobStatus.from_dict(old), d, obs


_ON_ONE = JobSetObservation(restarts=2, replicas=1, restart_base=2)
_ON_TWO = JobSetObservation(restarts=1, replicas=2)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (_resize_case({}, [CreateJobSet()]), []),
        (_resize_case(_RESIZED, [CreateJobSet(1, 2, 0)]), []),
        (_resize_case(_SHRUNK, [CreateJobSet(None, 3, 0)]), []),
        (_resize_case({}, [CreateJobSet(1)]), ["first-gang-shrunk"]),
        (_resize_case(_RESIZED, [CreateJobSet(0, 2, 0)]), ["create-size"]),
        (_resize_case(_RESIZED, [CreateJobSet(3, 2, 0)]), ["create-size"]),
        (_resize_case({}, [CreateJobSet(1)], elastic=False), ["create-size"]),
        (_resize_case(_RESIZED, [CreateJobSet(1, 1, 0)]), ["restarts-before"]),
        (_resize_case({}, [CreateJobSet(), CreateJobSet()]), ["create-twice"]),
        (_resize_case(_RESIZED, [CreateJobSet(1, 2, 0)], jobset=_ON_TWO), ["create-twice"]),
        (
            _resize_case(
                _RESIZED,
                [DeleteJobSet(foreground=True)],
                ("ShrinkingSlices",),
                (PoolState.READY, PoolState.ABSENT),
                _ON_TWO,
            ),
            [],
        ),
        (
            _resize_case(
                _RESIZED, [DeleteJobSet(foreground=True)], ("ShrinkingSlices",), _READY2, _ON_TWO
            ),
            ["resize-same-size"],
        ),
        (
            _resize_case(
                _SHRUNK,
                [DeleteJobSet(foreground=True)],
                ("GrowingSlices",),
                (PoolState.READY, PoolState.ABSENT),
                _ON_ONE,
            ),
            ["resize-same-size"],
        ),
        (
            _resize_case(
                _SHRUNK, [DeleteJobSet(foreground=True)], ("GrowingSlices",), _READY2, _ON_ONE
            ),
            [],  # nothing runs: no checkpoint to wait for
        ),
        (
            _resize_case(
                {**_SHRUNK, "checkpoint": _GROW_ASKED},
                [DeleteJobSet(foreground=True)],
                ("GrowingSlices",),
                _READY2,
                _ON_ONE,
                _running_pods(1, 2),
            ),
            ["grow-unsaved"],
        ),
        (
            _resize_case(
                {**_SHRUNK, "checkpoint": {**_GROW_ASKED, "savedStep": 7}},
                [DeleteJobSet(foreground=True)],
                ("GrowingSlices",),
                _READY2,
                _ON_ONE,
                _running_pods(1, 2),
            ),
            [],
        ),
        (
            _resize_case({}, [DeleteJobSet(foreground=True)], ("ShrinkingSlices",), elastic=False),
            ["resize-same-size"],
        ),
        (_resize_case(_SHRUNK, [], status={"restarts": 1}), ["restarts-down", "by-cause-sum"]),
        (_resize_case(_SHRUNK, [], status={"restartsByCause": {"resize": 1}}), ["by-cause-sum"]),
        (_resize_case(_SHRUNK, [], status={"activeSlices": 3}), ["active-slices"]),
        (
            _resize_case(
                _RESIZED, [CreatePools((0, 1))], pools=(PoolState.READY, PoolState.ABSENT)
            ),
            ["create-live-pool"],
        ),
        (
            _resize_case(_RESIZED, [CreatePools((1,))], pools=(PoolState.READY, PoolState.ABSENT)),
            [],
        ),
    ],
)
def test_resize_violations_name_each_broken_invariant(
    case: tuple[Plan, MultisliceJobStatus, Decision, Observed], expected: list[str]
) -> None:
    assert [kind(v) for v in resize_violations(*case)] == expected


# ---------------------------------------------------------------- world -> Observed (one place)


def observed(w: World, plan: Plan) -> Observed:
    """What the shell would hand decide() in this world (controller/observe.py's projections)."""
    js = w.jobset
    attempt = js.restarts if js else 0
    base = js.base if js else 0
    current = [p for p in w.pods if p.attempt == attempt and p.phase != "Failed" and not p.deleting]

    def slices_where(pred: Any) -> int:
        replicas = js.replicas if js else SLICES
        return sum(1 for i in range(replicas) if pred([p for p in current if p.slice == i]))

    jobset = None
    if js is not None:
        jobset = JobSetObservation(
            suspended=js.suspended,
            suspended_since=js.suspended_at,
            restarts=js.base + js.restarts,
            restarts_counted=js.counted_base + js.counted,
            replicas=js.replicas,
            restart_base=js.base,
            completed=js.completed,
            failed=js.failed,
            failure_reason=js.failure_reason,
            failure_message=js.failure_message,
            ready_jobs=slices_where(
                lambda ps: len(ps) == HOSTS and all(p.phase == "Running" and p.ready for p in ps)
            ),
            active_jobs=slices_where(lambda ps: any(p.phase in ("Pending", "Running") for p in ps)),
            succeeded_jobs=slices_where(
                lambda ps: len(ps) == HOSTS and all(p.phase == "Succeeded" for p in ps)
            ),
            created=js.created,
            deleting=js.gone_at is not None,
        )
    slices = []
    for spec in plan.node_pools:
        pool = w.pools.get(spec.slice_index)
        if pool is None:
            slices.append(SliceObservation(spec.slice_index, spec.name, PoolState.ABSENT))
            continue
        slices.append(
            SliceObservation(
                index=spec.slice_index,
                pool=spec.name,
                pool_state=pool.state,
                ready_hosts=pool.ready,
                error=pool.error,
                operation_pending=pool.until is not None,
                present_hosts=pool.present,
                taken_by=pool.taken_by,
                taken_by_older=pool.taken_by_older,
            )
        )
    verdict = w.verdict[1] if w.verdict is not None and w.verdict[0] == w.generation else None
    return Observed(
        now=w.now,
        slices=slices,
        jobset=jobset,
        admission=verdict,
        pods=[
            PodRecord(
                p.name,
                p.slice,
                base + p.attempt,
                p.phase,
                ready=p.ready,
                deleting=p.deleting,
                node=p.node,
                pool=p.pool,
                exit_code=p.exit_code,
                reason=p.reason,
                disruption=p.disruption,
                unschedulable_since=p.since if p.phase == "Pending" else None,
                scheduler_message="0/8 nodes are available" if p.phase == "Pending" else "",
                checkpoint_request=p.checkpoint_request,
                checkpoint_saved=p.checkpoint_saved,
            )
            for p in w.pods
        ],
        strays={name: pool.state for name, pool in w.strays.items()},
        blind_since=w.blind_since,
        queue=_queue(w),
    )


def _queue(w: World) -> QueueObservation | None:
    if not w.queued:
        return None
    wl = w.workload
    workload = None
    if wl is not None:
        workload = WorkloadObservation(
            name=f"jobset-{NAME}-0001",
            resource_version=str(wl.rv),
            active=wl.active,
            quota_reserved=wl.reserved,
            admitted=wl.admitted,
            finished=wl.finished,
            cluster_queue=CLUSTER_QUEUE if wl.reserved else None,
            pending_reason="" if wl.reserved else "Pending",
            pending_message="" if wl.reserved else "waiting for quota in ClusterQueue tpu-cq",
            evicted=wl.evicted,
            reclaimable=wl.reclaimable,
            eviction_reason=wl.eviction_reason,
            eviction_message=f"evicted ({wl.eviction_reason})" if wl.evicted else "",
            eviction_time=wl.eviction_time,
            check=(
                CheckObservation(CHECK, wl.check, wl.check_message, wl.retry_count)
                if wl.check is not None
                else None
            ),
        )
    return QueueObservation(QUEUE, cluster_queue=CLUSTER_QUEUE, workload=workload)


# ---------------------------------------------------------------- the machine


def settings_from_env(share: float = 1.0) -> settings:
    """Bounded and deterministic for `make test`; `make fuzz` sets MACHINE_EXAMPLES (and
    MACHINE_RANDOM=1 for a fresh seed each run: hypothesis prints it with a failure)."""
    return settings(
        max_examples=max(1, int(share * int(os.environ.get("MACHINE_EXAMPLES", "500")))),
        stateful_step_count=int(os.environ.get("MACHINE_STEPS", "20")),
        derandomize=os.environ.get("MACHINE_RANDOM", "") != "1",
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


slice_index = st.integers(0, SLICES - 1)


def jobs(
    queues: list[str | None], elastic: list[int | None] | None = None
) -> st.SearchStrategy[Job]:
    """`elastic`: the spec.elastic.waitSeconds to draw from (None: not elastic); an elastic
    job's simplest maxDisruptionRestarts (hypothesis's first choice) is a large one, so that
    the loss that shrinks it is not the end of it."""
    return st.builds(
        Job,
        spot=st.booleans(),
        queue=st.sampled_from(queues),
        max_restarts=st.sampled_from([0, 3, 10]),
        max_disruption_restarts=st.sampled_from([30, 2, 1, 0] if elastic else [0, 1, 2, 30]),
        ttl=st.sampled_from([None, 0, 120]),
        startup_timeout=st.sampled_from([None, None, 60]),
        keep_node_pools=st.booleans(),
        refused=st.sampled_from([False] * 9 + [True]),
        elastic_wait=st.sampled_from(elastic or [None]),
        saves_after=st.sampled_from([None, 5, 60] if elastic else [None]),
    )


# A running job on its way to a failure verdict whose evidence can go while its JobSet runs
# (DecideMachine._fail_first): a pool name another job takes, a permanent error on a repair,
# pods that cannot be scheduled or are never created.
FAILING = ["taken", "permanent", "unschedulable", "not created"]
LATENCIES = {
    "create_latency": st.sampled_from([1, 60, 300]),
    "delete_latency": st.sampled_from([1, 30]),
    "warm": st.sampled_from([True, True, False, True, True, False, True, True, False, *FAILING]),
}
# The elastic job starts shrunk, or about to grow back, half the time (DecideMachine.start).
ELASTIC_LATENCIES = {
    **LATENCIES,
    "warm": st.sampled_from([True, False, "shrunk", "growing"] * 2 + FAILING),
}


class DecideMachine(RuleBasedStateMachine):
    """One Managed job of 2 slices, from creation (or from Running) to wherever the rules lead."""

    def __init__(self) -> None:
        super().__init__()
        self._reset()

    def _reset(self) -> None:
        self.job: Job | None = None
        self.status: dict[str, Any] = {}  # as the apiserver stores it
        self.has_finalizer = False
        self.deleting = False
        self.gone = False  # the job object no longer exists
        self.suspend = False
        # The late-verdict check: the pools the last pass created, and whether anything but the
        # operator's own actions changed the world since.
        self.creating: set[str] = set()
        self.changed = True
        self.requeue: float | None = None  # the last decision's requeue_after
        # Armed: the next pass that ends the job crashes after this many of its actions (and
        # whether the world then takes the verdict's evidence away: `_evidence_goes`).
        self.crash_at_end: tuple[int, bool] | None = None
        self.failed: str | None = None  # the sticky reason the operator failed the job with
        self.w = World(T0, 60, 30)

    # ------------------------------------------------------------ setup

    def start(self, job: Job, create_latency: int, delete_latency: int, warm: bool | str) -> None:
        """`warm`: start from a running job, reached by the machine itself (every pass of the
        way checked), so that the rules spend their steps on what happens to a running job;
        "shrunk": an elastic job running on fewer slices (`_shrink_first`); "growing": then
        waiting for the checkpoint before it grows back (`_grow_first`); one of FAILING: failed
        from Running, with a crash after the verdict's status write (`_fail_first`)."""
        self._reset()
        self.job = job
        self.plans = {s: spec_and_plan(job, s) for s in (False, True)}
        self.w = World(T0, create_latency, delete_latency, queued=job.queue is not None)
        if warm and not job.refused:
            self._warm_up()
            if warm in ("shrunk", "growing"):
                self._shrink_first()
            if warm == "growing":
                self._grow_first()
            if warm in FAILING:
                assert isinstance(warm, str)
                self._fail_first(warm)

    def _warm_up(self) -> None:
        for _ in range(30):
            if self.status.get("phase") == Phase.RUNNING:
                return
            self._pass()
            wl = self.w.workload
            if wl is not None and wl.active and not wl.reserved:
                self._reserve()
            elif wl is not None and self._admissible():
                self._admit()
            self._advance_to(self.w.now + timedelta(seconds=self.w.create_latency))
        raise AssertionError(f"the warm start never ran: {self.status.get('message')}")

    def _shrink_first(self) -> None:
        """From Running (`_warm_up`): slice 1's pool vanishes and GKE refuses its replacement
        once (quota), so that an elastic job runs on fewer slices, reached by the machine
        itself (every pass checked); the rules then spend their steps on growing back. Not
        every job gets there (a maxDisruptionRestarts of 0 fails it): it goes on from there."""
        del self.w.pools[1]
        self.w.armed[1] = "quota"
        self._seen()
        for _ in range(10):
            js = self.w.jobset
            if self.status.get("phase") == Phase.RUNNING and js and js.replicas < SLICES:
                return
            if self.status.get("phase") in TERMINAL:
                return
            self._pass()
            self._advance_to(self.w.now + timedelta(seconds=5))

    def _fail_first(self, how: str) -> None:
        """From Running (`_warm_up`): slice 1's pool name taken by an older job, a permanent
        error on the replacement of its pool, or its pods (restarted) unschedulable or never
        created; passes run, time passes, until the job ends (most often with that verdict),
        the operator crashing right after that pass's status write, and the verdict's evidence
        going meanwhile (`crash_the_operator`). The rules go on from there."""
        w = self.w
        if how in ("taken", "permanent"):
            del w.pools[1]
        if how == "taken":
            w.pools[1] = Pool(PoolState.READY, ready=HOSTS, present=HOSTS, taken_by="ns/other")
        elif how == "permanent":
            w.armed[1] = "permanent"
        else:
            w.refused[1] = how
            self._pod_fails(1, 1, None)  # a restart: slice 1's new pods are refused
        self.crash_at_end = (0, True)
        self._seen()
        for _ in range(40):
            if self.status.get("phase") in TERMINAL:
                return
            self._pass()
            self._advance_to(self.w.now + timedelta(seconds=60))

    def _grow_first(self) -> None:
        """From shrunk (`_shrink_first`): time passes, passes run, until the replacement pool is
        Ready and the job asks its workload for the checkpoint before growing back (or gets
        elsewhere)."""
        for _ in range(60):
            cp = self.status.get("checkpoint") or {}
            js = self.w.jobset
            if str(cp.get("requestId", "")).startswith(GROW_PREFIX) or js is None:
                return
            if self.status.get("phase") in TERMINAL or js.replicas == SLICES:
                return
            self._pass()
            self._advance_to(self.w.now + timedelta(seconds=10))

    @property
    def spec(self) -> MultisliceJobSpec:
        return self.plans[self.suspend][0]

    @property
    def plan(self) -> Plan:
        return self.plans[self.suspend][1]

    def meta(self) -> JobMeta:
        labels = {keys.KUEUE_QUEUE_NAME: QUEUE} if self.job and self.job.queue else {}
        return JobMeta(
            NAMESPACE,
            NAME,
            UID,
            self.w.generation,
            creation_time=T0,
            labels=labels,
            deleting=self.deleting,
            has_finalizer=self.has_finalizer,
        )

    def observe(self) -> Observed:
        return observed(self.w, self.plan)

    # ------------------------------------------------------------ the operator's pass

    def _pass(self, crash: int | None = None, evidence_goes: bool = False) -> Decision:
        """One pass of the shell; `crash`: the operator crashes once the status is written and
        this many of the actions applied, then restarts (`_restart`), meanwhile the verdict's
        evidence goes or not (`_evidence_goes`)."""
        meta, obs = self.meta(), self.observe()
        old = MultisliceJobStatus.from_dict(self.status)
        d = self._decide(meta, old, obs)
        problems = list(d.violations) + resize_violations(self.plan, old, d, obs)
        problems += self._failed_runs_again(d)
        deleted = {n for a in d.actions if isinstance(a, DeletePools) for n in a.pools}
        late = sorted(deleted & self.creating) if not self.changed else []
        under = sorted(
            {p.pool for p in self.w.pods if p.pool in deleted and p.phase in ("Pending", "Running")}
        )
        if under and d.status.phase in HELD and not meta.deleting:
            problems.append(
                f"held-pool-under-pods: node pool {', '.join(map(str, under))} deleted while a "
                f"pod of the {d.status.phase} job's JobSet still runs or terminates on it (node "
                "shutdown: a restart of every slice, its grace period cut)"
            )
        if late:
            problems.append(
                f"late-verdict: node pool {', '.join(late)} created by the previous pass is "
                "deleted by this one, and nothing but that pass's own actions changed the world"
            )
        if problems:
            raise violation(kind(problems[0]), self._explain(problems, old, obs, d))
        if not d.actions:
            self._fixpoint(meta, obs, d)
        if not (meta.deleting and not meta.has_finalizer):
            self.status = d.status.to_dict()
            self.failed = self.failed or sticky_failure(MultisliceJobStatus.from_dict(self.status))
        if crash is None and self.crash_at_end is not None and d.status.phase in TERMINAL:
            (crash, evidence_goes), self.crash_at_end = self.crash_at_end, None
        applied = d.actions if crash is None else d.actions[:crash]
        pool_of = {p.slice_index: p.name for p in self.plan.node_pools}
        self.creating = {
            pool_of[i] for a in applied if isinstance(a, CreatePools) for i in a.slices
        }
        self.changed = False
        self.requeue = d.requeue_after
        self.w.blind_since = None  # watched from now on
        for action in applied:
            self._apply(action)
        if crash is not None:
            self._restart()
            if evidence_goes:
                self._evidence_goes()
        return d

    def _decide(self, meta: JobMeta, old: MultisliceJobStatus, obs: Observed) -> Decision:
        """decide(), whose own invariants (reconcile/invariants.py) raise in tests: reported by
        the broken invariant's key."""
        try:
            return decide(meta, self.spec, self.plan, None, old, obs, CFG)
        except invariants.InvariantViolation as e:
            raise violation(kind(str(e)), self._explain([str(e)], old, obs)) from e

    def _failed_runs_again(self, d: Decision) -> list[str]:
        """A job the operator failed with a verdict that sticks never creates a pool or its
        JobSet, resumes, or leaves a terminal phase again."""
        if self.failed is None:
            return []
        revived = [a for a in d.actions if creates(a)]
        if d.status.phase in TERMINAL and not revived:
            return []
        return [
            f"failed-runs-again: the job failed ({self.failed}), now phase {d.status.phase} "
            f"with {revived}"
        ]

    def _fixpoint(self, meta: JobMeta, obs: Observed, d: Decision) -> None:
        """A pass that acted on nothing changed nothing in the world; deciding again on the same
        world (the same observation, the time advanced 0 s, the job now watched) with the status
        it wrote as the old status must write nothing: the same status, no action, no event."""
        again = decide(
            meta,
            self.spec,
            self.plan,
            None,
            MultisliceJobStatus.from_dict(d.status.to_dict()),
            replace(obs, blind_since=None),
            CFG,
        )
        first, second = d.status.to_dict(), again.status.to_dict()
        if first != second or again.actions or again.events:
            diff = {
                k: (first.get(k), second.get(k))
                for k in sorted(set(first) | set(second))
                if first.get(k) != second.get(k)
            }
            raise violation(
                "fixpoint",
                "fixpoint: deciding again on an unchanged world writes "
                f"{diff or 'the same status'}, actions {again.actions}, events "
                f"{[(e.reason, e.message) for e in again.events]}",
            )

    def _explain(
        self,
        problems: list[str],
        old: MultisliceJobStatus,
        obs: Observed,
        d: Decision | None = None,
    ) -> str:
        js = obs.jobset
        pools = {s.index: (str(s.pool_state), s.ready_hosts) for s in obs.slices}
        lines = [
            *problems,
            f"  old phase {old.phase} ({old.message}), restarts {old.restarts}, failed "
            f"{self.failed}",
            f"  finalizer {self.has_finalizer}, deleting {self.deleting}, suspend "
            f"{self.suspend}, job {self.job}",
            f"  pools {pools}, jobset {js}",
        ]
        if d is not None:
            lines += [
                f"  -> phase {d.status.phase} ({d.status.message})",
                f"  -> actions {d.actions}",
                f"  -> events {[e.reason for e in d.events]}",
            ]
        return "\n".join(lines)

    def _apply(self, a: object) -> None:
        w = self.w
        if isinstance(a, AddFinalizer):
            self.has_finalizer = True
        elif isinstance(a, RemoveFinalizer):
            self.has_finalizer = False
            if self.deleting:
                self._gone()
        elif isinstance(a, CreatePools):
            for i in a.slices:
                self._create_pool(i)
        elif isinstance(a, DeletePools):
            for name in a.pools:
                self._delete_pool(name)
        elif isinstance(a, CreateJobSet):
            if w.jobset is None:  # (a second create: 409 AlreadyExists)
                queued = self.job is not None and self.job.queue is not None
                w.jobset = JobSet(
                    w.now,
                    suspended=self.suspend or queued,
                    replicas=SLICES if a.slices is None else a.slices,
                    base=a.restarts_before,
                    counted_base=a.counted_before if a.restarts_before else 0,
                )
        elif isinstance(a, ValidateJobSet):
            refused = "spec.replicatedJobs: Invalid value" if self.job and self.job.refused else ""
            w.verdict = (w.generation, Admission(refused=refused))
        elif isinstance(a, DeleteJobSet):
            if w.jobset is not None and w.jobset.gone_at is None:
                # Foreground (a resize): it stays, deleting, until its pods are gone.
                w.jobset.gone_at = w.now + timedelta(seconds=5)
                w.jobset.foreground = a.foreground
        elif isinstance(a, SetJobSetSuspend):
            if w.jobset is not None:
                w.jobset.suspended = a.suspend
        elif isinstance(a, DeleteJob):
            self._delete_job()
        elif isinstance(a, SetAdmissionCheckState):
            self._check_state(a)
        elif isinstance(a, EvictPods):
            evicted = sorted({p.slice for p in w.pods if p.name in a.pods})
            if evicted:  # DisruptionTarget: one restart of all slices
                self._pod_fails(evicted[0], 143, "EvictionByEvictionAPI")
        elif isinstance(a, AnnotatePods):
            for p in w.pods:
                if p.name in a.pods and a.key == keys.CHECKPOINT_REQUEST:
                    p.checkpoint_request, p.asked_at = a.value, w.now
        elif isinstance(a, SetWorkloadActive):
            wl = w.workload
            if wl is not None and wl.active != a.active:
                wl.active, wl.rv = a.active, wl.rv + 1
                if not a.active and wl.reserved:  # Kueue evicts an inactive Workload
                    self._evict("InactiveWorkload")
        elif isinstance(a, CreateWorkload):
            if w.workload is None:  # (a second create: 409 AlreadyExists)
                w.workload = Workload(
                    CheckState.PENDING if self.job and self.job.queue == "check" else None
                )
        elif isinstance(a, ReleaseWorkload):
            wl = w.workload
            if wl is not None and str(wl.rv) == a.resource_version and wl.evicted:
                wl.reserved, wl.admitted, wl.rv = False, False, wl.rv + 1
        elif isinstance(a, ReclaimPods):
            wl = w.workload
            if wl is not None and str(wl.rv) == a.resource_version:
                assert a.count >= wl.reclaimable, f"reclaimablePods lowered: {a}"  # Kueue refuses
                wl.reclaimable, wl.rv = a.count, wl.rv + 1
        elif isinstance(a, FinishWorkload):
            if w.workload is not None and not w.workload.finished:
                w.workload.finished, w.workload.rv = True, w.workload.rv + 1
        else:
            raise AssertionError(f"unknown action {a}")
        self._sync()

    # ------------------------------------------------------------ the cloud

    def _create_pool(self, i: int) -> None:
        w = self.w
        pool = w.pools.get(i)
        if pool is not None and pool.state != PoolState.ABSENT:
            return  # adopted (create is idempotent)
        fate = w.armed.pop(i, "ok")
        name = self.plan.node_pools[i].name
        if fate == "quota":  # refused at once: HTTP 403, no pool (facts.md section 10)
            err = PoolError(i, name, "GCE_QUOTA_EXCEEDED", "Insufficient regional quota", False)
            w.pools[i] = Pool(PoolState.ABSENT, error=err)
            self.changed = True  # the cloud's answer, not the operator's doing
            return
        w.pools[i] = Pool(
            PoolState.CREATING, until=w.now + timedelta(seconds=w.create_latency), fate=fate
        )

    def _delete_pool(self, name: str) -> None:
        w = self.w
        if name in w.strays:
            stray = w.strays[name]
            if stray.state != PoolState.DELETING:
                w.strays[name] = Pool(
                    PoolState.DELETING, until=w.now + timedelta(seconds=w.delete_latency)
                )
            return
        index = next(p.slice_index for p in self.plan.node_pools if p.name == name)
        pool = w.pools.get(index)
        if pool is None or pool.state == PoolState.DELETING:
            return
        if pool.state == PoolState.ABSENT:
            del w.pools[index]
            return
        if pool.state == PoolState.CREATING:
            return  # GKE: 400 "is currently creating a node pool" (facts.md section 10)
        w.pools[index] = Pool(
            PoolState.DELETING,
            until=w.now + timedelta(seconds=w.delete_latency),
            taken_by=pool.taken_by,
        )

    def _advance_to(self, when: datetime) -> None:
        """Time passes: the operations in flight end (a change in the world)."""
        w = self.w
        self.changed = True
        w.now = when
        for i, pool in list(w.pools.items()):
            if pool.until is None or pool.until > w.now:
                continue
            name = self.plan.node_pools[i].name
            if pool.state == PoolState.DELETING:
                del w.pools[i]
            elif pool.fate == "stockout":
                err = PoolError(i, name, "GCE_STOCKOUT", "Not all instances running", False)
                w.pools[i] = Pool(PoolState.FAILED, error=err)
            elif pool.fate == "permanent":
                err = PoolError(i, name, "INVALID_ARGUMENT", "unknown machine type", True)
                w.pools[i] = Pool(PoolState.FAILED, error=err)
            else:
                w.pools[i] = Pool(PoolState.READY, ready=HOSTS, present=HOSTS)
        for name, stray in list(w.strays.items()):
            if stray.until is not None and stray.until <= w.now:
                del w.strays[name]
        if self.job is not None and self.job.saves_after is not None:
            self._save(self.job.saves_after)
        if w.jobset is not None and w.jobset.gone_at is not None and w.jobset.gone_at <= w.now:
            w.jobset = None
            w.pods = []
        self._sync()

    # ------------------------------------------------------------ JobSet, Jobs, pods

    def _sync(self) -> None:
        """The JobSet, Job, scheduler and kubelet of this world: the pods of the current
        attempt follow the pools."""
        w, js = self.w, self.w.jobset
        if js is not None and js.gone_at is not None and js.foreground:
            for p in w.pods:  # terminating; gone with the JobSet (`_advance_to`)
                p.deleting = p.deleting or p.phase in ("Pending", "Running")
            return
        if js is not None and js.gone_at is None and js.suspended and not js.failed:
            self._stop_pods(js)
            return
        if js is None or js.gone_at is not None or js.failed:
            w.pods = [p for p in w.pods if p.phase == "Failed"] if js is not None else []
            return
        js.suspended_at = None
        if js.completed:
            return
        # Pods of a vanished node fail (PodGC, DisruptionTarget): one restart of all slices.
        for i in range(SLICES):
            pool = w.pools.get(i)
            lost = pool is None or not pool.up or pool.present < HOSTS or pool.taken_by
            name = self.plan.node_pools[i].name
            on_it = [p for p in w.pods if p.pool == name and p.attempt == js.restarts]
            if lost and any(p.phase == "Running" for p in on_it):
                self._pod_fails(on_it[0].slice, 143, "DeletionByPodGC")
                return
        live = [
            p
            for p in w.pods
            if p.attempt == js.restarts and p.phase != "Failed" and p.ends_at is None
        ]
        w.pods = [p for p in w.pods if p.phase == "Failed" and p.attempt >= js.restarts - 1]
        attempt = js.base + js.restarts  # as the pods' names say it (unique across JobSets)
        placed = self._placement(js, live)
        for i in range(js.replicas):
            at = placed.get(i)
            pool = w.pools.get(at) if at is not None else None
            name = self.plan.node_pools[at].name if at is not None else ""
            refused = w.refused.get(i)
            for h in range(HOSTS):
                pod = next((p for p in live if p.slice == i and p.name.endswith(f"-{h}")), None)
                if pod is None and refused == "not created":
                    continue
                if pod is None:
                    pod = Pod(f"{NAME}-slice-{i}-a{attempt}-{h}", i, js.restarts, "Pending", w.now)
                placed_now = pod.phase == "Running" or refused != "unschedulable"
                if pool is not None and self._schedulable(pool) and placed_now:
                    pod.phase, pod.node, pod.pool = "Running", f"{name}-node-{h}", name
                    pod.ready = h < pool.ready
                w.pods.append(pod)

    def _stop_pods(self, js: JobSet) -> None:
        """Suspended: JobSet suspends its Jobs, the Job controller deletes their pods; a pod on
        a node terminates for POD_STOP_SECONDS, one without a node goes at once."""
        w = self.w
        js.suspended_at = js.suspended_at or w.now
        kept = []
        for p in w.pods:
            if p.phase in ("Pending", "Running") and p.pool is not None and p.ends_at is None:
                p.deleting, p.ends_at = True, w.now + timedelta(seconds=POD_STOP_SECONDS)
            if p.phase == "Failed" or (p.ends_at is not None and p.ends_at > w.now):
                kept.append(p)
        w.pods = kept

    @staticmethod
    def _schedulable(pool: Pool) -> bool:
        return pool.up and not pool.taken_by and pool.present >= HOSTS

    def _placement(self, js: JobSet, live: list[Pod]) -> dict[int, int]:
        """Which pool each of the JobSet's slices (Jobs) runs on. Every pool takes one Job at
        most (the exclusive-topology annotation, keyed by node pool): a full JobSet's slice i on
        pool i, as the job's first gang is placed; a smaller one's (spec.elastic) on the pool its
        pods already run on, else on the first free pool that can take it."""
        if js.replicas == SLICES:
            return {i: i for i in range(SLICES)}
        index = {p.name: p.slice_index for p in self.plan.node_pools}
        placed = {p.slice: index[p.pool] for p in live if p.pool is not None}
        free = [
            i
            for i in range(SLICES)
            if i not in placed.values()
            and (pool := self.w.pools.get(i)) is not None
            and self._schedulable(pool)
        ]
        for j in range(js.replicas):
            if j not in placed and free:
                placed[j] = free.pop(0)
        return placed

    def _pod_fails(self, i: int, code: int, disruption: str | None) -> None:
        """A pod of slice i failed: JobSet's failure policy, as render/jobset.py writes it."""
        w, js, fp = self.w, self.w.jobset, self.spec.failure_policy
        if js is None or js.failed or js.completed or js.gone_at is not None:
            return
        w.pods.append(
            Pod(
                f"{NAME}-slice-{i}-a{js.base + js.restarts}-0",
                i,
                js.restarts,
                "Failed",
                w.now,
                exit_code=code,
                reason="Error",
                disruption=disruption,
            )
        )
        if disruption is not None:  # RestartJobSetAndIgnoreMaxRestarts
            js.restarts += 1
        elif fp.is_fatal(code):  # FailJobSet
            js.failed, js.failure_reason = True, "FailJobSetFailurePolicyAction"
            js.failure_message = f"pod failed with exit code {code}"
        elif js.counted >= max(0, fp.max_restarts - js.counted_base):  # what render/jobset.py left
            js.failed, js.failure_reason = True, "ReachedMaxRestarts"
            js.failure_message = "jobset failed due to reaching max number of restarts"
        else:  # RestartJobSet
            js.restarts += 1
            js.counted += 1
        self._sync()

    # ------------------------------------------------------------ Kueue

    def _admissible(self) -> bool:
        wl = self.w.workload
        return (
            wl is not None
            and wl.reserved
            and not wl.admitted
            and wl.check in (None, CheckState.READY)
        )

    def _reserve(self) -> None:
        wl = self.w.workload
        assert wl is not None
        wl.reserved, wl.evicted, wl.rv = True, False, wl.rv + 1

    def _admit(self) -> None:
        """Admitted: the JobSet is not Kueue's (no queue label), so the operator resumes it."""
        wl = self.w.workload
        assert wl is not None
        wl.admitted, wl.rv = True, wl.rv + 1
        self._sync()

    def _evict(self, reason: str) -> None:
        """Evicted=True, the checks reset to Pending; the quota stays reserved until the owner
        says the job stopped (ReleaseWorkload), as for a Go job of Kueue's job reconciler."""
        w, wl = self.w, self.w.workload
        assert wl is not None
        wl.admitted = False
        wl.evicted, wl.eviction_reason, wl.eviction_time = True, reason, w.now
        if wl.check is not None:
            wl.check, wl.check_message = CheckState.PENDING, ""
        wl.rv += 1
        self._sync()

    def _check_state(self, a: SetAdmissionCheckState) -> None:
        wl = self.w.workload
        if wl is None or wl.check is None or str(wl.rv) != a.resource_version:
            return  # the Workload moved since: nothing written
        wl.check, wl.check_message, wl.rv = a.state, a.message, wl.rv + 1
        if a.state == CheckState.RETRY:  # Kueue evicts at once and queues it again
            wl.retry_count += 1
            self._evict("AdmissionCheck")
        elif a.state == CheckState.REJECTED:  # Kueue deactivates it
            wl.active = False
            self._evict("Deactivated")

    # ------------------------------------------------------------ the job object

    def _gone(self) -> None:
        """The job object is gone: its JobSet is garbage-collected (owner reference)."""
        self.gone = True
        self.w.workload = None  # owned by the job too
        if self.w.jobset is not None:
            self.w.jobset.gone_at = self.w.now

    def _delete_job(self) -> None:
        self.deleting = True
        if not self.has_finalizer:
            self._gone()

    def _over(self) -> bool:
        """Nothing of the job is left to act on: gone, or finished with its pools and JobSet
        gone (a hand-written terminal phase over a running JobSet is not over)."""
        finished = self.status.get("phase") in TERMINAL and not self.w.pools
        return self.gone or (finished and self.w.jobset is None)

    @invariant()
    def the_jobset_runs_its_replicas(self) -> None:
        """The world's own promise (after every step): a JobSet's pods are its replicas' only,
        and no two of its slices share a pool (exclusive placement)."""
        js = self.w.jobset
        if js is None:
            return
        live = [p for p in self.w.pods if p.phase != "Failed" and p.attempt == js.restarts]
        extra = sorted({p.slice for p in live if p.slice >= js.replicas})
        on = {(p.slice, p.pool) for p in live if p.pool is not None}
        shared = len({pool for _, pool in on}) < len(on)
        if not MIN_SLICES <= js.replicas <= SLICES or extra or shared:
            raise violation(
                "world-replicas",
                f"world-replicas: JobSet of {js.replicas} replicas with pods of slices {extra}, "
                f"placed {sorted(on, key=str)}",
            )

    # ------------------------------------------------------------ rules: the operator

    def _seen(self) -> None:
        """The world changed (by anything but the operator's own actions): the next pass
        (`reconcile`, `tick`) sees it, with whatever else changed meanwhile."""
        self.changed = True
        self._sync()

    @precondition(lambda self: not self.gone)
    @rule()
    def reconcile(self) -> None:
        """A pass now (a watch event, a resync)."""
        self._pass()

    @precondition(lambda self: self.w.blind_since is None)
    @rule()
    def restart_the_operator(self) -> None:
        """Its memory is lost (the dry-run verdict) and it did not watch the job meanwhile:
        its first pass (the next) has blind_since. Not a change in the world: no pass may undo
        its predecessor's work for that."""
        self._restart()

    def _restart(self) -> None:
        self.w.verdict = None
        self.w.blind_since = self.w.now

    @precondition(lambda self: not self.gone)
    @rule(applied=st.sampled_from([0, 0, 1, 2]), at_end=st.booleans(), evidence_goes=st.booleans())
    def crash_the_operator(self, applied: int, at_end: bool, evidence_goes: bool) -> None:
        """The operator crashes between a pass's status write and its actions (`applied`: after
        the first few of them, as a delete the apiserver refuses leaves the rest undone), then
        restarts, while the world moves on (`evidence_goes`: what a verdict saw goes). Now, or
        armed (`at_end`) for the next pass that ends the job: a verdict, or a finished job's
        release, so that every verdict the machine reaches is crashed on."""
        if at_end:
            self.crash_at_end = (applied, evidence_goes)
        else:
            self._pass(crash=applied, evidence_goes=evidence_goes)

    @invariant()
    def a_failed_job_never_runs_again(self) -> None:
        """After every step: a job the operator failed with a verdict that sticks keeps a
        terminal phase (its decisions are checked in `_pass`: nothing created or resumed)."""
        phase = self.status.get("phase")
        if self.failed is not None and not self.gone and phase not in TERMINAL:
            raise violation(
                "failed-runs-again",
                f"failed-runs-again: the job failed ({self.failed}), its status now {phase}",
            )

    # ------------------------------------------------------------ rules: time and the cloud

    @rule(seconds=st.sampled_from([1, 10, 60, 301, 700, 1900]))
    def tick(self, seconds: int) -> None:
        """Time passes; the operator runs the passes its decisions asked for (requeue_after, a
        few at most: it may also be slow), and one at the end."""
        end = self.w.now + timedelta(seconds=seconds)
        for _ in range(PASSES_PER_TICK):
            if self.requeue is None or self.gone:
                break
            at = self.w.now + timedelta(seconds=max(1, int(self.requeue)))
            if at >= end:
                break
            self._advance_to(at)
            self._pass()
        self._advance_to(end)
        if not self.gone:
            self._pass()

    @precondition(lambda self: len(self.w.armed) < SLICES)
    @rule(i=slice_index, fate=st.sampled_from(["stockout", "quota", "permanent"]))
    def arm_create_failure(self, i: int, fate: str) -> None:
        """The next create of slice i's pool fails so (the cloud's answer, when it comes)."""
        self.w.armed[i] = fate

    def _any_up(self) -> bool:
        return any(self._up(i) is not None for i in range(SLICES))

    def _all_running(self) -> bool:
        js = self.w.jobset
        running = [p for p in self.w.pods if p.phase == "Running" and p.ready]
        return js is not None and js.gone_at is None and len(running) == js.replicas * HOSTS

    def _up(self, i: int) -> Pool | None:
        pool = self.w.pools.get(i)
        return pool if pool is not None and pool.up and not pool.taken_by else None

    @staticmethod
    def _pick(i: int, ok: Any) -> int:
        """Slice i if `ok(i)`, else the first that is (the rule's precondition says one is):
        a rule drawn for a slice it cannot act on acts on another, not on nothing."""
        return i if ok(i) else next(j for j in range(SLICES) if ok(j))

    @precondition(lambda self: self._any_up())
    @rule(i=slice_index)
    def pool_vanishes(self, i: int) -> None:
        """GKE reclaims a spot slice (preemption), or someone deletes the pool out of band
        (gcloud, a cleanup script): the pool and its nodes are gone."""
        del self.w.pools[self._pick(i, self._up)]
        self._seen()

    @precondition(lambda self: self._any_up())
    @rule(i=slice_index, how=st.sampled_from(["nodes gone", "pool error", "node NotReady"]))
    def slice_degrades(self, i: int, how: str) -> None:
        """Nodes gone: the pool is there, its nodes not; pool error: GKE says ERROR; node
        NotReady: one node (its pods keep running, not Ready)."""
        i = self._pick(i, self._up)
        pool = self.w.pools[i]
        if how == "nodes gone":
            pool.ready = pool.present = 0
        elif how == "pool error":
            name = self.plan.node_pools[i].name
            err = PoolError(i, name, "ERROR", "the node pool is in ERROR", False)
            self.w.pools[i] = Pool(PoolState.FAILED, error=err)
        else:
            pool.ready = max(0, pool.ready - 1)
        self._seen()

    def _not_ready(self, i: int) -> bool:
        return self.w.pools[i].ready < self.w.pools[i].present

    @precondition(lambda self: any(self._not_ready(i) for i in self.w.pools))
    @rule(i=slice_index)
    def nodes_ready_again(self, i: int) -> None:
        pool = self.w.pools[self._pick(i, lambda j: j in self.w.pools and self._not_ready(j))]
        pool.ready = pool.present
        self._seen()

    @precondition(lambda self: len(self.w.pools) < SLICES)
    @rule(i=slice_index, older=st.booleans())
    def another_job_takes_the_name(self, i: int, older: bool) -> None:
        """Another live job's pool gets our pool's name (a collision) while ours is absent."""
        i = self._pick(i, lambda j: j not in self.w.pools)
        self.w.pools[i] = Pool(
            PoolState.READY, ready=HOSTS, present=HOSTS, taken_by="ns/other", taken_by_older=older
        )
        self._seen()

    @precondition(lambda self: not self.gone)
    @rule(i=slice_index, how=st.sampled_from(["unschedulable", "not created"]))
    def pods_refused(self, i: int, how: str) -> None:
        """Slice i's new pods cannot be scheduled (a nodeSelector no node of its pool carries)
        or are never created (a pod webhook, a quota refuses the Job controller's pods), until
        the evidence goes."""
        self.w.refused = {**self.w.refused, i: how}
        self._seen()

    def _evidence(self) -> bool:
        pools = self.w.pools.values()
        return bool(self.w.refused) or any(p.taken_by or p.state == PoolState.FAILED for p in pools)

    @precondition(lambda self: self._evidence())
    @rule()
    def evidence_goes(self) -> None:
        """What a failure verdict saw goes: the other job whose pool has our pool's name is
        deleted, its pool with it (PoolNameTaken); a pool in error is deleted out of band
        (ProvisioningFailed); the pods' refusals are lifted (Unschedulable, PodsNotCreated)."""
        self._evidence_goes()

    def _evidence_goes(self) -> None:
        w = self.w
        w.pools = {
            i: p for i, p in w.pools.items() if not p.taken_by and p.state != PoolState.FAILED
        }
        w.refused = {}
        self._seen()

    @precondition(lambda self: not self.w.strays)
    @rule()
    def stray_appears(self) -> None:
        """A pool labelled with this job's uid that its plan does not name (an older naming)."""
        if "old-naming-pool" in self.w.strays:
            return
        self.w.strays["old-naming-pool"] = Pool(PoolState.READY, ready=HOSTS, present=HOSTS)
        self._seen()

    # ------------------------------------------------------------ rules: the JobSet's pods

    @precondition(lambda self: any(p.phase in ("Pending", "Running") for p in self.w.pods))
    @rule(
        i=slice_index,
        failure=st.sampled_from([(1, None), (78, None), (75, None), (143, "TerminationByKubelet")]),
    )
    def pod_fails(self, i: int, failure: tuple[int, str | None]) -> None:
        """Retryable, fatal (nonRetryableExitCodes), hang, or a disruption (DisruptionTarget)."""
        live = [p for p in self.w.pods if p.phase in ("Pending", "Running") and not p.deleting]
        if not any(p.slice == i for p in live):
            return
        self._pod_fails(i, *failure)
        self._seen()

    def _unsaved(self) -> Pod | None:
        """The first running pod of the current attempt with a checkpoint request that no pod
        has acknowledged yet (process 0's pod, slice 0 host 0, when it has it)."""
        js = self.w.jobset
        if js is None or js.gone_at is not None:
            return None
        pods = [
            p
            for p in self.w.pods
            if p.attempt == js.restarts
            and p.phase == "Running"
            and not p.deleting
            and p.checkpoint_request is not None
        ]
        acked = {p.checkpoint_saved[0] for p in self.w.pods if p.checkpoint_saved}
        return next((p for p in pods if p.checkpoint_request not in acked), None)

    @precondition(lambda self: self._unsaved() is not None)
    @rule()
    def workload_saves_checkpoint(self) -> None:
        """The workload's processes agree on a step and save there; process 0 acknowledges the
        request on its pod (multislice.dev/checkpoint-saved). Sometimes: it may never answer."""
        if self._save():
            self._seen()

    def _save(self, after: int | None = None) -> bool:
        """Process 0's pod acknowledges the request (`after`: only once it is that old)."""
        pod = self._unsaved()
        if pod is None or pod.checkpoint_request is None:
            return False
        if after is not None and (
            pod.asked_at is None or pod.asked_at + timedelta(seconds=after) > self.w.now
        ):
            return False
        step = 100 + int((self.w.now - T0).total_seconds())
        pod.checkpoint_saved = (pod.checkpoint_request, step)
        return True

    @precondition(lambda self: self._all_running())
    @rule()
    def training_finishes(self) -> None:
        w, js = self.w, self.w.jobset
        if js is None or not self._all_running():
            return
        js.completed = True
        running = [p for p in w.pods if p.phase == "Running" and p.ready]
        for p in running:
            p.phase, p.ready = "Succeeded", False
        self._seen()

    @precondition(lambda self: self.w.jobset is not None and self.w.jobset.gone_at is None)
    @rule()
    def user_deletes_the_jobset(self) -> None:
        js = self.w.jobset
        if js is None or js.gone_at is not None:
            return
        js.gone_at = self.w.now + timedelta(seconds=5)
        self._seen()

    # ------------------------------------------------------------ rules: Kueue

    @precondition(lambda self: self.w.workload is not None)
    @rule()
    def kueue_reserves_quota(self) -> None:
        wl = self.w.workload
        if wl is None or not wl.active or wl.reserved or wl.finished:
            return
        self._reserve()
        self._seen()

    @precondition(lambda self: self._admissible())
    @rule()
    def kueue_admits(self) -> None:
        if not self._admissible():
            return
        self._admit()
        self._seen()

    @precondition(lambda self: self.w.workload is not None)
    @rule()
    def kueue_preempts(self) -> None:
        wl = self.w.workload
        if wl is None or not wl.reserved or wl.evicted or wl.finished:
            return
        self._evict("Preempted")
        self._seen()

    # ------------------------------------------------------------ rules: the user

    @precondition(lambda self: bool(self.status) and not self.gone)
    @rule(
        phase=st.sampled_from([None, Phase.SUCCEEDED, Phase.FAILED]),
        drop_finalizer=st.booleans(),
    )
    def user_forces(self, phase: Phase | None, drop_finalizer: bool) -> None:
        """What users do to a job that seems stuck: write a terminal phase by hand (kubectl
        edit --subresource=status), remove the finalizers, or both at once."""
        if phase is None and not (drop_finalizer and self.has_finalizer):
            return
        if phase is not None:
            self.status = {**self.status, "phase": str(phase)}
        if drop_finalizer:
            self.has_finalizer = False
            if self.deleting:
                self._gone()
        self._seen()

    @precondition(lambda self: not self.gone and not self.deleting)
    @rule()
    def user_toggles_suspend(self) -> None:
        self.suspend = not self.suspend
        self.w.generation += 1  # a spec change: the dry-run verdict was for the old generation
        self._seen()

    @precondition(lambda self: not self.gone and not self.deleting)
    @rule()
    def user_deletes_the_job(self) -> None:
        self._delete_job()
        self._seen()


class ManagedJob(DecideMachine):
    """A job without a queue: the operator's own lifecycle."""

    @initialize(job=jobs([None]), **LATENCIES)
    def setup(self, job: Job, create_latency: int, delete_latency: int, warm: bool) -> None:
        self.start(job, create_latency, delete_latency, warm)

    @precondition(lambda self: self._over())
    @rule(job=jobs([None]), **LATENCIES)
    def next_job(self, job: Job, create_latency: int, delete_latency: int, warm: bool) -> None:
        """The job is over: the rest of the steps go to another (a fresh world)."""
        self.start(job, create_latency, delete_latency, warm)


ELASTIC_WAITS: list[int | None] = [0, 30, 120]  # spec.elastic.waitSeconds: at once, soon, later


class ElasticJob(DecideMachine):
    """A job without a queue (an elastic job cannot be queued) with spec.elastic: it shrinks to
    MIN_SLICES after a loss, by recreating its JobSet, and grows back after a checkpoint."""

    @initialize(job=jobs([None], ELASTIC_WAITS), **ELASTIC_LATENCIES)
    def setup(self, job: Job, create_latency: int, delete_latency: int, warm: bool | str) -> None:
        self.start(job, create_latency, delete_latency, warm)

    @precondition(lambda self: self._over())
    @rule(job=jobs([None], ELASTIC_WAITS), **ELASTIC_LATENCIES)
    def next_job(
        self, job: Job, create_latency: int, delete_latency: int, warm: bool | str
    ) -> None:
        """The job is over: the rest of the steps go to another (a fresh world)."""
        self.start(job, create_latency, delete_latency, warm)


class QueuedJob(DecideMachine):
    """A job in a Kueue LocalQueue: its ClusterQueue with this operator's admission check, or
    for quota only."""

    @initialize(job=jobs(["check", "quota"]), **LATENCIES)
    def setup(self, job: Job, create_latency: int, delete_latency: int, warm: bool) -> None:
        self.start(job, create_latency, delete_latency, warm)

    @precondition(lambda self: self._over())
    @rule(job=jobs(["check", "quota"]), **LATENCIES)
    def next_job(self, job: Job, create_latency: int, delete_latency: int, warm: bool) -> None:
        """The job is over: the rest of the steps go to another (a fresh world)."""
        self.start(job, create_latency, delete_latency, warm)


@contextlib.contextmanager
def shrink_budget(seconds: int) -> Iterator[None]:
    """Hypothesis shrinks failures for up to 5 minutes (engine.MAX_SHRINKING_SECONDS, no
    setting); `make test` gives it MACHINE_SHRINK_SECONDS, `make fuzz` the full 5 minutes."""
    before = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if before is None:  # another hypothesis: its own default
        yield
        return
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = before


SHRINK_SECONDS = int(os.environ.get("MACHINE_SHRINK_SECONDS", "60"))


class TestManagedJob(ManagedJob.TestCase):  # type: ignore[misc,valid-type]
    settings = settings_from_env()

    def runTest(self) -> None:
        with shrink_budget(SHRINK_SECONDS):
            super().runTest()


class TestElasticJob(ElasticJob.TestCase):  # type: ignore[misc,valid-type]
    settings = settings_from_env(share=ELASTIC_SHARE)

    def runTest(self) -> None:
        with shrink_budget(SHRINK_SECONDS):
            super().runTest()


class TestQueuedJob(QueuedJob.TestCase):  # type: ignore[misc,valid-type]
    settings = settings_from_env(share=QUEUED_SHARE)

    def runTest(self) -> None:
        with shrink_budget(SHRINK_SECONDS):
            super().runTest()
