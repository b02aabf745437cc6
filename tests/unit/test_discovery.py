"""kopf's namespace and CRD discovery drop what their watches list (controller/discovery.py).

The namespace case runs kopf's own observer, watcher and workers; only the two HTTP calls under
them (`fetch_objs`, the listing, and `watch_objs`, the stream) are replaced, so the test decides
what each listing returns: namespace `b` is created between kopf's first listing and its
watch's own listing, the gap a demo run fell into."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import fetching, scanning, watching
from kopf._cogs.structs import references
from kopf._core.reactor import observation

from multislice_operator.controller import discovery

STOCK_NS = getattr(
    observation.process_discovered_namespace_event,
    "__wrapped__",
    observation.process_discovered_namespace_event,
)
STOCK_CRD = getattr(
    observation.process_discovered_resource_event,
    "__wrapped__",
    observation.process_discovered_resource_event,
)
NAMESPACES = references.Resource(
    group="",
    version="v1",
    plural="namespaces",
    namespaced=False,
    verbs=frozenset({"list", "watch"}),
)


def ns(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7", **meta},
    }


async def observe(
    monkeypatch: pytest.MonkeyPatch,
    listings: list[list[dict[str, Any]]],
    patterns: list[str],
    wrap: Callable[[Any], Any] | None,
) -> set[Any]:
    """The namespaces kopf watches once it has processed every listed object."""
    calls = iter(listings)
    seen: list[str] = []
    done = asyncio.Event()
    expected = sum(len(listing) for listing in listings[1:])

    async def fetch_objs(**_: Any) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        yield next(calls), "7"

    async def watch_objs(**_: Any) -> AsyncIterator[dict[str, Any]]:
        await asyncio.Event().wait()  # a quiet watch: nothing happens after the listings
        yield {}  # pragma: no cover

    async def spy(**kw: Any) -> None:
        await STOCK_NS(**kw)
        seen.append(kw["raw_event"]["object"]["metadata"]["name"])
        if len(seen) == expected:
            done.set()

    monkeypatch.setattr(fetching, "fetch_objs", fetch_objs)
    monkeypatch.setattr(watching, "watch_objs", watch_objs)
    monkeypatch.setattr(
        observation, "process_discovered_namespace_event", wrap(spy) if wrap else spy
    )
    insights = references.Insights()
    await insights.backbone.fill(resources=[NAMESPACES])
    settings = kopf.OperatorSettings()
    task = asyncio.create_task(
        observation.namespace_observer(
            clusterwide=False, namespaces=patterns, insights=insights, settings=settings
        )
    )
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return set(insights.namespaces)


def test_stock_kopf_never_watches_a_namespace_created_between_its_two_listings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bug, pinned: when this fails, kopf counts its listings and discovery.py can go."""
    listings = [[ns("a"), ns("other")], [ns("a"), ns("b"), ns("other")]]
    watched = asyncio.run(observe(monkeypatch, listings, ["a", "b"], wrap=None))
    assert watched == {"a"}


def test_a_namespace_created_between_the_listings_is_watched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listings = [[ns("a"), ns("other")], [ns("a"), ns("b"), ns("other")]]
    watched = asyncio.run(
        observe(monkeypatch, listings, ["a", "b"], wrap=discovery.namespace_processor)
    )
    assert watched == {"a", "b"}  # never `other`: it matches no pattern


