"""decide(): observed state -> actions and status. The reconcile brain, pure and table-tested.

Level-based like the JobSet and Kueue controllers: every call recomputes the desired state from what
is observed now (the job, its JobSet, its slices' pools and nodes, its pods) and from the job's own
status (the only memory: restart count, gang attempts and backoff deadline, per-slice history).
Nothing here does I/O; the controller applies the actions and writes the status, and a crash
between any two steps just means the next call sees a little more done and carries on.

One pass, in order:

1. `derive` the facts (facts.py): the job's own JobSet, one record per pod and its views, the
   job's capacity model (`Facts.capacity`, chosen once from the plan: capacity.model_of) and
   the slices' readiness as it sees them, each cause's restart strategy (`Facts.restart`),
   the optional steps its spec selects (`Facts.steps`: Kueue, MultiKueue, preflight, elastic;
   a step's module is entered only for a job that selected it), restarts by cause, the
   capacity clock.
2. The verdicts (verdicts.py), in one order: the first that fires ends the pass with its own
   actions (a failed job deletes its JobSet and releases its pools; nothing is created).
3. Otherwise the lifecycle (`_lifecycle`): the apiserver's dry run before the first capacity if
   the model asks for it, the finalizer; the preflight compile (preflight.py) if the spec asks
   for it; the Kueue gate (kueue_gate.py) for a job that names a queue
   (`_queued`: held, or provisioning before admission); the capacity (`Facts.capacity.provide`:
   what to create, what to repair); then the JobSet (`_run`): a restart the operator carries
   out (restart_strategy.py: a resize), the JobSet created or resumed, or running (running.py)
   with the startup deadline and checkpoints on demand.
4. The phase is settled once; status.slices and goodput follow from it; the invariants are
   checked on the whole decision (invariants.py).

Which capacity model or restart strategy a job has is never tested here: the model and the
strategy answer (capacity.py, restart_strategy.py; they are plugins: registry.py).
"""

from __future__ import annotations

import dataclasses

from multislice_operator.api.models import (
    ConditionType,
    MultisliceJobSpec,
    MultisliceJobStatus,
    Phase,
    SchedulingStatus,
)
from multislice_operator.common.errors import SpecError
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile import (
    checkpoint,
    elastic,
    goodput,
    invariants,
    kueue_gate,
    maintenance,
    multikueue,
    preflight,
    restart_strategy,
    startup,
    verdicts,
)
from multislice_operator.reconcile.capacity import (
    NO_CAPACITY,
    PROVISIONED,
    Capacity,
    pools_present,
    release_stopped,
    stop_wait,
    strays,
)
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.deltas import deltas
from multislice_operator.reconcile.facts import Facts, derive
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.running import count_restarts, running_phase
from multislice_operator.reconcile.slices import slice_statuses
from multislice_operator.reconcile.types import (
    AddFinalizer,
    CheckState,
    CreateJobSet,
    DecideConfig,
    Decision,
    JobMeta,
    JobSetObservation,
    Observed,
    SetJobSetSuspend,
    ValidateJobSet,
)

TERMINAL_RESYNC_FACTOR = 6  # a finished job is looked at less often (TTL, a lying status)
CAPACITY_END_PREFIX = "flexend-"  # one request per end of the capacity (flex-start's run)


