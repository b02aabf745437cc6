"""The versions of the controllers the operator depends on, checked at start-up and while a
problem lasts: what is installed, what is needed, and why (operator log, runtime flags).

* Kueue (with --kueue): the operator speaks ``kueue.x-k8s.io/v1beta2``, served from Kueue
  v0.15.0 (Kueue's apis/kueue: v0.14 has v1beta1 only); v0.13/v0.14 would leave the admission
  check never Active and queued jobs waiting forever. Read by discovery (``GET /apis/GROUP``).
  ``Runtime.kueue_problem`` carries the refusal for decide() (a queued job's condition).
* JobSet: the failure policy the operator renders needs ``onJobFailureMessagePatterns`` in
  failurePolicy rules, which arrived in JobSet v0.10.0 (kubernetes-sigs/jobset#1033; absent from
  the v0.9.1 CRD). Read from the JobSet CRD's schema. An older CRD would drop the field silently;
  with fieldValidation=Strict (controller/kube.py) it refuses every job's JobSet at the dry run
  before any node pool, and ``Runtime.jobset_problem`` says why at start-up.
* The restart strategies' own checks (a strategy's ``probe``, run here for each registered
  strategy that has one, with the JobSet CRD read above; ``Runtime.support``, a fact for
  decide(), by strategy name): in-place restart's is plugins/inplace_shell.py.
* Kubernetes PodGroups (gang scheduling, Kubernetes 1.37: KEP-4671's Workload API, beta, behind
  the ``GenericWorkload`` gate, off by default, and ``scheduling.k8s.io/v1beta1`` in the
  apiserver's runtime-config): read by discovery of that group version's resources. Where they
  are served every JobSet's pods join one PodGroup of the job (render/podgroup.py): the first
  pod of every slice binds, claiming its pool, together or not at all; elsewhere nothing
  changes. Detected, never required.
* GKE's Slice API (dynamic slicing only): served where GKE's slice controller is enabled. Most
  clusters do not serve it; the operator says so once, in its own words, instead of kopf's
  warning about an unresolved resource (controller/discovery.py quiets that one), and kopf
  starts watching Slices when the CRD appears.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from multislice_operator.common import keys
from multislice_operator.controller.kube import ApiError
from multislice_operator.controller.runtime import Runtime
from multislice_operator.reconcile import StrategySupport
from multislice_operator.registry import REGISTRY, resolve

log = logging.getLogger("multislice_operator")

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
KUEUE_MINIMUM, KUEUE_TESTED = "v0.15.0", "v0.19.2"
JOBSET_CRD, JOBSET_VERSION = "jobsets.jobset.x-k8s.io", "v1alpha2"
JOBSET_MINIMUM, JOBSET_TESTED = "v0.10.0", "v0.12.0"
JOBSET_FIELD = "onJobFailureMessagePatterns"
RECHECK_SECONDS = 60.0


def pod_groups_said(served: bool) -> str:
    """The log line for Kubernetes PodGroups being served or not (start-up and on a change)."""
    api = f"{keys.POD_GROUP_GROUP}/{keys.POD_GROUP_VERSION} {keys.POD_GROUP_PLURAL}"
    if served:
        return f"gang scheduling: {api} served; a job's slices claim their pools all or none"
    return f"gang scheduling: {api} not served; a job's slices claim their pools one by one"


def slice_api_said(served: bool) -> str:
    """The log line for GKE's Slice API being served or not (said at start-up and on a change)."""
    api = f"the Slice API ({keys.SLICE_GROUP}/{keys.SLICE_VERSION} {keys.SLICE_PLURAL})"
    if served:
        return f"dynamic slicing: {api} is served; Slices are watched"
    return (
        f"dynamic slicing: {api} is not served on this cluster: DynamicSlicing jobs cannot form "
        "their slices until it is (enable GKE's slice controller); Slices are watched once it is"
    )


def kueue_problem(served: list[str] | None) -> str | None:
    """Why the installed Kueue cannot work with this operator; None when it can, or when no
    Kueue is installed (jobs then say that no Kueue Workload exists)."""
    if served is None or KUEUE_VERSION in served:
        return None
    installed = ", ".join(f"{KUEUE_GROUP}/{v}" for v in served) or "no version"
    return (
        f"the installed Kueue serves {installed} only (Kueue v0.14 or older), and this operator "
        f"needs {KUEUE_GROUP}/{KUEUE_VERSION} (Kueue {KUEUE_MINIMUM} or newer; tested with "
        f"{KUEUE_TESTED}): upgrade Kueue. Until then no queued job is admitted"
    )


def _rule_properties(crd: dict[str, Any], version: str) -> dict[str, Any] | None:
    for v in (crd.get("spec") or {}).get("versions") or []:
        if v.get("name") != version or not v.get("served"):
            continue
        node: Any = ((v.get("schema") or {}).get("openAPIV3Schema")) or {}
        for step in ("spec", "failurePolicy", "rules"):
            node = (node.get("properties") or {}).get(step) or {}
        props: dict[str, Any] = (node.get("items") or {}).get("properties") or {}
        return props
    return None


