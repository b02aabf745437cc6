"""kopf's private API, the three pieces the operator leans on: controller/kube.py rides kopf's own
API client (its session, credentials and re-authentication), controller/discovery.py wraps
the two processors of kopf's namespace and CRD discovery (tests/unit/test_discovery.py pins their
behaviour), and controller/relist.py wraps kopf's list-then-watch and prunes its indexes and
memories after a listing (tests/unit/test_relist.py). kopf is pinned exactly in
pyproject.toml's `operator` extra (and image/requirements.lock); these tests fail when a kopf
upgrade moves what kube.py calls, and when new code reaches for another private name. The last
test drives kopf's own per-object worker with the operator's settings (how long it holds a body)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import re
import tomllib
import weakref
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

import kopf
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import errors as kopf_errors

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_PRIVATE = {
    "kopf._cogs.clients.api",
    "kopf._cogs.clients.errors",
    "kopf._cogs.clients.watching",
    "kopf._core.reactor.inventory",
    "kopf._core.reactor.observation",
}
IMPORT = re.compile(r"^from (kopf\._[\w.]+) import (\w+)|^import (kopf\._[\w.]+)", re.M)


def test_kopf_is_pinned_exactly_and_installed_at_that_version() -> None:
    # The operator's pins are its extra (the base dependencies are the CLI's ranges).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["optional-dependencies"]["operator"]
    (pin,) = [d for d in deps if re.match(r"kopf\b", d)]
    assert re.fullmatch(r"kopf==[0-9.]+", pin), pin
    assert version("kopf") == pin.split("==")[1]


def test_the_operator_uses_no_other_private_kopf_name() -> None:
    used: set[str] = set()
    for path in (ROOT / "operator").rglob("*.py"):
        text = path.read_text()
        for package, name, module in IMPORT.findall(text):
            used.add(module or f"{package}.{name}")
        # Attribute access into kopf's private parts (registry._indexing and the like).
        assert not re.search(r"\bregistry\._\w+|kopf\.\w+\._\w+", text), path
    assert used == ALLOWED_PRIVATE


def test_the_request_function_kube_py_calls_keeps_its_shape() -> None:
    sig = inspect.signature(kopf_api.request)
    assert inspect.iscoroutinefunction(kopf_api.request)
    for name in ("method", "url", "payload", "headers", "backoffs", "settings", "logger"):
        assert name in sig.parameters, name
    assert isinstance(kopf.OperatorSettings(), kopf.OperatorSettings)


def test_what_relist_py_wraps_and_prunes_keeps_its_shape() -> None:
    """The list-then-watch that infinite_watch calls by its module name, the bookmark that ends a
    listing, an index's reverse map keyed (namespace, name, uid), the memories keyed by uid."""
    from kopf._cogs.clients import watching
    from kopf._core.engines import indexing
    from kopf._core.reactor import inventory

    params = inspect.signature(watching.continuous_watch).parameters
    assert {"settings", "resource", "namespace", "operator_pause_waiter"} <= set(params)
    assert "continuous_watch(" in inspect.getsource(watching.infinite_watch)
    assert isinstance(watching.Bookmark.LISTED, watching.Bookmark)
    indexer = indexing.OperatorIndexer()
    indexer.replace(("ns", "n", "u"), {"k": 1})
    assert indexer.index._Index__reverse == {("ns", "n", "u"): {"k"}}  # type: ignore[attr-defined]
    indexer.index._discard(("ns", "n", "u"))
    assert not indexer.index
    memories = inventory.ResourceMemories()
    asyncio.run(memories.recall({"metadata": {"uid": "u"}}))  # type: ignore[arg-type]
    assert set(memories._items) == {"u"}


def test_the_errors_kube_py_catches_keep_their_hierarchy() -> None:
    assert issubclass(kopf_errors.APIClientError, kopf_errors.APIError)
    for cls in (
        kopf_errors.APINotFoundError,
        kopf_errors.APIConflictError,
        kopf_errors.APIUnprocessableEntityError,
        kopf_errors.APIForbiddenError,
    ):
        assert issubclass(cls, kopf_errors.APIClientError), cls
    err = kopf_errors.APIError({"message": "m"}, status=418, headers={})
    assert err.status == 418