def decide(
    meta: JobMeta,
    spec: MultisliceJobSpec | None,
    plan: Plan | None,
    spec_error: SpecError | None,
    old_status: MultisliceJobStatus | None,
    obs: Observed,
    cfg: DecideConfig | None = None,
) -> Decision:
    """From what is observed now to what to do next and the status to write."""
    cfg = cfg or DecideConfig.from_settings()
    old = old_status or MultisliceJobStatus()
    f = derive(meta, spec, plan, spec_error, old, obs, cfg)
    if f.steps.multikueue and multikueue.runs_elsewhere(f):
        return invariants.enforce(f, _manager(f))  # a worker cluster runs it
    verdict = verdicts.first(f)
    if verdict is None and _asks_apiserver(f):
        # Before the first pool: the apiserver's own verdict on the JobSet and its first Job (a
        # dry run). Nothing else changes, so nothing is written: its answer comes in a moment.
        return invariants.enforce(
            f,
            Decision(
                old,
                [ValidateJobSet(restart_strategy.jobset_value(f.restart))],
                requeue_after=cfg.resync_seconds,
                keep_status=True,
            ),
        )
    b = Builder(meta, old, f.now)
    due = _every_pass(f, b)
    if verdict is not None:
        phase, message = verdicts.finish(f, b, verdict)
        cap = NO_CAPACITY
    else:
        phase, message, cap = _lifecycle(f, b, due)
        if f.plan is not None:
            _active_slices(b, f.js)
        if f.plan is not None and f.steps.elastic:
            elastic.degraded(b, f.size)
        deadline = verdicts.next_deadline(f)
        if deadline is not None:
            b.requeue_in(deadline)
    b.settle(phase, message)
    _stamp_jobset(f, b)
    # Being deleted: the slices and the goodput stay as last written (one status write for the
    # deletion, not one per pool state, or per pool gone, seen while the pools are released).
    if not f.deleting:
        if f.plan is not None and f.error is None:
            slice_statuses(f, b, f.plan, cap.repairing, cap.blips)
            b.status.capacity = f.capacity.status(f)  # the model's own part
        goodput.account(f, b, cap.stalled, bool(cap.degraded))
    b.transition_event()
    decision = Decision(
        b.status,
        b.actions,
        b.events,
        requeue_after=_next_pass(f, b),
        metrics=deltas(old, b.status, b.events, f.now),
    )
    return invariants.enforce(f, decision)


def _manager(f: Facts) -> Decision:
    """A MultiKueue manager's pass (multikueue.manager), which writes no status: MultiKueue
    copies the worker's. Unless nothing can queue the job (the operator does not watch Kueue,
    Kueue does not answer): then it says so, as any queued job does, and holds nothing."""
    d = multikueue.manager(f)
    if f.deleting or f.plan is None:
        return d
    b = Builder(f.meta, f.old, f.now)
    g = kueue_gate.gate(f, b)
    if g.reason not in (Reason.NO_KUEUE_WORKLOAD, Reason.KUEUE_UNSUPPORTED):
        return d
    phase, message = kueue_gate.hold(f, b, g)
    b.settle(phase, message)
    b.transition_event()
    return Decision(b.status, b.actions, b.events, requeue_after=b.requeue or d.requeue_after)


def _active_slices(b: Builder, js: JobSetObservation | None) -> None:
    """status.activeSlices: the slices the JobSet runs on. A suspended JobSet (a queued job's,
    before Kueue admits it) runs nothing: not counted, and no status write for it."""
    if js is not None and js.replicas and not js.deleting and not js.suspended:
        b.status.active_slices = js.replicas


def _stamp_jobset(f: Facts, b: Builder) -> None:
    """A JobSet created this pass restarts as the job's chosen strategies say (its one
    failurePolicy.restartStrategy), and each strategy says what it needs to of it; where the
    cluster serves PodGroups its pods form one gang (render/podgroup.py)."""
    value = restart_strategy.jobset_value(f.restart)
    created = False
    for i, a in enumerate(b.actions):
        if isinstance(a, CreateJobSet):
            b.actions[i] = dataclasses.replace(a, restart_strategy=value, gang=f.obs.pod_groups)
            created = True
    if created:
        restart_strategy.announce(f, b)


def _asks_apiserver(f: Facts) -> bool:
    """A job about to create its first capacity, whose JobSet the apiserver has not judged (if
    its capacity model asks for that dry run: capacity.py)."""
    if not f.capacity.dry_run_first:
        return False
    return f.js is None and f.obs.admission is None and not pools_present(f)


