"""spec.preflight locally: the compile pod, played.

The local cluster's nodes are kwok's fake TPU VMs, tainted for TPU pods only, and kwok runs
nothing: the operator's compile Job (a CPU pod, no toleration) would stay Pending forever. As the
demo's --run-workload runs the real workload beside kwok's pods, the demo runs the compile command
itself (`run_compile`, the same command and environment the Job's pod has) and writes its result
into the pod's status (`finish_compile_pod`): terminated with the command's exit code and its
termination message, as the kubelet would. The Job controller then completes or fails the Job as
on a real cluster, and the operator reads it as it reads a real one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from multislice_workload.termination import TERMINATION_LOG_ENV

# Kubernetes 1.27+: the Job controller's label on its pods (batch.kubernetes.io/job-name).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
MESSAGE_MAX = 4096  # the kubelet's bound on a termination message (4096 bytes)
LOG_TAIL_LINES = 80  # FallbackToLogsOnError's tail: the kubelet keeps 80 lines at most


def compile_pod(api: client.ApiClient, namespace: str, job: str) -> dict[str, Any] | None:
    """The pod of the compile Job `job`, as a dict (None: not created yet)."""
    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{JOB_NAME_LABEL}={job}"
    )
    for pod in pods.items:
        if pod.status is not None and pod.status.phase in ("Pending", "Running"):
            data: dict[str, Any] = api.sanitize_for_serialization(pod)  # type: ignore[no-untyped-call]
            return data
    return None


def finish_compile_pod(
    api: client.ApiClient, namespace: str, pod: dict[str, Any], exit_code: int, message: str
) -> None:
    """The pod terminated as the kubelet reports it: its container with this exit code and
    termination message, the pod Succeeded (0) or Failed."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    containers = pod["spec"]["containers"]
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": "Completed" if exit_code == 0 else "Error",
                    "message": message[-MESSAGE_MAX:],
                    "startedAt": now,
                    "finishedAt": now,
                }
            },
        }
        for c in containers
    ]
    body = {
        "status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": statuses,
        }
    }
    client.CoreV1Api(api).patch_namespaced_pod_status(pod["metadata"]["name"], namespace, body)


def pod_env(pod: dict[str, Any]) -> dict[str, str]:
    """The compile container's literal environment (downward-API values read empty, as JobSet's
    annotations do on a plain pod)."""
    (container,) = pod["spec"]["containers"][:1]
    return {e["name"]: str(e.get("value", "")) for e in container.get("env") or []}


def run_compile(pod: dict[str, Any], timeout: float = 600) -> tuple[int, str]:
    """Run the pod's compile command here, with its environment: (exit code, termination
    message). The message is what the kubelet would report: the last JSON line the command
    printed (the workload's compile writes it), else the tail of its output on failure."""
    container = pod["spec"]["containers"][0]
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    beside = Path(sys.executable).parent / argv[0]  # the venv's console script (make demo's)
    if not shutil.which(argv[0]) and beside.exists():
        argv[0] = str(beside)
    with tempfile.TemporaryDirectory(prefix="msj-preflight-") as tmp:
        # The container's /dev/termination-log: the workload writes its message there.
        log_file = Path(tmp) / "termination-log"
        env = {**os.environ, **pod_env(pod), TERMINATION_LOG_ENV: str(log_file)}
        try:
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError as exc:
            return 127, f"{argv[0]}: {exc.strerror}"
        except subprocess.TimeoutExpired:
            return 124, f"compile timed out after {timeout:.0f}s"
        said = log_file.read_text().strip() if log_file.exists() else ""
    # The kubelet's terminationMessagePolicy FallbackToLogsOnError: the file, else on a failure
    # the tail of the logs.
    if said or done.returncode == 0:
        return done.returncode, said
    tail = (done.stdout + done.stderr).strip().splitlines()[-LOG_TAIL_LINES:]
    return done.returncode, "\n".join(tail)
