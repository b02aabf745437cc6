"""HTTP 429 with Retry-After: the apiserver's answer to overload (priority and fairness: 1-32 s,
max-in-flight: 1 s, a graceful shutdown: 5 s; k8s.io/apiserver pkg/server/filters). Every call
path of the operator to the apiserver, over real HTTP on kopf's client: each waits what the
server asked before it asks again (kopf's backoff where that is longer). The waits are read from
a spy on the sleep kopf's client (and controller/kube.py) use, not from the wall clock."""

from __future__ import annotations

import asyncio
import json
import logging
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import kopf
import pytest
from aiohttp import web
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import auth, watching
from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.structs import credentials, references

from multislice_operator.controller import handlers, reconciler
from multislice_operator.controller import kube as kube_module
from multislice_operator.controller.apisession import api_session
from multislice_operator.controller.kube import BACKOFFS, Kube
from tests.unit.test_shell_bad_input import body as job_body
from tests.unit.test_shell_bad_input import runtime

# What the apiserver writes for an overload (priority-and-fairness.go, tooManyRequests):
# http.Error, a plain-text body, no Status object.
OVERLOAD_TEXT = "Too many requests, please try again later."

Reply = tuple[int, dict[str, str], Any]  # status, headers, JSON body (a str: plain text)


def overloaded(seconds: str = "1") -> Reply:
    return 429, {"Retry-After": seconds}, OVERLOAD_TEXT


def ok(body: Any) -> Reply:
    return 200, {}, body


class FakeApiserver:
    """Answers each request with the next scripted reply for its path (the last one repeats)."""

    def __init__(self, script: dict[str, list[Reply]]) -> None:
        self.script = script
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.path_qs)
        replies = self.script[request.path]
        status, headers, payload = replies.pop(0) if len(replies) > 1 else replies[0]
        if isinstance(payload, str):
            return web.Response(status=status, headers=headers, text=payload)
        if request.query.get("watch") == "true" and status == 200:
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            for event in payload:
                await resp.write(json.dumps(event).encode() + b"\n")
            return resp
        return web.json_response(payload, status=status, headers=headers)


