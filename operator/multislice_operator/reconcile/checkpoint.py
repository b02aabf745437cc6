"""Checkpoints on demand (docs/environment.md section 3). Pure.

One mechanism for users and maintenance: a request has an id; the operator puts
`multislice.dev/checkpoint-request: <id>` on every pod of the attempt it was made in (pods that
attempt creates later too); each pod sees its own annotations as a file (the downward API
volume render/jobset.py mounts); the workload's processes agree on one step, save there, and process
0 acknowledges with `multislice.dev/checkpoint-saved: {"id", "step"}` on its pod. A restart ends
the request: the next attempt resumes from a checkpoint anyway.

A user asks with `kubectl annotate msj NAME multislice.dev/checkpoint-request=ID` (a new value
is a new request); maintenance asks `maint-<start>` checkpointAheadSeconds before the window.
"""

from __future__ import annotations

from typing import Literal

from multislice_operator.api.models import CheckpointStatus
from multislice_operator.common import keys
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import AnnotatePods

MAX_ID_LENGTH = 63  # docs/environment.md section 3
SOURCE_USER, SOURCE_MAINTENANCE, SOURCE_FLEX_START = "user", "maintenance", "flex-start"
SOURCE_ELASTIC = "elastic"  # before an elastic job grows back (elastic.py)
SOURCES = (SOURCE_USER, SOURCE_MAINTENANCE, SOURCE_FLEX_START, SOURCE_ELASTIC)
# Where CheckpointStatus remembers the operator's last request of each source.
RequestField = Literal["maintenance_request", "flex_start_request", "elastic_request"]


def valid_id(value: str) -> bool:
    return 0 < len(value) <= MAX_ID_LENGTH and value.isprintable() and '"' not in value


def _request(
    f: Facts, b: Builder, cp: CheckpointStatus | None, rid: str, source: str
) -> CheckpointStatus:
    attempt = f.attempt
    new = CheckpointStatus(
        request_id=rid,
        source=source,
        request_time=f.now,
        restart_attempt=attempt,
        user_request=cp.user_request if cp else None,
        maintenance_request=cp.maintenance_request if cp else None,
        flex_start_request=cp.flex_start_request if cp else None,
        elastic_request=cp.elastic_request if cp else None,
    )
    b.event(
        Reason.CHECKPOINT_REQUESTED,
        f"checkpoint {rid} requested ({source}): annotating every pod of attempt {attempt} "
        f"with {keys.CHECKPOINT_REQUEST}",
    )
    return new


def serve_requests(
    f: Facts,
    b: Builder,
    maintenance_request: str | None,
    flex_start_request: str | None = None,
    elastic_request: str | None = None,
) -> None:
    """While the JobSet runs: take new requests, put the current one on its attempt's pods,
    and record the step saved for it."""
    js = f.js
    if js is None or js.suspended:
        return
    old = f.old.checkpoint
    cp = _take_user_request(f, b, old.model_copy(deep=True) if old is not None else None)
    # The operator's own requests, in this order: each new one becomes the current request.
    ours: tuple[tuple[str, RequestField, str | None], ...] = (
        (SOURCE_MAINTENANCE, "maintenance_request", maintenance_request),
        (SOURCE_FLEX_START, "flex_start_request", flex_start_request),
        (SOURCE_ELASTIC, "elastic_request", elastic_request),
    )
    for source, field, rid in ours:
        cp = _take_request(f, b, cp, source, field, rid)
    b.status.checkpoint = cp
    if cp is None or cp.request_id is None:
        return
    if cp.restart_attempt == js.restarts:
        _annotate(f, b, cp, cp.request_id)
    if cp.saved_step is None:
        _record_saved(f, b, cp, cp.request_id)


def _take_user_request(
    f: Facts, b: Builder, cp: CheckpointStatus | None
) -> CheckpointStatus | None:
    """A new value of the job's checkpoint-request annotation: a request if it is a valid id, an
    event if not; either way it is remembered so that it is judged once."""
    asked = f.meta.annotations.get(keys.CHECKPOINT_REQUEST)
    if asked is None or asked == (cp.user_request if cp else None):
        return cp
    if valid_id(asked):
        cp = _request(f, b, cp, asked, SOURCE_USER)
    else:
        b.event(
            Reason.CHECKPOINT_REQUEST_INVALID,
            f"{keys.CHECKPOINT_REQUEST}={asked!r} ignored: an id is 1-{MAX_ID_LENGTH} "
            "printable characters (e.g. $(date +%s))",
        )
    cp = cp or CheckpointStatus(source=SOURCE_USER)
    cp.user_request = asked
    return cp


def _take_request(
    f: Facts,
    b: Builder,
    cp: CheckpointStatus | None,
    source: str,
    field: RequestField,
    rid: str | None,
) -> CheckpointStatus | None:
    """The operator's request `rid` from `source`, remembered in `field`: a request once."""
    if rid is None or rid == (getattr(cp, field) if cp else None):
        return cp
    new = _request(f, b, cp, rid, source)
    setattr(new, field, rid)
    return new


def _annotate(f: Facts, b: Builder, cp: CheckpointStatus, rid: str) -> None:
    """Put the request on every pod of its attempt that lacks it, and count those that have it."""
    mine = [p for p in f.live_pods if p.attempt == cp.restart_attempt and not p.deleting]
    missing = tuple(sorted(p.name for p in mine if p.checkpoint_request != rid))
    if missing:
        b.add(AnnotatePods(missing, keys.CHECKPOINT_REQUEST, rid))
    cp.pods_annotated = sum(1 for p in mine if p.checkpoint_request == rid)


def _record_saved(f: Facts, b: Builder, cp: CheckpointStatus, rid: str) -> None:
    step = acked(f).get(rid)
    if step is not None:
        cp.saved_step, cp.saved_time = step, f.now
        b.event(Reason.CHECKPOINT_SAVED, f"checkpoint {rid} saved at step {cp.saved_step}")


def acked(f: Facts) -> dict[str, int]:
    """The step saved for each request the workload acknowledged, on the pods as seen now."""
    acks = [p.checkpoint_saved for p in f.live_pods]
    acks += [p.termination.checkpoint_request for p in f.failures if p.termination]
    out: dict[str, int] = {}
    for ack in acks:
        if ack is not None:
            out[ack[0]] = max(ack[1], out.get(ack[0], ack[1]))
    return out
