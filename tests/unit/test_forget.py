"""Issue 23: a finished and deleted MultisliceJob leaves nothing behind in the operator process.

N jobs go through the operator's own per-job paths (the watch handler, the work queue and its
workers, the reconcile with its status writes, JobSet creates, events, metrics and goodput), then
are deleted; every per-job structure and every metric series naming a job must be empty after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from multislice_local.nodes import tpu_node_manifest
from multislice_operator.controller import handlers, metrics
from multislice_operator.controller import observe as ob
from multislice_operator.controller import runtime as runtime_module
from multislice_operator.controller.runtime import Indexes, JobKey, Runtime
from multislice_operator.reconcile import DecideConfig
from multislice_operator.settings import Settings

NAMESPACE = "leak"
RUNNING = {"replicatedJobsStatus": [{"name": "slice", "ready": 2, "active": 2}]}
COMPLETED = {
    "terminalState": "Completed",
    "conditions": [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}],
    "replicatedJobsStatus": [{"name": "slice", "succeeded": 2}],
}


def job(name: str, accelerator: str = "v5litepod-16") -> dict[str, Any]:
    return {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": "1",
            "creationTimestamp": "2026-12-02T12:00:00Z",
        },
        "spec": {
            "accelerator": accelerator,
            "slices": 2,
            "provisioning": {"mode": "Existing"},
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


class Apiserver:
    """The few calls a pass makes, kept in memory; `hold` parks one job's status writes until
    released (a pass still running when its job is deleted)."""

    def __init__(self) -> None:
        self.jobs: dict[JobKey, dict[str, Any]] = {}
        self.jobsets: dict[JobKey, dict[str, Any]] = {}
        self.events = 0
        self.hold: JobKey | None = None
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def get_namespace(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {}}}

    async def list_node_leases(self) -> dict[str, str]:
        """Every node's kubelet heartbeating now."""
        renewed = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {f"pool-{p}-{i}": renewed for p in range(2) for i in range(4)}

    async def dry_run_create(self, obj: dict[str, Any]) -> None:
        return None

    async def create_jobset(self, body: dict[str, Any]) -> dict[str, Any] | None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self.jobsets:
            return None
        meta["uid"] = f"js-{meta['name']}"
        self.jobsets[key] = body
        return body

    async def get_jobset(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.jobsets.get((namespace, name))

    async def delete_jobset(
        self, namespace: str, name: str, uid: str = "", foreground: bool = False
    ) -> None:
        self.jobsets.pop((namespace, name), None)

    async def apply_job_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        key = (namespace, name)
        stored = self.jobs[key]
        meta = dict(stored["metadata"])
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self.jobs[key] = written = {**stored, "metadata": meta, "status": status}
        if key == self.hold:  # written; the answer comes back after the job was deleted
            self.held.set()
            await self.release.wait()
        return written

    async def merge_job_status(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        return self.jobs[(namespace, name)]

    async def post_event(
        self, job: dict[str, Any], type_: str, reason: str, message: str
    ) -> str | None:
        self.events += 1
        return f"{job['metadata']['name']}.{self.events}"

    async def repeat_event(self, namespace: str, name: str, count: int) -> bool:
        return True


def nodes() -> dict[str, list[dict[str, Any]]]:
    """Two Ready v5litepod-16 pools (4 hosts of 4 chips): room for every job's two slices."""
    index: dict[str, list[dict[str, Any]]] = {}
    for p in range(2):
        pool = f"pool-{p}"
        for i in range(4):
            body = tpu_node_manifest(f"{pool}-{i}", pool, "tpu-v5-lite-podslice", "4x4", 4)
            body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
            index.setdefault(pool, []).append(ob.summarize_node(body))
    return index


def runtime(api: Apiserver) -> Runtime:
    return Runtime(
        settings=Settings(),
        kube=api,  # type: ignore[arg-type]
        provisioner=None,
        cfg=DecideConfig.from_settings(),
        indexes=Indexes(jobsets={}, pods={}, nodes=nodes()),
    )


async def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.01)


def phases(api: Apiserver, keys: list[JobKey]) -> set[str]:
    return {(api.jobs[k].get("status") or {}).get("phase", "") for k in keys}


async def event(rt: Runtime, api: Apiserver, type_: str, key: JobKey) -> None:
    """What kopf hands the watch handler."""
    body = api.jobs.pop(key) if type_ == "DELETED" else api.jobs[key]
    await handlers.job_event(type=type_, namespace=key[0], name=key[1], body=body)  # type: ignore[arg-type]


def jobset_status(rt: Runtime, api: Apiserver, status: dict[str, Any]) -> None:
    """The JobSet controller's part, seen through the index, and the events that wake a job."""
    jobsets: dict[Any, Any] = rt.indexes.jobsets  # type: ignore[assignment]
    for key, js in api.jobsets.items():
        jobsets[key] = [ob.summarize_jobset({**js, "status": status})]
        rt.poke(*key)


def retained(rt: Runtime, keys: set[JobKey]) -> dict[str, Any]:
    """Every per-job structure of the process that still holds something (every job is gone),
    and the metric series naming one of `keys`."""
    names = {k[1] for k in keys}
    q = rt.queue
    held: dict[str, Any] = {
        "store": set(rt.store.bodies),
        "queue due": set(q._due),
        "queue heap": {e[2] for e in q._heap},
        "queue processing": set(q._processing),
        "queue dirty": set(q._dirty),
        "queue debounced": set(q._debounced),
        "queue bursts": set(q._bursts),
        "strangers": set(rt.strangers),
        "waiting_for_nodes": set(rt.waiting_for_nodes),  # shapes, even with no job left
        "admission": set(rt.admission),
        "created_jobsets": set(rt.created_jobsets),
        "deleted_jobsets": set(rt.deleted_jobsets),
        "errors": set(rt.errors),
        "parsed": set(rt.parsed),
        "watched": set(rt.watched),
        "events": set(rt.events),
        "metrics JOBS": set(metrics.JOBS.phases),
        "metrics GOODPUT values": set(metrics.GOODPUT.values),
        "metrics GOODPUT counted": set(metrics.GOODPUT.counted),
        "metrics MAINTENANCE": set(metrics.MAINTENANCE.times),
        "metrics ACTIVE_SLICES": set(metrics.ACTIVE_SLICES.times),
        "series naming a job": {
            (s.name, s.labels["name"])
            for family in metrics.REGISTRY.collect()
            for s in family.samples
            if s.labels.get("name") in names
        },
    }
    return {what: got for what, got in held.items() if got}


@pytest.fixture
def clean_metrics() -> None:
    for key in list(metrics.JOBS.phases):
        metrics.forget_job(key)


async def lifecycle(n: int, waiting: int, race: bool) -> tuple[Runtime, set[JobKey]]:
    api = Apiserver()
    rt = handlers.RUNTIME = runtime(api)
    workers = [asyncio.create_task(handlers._worker(rt)) for _ in range(4)]
    keys = [(NAMESPACE, f"job-{i:03d}") for i in range(n)]
    stuck = [(NAMESPACE, f"wait-{i:03d}") for i in range(waiting)]  # no pool of their shape
    for key in keys + stuck:
        api.jobs[key] = job(key[1], "v5litepod-16" if key in keys else "v5litepod-32")
        await event(rt, api, "ADDED", key)
    await until(lambda: phases(api, keys) == {"Starting"}, "Starting")
    await until(lambda: phases(api, stuck) == ({"Pending"} if stuck else set()), "Pending")
    assert (
        rt.events and rt.parsed and rt.created_jobsets and bool(rt.waiting_for_nodes) == bool(stuck)
    )
    jobset_status(rt, api, RUNNING)
    await until(lambda: phases(api, keys) == {"Running"}, "Running")
    assert metrics.GOODPUT.values
    if race:  # the last job's next status write is still under way when it is deleted
        api.hold = keys[-1]
    jobset_status(rt, api, COMPLETED)
    await until(lambda: phases(api, keys[:-1]) == {"Succeeded"}, "Succeeded")
    if race:
        await api.held.wait()
    for key in keys + stuck:
        await event(rt, api, "DELETED", key)
        rt.indexes.jobsets.pop(key, None)  # type: ignore[attr-defined]  # Kubernetes' GC
    api.release.set()
    await until(lambda: not rt.queue._processing, "the passes in flight")
    await asyncio.sleep(0.1)
    for w in workers:
        w.cancel()
    return rt, set(keys + stuck)


@pytest.mark.usefixtures("clean_metrics")
def test_deleted_jobs_leave_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "RUNTIME", None)
    rt, keys = asyncio.run(lifecycle(20, 3, race=False))
    assert retained(rt, keys) == {}


