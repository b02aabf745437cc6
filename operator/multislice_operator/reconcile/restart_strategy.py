"""Restart strategies: how every slice of a job restarts, one interface, chosen per cause. Pure.

A `RestartStrategy` registers itself (registry.py): its name (status.lastRestart.strategy, whose
enum the CRD takes from the registry), the causes it restarts, what it renders into the JobSet
(`jobset_value`, failurePolicy.restartStrategy: JobSet carries those restarts out; None: the
operator does, on a pass: `carry_out`), its pod's half (`render_job`), the objects its pods need
(`companions`), how the restarts it makes itself are counted (`restarts_made`) and announced.
Implementations (`JobSetStrategy` subclasses): plugins/recreate.py (JobSet's Recreate),
plugins/inplace.py (JobSet's InPlaceRestart) and plugins/resize.py (resize: spec.elastic);
tests/plugins/ holds one written outside the package (JobSet's BlockingRecreate).

`choose` is the one place a job's strategies are chosen, once per pass (`Facts.restart`): for
each cause, of the registered strategies that restart it and are usable, the one of highest
`precedence`. Usable: with a JobSet of the job's own, what that JobSet carries out (its observed
failurePolicy.restartStrategy, or one it includes: InPlaceRestart recreates a failed Job); before
it, what the strategy says of the job and the cluster (`available`: in-place restart where the
cluster has it). A JobSet has one restartStrategy: the chosen JobSet strategies must agree on it
(`jobset_value` raises otherwise), unless one includes the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from multislice_operator.api.models import MultisliceJobSpec, Phase, RestartCause
from multislice_operator.reconcile.types import JobSetObservation, Observed
from multislice_operator.registry import REGISTRY

if TYPE_CHECKING:
    from multislice_operator.reconcile.capacity import Capacity
    from multislice_operator.reconcile.context import Builder
    from multislice_operator.reconcile.facts import Facts
    from multislice_operator.settings import Settings

JOBSET_DEFAULT = "Recreate"  # JobSet's failurePolicy.restartStrategy when none is rendered

Chosen = Mapping[RestartCause, "RestartStrategy"]


class RestartStrategy(Protocol):
    """How all slices restart: one implementation per strategy, registered by name."""

    name: str
    description: str  # what it does, in the CRD's description of status.lastRestart.strategy
    causes: frozenset[RestartCause]
    # Among the strategies usable for a cause, the one of highest precedence is chosen.
    precedence: int
    # Other restartStrategy values a JobSet rendered with this one carries out too.
    includes: frozenset[str]
    # Its restarts are announced by its own events (no RestartingAllSlices for them).
    announces: bool
    # A restart of it while the previous one has not recovered continues that outage.
    continues_outage: bool
    # Where it is available, for `plan` ("": always).
    when: str
    # Its check of the cluster (None: none): a reference `module:function` to an async
    # f(runtime, jobset_crd) -> StrategySupport, loaded and run by the controller at start-up
    # and while its checks repeat (controller/versions.py); decide() reads the result as
    # `Observed.support[name]`, the operator's log says it once as `said`.
    probe: str | None
    said: str

    @property
    def jobset_value(self) -> str | None:
        """The JobSet failurePolicy.restartStrategy it renders; None: the operator carries it
        out."""
        ...

    def available(self, spec: MultisliceJobSpec | None, obs: Observed) -> bool:
        """Whether a JobSet created now (or the operator, for its own) may use it."""
        ...

    def render_job(self, job_spec: dict[str, Any], spec: MultisliceJobSpec,
                   settings: Settings | None) -> None:  # fmt: skip
        """Its half of the JobSet's Job (the pod template), in place."""
        ...

    def companions(self, namespace: str, pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """Objects its pods need, applied (path, body) before the JobSet is created."""
        ...

    def announce(self, f: Facts, b: Builder, chosen: Chosen) -> None:
        """What the job says of it when its JobSet is created (a condition, an event)."""
        ...

    def restarts_made(self, before: int, js: JobSetObservation) -> dict[RestartCause, int]:
        """Restarts it made itself that the JobSet's counters include, by cause, since the
        status said `before` restarts (JobSet's own restarts are split by the pods)."""
        ...

    def carry_out(self, f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
        """What the operator does this pass; a phase and message: a restart in flight, which
        ends the lifecycle's pass."""
        ...


class JobSetStrategy:
    """A strategy JobSet carries out itself (failurePolicy.restartStrategy `jobset_value`): the
    operator renders it and counts its restarts from the JobSet; nothing is done by a pass.
    Subclasses name it, its causes and precedence (plugins/recreate.py, plugins/inplace.py)."""

    name = JOBSET_DEFAULT
    description = "every pod deleted and created again"
    causes: frozenset[RestartCause] = frozenset()
    precedence = 0
    jobset_value: str | None = JOBSET_DEFAULT
    includes: frozenset[str] = frozenset()
    announces = False
    continues_outage = False
    when = ""
    probe: str | None = None
    said = ""

    def available(self, spec: MultisliceJobSpec | None, obs: Observed) -> bool:
        return True

    def render_job(self, job_spec: dict[str, Any], spec: MultisliceJobSpec,
                   settings: Settings | None) -> None:  # fmt: skip
        return None

    def companions(self, namespace: str, pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return []

    def announce(self, f: Facts, b: Builder, chosen: Chosen) -> None:
        return None

    def restarts_made(self, before: int, js: JobSetObservation) -> dict[RestartCause, int]:
        return {}  # JobSet's restarts: attributed from the pods (restarts.py)

    def carry_out(self, f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
        return None  # JobSet restarts the slices itself


def registered() -> list[RestartStrategy]:
    return list(REGISTRY.strategies().values())


def _carries(js_value: str, s: RestartStrategy) -> bool:
    """A JobSet rendered with restartStrategy `js_value` carries out `s`'s restarts."""
    if s.jobset_value is None or s.jobset_value == js_value:
        return True
    owner = next((t for t in registered() if t.jobset_value == js_value), None)
    return owner is not None and s.jobset_value in owner.includes


def _usable(s: RestartStrategy, spec: MultisliceJobSpec | None, js: JobSetObservation | None,
            obs: Observed) -> bool:  # fmt: skip
    if js is not None and s.jobset_value is not None:
        return _carries(js.restart_strategy, s)
    return s.available(spec, obs)


def choose(spec: MultisliceJobSpec | None, js: JobSetObservation | None, obs: Observed) -> Chosen:
    """Each cause's strategy for this job now (a cause no usable strategy restarts is absent:
    a resize without spec.elastic)."""
    out: dict[RestartCause, RestartStrategy] = {}
    usable = [s for s in registered() if _usable(s, spec, js, obs)]
    for cause in RestartCause:
        candidates = [s for s in usable if cause in s.causes]
        if candidates:
            out[cause] = max(candidates, key=lambda s: s.precedence)  # first of the highest
    return out


def unique(chosen: Chosen) -> list[RestartStrategy]:
    """Each chosen strategy once, in the causes' order."""
    seen: list[RestartStrategy] = []
    for s in chosen.values():
        if all(s is not t for t in seen):
            seen.append(s)
    return seen


def jobset_value(chosen: Chosen) -> str:
    """The JobSet's one failurePolicy.restartStrategy for the chosen strategies: theirs, or the
    one that includes the others (ValueError when they disagree)."""
    values = {s.jobset_value for s in unique(chosen) if s.jobset_value is not None}
    for s in unique(chosen):
        if s.jobset_value is not None and values - {s.jobset_value} <= s.includes:
            return s.jobset_value
    if not values:
        return JOBSET_DEFAULT
    raise ValueError(
        f"restart strategies disagree on JobSet failurePolicy.restartStrategy: {sorted(values)}"
    )


def rendering(value: str) -> RestartStrategy | None:
    """The registered strategy that renders JobSet restartStrategy `value` (None: none does)."""
    return next((s for s in registered() if s.jobset_value == value), None)


def carry_out(f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
    """The restart the operator carries out this pass, if any (the first in flight wins)."""
    for s in unique(f.restart):
        restarting = s.carry_out(f, b, cap)
        if restarting is not None:
            return restarting
    return None


def announce(f: Facts, b: Builder) -> None:
    """A JobSet is created this pass: each registered strategy says what it needs to."""
    for s in registered():
        s.announce(f, b, f.restart)


def summary() -> str:
    """How a job's slices restart, by cause, for `plan` (offline: where a strategy depends on
    the cluster or the spec, it says where; the job's status says which ran)."""
    by_phrase: dict[str, list[str]] = {}
    for cause in RestartCause:
        ranked = sorted((s for s in registered() if cause in s.causes), key=lambda s: -s.precedence)
        words = [f"{s.name} {s.when}".strip() for s in ranked]
        if words:
            by_phrase.setdefault(", else ".join(words), []).append(cause.value)
    return "; ".join(f"{', '.join(causes)} {phrase}" for phrase, causes in by_phrase.items())
