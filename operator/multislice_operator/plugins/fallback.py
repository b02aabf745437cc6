"""Capacity model `Fallback` (spec.provisioning.mode Fallback): an ordered list of ways to get
the gang, tried one after another. Pure.

Each option (spec.provisioning.fallback.options) is a capacity type (a reservation, flex-start,
spot, on-demand), optionally another zone of the cluster's region and another shape (an
accelerator and slice count with its own parallelism, provisioning.fallback.shapes), served by
another capacity model (Managed node pools by default; DynamicSlicing cubes of a reservation
block; Existing pools). The job is planned as the option it tries now (`compose`: the plan's
shape, parallelism, capacity and pools are that option's; `status.fallback.option` says which),
so its JobSet, environment, Kueue Workload and node pools are always one option's: slices are
never mixed across options.

One option is tried all or none, by its own model (wrapped: `Fallback`): a stockout, a quota
error, an exhausted reservation, a gang timeout, or the option's trySeconds running out (also
while flex-start pools wait for capacity or Kueue holds the job without quota) leaves it: what it
holds is released first (its node pools, its JobSet if one waits), then the next option is tried
at once, and after the last one the first again after a backoff (a round). With spec.preflight
each shape is compiled before its first option is tried; an option whose shape the compiler
refused is skipped (0 pools for it), and only when every shape is refused does the job fail.
Errors retrying cannot fix still fail the job. Once an option's gang is up the job runs there:
a lost slice is repaired by that option's model, as ever.

status.fallback (api/models.py FallbackStatus) is this model's memory: the option tried, since
when, the round, why the last one was left, each option's attempts and waiting seconds, and the
shapes the compiler judged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from multislice_operator.api.models import (
    CEL_MODE,
    CapacityType,
    FallbackLeave,
    FallbackOptionStatus,
    FallbackShapeStatus,
    FallbackStatus,
    MultisliceJobSpec,
    MultisliceJobStatus,
    Phase,
    PreflightState,
    PreflightStatus,
    Rule,
)
from multislice_operator.common import keys
from multislice_operator.common.errors import FieldError, SpecError
from multislice_operator.common.pools import CODE_QUOTA, CODE_RESERVATION_EXHAUSTED, CODE_STOCKOUT
from multislice_operator.planning.plan import (
    FallbackPlan,
    OptionPlan,
    Plan,
    plan_spec,
    rule_errors,
)
from multislice_operator.reconcile.capacity import (
    PROVISIONED,
    Capacity,
    CapacityModel,
    Released,
    Size,
    Slices,
)
from multislice_operator.reconcile.context import Builder, at_second, backoff_seconds
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    DecideConfig,
    Decision,
    DeleteJobSet,
    JobSetObservation,
    Observed,
    SliceObservation,
)
from multislice_operator.registry import CapacityPlugin, Feature, Registry

if TYPE_CHECKING:
    from multislice_operator.common.pools import PoolError
    from multislice_operator.reconcile.facts import Facts

MODE = "Fallback"
OPTIONS = "spec.provisioning.fallback.options"
SHAPES = "spec.provisioning.fallback.shapes"
# What a leave says, after "left option k (what) after Ns: ".
WORDS = {
    FallbackLeave.STOCKOUT: "stockout",
    FallbackLeave.QUOTA: "quota",
    FallbackLeave.RESERVATION: "reservation exhausted",
    FallbackLeave.TIMEOUT: "not ready within its trySeconds",
    FallbackLeave.REFUSED: "its shape did not compile",
    FallbackLeave.FAILED: "its gang failed",
}
_LEAVE_OF_CODE = {
    CODE_STOCKOUT: FallbackLeave.STOCKOUT,
    CODE_QUOTA: FallbackLeave.QUOTA,
    CODE_RESERVATION_EXHAUSTED: FallbackLeave.RESERVATION,
}


# ---------------------------------------------------------------- planning: one option at a time


def _shape_index(spec: MultisliceJobSpec, name: str | None) -> int | None:
    fb = spec.provisioning.fallback
    assert fb is not None
    return next((i for i, s in enumerate(fb.shapes) if s.name == name), None) if name else None


def try_seconds(spec: MultisliceJobSpec, k: int) -> int:
    fb = spec.provisioning.fallback
    assert fb is not None
    return fb.options[k].try_seconds or spec.provisioning.timeout_seconds


def option_spec(spec: MultisliceJobSpec, k: int) -> MultisliceJobSpec:
    """The job as option `k` runs it: its capacity, model and shape; everything else the job's.
    Its model's gang timeout is the option's trySeconds."""
    fb = spec.provisioning.fallback
    assert fb is not None
    opt = fb.options[k]
    provisioning = spec.provisioning.model_copy(
        update={
            "mode": opt.mode,
            "dynamic_slicing": opt.dynamic_slicing,
            "fallback": None,
            "timeout_seconds": try_seconds(spec, k),
        }
    )
    update: dict[str, Any] = {"capacity": opt.capacity, "provisioning": provisioning}
    j = _shape_index(spec, opt.shape)
    if j is not None:
        shape = fb.shapes[j]
        update |= {
            "accelerator": shape.accelerator,
            "topology": shape.topology,
            "slices": shape.slices,
            "parallelism": shape.parallelism,
        }
    return spec.model_copy(update=update)


def _moved(path: str, prefix: str, to: str) -> str | None:
    if path == prefix or path.startswith((f"{prefix}.", f"{prefix}[")):
        return to + path[len(prefix) :]
    return None


def _remap(e: FieldError, k: int, j: int | None) -> FieldError:
    """An error of option k's plan, named where the job's spec says it: the option's capacity,
    model or trySeconds, or its shape's fields."""
    opt = f"{OPTIONS}[{k}]"
    moves = [
        ("spec.capacity", f"{opt}.capacity"),
        ("spec.provisioning.dynamicSlicing", f"{opt}.dynamicSlicing"),
        ("spec.provisioning.mode", f"{opt}.mode"),
        ("spec.provisioning.timeoutSeconds", f"{opt}.trySeconds"),
    ]
    if j is not None:
        moves += [
            (f"spec.{f}", f"{SHAPES}[{j}].{f}")
            for f in ("accelerator", "topology", "slices", "parallelism")
        ]
    for prefix, to in moves:
        path = _moved(e.path, prefix, to)
        if path is not None:
            return FieldError(path, e.message)
    return e


