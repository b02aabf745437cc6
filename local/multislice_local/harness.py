"""Run the operator as a real process against a local control plane (tests, demo, benchmarks)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local import allocator
from multislice_local.crashpoints import CRASH_POINT_ENV
from multislice_operator.api.crd import generate_crd

T = TypeVar("T")


# Ports handed out by this process: never twice, though nothing may listen on one yet.
_GIVEN: set[int] = set()
_SPAN = 12000  # how far below the ephemeral range ports are drawn


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback port nothing listens on, for a server started next. Drawn below the kernel's
    ephemeral range: a port 0 bind gets one from that range, where any outgoing connection of
    the machine could take it before the server binds it (a suite run saw an operator's metrics
    port so taken: "address already in use")."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randrange(max(1024, low - _SPAN), low)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:  # the range is full: the kernel's choice
        s.bind(("127.0.0.1", 0))
        given: int = s.getsockname()[1]
        return given


def wait_for(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll `check` until it returns something truthy; raise with `what` (and details) if not."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    extra = f"\n{on_timeout()}" if on_timeout else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last}){extra}")


def install_kueue_crds(api: client.ApiClient, crds_file: Path) -> None:
    """Kueue's CRDs (its built kueue-crds.yaml) without its controller or webhooks, for a test
    that plays Kueue's writes itself; kept if they exist (an api profile shares them)."""
    ext: Any = client.ApiextensionsV1Api(api)
    names = []
    for crd in yaml.safe_load_all(crds_file.read_text()):
        if not crd:
            continue
        names.append(crd["metadata"]["name"])
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def established(name: str) -> bool:
        conds = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    for name in names:
        wait_for(partial(established, name), 30, f"CRD {name}")


def install_crds(api: client.ApiClient, jobset_crd: Path | None = None) -> None:
    """Apply the MultisliceJob CRD (and the JobSet CRD, for the api profile) and wait for them."""
    ext: Any = client.ApiextensionsV1Api(api)  # plain dicts in, typed models out
    crds = [generate_crd()]
    if jobset_crd is not None:
        crds.append(yaml.safe_load(jobset_crd.read_text()))
    for crd in crds:
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = ext.read_custom_resource_definition(crd["metadata"]["name"])
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)
    for crd in crds:
        name = crd["metadata"]["name"]

        def established(name: str = name) -> bool:
            got = ext.read_custom_resource_definition(name)
            conds = got.status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conds)

        wait_for(established, 30, f"CRD {name} established")
        # Established is not served: until the new storage is ready a list or watch gets 429
        # "storage is (re)initializing" (and kopf logs an ERROR for its first retry).
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))

        def served(g: str = group, v: str = version, p: str = plural) -> bool:
            try:
                client.CustomObjectsApi(api).list_cluster_custom_object(g, v, p, limit=1)
            except ApiException as exc:
                if exc.status in (404, 429, 503):
                    return False
                raise
            return True

        wait_for(served, 30, f"CRD {name} served")


class OperatorProcess:
    """`multislice-operator run` in a subprocess, its log in a file, always stopped."""

    def __init__(
        self,
        kubeconfig: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        namespaces: list[str] | None = None,
        image_allocator: bool = True,
    ) -> None:
        self.kubeconfig = kubeconfig
        # As the image runs it: jemalloc, every Python object in it (allocator.py); False: the
        # interpreter's defaults, as a pip-installed operator runs.
        self.image_allocator = image_allocator
        # Watching only some namespaces keeps concurrent operators on one apiserver apart.
        self.namespaces = list(namespaces or [])
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="msj-operator-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def metrics_url(self) -> str:
        secure = "--metrics-auth" in self.extra_args and "none" not in self.extra_args
        return f"{'https' if secure else 'http'}://127.0.0.1:{self.metrics_port}/metrics"

    def start(self, wait: bool = True) -> OperatorProcess:
        # A crash point (tests) runs the same operator with its adapters wrapped.
        entry = (
            "multislice_local.crashpoints"
            if CRASH_POINT_ENV in self.env
            else ("multislice_operator.cli.main")
        )
        argv = [
            sys.executable,
            "-m",
            entry,
            "run",
            *([a for ns in self.namespaces for a in ("-n", ns)] or ["--all-namespaces"]),
            "--metrics-port",
            str(self.metrics_port),
            # Plain HTTP on loopback: the tests scrape without a token (the chart's HTTPS with
            # TokenReview is tested in tests/integration/test_chart.py).
            *(() if "--metrics-auth" in self.extra_args else ("--metrics-auth", "none")),
            "--health-port",
            str(self.liveness_port),
            "--health-bind-address",
            "127.0.0.1",
            *self.extra_args,
        ]
        env = self.environment()
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        if wait:
            try:
                self.wait_live()
            except BaseException:  # not left running past its control plane
                self.stop()
                raise
        return self

    def environment(self) -> dict[str, str]:
        """The process's environment: this one's, the image's allocator, the kubeconfig, then
        the caller's `env` (which wins)."""
        image = allocator.operator_env() if self.image_allocator else {}
        return {**os.environ, **image, "KUBECONFIG": str(self.kubeconfig), **self.env}

    def wait_live(self, timeout: float = 60) -> None:
        """Until its liveness endpoint answers (raises at once if the process exited)."""
        wait_for(self._live, timeout, "operator liveness endpoint", on_timeout=self.log_tail)

    def _live(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1
            ) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def kill(self) -> None:
        """SIGKILL, as a node failure or an OOM kill would: no cleanup, no last word."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
