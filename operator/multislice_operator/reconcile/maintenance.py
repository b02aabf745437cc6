"""Host maintenance ahead of time: what GKE announces on the job's nodes. Pure.

GKE (1.31+) labels a GPU/TPU node with the start of its next host maintenance
(`cloud.google.com/scheduled-maintenance-time`, Unix seconds, days ahead) and the latest start
it may move to (`...-latest`), and with `cloud.google.com/active-node-maintenance` while it
runs; a host event on one VM of a TPU slice stops the whole slice. The operator shows the
earliest announced start and the slices it hits (condition MaintenanceScheduled,
status.maintenance, an event, a metric) and, with spec.maintenance.checkpointAheadSeconds, asks
the workload for a checkpoint that long before it (checkpoint.py).

Kubernetes 1.37 (KEP-5683, alpha gate NodeLifecycleConditions) lets the admin announce
maintenance on the node itself: condition MaintenancePlanned ("expected to undergo a change in
the future. If this change impacts Node users, the admin should drain the Node first") and
MaintenanceInProgress ("actively undergoing maintenance"), set and cleared by the admin
(k8s.io/api core/v1 types.go, NodeMaintenancePlanned). Neither names a time: the drain may come
at once, so such a node's maintenance is read as due since the condition turned True (its
lastTransitionTime; since the operator first saw it where the condition does not say), the same
window as long as it stays True: with checkpointAheadSeconds its checkpoint is asked at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from multislice_operator.api.models import ConditionType, MaintenanceStatus
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import NodeMaintenance

MAINTENANCE = ConditionType.MAINTENANCE_SCHEDULED
REQUEST_PREFIX = "maint-"


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def request_id(when: datetime) -> str:
    """The checkpoint request for the maintenance starting at `when`: one per window."""
    return f"{REQUEST_PREFIX}{int(when.timestamp())}"


def assess(f: Facts, b: Builder) -> str | None:
    """Condition, status, event; the checkpoint request due now, if any."""
    found = f.obs.maintenance
    old = f.old.maintenance
    if not found:
        _clear(f, b)
        return None
    planned = _planned(found, old, f.now)
    now = _summary(found, planned)
    b.status.maintenance = now
    assert f.spec is not None
    ahead = f.spec.maintenance.checkpoint_ahead_seconds
    reason, message = _condition(now, ahead, planned, any(m.planned for m in found))
    b.cond(MAINTENANCE, "True", reason, message)
    if old is None or (old.time, old.slices, old.active) != (now.time, now.slices, now.active):
        b.event(reason, message)
    if ahead is None or now.time is None:
        return None
    due = (now.time - f.now).total_seconds() - ahead
    if due > 0:
        b.requeue_in(due)
        return None
    return request_id(now.time)


def _clear(f: Facts, b: Builder) -> None:
    """No node announces maintenance: no status, and the condition turns False if it was True."""
    b.status.maintenance = None
    before = f.old.condition(MAINTENANCE)
    if before is not None and before.status == "True":
        b.cond(
            MAINTENANCE,
            "False",
            Reason.NO_MAINTENANCE_SCHEDULED,
            "no node of the job announces host maintenance any more",
        )


def _planned(
    found: Sequence[NodeMaintenance], old: MaintenanceStatus | None, now: datetime
) -> datetime | None:
    """When the maintenance nodes announce in their conditions is due: the earliest condition's
    lastTransitionTime; for a condition without one, since first seen (the status's time if it
    was already due then, else now)."""
    times = [m.planned_since for m in found if m.planned and m.planned_since is not None]
    if any(m.planned and m.planned_since is None for m in found):
        times.append(old.time if old is not None and old.time and old.time <= now else now)
    return min(times) if times else None


def _summary(found: Sequence[NodeMaintenance], planned: datetime | None) -> MaintenanceStatus:
    """The earliest announced start, the latest it may move to, and what it hits."""
    times = [m.time for m in found if m.time is not None]
    if planned is not None:
        times.append(planned)
    latest = [m.latest for m in found if m.latest is not None]
    return MaintenanceStatus(
        time=min(times) if times else None,
        latest_time=max(latest) if latest else None,
        slices=sorted({m.slice_index for m in found if m.slice_index is not None}),
        nodes=len({m.node for m in found}),
        active=any(m.active for m in found),
    )


def _condition(
    now: MaintenanceStatus, ahead: int | None, planned: datetime | None, by_node: bool
) -> tuple[Reason, str]:
    """The MaintenanceScheduled condition's reason and message (the event's too); `planned`:
    when the maintenance a node's own conditions announce is due, `by_node`: any does."""
    where = (
        f"slice{'s' if len(now.slices) > 1 else ''} {', '.join(map(str, now.slices))}"
        if now.slices
        else "the job's nodes"
    )
    nodes = f"{now.nodes} node{'s' if now.nodes > 1 else ''}"
    if now.active:
        if by_node:  # the admin's MaintenanceInProgress may not stop the host (a live patch)
            return (
                Reason.MAINTENANCE_IN_PROGRESS,
                f"host maintenance in progress on {where} ({nodes}; GKE's labels or the "
                "node's condition MaintenanceInProgress): a host that stops or a node "
                "drained restarts all slices",
            )
        return (
            Reason.MAINTENANCE_IN_PROGRESS,
            f"host maintenance in progress on {where} ({nodes}): those hosts stop",
        )
    when = iso(now.time) if now.time else "an unannounced time"
    latest_note = f" (latest start {iso(now.latest_time)})" if now.latest_time else ""
    if planned is not None and now.time == planned:
        message = (
            f"a node announces host maintenance (condition MaintenancePlanned since {when}; "
            f"it gives no start, so it is due now) on {where} ({nodes}): a drain stops the "
            "slice and all slices restart (cause disruption)"
        )
        if ahead is not None:
            message += "; a checkpoint is requested at once"
        return Reason.MAINTENANCE_SCHEDULED, message
    message = (
        f"GKE scheduled host maintenance at {when}{latest_note} on {where} ({nodes}): "
        "the slice stops and all slices restart (cause disruption)"
    )
    if ahead is not None and now.time is not None:
        message += f"; a checkpoint is requested {ahead}s before"
    return Reason.MAINTENANCE_SCHEDULED, message