def _next_pass(f: Facts, b: Builder) -> float:
    if b.requeue is not None:
        return b.requeue
    terminal = b.status.phase in (Phase.SUCCEEDED, Phase.FAILED)
    return f.cfg.resync_seconds * (TERMINAL_RESYNC_FACTOR if terminal else 1)


def _every_pass(f: Facts, b: Builder) -> str | None:
    """What every pass of a valid job states, whatever ends it; the maintenance checkpoint
    request due now, if any."""
    plan = f.plan
    if plan is None or f.error is not None:
        return None
    b.cond(
        ConditionType.VALIDATED, "True", Reason.VALID, f"{plan.slices} x {plan.shape.accelerator}"
    )
    b.status.total_chips = plan.total_chips
    # The clocks of pods waiting for a node, once kept (scheduling.py): until they stop; the
    # clock of a slice's missing pods from the first pass that sees them (nothing else has it).
    b.status.scheduling = _scheduling_kept(f)
    advice = plan.advice
    bound = "True" if advice.verdict == "dcn-bound" else "False"
    reason = {"ok": Reason.BATCH_LARGE_ENOUGH, "dcn-bound": Reason.BATCH_TOO_SMALL}.get(
        advice.verdict, Reason.NO_BATCH_HINT
    )
    b.cond(ConditionType.DCN_BOUND, bound, reason, advice.message)
    if f.steps.preflight:
        preflight.record(f, b)
    if not f.deleting and f.finished_before and not f.world_agrees:
        _status_ignored(f, b)
    if f.deleting:
        # Deleting kills the pods (JobSet may count a restart on its way out): no restart to
        # record or announce (RestartingAllSlices would page on a deletion).
        return None
    count_restarts(f, b)
    return maintenance.assess(f, b)


def _scheduling_kept(f: Facts) -> SchedulingStatus | None:
    clocks = f.scheduling
    if clocks is None or f.old.scheduling is not None:
        return clocks
    if clocks.pods_missing_since is not None:
        return SchedulingStatus(pods_missing_since=clocks.pods_missing_since)
    return None


def _status_ignored(f: Facts, b: Builder) -> None:
    b.event(
        Reason.STATUS_IGNORED,
        f"status.phase says {f.old.phase} but the JobSet is still running: the operator does "
        "not act on a status it did not derive from the world; the phase is recomputed",
    )
    # Forget the terminal memory that came with it, so the job is judged from the world again.
    b.status.completion_time = None
    b.status.conditions = [
        c
        for c in b.status.conditions
        if c.type not in (ConditionType.COMPLETED, ConditionType.FAILED)
    ]


def _lifecycle(f: Facts, b: Builder, due: str | None) -> tuple[Phase, str, Capacity]:
    """No verdict ended the pass: the Kueue gate, the job's capacity, then its JobSet."""
    assert f.plan is not None and f.spec is not None
    _begin(f, b)
    compiling = preflight.gate(f, b) if f.steps.preflight else None  # before any capacity
    if compiling is not None:
        return (*compiling, NO_CAPACITY)
    g = kueue_gate.gate(f, b) if f.steps.kueue else None
    queued = _queued(f, b, g)
    if queued is not None:
        return queued
    cap = f.capacity.provide(f, b, verdicts.gang_up(f))
    if g is not None:
        kueue_gate.admitted(b, g)
        kueue_gate.reclaim(f, b)
    if g is not None and f.steps.multikueue:
        multikueue.lost(f, b, g.check.name if g.check else None, cap.rolled_back)
    return _run(f, b, cap, due)


def _begin(f: Facts, b: Builder) -> None:
    """What every lifecycle pass does first: the first pass's memory, the finalizer before the
    first capacity, the job's stray pools deleted."""
    assert f.plan is not None
    plan = f.plan
    b.status.startup = None  # timed again below, only while the JobSet starts
    if b.status.start_time is None:  # the job's first active pass
        b.status.start_time = f.now
        if plan.warnings:  # said once: validate printed it too, but nobody may have run it
            b.event(
                Reason.NO_CHECKPOINT, "; ".join(f"{w.path}: {w.message}" for w in plan.warnings)
            )
    if f.capacity.finalizer_first and not f.meta.has_finalizer:
        b.add(AddFinalizer())  # before any pool can exist
    b.delete_pools(strays(f))  # labelled with our uid, named by no plan of ours: never needed