def test_no_diff_base_is_safe_because_the_operator_registers_no_change_handler() -> None:
    """handlers.NoDiffBase spares kopf a deep copy of every watched body per event; that is right
    only while nothing diffs against it: no on.create/update/delete/resume/field handler, no
    daemon or timer (a daemon's idle reset reads the diff), whatever --kueue adds."""
    from kopf._cogs.structs import diffs

    from multislice_operator.controller import handlers
    from multislice_operator.settings import Settings

    kept = handlers._SETTINGS, handlers.PROVISIONER_FACTORY
    handlers.configure(Settings(kueue=True), None)  # the Kueue watches too
    handlers._SETTINGS, handlers.PROVISIONER_FACTORY = kept
    registry = kopf.get_default_registry()
    assert registry._watching.get_all_handlers()  # the spies are there: the registry is ours
    assert not registry._changing.get_all_handlers()
    assert not registry._spawning.get_all_handlers()

    settings = kopf.OperatorSettings()
    storage = settings.persistence.diffbase_storage = handlers.NoDiffBase()
    body = kopf.Body({"metadata": {"name": "j", "labels": {"a": "1"}}, "spec": {"x": [1] * 1000}})
    essence = storage.build(body=body)
    assert essence == {} and storage.fetch(body=body) == {}
    old = settings.persistence.progress_storage.clear(essence=essence)
    assert not diffs.diff(old, settings.persistence.progress_storage.clear(essence=essence))


class _RawEvent(dict[str, Any]):
    """A watch event as kopf's stream yields it, but one a weakref can follow (a dict cannot)."""


def test_kopfs_worker_lets_a_watched_objects_last_body_go_soon_after_its_event() -> None:
    """kopf's per-object worker holds the last event it processed until it idles out. With the
    operator's settings it exits, and the body goes, well inside 3 s; kopf's default (5 s) keeps
    it, and after a burst of 200 jobs that kept hundreds of bodies alive at once: a peak the
    allocator never handed back (docs/benchmarks.md, the memory after a load)."""
    from kopf._core.reactor import queueing

    from multislice_operator.controller import handlers

    settings = kopf.OperatorSettings()
    handlers.configure_kopf(settings)

    async def scenario() -> tuple[list[str], weakref.ref[_RawEvent], int]:
        seen: list[str] = []

        async def processor(*, raw_event: Mapping[str, Any], **_: Any) -> None:
            seen.append(raw_event["type"])

        key: Any = ("multislicejobs", "uid-1")
        streams: dict[Any, Any] = {
            key: queueing.Stream(backlog=asyncio.Queue(), pressure=asyncio.Event())
        }
        raw = _RawEvent(type="ADDED", object={"metadata": {"uid": "uid-1"}, "spec": [0] * 1000})
        body = weakref.ref(raw)
        await streams[key].backlog.put(raw)
        del raw
        worker = queueing.worker(
            signaller=asyncio.Condition(),
            settings=settings,
            processor=processor,  # type: ignore[arg-type]
            streams=streams,
            key=key,
        )
        await asyncio.wait_for(worker, timeout=3.0)  # kopf's default would still hold it here
        return seen, body, len(streams)

    seen, body, left = asyncio.run(scenario())
    gc.collect()
    assert seen == ["ADDED"]  # the event was processed, and then:
    assert body() is None, "the worker still holds the object's last body"
    assert left == 0  # the worker and its queue are gone


def test_only_the_operators_own_jobsets_pods_and_nodes_are_watched() -> None:
    """kopf keeps a memory (memo, error throttler, index state) for every object its watches
    deliver, for the object's life, whether a handler's label filter matches it or not: on a
    cluster of other workloads every pod and JobSet would cost the operator one, and every one of
    their events a parse. The operator's settings ask the apiserver for its own only (kopf's
    server-side label selectors), with the same labels its handlers filter on."""
    from kopf._cogs.structs import references

    from multislice_operator.common import keys
    from multislice_operator.controller import handlers

    settings = kopf.OperatorSettings()
    handlers.configure_kopf(settings)
    wanted = {
        ("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"): [
            f"{keys.MANAGED_BY}={keys.MANAGED_BY_VALUE}"
        ],
        ("", "v1", "pods", "Pod"): [keys.JOB_NAME],
        ("", "v1", "nodes", "Node"): [keys.GKE_NODEPOOL],
        ("metrics.k8s.io", "v1beta1", "pods", "PodMetrics"): [],  # another group's "pods"
    }
    for (group, api_version, plural, kind), selectors in wanted.items():
        resource = references.Resource(group, api_version, plural, kind=kind)
        assert settings.watching.label_selectors.collect(resource) == selectors, resource
