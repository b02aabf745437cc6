"""Leader election judges a Lease expired as client-go's leaderelection does: by the elector's own
clock, from when it last saw the Lease record change (observedTime), never from the holder's
renewTime, which another node's clock wrote (issue 44)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from multislice_operator.controller.kube import Conflict
from multislice_operator.controller.leader import LeaderElector, LeaseConfig

NS, NAME, LEASE_SECONDS = "msj-system", "multislice-operator", 15


class Clock:
    """This replica's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Leases:
    """One Lease in an apiserver: replace needs the resourceVersion read (409 otherwise)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.lease

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self.lease is None
        return self._store(body)

    async def replace_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self.lease is not None
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise Conflict("the object has been modified", status=409, headers={})
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": str(self.version)},
        }
        return self.lease

    def renew_as(self, holder: str, wall: datetime) -> None:
        """Another replica renews, stamping renewTime with its own (skewed) wall clock."""
        stamp = wall.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {
            "holderIdentity": holder,
            "leaseDurationSeconds": LEASE_SECONDS,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        }
        meta = {"name": NAME, "namespace": NS, "resourceVersion": str(self.version)}
        if self.lease is None:
            meta.pop("resourceVersion")
        self._store({"metadata": meta, "spec": spec})

    @property
    def holder(self) -> str:
        assert self.lease is not None
        return str(self.lease["spec"]["holderIdentity"])


def elector(leases: Leases, clock: Clock) -> LeaderElector:
    cfg = LeaseConfig(NS, NAME, "me", lease_seconds=LEASE_SECONDS)
    return LeaderElector(leases, cfg, clock=clock)  # type: ignore[arg-type]


def attempt(e: LeaderElector) -> bool:
    return asyncio.run(e._try())


def test_a_live_leader_whose_clock_is_behind_keeps_its_lease() -> None:
    """The leader's node is an hour slow: every renewTime it writes is an hour in the past by
    our clock. It renews every 2 s, so the lease is live: a standby must never take it."""
    leases, clock = Leases(), Clock()
    them = datetime.now(UTC) - timedelta(hours=1)
    leases.renew_as("them", them)
    standby = elector(leases, clock)
    for _ in range(30):  # a minute of renewals, each seen by the standby
        assert not attempt(standby)
        assert leases.holder == "them"
        clock.t += 2
        them += timedelta(seconds=2)
        leases.renew_as("them", them)


def test_a_dead_leader_whose_clock_was_ahead_is_replaced_after_one_lease_duration() -> None:
    """The leader's node was an hour fast, then the leader died: its last renewTime is an hour
    in our future. The standby takes over one lease duration after it last saw the Lease change,
    not an hour later."""
    leases, clock = Leases(), Clock()
    leases.renew_as("them", datetime.now(UTC) + timedelta(hours=1))
    standby = elector(leases, clock)
    assert not attempt(standby)  # first seen now: valid for 15 s from now
    clock.t += LEASE_SECONDS - 1
    assert not attempt(standby)
    clock.t += 2
    assert attempt(standby)
    assert leases.holder == "me"
    assert leases.lease is not None and leases.lease["spec"]["leaseTransitions"] == 1


def test_a_lease_first_seen_is_given_a_whole_duration_whatever_its_renew_time() -> None:
    """As client-go: a replica that starts beside a Lease does not trust its renewTime either
    way; it waits one lease duration of no change before taking it."""
    leases, clock = Leases(), Clock()
    leases.renew_as("them", datetime.now(UTC) - timedelta(days=1))
    standby = elector(leases, clock)
    assert not attempt(standby)
    clock.t += LEASE_SECONDS + 1
    assert attempt(standby) and leases.holder == "me"


def test_the_holder_renews_its_own_lease_and_a_free_one_is_taken_at_once() -> None:
    leases, clock = Leases(), Clock()
    me = elector(leases, clock)
    assert attempt(me) and leases.holder == "me"  # no Lease yet: created
    renewed = leases.version
    clock.t += 2
    assert attempt(me) and leases.version == renewed + 1
    assert leases.lease is not None
    leases.lease["spec"]["holderIdentity"] = ""  # released
    other = elector(leases, clock)
    other.cfg = LeaseConfig(NS, NAME, "other", lease_seconds=LEASE_SECONDS)
    assert attempt(other) and leases.holder == "other"
