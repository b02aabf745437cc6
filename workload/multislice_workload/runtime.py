"""Joining the job: platform detection, `jax.distributed` start-up, preemption notices."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from multislice_workload.env import ConfigError, WorkloadEnv

# Generous: on a restart every pod is recreated and image pulls can make some start late. The
# one bound on how far apart the processes may be at start-up: joining, the CPU backend's topology
# exchange and the barriers before the first collectives (`wait_for_peers`) all wait this long.
DEFAULT_INIT_TIMEOUT_S = 300
# The barriers every process passes right before a first collective (see `wait_for_peers`): once
# compiled and set up, before the checkpoint manager's first collective (Orbax's
# `sync_global_devices` and `broadcast_one_to_all` are programs over one device per process); and
# with the state built, before the first step (the training's groups: each slice's, each data
# group's, every device's). Later programs reuse those groups.
SETUP_BARRIER = "multislice_workload/set-up"
FIRST_STEP_BARRIER = "multislice_workload/first-step"


# A TPU chip on the PCI bus: Google's vendor id and a TPU device id, as JAX itself decides whether
# a TPU backend can start (jax/_src/hardware_utils.py, num_available_tpu_chips_and_device_id:
# v3 0x0027, v4 0x005e, v5p 0x0062, v5e 0x0063, v6e 0x006f, tpu7x 0x0076).
PCI_DEVICES = Path("/sys/bus/pci/devices")
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"})


def tpu_chips(pci: Path = PCI_DEVICES) -> int:
    """The TPU chips this machine has (0 on a CPU machine, whatever is installed)."""
    chips = 0
    for vendor in pci.glob("*/vendor"):
        try:
            if vendor.read_text().strip() != GOOGLE_PCI_VENDOR:
                continue
            device = (vendor.parent / "device").read_text().strip()
        except OSError:
            continue
        chips += device in TPU_PCI_DEVICES
    return chips


def on_tpu(environ: Mapping[str, str] | None = None, pci: Path = PCI_DEVICES) -> bool:
    """Decided before any backend starts, since jax.distributed must be initialized first.

    An explicit JAX_PLATFORMS wins (the local launcher sets ``cpu`` even when it replays a TPU
    job's environment); otherwise a TPU needs both its runtime (libtpu, which the workload's
    `tpu` extra also installs on CPU machines to compile for TPUs) and a TPU chip.
    """
    environ = os.environ if environ is None else environ
    requested = environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if requested:
        return requested == "tpu"
    return importlib.util.find_spec("libtpu") is not None and tpu_chips(pci) > 0


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
        set_cpu_topology_timeouts(init_timeout_s)
        jax.distributed.initialize(
            coordinator_address=env.jax_coordinator,
            num_processes=env.process_count,
            process_id=env.process_id,
            cluster_detection_method="deactivate",
            initialization_timeout=init_timeout_s,
        )
    check_identity(env, jax.process_index(), jax.process_count())


def set_cpu_topology_timeouts(init_timeout_s: int) -> None:
    """The CPU backend's start-up exchange of device topologies waits as long as joining did.

    JAX 0.10's defaults (jax/_src/xla_bridge.py: `jax_cpu_get_local_topology_timeout_minutes` 2,
    `..._global_...` 5, the global one "strictly greater" than the local one) are a library's
    guess; the workload's own bound is `init_timeout_s`.
    """
    import jax

    local = max(1, math.ceil(init_timeout_s / 60))
    jax.config.update("jax_cpu_get_local_topology_timeout_minutes", local)
    jax.config.update("jax_cpu_get_global_topology_timeout_minutes", local + 1)


def wait_for_peers(name: str, timeout_s: int) -> None:
    """Block until every process has called this with `name` (a no-op for one process).

    Why right before a first collective: on CPU, XLA connects each group of devices lazily, at
    the first collective over it (xla/backends/cpu/collectives: a gloo context per group, then
    `connectFullMesh`), and that rendezvous waits gloo's fixed 30 s (gloo/context.cc
    `kTimeoutDefault`; XLA's `make_gloo_tcp_collectives` takes no timeout and never sets one, JAX
    0.10.2), so processes that reach it more than 30 s apart (a busy machine) fail with "Gloo
    context initialization failed: DEADLINE_EXCEEDED". Meeting at the coordination service's
    barrier first, under the workload's own start-up bound, brings them to it together; nothing
    of one process's own work may sit between the barrier and the collective. The same barrier
    Orbax uses between processes.
    """
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None or distributed.global_state.num_processes <= 1:
        return
    client.wait_at_barrier(name, timeout_in_ms=timeout_s * 1000)


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
