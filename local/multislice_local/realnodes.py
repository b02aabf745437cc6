"""Real nodes for a local control plane: real kubelets, containerd and runc running real pods.

Everything below the API server is played by kwok in the other profiles; here each node is a
"host" of its own on this machine (docs/real-nodes.md):

* its own **network namespace** with one interface (``eth0``, a veth into a bridge the stack
  creates in the host's namespace), so ``hostNetwork`` pods of two nodes never share ports, and a
  **UTS namespace** (its hostname is the node's name);
* its own **mount namespace**, where a directory of the node's is bind-mounted over ``/var`` and
  ``/run``: containerd's and the kubelet's state, pod network namespaces, CNI caches, container
  logs and shim sockets never touch the host's;
* its own containerd (with the runc and CNI plugins built by ``hack/build-bins.sh --nodes``),
  kubelet (its own ``system:node:<name>`` identity and serving certificate), cgroup root, CNI bridge
  and pod subnet, and, on TPU nodes, the project's device plugin advertising ``google.com/tpu``.

The cluster's addresses are private and stay on the machine: slot ``s`` (one per running cluster,
so two can run at once) owns ``10.(200+s).0.0/16``, which the host routes nowhere but to its
bridge (an ``unreachable`` route for the rest); the host's ``ip_forward`` is never touched, nodes
have no default route, and nothing is masqueraded. The API server listens on ``10.(200+s).1.1:443``,
the first address of the service CIDR, i.e. the ``kubernetes`` Service's ClusterIP, which is on the
host end of the bridge: in-cluster clients find it through ``KUBERNETES_SERVICE_HOST`` with no
kube-proxy (there is no iptables here). CoreDNS (the cluster DNS, ``10.(200+s).1.10``) runs beside
the control plane and resolves Services and pod hostnames (``<host>.<subdomain>.<ns>.svc...``).

Images come from OCI archives (:mod:`multislice_local.oci`), imported into every node's containerd
(``ctr images import``, namespace ``k8s.io``): the pause image (Kubernetes' ``pause.c``) and the
tests' probe image (``local/go/msj-probe``) at start, anything else with
:meth:`RealCluster.import_image`.
Pods use them with ``imagePullPolicy: IfNotPresent`` or ``Never``; there is no registry.

API::

    with RealCluster(nodes=default_nodes(), profile="cluster") as cluster:
        cluster.cp                          # the ControlPlane (kubeconfig, api_client())
        ref = cluster.import_image(archive) # e.g. the operator image, on every node
        cluster.node_ip("tpu-a-0")

:func:`unavailable_reason` says in one line why this host cannot run real nodes (None if it can);
:func:`sweep` removes what a crashed run left (every start runs it first).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml

from multislice_local import oci
from multislice_local.controlplane import (
    BUILD_SCRIPT,
    ControlPlane,
    NodeNetwork,
    _die_with_parent,
    _free_port,
    _kubeconfig,
    _Proc,
    _tail,
    _terminate,
    spawn_logged,
    wait_until,
)
from multislice_operator.common import keys

log = logging.getLogger(__name__)

PREFIX = "msj"  # every link, cgroup and directory of ours starts with it (the sweep finds them)
SLOTS = 8  # clusters that can run at once: slot s owns 10.(200+s).0.0/16
LOCK_DIR = Path("/run/msj-realnodes")
CGROUP_FS = Path("/sys/fs/cgroup")
# What kubelets need mounted (cgroup v1; this machine's kernel has a cgroup2 mount beside them).
CGROUP_V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer")
PAUSE_IMAGE = "msj.local/pause:3.10.2"
PROBE_IMAGE = "msj.local/probe:1"
PROBE_BINARY = "/msj-probe"  # where the probe image has its program
CLUSTER_DOMAIN = "cluster.local"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"  # inside a node's mount namespace
KUBELET_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
TPU_TAINT = f"{keys.TPU_RESOURCE}=present:NoSchedule"


class RealNodesError(RuntimeError):
    """A node failed to start or become Ready; the message carries the component's log tail."""


class RealNodesUnavailable(RealNodesError):
    """This host cannot run real nodes; the message is one line naming what is missing."""


# ------------------------------------------------------------------------------ node specs