def _queued(f: Facts, b: Builder, g: kueue_gate.Gate | None) -> tuple[Phase, str, Capacity] | None:
    """A queued job that Kueue holds, or whose quota is reserved before admission; None: run."""
    if g is not None and g.allows == kueue_gate.Pass.HOLD:
        return (*_hold(f, b, g), NO_CAPACITY)
    if g is not None and g.allows == kueue_gate.Pass.PROVISION:
        return _provision(f, b, g)
    if g is not None and g.allows == kueue_gate.Pass.ADMISSION:
        b.status.capacity_ready_time = None
        return (*kueue_gate.waiting_for_admission(f, b, g.message), NO_CAPACITY)
    return None


def _run(f: Facts, b: Builder, cap: Capacity, due: str | None) -> tuple[Phase, str, Capacity]:
    """The JobSet on the capacity: a restart the operator carries out, the JobSet created or
    resumed, or running (the startup deadline, checkpoints on demand)."""
    assert f.plan is not None
    plan = f.plan
    restarting = restart_strategy.carry_out(f, b, cap)  # e.g. a resize (spec.elastic)
    if restarting is not None:
        return (*restarting, cap)
    js = f.js
    if js is None:
        return _create(f, b, cap)
    b.status.job_set = plan.name
    if js.suspended:
        return _resume(f, b, cap)
    if cap.with_pods is not None:
        b.status.capacity_ready_time = None  # no deadline runs while the capacity comes
        return Phase.PROVISIONING, cap.with_pods, cap
    phase, message = running_phase(f, b, js, cap.ready)
    b.status.capacity_ready_time = f.capacity_ready_since
    startup.check(f, b, phase, cap.stalled)
    grow = elastic.grow_request(plan, js, f.size, f.attempt) if f.steps.elastic else None
    checkpoint.serve_requests(f, b, due, _capacity_end(f, b), grow)
    return phase, message, cap


def _create(f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str, Capacity]:
    """No JobSet yet: created once the capacity is ready (or comes with its pods)."""
    assert f.plan is not None
    plan = f.plan
    if cap.with_pods is None and not cap.ready:
        return cap.phase or Phase.PENDING, cap.message, cap
    b.add(elastic.create(plan, f.old, f.size.target) if f.steps.elastic else CreateJobSet())
    b.status.job_set = plan.name
    b.status.active_slices = f.size.target
    if cap.with_pods is not None:  # its pending pods bring the capacity (flex-start)
        return Phase.PROVISIONING, cap.with_pods, cap
    b.status.capacity_ready_time = f.now
    # Written as the next pass will see it (the JobSet, nothing running yet), so creating
    # the JobSet costs one status write, not two.
    seen = JobSetObservation(replicas=f.size.target)
    return (*running_phase(f, b, seen, True), cap)


def _resume(f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str, Capacity]:
    """A suspended JobSet (a queued job's, before admission; a held one): resumed once its
    capacity is ready."""
    b.status.capacity_ready_time = None  # no pod to judge until it runs
    if cap.ready:
        b.add(SetJobSetSuspend(False))
        return Phase.STARTING, "capacity ready again; resuming the JobSet", cap
    if cap.with_pods is not None:  # its pending pods bring the capacity (flex-start)
        b.add(SetJobSetSuspend(False))
        return Phase.PROVISIONING, cap.with_pods, cap
    if cap.phase is not None:
        return cap.phase, cap.message, cap
    cond = b.status.condition(PROVISIONED)
    waiting = cond.message if cond and cond.message else "waiting for capacity"
    return Phase.PROVISIONING, f"resuming: {waiting}", cap


