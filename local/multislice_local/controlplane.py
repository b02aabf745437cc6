"""A real local Kubernetes control plane run as child processes, for tests and local runs.

Four profiles, each a list of components (see PROFILES at the end of the components section:
a component is one process with what it needs prepared, its command line, its readiness checks and
what to undo before it stops):

* ``api``: etcd + kube-apiserver (TLS, client-certificate auth, RBAC), as envtest runs them.
* ``cluster``: ``api`` plus kube-controller-manager, kube-scheduler, the kwok controller (fake
  nodes and pod phases, see :mod:`multislice_local.nodes`) and the JobSet controller with
  its webhooks served on 127.0.0.1.
* ``kueue``: ``cluster`` plus the Kueue controller (v0.19; the operator makes its jobs' Workloads,
  Kueue's JobSet integration is on but has nothing to do): its CRDs
  with their conversion webhook on 127.0.0.1, its own and its JobSet webhooks (installed only
  while it runs), no visibility API server (no position-in-queue API locally).
* ``manager``: a MultiKueue manager cluster (:mod:`multislice_local.multicluster`): ``api`` plus
  kube-controller-manager (garbage collection, namespaces) and Kueue with its ``multiKueue``
  configuration (MultisliceJob as an external framework); no scheduler, kwok or JobSet
  controller: no job runs there. The JobSet CRD is installed (CRD only), so Kueue's JobSet
  integration starts as in the ``kueue`` profile.

Binaries come from ``hack/build-bins.sh`` (built from pinned Go modules into a versioned cache).

The newest Kubernetes lane: ``ControlPlane(profile, kube_next=True)`` runs kube-apiserver and
kube-scheduler of the next minor (1.37, ``hack/build-bins.sh --next``) with the Workload API on
(``NEXT_APISERVER_FLAGS``, ``NEXT_SCHEDULER_FLAGS``), beside the main lane's other components.

CLI::

    python -m multislice_local.controlplane up --profile cluster [--detach] [--kube-next]
    python -m multislice_local.controlplane down --profile cluster

(A whole MultiKueue setup, a manager and two workers: ``python -m multislice_local.multicluster
up``.)
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import ctypes
import datetime as dt
import functools
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.controller.serving import subject_alt_names

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-bins.sh"
# The compatibility lane (hack/README.md, tests/README.md): MULTISLICE_CONTROLLERS=compat runs the
# oldest JobSet and Kueue controllers the operator supports, with their own CRDs and webhook
# manifests (built into <cache>/compat/ and as *-compat binaries), on the same Kubernetes.
CONTROLLERS_ENV = "MULTISLICE_CONTROLLERS"
COMPAT = os.environ.get(CONTROLLERS_ENV, "current") == "compat"


def _controller(name: str) -> str:
    """The file name in the binary cache of a JobSet/Kueue binary or manifest for this lane."""
    if not COMPAT:
        return name
    return f"{name}-compat" if name.endswith("-controller") else f"compat/{name}"


BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwokctl",
    _controller("jobset-controller"),
    "helm",
    _controller("kueue-controller"),
)
JOBSET_CRD_FILE = _controller("jobset.x-k8s.io_jobsets.yaml")
JOBSET_WEBHOOKS_FILE = _controller("jobset-webhook-manifests.yaml")
JOBSET_CRD_NAME = "jobsets.jobset.x-k8s.io"
# kwok manages only nodes carrying this annotation (see nodes.py).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
KWOK_NODE_LEASE_SECONDS = 40  # kubelet's default node lease duration
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
POD_CIDR = "10.64.0.1/16"

# The newest Kubernetes lane (hack/README.md, "The newest Kubernetes lane"): these two binaries
# come from the next minor's cache dir (hack/build-bins.sh --next: Kubernetes 1.37), every other
# one from the main lane's (etcd, a kube-controller-manager one minor older: a supported skew).
# The Workload API (scheduling.k8s.io/v1beta1 Workload and PodGroup, pods' spec.schedulingGroup)
# is beta in 1.37 but its gate is off by default, and a beta group version is not served unless
# asked for. With the gate the scheduler's default plugins include GangScheduling (we give it no
# configuration, so nothing leaves it out).
NEXT_BINARIES = ("kube-apiserver", "kube-scheduler")
NEXT_FEATURE_GATES = "--feature-gates=GenericWorkload=true"
NEXT_APISERVER_FLAGS = (NEXT_FEATURE_GATES, "--runtime-config=scheduling.k8s.io/v1beta1=true")
NEXT_SCHEDULER_FLAGS = (NEXT_FEATURE_GATES,)
# 1.37's apiserver refuses to start with the default (lease) endpoint reconciler on a loopback
# advertise address ("may not be in the loopback range"); 1.36 starts, and its writes of the
# `kubernetes` Service's endpoints fail that same validation, so with none nothing is lost.
NEXT_LOOPBACK_APISERVER_FLAGS = ("--endpoint-reconciler-type=none",)


@dataclass(frozen=True)
class NodeNetwork:
    """Where a control plane for real nodes (:mod:`multislice_local.realnodes`) serves: the API
    server listens on the first address of ``service_cidr``, port 443, which is also the
    ``kubernetes`` Service's ClusterIP. With no kube-proxy on the nodes, that is how in-cluster
    clients (``KUBERNETES_SERVICE_HOST``) reach it: the address is on the host end of the nodes'
    bridge (realnodes.py puts it there before the control plane starts)."""

    service_cidr: str

    @property
    def apiserver_ip(self) -> str:
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))


# Strong references: a started control plane dropped without stop() is still stopped at exit.
_LIVE: set[ControlPlane] = set()


class ControlPlaneError(RuntimeError):
    """A component failed to start or become ready; the message carries its log tail."""


# --------------------------------------------------------------------------------------------
# Binaries


def _cache_dir(env: str, flag: str) -> Path:
    """A binary cache dir: ``env`` when set, else what ``hack/build-bins.sh <flag>`` prints."""
    override = os.environ.get(env)
    if override:
        return Path(override)
    if not BUILD_SCRIPT.exists():
        raise ControlPlaneError(f"{BUILD_SCRIPT} not found (not a source checkout); set {env}")
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), flag], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def bin_dir() -> Path:
    """Directory holding the binaries for the pinned versions (MULTISLICE_BIN_DIR overrides)."""
    return _cache_dir("MULTISLICE_BIN_DIR", "--print-dir")


def next_bin_dir() -> Path:
    """Directory holding the newest Kubernetes lane's kube-apiserver and kube-scheduler
    (MULTISLICE_NEXT_BIN_DIR overrides)."""
    return _cache_dir("MULTISLICE_NEXT_BIN_DIR", "--print-next-dir")


def _wanted() -> list[str]:
    return [*BINARIES, *(f for c in COMPONENTS.values() for f in c.files)]


def ensure_binaries(verbose: bool = True) -> Path:
    """Return the binary directory, running hack/build-bins.sh first when the cache is cold.

    Callers at once (pytest-xdist workers, two checkouts) take turns on a lock beside the cache:
    one builds, the others then find the binaries there instead of starting a second build."""
    return _ensure(bin_dir(), _wanted(), (), "MULTISLICE_BIN_DIR", verbose)


def ensure_next_binaries(verbose: bool = True) -> Path:
    """Return the newest Kubernetes lane's directory, running ``hack/build-bins.sh --next``
    first when it lacks a binary (cold: minutes), with the same lock as :func:`ensure_binaries`."""
    return _ensure(next_bin_dir(), NEXT_BINARIES, ("--next",), "MULTISLICE_NEXT_BIN_DIR", verbose)


def _ensure(
    directory: Path, wanted: Sequence[str], flags: Sequence[str], env: str, verbose: bool
) -> Path:
    def missing() -> list[str]:
        return [name for name in wanted if not (directory / name).is_file()]

    if not missing():
        return directory
    if os.environ.get(env):
        raise ControlPlaneError(f"{env}={directory} lacks {', '.join(missing())}")
    import fcntl

    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not missing():  # built by whoever held the lock before us
            return directory
        if verbose:
            print(f"controlplane: building {', '.join(missing())} (cold: minutes)", flush=True)
        # Progress goes straight to our stdout/stderr; a cold build takes many minutes.
        script = " ".join([str(BUILD_SCRIPT), *flags])
        result = subprocess.run(["bash", str(BUILD_SCRIPT), *flags], check=False)
        if result.returncode != 0:
            raise ControlPlaneError(f"{script} failed with exit code {result.returncode}")
        if missing():
            raise ControlPlaneError(f"{script} did not produce {', '.join(missing())}")
    return directory


# --------------------------------------------------------------------------------------------
# Certificates


def _key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys are generated in microseconds, unlike RSA; every component accepts them.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass
class CertificateAuthority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, common_name: str = "multislice-local-ca") -> CertificateAuthority:
        key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @property
    def pem(self) -> bytes:
        return _cert_pem(self.cert)

    def issue(
        self,
        common_name: str,
        organizations: tuple[str, ...] = (),
        *,
        server: bool = False,
        hosts: tuple[str, ...] = (),
    ) -> tuple[bytes, bytes]:
        """Return (cert PEM, key PEM) for a client or, with ``server``, a serving certificate."""
        key = _key()
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if hosts:
            names = subject_alt_names(list(hosts))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return _cert_pem(builder.sign(self.key, hashes.SHA256())), _key_pem(key)


def _kubeconfig(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> str:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)},
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    return yaml.safe_dump(doc, sort_keys=False)


# --------------------------------------------------------------------------------------------
# Processes


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child: SIGKILL it when the thread that started it dies, so a hard-killed test
    # session cannot leak an apiserver. Only used from the main thread (see _spawn).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        return _tail(self.log, lines)


def spawn_logged(
    name: str,
    argv: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> _Proc:
    """Start ``argv`` in a process group of its own (stop kills the whole group), its output
    appended to ``log``."""
    with log.open("ab") as out:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **env} if env else None,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
    return _Proc(name, popen, log)


def wait_until(
    proc: _Proc | None,
    check: Callable[[], str | None],
    deadline: float,
    what: str,
    error: type[Exception] = ControlPlaneError,
    transient: tuple[type[Exception], ...] = (OSError, ssl.SSLError, urllib.error.URLError),
) -> None:
    """Poll ``check`` (None = ready, else the reason; a ``transient`` exception is a reason too)
    until ready, ``proc`` dies or time runs out; raise ``error`` with the log tail then."""
    reason = "not checked"
    while True:
        if proc is not None and proc.popen.poll() is not None:
            raise error(
                f"{proc.name} exited with code {proc.popen.returncode} while waiting for "
                f"{what}\n--- {proc.name} log tail ---\n{proc.tail()}"
            )
        try:
            result = check()
        except transient as err:
            result = str(err)
        if result is None:
            return
        reason = result
        if time.monotonic() > deadline:
            if proc is None:
                raise error(f"timed out waiting for {what} ({reason})")
            raise error(
                f"{proc.name}: timed out waiting for {what} ({reason})\n"
                f"--- {proc.name} log tail ---\n{proc.tail()}"
            )
        time.sleep(0.1)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _http_get(url: str, context: ssl.SSLContext | None, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _insecure_context() -> ssl.SSLContext:
    # Controller-manager and scheduler serve /healthz with a self-signed certificate.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# --------------------------------------------------------------------------------------------
# Control plane


class ControlPlane:
    """etcd + kube-apiserver (``api``), a whole fake cluster (``cluster``), or that plus Kueue
    (``kueue``), on 127.0.0.1.

    Attributes after :meth:`start`: ``kubeconfig`` (admin, system:masters), ``server`` (URL),
    ``pids`` (component name -> pid of every process still running), ``workdir``, ``ca_file``.
    Logs are under ``workdir/logs``; set MULTISLICE_KEEP_WORKDIR=1 to keep a temporary workdir.

    ``kube_next=True``: the newest Kubernetes lane, kube-apiserver and kube-scheduler of the next
    minor with the Workload API on (``NEXT_BINARIES``, ``NEXT_APISERVER_FLAGS``).
    """

    def __init__(
        self,
        profile: str = "api",
        workdir: Path | None = None,
        binaries: Path | None = None,
        network: NodeNetwork | None = None,
        kube_next: bool = False,
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {tuple(PROFILES)}, not {profile!r}")
        self.profile = profile
        # Real nodes' control plane (realnodes.py): the API server at the kubernetes Service's
        # ClusterIP, node authorization, kubelet client certificates. None: 127.0.0.1, as before.
        self.network = network
        self.kube_next = kube_next
        self._next_bins: Path | None = None  # the newest lane's dir, found by start()
        self._own_workdir = workdir is None
        self._workdir_arg = workdir
        self._bin_arg = binaries
        self.workdir = Path(workdir) if workdir else Path()
        self.kubeconfig = Path()
        self.server = ""
        self.ca_file = Path()
        self._ca: CertificateAuthority | None = None
        self._api_ctx: ssl.SSLContext | None = None
        self._procs: list[_Proc] = []
        self._lock = threading.Lock()
        self.jobset_webhook_port = 0
        self.ports: dict[str, int] = {}  # component port name -> port, picked per start
        self.kueue_webhooks: list[tuple[str, str]] = []
        # Set before start(): merged into Kueue's featureGates (a test of another Kueue default).
        self.kueue_feature_gates: dict[str, bool] = {}

    # -- public API -------------------------------------------------------------------------

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self._procs if p.popen.poll() is None}

    def start(self, timeout: float = 120.0) -> Self:
        """Start every component and wait until it is ready; raise ControlPlaneError if not."""
        bins = self._bin_arg or ensure_binaries()
        if self.kube_next:
            self._next_bins = ensure_next_binaries()
        for attempt in range(3):
            self._prepare_workdir()
            _LIVE.add(self)
            try:
                self._start(bins, time.monotonic() + timeout)
                return self
            except BaseException as err:
                self.stop()
                # A port picked as free can be taken before the component binds it: retry.
                retry = isinstance(err, ControlPlaneError) and "address already in use" in str(err)
                if not retry or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop every process this object started (by process group), then remove temp state."""
        with self._lock:
            procs, self._procs = self._procs, []
        for proc in reversed(procs):
            teardown = COMPONENTS[proc.name].teardown if proc.name in COMPONENTS else None
            if teardown is not None and self._api_ctx is not None:
                with contextlib.suppress(Exception):  # the API server may be gone already
                    teardown(self)
            _terminate(proc.popen)
        _LIVE.discard(self)
        if (
            self._own_workdir
            and self.workdir != Path()
            and not os.environ.get("MULTISLICE_KEEP_WORKDIR")
        ):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_component(self, name: str) -> None:
        """Stop one component (its teardown first: Kueue's webhooks go before Kueue does)."""
        with self._lock:
            procs = [p for p in self._procs if p.name == name]
            self._procs = [p for p in self._procs if p.name != name]
        for proc in procs:
            teardown = COMPONENTS[name].teardown if name in COMPONENTS else None
            if teardown is not None:
                teardown(self)
            _terminate(proc.popen)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def client_env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """Environment for kubectl/helm against this control plane. Each control plane gets its
        own discovery cache: kubectl keys $HOME/.kube/cache by host:port, and a port reused by a
        later control plane would otherwise read a stale list of resources."""
        return {
            **os.environ,
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
            "KUBECACHEDIR": str(self.workdir / "kube-cache"),
        }

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient authenticated as the admin."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def user_kubeconfig(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """Write a kubeconfig for a client-certificate user (for RBAC tests) and return its path."""
        if self._ca is None:
            raise ControlPlaneError("control plane not started")
        cert, key = self._ca.issue(user, groups)
        # KUBECONFIG is a colon-separated list: keep ':' (service-account users) out of the name.
        path = self.workdir / f"kubeconfig-{re.sub(r'[^A-Za-z0-9_.-]', '_', user)}"
        path.write_text(_kubeconfig(self.server, self._ca.pem, cert, key, user))
        return path

    def log_tail(self, name: str, lines: int = 40) -> str:
        return _tail(self.workdir / "logs" / f"{name}.log", lines)

    # -- startup ----------------------------------------------------------------------------

    def _prepare_workdir(self) -> None:
        if self._own_workdir:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"multislice-{self.profile}-"))
        else:
            self.workdir = Path(self._workdir_arg or ".").resolve()
            # Stale etcd data would carry old member URLs and objects: always start empty.
            shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
            shutil.rmtree(self.workdir / "logs", ignore_errors=True)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        (self.workdir / "pki").mkdir(exist_ok=True)

    def _write(self, rel: str, data: bytes | str, mode: int = 0o600) -> Path:
        path = self.workdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            data = data.encode()
        path.write_bytes(data)
        path.chmod(mode)
        return path

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> _Proc:
        main = threading.current_thread() is threading.main_thread()
        proc = spawn_logged(
            name,
            argv,
            self.workdir / "logs" / f"{name}.log",
            env,
            cwd=self.workdir,
            preexec_fn=_die_with_parent if main and sys.platform == "linux" else None,
        )
        with self._lock:
            self._procs.append(proc)
        return proc

    def _wait(
        self, proc: _Proc, check: Callable[[], str | None], deadline: float, what: str
    ) -> None:
        """Poll ``check`` (None = ready, else the reason) until ready, the process dies or time
        runs out."""
        wait_until(proc, check, deadline, what)

    def _start(self, bins: Path, deadline: float) -> None:
        """Start the profile's components in order (see PROFILES and COMPONENTS below).

        Each component's ``prepare`` runs first (certificates, configuration, CRDs, webhook
        configurations: the API server is up by then for every component after it), then its
        process starts. A ``blocking`` component is waited for before the next one starts (etcd,
        the API server); the others start together and are waited for at the end.
        """
        self._pki()
        later: list[tuple[_Proc, Component]] = []
        for component in PROFILES[self.profile]:
            if component.prepare is not None:
                component.prepare(self, bins, deadline)
            env = component.env(self) if component.env is not None else None
            binary = bins / component.binary
            if self._next_bins is not None and component.binary in NEXT_BINARIES:
                binary = self._next_bins / component.binary
            proc = self._spawn(component.name, [str(binary), *component.argv(self)], env)
            if component.blocking:
                self._await(proc, component, deadline)
            else:
                later.append((proc, component))
        for proc, component in later:
            self._await(proc, component, deadline)

    def _await(self, proc: _Proc, component: Component, deadline: float) -> None:
        for check in component.ready:
            self._wait(proc, check.probe(self), deadline, check.what)

    def _pki(self) -> None:
        """The CA, the API server's serving certificate, the admin's client certificate and the
        service-account key pair: what every profile needs before its first process."""
        ca = self._ca = CertificateAuthority.create()
        self.ca_file = self._write("pki/ca.crt", ca.pem, 0o644)
        self._write("pki/ca.key", _key_pem(ca.key))
        serving_cert, serving_key = ca.issue(
            "kube-apiserver",
            server=True,
            hosts=(
                *((self.network.apiserver_ip,) if self.network else ()),
                "127.0.0.1",
                "localhost",
                "10.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
        )
        self._write("pki/apiserver.crt", serving_cert, 0o644)
        self._write("pki/apiserver.key", serving_key)
        admin_cert, admin_key = ca.issue("admin", ("system:masters",))
        self._write("pki/admin.crt", admin_cert, 0o644)
        self._write("pki/admin.key", admin_key)
        # Front-proxy identity for aggregated APIs; also keeps the requestheader CA bundle that
        # controller-manager and scheduler read from being empty.
        proxy_cert, proxy_key = ca.issue("front-proxy-client")
        self._write("pki/front-proxy-client.crt", proxy_cert, 0o644)
        self._write("pki/front-proxy-client.key", proxy_key)
        sa_key = _key()
        self._write("pki/sa.key", _key_pem(sa_key))
        self._write(
            "pki/sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            0o644,
        )
        self.ports = {name: _free_port() for name in ("etcd", "etcd-peer", "kube-apiserver")}
        self.server = f"https://127.0.0.1:{self.ports['kube-apiserver']}"
        if self.network is not None:
            # The ClusterIP's port: what KUBERNETES_SERVICE_PORT says in every pod.
            self.ports["kube-apiserver"] = 443
            self.server = f"https://{self.network.apiserver_ip}:443"
            # The API server's identity towards kubelets (logs, exec): a superuser, as kubeadm's
            # apiserver-kubelet-client was.
            cert, key = ca.issue("kube-apiserver-kubelet-client", ("system:masters",))
            self._write("pki/apiserver-kubelet-client.crt", cert, 0o644)
            self._write("pki/apiserver-kubelet-client.key", key)
        self.kubeconfig = self._write(
            "kubeconfig", _kubeconfig(self.server, ca.pem, admin_cert, admin_key, "admin")
        )
        self._api_ctx = ssl.create_default_context(cafile=str(self.ca_file))
        pki = self.workdir / "pki"
        self._api_ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    @property
    def ca(self) -> CertificateAuthority:
        if self._ca is None:
            raise ControlPlaneError("control plane not started")
        return self._ca

    def port(self, name: str) -> int:
        """A free loopback port for `name`, picked once per start."""
        if name not in self.ports:
            self.ports[name] = _free_port()
        return self.ports[name]

    def install_webhooks(
        self,
        manifests: Path,
        prefix: str,
        port: int,
        keep: Callable[[str], bool] = lambda _path: True,
        object_selectors: dict[str, dict[str, Any]] | None = None,
    ) -> list[tuple[str, str]]:
        """Create a module's webhook configurations with each `service:` reference rewritten to
        https://127.0.0.1:<port><path> (our CA), keeping only the webhooks whose path `keep`
        accepts; `object_selectors` maps a path suffix to an objectSelector. Returns the
        (plural, name) of every configuration created."""
        ca_bundle = base64.b64encode(self.ca.pem).decode()
        created = []
        for doc in yaml.safe_load_all(manifests.read_text()):
            if not doc:
                continue
            doc["metadata"] = {"name": f"{prefix}-{doc['metadata']['name']}"}
            hooks = []
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                if not keep(path):
                    continue
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{port}{path}",
                    "caBundle": ca_bundle,
                }
                for suffix, selector in (object_selectors or {}).items():
                    if path.endswith(suffix):
                        hook["objectSelector"] = selector
                hooks.append(hook)
            doc["webhooks"] = hooks
            plural = (
                "mutatingwebhookconfigurations"
                if doc["kind"] == "MutatingWebhookConfiguration"
                else "validatingwebhookconfigurations"
            )
            self._api("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}", doc)
            created.append((plural, doc["metadata"]["name"]))
        return created

    def delete_webhooks(self, configurations: list[tuple[str, str]]) -> None:
        for plural, name in configurations:
            self._request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/{name}")

    def create_crds(self, crds: list[dict[str, Any]], deadline: float, waiter: _Proc) -> None:
        """POST each CRD (never client-side apply: Kueue's workloads CRD is far over the 256 KiB
        last-applied annotation) and wait until every one is Established."""
        for crd in crds:
            self._api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        for crd in crds:
            name = crd["metadata"]["name"]
            self._wait(
                waiter, functools.partial(self._crd_established, name), deadline, f"CRD {name}"
            )

    def _apiserver(self) -> _Proc:
        return next(p for p in self._procs if p.name == "kube-apiserver")

    def _crd_established(self, name: str) -> str | None:
        status, body = self._request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        )
        if status != 200:
            return f"HTTP {status}"
        for cond in (body.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Established" and cond.get("status") == "True":
                return None
        return "not established"

    def dry_run_create(self, path: str, body: dict[str, Any]) -> str | None:
        """None when a server-side dry-run create passes every admission webhook."""
        status, answer = self._request("POST", f"{path}?dryRun=All", body)
        return None if status == 201 else f"HTTP {status}: {answer.get('message', answer)}"

    # -- raw API access (no client-library discovery or model deserialization) ----------------

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.server}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, context=self._api_ctx, timeout=10) as resp:
                status, raw = int(resp.status), resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"message": raw.decode(errors="replace")}
        return status, parsed if isinstance(parsed, dict) else {"items": parsed}

    def _api(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        status, parsed = self._request(method, path, body)
        if status >= 300:
            raise ControlPlaneError(f"{method} {path}: HTTP {status}: {parsed.get('message')}")
        return parsed


def _http_check(url: str, context: ssl.SSLContext | None = None) -> Callable[[], str | None]:
    if context is None and url.startswith("https"):
        context = _insecure_context()
    return lambda: _expect_ok(_http_get(url, context))


def _expect_ok(result: tuple[int, bytes]) -> str | None:
    status, body = result
    return None if status == 200 else f"HTTP {status}: {body[:200]!r}"


# --------------------------------------------------------------------------------------------
# Components and profiles
#
# A component is one process: what it needs prepared before it starts (ports, certificates, its
# configuration, CRDs, webhook configurations), its command line, how to tell it is ready, and
# what to undo before it stops. A profile is a list of components, started in order.


@dataclass(frozen=True)
class Readiness:
    what: str  # said in the error when it never becomes ready
    probe: Callable[[ControlPlane], Callable[[], str | None]]  # None = ready, else the reason


@dataclass(frozen=True)
class Component:
    name: str  # process and log name (workdir/logs/<name>.log)
    binary: str  # file in the binary cache
    argv: Callable[[ControlPlane], list[str]]
    ready: tuple[Readiness, ...] = ()
    prepare: Callable[[ControlPlane, Path, float], None] | None = None  # (cp, bins, deadline)
    env: Callable[[ControlPlane], dict[str, str]] | None = None  # extra environment
    teardown: Callable[[ControlPlane], None] | None = None  # before its process is stopped
    blocking: bool = False  # later components need it ready
    files: tuple[str, ...] = ()  # other files it needs from the binary cache


def _http_ready(what: str, url: Callable[[ControlPlane], str]) -> Readiness:
    return Readiness(what, lambda cp: _http_check(url(cp)))


# -- etcd and the API server (the api profile)


def _etcd_argv(cp: ControlPlane) -> list[str]:
    client, peer = f"http://127.0.0.1:{cp.port('etcd')}", f"http://127.0.0.1:{cp.port('etcd-peer')}"
    return [
        "--name=local",
        f"--data-dir={cp.workdir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=local={peer}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync",  # test data: durability is not worth the fsync latency
        "--log-level=warn",
    ]


def _apiserver_argv(cp: ControlPlane) -> list[str]:
    argv = _apiserver_common_argv(cp)
    if cp.kube_next:
        argv += NEXT_APISERVER_FLAGS
    if cp.network is None:
        return [
            *argv,
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--authorization-mode=RBAC",
            # No token controller in the api profile, and tests need no pod tokens.
            "--disable-admission-plugins=ServiceAccount",
            *(NEXT_LOOPBACK_APISERVER_FLAGS if cp.kube_next else ()),
        ]
    pki = cp.workdir / "pki"
    return [
        *argv,
        f"--bind-address={cp.network.apiserver_ip}",
        f"--advertise-address={cp.network.apiserver_ip}",
        f"--service-cluster-ip-range={cp.network.service_cidr}",
        # Real kubelets with their own identities (system:node:<name>): node authorization and
        # NodeRestriction, as every production cluster runs them. Pods get service account
        # tokens (the ServiceAccount admission plugin is on by default).
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        # Node names resolve nowhere: dial kubelets (logs, exec) at their InternalIP.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        # No kube-proxy: webhooks and aggregated APIs behind a Service are called at the
        # Service's endpoints (pod IPs, routed to the nodes), not at its ClusterIP.
        "--enable-aggregator-routing=true",
    ]


def _apiserver_common_argv(cp: ControlPlane) -> list[str]:
    pki = cp.workdir / "pki"
    return [
        f"--etcd-servers=http://127.0.0.1:{cp.port('etcd')}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--secure-port={cp.port('kube-apiserver')}",
        "--allow-privileged=true",
        f"--service-account-issuer={cp.server}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--requestheader-client-ca-file={pki / 'ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        "--profiling=false",
    ]


ETCD = Component(
    "etcd",
    "etcd",
    _etcd_argv,
    ready=(_http_ready("etcd /health", lambda cp: f"http://127.0.0.1:{cp.port('etcd')}/health"),),
    blocking=True,
)
KUBE_APISERVER = Component(
    "kube-apiserver",
    "kube-apiserver",
    _apiserver_argv,
    ready=(
        Readiness(
            "kube-apiserver /readyz", lambda cp: _http_check(f"{cp.server}/readyz", cp._api_ctx)
        ),
    ),
    blocking=True,
)


# -- controller-manager, scheduler, kwok (the cluster profile)


def _secure_component_argv(cp: ControlPlane, name: str) -> list[str]:
    kubeconfig = str(cp.kubeconfig)
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--secure-port={cp.port(name)}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
    ]


def _kcm_argv(cp: ControlPlane) -> list[str]:
    pki = cp.workdir / "pki"
    return [
        *_secure_component_argv(cp, "kube-controller-manager"),
        "--use-service-account-credentials=false",
        # No cloud and no pod CIDRs to allocate.
        "--controllers=*,-node-ipam-controller,-service-lb-controller,"
        "-node-route-controller,-cloud-node-lifecycle-controller",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
    ]


def _kwok_prepare(cp: ControlPlane, _bins: Path, _deadline: float) -> None:
    cp._write("kwok-stages.yaml", kwok_stages_yaml(), 0o644)


def _kwok_argv(cp: ControlPlane) -> list[str]:
    return [
        f"--kubeconfig={cp.kubeconfig}",
        f"--config={cp.workdir / 'kwok-stages.yaml'}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
        f"--server-address=127.0.0.1:{cp.port('kwok')}",
        # Heartbeats through Leases, as kubelets do: without them kwok renews node status only
        # every ~50 s and the node lifecycle controller marks every node Unknown for a moment,
        # about once a minute (a NotReady flap no real TPU VM has).
        f"--node-lease-duration-seconds={KWOK_NODE_LEASE_SECONDS}",
        f"--cidr={POD_CIDR}",
        "--node-ip=10.63.0.1",
    ]


def _https_healthz(name: str) -> Readiness:
    return _http_ready(f"{name} /healthz", lambda cp: f"https://127.0.0.1:{cp.port(name)}/healthz")


KUBE_CONTROLLER_MANAGER = Component(
    "kube-controller-manager",
    "kube-controller-manager",
    _kcm_argv,
    ready=(_https_healthz("kube-controller-manager"),),
)


def _scheduler_argv(cp: ControlPlane) -> list[str]:
    argv = _secure_component_argv(cp, "kube-scheduler")
    return [*argv, *NEXT_SCHEDULER_FLAGS] if cp.kube_next else argv


KUBE_SCHEDULER = Component(
    "kube-scheduler",
    "kube-scheduler",
    _scheduler_argv,
    ready=(_https_healthz("kube-scheduler"),),
)
KWOK = Component(
    "kwok",
    "kwok",
    _kwok_argv,
    ready=(_http_ready("kwok /healthz", lambda cp: f"http://127.0.0.1:{cp.port('kwok')}/healthz"),),
    prepare=_kwok_prepare,
)


# -- the JobSet controller and its webhooks


def _serving_cert(cp: ControlPlane, name: str, directory: str) -> Path:
    """controller-runtime's tls.crt/tls.key for 127.0.0.1, signed by the control plane CA."""
    cert, key = cp.ca.issue(name, server=True, hosts=("127.0.0.1",))
    cp._write(f"{directory}/tls.crt", cert, 0o644)
    cp._write(f"{directory}/tls.key", key)
    return cp.workdir / directory


