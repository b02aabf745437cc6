"""Shared fixtures: real local Kubernetes control planes (multislice_local).

* ``kube_api``: session-scoped :class:`ControlPlane` of the ``api`` profile (etcd + apiserver).
* ``kube_cluster``: session-scoped ``cluster`` profile (plus controller-manager, scheduler, kwok,
  JobSet controller and webhooks).
* ``kube_kueue``: session-scoped ``kueue`` profile (``cluster`` plus the Kueue controller).
* ``kube_next``: session-scoped ``cluster`` profile on the newest Kubernetes lane (kube-apiserver
  and kube-scheduler 1.37 with the Workload API on: ``ControlPlane(..., kube_next=True)``).
* ``real_cluster``: session-scoped :class:`RealCluster`: a ``cluster`` control plane with real
  nodes (kubelet, containerd, runc; two v5litepod-8 pools of two hosts and a plain node); skipped
  with one line where the host cannot run containers (``realnodes.unavailable_reason()``).
* ``kube_client(cp) -> kubernetes.client.ApiClient``: admin client for a control plane.
* ``namespace(cp, prefix="t") -> str``: a fresh namespace, deleted after the test.
* ``tpu_nodes(pool_name, count, accelerator_label, topology, chips_per_host, **kw) -> names``:
  fake TPU nodes in ``kube_cluster``, deleted after the test.
* ``operator_image`` / ``workload_image``: the product's images as OCI archives
  (:class:`multislice_local.images.BuiltImage`: ``.archive``, ``.ref``, ``.digest``), built
  offline into the image cache (``MULTISLICE_IMAGE_CACHE``; cold: minutes, warm: seconds).

Tests under tests/integration and tests/e2e get the ``integration`` / ``e2e`` markers.

How the suite runs in parallel (``make test``, tests/README.md): the unit layer with ``pytest -n
1``, beside tests/integration and tests/e2e with ``pytest -n 4 --dist loadgroup``. Every test that
uses a control-plane fixture is put in the xdist group of that fixture (the first of
``_CONTROL_PLANE_FIXTURES`` it uses; ``kube_cluster`` tests of a module, or tests, in
``_CLUSTER_SHARDS`` in that shard's group), so each session control plane boots in one worker only
and its tests run one after another there; a test without one is grouped with its module (module
fixtures, such as a built wheel, are built once). Groups in ``_SERIAL_GROUPS`` keep tests that
start many processes of their own off each other. A new test needs no marker: ask for ``kube_api``
/ ``kube_cluster`` / ``kube_kueue`` and a ``namespace`` of them; a new control-plane fixture must
be added to ``_CONTROL_PLANE_FIXTURES``.

The groups reach xdist's scheduler through a file per worker, not through xdist's own
``--dist loadgroup``: pytest-xdist 3.8.0 marks a group by appending ``@group`` to the test's
node id, which pytest 9.2's structured node ids ignore, so its grouping silently does nothing
(pytest-dev/pytest-xdist#1386, fix open in #1388). ``_GroupScheduling`` is xdist's
LoadScopeScheduling (biggest scope first, one scope per worker at a time) with these groups as
the scopes.
"""

from __future__ import annotations

import json
import re
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from multislice_local import realnodes
from multislice_local.controlplane import ControlPlane, ensure_binaries, ensure_next_binaries
from multislice_local.images import BuiltImage, build_image
from multislice_local.nodes import delete_nodes, register_tpu_nodes

# In order: a test using more than one is grouped with the first. ``mc``: the MultiKueue setup
# of tests/e2e/test_multicluster.py (three control planes of its own, module-scoped).
_CONTROL_PLANE_FIXTURES = (
    "kube_cluster", "kube_kueue", "kube_api", "mc", "real_cluster", "kube_next"
)  # fmt: skip
# The kube_cluster tests are the longest group by far (about 1500 of the layer's 2100
# worker-seconds), so they run as three groups, each on a cluster control plane of its own (a
# session fixture is per worker: the worker that runs a group boots one): the modules, or single
# tests (module::function), below on the second and third, every other one on the first,
# balanced by each test's time (`--junitxml`: about 450-470 s each on 2 cores). The layer waits on
# controllers more than it computes, so the clusters side by side on four workers divide its
# time (measured on 2 cores with the unit layer beside it: two clusters on three workers, 928 s
# for the layer; three on four, see tests/README.md). A fourth worker once cost a write-budget
# job an extra status write under the load: a pass that saw one of a deleted job's pools gone
# and the other not yet, fixed since (goodput is kept as the deletion's first pass wrote it).
_CLUSTER_SHARDS = {
    "tests/e2e/test_demo.py": "kube_cluster-2",
    "tests/e2e/test_disruptions.py": "kube_cluster-2",
    # The real JAX workload's four processes (about 220 s) beside the modules that compute little.
    "tests/e2e/test_demo.py::test_demo_runs_the_real_workload_with_the_injected_environment": (
        "kube_cluster-3"
    ),
    "tests/e2e/test_goodput.py": "kube_cluster-3",
    "tests/e2e/test_bad_input_holds_no_pools.py": "kube_cluster-3",
}
# Groups start in this order, longest first, then every other one (xdist's LoadScope would start
# the groups with the most tests first, and the many quick kube_api tests are not the long pole).
# The real nodes' group first: its images, imports and a JAX job in real pods make it the longest.
_FIRST_GROUPS = (
    "real_cluster", "kube_cluster-2", "kube_cluster-3", "kube_cluster", "kube_kueue", "kube_api"
)  # fmt: skip
# Modules whose tests start many CPU-bound processes (the JAX workload's multi-process runs): one
# group, so that two of them never run at once on a 2-core machine.
_SERIAL_GROUPS = {
    "tests/workload/test_workload_local.py": "workload-processes",
    "tests/workload/test_workload_cli.py": "workload-processes",
    # The TPU compile lane: its compiles are cached in the module, so they share one worker.
    "tests/workload/test_tpu_compile.py": "tpu-compile",
}


