"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Every replica watches; only the holder of the Lease reconciles. A replica acquires the Lease when
it is free or expired, renews it every `retry_seconds`, and when it cannot renew within
`renew_deadline_seconds` it has lost it: the operator then exits (as controller-runtime's
managers do), so a fresh process comes back as a standby instead of acting on stale beliefs.

Expired is judged as client-go does (tools/leaderelection, `observedTime`): by this replica's own
monotonic clock, leaseDurationSeconds after it last saw the Lease record change, never from the
holder's renewTime, which another node's clock wrote. A holder whose clock is behind keeps its
live Lease, and one whose clock was ahead is replaced one lease duration after it stops renewing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from multislice_operator.controller.kube import ApiError, Conflict, Kube

log = logging.getLogger("multislice_operator.leader")


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_seconds: float = 15.0  # client-go defaults: 15 s lease, 10 s renew deadline, 2 s retry
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0


def _now() -> datetime:
    return datetime.now(UTC)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    value = value.replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def held_by_other(spec: dict[str, Any], identity: str, observed_at: float, now: float) -> bool:
    """True when another holder's lease is still valid (pure): its record last changed, as this
    replica saw it, at `observed_at`, less than leaseDurationSeconds ago by this replica's clock."""
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return False
    duration = float(spec.get("leaseDurationSeconds") or 0)
    return observed_at + duration > now


class LeaderElector:
    def __init__(
        self, kube: Kube, cfg: LeaseConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kube, self.cfg, self.clock = kube, cfg, clock
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        # The Lease spec as last read or written, and this replica's clock when it last changed.
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0

    async def run(self) -> None:
        """Acquire, then renew until lost (sets `lost`); never returns while leading."""
        while not self.leading.is_set():
            if await self._try():
                log.info("leader election acquired lease=%s/%s identity=%s", *self._who())
                self.leading.set()
                break
            await asyncio.sleep(self.cfg.retry_seconds)
        last_renew = self.clock()
        while True:
            await asyncio.sleep(self.cfg.retry_seconds)
            if await self._try():
                last_renew = self.clock()
            elif self.clock() - last_renew > self.cfg.renew_deadline_seconds:
                log.error("leader election lost lease=%s/%s identity=%s", *self._who())
                self.leading.clear()
                self.lost.set()
                return

    def _observe(self, spec: dict[str, Any]) -> None:
        """client-go's setObservedRecord, on a change only: the clock restarts when the record
        (holder, renewTime, ...) differs from the one last seen."""
        if spec != self._observed:
            self._observed, self._observed_at = dict(spec), self.clock()

    def _who(self) -> tuple[str, str, str]:
        return self.cfg.namespace, self.cfg.name, self.cfg.identity

    async def _try(self) -> bool:
        cfg, now = self.cfg, _now()
        try:
            lease = await self.kube.get_lease(cfg.namespace, cfg.name)
            if lease is None:
                body = self._body(None, now, now)
                await self.kube.create_lease(cfg.namespace, body)
                self._observe(body["spec"])
                return True
            spec = lease.get("spec") or {}
            self._observe(spec)
            if held_by_other(spec, cfg.identity, self._observed_at, self.clock()):
                return False
            mine = spec.get("holderIdentity") == cfg.identity
            acquired = _parse(spec.get("acquireTime")) if mine else now
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
            body = self._body(lease, acquired or now, now, transitions)
            await self.kube.replace_lease(cfg.namespace, body)
            self._observe(body["spec"])
            return True
        except Conflict:
            return False  # someone else wrote the lease between our read and write
        except (TimeoutError, ApiError, OSError) as exc:
            log.warning("leader election attempt failed error=%r", exc)
            return False

    def _body(
        self,
        lease: dict[str, Any] | None,
        acquired: datetime,
        now: datetime,
        transitions: int = 0,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.cfg.name, "namespace": self.cfg.namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.cfg.identity,
                "leaseDurationSeconds": int(self.cfg.lease_seconds),
                "acquireTime": _fmt(acquired),
                "renewTime": _fmt(now),
                "leaseTransitions": transitions,
            },
        }
