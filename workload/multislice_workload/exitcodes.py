"""Process exit codes: the contract between the workload and the operator's failure policy.

The operator turns these into a JobSet ``podFailurePolicy`` (docs/environment.md section 1):
codes in its fatal list (default ``[78]``) fail the whole job at once; 75 restarts with cause
``hang``; everything else restarts all slices from the last checkpoint. Keep this module free of
imports so the operator, tests and the launcher can read it without pulling in JAX.
"""

from __future__ import annotations

# Training finished (or the benchmark ran) normally.
EXIT_OK = 0

# Unexpected crash (uncaught exception). Retryable: a restart from the checkpoint may succeed.
EXIT_CRASH = 1

# Failure injected on purpose for tests and demos (MULTISLICE_FAIL_AT_STEP). Retryable, and
# distinct from EXIT_CRASH so a timeline shows the failure was planned.
EXIT_INJECTED_FAILURE = 13

# The program asks for a restart (the xpk / MaxText convention, `sys.exit(42)`). Retryable.
EXIT_RESTART_REQUESTED = 42

# Hang watchdog: no training step completed within the bound (sysexits EX_TEMPFAIL). Retryable;
# the operator counts it as cause `hang`.
EXIT_HANG = 75

# Fatal configuration error: missing or inconsistent environment, bad flags, a layout that does
# not fit (sysexits EX_CONFIG). Restarting cannot fix it: the operator's default fatal list.
EXIT_CONFIG_ERROR = 78

# SIGTERM (preemption, maintenance, JobSet restart) handled: a checkpoint was saved first.
# 128 + 15, what a shell or the kubelet reports for a SIGTERM-killed process. Retryable.
EXIT_PREEMPTED = 143

NON_RETRYABLE_EXIT_CODES: frozenset[int] = frozenset({EXIT_CONFIG_ERROR})

# The termination message's `reason` for each code the program itself exits with.
REASONS: dict[int, str] = {
    EXIT_OK: "finished",
    EXIT_CRASH: "crash",
    EXIT_INJECTED_FAILURE: "injected",
    EXIT_RESTART_REQUESTED: "restart_requested",
    EXIT_HANG: "hang",
    EXIT_CONFIG_ERROR: "config_error",
    EXIT_PREEMPTED: "preempted",
}


def is_retryable(code: int) -> bool:
    """True when the failure policy should restart all slices after this exit code."""
    return code != EXIT_OK and code not in NON_RETRYABLE_EXIT_CODES
