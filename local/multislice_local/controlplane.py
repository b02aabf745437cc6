"""A real local Kubernetes control plane run as child processes, for tests and local runs.

Two profiles:

* ``api``: etcd + kube-apiserver (TLS, client-certificate auth, RBAC), as envtest runs them.
* ``cluster``: ``api`` plus kube-controller-manager, kube-scheduler, the kwok controller (fake
  nodes and pod phases, see :mod:`multislice_local.nodes`) and the JobSet controller with
  its webhooks served on 127.0.0.1.

Binaries come from ``hack/build-bins.sh`` (built from pinned Go modules into a versioned cache).

CLI::

    python -m multislice_local.controlplane up --profile cluster [--detach]
    python -m multislice_local.controlplane down --profile cluster
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import ctypes
import datetime as dt
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
from collections.abc import Callable
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

from multislice_operator import keys

PROFILES = ("api", "cluster")
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-bins.sh"
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwokctl",
    "jobset-controller",
    "helm",
)
JOBSET_CRD_FILE = "jobset.x-k8s.io_jobsets.yaml"
JOBSET_WEBHOOKS_FILE = "jobset-webhook-manifests.yaml"
JOBSET_CRD_NAME = "jobsets.jobset.x-k8s.io"
# kwok manages only nodes carrying this annotation (see nodes.py).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_LEASE_SECONDS = 40  # kubelet's default node lease duration
KWOK_NODE_ANNOTATION_VALUE = "fake"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
POD_CIDR = "10.64.0.1/16"

# Strong references: a started control plane dropped without stop() is still stopped at exit.
_LIVE: set[ControlPlane] = set()


class ControlPlaneError(RuntimeError):
    """A component failed to start or become ready; the message carries its log tail."""


# --------------------------------------------------------------------------------------------
# Binaries


def bin_dir() -> Path:
    """Directory holding the binaries for the pinned versions (MULTISLICE_BIN_DIR overrides)."""
    override = os.environ.get("MULTISLICE_BIN_DIR")
    if override:
        return Path(override)
    if not BUILD_SCRIPT.exists():
        raise ControlPlaneError(
            f"{BUILD_SCRIPT} not found (not a source checkout); set MULTISLICE_BIN_DIR"
        )
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def _missing(directory: Path) -> list[str]:
    wanted = [*BINARIES, JOBSET_CRD_FILE, JOBSET_WEBHOOKS_FILE]
    return [name for name in wanted if not (directory / name).is_file()]


def ensure_binaries(verbose: bool = True) -> Path:
    """Return the binary directory, running hack/build-bins.sh first when the cache is cold."""
    directory = bin_dir()
    missing = _missing(directory)
    if not missing:
        return directory
    if os.environ.get("MULTISLICE_BIN_DIR"):
        raise ControlPlaneError(f"MULTISLICE_BIN_DIR={directory} lacks {', '.join(missing)}")
    if verbose:
        print(f"controlplane: building {', '.join(missing)} (cold cache: minutes)", flush=True)
    # Progress goes straight to our stdout/stderr; a cold build takes many minutes.
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], check=False)
    if result.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    missing = _missing(directory)
    if missing:
        raise ControlPlaneError(f"{BUILD_SCRIPT} did not produce {', '.join(missing)}")
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
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
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
    """etcd + kube-apiserver (``api``) or a whole fake cluster (``cluster``) on 127.0.0.1.

    Attributes after :meth:`start`: ``kubeconfig`` (admin, system:masters), ``server`` (URL),
    ``pids`` (component name -> pid of every process still running), ``workdir``, ``ca_file``.
    Logs are under ``workdir/logs``; set MULTISLICE_KEEP_WORKDIR=1 to keep a temporary workdir.
    """

    def __init__(
        self, profile: str = "api", workdir: Path | None = None, binaries: Path | None = None
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {PROFILES}, not {profile!r}")
        self.profile = profile
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

    # -- public API -------------------------------------------------------------------------

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self._procs if p.popen.poll() is None}

    def start(self, timeout: float = 120.0) -> Self:
        """Start every component and wait until it is ready; raise ControlPlaneError if not."""
        bins = self._bin_arg or ensure_binaries()
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
            _terminate(proc.popen)
        _LIVE.discard(self)
        if (
            self._own_workdir
            and self.workdir != Path()
            and not os.environ.get("MULTISLICE_KEEP_WORKDIR")
        ):
            shutil.rmtree(self.workdir, ignore_errors=True)

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

    def _spawn(self, name: str, argv: list[str]) -> _Proc:
        log = self.workdir / "logs" / f"{name}.log"
        main = threading.current_thread() is threading.main_thread()
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,  # own process group: stop() kills the whole group
                preexec_fn=_die_with_parent if main and sys.platform == "linux" else None,
            )
        proc = _Proc(name, popen, log)
        with self._lock:
            self._procs.append(proc)
        return proc

    def _wait(
        self, proc: _Proc, check: Callable[[], str | None], deadline: float, what: str
    ) -> None:
        """Poll ``check`` (None = ready, else the reason) until ready, the process dies or time
        runs out."""
        reason = "not checked"
        while True:
            if proc.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{proc.name} exited with code {proc.popen.returncode} while waiting for "
                    f"{what}\n--- {proc.name} log tail ---\n{proc.tail()}"
                )
            try:
                result = check()
            except (OSError, ssl.SSLError, urllib.error.URLError) as err:
                result = str(err)
            if result is None:
                return
            reason = result
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{proc.name}: timed out waiting for {what} ({reason})\n"
                    f"--- {proc.name} log tail ---\n{proc.tail()}"
                )
            time.sleep(0.1)

    def _start(self, bins: Path, deadline: float) -> None:
        ca = self._ca = CertificateAuthority.create()
        self.ca_file = self._write("pki/ca.crt", ca.pem, 0o644)
        self._write("pki/ca.key", _key_pem(ca.key))
        serving_cert, serving_key = ca.issue(
            "kube-apiserver",
            server=True,
            hosts=(
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

        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        self.kubeconfig = self._write(
            "kubeconfig", _kubeconfig(self.server, ca.pem, admin_cert, admin_key, "admin")
        )
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=local",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=local={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",  # test data: durability is not worth the fsync latency
                "--log-level=warn",
            ],
        )
        self._wait(etcd, _http_check(f"{etcd_url}/health"), deadline, "etcd /health")

        pki = self.workdir / "pki"
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--secure-port={api_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                "--authorization-mode=RBAC",
                # No token controller in the api profile, and tests need no pod tokens.
                "--disable-admission-plugins=ServiceAccount",
                f"--service-account-issuer={self.server}",
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
            ],
        )
        self._api_ctx = ssl.create_default_context(cafile=str(self.ca_file))
        self._api_ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        readyz = _http_check(f"{self.server}/readyz", self._api_ctx)
        self._wait(apiserver, readyz, deadline, "kube-apiserver /readyz")
        if self.profile == "cluster":
            self._start_cluster(bins, deadline, apiserver, ca)

    def _start_cluster(
        self, bins: Path, deadline: float, apiserver: _Proc, ca: CertificateAuthority
    ) -> None:
        kubeconfig = str(self.kubeconfig)
        pki = self.workdir / "pki"
        kcm_port, sched_port, kwok_port = _free_port(), _free_port(), _free_port()
        hook_port, probe_port = _free_port(), _free_port()
        self.jobset_webhook_port = hook_port

        # JobSet CRD first: its controller must find the kind when it starts.
        crd = yaml.safe_load((bins / JOBSET_CRD_FILE).read_text())
        self._api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        self._install_jobset_webhooks(bins, hook_port, ca)

        kcm = self._spawn(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--secure-port={kcm_port}",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                # No cloud and no pod CIDRs to allocate.
                "--controllers=*,-node-ipam-controller,-service-lb-controller,"
                "-node-route-controller,-cloud-node-lifecycle-controller",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
            ],
        )
        scheduler = self._spawn(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--secure-port={sched_port}",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
            ],
        )
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_bytes(kwok_stages_yaml())
        kwok = self._spawn(
            "kwok",
            [
                str(bins / "kwok"),
                f"--kubeconfig={kubeconfig}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector="
                f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
                f"--server-address=127.0.0.1:{kwok_port}",
                # Heartbeats through Leases, as kubelets do: without them kwok renews node status
                # only every ~50 s and the node lifecycle controller marks every node Unknown for
                # a moment, about once a minute (a NotReady flap no real TPU VM has).
                f"--node-lease-duration-seconds={KWOK_NODE_LEASE_SECONDS}",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.63.0.1",
            ],
        )
        self._wait(apiserver, self._crd_established, deadline, f"CRD {JOBSET_CRD_NAME} Established")

        hook_cert, hook_key = ca.issue("jobset-webhook", server=True, hosts=("127.0.0.1",))
        self._write("jobset/certs/tls.crt", hook_cert, 0o644)
        self._write("jobset/certs/tls.key", hook_key)
        jobset_config = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            # Our own certificate and webhook configurations replace its in-cluster cert rotator.
            "internalCertManagement": {"enable": False},
            "webhook": {
                "port": hook_port,
                "host": "127.0.0.1",
                "certDir": str(self.workdir / "jobset" / "certs"),
            },
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        }
        config_path = self._write("jobset/config.yaml", yaml.safe_dump(jobset_config))
        jobset = self._spawn(
            "jobset-controller",
            [
                str(bins / "jobset-controller"),
                f"--kubeconfig={kubeconfig}",
                f"--config={config_path}",
                "--leader-elect=false",
                "--zap-devel=false",
            ],
        )

        for proc, url in (
            (kcm, f"https://127.0.0.1:{kcm_port}/healthz"),
            (scheduler, f"https://127.0.0.1:{sched_port}/healthz"),
            (kwok, f"http://127.0.0.1:{kwok_port}/healthz"),
            (jobset, f"http://127.0.0.1:{probe_port}/readyz"),
        ):
            self._wait(proc, _http_check(url), deadline, url)
        # Webhooks answer when a server-side dry-run create passes mutation and validation.
        self._wait(jobset, self._jobset_dry_run, deadline, "JobSet webhooks (dry-run create)")

    def _install_jobset_webhooks(self, bins: Path, port: int, ca: CertificateAuthority) -> None:
        ca_bundle = base64.b64encode(ca.pem).decode()
        for doc in yaml.safe_load_all((bins / JOBSET_WEBHOOKS_FILE).read_text()):
            if not doc:
                continue
            kind = doc["kind"]
            doc["metadata"] = {"name": f"jobset-{doc['metadata']['name']}"}
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{port}{path}",
                    "caBundle": ca_bundle,
                }
                if path.endswith("-v1-pod"):
                    # As the module's kustomize patches do: only JobSet pods go to the webhook.
                    hook["objectSelector"] = {
                        "matchExpressions": [{"key": keys.JOBSET_NAME, "operator": "Exists"}]
                    }
            plural = (
                "mutatingwebhookconfigurations"
                if kind == "MutatingWebhookConfiguration"
                else "validatingwebhookconfigurations"
            )
            self._api("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}", doc)

    def _crd_established(self) -> str | None:
        status, body = self._request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{JOBSET_CRD_NAME}"
        )
        if status != 200:
            return f"HTTP {status}"
        for cond in (body.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Established" and cond.get("status") == "True":
                return None
        return "not established"

    def _jobset_dry_run(self) -> str | None:
        status, body = self._request(
            "POST",
            "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets?dryRun=All",
            {
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
            },
        )
        return None if status == 201 else f"HTTP {status}: {body.get('message', body)}"

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
    cp = ControlPlane(args.profile, workdir=workdir)
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
    up.add_argument("--profile", choices=PROFILES, default="cluster")
    up.add_argument("--detach", action="store_true", help="return once ready; stop with `down`")
    down = sub.add_parser("down", help="stop a control plane started by `up`")
    down.add_argument("--profile", choices=PROFILES, default="cluster")
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
