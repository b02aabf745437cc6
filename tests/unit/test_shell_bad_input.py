"""The shell's part of issue 14 (no apiserver): errors back off per job with one log line, the
apiserver's refusals become observations, and pools of our names are attributed to their owners."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from kopf._cogs.clients import errors as kopf_errors

from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.controller import admission, handlers, reconciler
from multislice_operator.controller import observe as ob
from multislice_operator.controller.runtime import Indexes, Runtime
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.provisioning.base import GangObservation
from multislice_operator.provisioning.gke import OwnedPool
from multislice_operator.reconcile import Admission, DecideConfig, JobMeta, JobSetObservation
from multislice_operator.render.jobset import render_jobset, render_probe_job
from multislice_operator.settings import Settings


def body(name: str = "job", uid: str = "uid-1", created: str = "2026-11-30T12:00:00Z") -> dict:
    return {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "generation": 1,
            "resourceVersion": "1",
            "creationTimestamp": created,
            "finalizers": ["multislice.dev/cleanup"],
        },
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


class Unreadable:
    """A provisioner whose cloud cannot be read (429/5xx from GKE after its own retries)."""

    async def observe_gang(self, plan: Any, max_age: float = 0.0) -> GangObservation:
        err = PoolError(None, "", "RESOURCE_EXHAUSTED", "429 Too Many Requests", False)
        return GangObservation(errors=[err], complete=False)


def runtime(provisioner: Any = None, kube: Any = None) -> Runtime:
    return Runtime(
        settings=Settings(),
        kube=kube,
        provisioner=provisioner,
        cfg=DecideConfig.from_settings(),
        indexes=Indexes(jobsets={}, pods={}, nodes={}),
    )


def test_an_unreadable_cloud_logs_one_warning_line_and_backs_off_exponentially(caplog):
    rt = runtime(Unreadable())
    rt.store.put(body())
    caplog.set_level(logging.INFO, logger="multislice_operator")
    delays = [asyncio.run(reconciler.reconcile(rt, ("ns", "job"), n)) for n in range(4)]
    assert delays == [-2.0, -4.0, -8.0, -16.0]
    records = [r for r in caplog.records if r.name == "multislice_operator"]
    assert len(records) == 4
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in records)
    assert "observe failed job=ns/job" in records[0].getMessage()
    assert "RESOURCE_EXHAUSTED" in records[0].getMessage()


class Busy:
    async def observe_gang(self, plan: Any, max_age: float = 0.0) -> GangObservation:
        raise kopf_errors.APIServerError(
            {"message": "etcdserver: too many requests"}, status=503, headers={}
        )


def test_an_apiserver_error_is_one_warning_line_too(caplog):
    rt = runtime(Busy())
    rt.store.put(body())
    caplog.set_level(logging.INFO, logger="multislice_operator")
    assert asyncio.run(reconciler.reconcile(rt, ("ns", "job"), 1)) == -4.0
    (record,) = [r for r in caplog.records if r.name == "multislice_operator"]
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "status=503" in record.getMessage()


def test_the_backoff_is_per_job_whichever_worker_runs_it(monkeypatch):
    seen: list[int] = []

    async def failing(rt: Runtime, key: Any, errors: int = 0) -> float:
        seen.append(errors)
        return -0.01

    monkeypatch.setattr(handlers, "reconcile", failing)

    async def main() -> None:
        rt = runtime()
        rt.store.put(body())  # a job that exists: a deleted one's key is not requeued
        workers = [asyncio.create_task(handlers._worker(rt)) for _ in range(4)]
        rt.queue.add(("ns", "job"))
        while len(seen) < 5:
            await asyncio.sleep(0.01)
        for w in workers:
            w.cancel()

    asyncio.run(main())
    assert seen[:5] == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- the apiserver's verdict


def api_error(status: int, message: str) -> kopf_errors.APIError:
    cls = {403: kopf_errors.APIForbiddenError, 422: kopf_errors.APIUnprocessableEntityError}.get(
        status, kopf_errors.APIError
    )
    return cls({"message": message}, status=status, headers={})


@pytest.mark.parametrize(
    ("status", "message", "verdict"),
    [
        (422, 'JobSet.jobset.x-k8s.io "a.b.c" is invalid: spec.x', True),
        (400, "bad request", True),
        (403, 'admission webhook "vjobset.kb.io" denied the request: subdomain', True),
        (403, 'jobsets.jobset.x-k8s.io is forbidden: User "x" cannot create resource', False),
        (404, "the server could not find the requested resource", False),
        (500, "internal error", False),
    ],
)
def test_only_a_verdict_on_the_object_is_a_refusal(status, message, verdict):
    got = admission.refusal(api_error(status, message))
    assert (got == message) if verdict else got is None


class DryRunKube:
    def __init__(self, refuse: dict[str, kopf_errors.APIError]) -> None:
        self.refuse, self.asked = refuse, []

    async def dry_run_create(self, obj: dict) -> None:
        self.asked.append(obj["kind"])
        if obj["kind"] in self.refuse:
            raise self.refuse[obj["kind"]]


def jobset() -> dict:
    job = load_job(body())
    return render_jobset(plan_job(job), job.spec)


def test_the_jobset_then_its_first_job_are_dry_run():
    kube = DryRunKube({})
    assert asyncio.run(admission.judge(kube, jobset())) == Admission()
    assert kube.asked == ["JobSet", "Job"]
    refused = api_error(422, 'Job.batch "job-slice-0" is invalid: spec.template.labels: bad key!')
    kube = DryRunKube({"Job": refused})
    verdict = asyncio.run(admission.judge(kube, jobset()))
    assert verdict.refused.endswith("spec.template.labels: bad key!")


def test_a_transient_dry_run_error_is_no_verdict():
    kube = DryRunKube({"JobSet": api_error(500, "etcd timeout")})
    with pytest.raises(kopf_errors.APIError):
        asyncio.run(admission.judge(kube, jobset()))


def test_the_probe_job_is_the_one_the_jobset_controller_makes():
    js = jobset()
    js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q"
    js["spec"]["replicatedJobs"][0]["template"]["metadata"]["labels"][
        "kueue.x-k8s.io/queue-name"
    ] = "q"
    probe = render_probe_job(js)
    assert probe["kind"] == "Job" and probe["metadata"]["name"] == "job-slice-0"
    pod = probe["spec"]["template"]
    assert pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] == "job"
    assert pod["spec"]["subdomain"] == "job"
    assert "kueue.x-k8s.io/queue-name" not in probe["metadata"]["labels"]
    assert probe["spec"]["completionMode"] == "Indexed"


# ---------------------------------------------------------------- who owns a pool of our name


def owned(job: str, uid: str) -> OwnedPool:
    return OwnedPool("msj-x-0", 0, PoolState.READY, owner_uid=uid, namespace="ns", job_name=job)


def meta(uid: str = "uid-1", created: str = "2026-11-30T12:00:00Z") -> JobMeta:
    return reconciler.job_meta(body(uid=uid, created=created))


def test_a_previous_incarnation_of_this_job_is_ours_to_replace():
    owner = reconciler._owner(runtime(), ("ns", "job"), meta(), owned("job", "uid-0"))
    assert owner.gone


def test_another_live_job_is_never_touched_and_the_younger_job_yields():
    rt = runtime()
    rt.store.put(body("other", "uid-2", created="2026-11-30T11:00:00Z"))
    older = reconciler._owner(rt, ("ns", "job"), meta(), owned("other", "uid-2"))
    assert not older.gone and older.older and older.job == "ns/other"
    younger = reconciler._owner(
        rt, ("ns", "job"), meta(created="2026-11-30T10:00:00Z"), owned("other", "uid-2")
    )
    assert not younger.gone and not younger.older


def test_an_owner_that_cannot_be_seen_is_never_touched():
    owner = reconciler._owner(runtime(), ("ns", "job"), meta(), owned("elsewhere", "uid-9"))
    assert not owner.gone and owner.older


def test_a_recreated_owner_leaves_an_orphan():
    rt = runtime()
    rt.store.put(body("other", "uid-3"))
    assert reconciler._owner(rt, ("ns", "job"), meta(), owned("other", "uid-2")).gone


def test_unschedulable_pods_are_read_from_the_pod_scheduled_condition():
    pod = {
        "metadata": {
            "name": "job-slice-1-0-x",
            "labels": {
                "jobset.sigs.k8s.io/job-index": "1",
                "jobset.sigs.k8s.io/restart-attempt": "0",
            },
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/8 nodes are available",
                    "lastTransitionTime": "2026-11-30T11:50:00Z",
                }
            ],
        },
    }
    (got,) = ob.pod_records([ob.summarize_pod(pod)], JobSetObservation())
    assert got.slice_index == 1 and got.scheduler_message == "0/8 nodes are available"
    assert got.unschedulable_since == datetime(2026, 11, 30, 11, 50, tzinfo=UTC)
    assert got.attempt == 0  # facts.py: only the current attempt's pods count


# ---------------------------------------------------------------- the orphan sweep and Roles


class Jobs:
    def __init__(self) -> None:
        self.asked: list[str | None] = []

    async def list_jobs(self, namespace: str | None = None) -> list[dict]:
        self.asked.append(namespace)
        live = {"metadata": {"namespace": "team-a", "name": "live", "uid": "uid-live"}}
        return [live] if namespace in (None, "team-a") else []


class Pools:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def list_owned(self, max_age: float = 0.0) -> list[OwnedPool]:
        def pool(name: str, ns: str, job: str, uid: str) -> OwnedPool:
            return OwnedPool(name, 0, PoolState.READY, owner_uid=uid, namespace=ns, job_name=job)

        return [
            pool("msj-live-0", "team-a", "live", "uid-live"),
            pool("msj-gone-0", "team-a", "gone", "uid-gone"),
            pool("msj-other-0", "team-b", "other", "uid-other"),  # not ours to judge
        ]

    async def delete_named(self, names: list[str]) -> Any:
        self.deleted += names
        from multislice_operator.provisioning.base import ActionResult

        return ActionResult()


def test_the_sweep_lists_watched_namespaces_only_and_never_touches_the_others():
    from multislice_operator.controller.gc import collect_orphans

    rt = runtime(Pools(), Jobs())
    rt.settings.namespaces = ["team-a"]
    assert asyncio.run(collect_orphans(rt)) == ["msj-gone-0"]
    assert rt.kube.asked == ["team-a"]  # a Role in team-a is enough
    rt.settings.namespaces = ["team-a*"]  # a glob: one cluster-wide list (the ClusterRole)
    rt.kube.asked = []
    assert asyncio.run(collect_orphans(rt)) == ["msj-gone-0"]
    assert rt.kube.asked == [None]


# ---------------------------------------------------------------- the metrics bind address


def _reachable(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


def test_metrics_bind_the_configured_address_only():
    from multislice_local.harness import free_port
    from multislice_operator.controller import serving

    assert Settings().metrics_bind_address == "127.0.0.1"  # local default: loopback
    loopback, everywhere = free_port(), free_port()

    async def check() -> tuple[bool, bool, bool]:
        runners = [
            await serving.start(serving.metrics_app(None), "127.0.0.1", loopback),
            # The chart's value, for scraping (HTTPS with authentication there).
            await serving.start(serving.metrics_app(None), "0.0.0.0", everywhere),
        ]
        try:
            return await asyncio.gather(
                asyncio.to_thread(_reachable, "127.0.0.1", loopback),
                asyncio.to_thread(_reachable, "127.0.0.2", loopback),
                asyncio.to_thread(_reachable, "127.0.0.2", everywhere),
            )
        finally:
            for runner in runners:
                await runner.cleanup()

    on_loopback, loopback_elsewhere, everywhere_elsewhere = asyncio.run(check())
    assert on_loopback and not loopback_elsewhere and everywhere_elsewhere
