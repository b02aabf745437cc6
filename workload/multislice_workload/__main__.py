"""``python -m multislice_workload {shardings,train,compile,...} [flags]``, or the
``multislice_workload`` command (the preflight Job's: spec.preflight)."""

from __future__ import annotations

import os
import sys

from multislice_workload.cli import main


def run() -> None:
    """The process: `python -m multislice_workload`, and the `multislice_workload` command."""
    code = main()
    if code != 0:
        # Skip interpreter shutdown: jax.distributed's atexit hook waits at a barrier for every
        # process, and after a one-sided failure the others never arrive; the pod must end now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
