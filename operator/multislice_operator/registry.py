"""The plugin seam: what a capacity model and a restart strategy register, and how they load.

As a Kueue job integration registers everything its kind needs (jobframework.RegisterIntegration:
its GenericJob, its webhook, its indexes, its MultiKueue adapter) and the reconciler never names a
kind, a **capacity model** registers a `CapacityPlugin` (its `spec.provisioning.mode` value, the
spec features it accepts, its own spec rules, what its plan creates, how a slice is observed,
its part of the pod template, its actions' appliers, what the controller watches for it, its
status part and its docs section) and a **restart strategy** registers itself (its name, the
causes it restarts, its JobSet fields, how its restarts are counted, whether the operator or
JobSet carries it out: reconcile/restart_strategy.py's `RestartStrategy`).

Every one of them, in-tree or not, is loaded the same way: a reference `module:function` called
with the registry. The in-tree ones are `BUILTIN`; others come from the entry point group
`multislice_operator.plugins` of any installed distribution and from the environment variable
`MSJ_PLUGINS` (references separated by commas). The CRD's enums (`spec.provisioning.mode`,
`status.lastRestart.strategy`), its spec rules and docs/api.md are generated from what is loaded.

This module sits below every layer (api reads it for the enums): it imports no other module of
the package at run time; what it holds is typed for the checker only.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multislice_operator.api.models import Rule
    from multislice_operator.reconcile.capacity import CapacityModel
    from multislice_operator.reconcile.restart_strategy import RestartStrategy

ENTRY_POINT_GROUP = "multislice_operator.plugins"
ENV = "MSJ_PLUGINS"
# The in-tree plugins, loaded first and in this order (the enums list them so).
BUILTIN = (
    "multislice_operator.plugins.nodepools:register",
    "multislice_operator.plugins.existing:register",
    "multislice_operator.plugins.dynamic:register",
    "multislice_operator.plugins.fallback:register",
    "multislice_operator.plugins.inplace:register",
    "multislice_operator.plugins.recreate:register",
    "multislice_operator.plugins.resize:register",
)


class Feature:
    """Spec features a capacity model may accept (an allow-list: what it does not name, it
    refuses, naming the field; api/models.py FEATURES generates the rules)."""

    SPARES = "spares"  # spec.spares > 0: hot spare pools (or cubes) the model keeps
    ELASTIC = "elastic"  # spec.elastic: the job runs on fewer slices while pools come back
    FLEX_START = "flexStart"  # spec.capacity.type FlexStart: capacity the model waits for


FEATURES = frozenset(v for k, v in vars(Feature).items() if k.isupper())
MODE_RE = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")  # quoted into CEL and docs as it is


@dataclass(frozen=True)
class Watch:
    """An object kind the controller watches for a capacity model: an index of its objects
    (kopf), each summarized by `summarize` (a reference `module:function`, pure: the body to the
    few fields the model reads), under the index's name; an event wakes the jobs it names."""

    name: str
    group: str
    version: str
    plural: str
    summarize: str
    labels: Mapping[str, str] = field(default_factory=dict)
    cluster_scoped: bool = True
    # A kind a cluster may well not serve (an optional API of the cloud's): the operator says so
    # once in its own words and kopf's unresolved-resources warning is quieted for its group.
    optional: bool = False


@dataclass(frozen=True)
class CapacityPlugin:
    """Everything one capacity model brings (one `spec.provisioning.mode` value).

    - `model`: decide()'s half (reconcile/capacity.py's `CapacityModel`).
    - `accepts`: the `Feature`s it accepts, each with a few words of what it does with it (the
      spec rules refusing the others are generated, naming the modes that accept them).
    - `rules`: its own spec rules (api/models.py `Rule`: CEL for the CRD, Python for validate).
    - `check`: its checks that need the catalog: f(spec, shape) -> field errors (planning).
    - `pools`: what its plan creates: f(spec, shape, namespace, name) -> the Plan's fields it
      sets (node_pools, spare_pools, ...); None: no pool of its own.
    - `observe`: how its slices are observed: f(ObserveInputs) -> (slice observations, its own
      observation, which decide() reads as `Observed.capacity`) (controller/observe.py).
    - `place`: its part of the pod template: f(template, plan), in place (render/jobset.py).
    - `exclusive_topology`: the node label JobSet places each slice's Job exclusively on
      (None: the node pool's, cloud.google.com/gke-nodepool).
    - `appliers`: its own actions, each to a reference `module:function` (controller side,
      loaded when first applied: the CLI never imports the controller).
    - `watches`: what the controller watches for it besides nodes and pods.
    - `status`: its part of the status, f(facts) -> a JSON object or None, in `status.capacity`.
    - `docs`: its docs section (markdown), generated into docs/api.md.
    - `own_slice_pools`: the plan's pools are the slices' own (maintenance and the job's pods'
      pools are read from them); else the nodes its pods run on are.
    - `waits_for_nodes`: a job of it waiting in Pending is woken by node events of its shape.
    - `compose`: a model composed of others (Fallback) plans the job itself: f(spec, namespace,
      name, status) -> the Plan of what it tries now, whose `mode` is the model serving it
      (its pools, observation and pod placement are that model's) and whose `composed` is
      this mode; None: planning/plan.py plans the spec as it is.
    - `wraps`: with `compose`, the model decide() asks for a plan served by another model:
      f(that model) -> the CapacityModel (capacity.model_of).
    """

    mode: str
    model: CapacityModel
    description: str
    accepts: Mapping[str, str] = field(default_factory=dict)
    rules: Sequence[Rule] = ()
    check: Callable[..., list[Any]] | None = None
    pools: Callable[..., Mapping[str, Any]] | None = None
    observe: Callable[..., Any] | None = None
    place: Callable[..., None] | None = None
    exclusive_topology: str | None = None
    appliers: Mapping[type, str] = field(default_factory=dict)
    watches: Sequence[Watch] = ()
    status: Callable[..., dict[str, Any] | None] | None = None
    docs: str = ""
    own_slice_pools: bool = False
    waits_for_nodes: bool = False
    compose: Callable[..., Any] | None = None
    wraps: Callable[[CapacityModel], CapacityModel] | None = None


