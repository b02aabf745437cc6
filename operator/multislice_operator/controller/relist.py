"""What a re-list did not return goes from kopf's indexes and memories, as client-go's does.

kopf (pinned in pyproject.toml) lists a watched kind again when its watch answers 410 Gone, or
when the apiserver's 429 outlasts kopf's retries (`clients/watching.py`, `continuous_watch`), and
a listing yields the objects it finds with no DELETED for those deleted while nothing watched:
their index entries and kopf's per-object memories stayed for the process's life. After a 50-job
load 104 deleted nodes were still in the node index (docs/benchmarks.md): memory the load never
gave back, and a pool made again under the same name would have been seen with its old nodes.
client-go's reflector replaces its store with each listing instead (its `Replace`).

`install()` wraps kopf's `continuous_watch` so that when a listing ends (kopf's
`Bookmark.LISTED`, before the watch that follows it starts), every entry of the indexes `track`
names for that kind, in the listing's namespace, whose object the listing did not return is
dropped, with kopf's memory of it. An object created after the listing comes by that watch, so
nothing live is dropped. Nothing else changes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from kopf._cogs.clients import watching
from kopf._core.reactor import inventory

log = logging.getLogger(__name__)

_MARK = "__multislice_relist__"
# kopf's per-object memories, handed to kopf.operator so that a dropped object's goes too.
MEMORIES = inventory.ResourceMemories()
# (API group, plural) -> the kopf indexes fed by that kind's watch.
_TRACKED: dict[tuple[str, str], list[Any]] = {}


def track(indexes: Iterable[tuple[str, str, Any]]) -> None:
    """These kopf indexes, each (API group, plural, index), are fed by that kind's watch: prune
    them after each of its listings (replaces what an earlier start of the operator tracked)."""
    _TRACKED.clear()
    for group, plural, index in indexes:
        _TRACKED.setdefault((group, plural), []).append(index)


def prune(index: Any, namespace: str | None, listed: set[str]) -> set[str]:
    """Drop `index`'s entries for objects in `namespace` (None: every one) whose uid is not in
    `listed`; returns their uids. kopf 1.45 keys an object's entries (namespace, name, uid) and
    keeps where each is stored in the index's reverse map (`indexing.Index`)."""
    reverse: dict[tuple[Any, Any, Any], Any] = index._Index__reverse
    stale = [k for k in reverse if (namespace is None or k[0] == namespace) and k[2] not in listed]
    for key in stale:
        index._discard(key)
    return {str(k[2]) for k in stale}


def _uid(event: Any) -> str | None:
    uid = ((event.get("object") or {}).get("metadata") or {}).get("uid")
    return str(uid) if uid else None


def _after_listing(resource: Any, namespace: str | None, listed: set[str]) -> None:
    gone: set[str] = set()
    for index in _TRACKED.get((resource.group, resource.plural), ()):
        gone |= prune(index, namespace, listed)
    for uid in gone:
        MEMORIES._items.pop(uid, None)
    if gone:
        log.info(
            "re-listed %s%s: %d deleted while unwatched, dropped from the operator's indexes",
            resource.plural,
            f" in {namespace}" if namespace else "",
            len(gone),
        )


Stream = Callable[..., AsyncIterator[Any]]


def listing_pruner(original: Stream) -> Stream:
    @functools.wraps(original)  # kopf's signature and name still show through (__wrapped__)
    async def continuous_watch(*, resource: Any, namespace: str | None, **kw: Any
                               ) -> AsyncIterator[Any]:  # fmt: skip
        listed: set[str] = set()
        async for event in original(resource=resource, namespace=namespace, **kw):
            if event is watching.Bookmark.LISTED:
                _after_listing(resource, namespace, listed)
                listed = set()
            elif isinstance(event, dict) and event.get("type") is None:
                uid = _uid(event)
                if uid is not None:
                    listed.add(uid)
            yield event

    setattr(continuous_watch, _MARK, True)
    return continuous_watch


def install() -> None:
    """Wrap kopf's continuous_watch (once); `infinite_watch` calls it by its module name."""
    if not getattr(watching.continuous_watch, _MARK, False):
        watching.continuous_watch = listing_pruner(watching.continuous_watch)
