"""The apiserver's own verdict on a job's JobSet, before any node pool exists (issue 14).

A server-side dry run (``?dryRun=All``) of the JobSet the job renders runs the apiserver's schema
validation and every admission webhook, JobSet's included (the subdomain must be a DNS-1035 label,
pod names must fit, ...); a dry run of the first Job the JobSet controller would make of it runs
the Job's and pod template's validation (label keys and values, annotation size, container names,
quantities, ports). Exact by construction: the same code that would refuse them later refuses them
now, while nothing is provisioned. What it says becomes an observation (:class:`Admission`);
decide() fails the job with the apiserver's message.
"""

from __future__ import annotations

import logging
from typing import Any

from multislice_operator.controller import versions
from multislice_operator.controller.kube import ApiError, Conflict
from multislice_operator.reconcile import Admission
from multislice_operator.render.jobset import render_probe_job

log = logging.getLogger("multislice_operator")

# Statuses that are a verdict on the object itself: retrying the same object cannot help.
REFUSED_STATUSES = (400, 422)


def explain(message: str) -> str:
    """The apiserver's refusal, with what it means where the operator knows better: a strict
    decoding error (fieldValidation=Strict, controller/kube.py) on a field of the failure policy
    the operator renders means an older JobSet than the operator needs."""
    if "strict decoding error" in message and versions.JOBSET_FIELD in message:
        return (
            f"{message}: the installed JobSet is older than {versions.JOBSET_MINIMUM} "
            f"(its CRD has no {versions.JOBSET_FIELD}); install JobSet {versions.JOBSET_MINIMUM} "
            f"or newer (tested with {versions.JOBSET_TESTED})"
        )
    return message


def refusal(exc: ApiError) -> str | None:
    """The apiserver's message when `exc` refuses the object; None when it is about the operator
    or the moment (RBAC, a missing CRD, 409, 429, 5xx): those are retried, never a verdict."""
    message = exc.message or str(exc)
    if exc.status in REFUSED_STATUSES:
        return explain(message)
    if exc.status == 403 and "admission webhook" in message:  # a webhook's denial, not RBAC
        return message
    return None


async def judge(kube: Any, jobset: dict[str, Any]) -> Admission:
    """Dry-run the JobSet, then its first Job. Raises what is no verdict (the pass is retried)."""
    for body in (jobset, render_probe_job(jobset)):
        try:
            await kube.dry_run_create(body)
        except Conflict:
            continue  # one of that name exists: the create itself will tell whose it is
        except ApiError as exc:
            refused = refusal(exc)
            if refused is None:
                raise
            meta = body["metadata"]
            log.warning(
                "dry run refused %s %s/%s: %s",
                body["kind"],
                meta["namespace"],
                meta["name"],
                refused,
            )
            return Admission(refused=refused)
    return Admission()
