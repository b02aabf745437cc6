"""Process exit codes: the contract between the workload and the operator's failure policy.

The operator turns these into a JobSet ``podFailurePolicy``: codes listed in
``nonRetryableExitCodes`` (default ``[42]``) fail the whole job at once, everything else restarts
all slices from the last checkpoint. Keep this module free of imports so the operator, tests and
the launcher can read it without pulling in JAX.
"""

from __future__ import annotations

# Training finished (or the benchmark ran) normally.
EXIT_OK = 0

# Unexpected crash (uncaught exception). Retryable: a restart from the checkpoint may succeed.
EXIT_CRASH = 1

# Failure injected on purpose for tests and demos (MULTISLICE_FAIL_AT_STEP). Retryable, and
# distinct from EXIT_CRASH so a timeline shows the failure was planned.
EXIT_INJECTED_FAILURE = 13

# Fatal configuration error: missing or inconsistent environment, bad flags. Restarting cannot
# fix it, so the operator's default nonRetryableExitCodes is [42].
EXIT_CONFIG_ERROR = 42

# SIGTERM (preemption, maintenance, JobSet restart) handled: a checkpoint was saved first.
# 128 + 15, what a shell or the kubelet reports for a SIGTERM-killed process. Retryable.
EXIT_PREEMPTED = 143

NON_RETRYABLE_EXIT_CODES: frozenset[int] = frozenset({EXIT_CONFIG_ERROR})


def is_retryable(code: int) -> bool:
    """True when the failure policy should restart all slices after this exit code."""
    return code != EXIT_OK and code not in NON_RETRYABLE_EXIT_CODES
