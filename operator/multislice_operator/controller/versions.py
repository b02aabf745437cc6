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
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from multislice_operator.controller.kube import ApiError
from multislice_operator.controller.runtime import Runtime

log = logging.getLogger("multislice_operator")

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
KUEUE_MINIMUM, KUEUE_TESTED = "v0.15.0", "v0.19.2"
JOBSET_CRD, JOBSET_VERSION = "jobsets.jobset.x-k8s.io", "v1alpha2"
JOBSET_MINIMUM, JOBSET_TESTED = "v0.10.0", "v0.12.0"
JOBSET_FIELD = "onJobFailureMessagePatterns"
RECHECK_SECONDS = 60.0


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
    try:
        jobset = jobset_problem(await rt.kube.get_crd(JOBSET_CRD))
    except ApiError as exc:
        log.warning("jobset crd not read: %s", exc)
        jobset = rt.jobset_problem
    for what, old, new in (
        ("kueue", rt.kueue_problem, kueue),
        ("jobset", rt.jobset_problem, jobset),
    ):
        if new and new != old:
            log.error("unsupported %s: %s", what, new)
        elif old and not new:
            log.info("%s is supported now", what)
    rt.kueue_problem, rt.jobset_problem = kueue, jobset


async def check_loop(rt: Runtime) -> None:
    """Look again now and then: an upgrade (or a downgrade) needs no operator restart."""
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        try:
            await check(rt)
        except Exception as exc:  # never let a check end the loop; the next one tries again
            log.warning("versions not checked: %s", exc)
