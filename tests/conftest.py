"""Shared fixtures: real local Kubernetes control planes (multislice_local).

* ``kube_api``: session-scoped :class:`ControlPlane` of the ``api`` profile (etcd + apiserver).
* ``kube_cluster``: session-scoped ``cluster`` profile (plus controller-manager, scheduler, kwok,
  JobSet controller and webhooks).
* ``kube_kueue``: session-scoped ``kueue`` profile (``cluster`` plus the Kueue controller).
* ``kube_client(cp) -> kubernetes.client.ApiClient``: admin client for a control plane.
* ``namespace(cp, prefix="t") -> str``: a fresh namespace, deleted after the test.
* ``tpu_nodes(pool_name, count, accelerator_label, topology, chips_per_host, **kw) -> names``:
  fake TPU nodes in ``kube_cluster``, deleted after the test.

Tests under tests/integration and tests/e2e get the ``integration`` / ``e2e`` markers.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from multislice_local.controlplane import ControlPlane, ensure_binaries
from multislice_local.nodes import delete_nodes, register_tpu_nodes

_CONTROL_PLANE_FIXTURES = {"kube_api", "kube_cluster", "kube_kueue"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "e2e" in parts:
            item.add_marker(pytest.mark.e2e)
    # A cold binary build takes many minutes: do it here, outside any per-test timeout.
    if not config.option.collectonly and any(
        _CONTROL_PLANE_FIXTURES & set(getattr(item, "fixturenames", ())) for item in items
    ):
        ensure_binaries()


def _control_plane(request: pytest.FixtureRequest, profile: str) -> ControlPlane:
    cp = ControlPlane(profile)
    # Registered before start so a half-started control plane is stopped too (start() also
    # cleans up after itself, and an atexit hook covers interpreter exit).
    request.addfinalizer(cp.stop)
    return cp.start()


@pytest.fixture(scope="session")
def kube_api(request: pytest.FixtureRequest) -> ControlPlane:
    return _control_plane(request, "api")


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest) -> ControlPlane:
    return _control_plane(request, "cluster")


@pytest.fixture(scope="session")
def kube_kueue(request: pytest.FixtureRequest) -> ControlPlane:
    return _control_plane(request, "kueue")


@pytest.fixture
def kube_client() -> Iterator[Callable[[ControlPlane], client.ApiClient]]:
    clients: list[client.ApiClient] = []

    def make(cp: ControlPlane) -> client.ApiClient:
        api_client: client.ApiClient = cp.api_client()
        clients.append(api_client)
        return api_client

    yield make
    for api_client in clients:
        api_client.close()


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, kube_client: Callable[[ControlPlane], client.ApiClient]
) -> Iterator[Callable[..., str]]:
    created: list[tuple[client.CoreV1Api, str]] = []
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")

    def make(cp: ControlPlane, prefix: str = "") -> str:
        name = f"{prefix or base or 't'}-{uuid.uuid4().hex[:6]}"
        core = client.CoreV1Api(kube_client(cp))
        core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
        created.append((core, name))
        return name

    yield make
    for core, name in created:
        # Not waited for: the namespace controller (cluster profile) finishes in the background.
        try:
            core.delete_namespace(name)
        except client.ApiException as err:
            if err.status != 404:
                raise


@pytest.fixture
def tpu_nodes(
    kube_cluster: ControlPlane, kube_client: Callable[[ControlPlane], client.ApiClient]
) -> Iterator[Callable[..., list[str]]]:
    api_client = kube_client(kube_cluster)
    pools: list[str] = []

    def make(
        pool_name: str,
        count: int,
        accelerator_label: str,
        topology: str,
        chips_per_host: int,
        **kwargs: Any,
    ) -> list[str]:
        pools.append(pool_name)
        return register_tpu_nodes(
            api_client, pool_name, count, accelerator_label, topology, chips_per_host, **kwargs
        )

    yield make
    for pool in pools:
        delete_nodes(api_client, pool)
