"""The operator's heartbeat: one Lease it renews while it reconciles, whatever the number of jobs.

Goodput is written only when a job's state changes (no status write for an idle job), so after an
operator restart nothing in a job says until when it was watched. The heartbeat says it once for
all of them: the previous operator's last renewal is when it last watched, and the time since is
charged to the state each job is found in (reconcile/goodput.py). One small write per interval
per operator, not per job.

The Lease also carries what a MultiKueue worker must not forget across a restart: the jobs it
handed back and when (annotation multislice.dev/multikueue-lost), so that their cooldown outlives
the process (reconcile/multikueue.remote_checks reads it; controller/kueue.py forgets an entry
once its cooldown is over). A hand-back writes the Lease at once rather than at the next beat.

Best effort: if the Lease cannot be read or written (RBAC), the operator logs it once and runs on;
goodput then charges such a gap to the state the job was in before, and a restart forgets the
hand-backs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from multislice_operator.common import keys
from multislice_operator.controller.kube import ApiError, Conflict, Kube
from multislice_operator.controller.leader import _fmt, _parse

log = logging.getLogger("multislice_operator.heartbeat")

SUFFIX = "-heartbeat"
READ_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class HeartbeatConfig:
    namespace: str
    name: str  # the leader-election Lease name + SUFFIX
    identity: str
    interval_seconds: float = 10.0


def previous_renewal(lease: dict[str, Any] | None, identity: str) -> datetime | None:
    """When another operator last renewed the heartbeat (pure); None: never, or it is ours."""
    if not lease:
        return None
    spec = lease.get("spec") or {}
    if spec.get("holderIdentity") == identity:
        return None
    return _parse(spec.get("renewTime"))


Lost = dict[tuple[str, str], datetime]  # (namespace, Workload) -> when this worker handed it back


def lost_from(lease: dict[str, Any] | None) -> Lost:
    """The hand-backs a Lease remembers (pure); what cannot be read is dropped, never raised:
    the worst a bad entry costs is one gang tried again on this worker."""
    raw = (((lease or {}).get("metadata") or {}).get("annotations") or {}).get(keys.MULTIKUEUE_LOST)
    try:
        entries = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    out: Lost = {}
    for key, value in entries.items() if isinstance(entries, dict) else ():
        ns, _, name = str(key).partition("/")
        when = _parse(value) if isinstance(value, str) else None
        if ns and name and when is not None and when.tzinfo is not None:  # naive: not ours
            out[(ns, name)] = when
    return out


def lost_annotation(lost: Lost) -> dict[str, str]:
    """The annotations that remember `lost` (none when there is nothing to remember)."""
    if not lost:
        return {}
    entries = {f"{ns}/{name}": _fmt(when) for (ns, name), when in sorted(lost.items())}
    return {keys.MULTIKUEUE_LOST: json.dumps(entries, separators=(",", ":"))}


class Heartbeat:
    def __init__(self, kube: Kube, cfg: HeartbeatConfig, lost: Lost | None = None) -> None:
        self.kube, self.cfg = kube, cfg
        self.lease: dict[str, Any] | None = None
        self.failing = False
        # The runtime's own map (rt.multikueue_lost): filled from the Lease at start, written
        # with each beat.
        self.lost: Lost = lost if lost is not None else {}
        self._writing = asyncio.Lock()  # the interval's beat and a hand-back's: one at a time

    async def start(self) -> datetime | None:
        """Read when the previous operator was last alive, then renew as this one."""
        previous = None
        try:
            async with asyncio.timeout(READ_TIMEOUT_SECONDS):
                self.lease = await self.kube.get_lease(self.cfg.namespace, self.cfg.name)
            previous = previous_renewal(self.lease, self.cfg.identity)
            for key, when in lost_from(self.lease).items():
                self.lost.setdefault(key, when)
        except (TimeoutError, ApiError, OSError) as exc:
            self._failed("read", exc)
        await self.beat()
        log.info(
            "heartbeat lease=%s/%s previous_operator_alive=%s",
            self.cfg.namespace,
            self.cfg.name,
            _fmt(previous) if previous else "unknown",
        )
        return previous

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.interval_seconds)
            await self.beat()

    async def beat(self) -> None:
        async with self._writing:
            await self._beat()

    async def _beat(self) -> None:
        body = self._body(datetime.now(UTC))
        try:
            if self.lease is None:
                self.lease = await self.kube.create_lease(self.cfg.namespace, body)
            else:
                self.lease = await self.kube.replace_lease(self.cfg.namespace, body)
            self.failing = False
        except Conflict:  # written by someone else since our read: read again, renew next time
            self.lease = await self._read()
        except (TimeoutError, ApiError, OSError) as exc:
            self._failed("renew", exc)
            self.lease = await self._read()

    async def _read(self) -> dict[str, Any] | None:
        try:
            lease = await self.kube.get_lease(self.cfg.namespace, self.cfg.name)
        except (TimeoutError, ApiError, OSError):
            return None
        for key, when in lost_from(lease).items():  # a start that could not read: not lost now
            self.lost.setdefault(key, when)
        return lease

    def _failed(self, what: str, exc: BaseException) -> None:
        if not self.failing:  # once per failing spell, not every interval
            log.warning(
                "heartbeat %s failed lease=%s/%s error=%r (goodput charges an operator "
                "outage to the state before it)",
                what,
                self.cfg.namespace,
                self.cfg.name,
                exc,
            )
        self.failing = True

    def _body(self, now: datetime) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.cfg.name, "namespace": self.cfg.namespace}
        annotations = lost_annotation(self.lost)
        if annotations:
            meta["annotations"] = annotations
        if self.lease is not None:
            meta["resourceVersion"] = (self.lease.get("metadata") or {}).get("resourceVersion")
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {"holderIdentity": self.cfg.identity, "renewTime": _fmt(now)},
        }