def _jobset_prepare(cp: ControlPlane, bins: Path, deadline: float) -> None:
    # The CRD first: the controller must find the kind when it starts.
    crd = yaml.safe_load((bins / JOBSET_CRD_FILE).read_text())
    cp.create_crds([crd], deadline, cp._apiserver())
    port = cp.jobset_webhook_port = cp.port("jobset-webhook")
    # As the module's kustomize patches do: only JobSet pods go to the pod webhook.
    only_jobset_pods = {"matchExpressions": [{"key": keys.JOBSET_NAME, "operator": "Exists"}]}
    cp.install_webhooks(
        bins / JOBSET_WEBHOOKS_FILE, "jobset", port, object_selectors={"-v1-pod": only_jobset_pods}
    )
    certs = _serving_cert(cp, "jobset-webhook", "jobset/certs")
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        # Our own certificate and webhook configurations replace its in-cluster cert rotator.
        "internalCertManagement": {"enable": False},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{cp.port('jobset-probe')}"},
    }
    # In-place restart (docs/restarts.md): the gate is alpha, off by default, and set only in
    # the config file; a JobSet older than v0.11 refuses a gate it does not know, so only where
    # its CRD has the strategy.
    if "InPlaceRestart" in (bins / JOBSET_CRD_FILE).read_text():
        config["featureGates"] = {"InPlaceRestart": True}
    cp._write("jobset/config.yaml", yaml.safe_dump(config))