class PluginError(RuntimeError):
    """A plugin that cannot be loaded or registered: its reference and why."""


class Registry:
    """The loaded plugins. Read through the accessors, which load them on first use."""

    def __init__(self) -> None:
        self._models: dict[str, CapacityPlugin] = {}
        self._strategies: dict[str, RestartStrategy] = {}
        self._loaded = False
        self._loading = False
        self.sources: list[str] = []  # every reference loaded, in order

    # ------------------------------------------------------------ registering

    def add_model(self, plugin: CapacityPlugin) -> None:
        if not MODE_RE.fullmatch(plugin.mode):
            raise PluginError(f"provisioning mode {plugin.mode!r} is not a CamelCase word")
        unknown = sorted(set(plugin.accepts) - FEATURES)
        if unknown:
            raise PluginError(f"mode {plugin.mode}: unknown features {unknown}, not {FEATURES}")
        if plugin.mode in self._models and self._models[plugin.mode] is not plugin:
            raise PluginError(f"provisioning mode {plugin.mode!r} is registered twice")
        self._models[plugin.mode] = plugin

    def add_strategy(self, strategy: RestartStrategy) -> None:
        known = self._strategies.get(strategy.name)
        if known is not None and known is not strategy:
            raise PluginError(f"restart strategy {strategy.name!r} is registered twice")
        self._strategies[strategy.name] = strategy

    # ------------------------------------------------------------ reading

    def models(self) -> Mapping[str, CapacityPlugin]:
        self.load()
        return self._models

    def model(self, mode: str) -> CapacityPlugin:
        found = self.models().get(mode)
        if found is None:
            raise KeyError(
                f"no capacity model for provisioning mode {mode!r}: {', '.join(self.modes())} "
                f"are registered (a plugin not loaded? {ENV}, or entry point group "
                f"{ENTRY_POINT_GROUP})"
            )
        return found

    def modes(self) -> list[str]:
        return list(self.models())

    def strategies(self) -> Mapping[str, RestartStrategy]:
        self.load()
        return self._strategies

    def names(self) -> list[str]:
        """The restart strategies' names (status.lastRestart.strategy)."""
        return list(self.strategies())

    # ------------------------------------------------------------ loading

    def load(self, refs: Iterable[str] | None = None) -> None:
        """Load the in-tree plugins, then the installed entry points and `MSJ_PLUGINS` (once);
        with `refs`, those references too (each once)."""
        if not self._loaded and not self._loading:
            self._loading = True
            try:
                for ref in BUILTIN:
                    self._call(ref, "in-tree")
                for ref in _entry_points():
                    self._call(ref, f"entry point group {ENTRY_POINT_GROUP}")
                for ref in from_env():
                    self._call(ref, ENV)
                self._loaded = True
            finally:
                self._loading = False
        for ref in refs or ():
            self._call(ref, "asked for")

    def _call(self, ref: str, origin: str) -> None:
        if ref in self.sources:
            return
        try:
            register = resolve(ref)
            self.sources.append(ref)
            register(self)
        except Exception as exc:
            raise PluginError(
                f"{exc} ({origin})"
                if isinstance(exc, PluginError)
                else f"plugin {ref} failed to register: {exc} ({origin})"
            ) from exc

    def snapshot(self) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """What is registered now (tests: `restore` puts it back)."""
        self.load()
        return dict(self._models), dict(self._strategies), list(self.sources)

    def restore(self, state: tuple[dict[str, Any], dict[str, Any], list[str]]) -> None:
        self._models, self._strategies, self.sources = dict(state[0]), dict(state[1]), state[2]


def resolve(ref: str) -> Callable[..., Any]:
    """`module:attribute` to the object (PluginError naming the reference when it is not)."""
    module, sep, attr = ref.strip().partition(":")
    if not sep or not module or not attr:
        raise PluginError(f"plugin reference {ref!r} is not module:function")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"plugin {ref} cannot be loaded: {exc}") from exc
    if not callable(found):
        raise PluginError(f"plugin {ref} is not callable")
    return found  # type: ignore[no-any-return]


def from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """The references `MSJ_PLUGINS` names (comma-separated `module:function`)."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    return [r.strip() for r in value.split(",") if r.strip()]


def _entry_points() -> list[str]:
    """Installed distributions' plugins (entry point group `multislice_operator.plugins`)."""
    return sorted(ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))


REGISTRY = Registry()
