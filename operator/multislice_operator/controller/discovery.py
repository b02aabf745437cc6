"""kopf's discovery of watched namespaces and of CRDs, made to count what it lists.

kopf (pinned in pyproject.toml) resolves `watchNamespaces` by listing the namespaces once and then
starting a watch of them, and it learns of CRDs by one discovery scan and then a watch of the
CRDs. Both watches begin with a listing of their own (and list again after every 410 Gone), and
kopf drops every listed object: only the watch's ADDED, MODIFIED and DELETED events count. So a
namespace created between the two listings, or while the watch reconnects, is never watched and
its jobs are never seen (a demo run, creating `team-b` just after its operator started, waited
out its timeout on a job the operator never handled); a CRD established in that gap (JobSet,
Kueue, applied with the chart) is never served.

`install()` wraps kopf's two event processors so that a listed object counts as an ADDED one
where kopf's own state does not have it yet: a listed namespace that matches a pattern is watched,
a listed CRD of a group the operator handles and kopf does not serve is scanned. Nothing else
changes (a namespace already watched, a CRD already served, any other group: as kopf does).

It also quiets kopf's warning about a handler whose resource the cluster does not serve for the
`optional` groups (GKE's Slice API, served only where dynamic slicing is enabled): kopf logs it at
start-up and again on every CRD event while the CRD is missing, and the operator says it once in
its own words (controller/versions.py). kopf still watches the resource once it is served. The
warning for any other group (a missing MultisliceJob or JobSet CRD) is kept.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Collection, Coroutine
from typing import Any

from kopf._core.reactor import observation

Processor = Callable[..., Coroutine[Any, Any, None]]
_MARK = "__multislice_discovery__"


def _listed(raw_event: Any) -> bool:
    return raw_event.get("type") is None


def _served(insights: Any, group: str) -> bool:
    return any(r.group == group for r in (*insights.watched_resources, *insights.indexed_resources))


def namespace_processor(original: Processor) -> Processor:
    @functools.wraps(original)
    async def process(
        *, raw_event: Any, namespaces: Collection[str], insights: Any, **kw: Any
    ) -> None:
        if _listed(raw_event):
            name = raw_event["object"]["metadata"]["name"]
            if name not in insights.namespaces:
                raw_event = {**raw_event, "type": "ADDED"}
        await original(raw_event=raw_event, namespaces=namespaces, insights=insights, **kw)

    setattr(process, _MARK, True)
    return process


def resource_processor(original: Processor, groups: Collection[str]) -> Processor:
    @functools.wraps(original)
    async def process(*, raw_event: Any, insights: Any, **kw: Any) -> None:
        if _listed(raw_event):
            group = str((raw_event["object"].get("spec") or {}).get("group") or "")
            if group in groups and not _served(insights, group):
                raw_event = {**raw_event, "type": "ADDED"}
        await original(raw_event=raw_event, insights=insights, **kw)

    setattr(process, _MARK, True)
    return process


# kopf's words (observation._disable_mismatched_selectors): the head, then the selectors.
UNRESOLVED = "Unresolved resources cannot be served"
_SELECTOR = re.compile(r"Selector\([^()]*\)")


class OptionalResources(logging.Filter):
    """kopf's unresolved-resources warning without the selectors of the `groups`; dropped when
    it names no other."""

    def __init__(self, groups: Collection[str]) -> None:
        super().__init__()
        self.groups = frozenset(groups)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(UNRESOLVED):
            return True
        head = message.split(": ", 1)[0]
        kept = [s for s in _SELECTOR.findall(message) if not self._optional(s)]
        if not kept:
            return False
        record.msg, record.args = f"{head}: {', '.join(kept)}", ()
        return True

    def _optional(self, selector: str) -> bool:
        return any(f"group={group!r}" in selector for group in self.groups)


def install(groups: Collection[str], optional: Collection[str] = ()) -> None:
    """Wrap kopf's processors (once): `groups` are the API groups of the operator's handlers,
    `optional` those of them a cluster may not serve (kopf's warning about them is quieted)."""
    if optional and not any(isinstance(f, OptionalResources) for f in observation.logger.filters):
        observation.logger.addFilter(OptionalResources(optional))
    ns_event = observation.process_discovered_namespace_event
    if not getattr(ns_event, _MARK, False):
        observation.process_discovered_namespace_event = namespace_processor(ns_event)
    crd_event = observation.process_discovered_resource_event
    if not getattr(crd_event, _MARK, False):
        observation.process_discovered_resource_event = resource_processor(
            crd_event, frozenset(groups)
        )
