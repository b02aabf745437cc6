"""Best-effort PATCH of this pod's annotations with the in-cluster service-account credentials.

Standard library only (the image needs no Kubernetes client): the API server address from
``KUBERNETES_SERVICE_HOST``/``_PORT``, the token and CA from the mounted service account, the pod
from ``MULTISLICE_POD_NAME``/``MULTISLICE_POD_NAMESPACE`` (downward API). Without credentials,
RBAC or a reachable API server the acknowledgement is skipped with one warning: the checkpoint
itself is what matters, and the termination message records it too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import ssl
import threading
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from multislice_workload import logs

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POD_NAME_ENV = "MULTISLICE_POD_NAME"
POD_NAMESPACE_ENV = "MULTISLICE_POD_NAMESPACE"
MERGE_PATCH = "application/merge-patch+json"
TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class PodTarget:
    api_server: str  # https://host:port
    token: str
    ca_file: str | None
    namespace: str
    pod: str


def in_cluster_target(
    environ: Mapping[str, str] | None = None, service_account: Path = SERVICE_ACCOUNT_DIR
) -> tuple[PodTarget | None, str]:
    """Where and as whom to patch, or None and why not."""
    environ = os.environ if environ is None else environ
    host = environ.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = environ.get("KUBERNETES_SERVICE_PORT", "").strip() or "443"
    pod = environ.get(POD_NAME_ENV, "").strip()
    namespace = environ.get(POD_NAMESPACE_ENV, "").strip()
    token_file = service_account / "token"
    if not host:
        return None, "not in a cluster (KUBERNETES_SERVICE_HOST is not set)"
    if not pod or not namespace:
        return None, f"{POD_NAME_ENV} / {POD_NAMESPACE_ENV} not set"
    try:
        token = token_file.read_text().strip()
    except OSError:
        return None, f"no service-account token at {token_file}"
    ca = service_account / "ca.crt"
    host = f"[{host}]" if ":" in host else host  # IPv6 literal
    return PodTarget(
        f"https://{host}:{port}", token, str(ca) if ca.exists() else None, namespace, pod
    ), ""


def annotation_patch(target: PodTarget, annotations: Mapping[str, str]) -> urllib.request.Request:
    """The merge-patch request setting `annotations` on the target pod."""
    body = json.dumps({"metadata": {"annotations": dict(annotations)}}).encode()
    url = f"{target.api_server}/api/v1/namespaces/{target.namespace}/pods/{target.pod}"
    return urllib.request.Request(
        url,
        data=body,
        method="PATCH",
        headers={
            "Authorization": f"Bearer {target.token}",
            "Content-Type": MERGE_PATCH,
            "Accept": "application/json",
        },
    )


def send(request: urllib.request.Request, ca_file: str | None, timeout: float = TIMEOUT_S) -> int:
    """HTTP status of the request (raises OSError / urllib errors on failure)."""
    context = None
    if request.full_url.startswith("https://"):
        context = ssl.create_default_context(cafile=ca_file)
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        return int(response.status)


class Annotator:
    """Patches this pod's annotations in the background; warns once when it cannot."""

    def __init__(self, target: PodTarget | None, why_not: str = "") -> None:
        self.target = target
        self.why_not = why_not
        self._warned = False
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Annotator:
        return cls(*in_cluster_target(environ))

    def annotate(self, annotations: Mapping[str, str]) -> threading.Thread | None:
        if self.target is None:
            self._warn(self.why_not)
            return None
        thread = threading.Thread(
            target=self._patch, args=(self.target, dict(annotations)), daemon=True
        )
        thread.start()
        self._threads.append(thread)
        return thread

    def _patch(self, target: PodTarget, annotations: dict[str, str]) -> None:
        try:
            status = send(annotation_patch(target, annotations), target.ca_file)
            logs.emit("pod_annotated", pod=target.pod, annotations=annotations, status=status)
        except Exception as err:  # best effort: RBAC, network, API server down
            self._warn(f"cannot patch pod {target.namespace}/{target.pod}: {err}")

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logs.emit("warning", message=f"checkpoint acknowledgement skipped: {why}")

    def join(self, timeout: float = TIMEOUT_S) -> None:
        for thread in self._threads:
            thread.join(timeout)
