"""What the unit tests of decide() share: a MultisliceJob body, its spec and plan, and an
observation in which the apiserver already accepted the JobSet."""

from __future__ import annotations

from typing import Any

from multislice_operator.planning.plan import Plan, load_job, plan_job
from multislice_operator.reconcile import Admission, Pod, Termination
from multislice_operator.reconcile import Observed as _Observed


def body(
    name: str = "job", namespace: str = "ns", *, metadata: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """A MultisliceJob of 2 v5litepod-16 slices (container "c", image "i"); `metadata` adds to
    the name and namespace, `spec` sets spec fields (replacing)."""
    return {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {"name": name, "namespace": namespace, **(metadata or {})},
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
            # Progress survives restarts (else the first pass warns NoCheckpoint, once).
            "checkpoint": {"directory": "gs://bucket/job"},
            **spec,
        },
    }


def spec_and_plan(obj: dict[str, Any] | None = None, **spec: Any) -> tuple[Any, Plan]:
    """The spec and plan of `obj`, or of ``body(**spec)``."""
    job = load_job(obj if obj is not None else body(**spec))
    return job.spec, plan_job(job)


def Observed(**kw: Any) -> _Observed:
    """An observation in which the apiserver already accepted the JobSet (the dry run before
    any pool, issue 14); the tests of admission itself pass `admission` explicitly."""
    kw.setdefault("admission", Admission())
    return _Observed(**kw)


def failed(
    name: str,
    slice_index: int | None,
    exit_code: int | None,
    reason: str = "Error",
    attempt: int = 0,
    *,
    step: int | None = None,
    checkpoint_step: int | None = None,
    termination_reason: str | None = None,
    checkpoint_request: tuple[str, int] | None = None,
    disruption: str | None = None,
) -> Pod:
    """A failed pod, with what its termination message said (when it said anything)."""
    said = (step, checkpoint_step, termination_reason, checkpoint_request)
    termination = Termination(*said) if any(v is not None for v in said) else None
    return Pod(
        name,
        slice_index,
        attempt,
        "Failed",
        exit_code=exit_code,
        reason=reason,
        termination=termination,
        disruption=disruption,
    )


def running(counts: dict[int, int], attempt: int = 0) -> list[Pod]:
    """Pods running and ready: `counts` per slice."""
    return [
        Pod(f"job-slice-{i}-{h}", i, attempt, "Running", ready=True)
        for i, n in sorted(counts.items())
        for h in range(n)
    ]


def succeeded(counts: dict[int, int], attempt: int = 0) -> list[Pod]:
    return [
        Pod(f"job-slice-{i}-{h}-done", i, attempt, "Succeeded")
        for i, n in sorted(counts.items())
        for h in range(n)
    ]