def _option_plans(spec: MultisliceJobSpec, namespace: str, name: str
                  ) -> tuple[list[Plan | None], list[FieldError]]:  # fmt: skip
    """Every option's plan (None where it has errors) and the errors, named in the job's spec."""
    fb = spec.provisioning.fallback
    assert fb is not None
    plans: list[Plan | None] = []
    errors: list[FieldError] = []
    for k, opt in enumerate(fb.options):
        try:
            plans.append(plan_spec(option_spec(spec, k), namespace, name))
        except SpecError as exc:
            plans.append(None)
            j = _shape_index(spec, opt.shape)
            errors += [_remap(e, k, j) for e in exc.errors]
    return plans, errors


def _shape_what(plan: Plan) -> str:
    return f"{plan.shape.accelerator} x {plan.slices}"


def _refused(status: MultisliceJobStatus | None) -> set[str]:
    """The shapes the preflight compile refused (status.fallback.shapes)."""
    fb = status.fallback if status is not None else None
    return {s.name for s in fb.shapes if not s.fits} if fb is not None else set()


def compose(spec: MultisliceJobSpec, namespace: str, name: str,
            status: MultisliceJobStatus | None) -> Plan:  # fmt: skip
    """The plan of the option the job tries now (status.fallback.option; the first when none):
    its shape, capacity and pools, each pool labelled with the option's capacity type (which
    the pods and the Kueue Workload select). Every option is planned, so an error in any of them
    is reported at once, named where the spec says it."""
    fb = spec.provisioning.fallback
    errors = rule_errors(spec, set())
    if fb is None:  # the rules above name it
        raise SpecError(errors or [FieldError("spec.provisioning.fallback", "required")])
    plans, option_errors = _option_plans(spec, namespace, name)
    for e in option_errors:
        if e not in errors:
            errors.append(e)
    if errors:
        raise SpecError(errors)
    tried = status.fallback if status is not None else None
    k = tried.option if tried is not None and tried.option < len(fb.options) else 0
    plan = plans[k]
    assert plan is not None
    options = tuple(
        OptionPlan(
            index=i,
            capacity=str(o.capacity.type),
            reservation=o.capacity.reservation,
            zone=o.zone,
            shape=o.shape or "",
            shape_what=_shape_what(p),
            mode=o.mode,
            try_seconds=try_seconds(spec, i),
        )
        for i, (o, p) in enumerate(zip(fb.options, plans, strict=True))
        if p is not None
    )
    current = options[k]
    refused = _refused(status)
    named = {o.shape for o in options}
    selector = {keys.CAPACITY_TYPE: current.capacity}
    if current.capacity == CapacityType.SPOT.value:
        selector[keys.GKE_SPOT] = "true"  # GKE labels spot nodes so: Kueue's spot flavors match

    def labelled(pools: list[Any]) -> list[Any]:
        return [
            dataclasses.replace(
                p,
                zone=current.zone,
                node_labels={**p.node_labels, keys.CAPACITY_TYPE: current.capacity},
            )
            for p in pools
        ]

    unused = [s.name for s in fb.shapes if s.name not in named]
    warnings = [
        FieldError(SHAPES, f"shape {n!r} is named by no option (options[].shape): never tried")
        for n in unused
    ]
    return dataclasses.replace(
        plan,
        composed=MODE,
        fallback=FallbackPlan(k, options),
        node_pools=labelled(plan.node_pools),
        spare_pools=labelled(plan.spare_pools),
        node_selector=selector,
        shape_key=current.shape,
        quota_key=str(k),
        shape_alternatives=len(named - refused - {current.shape}),
        warnings=[*plan.warnings, *warnings],
    )


