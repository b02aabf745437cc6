"""What a decision adds to the operator's counters and histograms: from the old and new status
and the events, computed in the core so the shell only applies them. Pure."""

from __future__ import annotations

from datetime import datetime

from multislice_operator.api.models import (
    MultisliceJobStatus,
    RestartCause,
    RestartsByCause,
    RestartStatus,
)
from multislice_operator.reconcile.reasons import Reason, metric_of
from multislice_operator.reconcile.types import Event, MetricDeltas


def deltas(
    old: MultisliceJobStatus, new: MultisliceJobStatus, events: list[Event], now: datetime
) -> MetricDeltas:
    m = MetricDeltas()
    for event in events:
        labels = metric_of(event.reason, event.cause)
        if labels is not None:
            m.slice_failures.append(labels)
    if new.restarts_by_cause is not None:
        _restarts(m, old, new.restarts_by_cause)
    cp, cp_was = new.checkpoint, old.checkpoint
    if cp is not None and cp.request_id and (cp_was is None or cp_was.request_id != cp.request_id):
        m.checkpoint_requests.append(cp.source)
    m.gang_attempts = max(0, (new.provisioning_attempts or 0) - (old.provisioning_attempts or 0))
    if new.last_restart is not None:
        _last_restart(m, new.last_restart, old.last_restart)
    _timings(m, old, new, events, now)
    return m


def _restarts(m: MetricDeltas, old: MultisliceJobStatus, counts: RestartsByCause) -> None:
    """The restarts added per cause since the old status."""
    before = old.restarts_by_cause
    for cause in RestartCause:
        added = counts.get(cause) - (before.get(cause) if before else 0)
        if added > 0:
            m.restarts[cause.value] = added


def _last_restart(m: MetricDeltas, restart: RestartStatus, was: RestartStatus | None) -> None:
    """A restart's lost steps once, when first seen; its recovery time once, when known."""
    first_seen = was is None or was.restart != restart.restart
    if first_seen and restart.lost_steps is not None:
        m.lost_steps.append(restart.lost_steps)
    if restart.recovery_seconds is not None and (
        first_seen or (was is not None and was.recovery_seconds is None)
    ):
        m.recovery_seconds.append(restart.recovery_seconds)


def _timings(
    m: MetricDeltas,
    old: MultisliceJobStatus,
    new: MultisliceJobStatus,
    events: list[Event],
    now: datetime,
) -> None:
    """Time to provision (on the gang's Provisioned event) and to run (when it first runs)."""
    gang = [e for e in events if e.reason == Reason.GANG_PROVISIONED]
    if gang and new.start_time:
        m.provisioning_seconds.append((now - new.start_time).total_seconds())
    if new.running_time and not old.running_time and new.start_time:
        m.time_to_running_seconds.append((new.running_time - new.start_time).total_seconds())
