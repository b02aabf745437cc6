"""Can a pod template's node selection ever match the nodes of the job's own node pools?

In Managed mode the operator creates every node the job runs on, so it knows their labels: its
own (multislice.dev/*, in the CreateNodePoolRequest) and the ones GKE derives from the request
(pool name, TPU accelerator and topology, machine type, spot). A nodeSelector or required node
affinity that none of them can satisfy would hold the whole gang until
failurePolicy.unschedulableTimeoutSeconds; the plan refuses it before the first pool.

Three-valued: a label is known (a value), known absent, or unknown (GKE and Kubernetes set many
labels under their own domains: zone, hostname, OS, ...). Only a requirement that is false on
known labels is refused; an unknown label never is. Nothing but GKE, Kubernetes and the operator
labels these nodes, so a key outside their domains is known absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from multislice_operator.common import keys
from multislice_operator.common.errors import FieldError

# Domains whose labels GKE or the kubelet may set on a node we did not list: unknown, not absent.
PLATFORM_DOMAINS = ("kubernetes.io", "k8s.io", "cloud.google.com", "gke.io", "googleapis.com")
ABSENT, UNKNOWN = object(), object()
Value = object  # a str, ABSENT or UNKNOWN
AFFINITY = "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def _domain(key: str) -> str:
    return key.rpartition("/")[0]


def lookup(labels: Mapping[str, str], unknown: frozenset[str]) -> Callable[[str], Value]:
    """The value of a label on a node that carries `labels` (plus `unknown` keys whose value
    the plan cannot know, and whatever GKE adds under its domains)."""

    def value(key: str) -> Value:
        if key in labels:
            return labels[key]
        if key in unknown:
            return UNKNOWN
        domain = _domain(key)
        if domain == keys.PREFIX or key == keys.GKE_SPOT:  # ours; spot: only on spot pools
            return ABSENT
        platform = any(domain == d or domain.endswith("." + d) for d in PLATFORM_DOMAINS)
        return UNKNOWN if platform else ABSENT

    return value


def _expression(expr: Any, value: Callable[[str], Value]) -> bool | None:
    """A NodeSelectorRequirement on one node: True, False, or None (cannot tell)."""
    if not isinstance(expr, dict):
        return None
    v = value(str(expr.get("key", "")))
    raw = expr.get("values") or []
    if not isinstance(raw, list):  # a type error the schema check reports (`values: 5`)
        return None
    op, values = expr.get("operator"), [str(x) for x in raw]
    if v is UNKNOWN:
        return None
    present = v is not ABSENT
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op == "In":
        return present and v in values
    if op == "NotIn":
        return not present or v not in values
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            a, b = int(str(v)), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return None if present else False


def _term(term: Any, value: Callable[[str], Value]) -> bool | None:
    """A NodeSelectorTerm (its requirements ANDed); an empty term matches no node."""
    if not isinstance(term, dict):
        return None
    exprs = list(term.get("matchExpressions") or [])
    if term.get("matchFields"):
        return None  # metadata.name: the node's name, unknown before it exists
    if not exprs:
        return False
    results = [_expression(e, value) for e in exprs]
    if any(r is False for r in results):
        return False
    return True if all(r is True for r in results) else None


def _shown(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def never_matched(
    pod: Mapping[str, Any],
    pools: list[tuple[str, Mapping[str, str]]],
    unknown: frozenset[str],
    skip: frozenset[str] = frozenset(),
) -> list[FieldError]:
    """The template's nodeSelector entries and required node affinity that the nodes of some
    pool (name, labels) can never satisfy: each slice's pods must fit their own pool."""
    errors: list[FieldError] = []
    selector = pod.get("nodeSelector") or {}
    nodes = [(name, labels, lookup(labels, unknown)) for name, labels in pools]
    for key, want in sorted(selector.items()) if isinstance(selector, dict) else ():
        if key in skip:
            continue
        for name, labels, value in nodes:
            if value(key) is UNKNOWN or value(key) == str(want):
                continue
            errors.append(
                FieldError(
                    f"spec.template.spec.nodeSelector.{key}",
                    f"{key}={want} is never true on node pool {name}, which the operator creates "
                    f"for this job (Managed): its nodes carry {_shown(labels)} (plus GKE's own "
                    f"kubernetes.io and cloud.google.com labels); {_fix(key, len(pools))}",
                )
            )
            break
    required = (((pod.get("affinity") or {}).get("nodeAffinity") or {}) or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if isinstance(terms, list):
        for name, labels, value in nodes:
            if all(_term(t, value) is False for t in terms):
                errors.append(
                    FieldError(
                        AFFINITY,
                        f"no nodeSelectorTerm matches a node of node pool {name}, which the "
                        f"operator creates for this job (Managed): its nodes carry "
                        f"{_shown(labels)} (plus GKE's own kubernetes.io and cloud.google.com "
                        "labels); the pods would never schedule. Remove or correct the "
                        "affinity, or use provisioning.mode: Existing for node pools you label",
                    )
                )
                break
    return errors


def _fix(key: str, pools: int) -> str:
    if key == keys.GKE_NODEPOOL:
        each = "each slice runs on a node pool of its own, " if pools > 1 else ""
        return (
            f"{each}named by the operator (see `multislice-operator plan`): remove the selector, "
            "or use provisioning.mode: Existing to run on node pools you created"
        )
    return (
        "the pods would never schedule: remove it, or use provisioning.mode: Existing to run on "
        "node pools you labelled yourself"
    )
