"""A local Kueue MultiKueue setup: one manager cluster and two workers, all real processes.

* the **manager**: a :class:`LocalStack` on the ``manager`` profile (etcd, kube-apiserver,
  kube-controller-manager, Kueue with ``multiKueue.externalFrameworks`` naming MultisliceJob) and
  the operator with ``--kueue`` (its GKE simulator is never called: no job runs there);
* the **workers** ``a`` and ``b``: each a :class:`LocalStack` on the ``kueue`` profile with its
  own GKE simulator (its own capacity and faults: ``mc.workers["a"].sim.set_faults(...)``), its
  own operator, and a GKE cluster name and location of its own.

On the manager (``kueue-system``): per worker a Secret ``worker-<w>-kubeconfig`` holding a
kubeconfig with embedded credentials for that worker's API server (a client certificate of
``system:masters`` issued by the worker's CA), a ``MultiKueueCluster`` ``worker-<w>`` naming it, a
``MultiKueueConfig`` listing both, the ``AdmissionCheck`` ``multikueue`` (controller
``kueue.x-k8s.io/multikueue``), the ResourceFlavor and the ClusterQueue ``team-a`` listing that
check. On each worker: the ResourceFlavor, the operator's ``multislice-gang`` AdmissionCheck and a
ClusterQueue ``team-a`` listing it, with the worker's own quota. :meth:`MultiCluster.namespace`
makes a namespace and its LocalQueue on all three (the worker's copy of a Workload keeps the
manager's ``queueName``).

Shapes read in Kueue v0.19.2: ``apis/kueue/v1beta2/multikueue_types.go``,
``apis/config/v1beta2/configuration_types.go`` (``multiKueue``),
``pkg/controller/admissionchecks/multikueue/``.

CLI::

    python -m multislice_local.multicluster up     # Ctrl-C stops everything
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local import queues
from multislice_local.controlplane import KUEUE_NAMESPACE, ControlPlane
from multislice_local.gke_sim import Faults
from multislice_local.harness import wait_for
from multislice_local.stack import LocalStack, StackOptions
from multislice_operator.api import models
from multislice_operator.common import keys

QUEUE = "team-a"  # the ClusterQueue on every cluster, and the default LocalQueue name
FLAVOR = "tpu-v5e"
GKE_ACCELERATOR = "tpu-v5-lite-podslice"
MULTIKUEUE_CHECK = "multikueue"
MULTIKUEUE_CONFIG = "multislice"
MANAGER = "manager"
KUEUE_LOG = "kueue-controller"


@dataclass
class WorkerSpec:
    """One worker cluster: its ClusterQueue's quota, its GKE cluster, its simulator's faults."""

    quota: int = 64  # google.com/tpu chips of ClusterQueue team-a (v5litepod-16 x 2 is 32)
    location: str = "us-central2-b"
    faults: Faults = field(default_factory=Faults)
    operator_env: dict[str, str] = field(default_factory=dict)


def default_workers() -> dict[str, WorkerSpec]:
    return {"a": WorkerSpec(location="us-central2-b"), "b": WorkerSpec(location="us-east5-b")}


def cluster_name(worker: str) -> str:
    """The worker's MultiKueueCluster name, and its GKE cluster name."""
    return f"worker-{worker}"


def kubeconfig_secret(worker: str, kubeconfig: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{cluster_name(worker)}-kubeconfig", "namespace": KUEUE_NAMESPACE},
        "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()},
    }


def multikueue_cluster(worker: str) -> dict[str, Any]:
    return {
        "apiVersion": queues.API_VERSION,
        "kind": "MultiKueueCluster",
        "metadata": {"name": cluster_name(worker)},
        "spec": {
            "clusterSource": {
                "kubeConfig": {
                    "locationType": "Secret",
                    "location": f"{cluster_name(worker)}-kubeconfig",  # in Kueue's namespace
                }
            }
        },
    }


def multikueue_config(workers: Iterable[str], name: str = MULTIKUEUE_CONFIG) -> dict[str, Any]:
    return {
        "apiVersion": queues.API_VERSION,
        "kind": "MultiKueueConfig",
        "metadata": {"name": name},
        "spec": {"clusters": [cluster_name(w) for w in workers]},
    }


def multikueue_check(
    name: str = MULTIKUEUE_CHECK, config: str = MULTIKUEUE_CONFIG
) -> dict[str, Any]:
    return {
        "apiVersion": queues.API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": {"name": name},
        "spec": {
            "controllerName": keys.MULTIKUEUE_MANAGED_BY,  # kueue.x-k8s.io/multikueue
            "parameters": {"apiGroup": queues.GROUP, "kind": "MultiKueueConfig", "name": config},
        },
    }