JOBSET_PROBE = {
    "apiVersion": "jobset.x-k8s.io/v1alpha2",
    "kind": "JobSet",
    "metadata": {"name": "readiness-probe"},
    "spec": {
        "replicatedJobs": [
            {
                "name": "probe",
                "replicas": 1,
                "template": {
                    "spec": {
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": "c", "image": "probe"}],
                            }
                        }
                    }
                },
            }
        ]
    },
}

JOBSET_CONTROLLER = Component(
    "jobset-controller",
    _controller("jobset-controller"),
    lambda cp: [
        f"--kubeconfig={cp.kubeconfig}",
        f"--config={cp.workdir / 'jobset' / 'config.yaml'}",
        "--leader-elect=false",
        "--zap-devel=false",
    ],
    ready=(
        _http_ready(
            "jobset-controller /readyz",
            lambda cp: f"http://127.0.0.1:{cp.port('jobset-probe')}/readyz",
        ),
        # Webhooks answer when a server-side dry-run create passes mutation and validation.
        Readiness(
            "JobSet webhooks (dry-run create)",
            lambda cp: (
                lambda: cp.dry_run_create(
                    "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets", JOBSET_PROBE
                )
            ),
        ),
    ),
    prepare=_jobset_prepare,
    files=(JOBSET_CRD_FILE, JOBSET_WEBHOOKS_FILE),
)