@pytest.mark.usefixtures("clean_metrics")
def test_a_job_deleted_while_its_pass_writes_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass's status write answers after the DELETED event was handled: what it brings back
    (the body, the series) must not be kept."""
    monkeypatch.setattr(handlers, "RUNTIME", None)
    rt, keys = asyncio.run(lifecycle(5, 0, race=True))
    assert retained(rt, keys) == {}


# The parts of the process that are not per-job state of ours: kopf's indexes (the test plays
# the garbage collector on them), the stand-in apiserver, configuration, running tasks.
NOT_STATE = {"indexes", "kube", "settings", "cfg", "tasks", "readiness"}


def mentions(
    root: object, names: set[str], path: str = "rt", seen: set[int] | None = None
) -> set[str]:
    """Where, anywhere under `root` (fields, dict keys and values, items), a string names one
    of `names`: found by walking the objects, not by a list of known fields, so state a future
    change adds per job is checked too."""
    seen = set() if seen is None else seen
    if id(root) in seen or isinstance(root, (int, float, bool, type(None), bytes)):
        return set()
    seen.add(id(root))
    if isinstance(root, str):
        return {path} if root in names else set()
    found: set[str] = set()
    if isinstance(root, dict):
        for k, v in list(root.items()):
            found |= mentions(k, names, f"{path} key", seen)
            found |= mentions(v, names, f"{path}[{k!r}]", seen)
    elif isinstance(root, (list, tuple, set, frozenset)):
        for i, item in enumerate(list(root)):
            found |= mentions(item, names, f"{path}[{i}]", seen)
    elif hasattr(root, "__dict__") and type(root).__module__.startswith("multislice_operator"):
        for attr, value in vars(root).items():
            if attr not in NOT_STATE:
                found |= mentions(value, names, f"{path}.{attr}", seen)
    return found


def test_mentions_finds_a_job_named_in_any_field() -> None:
    """The walk itself: a name kept in a field no test lists (a key, a value, a nested tuple) is
    found; the walk of a runtime holding no job finds nothing."""
    rt = runtime(Apiserver())
    assert mentions(rt, {"job-001"}) == set()
    rt.errors[(NAMESPACE, "job-001")] = 1
    rt.store.bodies[(NAMESPACE, "x")] = {"metadata": {"name": "job-002"}}
    rt.new_cache = {"x": [("a", "job-003")]}  # type: ignore[attr-defined]
    found = mentions(rt, {"job-001", "job-002", "job-003"})
    assert {p.split("[")[0].split(" ")[0] for p in found} == {
        "rt.errors",
        "rt.store.bodies",
        "rt.new_cache",
    }, found


@pytest.mark.usefixtures("clean_metrics")
def test_no_field_of_the_process_names_a_deleted_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45 (memory after a 200-job load): whatever holds per-job state, by any name, lets a
    deleted job go: nothing reachable from the runtime or the per-job metrics names one."""
    monkeypatch.setattr(handlers, "RUNTIME", None)
    rt, keys = asyncio.run(lifecycle(20, 3, race=True))
    names = {k[1] for k in keys}
    collectors = [metrics.JOBS, metrics.GOODPUT, metrics.MAINTENANCE, metrics.ACTIVE_SLICES]
    assert mentions(rt, names) | mentions(collectors, names, "metrics") == set()