@dataclass(frozen=True)
class NodeSpec:
    """One real node: its name, the labels and taints it registers with, and how many TPU chips
    the device plugin advertises on it (0: no plugin, no ``google.com/tpu``)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()  # "key=value:Effect", as the kubelet's registerWithTaints
    tpu_chips: int = 0


def tpu_pool(
    pool: str,
    hosts: int = 2,
    accelerator: str = "tpu-v5-lite-podslice",
    topology: str = "2x4",
    chips_per_host: int = 4,
) -> list[NodeSpec]:
    """The nodes of one GKE TPU node pool (labels and taint as GKE sets them; facts.md 2): by
    default a ``v5litepod-8`` slice, two 4-chip hosts of topology ``2x4``."""
    labels = {
        keys.GKE_NODEPOOL: pool,
        keys.GKE_TPU_ACCELERATOR: accelerator,
        keys.GKE_TPU_TOPOLOGY: topology,
    }
    return [NodeSpec(f"{pool}-{i}", labels, (TPU_TAINT,), chips_per_host) for i in range(hosts)]


def plain_node(name: str = "cpu-0", pool: str = "default-pool") -> NodeSpec:
    """A node with no TPU and no taint (where an operator Deployment runs)."""
    return NodeSpec(name, {keys.GKE_NODEPOOL: pool})


def default_nodes() -> list[NodeSpec]:
    """Two ``v5litepod-8`` pools of two hosts (a 2-slice x 2-host job) and one plain node."""
    return [*tpu_pool("tpu-a"), *tpu_pool("tpu-b"), plain_node()]


def _check_specs(specs: Sequence[NodeSpec]) -> None:
    names = [s.name for s in specs]
    if not specs or len(specs) > 120:
        raise ValueError(f"nodes: give 1 to 120 NodeSpecs, not {len(specs)}")
    if len(set(names)) != len(names):
        raise ValueError(f"nodes: names must be unique: {names}")
    for spec in specs:
        if not spec.name.replace("-", "").isalnum() or spec.name != spec.name.lower():
            raise ValueError(f"nodes: {spec.name!r}: use lower-case letters, digits and '-'")
        for key in spec.labels:
            if key.split("/")[0].endswith(("kubernetes.io", "k8s.io")):
                raise ValueError(
                    f"nodes: {spec.name} label {key}: the kubelet may not set kubernetes.io "
                    "labels (NodeRestriction); use another prefix"
                )
        for taint in spec.taints:
            if "=" not in taint or ":" not in taint:
                raise ValueError(f"nodes: {spec.name} taint {taint!r}: write key=value:Effect")


# ------------------------------------------------------------------------- the host checked


def unavailable_reason() -> str | None:
    """None when this host can run real nodes, else one line: what is missing and how to run
    the real-node tests."""
    how = "run them as root on a Linux host with cgroup v1 controllers (as CI does)"
    if sys.platform != "linux":
        return f"real nodes need Linux, not {sys.platform}; {how}"
    if os.geteuid() != 0:
        return f"real nodes need root (namespaces, cgroups, mounts, bridges); {how}"
    missing = [t for t in ("ip", "unshare", "nsenter", "mount") if shutil.which(t) is None]
    if missing:
        return f"real nodes need {', '.join(missing)} on PATH (iproute2, util-linux); {how}"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return f"real nodes need overlayfs (containerd's snapshotter): modprobe overlay; {how}"
    absent = [c for c in CGROUP_V1_CONTROLLERS if not (CGROUP_FS / c / "cgroup.procs").exists()]
    if absent:
        return (
            f"real nodes need the cgroup v1 controllers {', '.join(absent)} mounted under "
            f"{CGROUP_FS} (a cgroup v2-only host is not supported yet); {how}"
        )
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"real nodes need new namespaces (unshare: {probe.stderr.strip()}); {how}"
    return None


# ------------------------------------------------------------------------------ binaries


@dataclass(frozen=True)
class NodeBinaries:
    root: Path  # kubelet, containerd, runc, cni/, coredns, pause
    local: Path  # the project's: tpu-device-plugin, msj-probe

    FILES = (
        "kubelet",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "cni/bridge",
        "cni/loopback",
        "cni/host-local",
        "coredns",
        "pause",
    )
    LOCAL_FILES = ("tpu-device-plugin", "msj-probe")

    def missing(self) -> list[str]:
        return [f for f in self.FILES if not (self.root / f).is_file()] + [
            f"local/{f}" for f in self.LOCAL_FILES if not (self.local / f).is_file()
        ]


def _node_dirs() -> NodeBinaries:
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-node-dirs"], check=True, capture_output=True, text=True
    )
    root, local = out.stdout.split()
    return NodeBinaries(Path(root), Path(local))


def ensure_node_binaries(verbose: bool = True) -> NodeBinaries:
    """The real nodes' binaries, built first by ``hack/build-bins.sh --nodes`` when missing
    (cold: minutes; callers at once take turns on a lock and the later ones find them built)."""
    dirs = _node_dirs()
    if not dirs.missing():
        return dirs
    dirs.root.parent.mkdir(parents=True, exist_ok=True)
    with open(dirs.root.parent / f".{dirs.root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = dirs.missing()
        if missing:
            if verbose:
                print(f"realnodes: building {', '.join(missing)} (cold: minutes)", flush=True)
            result = subprocess.run(["bash", str(BUILD_SCRIPT), "--nodes"], check=False)
            if result.returncode != 0 or dirs.missing():
                raise RealNodesError(
                    f"{BUILD_SCRIPT} --nodes failed (exit {result.returncode}); missing: "
                    f"{', '.join(dirs.missing())}"
                )
    return dirs


# ------------------------------------------------------------------------------- network


class Slot:
    """The names and addresses of one running cluster, slot ``index``: everything of it is
    named ``msj<index>...`` and addressed in ``10.(200+index).0.0/16``."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.net = f"10.{200 + index}"
        self.cidr = f"{self.net}.0.0/16"  # routed nowhere but to the bridge
        self.bridge = f"{PREFIX}{index}br"
        self.gateway = f"{self.net}.0.1"  # the host's end, on the node network
        self.service_cidr = f"{self.net}.1.0/24"  # .1: the API server (kubernetes ClusterIP)
        self.dns_ip = f"{self.net}.1.10"
        self.cgroup = f"{PREFIX}{index}"
        self.workdir = Path(tempfile.gettempdir()) / f"{PREFIX}{index}-realnodes"

    def node_ip(self, i: int) -> str:
        return f"{self.net}.0.{10 + i}"

    def pod_cidr(self, i: int) -> str:
        return f"{self.net}.{128 + i}.0/24"

    def veth(self, i: int) -> str:
        return f"{PREFIX}{self.index}v{i}"