def _xdist_group(item: pytest.Item) -> str | None:
    """The xdist group of `item`: its control plane's, its serial group, or (integration and
    e2e tests) its module; None: any worker."""
    fixtures = set(getattr(item, "fixturenames", ()))
    module = item.path.relative_to(item.config.rootpath).as_posix()
    for name in _CONTROL_PLANE_FIXTURES:
        if name == "kube_cluster" and name in fixtures:
            test = f"{module}::{getattr(item, 'originalname', item.name)}"
            return _CLUSTER_SHARDS.get(test) or _CLUSTER_SHARDS.get(module, name)
        if name in fixtures:
            return name
    if module in _SERIAL_GROUPS:
        return _SERIAL_GROUPS[module]
    if {"integration", "e2e"} & set(item.path.parts):
        return module
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "e2e" in parts:
            item.add_marker(pytest.mark.e2e)
        group = _xdist_group(item)
        if group is not None and not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(group))
    if _loadgroup(config):  # xdist starts the groups in the order their first tests come
        items.sort(key=_start_rank)
    # A cold binary build takes many minutes: do it here, outside any per-test timeout (under
    # xdist every worker asks; ensure_binaries lets one build and the others wait for it).
    if not config.option.collectonly and any(
        set(_CONTROL_PLANE_FIXTURES) & set(getattr(item, "fixturenames", ())) for item in items
    ):
        ensure_binaries()
    # The newest Kubernetes lane's two binaries likewise (after the main lane's: they share its
    # Go build cache).
    if not config.option.collectonly and any(
        "kube_next" in getattr(item, "fixturenames", ()) for item in items
    ):
        ensure_next_binaries()
    # The real nodes' binaries likewise, where this host can run them (elsewhere their tests skip).
    if (
        not config.option.collectonly
        and any("real_cluster" in getattr(item, "fixturenames", ()) for item in items)
        and realnodes.unavailable_reason() is None
    ):
        realnodes.ensure_node_binaries()


# ---------------------------------------------------------------- xdist groups (see the docstring)


def _start_rank(item: pytest.Item) -> int:
    mark = item.get_closest_marker("xdist_group")
    group = str(mark.args[0] if mark.args else mark.kwargs["name"]) if mark else None
    return _FIRST_GROUPS.index(group) if group in _FIRST_GROUPS else len(_FIRST_GROUPS)


_GROUPS_DIR = "msj_xdist_groups_dir"  # workerinput key: where workers write their group maps


def _loadgroup(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "dist", "no") == "loadgroup")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Controller side: tell each worker where to write its node id -> group map."""
    config = node.config
    if _loadgroup(config):
        if not hasattr(config, "_msj_groups_dir"):
            config._msj_groups_dir = tempfile.mkdtemp(prefix="msj-xdist-groups-")  # type: ignore[attr-defined]
        node.workerinput[_GROUPS_DIR] = config._msj_groups_dir  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)  # before xdist's own tells the controller collection is done
def pytest_collection_finish(session: pytest.Session) -> None:
    """Worker side: the map of this worker's collection (all workers collect the same tests)."""
    workerinput = getattr(session.config, "workerinput", None)
    if not workerinput or _GROUPS_DIR not in workerinput:
        return
    groups = {}
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs["name"])
    path = Path(workerinput[_GROUPS_DIR]) / f"{workerinput['workerid']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.rename(path)  # whole or absent for the controller


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if not _loadgroup(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Scopes are the groups the workers wrote (read once every worker has collected:
        schedule() runs then); a test in no group is a scope of its own."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = {}
                for path in Path(config._msj_groups_dir).glob("*.json"):  # type: ignore[attr-defined]
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid, nodeid)

    config.option.loadscopereorder = False  # the collection's order: _FIRST_GROUPS first
    return _GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = getattr(config, "_msj_groups_dir", None)
    if directory:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def _control_plane(
    request: pytest.FixtureRequest, profile: str, kube_next: bool = False
) -> ControlPlane:
    cp = ControlPlane(profile, kube_next=kube_next)
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


@pytest.fixture(scope="session")
def kube_next(request: pytest.FixtureRequest) -> ControlPlane:
    """The ``cluster`` profile on the newest Kubernetes lane (hack/README.md)."""
    return _control_plane(request, "cluster", kube_next=True)


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> realnodes.RealCluster:
    reason = realnodes.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster = realnodes.RealCluster()
    request.addfinalizer(cluster.stop)
    return cluster.start()


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


@pytest.fixture(scope="session")
def operator_image() -> BuiltImage:
    return build_image("operator")


@pytest.fixture(scope="session")
def workload_image() -> BuiltImage:
    return build_image("workload")
