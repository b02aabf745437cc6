"""The product on real nodes, as users run it (docs/real-nodes.md, "The product on them").

On a :class:`~multislice_local.realnodes.RealCluster`: the operator image and the workload image
(built offline by :mod:`multislice_local.images`) are imported into the nodes' containerd under
the names the chart and the examples use, as a registry would serve them, and the chart is
installed by ``helm install`` with no values: the operator runs as the chart's Deployment, with
its ServiceAccount, RBAC, admission policies, probes, metrics over TLS, read-only root and uid
65532, and in-place restart on with the operator's own image as the agent's. A MultisliceJob of
2 slices x 2 hosts then runs the workload image in real pods (:func:`job_manifest`), its
checkpoints on a directory every node sees (the stand-in for ``gs://``), and its progress is
read from the workload's own log lines (:func:`progress`).

    stack = RealStack(cluster).install(operator_image, workload_image)
    api.create_namespaced_custom_object(..., body=job_manifest("llm", ns, stack.checkpoints))
    progress(core, ns, "llm").last_step
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from multislice_local.controlplane import REPO_ROOT, bin_dir
from multislice_local.images import BuiltImage
from multislice_local.realnodes import RealCluster
from multislice_operator.api import models
from multislice_operator.common import keys

log = logging.getLogger(__name__)

CHART = REPO_ROOT / "charts" / "multislice-operator"
RELEASE = "multislice-operator"
NAMESPACE = "msj-system"
# The example every README section starts from: its workload image's name.
EXAMPLE = REPO_ROOT / "examples" / "v5e-16x2-fsdp.yaml"
CONTAINER = "train"  # the TPU container's name in the job's template
# Where the nodes' shared directory is mounted in the workload's pods (the job's checkpoints).
CHECKPOINT_MOUNT = "/checkpoints"


def chart_image() -> str:
    """The operator image the chart runs with no values: image.repository, tag = appVersion."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"


def example_workload_image() -> str:
    """The workload image the examples name (what a user pushes to their registry)."""
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    return str(spec["template"]["spec"]["containers"][0]["image"])


def helm(kubeconfig: Path, *args: str, timeout: float = 300) -> str:
    """Run the stack's helm against the cluster; its output, or RuntimeError with its words."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HELM_CACHE_HOME": "/nonexistent-cache"}
    done = subprocess.run(
        [str(bin_dir() / "helm"), *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:2])}: {done.stderr.strip() or done.stdout}")
    return done.stdout


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 1.0) -> Any:
    """``check()``'s first truthy value within ``timeout`` seconds, else TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)


