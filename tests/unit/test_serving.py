"""The operator's own HTTP surface (controller/serving.py) and the settings that guard it: health
and readiness, metrics behind delegated authentication (cached as controller-runtime's), TLS,
and what `run` refuses before it starts. The real apiserver's TokenReview is exercised in
tests/integration/test_chart.py
(test_metrics_need_a_token_bound_to_the_metrics_reader_role)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest
from aiohttp import ClientSession, web

from multislice_local.harness import free_port
from multislice_operator.controller import serving
from multislice_operator.controller.kube import ApiError
from multislice_operator.controller.workqueue import WorkQueue
from multislice_operator.settings import Settings


async def _get(
    app: web.Application, path: str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    port = free_port()
    runner = await serving.start(app, "127.0.0.1", port)
    try:
        async with (
            ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as resp,
        ):
            return resp.status, await resp.text()
    finally:
        await runner.cleanup()


def get(app: web.Application, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    return asyncio.run(_get(app, path, headers))


# ---------------------------------------------------------------- health


def test_readiness_needs_start_sync_and_the_lease() -> None:
    r = serving.Readiness(leader_elect=True)
    assert r.why_not() == "starting"
    r.started = True
    assert r.why_not() == "caches not synced"
    r.synced = True
    assert "standby" in (r.why_not() or "")
    r.standby_ready = True  # --ready-standby
    assert r.why_not() is None
    r.standby_ready, r.leading = False, True
    assert r.why_not() is None
    assert serving.Readiness(started=True, synced=True).why_not() is None  # no election


def test_health_endpoints_answer_what_the_operator_knows() -> None:
    r = serving.Readiness()
    problem: list[str] = []
    app = lambda: serving.health_app(r, lambda: problem[0] if problem else None)  # noqa: E731
    assert get(app(), "/healthz") == (200, "ok")
    assert get(app(), "/readyz") == (503, "starting")
    r.started = r.synced = True
    assert get(app(), "/readyz") == (200, "ok")
    problem.append("task worker failed: RuntimeError()")
    assert get(app(), "/healthz") == (500, "task worker failed: RuntimeError()")


def test_ready_only_once_a_job_came_through_the_watch_or_none_exists(monkeypatch: Any) -> None:
    """controller/handlers.py's sync wait: jobs exist but none has reached the store (kopf's
    indexes still listing) -> not synced, whatever the apiserver's errors meanwhile; the first
    job in the store -> synced. With no job at all it is synced at once."""
    from types import SimpleNamespace

    from multislice_operator.controller import handlers
    from multislice_operator.controller.runtime import JobStore

    monkeypatch.setattr(handlers, "SYNC_POLL_SECONDS", 0.01)

    class Lister:
        def __init__(self, jobs: list[dict[str, Any]]) -> None:
            self.jobs, self.calls = jobs, 0

        async def list_jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
            self.calls += 1
            if self.calls == 2:
                raise ApiError({"message": "down"}, status=503, headers={})  # type: ignore[arg-type]
            return self.jobs

    def runtime(jobs: list[dict[str, Any]]) -> Any:
        return SimpleNamespace(
            readiness=serving.Readiness(),
            store=JobStore(),
            settings=Settings(namespaces=["team"]),
            kube=Lister(jobs),
        )

    async def scenario() -> tuple[list[str | None], int]:
        job = {"metadata": {"namespace": "team", "name": "a", "uid": "u"}}
        rt = runtime([job])
        task = asyncio.create_task(handlers._await_sync(rt))
        seen = []
        for _ in range(5):  # several polls, one of them failing: still not synced
            await asyncio.sleep(0.02)
            seen.append(rt.readiness.why_not())
        rt.store.bodies[("team", "a")] = job  # the watch hands the job over
        await asyncio.wait_for(task, 5)
        seen.append(rt.readiness.why_not())
        empty = runtime([])
        await asyncio.wait_for(handlers._await_sync(empty), 5)
        seen.append(empty.readiness.why_not())
        return seen, rt.kube.calls

    seen, calls = asyncio.run(scenario())
    assert seen == ["caches not synced"] * 5 + [None, None]
    assert calls >= 3  # it kept asking after the failed list


# ---------------------------------------------------------------- metrics authentication


class FakeKube:
    """The two reviews, as the apiserver answers them, counted."""

    def __init__(self) -> None:
        self.users = {"good": {"username": "system:serviceaccount:mon:prom", "groups": ["g"]}}
        self.allowed = {"system:serviceaccount:mon:prom"}
        self.token_reviews = 0
        self.access_reviews: list[tuple[str, str]] = []
        self.fail = False

    async def review_token(self, token: str) -> dict[str, Any] | None:
        self.token_reviews += 1
        if self.fail:
            raise ApiError({"message": "apiserver down"}, status=503, headers={})  # type: ignore[arg-type]
        return self.users.get(token)

    async def may_get(self, user: dict[str, Any], path: str) -> bool:
        self.access_reviews.append((user["username"], path))
        return user["username"] in self.allowed


def auth_app(kube: FakeKube) -> web.Application:
    return serving.metrics_app(serving.KubernetesAuth(kube).check)  # type: ignore[arg-type]


def test_metrics_need_a_token_the_apiserver_accepts_and_authorizes() -> None:
    kube = FakeKube()
    assert get(auth_app(kube), "/metrics")[0] == 401
    assert get(auth_app(kube), "/metrics", {"Authorization": "Basic Zm9vOmJhcg=="})[0] == 401
    assert get(auth_app(kube), "/metrics", {"Authorization": "Bearer bad"})[0] == 401
    status, text = get(auth_app(kube), "/metrics", {"Authorization": "Bearer good"})
    assert status == 200 and "multislice_build_info" in text
    assert kube.access_reviews == [("system:serviceaccount:mon:prom", "/metrics")]
    kube.allowed.clear()
    kube.users["other"] = {"username": "alice"}
    status, text = get(auth_app(kube), "/metrics", {"Authorization": "Bearer other"})
    assert (status, text) == (403, "Authorization denied for user alice")
    kube.fail = True  # the apiserver cannot say: an error, never the metrics
    auth = serving.KubernetesAuth(kube)  # type: ignore[arg-type]
    assert asyncio.run(auth.check("Bearer new")) == (500, "Authentication failed")


def test_reviews_are_cached_per_token_and_user() -> None:
    kube = FakeKube()
    auth = serving.KubernetesAuth(kube)  # type: ignore[arg-type]

    async def scrape(n: int) -> list[tuple[int, str]]:
        return [await auth.check("Bearer good") for _ in range(n)]

    assert asyncio.run(scrape(5)) == [(200, "ok")] * 5
    assert kube.token_reviews == 1 and len(kube.access_reviews) == 1


def test_no_authentication_serves_anyone() -> None:
    assert get(serving.metrics_app(None), "/metrics")[0] == 200


# ---------------------------------------------------------------- TLS


def test_self_signed_certificate_serves_https(tmp_path: Any) -> None:
    ctx = serving.tls_context(None, ["localhost", "127.0.0.1"])
    port = free_port()

    async def fetch() -> int:
        runner = await serving.start(serving.metrics_app(None), "127.0.0.1", port, ctx)
        client = ssl.create_default_context()
        client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
        try:
            async with (
                ClientSession() as session,
                session.get(f"https://127.0.0.1:{port}/metrics", ssl=client) as resp,
            ):
                return resp.status
        finally:
            await runner.cleanup()

    assert asyncio.run(fetch()) == 200
    # A cert directory: tls.crt and tls.key, as a kubernetes.io/tls Secret mounts them.
    cert, key = serving.self_signed(["metrics.example"])
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    assert isinstance(serving.tls_context(str(tmp_path), []), ssl.SSLContext)
    with pytest.raises(FileNotFoundError):
        serving.tls_context(str(tmp_path / "missing"), [])


# ---------------------------------------------------------------- settings `run` refuses


def test_plain_metrics_only_on_loopback() -> None:
    assert Settings().problems() == []  # defaults: HTTPS with authentication, loopback
    assert Settings(metrics_auth="none").problems() == []
    assert Settings(metrics_auth="none", metrics_bind_address="::1").problems() == []
    (problem,) = Settings(metrics_auth="none", metrics_bind_address="0.0.0.0").problems()
    assert "--metrics-bind-address 127.0.0.1" in problem and "--metrics-auth" in problem
    assert Settings(metrics_auth="none", metrics_bind_address="0.0.0.0", metrics_port=0).problems(
    ) == []  # fmt: skip


def test_the_simulator_and_an_endpoint_override_are_different_settings() -> None:
    assert Settings(gke_endpoint="https://psc.example").problems() == []
    assert Settings(gke_simulator="http://127.0.0.1:1234").problems() == []
    (both,) = Settings(gke_simulator="http://x", gke_endpoint="https://y").problems()
    assert "exclude each other" in both
    (clear,) = Settings(gke_endpoint="http://10.0.0.1").problems()
    assert "--gke-simulator" in clear and "https://" in clear


def test_an_endpoint_override_keeps_the_google_credentials(monkeypatch: Any) -> None:
    """A private or PSC endpoint gets Application Default Credentials, not anonymous ones; only
    the simulator is anonymous (the old --gke-endpoint was both)."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials, Credentials

    from multislice_operator.provisioning.gke import GkeProvisioner

    class Adc(Credentials):  # type: ignore[misc]
        def refresh(self, request: Any) -> None:
            self.token = "t"

    adc = Adc()
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (adc, "my-proj"))
    where = {"project": "p", "location": "us-east5-b", "cluster": "c"}
    prov = GkeProvisioner.from_settings(**where, endpoint="https://psc.example")
    try:
        assert prov._client.transport._credentials is adc
        assert prov._client.transport._host.startswith("https://psc.example")
        assert prov._client_args["client_options"] is None  # Cloud TPU keeps Google's endpoint
    finally:
        prov.close()
    sim = GkeProvisioner.from_settings(**where, simulator="http://127.0.0.1:9")
    try:
        assert isinstance(sim._client.transport._credentials, AnonymousCredentials)
    finally:
        sim.close()
    with pytest.raises(ValueError, match="not both"):
        GkeProvisioner.from_settings(**where, endpoint="https://a", simulator="http://b")


# ---------------------------------------------------------------- workqueue depth


def test_workqueue_depth_counts_due_keys_only() -> None:
    async def scenario() -> tuple[int, int]:
        q: WorkQueue[str] = WorkQueue()
        q.add("now")
        q.add("later", 60)  # a resync: not waiting for a worker yet
        before = q.due()
        await q.get()
        return before, q.due()

    assert asyncio.run(scenario()) == (1, 0)


def test_the_self_signed_certificate_needs_nothing_beyond_the_runtime_pins() -> None:
    """`cryptography` (the self-signed certificate) is no pin of the operator's: it comes with
    google-auth, a dependency of the GKE clients. Should that change, pin it in pyproject.toml
    (tests/integration/test_image.py then wants the Dockerfile's ARG too)."""
    import re
    from importlib.metadata import requires

    needs = [r for r in requires("google-auth") or [] if re.match(r"cryptography\b", r)]
    assert any("extra ==" not in r for r in needs), needs  # unconditional, not an extra
