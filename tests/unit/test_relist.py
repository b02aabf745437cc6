"""A kopf re-list drops what it did not return (controller/relist.py): kopf's own watch code over
real HTTP (the fake apiserver of test_retry_after), kopf's own index and memory classes."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import watching
from kopf._cogs.structs import references
from kopf._core.engines import indexing

from multislice_operator.controller import handlers, relist
from tests.unit.test_retry_after import apiserver, ok

NODES = references.Resource("", "v1", "nodes", namespaced=False)


def _node(name: str, uid: str, pool: str = "pool-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid, "resourceVersion": "1",
                         "labels": {"cloud.google.com/gke-nodepool": pool}}}  # fmt: skip


def _key(body: dict[str, Any]) -> tuple[Any, Any, Any]:
    meta = body["metadata"]
    return (meta.get("namespace"), meta["name"], meta["uid"])


def _index(*bodies: dict[str, Any]) -> indexing.OperatorIndexer:
    """kopf's indexer with each body under its pool (as handlers.node_index returns it)."""
    indexer = indexing.OperatorIndexer()
    for b in bodies:
        pool = b["metadata"]["labels"]["cloud.google.com/gke-nodepool"]
        indexer.replace(_key(b), {pool: b["metadata"]["name"]})
    return indexer


def _names(index: Any) -> dict[str, list[str]]:
    return {pool: sorted(index[pool]) for pool in index}


def test_prune_drops_the_entries_whose_object_was_not_listed() -> None:
    indexer = _index(_node("a", "u-a"), _node("b", "u-b"), _node("c", "u-c", "pool-b"))
    assert relist.prune(indexer.index, None, {"u-a"}) == {"u-b", "u-c"}
    assert _names(indexer.index) == {"pool-a": ["a"]}  # pool-b's store went with its last node


def test_a_namespaces_listing_prunes_only_that_namespace() -> None:
    indexer = indexing.OperatorIndexer()
    for ns, name in (("team-a", "p1"), ("team-b", "p2")):
        indexer.replace((ns, name, f"u-{name}"), {(ns, "job"): name})
    assert relist.prune(indexer.index, "team-a", set()) == {"u-p1"}
    assert _names(indexer.index) == {("team-b", "job"): ["p2"]}


@pytest.fixture
def tracked() -> Any:
    yield
    relist.track([])
    relist.MEMORIES._items.clear()


def test_a_relist_after_410_gone_drops_the_nodes_deleted_while_unwatched(tracked: Any) -> None:
    """Listed a, b, c; the watch answers 410 Gone; b was deleted meanwhile and the new listing has
    a and c (c a new object under an old name: another uid). b's index entry and kopf memory go,
    and so does c's old entry; a and the new c stay."""
    a, b, c_old, c_new = (_node("a", "u-a"), _node("b", "u-b"), _node("c", "u-c1"),
                          _node("c", "u-c2"))  # fmt: skip
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    listing = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "5"}}
    script = {
        "/api/v1/nodes": [
            ok({**listing, "items": [a, b, c_old]}),
            ok([gone]),
            ok({**listing, "items": [a, c_new]}),
            ok([{"type": "MODIFIED", "object": a}]),
        ]
    }
    indexer = indexing.OperatorIndexer()
    relist.track([("", "nodes", indexer.index), ("", "pods", indexing.OperatorIndexer().index)])
    watch = relist.listing_pruner(watching.continuous_watch)

    async def go() -> list[Any]:
        seen: list[Any] = []
        async with apiserver(script):
            settings = kopf.OperatorSettings()
            handlers.configure_kopf(settings)
            settings.watching.reconnect_backoff = 0
            for _ in range(2):  # what infinite_watch does: again after the 410
                async for event in watch(settings=settings, resource=NODES, namespace=None,
                                         operator_pause_waiter=asyncio.Future()):  # fmt: skip
                    seen.append(event)
                    if isinstance(event, dict) and event["type"] in (None, "MODIFIED"):
                        # What kopf's worker does with a listed object: index and remember it.
                        body = event["object"]
                        indexer.replace(_key(body), {"pool-a": body["metadata"]["name"]})
                        await relist.MEMORIES.recall(body)
                    if isinstance(event, dict) and event["type"] == "MODIFIED":
                        break
        return seen

    seen = asyncio.run(go())
    assert seen.count(watching.Bookmark.LISTED) == 2
    assert _names(indexer.index) == {"pool-a": ["a", "c"]}
    assert set(indexer.index._Index__reverse) == {_key(a), _key(c_new)}  # type: ignore[attr-defined]
    assert set(relist.MEMORIES._items) == {"u-a", "u-c2"}


def test_install_wraps_kopfs_watch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async def original(**_: Any) -> Any:  # kopf's, unwrapped (an operator run may have wrapped it)
        yield watching.Bookmark.LISTED

    monkeypatch.setattr(watching, "continuous_watch", original)  # restored after the test
    relist.install()
    wrapped = watching.continuous_watch
    relist.install()
    assert wrapped is not original and watching.continuous_watch is wrapped
