"""The demo's control plane on kind, for machines with Docker (`make demo CLUSTER=kind`).

Only the start differs from the `cluster` profile: kind runs Kubernetes, JobSet is installed from
its released manifests, and kwok runs here (from `make bins`) to fake the TPU nodes. The GKE
simulator, the operator and the demo are the same code. Not exercisable where there is no Docker
engine (this project's CI): there, start() fails at once naming what is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from multislice_local.controlplane import (
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    ControlPlaneError,
    ensure_binaries,
    kwok_stages_yaml,
)

CLUSTER_NAME = "msj-demo"
JOBSET_MANIFESTS = (
    "https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml"
)


def missing_tools() -> list[str]:
    return [tool for tool in ("docker", "kind") if shutil.which(tool) is None]


class KindControlPlane:
    """Same surface as ControlPlane where the stack and the demo use it."""

    profile = "kind"

    def __init__(self, name: str = CLUSTER_NAME) -> None:
        self.name = name
        self.workdir = Path()
        self.kubeconfig = Path()
        self._kwok: subprocess.Popen[bytes] | None = None
        self._created = False

    @property
    def pids(self) -> dict[str, int]:
        alive = self._kwok is not None and self._kwok.poll() is None
        return {"kwok": self._kwok.pid} if alive and self._kwok else {}

    def start(self) -> KindControlPlane:
        missing = missing_tools()
        if missing:
            raise ControlPlaneError(
                f"CLUSTER=kind needs {' and '.join(missing)} on PATH (and a running Docker "
                "engine); use the default local cluster (make demo) where Docker is absent"
            )
        bins = ensure_binaries()
        self.workdir = Path(tempfile.mkdtemp(prefix="msj-kind-"))
        self.kubeconfig = self.workdir / "kubeconfig"
        try:
            self._run(
                "kind",
                "create",
                "cluster",
                "--name",
                self.name,
                "--kubeconfig",
                str(self.kubeconfig),
                "--wait",
                "180s",
            )
            self._created = True
            kubectl = str(bins / "kubectl")
            self._run(kubectl, "apply", "--server-side", "-f", JOBSET_MANIFESTS)
            self._run(
                kubectl,
                "-n",
                "jobset-system",
                "rollout",
                "status",
                "deployment/jobset-controller-manager",
                "--timeout=180s",
            )
            stages = self.workdir / "kwok-stages.yaml"
            stages.write_bytes(kwok_stages_yaml())
            log = (self.workdir / "kwok.log").open("wb")
            self._kwok = subprocess.Popen(
                [
                    str(bins / "kwok"),
                    f"--kubeconfig={self.kubeconfig}",
                    f"--config={stages}",
                    "--manage-all-nodes=false",
                    f"--manage-nodes-with-annotation-selector="
                    f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _run(self, *argv: str) -> None:
        env = {"KUBECONFIG": str(self.kubeconfig), "PATH": _path()}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise ControlPlaneError(f"{' '.join(argv[:3])} failed:\n{proc.stderr[-2000:]}")

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        if self._kwok is not None and self._kwok.poll() is None:
            self._kwok.terminate()
            self._kwok.wait(10)
        self._kwok = None
        if self._created:
            subprocess.run(
                ["kind", "delete", "cluster", "--name", self.name], capture_output=True, timeout=300
            )
            self._created = False
        if self.workdir != Path():
            shutil.rmtree(self.workdir, ignore_errors=True)


def _path() -> str:
    import os

    return os.environ.get("PATH", "")