def cached(rt: Runtime) -> dict[str, int]:
    """The entries of the caches passes of many jobs share (read only while fresh)."""
    leases = rt.node_leases[1] if rt.node_leases is not None else None
    return {
        "namespace labels": len(rt._namespaces),
        "priority classes": len(rt._priority_classes),
        "workload priorities": len(rt._workload_priorities),
        "template verdicts": len(rt.template_verdicts),
        "absent schedulers": len(rt._absent_schedulers),
        "node leases": len(leases or {}),
    }


@pytest.mark.usefixtures("clean_metrics")
def test_shared_caches_let_a_finished_load_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 56 (memory after a load comes back): what passes cached for every job (the node
    Leases' last listing, the namespace's labels) is read only while
    fresh; once the load is gone no pass reads it again, so it goes when it is stale instead of
    staying for the process's life."""
    monkeypatch.setattr(handlers, "RUNTIME", None)
    rt, _ = asyncio.run(lifecycle(20, 3, race=False))
    during = cached(rt)
    assert during["node leases"] == 8 and during["namespace labels"] == 1, during
    rt.expire(now=time.monotonic())  # all of it fresh still: kept
    assert cached(rt) == during
    stale = max(
        runtime_module.TEMPLATE_VERDICT_TTL_SECONDS,
        runtime_module.SCHEDULER_ABSENT_SECONDS,
        runtime_module.NAMESPACE_LABELS_TTL_SECONDS,
        rt.cfg.resync_seconds,
    )
    rt.expire(now=time.monotonic() + stale + 1)
    assert set(cached(rt).values()) == {0}, cached(rt)


def test_the_housekeeping_loop_expires_the_shared_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's own loop does it, every MEMORY_TRIM_SECONDS, with no pass to ask: a stale
    entry goes, a fresh one stays."""
    monkeypatch.setattr(handlers, "MEMORY_TRIM_SECONDS", 0.01)
    rt = runtime(Apiserver())
    now = time.monotonic()
    rt.remember_namespace_labels("fresh", {})
    rt._namespaces["stale"] = (now - runtime_module.NAMESPACE_LABELS_TTL_SECONDS - 1, {})
    rt.node_leases = (now - rt.cfg.resync_seconds - 1, {"node-0": 1.0})

    async def scenario() -> None:
        loop = asyncio.create_task(handlers._housekeeping(rt, None))
        try:
            await until(lambda: "stale" not in rt._namespaces, "the stale namespace gone")
        finally:
            loop.cancel()

    asyncio.run(scenario())
    assert set(rt._namespaces) == {"fresh"}
    assert rt.node_leases is None