# -- Kueue (the kueue profile); hack/README.md has the build recipe and its pitfalls, docs/kueue.md
# ("Locally") the demo


KUEUE_CRDS_FILE = _controller("kueue-crds.yaml")
KUEUE_WEBHOOKS_FILE = _controller("kueue-webhook-manifests.yaml")
KUEUE_NAMESPACE = "kueue-system"
# upstream config/components/crd/kustomization.yaml: these serve v1beta1 through a conversion
# webhook; the other Kueue CRDs convert with strategy None.
KUEUE_CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")


def kueue_webhook_wanted(path: str) -> bool:
    """Kueue's own kinds and JobSets only. Every integration's webhook is registered anyway
    (no-op for disabled frameworks), but the Pod, Job, Deployment and StatefulSet ones would
    catch every such object in the cluster with failurePolicy Fail."""
    return "-kueue-x-k8s-io-" in path or "-jobset-x-k8s-io-" in path


def _kueue_crds(cp: ControlPlane, bins: Path, port: int) -> list[dict[str, Any]]:
    ca_bundle = base64.b64encode(cp.ca.pem).decode()
    crds = []
    for doc in yaml.safe_load_all((bins / KUEUE_CRDS_FILE).read_text()):
        if not doc:
            continue
        if doc["spec"]["names"]["plural"] in KUEUE_CONVERTED:
            doc["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/convert",
                        "caBundle": ca_bundle,
                    },
                    "conversionReviewVersions": ["v1"],
                },
            }
        crds.append(doc)
    return crds