# ---------------------------------------------------------------- the model


class Fallback:
    """The options in order, each served by another model (`inner`, the model of the plan's
    mode); decide() gets one per inner model (`wrap`)."""

    name = "Fallback"
    finalizer_first = True  # an option's pools (or Slices) must go before the job does

    def __init__(self, inner: CapacityModel | None = None) -> None:
        self._inner = inner
        # The option's model's (the JobSet judged first; a pool no pod got replaced alone).
        self.dry_run_first = inner is None or inner.dry_run_first
        self.replaces_idle_pools = inner is not None and inner.replaces_idle_pools

    @property
    def inner(self) -> CapacityModel:
        assert self._inner is not None, "Fallback serves a plan through its option's model"
        return self._inner

    # -- what the option's model says

    def slices(self, old: MultisliceJobStatus, obs: Observed, plan: Plan, cfg: DecideConfig,
               now: datetime) -> Slices:  # fmt: skip
        return self.inner.slices(old, obs, plan, cfg, now)

    def size(self, plan: Plan, old: MultisliceJobStatus, slices: Slices, obs: Observed,
             js: JobSetObservation | None, now: datetime) -> Size:  # fmt: skip
        return self.inner.size(plan, old, slices, obs, js, now)

    def clock_ready(self, slices: Slices) -> bool:
        return self.inner.clock_ready(slices)

    def present(self, f: Facts) -> list[str]:
        return self.inner.present(f)

    def release(self, f: Facts, b: Builder) -> bool:
        return self.inner.release(f, b)

    def taken(self, f: Facts) -> list[SliceObservation]:
        return self.inner.taken(f)

    def permanent_errors(self, f: Facts, started: bool) -> list[PoolError]:
        return self.inner.permanent_errors(_as_option(f, self.inner), started)

    def chips_held(self, f: Facts, b: Builder, plan: Plan, in_use: bool) -> int:
        return self.inner.chips_held(f, b, plan, in_use)

    def violations(self, f: Facts, d: Decision) -> list[tuple[int, str]]:
        return self.inner.violations(f, d)

    def status(self, f: Facts) -> dict[str, Any] | None:
        return self.inner.status(f)  # this model's own part is status.fallback

    def ends(self, f: Facts) -> datetime | None:
        return self.inner.ends(f)

    # -- trying the options

    def provide(self, f: Facts, b: Builder, started: bool) -> Capacity:
        g = _as_option(f, self.inner)
        return _provide(f, b, lambda: self.inner.provide(g, b, started), self.inner, started)

    def before_admission(self, f: Facts, b: Builder) -> Capacity:
        g = _as_option(f, self.inner)
        return _provide(f, b, lambda: self.inner.before_admission(g, b), self.inner, False)

    def held(self, f: Facts, b: Builder, note: Released) -> None:
        """Kueue holds the job: its option's model says what becomes of the capacity; an option
        being left moves on once released, and one waiting for its quota past its trySeconds is
        left (the next option's Workload asks for another flavor's quota)."""
        self.inner.held(f, b, note)
        fb = _memory(f, b)
        if fb.leaving is not None:
            _move_on(f, b, fb, self.inner)
            return
        if note is not Released.ALL:
            return
        fb.ready = False  # released: readmitted, the option is provisioned again
        if fb.since is None:
            _begin(f, fb)
        elif _timed_out(f, fb):
            _leave(f, b, fb, self.inner, FallbackLeave.TIMEOUT,
                   "no quota for it in the ClusterQueue's flavors")  # fmt: skip
            _move_on(f, b, fb, self.inner)


