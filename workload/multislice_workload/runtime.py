"""Joining the job: platform detection, `jax.distributed` start-up, preemption notices."""

from __future__ import annotations

import importlib.util
import os
import signal
from collections.abc import Mapping
from types import FrameType

from multislice_workload.env import ConfigError, WorkloadEnv

# Generous: on a restart every pod is recreated and image pulls can make some start late.
DEFAULT_INIT_TIMEOUT_S = 300


def on_tpu(environ: Mapping[str, str] | None = None) -> bool:
    """Decided before any backend starts, since jax.distributed must be initialized first.

    An explicit JAX_PLATFORMS wins (the local launcher sets ``cpu`` even when it replays a TPU
    job's environment); otherwise the TPU image is the one that ships libtpu.
    """
    environ = os.environ if environ is None else environ
    requested = environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if requested:
        return requested == "tpu"
    return importlib.util.find_spec("libtpu") is not None


def initialize(
    env: WorkloadEnv, *, tpu: bool, init_timeout_s: int = DEFAULT_INIT_TIMEOUT_S
) -> None:
    """Start jax.distributed when the job has more than one process, then check who we are."""
    import jax

    if not env.distributed:
        return
    if tpu:
        # JAX's GKE cluster detection reads TPU_WORKER_ID/HOSTNAMES and MEGASCALE_*; libtpu
        # reads MEGASCALE_* for the DCN transport. The bare call keeps both in agreement.
        jax.distributed.initialize(initialization_timeout=init_timeout_s)
    else:
        # Off TPU nothing is auto-detected (TPU_WORKER_HOSTNAMES would otherwise trigger the GKE
        # TPU detector); gloo carries cross-process collectives over TCP.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=env.jax_coordinator,
            num_processes=env.process_count,
            process_id=env.process_id,
            cluster_detection_method="deactivate",
            initialization_timeout=init_timeout_s,
        )
    check_identity(env, jax.process_index(), jax.process_count())


def check_identity(env: WorkloadEnv, process_index: int, process_count: int) -> None:
    """JAX's view of the job must match the contract's, or shards would land on wrong hosts."""
    if (process_index, process_count) != (env.process_id, env.process_count):
        raise ConfigError(
            f"JAX runs as process {process_index} of {process_count}, but the environment says "
            f"process {env.process_id} of {env.process_count} (slice {env.slice_id} x "
            f"{env.hosts_per_slice} hosts + worker {env.worker_id})"
        )


class Preemption:
    """Tells the training loop, at a step boundary, that the job must checkpoint and stop.

    With several processes, JAX's preemption sync manager already owns SIGTERM: the notice is
    propagated through the coordination service and every process agrees on the same step, which
    matters because saving a checkpoint is a collective. A lone process only needs a flag.
    """

    def __init__(self, distributed: bool) -> None:
        self._distributed = distributed
        self._notified = False
        if not distributed:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._notified = True

    def reached(self, step: int) -> bool:
        """Call at every step on every process (the sync protocol counts on it)."""
        if not self._distributed:
            return self._notified
        from jax.experimental import multihost_utils

        return bool(multihost_utils.reached_preemption_sync_point(step))