# The manager profile's MultiKueue settings (apis/config/v1beta2 MultiKueue): the operator's
# kind as an external framework (the generic adapter copies a job whose spec.managedBy is
# kueue.x-k8s.io/multikueue to the worker, without managedBy, and its status back), short
# intervals so that a lost worker and orphaned remote objects are seen within a test.
MULTIKUEUE_ORIGIN = "multislice-local-manager"
MULTIKUEUE_WORKER_LOST_TIMEOUT = "60s"
MULTIKUEUE_GC_INTERVAL = "15s"


def multikueue_config() -> dict[str, Any]:
    """The ``multiKueue`` section of the manager's Kueue Configuration."""
    return {
        "externalFrameworks": [{"name": f"{models.KIND}.{models.VERSION}.{models.GROUP}"}],
        "origin": MULTIKUEUE_ORIGIN,
        "workerLostTimeout": MULTIKUEUE_WORKER_LOST_TIMEOUT,
        "gcInterval": MULTIKUEUE_GC_INTERVAL,
    }


def _kueue_prepare(cp: ControlPlane, bins: Path, deadline: float) -> None:
    port = cp.port("kueue-webhook")
    cp._api("POST", "/api/v1/namespaces", {"metadata": {"name": KUEUE_NAMESPACE}})
    if cp.profile == "manager":  # no JobSet controller there: its CRD alone
        crd = yaml.safe_load((bins / JOBSET_CRD_FILE).read_text())
        cp.create_crds([crd], deadline, cp._apiserver())
    cp.create_crds(_kueue_crds(cp, bins, port), deadline, cp._apiserver())
    # Kueue's JobSet webhooks match every JobSet with failurePolicy Fail: they exist only while
    # Kueue runs (installed here, removed by the teardown before Kueue stops).
    cp.kueue_webhooks = cp.install_webhooks(
        bins / KUEUE_WEBHOOKS_FILE, "kueue", port, keep=kueue_webhook_wanted
    )
    certs = _serving_cert(cp, "kueue-webhook", "kueue/certs")
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "leaderElection": {"leaderElect": False},
        # Its cert has only the Service DNS name, unreachable without kube-proxy: ours instead.
        "internalCertManagement": {"enable": False},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{cp.port('kueue-probe')}"},
        "integrations": {"frameworks": ["jobset.x-k8s.io/jobset"]},
    }
    # Its visibility API server binds :8082 on every interface and wants certificates of its
    # own; it is an aggregated API that needs an in-cluster Service: off.
    gates = {"VisibilityOnDemand": False}
    if cp.profile == "manager":
        config["multiKueue"] = multikueue_config()
        # Beta and on by default since v0.15: set anyway, the setup depends on it.
        gates |= {"MultiKueue": True, "MultiKueueAdaptersForCustomJobs": True}
    config["featureGates"] = {**gates, **cp.kueue_feature_gates}
    cp._write("kueue/config.yaml", yaml.safe_dump(config))