_WRAPPED: dict[int, Fallback] = {}


def wrap(inner: CapacityModel) -> CapacityModel:
    """The Fallback model over one option's model (one per model, as decide() compares)."""
    found = _WRAPPED.get(id(inner))
    if found is None:
        found = _WRAPPED[id(inner)] = Fallback(inner)
    return found


def _as_option(f: Facts, inner: CapacityModel) -> Facts:
    """The facts as option's model reads them: the option's spec (its capacity, shape, and
    trySeconds as its gang timeout), and itself as the job's model."""
    assert f.spec is not None and f.plan is not None and f.plan.fallback is not None
    spec = option_spec(f.spec, f.plan.fallback.option)
    return dataclasses.replace(f, spec=spec, capacity=inner)


def _memory(f: Facts, b: Builder) -> FallbackStatus:
    """status.fallback as this pass writes it (the option the plan is for)."""
    assert f.plan is not None and f.plan.fallback is not None
    if b.status.fallback is None:
        b.status.fallback = FallbackStatus(option=f.plan.fallback.option)
    fb = b.status.fallback
    if fb.option == f.plan.fallback.option:
        fb.shape = f.plan.fallback.current.shape
    return fb


def _option_status(fb: FallbackStatus, option: OptionPlan) -> FallbackOptionStatus:
    found = fb.option_status(option.index)
    if found is None:
        found = FallbackOptionStatus(option=option.index, what=option.what)
        fb.options = sorted([*fb.options, found], key=lambda o: o.option)
    return found


def _begin(f: Facts, fb: FallbackStatus) -> None:
    """The option's clock starts (its trySeconds count from now): one more attempt of it."""
    assert f.plan is not None and f.plan.fallback is not None
    fb.since = f.now
    _option_status(fb, f.plan.fallback.current).attempts += 1


def _timed_out(f: Facts, fb: FallbackStatus) -> bool:
    assert f.plan is not None and f.plan.fallback is not None and fb.since is not None
    return (f.now - fb.since).total_seconds() > f.plan.fallback.current.try_seconds


