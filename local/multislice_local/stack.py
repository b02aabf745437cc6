"""The local default: a simulated GKE multislice cluster on one machine.

A real control plane (`cluster` profile: apiserver, controller-manager, scheduler, kwok, JobSet),
the local GKE API simulator (node pools become kwok TPU nodes) and the operator as a real process
talking to both. Used by the end-to-end tests, the demo and the benchmarks.

The control plane is the stack's own (started and stopped with it), or one it is given: a
:class:`ControlPlane` a test session shares, or an :class:`ExistingCluster` named by a kubeconfig
(``multislice-local demo --kubeconfig``); a given one is never stopped by the stack.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multislice_local import slices
from multislice_local.controlplane import ControlPlane, bin_dir
from multislice_local.gke_sim import Faults, GkeSimulator, KubeNodeRegistrar, SimConfig
from multislice_local.harness import OperatorProcess, install_crds
from multislice_local.kind import KindControlPlane

PROJECT, LOCATION, CLUSTER, ZONE = (
    "local-project",
    "us-central2-b",
    "local-cluster",
    "us-central2-b",
)


class ExistingCluster:
    """A running cluster of the `cluster` (or `kueue`) profile's kind, named by its kubeconfig:
    the stack borrows it and never stops it (``stop`` does nothing)."""

    def __init__(self, kubeconfig: Path, profile: str = "cluster") -> None:
        self.kubeconfig = Path(kubeconfig)
        self.profile = profile
        self.workdir: Path | None = None  # nothing of it is on this machine's disk for us

    @property
    def pids(self) -> dict[str, int]:
        return {}

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        return None


@dataclass
class StackOptions:
    profile: str = "cluster"
    cluster: str = "local"  # local (built from Go modules) | kind (needs Docker)
    op_latency_s: float = 1.0
    resync_seconds: float = 1.0
    backoff_base_seconds: float = 2.0
    gc_interval_seconds: float = 5.0
    faults: Faults = field(default_factory=Faults)
    operator_env: dict[str, str] = field(default_factory=dict)
    # The operator's allocator: the image's (jemalloc, allocator.py) or the interpreter's defaults.
    operator_image_allocator: bool = True
    operator_log: Path | None = None
    start_operator: bool = True
    # The operator watches only these namespaces ([]: all): what keeps a stack on a shared
    # control plane off the other jobs there.
    namespaces: list[str] = field(default_factory=list)
    # The operator watches Kueue (--kueue); None: when the profile runs Kueue.
    kueue: bool | None = None
    kueue_workload_wait_seconds: float = 20.0
    # GKE dynamic slicing: the simulator serves the Slice CRD in the cluster and runs the slice
    # controller on it (docs/dynamic-slicing-contract.md), over these All Capacity mode
    # reservations of PROJECT ({reservation: {block: sub-blocks}}).
    slice_controller: bool = False
    reservations: dict[str, dict[str, int]] = field(default_factory=dict)
    slice_activation_s: float = 1.0
    # The GKE cluster the operator says it runs in (its --gke-* flags; the simulator serves any):
    # the stacks of a MultiKueue setup (multicluster.py) each name their own.
    gke_location: str = LOCATION
    gke_cluster: str = CLUSTER
    gke_node_location: str = ZONE


class LocalStack:
    """Start with `start()` (or `with`), stop with `stop()`: every process it started ends."""

    def __init__(
        self,
        options: StackOptions | None = None,
        control_plane: ControlPlane | ExistingCluster | None = None,
    ) -> None:
        self.options = options or StackOptions()
        self._own_cp = control_plane is None
        self.cp: ControlPlane | KindControlPlane | ExistingCluster | None = control_plane
        self.sim: GkeSimulator | None = None
        self.op: OperatorProcess | None = None
        self._api: Any = None

    @property
    def api(self) -> Any:
        if self._api is None:
            assert self.cp is not None
            self._api = self.cp.api_client()
        return self._api

    def start(self, progress: Any = None) -> LocalStack:
        say = progress or (lambda _msg: None)
        try:
            if self.cp is None and self.options.cluster == "kind":
                say("creating a kind cluster and installing JobSet (CLUSTER=kind)")
                self.cp = KindControlPlane().start()
            elif self.cp is None:
                say(f"starting the local Kubernetes ({self.options.profile} profile)")
                self.cp = ControlPlane(self.options.profile).start()
            jobset_crd = bin_dir() / "jobset.x-k8s.io_jobsets.yaml"
            install_crds(self.api, jobset_crd if self.options.profile == "api" else None)
            say("starting the local GKE API simulator")
            kubeconfig = str(self.cp.kubeconfig)
            store = None
            if self.options.slice_controller:
                slices.install_crd(kubeconfig)
                store = slices.KubeSliceStore(kubeconfig)
            self.sim = GkeSimulator(
                config=SimConfig(
                    op_latency_s=self.options.op_latency_s,
                    slice_activation_s=self.options.slice_activation_s,
                ),
                faults=self.options.faults,
                registrar=KubeNodeRegistrar(kubeconfig),
                slice_store=store,
            ).start()
            for name, blocks in self.options.reservations.items():
                self.sim.add_reservation(name, blocks, project=PROJECT)
            if self.options.start_operator:
                say("starting the operator")
                self.start_operator()
        except BaseException:
            self.stop()
            raise
        return self

    def operator_args(self) -> list[str]:
        assert self.sim is not None
        o = self.options
        return [
            "--gke-project",
            PROJECT,
            "--gke-location",
            o.gke_location,
            "--gke-cluster",
            o.gke_cluster,
            "--gke-node-location",
            o.gke_node_location,
            "--gke-simulator",
            self.sim.url,
            "--resync-seconds",
            str(o.resync_seconds),
            "--backoff-base-seconds",
            str(o.backoff_base_seconds),
            "--gc-interval-seconds",
            str(o.gc_interval_seconds),
            *(
                ["--kueue", "--kueue-workload-wait-seconds", str(o.kueue_workload_wait_seconds)]
                if (o.profile == "kueue" if o.kueue is None else o.kueue)
                else []
            ),
        ]

    def start_operator(self, extra_env: dict[str, str] | None = None) -> OperatorProcess:
        assert self.cp is not None
        env = {**self.options.operator_env, **(extra_env or {})}
        self.op = OperatorProcess(
            self.cp.kubeconfig,
            self.operator_args(),
            env=env,
            log_path=self.options.operator_log,
            namespaces=self.options.namespaces,
            image_allocator=self.options.operator_image_allocator,
        ).start()
        return self.op

    def stop_operator(self) -> None:
        if self.op is not None:
            self.op.stop()
            self.op = None

    def stop(self) -> None:
        self.stop_operator()
        if self.sim is not None:
            with contextlib.suppress(Exception):
                self.sim.stop()
            self.sim = None
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.close()
            self._api = None
        if self.cp is not None and self._own_cp:
            self.cp.stop()
            self.cp = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