@dataclass
class RealStack:
    """The chart installed on real nodes, with the product's images."""

    cluster: RealCluster
    chart: Path = CHART
    release: str = RELEASE
    namespace: str = NAMESPACE
    values: dict[str, Any] = field(default_factory=dict)  # none: as a user installs it

    @property
    def api(self) -> client.ApiClient:
        made: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.cluster.kubeconfig)
        )
        return made

    @property
    def checkpoints(self) -> Path:
        """The directory every node sees: the job's checkpoints (the stand-in for gs://)."""
        path = self.cluster.shared_dir / "checkpoints"
        path.mkdir(exist_ok=True)
        path.chmod(0o1777)  # the workload runs as its image's uid 10001
        return path

    def install(
        self, operator: BuiltImage, workload: BuiltImage, timeout: float = 300
    ) -> RealStack:
        """Import the images under their published names, ``helm install`` the chart, and wait
        until the operator's pod is Ready (its caches synced and the Lease held)."""
        tpu = [n for n, node in self.cluster.nodes.items() if node.spec.tpu_chips]
        # The agent runs from the operator's image in every TPU pod; the operator on the rest.
        self.cluster.import_image(operator.archive, tags=[chart_image()])
        self.cluster.import_image(workload.archive, nodes=tpu, tags=[example_workload_image()])
        args = [
            "install",
            self.release,
            str(self.chart),
            "-n",
            self.namespace,
            "--create-namespace",
        ]
        for key, value in self.values.items():
            args += ["--set-json", f"{key}={json.dumps(value)}"]
        helm(self.cluster.kubeconfig, *args)
        try:
            wait_for(self._ready, timeout, f"the operator's pod Ready in {self.namespace}")
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{self.operator_report()}") from None
        return self

    def operator_report(self, tail: int = 40) -> str:
        """Why the operator's pod is not Ready: its phase, each container's state and last
        state, and its log's last lines (the previous run's when it restarted)."""
        pod = self.operator_pod()
        if pod is None:
            return "no operator pod"
        lines = [f"pod {pod.metadata.name}: {pod.status.phase} on {pod.spec.node_name}"]
        for cs in pod.status.container_statuses or []:
            lines.append(f"  {cs.name}: ready={cs.ready} restarts={cs.restart_count} "
                         f"state={cs.state.to_dict()} last={cs.last_state.to_dict()}")  # fmt: skip
        core = client.CoreV1Api(self.api)
        for previous in (True, False):
            try:
                log = core.read_namespaced_pod_log(
                    pod.metadata.name, self.namespace, tail_lines=tail, previous=previous
                )
            except client.ApiException:
                continue
            lines.append(f"  {'previous' if previous else 'current'} log:\n{log}")
        return "\n".join(lines)

    def uninstall(self, timeout: float = 120) -> None:
        helm(self.cluster.kubeconfig, "uninstall", self.release, "-n", self.namespace, "--wait")
        core = client.CoreV1Api(self.api)
        wait_for(
            lambda: not core.list_namespaced_pod(self.namespace).items,
            timeout,
            "the operator's pods gone",
        )

    def kubectl(self, *args: str, check: bool = True, timeout: float = 180) -> str:
        """The stack's kubectl as the cluster's administrator (drain, exec, token)."""
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        done = subprocess.run(
            [str(bin_dir() / "kubectl"), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout + (done.stderr if not check else "")

    def operator_pod(self) -> Any:
        pods: list[Any] = (
            client.CoreV1Api(self.api)
            .list_namespaced_pod(
                self.namespace, label_selector=f"app.kubernetes.io/instance={self.release}"
            )
            .items
        )
        running = [p for p in pods if p.metadata.deletion_timestamp is None]
        return running[0] if running else None

    def operator_log(self, tail: int | None = None) -> str:
        pod = self.operator_pod()
        if pod is None:
            return "(no operator pod)"
        return str(
            client.CoreV1Api(self.api).read_namespaced_pod_log(
                pod.metadata.name, self.namespace, tail_lines=tail
            )
        )

    def _ready(self) -> bool:
        pod = self.operator_pod()
        conditions = (pod.status.conditions or []) if pod is not None else []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)


def job_manifest(
    name: str,
    namespace: str,
    checkpoints: Path,
    *,
    steps: int = 60,
    checkpoint_every: int = 10,
    fail_process: int | None = None,
    fail_at_step: int | None = None,
    settle_at_step: int | None = None,
) -> dict[str, Any]:
    """A MultisliceJob of 2 slices of v5litepod-8 (2 hosts of 4 chips each) on the real nodes'
    existing pools, training the workload image's LM on its prepared corpus, on CPU: 4 host
    devices per process stand for the 4 chips. Its checkpoints go to ``checkpoints`` (a hostPath
    every node sees, mounted at /checkpoints). With ``fail_process``/``fail_at_step`` that one
    process exits 13 (retryable) after that step on the first attempt only."""
    env = [
        {"name": "JAX_PLATFORMS", "value": "cpu"},
        # One CPU device per chip of the host, and no optimisation passes: a 2-core machine.
        {
            "name": "XLA_FLAGS",
            "value": "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0",
        },
    ]
    hooks = {
        "MULTISLICE_FAULT_PROCESS": fail_process,
        "MULTISLICE_FAIL_AT_STEP": fail_at_step,
        "MULTISLICE_SETTLE_SAVE_AT_STEP": settle_at_step,
    }
    env += [{"name": k, "value": str(v)} for k, v in hooks.items() if v is not None]
    args = [
        "train",
        "--dataset", "/opt/multislice/corpus",
        "--steps", str(steps),
        "--checkpoint_every", str(checkpoint_every),
        "--log_every", "1",
        "--eval_every", "0",
    ]  # fmt: skip
    return {
        "apiVersion": models.API_VERSION,
        "kind": "MultisliceJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accelerator": "v5litepod-8",
            "slices": 2,
            "provisioning": {"mode": "Existing"},
            "parallelism": {"ici": {"fsdp": 8}, "dcn": {"data": 2}},
            "checkpoint": {"directory": f"{CHECKPOINT_MOUNT}/{namespace}-{name}"},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": CONTAINER,
                            "image": example_workload_image(),
                            "args": args,
                            "env": env,
                            "volumeMounts": [{"name": "ckpt", "mountPath": CHECKPOINT_MOUNT}],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "ckpt",
                            "hostPath": {"path": str(checkpoints), "type": "Directory"},
                        }
                    ],
                }
            },
        },
    }


@dataclass
class Progress:
    """What the workload's processes logged (their JSON lines), per process and restart attempt."""

    events: list[dict[str, Any]]

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    @property
    def last_step(self) -> int:
        """The job's last step (process 0 logs them; every process is on the same one)."""
        return max((int(e["step"]) for e in self.of("step")), default=0)


def pod_events(core: client.CoreV1Api, namespace: str, pod: str, previous: bool = False
               ) -> list[dict[str, Any]]:  # fmt: skip
    """The workload's JSON log lines of one pod's train container (``previous``: the run
    before, while the kubelet keeps it); none while it has not started."""
    from multislice_workload.logs import parse_line  # the workload's own reader

    try:
        text = core.read_namespaced_pod_log(pod, namespace, container=CONTAINER, previous=previous)
    except client.ApiException:
        return []
    return [e for e in map(parse_line, str(text).splitlines()) if e is not None]


def progress(core: client.CoreV1Api, namespace: str, job: str, previous: bool = False) -> Progress:
    """The workload's log lines from every pod of the job, this container run's (``previous``:
    the run before the last restart's too, where the kubelet kept it)."""
    pods: list[Any] = core.list_namespaced_pod(
        namespace, label_selector=f"{keys.JOB_NAME}={job}"
    ).items
    runs = (True, False) if previous else (False,)
    names = [pod.metadata.name for pod in pods]
    return Progress([e for n in names for r in runs for e in pod_events(core, namespace, n, r)])