def test_a_relisting_counts_what_a_watch_event_would_have(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The second listing stands for a relisting after 410 Gone: team-c and team-d arrived
    # meanwhile, and team-d is already terminating (deletionTimestamp, no condition yet). kopf
    # keeps a terminating namespace watched, as for a MODIFIED event: its jobs' finalizers must
    # still run, so their node pools are released.
    going = ns("team-d", deletionTimestamp="2026-12-02T00:00:00Z")
    listings = [[ns("team-a")], [ns("team-a"), ns("team-c"), going, ns("prod")]]
    watched = asyncio.run(
        observe(monkeypatch, listings, ["team-*"], wrap=discovery.namespace_processor)
    )
    assert watched == {"team-a", "team-c", "team-d"}  # never prod: no pattern matches it


class Recorder:
    def __init__(self) -> None:
        self.types: list[str | None] = []

    async def __call__(self, *, raw_event: dict[str, Any], **_: Any) -> None:
        self.types.append(raw_event["type"])


def crd(group: str) -> dict[str, Any]:
    return {"metadata": {"name": f"things.{group}"}, "spec": {"group": group}}


def served(*groups: str) -> references.Insights:
    insights = references.Insights()
    insights.watched_resources.update(
        references.Resource(group=g, version="v1", plural="things") for g in groups
    )
    return insights


@pytest.mark.parametrize(
    ("group", "watched", "expected"),
    [
        ("jobset.x-k8s.io", (), "ADDED"),  # ours, not served: scanned as if it were added
        ("jobset.x-k8s.io", ("jobset.x-k8s.io",), None),  # served already: as kopf does
        ("example.com", (), None),  # no handler of ours: no discovery call per listed CRD
    ],
)
def test_a_listed_crd_is_scanned_only_for_a_group_of_ours_that_kopf_does_not_serve(
    group: str, watched: tuple[str, ...], expected: str | None
) -> None:
    rec = Recorder()
    process = discovery.resource_processor(rec, {"jobset.x-k8s.io", "multislice.dev"})
    asyncio.run(process(raw_event={"type": None, "object": crd(group)}, insights=served(*watched)))
    assert rec.types == [expected]


def test_watch_events_pass_through_unchanged() -> None:
    rec = Recorder()
    process = discovery.resource_processor(rec, {"jobset.x-k8s.io"})
    for kind in ("ADDED", "MODIFIED", "DELETED"):
        asyncio.run(
            process(raw_event={"type": kind, "object": crd("jobset.x-k8s.io")}, insights=served())
        )
    assert rec.types == ["ADDED", "MODIFIED", "DELETED"]


def test_stock_kopf_drops_a_listed_crd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinned as for namespaces: the stock processor scans nothing for a listed CRD, and scans
    the group of an ADDED one (what the wrapper turns a listing of ours into)."""
    scans: list[Any] = []

    async def scan_resources(*, groups: Any, **_: Any) -> set[Any]:
        scans.append(groups)
        return set()

    monkeypatch.setattr(scanning, "scan_resources", scan_resources)
    registry = kopf.OperatorRegistry()
    for kind in (None, "ADDED"):
        event: Any = {"type": kind, "object": crd("jobset.x-k8s.io")}
        asyncio.run(
            STOCK_CRD(
                raw_event=event,
                settings=kopf.OperatorSettings(),
                registry=registry,
                insights=references.Insights(),
            )
        )
    assert scans == [{"jobset.x-k8s.io"}]


def test_install_wraps_once_and_the_observers_look_the_processors_up_at_call_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(observation, "process_discovered_namespace_event", STOCK_NS)
    monkeypatch.setattr(observation, "process_discovered_resource_event", STOCK_CRD)
    discovery.install({"multislice.dev"})
    first = observation.process_discovered_namespace_event
    discovery.install({"multislice.dev"})
    assert observation.process_discovered_namespace_event is first
    assert first.__wrapped__ is STOCK_NS  # type: ignore[attr-defined]
    assert observation.process_discovered_resource_event.__wrapped__ is STOCK_CRD  # type: ignore[attr-defined]
    # kopf's observers name the processors as module globals, so the wrapped ones are the ones
    # their watchers call (a `from ... import` in kopf would bypass install()).
    import inspect

    for observer, name in (
        (observation.namespace_observer, "process_discovered_namespace_event"),
        (observation.resource_observer, "process_discovered_resource_event"),
    ):
        assert f"functools.partial({name}," in inspect.getsource(observer)


def _unresolved(caplog: pytest.LogCaptureFixture) -> list[str]:
    """kopf's unresolved-resources warnings when it revises the operator's handlers against a
    cluster that serves no custom resource at all (kopf's own revise_resources)."""
    from multislice_operator.controller import handlers  # registers the operator's handlers

    handlers._watch_plugins()  # the capacity models' watches, as configure() registers them
    assert handlers.optional_api_groups() <= handlers.api_groups()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=observation.logger.name):
        observation.revise_resources(
            group=None,
            insights=references.Insights(),
            registry=kopf.get_default_registry(),
            resources=[],
        )
    return [r.getMessage() for r in caplog.records if r.name == observation.logger.name]


def test_kopfs_warning_about_the_optional_slice_api_is_quieted_and_the_rest_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 56: every start on a cluster without GKE's Slice CRD (and every CRD event after)
    logged kopf's "Unresolved resources cannot be served ... slices"; the operator says that
    once in its own words (versions.py). A missing MultisliceJob or JobSet CRD is still said."""
    from multislice_operator.controller import handlers

    monkeypatch.setattr(observation.logger, "filters", [])
    (stock,) = _unresolved(caplog)
    assert stock.startswith(discovery.UNRESOLVED) and "any_name='slices'" in stock
    # The Slice watch is the dynamic model's, declared optional there (a registered
    # plugin's watch; nothing else names the group).
    assert handlers.optional_api_groups() == {"accelerator.gke.io"}
    discovery.install({"multislice.dev"}, optional=handlers.optional_api_groups())
    discovery.install({"multislice.dev"}, optional=handlers.optional_api_groups())
    assert len(observation.logger.filters) == 1  # installed once
    (quiet,) = _unresolved(caplog)
    assert "slices" not in quiet and "accelerator.gke.io" not in quiet
    assert "any_name='multislicejobs'" in quiet and "any_name='jobsets'" in quiet
    assert quiet.startswith(f"{discovery.UNRESOLVED} (try creating their CRDs): Selector(")


def test_a_warning_naming_only_the_optional_group_is_dropped() -> None:
    quiet = discovery.OptionalResources({"accelerator.gke.io"})
    only = logging.LogRecord(
        observation.logger.name, logging.WARNING, __file__, 1,
        f"{discovery.UNRESOLVED} (try creating their CRDs): Selector(group='accelerator.gke.io', "
        "version='v1beta1', any_name='slices')", (), None,
    )  # fmt: skip
    assert not quiet.filter(only)
    other = logging.LogRecord(
        observation.logger.name, logging.WARNING, __file__, 1, "Ambiguous resources ...", (), None
    )
    assert quiet.filter(other) and other.getMessage() == "Ambiguous resources ..."