# Every kubelet and containerd takes several inotify instances, and the kernel allows 128 per
# user by default: with a few control planes beside (the test suite's), the next kubelet fails
# with "too many open files". kind's documentation asks for 512 and more; this is the one host
# setting the real nodes change, raised once and left so (lowering it could break whoever
# started watches since).
INOTIFY_INSTANCES = 1024
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")


def _raise_inotify_limit() -> None:
    if int(INOTIFY_LIMIT.read_text()) < INOTIFY_INSTANCES:
        log.warning(
            "realnodes: raising fs.inotify.max_user_instances from %s to %d for the kubelets",
            INOTIFY_LIMIT.read_text().strip(),
            INOTIFY_INSTANCES,
        )
        INOTIFY_LIMIT.write_text(str(INOTIFY_INSTANCES))


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RealNodesError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def _create_bridge(slot: Slot) -> None:
    """The host's end of the nodes' network: a bridge with the node network's gateway address and
    the apiserver's and DNS's ClusterIPs, and the slot's range routed nowhere else."""
    _ip("link", "add", slot.bridge, "type", "bridge")
    _ip("addr", "add", f"{slot.gateway}/24", "dev", slot.bridge)
    for ip in (NodeNetwork(slot.service_cidr).apiserver_ip, slot.dns_ip):
        _ip("addr", "add", f"{ip}/32", "dev", slot.bridge)
    _ip("link", "set", slot.bridge, "up")
    # Whatever in the range has no more specific route (an unassigned ClusterIP) goes nowhere,
    # instead of out of the machine by the default route.
    _ip("route", "add", "unreachable", slot.cidr)


# ------------------------------------------------------------------------------- cgroups


def _cgroup_hierarchies() -> list[Path]:
    """Every cgroup mount under /sys/fs/cgroup (v1 hierarchies and the cgroup2 one beside)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, mountpoint = right.split()[0], Path(left.split()[4])
        if fstype in ("cgroup", "cgroup2") and mountpoint.parent == CGROUP_FS:
            found.append(mountpoint)
    return sorted(found)


def _make_cgroup(rel: str) -> None:
    """mkdir ``rel`` in every hierarchy; a new cpuset gets its parent's CPUs and memory nodes
    (an empty cpuset admits no process)."""
    for hierarchy in _cgroup_hierarchies():
        path = hierarchy
        for part in Path(rel).parts:
            path = path / part
            if path.is_dir():
                continue
            path.mkdir()
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (path / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((path.parent / name).read_text())


def _join_cgroup(rel: str) -> Callable[[], None]:
    """A preexec_fn: move the child into ``rel`` in every hierarchy before it execs, so that
    everything it starts (shims, containers) is found there by the teardown and the sweep."""
    files = [h / rel / "cgroup.procs" for h in _cgroup_hierarchies()]

    # Killed with the thread that starts it (PR_SET_PDEATHSIG), as the control plane's processes
    # are, when that is the main thread; the sweep finds the rest in the cgroup.
    die_with_parent = threading.current_thread() is threading.main_thread()

    def join() -> None:
        if die_with_parent:
            _die_with_parent()
        for procs in files:
            with contextlib.suppress(OSError):
                procs.write_text(str(os.getpid()))

    return join


def _cgroup_dirs(rel: str) -> list[Path]:
    """Every directory of ``rel``'s tree in every hierarchy, deepest first."""
    dirs: list[Path] = []
    for hierarchy in _cgroup_hierarchies():
        top = hierarchy / rel
        if top.is_dir():
            dirs.extend(Path(d) for d, _, _ in os.walk(top))
    return sorted(dirs, key=lambda d: len(d.parts), reverse=True)


def _cgroup_pids(rel: str) -> set[int]:
    pids: set[int] = set()
    for d in _cgroup_dirs(rel):
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
    return pids


