"""The orphan sweep: node pools labelled as ours whose job is gone or is another incarnation.

Workload policies (tpu7x placement, Compute Engine resource policies) are never swept: they are
shared by every job of a shape, free, and a delete could race another job's create that names
the policy, which GKE would then refuse as INVALID_ARGUMENT (docs/provisioning.md)."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from typing import Any

from multislice_operator.common.ownership import orphaned
from multislice_operator.common.pools import PoolState
from multislice_operator.controller import metrics
from multislice_operator.controller.runtime import Runtime

log = logging.getLogger("multislice_operator")


async def gc_loop(rt: Runtime) -> None:
    while True:
        await asyncio.sleep(rt.settings.gc_interval_seconds)
        try:
            await collect_orphans(rt)
        except Exception as exc:  # keep sweeping on the next interval
            log.warning("orphan sweep failed error=%s", exc)


async def list_watched_jobs(rt: Runtime) -> list[dict[str, Any]]:
    """The MultisliceJobs of the watched namespaces, from the apiserver. Watching named
    namespaces (the chart then grants Roles there only), list each of them; with globs, all."""
    patterns = rt.settings.namespaces
    exact = bool(patterns) and not any(c in p for p in patterns for c in "*?[")
    if exact:
        return [j for ns in patterns for j in await rt.kube.list_jobs(ns)]
    jobs = await rt.kube.list_jobs()
    if not patterns:
        return jobs
    return [
        j for j in jobs if any(fnmatch.fnmatch(j["metadata"]["namespace"], p) for p in patterns)
    ]


async def collect_orphans(rt: Runtime) -> list[str]:
    """Delete pools labelled as ours whose job is gone or is another incarnation (other uid)."""
    if rt.provisioner is None:
        return []
    # Read from the apiserver, not the watch: a job created a moment ago must not look gone.
    # A pool of a namespace this operator does not watch is never its business (another install).
    patterns = rt.settings.namespaces
    jobs = {
        (j["metadata"]["namespace"], j["metadata"]["name"]): j["metadata"].get("uid")
        for j in await list_watched_jobs(rt)
    }
    pools = await rt.provisioner.list_owned()
    orphans = []
    for pool in pools:
        ns, name = getattr(pool, "namespace", None), getattr(pool, "job_name", None)
        if ns is None or name is None or pool.status in (PoolState.ABSENT, PoolState.DELETING):
            continue
        if patterns and not any(fnmatch.fnmatch(ns, p) for p in patterns):
            continue
        if orphaned(pool.owner_uid, (ns, name), jobs, complete=True):
            orphans.append(pool.name)
    if orphans:
        log.warning("deleting orphaned node pools pools=%s", ",".join(orphans))
        result = await rt.provisioner.delete_named(orphans)
        metrics.GKE_CALLS_TOTAL.labels("delete", "error" if result.errors else "ok").inc()
        metrics.ORPHANS_DELETED_TOTAL.inc(len(orphans))
    return orphans