def _provide(f: Facts, b: Builder, attempt: Callable[[], Capacity], inner: CapacityModel,
             started: bool) -> Capacity:  # fmt: skip
    """One pass of the option tried now: its model's gang, left when it rolls back, when its
    time runs out or when the compiler refused its shape; the next option once it is released."""
    assert f.plan is not None and f.plan.fallback is not None
    plan = f.plan.fallback
    fb = _memory(f, b)
    if fb.leaving is not None:
        return _move_on(f, b, fb, inner)
    refusal = _compiled(f, b, fb)
    if refusal is not None:
        _leave(f, b, fb, inner, FallbackLeave.REFUSED, refusal)
        return _move_on(f, b, fb, inner)
    if started and fb.ready:  # the gang is up on this option: a lost slice is its model's
        return attempt()
    next_at = f.old.next_attempt_time
    if next_at is not None and f.now < next_at:  # a round's backoff: nothing held meanwhile
        inner.release(f, b)
        b.requeue_in((next_at - f.now).total_seconds())
        stamp = next_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        message = f"every option tried (round {fb.round - 1}); {_name(plan.current)} at {stamp}"
        b.cond(PROVISIONED, "False", Reason.PROVISIONING, message)
        return Capacity(False, Phase.PROVISIONING, message)
    if fb.since is None:
        _begin(f, fb)
    if _timed_out(f, fb) and not f.slices.enough:
        why = f"not ready within trySeconds ({plan.current.try_seconds}s)"
        return _leave(f, b, fb, inner, FallbackLeave.TIMEOUT, why)
    said = len(b.events)
    cap = attempt()
    if cap.rolled_back is not None:
        # Its model rolled the gang back: not retried here, the next option is tried instead.
        b.events[said:] = [e for e in b.events[said:] if e.reason != Reason.GANG_ROLLED_BACK]
        return _leave(f, b, fb, inner, _why(f, b), cap.rolled_back, released=True)
    if (cap.ready or f.slices.enough) and not fb.ready:
        fb.ready = True
        option = _option_status(fb, plan.current)
        option.waited_seconds += _seconds(f.now, fb.since)
    return dataclasses.replace(cap, message=f"{_name(plan.current)}: {cap.message}")


def _seconds(now: datetime, since: datetime | None) -> int:
    return max(0, int((now - since).total_seconds())) if since is not None else 0


def _name(option: OptionPlan) -> str:
    return f"option {option.index + 1} ({option.what})"


def _why(f: Facts, b: Builder) -> FallbackLeave:
    """Why the option's model rolled its gang back: its timeout, or the first slice's error."""
    cond = b.status.condition(PROVISIONED)
    if cond is not None and cond.reason == Reason.GANG_TIMEOUT:
        return FallbackLeave.TIMEOUT
    codes = [s.error.code for s in f.obs.slices if s.error is not None]
    return _LEAVE_OF_CODE.get(codes[0], FallbackLeave.FAILED) if codes else FallbackLeave.FAILED


def _next(f: Facts, fb: FallbackStatus) -> tuple[OptionPlan | None, bool]:
    """The option after the one tried now whose shape the compiler did not refuse, and whether
    the options wrapped round to the first."""
    assert f.plan is not None and f.plan.fallback is not None
    options = f.plan.fallback.options
    refused = {s.name for s in fb.shapes if not s.fits}
    k = f.plan.fallback.option
    for step in range(1, len(options) + 1):
        option = options[(k + step) % len(options)]
        if option.shape not in refused:
            return option, k + step >= len(options)
    return None, False


def _leave(f: Facts, b: Builder, fb: FallbackStatus, inner: CapacityModel, why: FallbackLeave,
           message: str, released: bool = False) -> Capacity:  # fmt: skip
    """The option tried now is rolled back: what it holds goes (its model's release; a JobSet
    that waited on it too), its waiting is counted, and the move is said once."""
    assert f.plan is not None and f.plan.fallback is not None
    current = f.plan.fallback.current
    waited = _seconds(f.now, fb.since)
    option = _option_status(fb, current)
    if not fb.ready:
        option.waited_seconds += waited
    option.last_left, option.message = why, message[:1024]
    fb.last_left, fb.last_left_option = why, current.index
    fb.leaving, fb.leaving_message, fb.since, fb.ready = why, message[:1024], None, False
    b.status.attempt_start_time = None
    b.status.next_attempt_time = None  # the next option is tried at once, not after a backoff
    nxt, wrapped = _next(f, fb)
    then = (
        f"next: {_name(nxt)}{' after a backoff (every option tried)' if wrapped else ''}"
        if nxt is not None
        else "no other option is left"
    )
    b.event(
        Reason.FALLBACK_MOVED,
        f"left {_name(current)} after {waited}s: {WORDS[why]} ({message}); {then}",
    )
    if not released:
        inner.release(f, b)
    _stop_jobset(f, b)
    text = f"leaving {_name(current)}: {WORDS[why]}; releasing its capacity, then {then}"
    b.cond(PROVISIONED, "False", Reason.LEAVING_OPTION, text)
    b.requeue_in(f.cfg.resync_seconds / 2)
    return Capacity(False, Phase.PROVISIONING, text, rolled_back=text, with_pods=_waits(f, text))