def _kill_cgroup(rel: str, keep: set[int] | None = None, timeout: float = 20.0) -> None:
    """SIGKILL every process in ``rel``'s tree except ``keep``, frozen first (freezer) so that
    none forks past the kill; wait until they are gone."""
    keep = keep or set()
    freezer = CGROUP_FS / "freezer" / rel / "freezer.state"
    frozen = not keep and freezer.exists()
    if frozen:
        with contextlib.suppress(OSError):
            freezer.write_text("FROZEN")
    deadline = time.monotonic() + timeout
    try:
        while pids := _cgroup_pids(rel) - keep:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if frozen:
                with contextlib.suppress(OSError):
                    freezer.write_text("THAWED")  # a frozen process dies only once thawed
                frozen = False
            if time.monotonic() > deadline:
                raise RealNodesError(f"cgroup {rel}: processes {sorted(pids)} outlived SIGKILL")
            time.sleep(0.05)
    finally:
        if frozen:
            with contextlib.suppress(OSError):
                freezer.write_text("THAWED")


def _remove_cgroup(rel: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    for d in _cgroup_dirs(rel):
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as err:  # EBUSY while the last tasks exit
                if time.monotonic() > deadline:
                    raise RealNodesError(f"cannot remove cgroup {d}: {err}") from err
                time.sleep(0.05)


# ------------------------------------------------------------------------------ the sweep


@contextlib.contextmanager
def _slot_lock(index: int, blocking: bool) -> Iterator[bool]:
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / f"slot-{index}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


def _sweep_slot(slot: Slot) -> list[str]:
    """Remove what a run of ``slot`` left (its lock held by the caller); return what was found."""
    found = []
    if _cgroup_dirs(slot.cgroup):
        found.append(f"cgroup {slot.cgroup} ({len(_cgroup_pids(slot.cgroup))} processes)")
        _kill_cgroup(slot.cgroup)
        _remove_cgroup(slot.cgroup)
    links = _ip("-o", "link", "show").stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == slot.bridge or name.startswith(f"{PREFIX}{slot.index}v"):
            found.append(f"link {name}")
            _ip("link", "del", name, check=False)
    if slot.cidr in _ip("route", "show", "type", "unreachable").stdout:
        found.append(f"route unreachable {slot.cidr}")
        _ip("route", "del", "unreachable", slot.cidr, check=False)
    if slot.workdir.exists():
        found.append(f"directory {slot.workdir}")
        for mount in _mounts_under(slot.workdir):  # none unless a namespace outlived its nodes
            _run(["umount", "-l", mount], check=False)
        shutil.rmtree(slot.workdir, ignore_errors=True)
    return found


def _mounts_under(path: Path) -> list[str]:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    return sorted((m for m in mounts if m.startswith(f"{path}/") or m == str(path)), reverse=True)


def sweep() -> list[str]:
    """Remove what crashed runs left in every slot no live cluster holds; return what was found
    (e.g. ``["cgroup msj0 (12 processes)", "link msj0br", ...]``)."""
    found = []
    for index in range(SLOTS):
        with _slot_lock(index, blocking=False) as free:
            if free:
                found += _sweep_slot(Slot(index))
    return found


# ------------------------------------------------------------------------------- a node


@dataclass
class Node:
    """A started node: ``ip`` (its InternalIP), ``pod_cidr``, ``dir`` (its /var and /run)."""

    spec: NodeSpec
    index: int
    ip: str
    pod_cidr: str
    dir: Path
    cgroup: str
    procs: dict[str, _Proc] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def holder_pid(self) -> int:
        return self.procs["holder"].popen.pid

    def nsenter(self) -> list[str]:
        """The command prefix that runs a program inside this node (its network, mount and UTS
        namespaces), e.g. ``node.nsenter() + ["ip", "addr"]``."""
        return ["nsenter", f"--target={self.holder_pid}", "--net", "--mount", "--uts", "--"]

    @property
    def containerd_socket(self) -> Path:
        return self.dir / CONTAINERD_SOCKET.lstrip("/")


# The holder: the process whose namespaces are the node's. It binds the node's directories over
# /var and /run in its private mount namespace, names the host, and then only waits.
_HOLDER = """set -e
mount --bind "$NODE_DIR/var" /var
mount --bind "$NODE_DIR/run" /run
mount --bind "$NODE_DIR/hosts" /etc/hosts
hostname "$NODE_NAME"
ip link set lo up
touch /run/holder-ready
exec sleep infinity
"""


class RealCluster:
    """A control plane (``profile``: ``cluster`` or ``kueue``, see controlplane.py) with real
    nodes, CoreDNS and images imported; :meth:`stop` leaves nothing on the host."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec] | None = None,
        profile: str = "cluster",
        binaries: NodeBinaries | None = None,
    ) -> None:
        self.specs = list(nodes if nodes is not None else default_nodes())
        _check_specs(self.specs)
        self.profile = profile
        self._bins_arg = binaries
        self.bins = NodeBinaries(Path(), Path())
        self.slot = Slot(0)
        self.nodes: dict[str, Node] = {}
        self.cp: ControlPlane | None = None
        self._lock_cm: contextlib.AbstractContextManager[bool] | None = None
        self._dns: _Proc | None = None
        self.workdir = Path()
        self.probe_image = ""  # the tests' image's reference, once started
        # A directory every node sees at the same path (a hostPath volume there is shared by
        # all pods, as a bucket is: where a job's checkpoints go); removed by stop().
        self.shared_dir = Path()
        self.pause_image = PAUSE_IMAGE

    # -- public API -------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def control_plane(self) -> ControlPlane:
        """The started control plane (RealNodesError before start())."""
        if self.cp is not None:
            return self.cp
        raise RealNodesError("cluster not started")

    def node_ip(self, name: str) -> str:
        return self.nodes[name].ip

    def start(self, timeout: float = 300.0) -> Self:
        """Start the network, the control plane, CoreDNS and every node; return once every node
        is Ready (and a TPU node's ``google.com/tpu`` allocatable is its chip count)."""
        reason = unavailable_reason()
        if reason is not None:
            raise RealNodesUnavailable(reason)
        self.bins = self._bins_arg or ensure_node_binaries()
        deadline = time.monotonic() + timeout
        for line in sweep():
            log.warning("realnodes: removed a crashed run's %s", line)
        _raise_inotify_limit()
        self._take_slot()
        try:
            self._start(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (kubelet, containers, containerd, shims, namespaces, cgroups), CoreDNS
        and the control plane, then remove the bridge, the route and the state directory."""
        errors: list[str] = []
        nodes, self.nodes = list(self.nodes.values()), {}
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            for node, err in zip(nodes, pool.map(_stop_node_quietly, nodes), strict=True):
                if err:
                    errors.append(f"{node.name}: {err}")
        if self._dns is not None:
            _terminate(self._dns.popen)
            self._dns = None
        if self.cp is not None:
            self.cp.stop()
            self.cp = None
        if self._lock_cm is not None:
            with contextlib.suppress(RealNodesError):  # the sweep below names what stayed
                _kill_cgroup(self.slot.cgroup)
                _remove_cgroup(self.slot.cgroup)
            for leftover in _sweep_slot(self.slot):
                # The bridge, the route and the directory are ours to remove; the rest is not
                # expected after the nodes' teardown.
                if not leftover.startswith(("link", "route", "directory")):
                    errors.append(f"left over: {leftover}")
            self._lock_cm.__exit__(None, None, None)
            self._lock_cm = None
        _LIVE.discard(self)
        if errors:
            raise RealNodesError("stop: " + "; ".join(errors))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def import_image(
        self, archive: Path, nodes: Sequence[str] | None = None, tags: Sequence[str] = ()
    ) -> str:
        """Import an OCI archive into the containerd of every node (or of ``nodes``), namespace
        ``k8s.io``, unpacked for the kubelet, also named ``tags`` (as a registry would serve it
        under those names: e.g. the chart's default image); return the image's reference."""
        ref = oci.image_name(archive)
        targets = [self.nodes[n] for n in (list(self.nodes) if nodes is None else nodes)]
        if not targets:
            raise ValueError("import_image: nodes is empty; give node names or None for all")
        names = [oci.normalize_ref(t) for t in tags]
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            list(pool.map(lambda node: self._import(node, archive, ref, names), targets))
        return ref

    def log_tail(self, node: str, component: str, lines: int = 40) -> str:
        return _tail(self.nodes[node].procs[component].log, lines)

    # -- startup ----------------------------------------------------------------------------

    def _take_slot(self) -> None:
        for index in range(SLOTS):
            cm = _slot_lock(index, blocking=False)
            if cm.__enter__():
                self.slot, self._lock_cm = Slot(index), cm
                _LIVE.add(self)
                return
            cm.__exit__(None, None, None)
        raise RealNodesError(f"all {SLOTS} real-node slots are taken by running clusters")

    def _start(self, deadline: float) -> None:
        slot = self.slot
        _sweep_slot(slot)  # ours now: nothing of an earlier run may be in the way
        self.workdir = slot.workdir
        (self.workdir / "logs").mkdir(parents=True)
        self.shared_dir = self.workdir / "shared"
        self.shared_dir.mkdir()
        _create_bridge(slot)
        _make_cgroup(slot.cgroup)
        self.cp = ControlPlane(
            self.profile,
            workdir=self.workdir / "controlplane",
            network=NodeNetwork(slot.service_cidr),
        ).start(timeout=max(30.0, deadline - time.monotonic()))
        self._start_dns(deadline)
        archives = self._write_images()
        self.nodes = {
            spec.name: Node(
                spec,
                i,
                slot.node_ip(i),
                slot.pod_cidr(i),
                self.workdir / "nodes" / spec.name,
                f"{slot.cgroup}/{spec.name}",
            )
            for i, spec in enumerate(self.specs)
        }
        for node in self.nodes.values():
            self._start_holder(node)
        for node in self.nodes.values():
            self._wire(node)
            self._start_containerd(node)
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            list(pool.map(lambda n: self._await_containerd(n, deadline), self.nodes.values()))
        for archive in archives:
            self.import_image(archive)
        for node in self.nodes.values():
            self._start_kubelet(node)
            if node.spec.tpu_chips:
                self._start_device_plugin(node)
        for node in self.nodes.values():
            self._await_ready(node, deadline)

    def _spawn(
        self,
        name: str,
        argv: list[str],
        cgroup: str,
        env: Mapping[str, str] | None = None,
        log_name: str | None = None,
    ) -> _Proc:
        path = self.workdir / "logs" / f"{log_name or name}.log"
        return spawn_logged(
            log_name or name, argv, path, dict(env or {}), preexec_fn=_join_cgroup(cgroup)
        )

    @staticmethod
    def _wait(
        what: str, check: Callable[[], str | None], deadline: float, proc: _Proc | None
    ) -> None:
        transient = (OSError, subprocess.SubprocessError, ValueError, KeyError)
        wait_until(proc, check, deadline, what, RealNodesError, transient)

    # -- DNS

    def _start_dns(self, deadline: float) -> None:
        cp, slot = self.control_plane, self.slot
        ready_port = _free_port()
        corefile = self.workdir / "dns" / "Corefile"
        corefile.parent.mkdir()
        # Only the cluster's zones: a name outside them is refused, never forwarded off the
        # machine.
        corefile.write_text(
            f""".:53 {{
    bind {slot.dns_ip}
    ready 127.0.0.1:{ready_port}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {cp.kubeconfig}
    }}
}}
"""
        )
        self._dns = self._spawn(
            "coredns", [str(self.bins.root / "coredns"), "-conf", str(corefile)], slot.cgroup
        )
        cp._api(
            "POST",
            "/api/v1/namespaces/kube-system/services",
            {
                "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
                "spec": {
                    "clusterIP": slot.dns_ip,
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP"},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                    ],
                },
            },
        )
        url = f"http://127.0.0.1:{ready_port}/ready"
        self._wait("CoreDNS /ready", lambda: _http_ok(url), deadline, self._dns)

    # -- images

    def _write_images(self) -> list[Path]:
        images = self.workdir / "images"
        images.mkdir()
        pause = oci.files_layer({"pause": ((self.bins.root / "pause").read_bytes(), 0o755)})
        probe_bin = (self.bins.local / "msj-probe").read_bytes()
        probe = oci.files_layer({PROBE_BINARY: (probe_bin, 0o755)})
        written = [
            oci.write_oci_archive(
                images / "pause.tar", [pause], {"Entrypoint": ["/pause"]}, PAUSE_IMAGE
            ),
            oci.write_oci_archive(
                images / "probe.tar",
                [probe],
                {"Entrypoint": [PROBE_BINARY], "Cmd": ["sleep"]},
                PROBE_IMAGE,
            ),
        ]
        self.probe_image = written[1].ref
        return [image.path for image in written]

    def _import(self, node: Node, archive: Path, ref: str, tags: Sequence[str]) -> None:
        ctr = [str(self.bins.root / "ctr"), f"--address={node.containerd_socket}", "-n", "k8s.io"]
        _run([*ctr, "images", "import", "--platform=linux/amd64", str(archive)])
        if tags:
            _run([*ctr, "images", "tag", "--force", ref, *tags])

    # -- a node's processes

    def _start_holder(self, node: Node) -> None:
        for sub in ("var/lib", "var/log", "run", "etc/cni/net.d", "pki"):
            (node.dir / sub).mkdir(parents=True, exist_ok=True)
        (node.dir / "var" / "run").symlink_to("/run")  # as on the host: /var/run -> /run
        # A GCE VM's /etc/hosts names the VM at its address (its guest agent writes the line), and
        # a hostNetwork pod gets its node's: JAX's CPU collectives (gloo) resolve the hostname.
        (node.dir / "hosts").write_text(
            f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            f"{node.ip}\t{node.name}\n"
        )
        _make_cgroup(node.cgroup)
        argv = [
            "unshare",
            "--net",
            "--mount",
            "--uts",
            "--propagation=private",
            "--",
            "sh",
            "-c",
            _HOLDER,
        ]
        env = {"NODE_DIR": str(node.dir), "NODE_NAME": node.name}
        node.procs["holder"] = self._spawn(
            "holder", argv, node.cgroup, env, log_name=f"{node.name}-holder"
        )

    def _wire(self, node: Node) -> None:
        """The node's eth0 (a veth into the bridge), its address, and its routes: the service
        range through the host, every other node's pod subnet through that node."""
        ready = node.dir / "run" / "holder-ready"
        self._wait(
            f"{node.name} namespaces",
            lambda: None if ready.exists() else "not yet",
            time.monotonic() + 30,
            node.procs["holder"],
        )
        slot, veth = self.slot, self.slot.veth(node.index)
        _ip(
            "link",
            "add",
            veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            str(node.holder_pid),
        )
        _ip("link", "set", veth, "master", slot.bridge, "up")
        inside = [*node.nsenter(), "ip"]
        _run([*inside, "addr", "add", f"{node.ip}/24", "dev", "eth0"])
        _run([*inside, "link", "set", "eth0", "up"])
        _run([*inside, "route", "add", slot.service_cidr, "via", slot.gateway])
        for other in self.nodes.values():
            if other is not node:
                _run([*inside, "route", "add", other.pod_cidr, "via", other.ip])
        # The node routes its pods' traffic (its own namespace's forwarding, not the host's).
        _run([*node.nsenter(), "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
        _ip("route", "add", node.pod_cidr, "via", node.ip)  # the host's replies to pod IPs

    def _start_containerd(self, node: Node) -> None:
        config = node.dir / "containerd.toml"
        config.write_text(_containerd_config(self.bins, node))
        (node.dir / "etc/cni/net.d/10-msj.conflist").write_text(
            json.dumps(_cni_config(node), indent=2)
        )
        path = f"{self.bins.root}:{os.environ.get('PATH', '/usr/bin:/bin')}"  # its shim
        node.procs["containerd"] = self._spawn(
            "containerd",
            [*node.nsenter(), str(self.bins.root / "containerd"), f"--config={config}"],
            node.cgroup,
            {"PATH": path},
            log_name=f"{node.name}-containerd",
        )

    def _await_containerd(self, node: Node, deadline: float) -> None:
        ctr = [str(self.bins.root / "ctr"), f"--address={node.containerd_socket}", "version"]

        def check() -> str | None:
            done = _run(ctr, check=False)
            return None if done.returncode == 0 else done.stderr.strip()[-200:]

        self._wait(f"{node.name} containerd", check, deadline, node.procs["containerd"])

    def _start_kubelet(self, node: Node) -> None:
        cp = self.control_plane
        ca = cp.ca
        pki = node.dir / "pki"
        cert, key = ca.issue(f"system:node:{node.name}", ("system:nodes",))
        kubeconfig = pki / "kubelet.kubeconfig"
        kubeconfig.write_text(_kubeconfig(cp.server, ca.pem, cert, key, f"system:node:{node.name}"))
        kubeconfig.chmod(0o600)
        serving_cert, serving_key = ca.issue(node.name, server=True, hosts=(node.ip, node.name))
        (pki / "kubelet.crt").write_bytes(serving_cert)
        (pki / "kubelet.key").write_bytes(serving_key)
        (pki / "kubelet.key").chmod(0o600)
        (pki / "ca.crt").write_bytes(ca.pem)
        (node.dir / "resolv.conf").write_text("# real nodes: no DNS beyond the cluster's\n")
        config = node.dir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(_kubelet_config(node, self.slot)))
        labels = ",".join(f"{k}={v}" for k, v in sorted(node.spec.labels.items()))
        argv = [
            *node.nsenter(),
            str(self.bins.root / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={node.name}",
            f"--node-ip={node.ip}",
            *([f"--node-labels={labels}"] if labels else []),
            "--v=1",
        ]
        node.procs["kubelet"] = self._spawn(
            "kubelet", argv, node.cgroup, log_name=f"{node.name}-kubelet"
        )

    def _start_device_plugin(self, node: Node) -> None:
        argv = [
            *node.nsenter(),
            str(self.bins.local / "tpu-device-plugin"),
            f"--plugin-dir={KUBELET_PLUGIN_DIR}",
            f"--chips={node.spec.tpu_chips}",
            f"--resource={keys.TPU_RESOURCE}",
        ]
        node.procs["tpu-device-plugin"] = self._spawn(
            "tpu-device-plugin", argv, node.cgroup, log_name=f"{node.name}-tpu-device-plugin"
        )

    def _await_ready(self, node: Node, deadline: float) -> None:
        cp = self.control_plane

        def check() -> str | None:
            status, body = cp._request("GET", f"/api/v1/nodes/{node.name}")
            if status != 200:
                return f"node object: HTTP {status}"
            conditions = {c["type"]: c["status"] for c in body["status"].get("conditions", [])}
            if conditions.get("Ready") != "True":
                return f"Ready={conditions.get('Ready')}"
            chips = body["status"].get("allocatable", {}).get(keys.TPU_RESOURCE, "0")
            if int(chips) != node.spec.tpu_chips:
                return f"{keys.TPU_RESOURCE} allocatable {chips}, want {node.spec.tpu_chips}"
            return None

        self._wait(f"node {node.name} Ready", check, deadline, node.procs["kubelet"])


def _http_ok(url: str) -> str | None:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as resp:
        return None if resp.status == 200 else f"HTTP {resp.status}"


def _stop_node_quietly(node: Node) -> str | None:
    try:
        _stop_node(node)
    except Exception as err:  # one node's trouble must not keep the others running
        return str(err)
    return None


def _stop_node(node: Node) -> None:
    """kubelet, then the pods' containers, containerd, every leftover (shims), the holder (its
    namespaces, mounts and eth0 go with it), the cgroups."""
    procs = node.procs
    if "tpu-device-plugin" in procs:
        _terminate(procs["tpu-device-plugin"].popen, grace=5)
    if "kubelet" in procs:
        _terminate(procs["kubelet"].popen, grace=10)
    daemons = {p.popen.pid for p in procs.values()}
    _kill_cgroup(node.cgroup, keep=daemons)  # containers and shims
    if "containerd" in procs:
        _terminate(procs["containerd"].popen, grace=10)
    _kill_cgroup(node.cgroup)
    for proc in procs.values():
        _terminate(proc.popen, grace=1)
    _remove_cgroup(node.cgroup)


# ---------------------------------------------------------------------- configuration files


def _containerd_config(bins: NodeBinaries, node: Node) -> str:
    """containerd 2.x config (version 3). /var and /run are the node's own (its mount namespace),
    so the default state paths stay off the host."""
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{node.dir / "opt"}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[{runtime}]
  # No CAP_SYS_RESOURCE on these machines (facts.md 14): nothing may lower its oom_score_adj.
  restrict_oom_score_adj = true
  [{runtime}.containerd]
    default_runtime_name = "runc"
  [{runtime}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [{runtime}.containerd.runtimes.runc.options]
      BinaryName = "{bins.root / "runc"}"
      SystemdCgroup = false
  [{runtime}.cni]
    bin_dirs = ["{bins.root / "cni"}"]
    conf_dir = "{node.dir / "etc/cni/net.d"}"
"""


def _cni_config(node: Node) -> dict[str, Any]:
    """A bridge in the node's namespace with the pods' gateway (so ip_forward is the node's,
    never the host's), host-local addresses from the node's pod subnet, no masquerading."""
    subnet = ipaddress.ip_network(node.pod_cidr)
    return {
        "cniVersion": "1.0.0",
        "name": f"{PREFIX}-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "isDefaultGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(subnet), "gateway": str(subnet[1])}]],
                },
            }
        ],
    }


def _kubelet_config(node: Node, slot: Slot) -> dict[str, Any]:
    pki = node.dir / "pki"
    none = "0%"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # These machines have cgroup v1 (facts.md 14): kubelet 1.35+ refuses it unless told.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{node.cgroup}",
        # No CAP_SYS_RESOURCE: the kubelet may not lower its own oom_score_adj either.
        "oomScoreAdj": 0,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "address": node.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": str(pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [slot.dns_ip],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(node.dir / "resolv.conf"),
        "registerWithTaints": [_taint(t) for t in node.spec.taints],
        # A shared, busy disk and memory on a test machine are no reason to evict anything;
        # images are imported once and never pulled again: no image garbage collection.
        "evictionHard": {
            "memory.available": none,
            "nodefs.available": none,
            "nodefs.inodesFree": none,
            "imagefs.available": none,
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "shutdownGracePeriod": "0s",
        "serializeImagePulls": False,
    }


def _taint(text: str) -> dict[str, str]:
    key_value, effect = text.rsplit(":", 1)
    key, _, value = key_value.partition("=")
    return {"key": key, "value": value, "effect": effect}


# Started clusters, stopped at exit if their owner did not.
_LIVE: set[RealCluster] = set()


def _stop_all() -> None:
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.stop()


atexit.register(_stop_all)


# ------------------------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multislice_local.realnodes")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster with real nodes; Ctrl-C stops it")
    up.add_argument("--profile", choices=("cluster", "kueue"), default="cluster")
    sub.add_parser("sweep", help="remove what crashed runs left")
    sub.add_parser("check", help="say whether this host can run real nodes")
    sub.add_parser("bins", help="build the real nodes' binaries where this host can run them")
    args = parser.parse_args(argv)
    if args.command in ("check", "bins"):
        reason = unavailable_reason()
        print(reason or "this host can run real nodes")
        if args.command == "bins":
            if reason is None:
                print(ensure_node_binaries().root)
            return 0  # nothing to build here: the real-node tests skip
        return 1 if reason else 0
    if args.command == "sweep":
        for line in sweep():
            print(f"removed {line}")
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    started = time.monotonic()
    with RealCluster(profile=args.profile) as cluster:
        print(f"real nodes ready in {time.monotonic() - started:.1f} s")
        print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
        for node in cluster.nodes.values():
            print(f"  {node.name}: {node.ip}, logs {cluster.workdir / 'logs'}/{node.name}-*.log")
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