def _capacity_end(f: Facts, b: Builder) -> str | None:
    """A checkpoint request spec.maintenance.checkpointAheadSeconds before the capacity is taken
    away, when its model knows when (flex-start's maximum run duration: GKE removes the VMs
    then, a disruption, every slice restarts)."""
    assert f.spec is not None
    ahead = f.spec.maintenance.checkpoint_ahead_seconds
    end = f.capacity.ends(f) if ahead is not None else None
    if ahead is None or end is None:
        return None
    due = (end - f.now).total_seconds() - ahead
    if due > 0:
        b.requeue_in(due)
        return None
    return f"{CAPACITY_END_PREFIX}{int(end.timestamp())}"


def _hold(f: Facts, b: Builder, g: kueue_gate.Gate) -> tuple[Phase, str]:
    """Kueue keeps the job waiting: no node pool, its JobSet (created at once, suspended) waits;
    one that ran is suspended, and its Workload's quota given back once it stopped."""
    assert f.plan is not None
    kueue_gate.stop(f, b, stop_wait(f) is None)
    note = release_stopped(f, b)
    b.status.attempt_start_time = None  # an attempt in flight is abandoned with the quota
    b.status.capacity_ready_time = None
    if g.reason in (Reason.EVICTED, Reason.INADMISSIBLE, Reason.QUOTA_PENDING):
        f.capacity.held(f, b, note)  # no quota: what becomes of the capacity
    if f.js is None and f.js_other is None and not b.replanned:
        b.add(CreateJobSet())
    b.status.job_set = f.plan.name
    gated = kueue_gate.Gate(g.allows, g.reason, f"{g.message}{note}", g.phase, g.workload, g.check)
    return kueue_gate.hold(f, b, gated)


def _provision(f: Facts, b: Builder, g: kueue_gate.Gate) -> tuple[Phase, str, Capacity]:
    """Quota reserved, our check Pending: the gang, all or none, before admission."""
    assert f.plan is not None and g.workload is not None and g.check is not None
    b.status.capacity_ready_time = None
    cq = g.workload.cluster_queue or "?"
    name = g.check.name
    cap = f.capacity.before_admission(f, b)
    if cap.preexisting is not None:  # nothing to provision: the check is Ready at once
        kueue_gate.report(f, b, g, CheckState.READY, cap.preexisting)
        phase, text = kueue_gate.waiting_for_admission(
            f, b, f"quota reserved in ClusterQueue {cq}; {cap.preexisting}"
        )
        return phase, text, NO_CAPACITY
    if cap.rolled_back is not None:
        kueue_gate.report(f, b, g, CheckState.RETRY, cap.rolled_back)
        retry = kueue_gate.Gate(
            kueue_gate.Pass.HOLD,
            Reason.CHECK_RETRY,
            f"{cap.message}; admission check {name} set to Retry: Kueue takes the quota back "
            "and queues the job again",
        )
        return (*kueue_gate.hold(f, b, retry), cap)
    if cap.ready or cap.with_pods is not None:
        # Capacity that comes with the pods (flex-start: pools up but empty) is admitted; the
        # JobSet's pods, pending once it is resumed after Kueue's admission, bring it.
        message = cap.with_pods or f"all {len(f.plan.pools)} node pools of the gang ready"
        kueue_gate.report(f, b, g, CheckState.READY, message, pin=True)
        text = f"{message}; admission check {name} Ready: waiting for Kueue to admit"
        return (*kueue_gate.waiting_for_admission(f, b, text), cap)
    # Provisioning, waiting out the backoff of a rolled-back attempt, or no provisioner: the
    # gang's own phase and message say which; the check stays Pending and the quota ours.
    b.cond(ConditionType.ADMITTED, "False", Reason.GANG_PROVISIONING,
           f"quota reserved in ClusterQueue {cq}; {cap.message}")  # fmt: skip
    return cap.phase or Phase.PROVISIONING, cap.message, cap