def _stop_jobset(f: Facts, b: Builder) -> None:
    """A JobSet made for the option being left (one waiting for flex-start capacity, or a
    queued job's, suspended) goes with it: the next option makes its own."""
    if f.js is not None and not f.js.deleting:
        b.add(DeleteJobSet(foreground=True))


def _waits(f: Facts, text: str) -> str | None:
    """With a JobSet that is not suspended, the pass says Provisioning through `with_pods`
    (flow.py); a suspended one (a queued job's) is never resumed for it."""
    return text if f.js is not None and not f.js.suspended else None


def _move_on(f: Facts, b: Builder, fb: FallbackStatus, inner: CapacityModel) -> Capacity:
    """An option being left: once nothing of it is held (its pools, Slices and any JobSet that
    waited on it), the next option is the one tried (the next pass plans it)."""
    assert f.plan is not None and f.plan.fallback is not None
    current = f.plan.fallback.current
    _stop_jobset(f, b)
    gone = inner.release(f, b) and f.js is None
    if not gone:
        text = f"leaving {_name(current)} ({WORDS[fb.leaving or FallbackLeave.FAILED]}): " \
            "releasing its capacity"  # fmt: skip
        b.cond(PROVISIONED, "False", Reason.LEAVING_OPTION, text)
        b.requeue_in(f.cfg.resync_seconds / 2)
        return Capacity(False, Phase.PROVISIONING, text, with_pods=_waits(f, text))
    nxt, wrapped = _next(f, fb)
    if nxt is None:  # every shape refused: the preflight's verdict fails the job
        text = f"leaving {_name(current)}: no option left whose shape compiles"
        return Capacity(False, Phase.PROVISIONING, text)
    fb.option, fb.shape, fb.leaving, fb.leaving_message = nxt.index, nxt.shape, None, None
    b.replanned = True  # this pass's plan is the option left: nothing is made of it
    _compiled_before(f, b, fb, nxt)
    text = f"trying {_name(nxt)}"
    if wrapped:
        fb.round += 1
        wait = backoff_seconds(f.meta.uid, fb.round - 1, f.cfg)
        b.status.next_attempt_time = at_second(f.now + timedelta(seconds=wait))
        text += f" after a backoff of {wait:.0f}s (round {fb.round})"
    b.cond(PROVISIONED, "False", Reason.PROVISIONING, text)
    b.requeue_in(1.0)
    return Capacity(False, Phase.PROVISIONING, text)


def _compiled_before(f: Facts, b: Builder, fb: FallbackStatus, nxt: OptionPlan) -> None:
    """Moving to a shape the compiler passed already (this generation): the preflight's record is
    that shape's again, so it is not compiled twice."""
    known = fb.shape_status(nxt.shape)
    pre = b.status.preflight
    if known is None or not known.fits or known.generation != f.meta.generation or pre is None:
        return
    b.status.preflight = PreflightStatus(
        state=PreflightState.PASSED,
        job=pre.job,
        generation=known.generation,
        hbm_bytes_per_device=known.hbm_bytes_per_device,
        hbm_capacity_bytes=known.hbm_capacity_bytes,
        message=known.message,
        time=pre.time,
        shape=nxt.shape,
    )


def _compiled(f: Facts, b: Builder, fb: FallbackStatus) -> str | None:
    """What the preflight compile said of the shape the option runs as (spec.preflight): kept
    in status.fallback.shapes; the compiler's words when it refused it, else None."""
    assert f.plan is not None and f.plan.fallback is not None
    pre = b.status.preflight
    key = f.plan.shape_key or ""
    if pre is None or pre.shape != key or pre.generation != f.meta.generation:
        return None
    if pre.state == PreflightState.RUNNING:
        return None
    fits = pre.state == PreflightState.PASSED
    known = fb.shape_status(key)
    if known is None or known.fits != fits:
        what = _shape_what(f.plan)
        entry = FallbackShapeStatus(
            name=key,
            what=what,
            fits=fits,
            generation=pre.generation,
            hbm_bytes_per_device=pre.hbm_bytes_per_device,
            hbm_capacity_bytes=pre.hbm_capacity_bytes,
            message=pre.message,
        )
        fb.shapes = [*(s for s in fb.shapes if s.name != key), entry]
    return None if fits else (pre.message or "the preflight compile failed")


