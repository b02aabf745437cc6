"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Every replica watches; only the holder of the Lease reconciles. A replica acquires the Lease when
it is free or expired (renewTime + leaseDurationSeconds in the past), renews it every
`retry_seconds`, and when it cannot renew within `renew_deadline_seconds` it has lost it: the
operator then exits (as controller-runtime's managers do), so a fresh process comes back as a
standby instead of acting on stale beliefs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
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


def held_by_other(spec: dict[str, Any], identity: str, now: datetime) -> bool:
    """True when another holder's lease is still valid (pure)."""
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return False
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    return renewed is not None and renewed + timedelta(seconds=duration) > now


class LeaderElector:
    def __init__(self, kube: Kube, cfg: LeaseConfig) -> None:
        self.kube, self.cfg = kube, cfg
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()

    async def run(self) -> None:
        """Acquire, then renew until lost (sets `lost`); never returns while leading."""
        while not self.leading.is_set():
            if await self._try():
                log.info("leader election acquired lease=%s/%s identity=%s", *self._who())
                self.leading.set()
                break
            await asyncio.sleep(self.cfg.retry_seconds)
        last_renew = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(self.cfg.retry_seconds)
            if await self._try():
                last_renew = asyncio.get_running_loop().time()
            elif asyncio.get_running_loop().time() - last_renew > self.cfg.renew_deadline_seconds:
                log.error("leader election lost lease=%s/%s identity=%s", *self._who())
                self.leading.clear()
                self.lost.set()
                return

    def _who(self) -> tuple[str, str, str]:
        return self.cfg.namespace, self.cfg.name, self.cfg.identity

    async def _try(self) -> bool:
        cfg, now = self.cfg, _now()
        try:
            lease = await self.kube.get_lease(cfg.namespace, cfg.name)
            if lease is None:
                await self.kube.create_lease(cfg.namespace, self._body(None, now, now))
                return True
            spec = lease.get("spec") or {}
            if held_by_other(spec, cfg.identity, now):
                return False
            mine = spec.get("holderIdentity") == cfg.identity
            acquired = _parse(spec.get("acquireTime")) if mine else now
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
            body = self._body(lease, acquired or now, now, transitions)
            await self.kube.replace_lease(cfg.namespace, body)
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