def jobset_problem(crd: dict[str, Any] | None) -> str | None:
    """Why the installed JobSet cannot run this operator's JobSets; None when it can, or when
    JobSet is not installed (the create then fails and is retried until it is)."""
    if crd is None:
        return None
    props = _rule_properties(crd, JOBSET_VERSION)
    need = f"JobSet {JOBSET_MINIMUM} or newer (tested with {JOBSET_TESTED})"
    if props is None:
        return f"the installed JobSet CRD {JOBSET_CRD} serves no {JOBSET_VERSION}: install {need}"
    if JOBSET_FIELD in props:
        return None
    return (
        f"the installed JobSet is older than {JOBSET_MINIMUM}: its CRD {JOBSET_CRD} has no "
        f"spec.failurePolicy.rules[].{JOBSET_FIELD}, which this operator's failure policy needs "
        "to tell a disruption and a fatal exit code from other failures; install "
        f"{need}. Until then every job is refused before any node pool"
    )


async def check(rt: Runtime) -> None:
    """Discover what is installed; log each problem once, and its end."""
    kueue = rt.kueue_problem
    if rt.settings.kueue:
        try:
            kueue = kueue_problem(await rt.kube.served_versions(KUEUE_GROUP))
        except ApiError as exc:
            log.warning("kueue versions not discovered: %s", exc)
    slice_api, pod_groups = await _optional_apis(rt)
    try:
        crd = await rt.kube.get_crd(JOBSET_CRD)
        jobset = jobset_problem(crd)
    except ApiError as exc:
        log.warning("jobset crd not read: %s", exc)
        jobset, crd = rt.jobset_problem, None
    support = await _probe_strategies(rt, crd) if crd is not None else dict(rt.support)
    _say_changes(rt, kueue, jobset, slice_api, pod_groups)
    _say_support(rt.support, support)
    rt.kueue_problem, rt.jobset_problem, rt.support = kueue, jobset, support
    rt.slice_api, rt.pod_groups = slice_api, pod_groups


async def _probe_strategies(rt: Runtime, crd: dict[str, Any]) -> dict[str, StrategySupport]:
    """Each registered strategy's probe (those that have one); what was known stays where a
    probe gets no answer (RBAC or the moment: the next check asks again)."""
    support = dict(rt.support)
    for strategy in REGISTRY.strategies().values():
        if strategy.probe is None:
            continue
        try:
            support[strategy.name] = await resolve(strategy.probe)(rt, crd)
        except ApiError as exc:
            log.warning("%s not checked: %s", strategy.said or strategy.name, exc)
    return support


def _say_support(old: Mapping[str, StrategySupport], new: Mapping[str, StrategySupport]) -> None:
    """Log each strategy's support once, when it is first found and when it changes."""
    strategies = REGISTRY.strategies()
    for name, found in new.items():
        if found != old.get(name):
            strategy = strategies.get(name)
            said = (strategy.said if strategy is not None else "") or name
            log.info("%s: %s (%s)", said, "used" if found.usable else "not used", found.why)


async def _optional_apis(rt: Runtime) -> tuple[bool | None, bool | None]:
    """Whether the Slice API and PodGroups are served (None, or what was known: no answer)."""
    slice_api, pod_groups = rt.slice_api, rt.pod_groups
    try:
        slice_api = keys.SLICE_VERSION in (await rt.kube.served_versions(keys.SLICE_GROUP) or [])
    except ApiError as exc:
        log.warning("slice api not discovered: %s", exc)
    try:
        served = await rt.kube.served_resources(keys.POD_GROUP_GROUP, keys.POD_GROUP_VERSION)
        pod_groups = keys.POD_GROUP_PLURAL in served
    except ApiError as exc:
        log.warning("pod groups not discovered: %s", exc)
    return slice_api, pod_groups


def _say_changes(
    rt: Runtime,
    kueue: str | None,
    jobset: str | None,
    slice_api: bool | None,
    pod_groups: bool | None,
) -> None:
    """Log what changed since the last check, once."""
    for what, old, new in (
        ("kueue", rt.kueue_problem, kueue),
        ("jobset", rt.jobset_problem, jobset),
    ):
        if new and new != old:
            log.error("unsupported %s: %s", what, new)
        elif old and not new:
            log.info("%s is supported now", what)
    if slice_api is not None and slice_api != rt.slice_api:
        log.info(slice_api_said(slice_api))
    if pod_groups is not None and pod_groups != rt.pod_groups:
        log.info(pod_groups_said(pod_groups))


async def check_loop(rt: Runtime) -> None:
    """Look again now and then: an upgrade (or a downgrade) needs no operator restart."""
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        try:
            await check(rt)
        except Exception as exc:  # never let a check end the loop; the next one tries again
            log.warning("versions not checked: %s", exc)