# ---------------------------------------------------------------- its spec rules

_HAS_FALLBACK = "has(self.fallback)"
RULES = (
    Rule(
        ("provisioning",),
        "spec.provisioning.fallback",
        f"{_HAS_FALLBACK} == (has(self.mode) && self.mode == '{MODE}')",
        f"spec.provisioning.fallback goes with provisioning.mode {MODE}: set both (the options "
        "to try, in order) or neither",
        lambda s: (s.provisioning.fallback is not None) == (s.provisioning.mode == MODE),
    ),
    Rule(
        (),
        "spec.capacity",
        f"{CEL_MODE} != '{MODE}' || !has(self.capacity)",
        f"spec.capacity is not read with provisioning.mode {MODE}: each option says its capacity "
        "(provisioning.fallback.options[].capacity); remove spec.capacity",
        lambda s: s.provisioning.mode != MODE or "capacity" not in s.model_fields_set,
    ),
    Rule(
        ("provisioning", "fallback"),
        f"{OPTIONS}[].shape",
        "self.options.all(o, !has(o.shape) || "
        "(has(self.shapes) && self.shapes.exists(s, s.name == o.shape)))",
        "spec.provisioning.fallback.options[].shape must name one of "
        "provisioning.fallback.shapes (unset: the job's own shape)",
        lambda s: (
            s.provisioning.fallback is None
            or all(
                o.shape is None or any(x.name == o.shape for x in s.provisioning.fallback.shapes)
                for o in s.provisioning.fallback.options
            )
        ),
    ),
    Rule(
        ("provisioning", "fallback"),
        f"{SHAPES}[].name",
        "!has(self.shapes) || self.shapes.all(a, self.shapes.exists_one(b, b.name == a.name))",
        "spec.provisioning.fallback.shapes[].name must be unique",
        lambda s: (
            s.provisioning.fallback is None
            or len({x.name for x in s.provisioning.fallback.shapes})
            == len(s.provisioning.fallback.shapes)
        ),
    ),
    Rule(
        ("provisioning", "fallback"),
        f"{OPTIONS}[].mode",
        f"self.options.all(o, !has(o.mode) || o.mode != '{MODE}')",
        f"spec.provisioning.fallback.options[].mode cannot be {MODE}: an option is served by "
        "Managed, DynamicSlicing or Existing",
        lambda s: (
            s.provisioning.fallback is None
            or all(o.mode != MODE for o in s.provisioning.fallback.options)
        ),
    ),
)


DOCS = """\
An ordered list of ways to get the gang (`provisioning.fallback.options`: a capacity type, a
zone, a shape of `provisioning.fallback.shapes`), each tried all or none by its own model
(Managed, DynamicSlicing or Existing); a stockout, quota error, exhausted reservation, timeout
or a shape the preflight compile refused moves to the next, after the last back to the first
with backoff ([provisioning.md](provisioning.md#fallback-across-capacity-types-and-shapes)).
`status.fallback`: the option and shape tried, why the last was left, each option's waiting.
`status.capacity`: the option's model's.
"""

DESCRIPTION = (
    "an ordered list of capacity options and shapes (provisioning.fallback), each tried all "
    "or none by its own model, the next one after a stockout, quota error or timeout."
)
PLUGIN = CapacityPlugin(
    MODE,
    Fallback(),
    DESCRIPTION,
    accepts={Feature.SPARES: "the option's spare pools"},
    rules=RULES,
    compose=compose,
    wraps=wrap,
    docs=DOCS,
)


def register(r: Registry) -> None:
    r.add_model(PLUGIN)