@asynccontextmanager
async def apiserver(script: dict[str, list[Reply]]) -> AsyncIterator[FakeApiserver]:
    """A fake apiserver on localhost, and kopf's client logged in to it on the operator's
    session (controller/apisession.py), as kopf's own tasks see it."""
    fake = FakeApiserver(script)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    info = api_session(kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"))
    token = auth.vault_var.set(credentials.Vault({"fake": info}))
    try:
        yield fake
    finally:
        auth.vault_var.reset(token)
        await info.aiohttp_session.close()
        await runner.cleanup()


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every wait kopf's client (api.py's retry loop) and kube.py ask for, in order; none is
    slept for real."""
    seen: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float, *args: Any, **kwargs: Any) -> Any:
        seen.append(delay)
        return await real_sleep(0)

    for module in (kopf_api, kube_module):
        shim = types.SimpleNamespace(**{k: getattr(asyncio, k) for k in dir(asyncio)})
        shim.sleep = sleep
        monkeypatch.setattr(module, "asyncio", shim, raising=False)
    return seen


def run(
    script: dict[str, list[Reply]], call: Callable[[Kube], Awaitable[Any]]
) -> tuple[Any, list[str]]:
    async def go() -> tuple[Any, list[str]]:
        async with apiserver(script) as fake:
            settings = kopf.OperatorSettings()
            handlers.configure_kopf(settings)
            return await call(Kube(settings)), fake.seen

    return asyncio.run(go())


JOBSET = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets/job"


# ---------------------------------------------------------------- calls with kopf's retries


def test_a_call_with_retries_waits_the_servers_retry_after_then_succeeds(waits):
    assert BACKOFFS[0] < 1  # the server's 1 s is longer than the first backoff: it wins
    got, seen = run(
        {JOBSET: [overloaded("1"), ok({"metadata": {"name": "job"}})]},
        lambda k: k.get_jobset("ns", "job"),
    )
    assert got == {"metadata": {"name": "job"}}
    assert seen == [JOBSET, JOBSET]  # exactly one retry
    assert waits == [1]


def test_kopfs_backoff_is_kept_where_it_is_longer_than_the_servers(waits):
    _, seen = run(
        {JOBSET: [overloaded("0"), ok({})]},
        lambda k: k.get_jobset("ns", "job"),
    )
    assert len(seen) == 2
    assert waits == [BACKOFFS[0]]


def test_a_call_overloaded_through_every_retry_fails_after_waiting_each_time(waits):
    with pytest.raises(kopf_errors.APITooManyRequestsError):
        run({JOBSET: [overloaded("3")]}, lambda k: k.get_jobset("ns", "job"))
    assert waits == [3, 3, 3]  # len(BACKOFFS) retries, each after the server's 3 s


# ---------------------------------------------------------------- calls without retries


def test_a_call_without_retries_waits_the_servers_retry_after_once(waits):
    # GET /version is one of the calls kube.py makes with backoffs=() (no retry of a 5xx or a
    # 403 there); a 429 asks to come back later, and it does, once.
    got, seen = run(
        {"/version": [overloaded("2"), ok({"gitVersion": "v1.37.2"})]},
        lambda k: k.server_version(),
    )
    assert got == "v1.37.2"
    assert seen == ["/version", "/version"]
    assert waits == [2]


def test_a_dry_run_overloaded_waits_and_retries_once(waits):
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "job", "namespace": "ns"},
    }
    path = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets"
    _, seen = run({path: [overloaded("1"), ok(body)]}, lambda k: k.dry_run_create(body))
    assert len(seen) == 2 and waits == [1]


def test_a_call_without_retries_overloaded_twice_fails_after_one_wait(waits):
    with pytest.raises(kopf_errors.APITooManyRequestsError):
        run({"/version": [overloaded("1")]}, lambda k: k.server_version())
    assert waits == [1]


def test_a_retry_after_longer_than_the_apiservers_longest_is_not_waited_inline(waits):
    # The apiserver asks at most 32 s (dropped_requests_tracker.go, maxRetryAfter); longer is
    # not its overload answer: the caller's own schedule retries (the pass, the next check).
    with pytest.raises(kopf_errors.APITooManyRequestsError):
        run({"/version": [overloaded("600"), ok({})]}, lambda k: k.server_version())
    assert waits == []


def test_an_eviction_a_disruption_budget_refuses_is_not_waited_for(waits):
    # pkg/registry/core/pod/storage/eviction.go: NewTooManyRequests(..., 10), a Status with
    # Retry-After 10: a refusal for now; the next pass asks again, no worker held 10 s a pod.
    path = "/api/v1/namespaces/ns/pods/p/eviction"
    pdb = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": 10},
        "code": 429,
    }
    with pytest.raises(kopf_errors.APITooManyRequestsError):
        run({path: [(429, {"Retry-After": "10"}, pdb), ok({})]}, lambda k: k.evict_pod("ns", "p"))
    assert waits == []


# ---------------------------------------------------------------- kopf's own list and watch


def test_kopfs_list_and_watch_wait_the_servers_retry_after(waits):
    """The watches behind the operator's indexes (kopf's watching.py): the list and the watch
    request go through the same request() with settings.networking.error_backoffs."""
    nodes = "/api/v1/nodes"
    node = {"metadata": {"name": "n", "resourceVersion": "2"}}
    listed = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}}
    script = {
        nodes: [
            overloaded("4"),
            ok({**listed, "items": []}),
            overloaded("5"),
            ok([{"type": "MODIFIED", "object": node}]),
        ]
    }

    async def go() -> tuple[list[Any], list[str]]:
        async with apiserver(script) as fake:
            settings = kopf.OperatorSettings()
            handlers.configure_kopf(settings)
            resource = references.Resource("", "v1", "nodes", namespaced=False)
            got: list[Any] = []
            async for event in watching.continuous_watch(
                settings=settings,
                resource=resource,
                namespace=None,
                operator_pause_waiter=asyncio.Future(),
            ):
                got.append(event)
                if isinstance(event, dict) and event.get("type") == "MODIFIED":
                    break
            return got, fake.seen

    got, seen = asyncio.run(go())
    assert got[-1] == {"type": "MODIFIED", "object": node}
    assert [s.split("?")[0] for s in seen] == [nodes] * 4
    assert "watch=true" not in seen[1] and "watch=true" in seen[3]
    assert waits == [4, 5]


# ---------------------------------------------------------------- the work queue


class Overloaded:
    """A pass that fails on the apiserver's 429 after the call's own retries."""

    def __init__(self, retry_after: str) -> None:
        self.retry_after = retry_after

    async def observe_gang(self, plan: Any, max_age: float = 0.0) -> Any:
        raise kopf_errors.APITooManyRequestsError(
            OVERLOAD_TEXT, status=429, headers={"Retry-After": self.retry_after}
        )


def test_a_pass_failed_by_a_429_is_retried_no_sooner_than_the_server_asked(caplog):
    caplog.set_level(logging.INFO, logger="multislice_operator")
    rt = runtime(Overloaded("30"))
    rt.store.put(job_body())
    assert asyncio.run(reconciler.reconcile(rt, ("ns", "job"), 0)) == -30.0
    # A short Retry-After leaves the job's own error backoff (2 s, doubling).
    rt = runtime(Overloaded("1"))
    rt.store.put(job_body())
    assert asyncio.run(reconciler.reconcile(rt, ("ns", "job"), 1)) == -4.0
