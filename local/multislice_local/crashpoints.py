"""`multislice-operator run` with a crash point: the crash-consistency tests' fault injection.

Wraps the operator's adapters (never its production code) so that the process dies the way a
SIGKILL would, right after a chosen side effect and before the status write that records it:

* ``after-pool-create``: after the provisioner accepted node-pool creates.
* ``after-jobset-create``: after the apiserver created the JobSet.
* ``after-check-write``: after the apiserver took a write of the operator's AdmissionCheck state
  on a Workload (Kueue mode).
* ``after-dry-run``: after the apiserver judged a dry-run create (JobSet or Job), before the
  verdict is used.
* ``after-pool-delete``: after the provisioner accepted node-pool deletes.
* ``after-jobset-delete``: after the apiserver deleted a JobSet (a job failed while it ran).

Usage: ``MSJ_CRASH_POINT=after-pool-create python -m multislice_local.crashpoints run ...``.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

CRASH_POINT_ENV = "MSJ_CRASH_POINT"
CRASH_EXIT_CODE = 3

log = logging.getLogger("multislice_local.crashpoints")

AsyncMethod = Callable[..., Awaitable[Any]]


def _crash_after(point: str, method: AsyncMethod, happened: Callable[[Any], bool]) -> AsyncMethod:
    @functools.wraps(method)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = await method(*args, **kwargs)
        if happened(result):
            log.error("crash point %s reached: exiting", point)
            logging.shutdown()
            os._exit(CRASH_EXIT_CODE)
        return result

    return wrapper


# What the crash harness (benchmarks/chaos.py) arms; after-check-write needs Kueue.
POINTS = (
    "after-pool-create",
    "after-jobset-create",
    "after-dry-run",
    "after-pool-delete",
    "after-jobset-delete",
)


def install(point: str) -> None:
    """Wrap the adapter method that the crash point follows."""
    if point == "after-pool-create":
        from multislice_operator.provisioning.gke import GkeProvisioner

        GkeProvisioner.create = _crash_after(  # type: ignore[method-assign,assignment]
            point, GkeProvisioner.create, lambda _: True
        )
    elif point == "after-jobset-create":
        from multislice_operator.controller.kube import Kube

        Kube.create_jobset = _crash_after(  # type: ignore[method-assign,assignment]
            point, Kube.create_jobset, lambda created: created is not None
        )
    elif point == "after-check-write":
        from multislice_operator.controller.kube import Kube

        Kube.apply_workload_check = _crash_after(  # type: ignore[method-assign,assignment]
            point, Kube.apply_workload_check, lambda _: True
        )
    elif point == "after-dry-run":
        from multislice_operator.controller.kube import Kube

        Kube.dry_run_create = _crash_after(  # type: ignore[method-assign,assignment]
            point, Kube.dry_run_create, lambda _: True
        )
    elif point == "after-pool-delete":
        from multislice_operator.provisioning.gke import GkeProvisioner

        GkeProvisioner.delete = _crash_after(  # type: ignore[method-assign,assignment]
            point, GkeProvisioner.delete, lambda _: True
        )
    elif point == "after-jobset-delete":
        from multislice_operator.controller.kube import Kube

        Kube.delete_jobset = _crash_after(  # type: ignore[method-assign,assignment]
            point, Kube.delete_jobset, lambda _: True
        )
    else:
        raise SystemExit(f"unknown {CRASH_POINT_ENV} {point!r}")


def main(argv: list[str] | None = None) -> int:
    from multislice_operator.cli.main import main as operator_main

    point = os.environ.get(CRASH_POINT_ENV)
    if point:
        install(point)
    return operator_main(argv)


if __name__ == "__main__":
    sys.exit(main())