def _kueue_teardown(cp: ControlPlane) -> None:
    cp.delete_webhooks(cp.kueue_webhooks)
    cp.kueue_webhooks = []


KUEUE_PROBE = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "ResourceFlavor",
    "metadata": {"name": "readiness-probe"},
}

KUEUE_CONTROLLER = Component(
    "kueue-controller",
    _controller("kueue-controller"),
    lambda cp: [
        f"--kubeconfig={cp.kubeconfig}",
        f"--config={cp.workdir / 'kueue' / 'config.yaml'}",
        "--zap-log-level=info",
    ],
    ready=(
        _http_ready(
            "kueue-controller /readyz",
            lambda cp: f"http://127.0.0.1:{cp.port('kueue-probe')}/readyz",
        ),
        # /readyz is 200 before the webhooks answer; a dry-run create goes through both.
        Readiness(
            "Kueue webhooks (dry-run create)",
            lambda cp: (
                lambda: cp.dry_run_create(
                    "/apis/kueue.x-k8s.io/v1beta2/resourceflavors", KUEUE_PROBE
                )
            ),
        ),
    ),
    prepare=_kueue_prepare,
    # hack/tools/kueue: upstream reads its metrics certificate from a fixed path and exits
    # without it, even with metrics off; our build takes the directory from this variable.
    env=lambda cp: {"KUEUE_METRICS_CERT_DIR": str(cp.workdir / "kueue" / "certs")},
    teardown=_kueue_teardown,
    files=(KUEUE_CRDS_FILE, KUEUE_WEBHOOKS_FILE),
)