class MultiCluster:
    """Start with :meth:`start` (or ``with``), stop with :meth:`stop`: every process ends.

    ``manager`` and ``workers`` (``"a"``, ``"b"``) are :class:`LocalStack` objects (``.api``,
    ``.sim``, ``.op``, ``.cp``). ``clusters()`` names all three."""

    def __init__(
        self,
        workers: dict[str, WorkerSpec] | None = None,
        manager_quota: int = 128,
        log_dir: Path | None = None,
        operator_env: dict[str, str] | None = None,
        op_latency_s: float = 1.0,
        manager_kueue_gates: dict[str, bool] | None = None,
    ) -> None:
        """`manager_kueue_gates`: Kueue feature gates on the manager, over the profile's
        (``{"WorkloadIdentifierAnnotations": False}``: MultiKueue marks a worker's copy with the
        prebuilt-workload-name label, as Kueue before v0.18 did, instead of the annotation)."""
        self.specs = workers if workers is not None else default_workers()
        self.manager_quota = manager_quota
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="msj-multicluster-"))
        self.operator_env = dict(operator_env or {})
        self.op_latency_s = op_latency_s
        # The manager's control plane is ours (its Kueue gates are set before it starts); the
        # stack borrows it, and stop() stops it after the stack.
        self.manager_cp = ControlPlane("manager")
        self.manager_cp.kueue_feature_gates = dict(manager_kueue_gates or {})
        self.manager = LocalStack(self._options(MANAGER, "manager", None), self.manager_cp)
        self.workers = {
            w: LocalStack(self._options(cluster_name(w), "kueue", spec))
            for w, spec in self.specs.items()
        }
        self.startup_seconds: dict[str, float] = {}
        self._kubeconfigs: dict[str, str] = {}  # the manager's, for each worker

    def _options(self, name: str, profile: str, spec: WorkerSpec | None) -> StackOptions:
        options = StackOptions(
            profile=profile,
            op_latency_s=self.op_latency_s,
            operator_log=self.log_dir / f"operator-{name}.log",
            operator_env={**self.operator_env, **(spec.operator_env if spec else {})},
            kueue=True,
            gke_cluster=name,
        )
        if spec is not None:
            options.faults = spec.faults
            options.gke_location = options.gke_node_location = spec.location
        return options

    # -- lifecycle ----------------------------------------------------------------------------

    def clusters(self) -> dict[str, LocalStack]:
        """``manager`` and each worker by its letter."""
        return {MANAGER: self.manager, **self.workers}

    def stack(self, cluster: str) -> LocalStack:
        return self.clusters()[cluster]

    def start(
        self, progress: Callable[[str], None] | None = None, timeout: float = 180
    ) -> MultiCluster:
        say = progress or (lambda _msg: None)
        if self.manager_cp.pids or any(s.cp is not None for s in self.workers.values()):
            # A second start would start a second operator per stack and lose the first.
            raise RuntimeError("MultiCluster already started (`with mc.start()` starts twice)")
        try:
            for name, stack in self.clusters().items():
                began = time.monotonic()
                if name == MANAGER:
                    say(f"[{name}] starting the local Kubernetes (manager profile)")
                    self.manager_cp.start()
                stack.start(progress=lambda msg, n=name: say(f"[{n}] {msg}"))
                self.startup_seconds[name] = time.monotonic() - began
            began = time.monotonic()
            say("creating the Kueue objects (MultiKueue on the manager, queues on the workers)")
            self._setup_objects()
            say("waiting for the MultiKueueClusters, AdmissionChecks and ClusterQueues")
            self.wait_ready(timeout)
            self.startup_seconds["objects"] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the three stacks side by side (one after another took 28 s here, side by side
        4 s); the manager's control plane after its stack (the stack only borrows it)."""

        def stop(stack: LocalStack) -> None:
            with contextlib.suppress(Exception):
                stack.stop()
            if stack is self.manager:
                self.manager_cp.stop()

        threads = [threading.Thread(target=stop, args=(s,)) for s in self.clusters().values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def __enter__(self) -> MultiCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- objects ------------------------------------------------------------------------------

    def _control_plane(self, cluster: str) -> ControlPlane:
        cp = self.stack(cluster).cp
        assert isinstance(cp, ControlPlane), f"{cluster}: not a local control plane"
        return cp

    def _setup_objects(self) -> None:
        for w, spec in self.specs.items():
            queues.apply(self.workers[w].api, [
                queues.resource_flavor(FLAVOR, GKE_ACCELERATOR),
                queues.admission_check(),
                queues.cluster_queue(QUEUE, spec.quota, FLAVOR),
            ])  # fmt: skip
        for w in self.specs:
            # Its own identity, in system:masters: RBAC for it is the chart's business.
            path = self._control_plane(w).user_kubeconfig("multikueue-manager", ("system:masters",))
            self._kubeconfigs[w] = path.read_text()
            self._put_secret(kubeconfig_secret(w, self._kubeconfigs[w]))
        queues.apply(self.manager.api, [
            *(multikueue_cluster(w) for w in self.specs),
            multikueue_config(self.specs),
            multikueue_check(),
            queues.resource_flavor(FLAVOR, GKE_ACCELERATOR),
            queues.cluster_queue(QUEUE, self.manager_quota, FLAVOR, check=MULTIKUEUE_CHECK),
        ])  # fmt: skip

    def _put_secret(self, secret: dict[str, Any]) -> None:
        core: Any = client.CoreV1Api(self.manager.api)  # plain dicts in
        try:
            core.create_namespaced_secret(KUEUE_NAMESPACE, secret)
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.replace_namespaced_secret(secret["metadata"]["name"], KUEUE_NAMESPACE, secret)

    def cut_off(self, worker: str) -> None:
        """A partition: the manager's kubeconfig for `worker` names a port nobody listens on, so
        MultiKueue loses it while the worker runs on, unseen (undo with :meth:`reconnect`)."""
        with socket.socket() as sock:  # a port just free: nothing listens there
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        config = yaml.safe_load(self._kubeconfigs[worker])
        for entry in config["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
        self._put_secret(kubeconfig_secret(worker, yaml.safe_dump(config)))

    def reconnect(self, worker: str) -> None:
        self._put_secret(kubeconfig_secret(worker, self._kubeconfigs[worker]))

    def set_quota(self, cluster: str, chips: int, cluster_queue: str = QUEUE) -> None:
        """Change a ClusterQueue's google.com/tpu quota on one cluster (``manager``, ``a``...)."""
        check = MULTIKUEUE_CHECK if cluster == MANAGER else queues.CHECK
        queues.apply(self.stack(cluster).api, [
            queues.cluster_queue(cluster_queue, chips, FLAVOR, check=check),
        ])  # fmt: skip

    def namespace(self, ns: str, queue: str = QUEUE, cluster_queue: str = QUEUE) -> str:
        """Namespace `ns` and LocalQueue `queue` (-> ClusterQueue `cluster_queue`) on every
        cluster; kept if they exist."""
        for stack in self.clusters().values():
            core = client.CoreV1Api(stack.api)
            try:
                core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
            except ApiException as exc:
                if exc.status != 409:
                    raise
            queues.apply(stack.api, [queues.local_queue(ns, queue, cluster_queue)])
        return ns

    def delete_namespace(self, ns: str) -> None:
        """Not waited for: each cluster's namespace controller finishes in the background."""
        for stack in self.clusters().values():
            with contextlib.suppress(ApiException):
                client.CoreV1Api(stack.api).delete_namespace(ns)

    # -- state --------------------------------------------------------------------------------

    def _get(self, cluster: str, plural: str, name: str) -> dict[str, Any] | None:
        custom: Any = client.CustomObjectsApi(self.stack(cluster).api)
        try:
            got: dict[str, Any] = custom.get_cluster_custom_object(
                queues.GROUP, queues.VERSION, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return got

    def multikueue_cluster(self, worker: str) -> dict[str, Any] | None:
        return self._get(MANAGER, "multikueueclusters", cluster_name(worker))

    def admission_check(self, cluster: str) -> dict[str, Any] | None:
        name = MULTIKUEUE_CHECK if cluster == MANAGER else queues.CHECK
        return self._get(cluster, "admissionchecks", name)

    def cluster_queue(self, cluster: str, name: str = QUEUE) -> dict[str, Any] | None:
        return self._get(cluster, "clusterqueues", name)

    def _waited(self) -> list[tuple[str, Callable[[], dict[str, Any] | None]]]:
        """(what, getter) of every object that must be Active=True."""
        out: list[tuple[str, Callable[[], dict[str, Any] | None]]] = []
        for w in self.specs:
            get = functools.partial(self.multikueue_cluster, w)
            out.append((f"manager MultiKueueCluster {cluster_name(w)}", get))
        for c in self.clusters():
            check = MULTIKUEUE_CHECK if c == MANAGER else queues.CHECK
            out.append((f"{c} AdmissionCheck {check}", functools.partial(self.admission_check, c)))
            out.append((f"{c} ClusterQueue {QUEUE}", functools.partial(self.cluster_queue, c)))
        return out

    def not_ready(self) -> list[str]:
        """What is not Active=True yet, with its condition."""
        late = []
        for what, get in self._waited():
            active = queues.condition(get(), "Active")
            if active.get("status") != "True":
                late.append(f"{what}: {active or 'no Active condition'}")
        return late

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            late = self.not_ready()
            if not late:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"MultiKueue setup not ready after {timeout:.0f}s:\n  "
                    + "\n  ".join(late)
                    + "\n"
                    + self.logs(kueue_lines=30, operator_lines=10)
                )
            time.sleep(0.5)

    # -- jobs (the tests' Env) ----------------------------------------------------------------

    def create(
        self,
        name: str,
        ns: str,
        queue: str = QUEUE,
        labels: dict[str, str] | None = None,
        run: str | None = "6s",
        **spec: Any,
    ) -> dict[str, Any]:
        """A MultisliceJob of 2 v5litepod-16 slices on the manager, with ``spec.managedBy:
        kueue.x-k8s.io/multikueue`` and the queue label; `spec` fields replace the body's
        (``managed_by=None`` leaves managedBy out)."""
        managed_by = spec.pop("managed_by", keys.MULTIKUEUE_MANAGED_BY)
        body = job_body(name, run=run, labels={keys.KUEUE_QUEUE_NAME: queue, **(labels or {})})
        if managed_by is not None:
            body["spec"]["managedBy"] = managed_by
        body["spec"].update(spec)
        custom: Any = client.CustomObjectsApi(self.manager.api)
        created: dict[str, Any] = custom.create_namespaced_custom_object(
            models.GROUP, models.VERSION, ns, models.PLURAL, body
        )
        return created

    def phase(
        self, cluster: str, name: str, ns: str, phase: str, timeout: float = 180
    ) -> dict[str, Any]:
        """Wait until the job's status on `cluster` says `phase` (a Failed one raises at once
        unless that is the phase waited for); its status. On timeout: :meth:`dump` of `ns`."""

        def check() -> dict[str, Any] | None:
            st = self.status(cluster, name, ns)
            if phase != "Failed" and st.get("phase") == "Failed":
                raise AssertionError(f"{cluster}: {ns}/{name} failed: {st}\n{self.dump(ns)}")
            return st if st.get("phase") == phase else None

        what = f"{cluster}: {ns}/{name} {phase}"
        return wait_for(check, timeout, what, interval=0.3, on_timeout=lambda: self.dump(ns))

    def job(self, cluster: str, name: str, ns: str) -> dict[str, Any] | None:
        custom: Any = client.CustomObjectsApi(self.stack(cluster).api)
        try:
            got: dict[str, Any] = custom.get_namespaced_custom_object(
                models.GROUP, models.VERSION, ns, models.PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return got

    def status(self, cluster: str, name: str, ns: str) -> dict[str, Any]:
        """The job's status on `cluster` ({} when the job or its status is not there)."""
        return dict((self.job(cluster, name, ns) or {}).get("status") or {})

    def workload(self, cluster: str, name: str, ns: str) -> dict[str, Any] | None:
        """The Workload of job `name` on `cluster`: the one the job owns, else (a worker's copy
        before its operator adopted it) the one named as the manager's."""
        found = queues.workloads(self.stack(cluster).api, ns).get(name)
        if found is not None or cluster == MANAGER:
            return found
        on_manager = queues.workloads(self.manager.api, ns).get(name)
        if on_manager is None:
            return None
        custom: Any = client.CustomObjectsApi(self.stack(cluster).api)
        try:
            got: dict[str, Any] = custom.get_namespaced_custom_object(
                queues.GROUP,
                queues.VERSION,
                ns,
                "workloads",
                on_manager["metadata"]["name"],
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return got

    def workloads(self, cluster: str, ns: str) -> list[dict[str, Any]]:
        """Every Workload in `ns` on `cluster` (owned or not)."""
        custom: Any = client.CustomObjectsApi(self.stack(cluster).api)
        items: list[dict[str, Any]] = custom.list_namespaced_custom_object(
            queues.GROUP, queues.VERSION, ns, "workloads"
        )["items"]
        return items

    # -- diagnostics --------------------------------------------------------------------------

    def kueue_log(self, cluster: str, lines: int = 40) -> str:
        cp = self.stack(cluster).cp
        return cp.log_tail(KUEUE_LOG, lines) if isinstance(cp, ControlPlane) else "(no log)"

    def operator_log(self, cluster: str, lines: int = 40) -> str:
        op = self.stack(cluster).op
        return op.log_tail(lines) if op is not None else "(no operator)"

    def logs(self, kueue_lines: int = 30, operator_lines: int = 30) -> str:
        out = []
        for c in self.clusters():
            out.append(f"--- {c}: Kueue log tail ---\n{self.kueue_log(c, kueue_lines)}")
            out.append(f"--- {c}: operator log tail ---\n{self.operator_log(c, operator_lines)}")
        return "\n".join(out)

    def dump(self, ns: str | None = None, lines: int = 30) -> str:
        """For a timeout: the setup's conditions; with `ns`, every Workload's and job's conditions
        there on each cluster; the tails of each Kueue's and operator's logs."""
        out = ["setup: " + ("ready" if not (late := self.not_ready()) else "; ".join(late))]
        if ns is not None:
            for c in self.clusters():
                try:
                    wls = {
                        w["metadata"]["name"]: _conditions(w)
                        | {"clusterName": (w.get("status") or {}).get("clusterName")}
                        for w in self.workloads(c, ns)
                    }
                    custom: Any = client.CustomObjectsApi(self.stack(c).api)
                    jobs = {
                        j["metadata"]["name"]: {
                            "phase": (j.get("status") or {}).get("phase"),
                            "message": (j.get("status") or {}).get("message"),
                            **_conditions(j),
                        }
                        for j in custom.list_namespaced_custom_object(
                            models.GROUP, models.VERSION, ns, models.PLURAL
                        )["items"]
                    }
                except ApiException as exc:
                    wls, jobs = {"error": exc.status}, {}
                out.append(f"{c} workloads: {wls}")
                out.append(f"{c} jobs: {jobs}")
                sim = self.stack(c).sim
                if c != MANAGER and sim is not None:
                    out.append(f"{c} pools: {list(sim.pools())}")
        out.append(self.logs(lines, lines))
        return "\n".join(out)

    # -- measurement --------------------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        """Every process of the setup: ``<cluster>/<component>`` -> pid (the simulators run in
        this process: ``self``)."""
        out = {"self": os.getpid()}
        for c, stack in self.clusters().items():
            if stack.cp is not None:
                out |= {f"{c}/{n}": pid for n, pid in stack.cp.pids.items()}
            if stack.op is not None and stack.op.proc is not None:
                out[f"{c}/operator"] = stack.op.proc.pid
        return out

    def rss(self) -> dict[str, int]:
        """Resident memory of each process of :meth:`pids`, in bytes."""
        out = {}
        for name, pid in self.pids().items():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1]) * 1024
        return out


def _conditions(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        c["type"]: (c["status"], c.get("reason"))
        for c in (obj.get("status") or {}).get("conditions") or []
    }


def job_body(
    name: str, run: str | None = "6s", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A MultisliceJob of 2 v5litepod-16 slices (the body tests/msj.py's ``job`` makes)."""
    from multislice_local.nodes import RUN_DURATION_ANNOTATION

    template: dict[str, Any] = {
        "spec": {"containers": [{"name": "train", "image": "example.invalid/t:1"}]}
    }
    if run is not None:
        template["metadata"] = {"annotations": {RUN_DURATION_ANNOTATION: run}}
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "failurePolicy": {"maxRestarts": 5},
            "template": template,
        },
    }


# --------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multislice_local.multicluster")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a manager and two workers; Ctrl-C stops them")
    up.add_argument("--quota-a", type=int, default=64, help="worker a's google.com/tpu quota")
    up.add_argument("--quota-b", type=int, default=64, help="worker b's google.com/tpu quota")
    up.add_argument("--manager-quota", type=int, default=128)
    up.add_argument("--namespace", action="append", default=[], help="also make this namespace")
    args = parser.parse_args(argv)
    workers = default_workers()
    workers["a"].quota, workers["b"].quota = args.quota_a, args.quota_b
    mc = MultiCluster(workers, manager_quota=args.manager_quota)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    began = time.monotonic()
    mc.start(progress=lambda msg: print(msg, flush=True))
    try:
        for ns in args.namespace:
            mc.namespace(ns)
        print(f"ready in {time.monotonic() - began:.1f}s {mc.startup_seconds}")
        for c, stack in mc.clusters().items():
            assert stack.cp is not None
            print(f"  {c}: export KUBECONFIG={stack.cp.kubeconfig}")
        print(f"  operator logs: {mc.log_dir}", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        mc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