API: tuple[Component, ...] = (ETCD, KUBE_APISERVER)
CLUSTER: tuple[Component, ...] = (
    *API,
    KUBE_CONTROLLER_MANAGER,
    KUBE_SCHEDULER,
    KWOK,
    JOBSET_CONTROLLER,
)
KUEUE: tuple[Component, ...] = (*CLUSTER, KUEUE_CONTROLLER)
# A MultiKueue manager: its Kueue config differs (_kueue_prepare looks at the profile).
MANAGER: tuple[Component, ...] = (*API, KUBE_CONTROLLER_MANAGER, KUEUE_CONTROLLER)
PROFILES: dict[str, tuple[Component, ...]] = {
    "api": API,
    "cluster": CLUSTER,
    "kueue": KUEUE,
    "manager": MANAGER,
}
COMPONENTS = {c.name: c for c in KUEUE}  # every profile's components are the kueue profile's


def _terminate(popen: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(grace)
    # The group may hold children that outlived the leader; SIGKILL whatever is left.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(5)


def kwok_stages_yaml() -> bytes:
    """The kwok Stage documents (default pod stages plus run-duration and failure injection)."""
    return (resources.files("multislice_local") / "kwok" / "stages.yaml").read_bytes()


@atexit.register
def _stop_all() -> None:
    for cp in list(_LIVE):
        cp.stop()


# --------------------------------------------------------------------------------------------
# CLI


def _run_dir() -> Path:
    default = Path.home() / ".cache" / "multislice-operator" / "run"
    return Path(os.environ.get("MULTISLICE_RUN_DIR", default))


def _pidfile(profile: str) -> Path:
    return _run_dir() / f"{profile}.pid"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmd_up(args: argparse.Namespace) -> int:
    pidfile = _pidfile(args.profile)
    if pidfile.exists():
        pid = int(pidfile.read_text().split()[0])
        if _pid_alive(pid):
            print(f"already running (pid {pid}); run `down --profile {args.profile}` first")
            return 1
    workdir = _run_dir() / args.profile
    if args.detach:
        return _detach(args, workdir)
    ensure_binaries()
    cp = ControlPlane(args.profile, workdir=workdir, kube_next=args.kube_next)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cp.start()
    try:
        pidfile.write_text(f"{os.getpid()}\n")
        print(f"profile {args.profile} ready: {cp.server}")
        print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
        for name, pid in cp.pids.items():
            print(f"  {name}: pid {pid}, log {cp.workdir / 'logs' / (name + '.log')}")
        sys.stdout.flush()
        while not stop.wait(1.0):
            dead = [p.name for p in cp._procs if p.popen.poll() is not None]
            if dead:
                print(f"component exited: {', '.join(dead)}; stopping", file=sys.stderr)
                return 1
        return 0
    finally:
        cp.stop()
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()


def _detach(args: argparse.Namespace, workdir: Path) -> int:
    # Build in the foreground so progress is visible, then run the supervisor in the background.
    ensure_binaries()
    if args.kube_next:
        ensure_next_binaries()
    _run_dir().mkdir(parents=True, exist_ok=True)
    log = _run_dir() / f"{args.profile}.log"
    with log.open("wb") as out:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "multislice_local.controlplane",
                "up",
                f"--profile={args.profile}",
                *(["--kube-next"] if args.kube_next else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if child.poll() is not None:
            print(log.read_text(errors="replace"), file=sys.stderr)
            return 1
        if "export KUBECONFIG=" in log.read_text(errors="replace"):
            print(f"profile {args.profile} up (supervisor pid {child.pid}, log {log})")
            print(f"export KUBECONFIG={workdir / 'kubeconfig'}")
            return 0
        time.sleep(0.2)
    _terminate(child)
    print(f"timed out; see {log}", file=sys.stderr)
    return 1


def _cmd_down(args: argparse.Namespace) -> int:
    pidfile = _pidfile(args.profile)
    if not pidfile.exists():
        print(f"profile {args.profile} is not running")
        return 0
    pid = int(pidfile.read_text().split()[0])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _pid_alive(pid):
        # Its components die with it (PR_SET_PDEATHSIG).
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()
    print(f"profile {args.profile} stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multislice_local.controlplane")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a local control plane and wait for Ctrl-C or `down`")
    up.add_argument("--profile", choices=sorted(PROFILES), default="cluster")
    up.add_argument("--detach", action="store_true", help="return once ready; stop with `down`")
    up.add_argument(
        "--kube-next",
        action="store_true",
        help="the newest Kubernetes lane: kube-apiserver and kube-scheduler 1.37, Workload API on",
    )
    down = sub.add_parser("down", help="stop a control plane started by `up`")
    down.add_argument("--profile", choices=sorted(PROFILES), default="cluster")
    sub.add_parser("bins", help="build the binaries if missing and print their directory")
    args = parser.parse_args(argv)
    if args.command == "up":
        return _cmd_up(args)
    if args.command == "down":
        return _cmd_down(args)
    print(ensure_binaries())
    return 0


if __name__ == "__main__":
    sys.exit(main())
