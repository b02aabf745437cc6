"""Real nodes (multislice_local.realnodes): real kubelets, containerd and runc run the pods.

One session cluster (the ``real_cluster`` fixture: two v5litepod-8 pools of two hosts and a plain
node) serves the tests that run pods; the teardown tests start clusters of their own in another
slot and look at the host itself (links, routes, mounts, cgroups, processes, namespaces) after a
stop and after a crashed run's sweep. Where the host cannot run containers (not root, no
overlayfs, no cgroup controllers), every test is skipped with the one line
``realnodes.unavailable_reason()`` gives.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from multislice_local import oci, realnodes
from multislice_local.controlplane import ensure_binaries
from multislice_operator.common import keys

POD_TIMEOUT = 120.0  # a loaded 2-core machine; a pod usually runs within seconds
TOLERATE_TPU = [{"key": keys.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]


# ----------------------------------------------------------------------------------- helpers


@pytest.fixture
def ns(real_cluster: realnodes.RealCluster, namespace: Callable[..., str]) -> str:
    return namespace(real_cluster.control_plane, "rn")


@pytest.fixture
def core(real_cluster: realnodes.RealCluster) -> Iterator[client.CoreV1Api]:
    api_client = real_cluster.control_plane.api_client()
    yield client.CoreV1Api(api_client)
    api_client.close()


def _pod(
    cluster: realnodes.RealCluster,
    name: str,
    args: list[str],
    node: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": cluster.probe_image,
        "imagePullPolicy": "Never",
        "args": args,
        **spec.pop("container", {}),
    }
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [container, *spec.pop("sidecars", [])],
            **({"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}),
            **spec,
        },
    }
    if node and node.startswith("tpu-"):
        body["spec"].setdefault("tolerations", TOLERATE_TPU)
    return body


def _raw_pod(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any]:
    """The pod as the API server has it (the client's models drop fields newer than they are)."""
    resp = core.read_namespaced_pod(name, ns, _preload_content=False)
    return dict(json.loads(resp.data))


def _wait_pod(
    core: client.CoreV1Api,
    ns: str,
    name: str,
    check: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = POD_TIMEOUT,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] = {}
    while time.monotonic() < deadline:
        pod = _raw_pod(core, ns, name)
        if check(pod):
            return pod
        time.sleep(0.5)
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    lines = "\n".join(f"  {e.reason}: {e.message}" for e in events)
    raise AssertionError(f"pod {ns}/{name}: no {what} in {timeout} s: {pod.get('status')}\n{lines}")


def _phase(phase: str) -> Callable[[dict[str, Any]], bool]:
    return lambda pod: pod.get("status", {}).get("phase") == phase


def _running(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return bool(statuses) and all("running" in s.get("state", {}) for s in statuses)


def _kubectl(cluster: realnodes.RealCluster, *args: str) -> str:
    cp = cluster.control_plane
    done = subprocess.run(
        [str(ensure_binaries() / "kubectl"), *args],
        env=cp.client_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _run_to_end(
    cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str, body: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """Create the pod, wait for it to end (Succeeded or Failed), return it and its logs."""
    name = body["metadata"]["name"]
    core.create_namespaced_pod(ns, body)
    pod = _wait_pod(
        core, ns, name, lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "end"
    )
    return pod, _kubectl(cluster, "logs", "-n", ns, name, "-c", "main")


# ------------------------------------------------------------------------------ the nodes


def test_nodes_register_as_gke_tpu_pools_with_chips_from_the_device_plugin(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api
) -> None:
    nodes = {n["metadata"]["name"]: n for n in _raw_nodes(core)}
    assert set(nodes) == {"tpu-a-0", "tpu-a-1", "tpu-b-0", "tpu-b-1", "cpu-0"}
    for name, node in nodes.items():
        labels, status = node["metadata"]["labels"], node["status"]
        addresses = {a["type"]: a["address"] for a in status["addresses"]}
        assert addresses["InternalIP"] == real_cluster.node_ip(name)
        info = status["nodeInfo"]
        assert info["kubeletVersion"] == "v1.36.3"
        assert info["containerRuntimeVersion"] == "containerd://2.4.2"
        # Kubernetes 1.36 kubelets declare the features pods may need (NodeDeclaredFeatures).
        assert "RestartAllContainersOnContainerExits" in status.get("declaredFeatures", [])
        taints = [(t["key"], t.get("value"), t["effect"]) for t in node["spec"].get("taints", [])]
        if name.startswith("tpu-"):
            assert labels[keys.GKE_NODEPOOL] == name.rsplit("-", 1)[0]
            assert labels[keys.GKE_TPU_ACCELERATOR] == "tpu-v5-lite-podslice"
            assert labels[keys.GKE_TPU_TOPOLOGY] == "2x4"
            assert taints == [(keys.TPU_RESOURCE, "present", "NoSchedule")]
            assert status["capacity"][keys.TPU_RESOURCE] == "4"
            assert status["allocatable"][keys.TPU_RESOURCE] == "4"
        else:
            assert taints == []
            assert keys.TPU_RESOURCE not in status["capacity"]


def _raw_nodes(core: client.CoreV1Api) -> list[dict[str, Any]]:
    return list(json.loads(core.list_node(_preload_content=False).data)["items"])


# -------------------------------------------------------------------------------- the pods


def test_a_pod_runs_with_downward_api_env_and_its_logs_come_back(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str
) -> None:
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "SLICE", "value": "1"},
        {"name": "COORDINATOR", "value": "$(POD_NAME).sub:8080"},
    ]
    body = _pod(real_cluster, "env", ["env"], "cpu-0", container={"env": env})
    pod, logs = _run_to_end(real_cluster, core, ns, body)
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    printed = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
    assert printed["POD_NAME"] == "env"
    assert printed["NODE_NAME"] == "cpu-0"
    assert printed["POD_IP"] == pod["status"]["podIP"]
    assert ipaddress.ip_address(pod["status"]["podIP"]) in _subnet(real_cluster, "cpu-0")
    assert printed["COORDINATOR"] == "env.sub:8080"
    assert printed["KUBERNETES_SERVICE_PORT"] == "443"


def _subnet(cluster: realnodes.RealCluster, node: str) -> Any:
    return ipaddress.ip_network(cluster.nodes[node].pod_cidr)


def test_a_failing_container_reports_its_exit_code_and_termination_message(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str
) -> None:
    message = '{"step": 120, "checkpointStep": 100}'
    body = _pod(real_cluster, "fails", ["exit", "42", message], "tpu-b-1")
    pod, _ = _run_to_end(real_cluster, core, ns, body)
    assert pod["status"]["phase"] == "Failed"
    (status,) = pod["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert terminated["exitCode"] == 42
    assert terminated["message"] == message
    assert pod["spec"]["nodeName"] == "tpu-b-1"


def test_an_imported_image_runs_with_its_config_where_it_was_imported(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str, tmp_path: Path
) -> None:
    program = (real_cluster.bins.local / "msj-probe").read_bytes()
    layer = oci.files_layer({"bin/probe": (program, 0o755)})
    config = {"Entrypoint": ["/bin/probe"], "Cmd": ["env"], "Env": [f"IMAGE_OF={ns}"]}
    image = oci.write_oci_archive(tmp_path / "img.tar", [layer], config, f"msj.local/{ns}:1")
    assert real_cluster.import_image(image.path, nodes=["cpu-0"]) == f"msj.local/{ns}:1"
    for name, node in (("here", "cpu-0"), ("not-here", "tpu-a-1")):
        body = _pod(real_cluster, name, [], node)  # no args: the image's Cmd
        body["spec"]["containers"][0]["image"] = image.ref
        del body["spec"]["containers"][0]["args"]
        core.create_namespaced_pod(ns, body)
    pod = _wait_pod(core, ns, "here", _phase("Succeeded"), "success")
    logs = _kubectl(real_cluster, "logs", "-n", ns, "here")
    assert f"IMAGE_OF={ns}" in logs.splitlines()  # the image's Env, run by its Entrypoint
    # With no registry digest, the CRI's image ID is the config's digest.
    assert pod["status"]["containerStatuses"][0]["imageID"].endswith(image.config_digest)
    waiting = _wait_pod(
        core,
        ns,
        "not-here",
        lambda p: any(
            s.get("state", {}).get("waiting", {}).get("reason") == "ErrImageNeverPull"
            for s in p["status"].get("containerStatuses", [])
        ),
        "ErrImageNeverPull",
    )
    assert waiting["spec"]["nodeName"] == "tpu-a-1"


def test_a_host_path_in_the_shared_dir_is_one_directory_for_every_node(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str
) -> None:
    # Where a job's checkpoints go (a stand-in for gs://): written on one node, read on another.
    shared = real_cluster.shared_dir / ns
    shared.mkdir()
    volume = {"name": "ckpt", "hostPath": {"path": str(shared), "type": "Directory"}}
    mount = {"volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}
    for name, node in (("writer", "tpu-a-0"), ("reader", "tpu-b-1")):
        body = _pod(
            real_cluster,
            name,
            ["starts", "/ckpt/steps"],
            node,
            container=mount,
            volumes=[volume],
        )
        pod, logs = _run_to_end(real_cluster, core, ns, body)
        assert pod["status"]["phase"] == "Succeeded", logs
    assert logs.strip() == "start 2"  # the reader found the writer's line
    assert len((shared / "steps").read_text().splitlines()) == 2


def test_host_network_pods_of_two_nodes_bind_one_port_and_reach_each_other(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str
) -> None:
    # TPU pods run with hostNetwork: the workload's coordinator and JobSet's in-place agent
    # (8081) bind the same ports on every host.
    for node in ("tpu-a-0", "tpu-a-1"):
        body = _pod(real_cluster, f"serve-{node}", ["serve", ":8081"], node, hostNetwork=True)
        core.create_namespaced_pod(ns, body)
    for node in ("tpu-a-0", "tpu-a-1"):
        _wait_pod(core, ns, f"serve-{node}", _running, "running server")
    for client_node, server_node in (("tpu-a-0", "tpu-a-1"), ("tpu-a-1", "tpu-a-0")):
        address = f"{real_cluster.node_ip(server_node)}:8081"
        body = _pod(
            real_cluster, f"dial-{client_node}", ["dial", address], client_node, hostNetwork=True
        )
        pod, logs = _run_to_end(real_cluster, core, ns, body)
        assert pod["status"]["phase"] == "Succeeded", logs
        assert logs.strip() == server_node  # the server's hostname: its node's
        assert pod["status"]["podIP"] == real_cluster.node_ip(client_node)
    # kubectl exec: the API server streams from the kubelet at its InternalIP.
    address = f"{real_cluster.node_ip('tpu-a-1')}:8081"
    out = _kubectl(
        real_cluster, "exec", "-n", ns, "serve-tpu-a-0", "--", "/msj-probe", "dial", address
    )
    assert out.strip() == "tpu-a-1"


def test_a_pod_hostname_under_a_headless_service_resolves_in_other_pods(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str
) -> None:
    # As JobSet makes them: a headless Service named after the subdomain, publishing addresses
    # before the pods are ready, and a hostNetwork TPU pod <jobset>-<rjob>-0-0.<subdomain>.
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "js"},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "js"},
                "publishNotReadyAddresses": True,
            },
        },
    )
    coordinator = _pod(
        real_cluster,
        "js-slice-0-0",
        ["sleep"],
        "tpu-b-0",
        hostNetwork=True,
        dnsPolicy="ClusterFirstWithHostNet",
        hostname="js-slice-0-0",
        subdomain="js",
        labels={"app": "js"},
    )
    core.create_namespaced_pod(ns, coordinator)
    _wait_pod(core, ns, "js-slice-0-0", _running, "running coordinator")
    name = "js-slice-0-0.js"  # the pods' search path completes it: <ns>.svc.cluster.local
    for client_node, host_network in (("cpu-0", False), ("tpu-b-1", True)):
        body = _pod(
            real_cluster,
            f"resolve-{client_node}",
            ["resolve", name, "60"],
            client_node,
            hostNetwork=host_network,
            dnsPolicy="ClusterFirstWithHostNet" if host_network else "ClusterFirst",
        )
        pod, logs = _run_to_end(real_cluster, core, ns, body)
        assert pod["status"]["phase"] == "Succeeded", logs
        assert logs.split() == [real_cluster.node_ip("tpu-b-0")]


def test_a_host_network_pod_resolves_its_nodes_hostname_to_the_nodes_address(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str
) -> None:
    """A GCE VM's /etc/hosts names the VM (its guest agent writes it), and a hostNetwork pod's
    hosts file is its node's: JAX's CPU collectives (gloo) resolve the hostname to bind there.
    Unresolved, every process of a real job died in gloo (device.cc:99, getaddrinfo -3)."""
    body = _pod(
        real_cluster,
        "own-name",
        ["resolve", "tpu-b-1", "60"],
        "tpu-b-1",
        hostNetwork=True,
        dnsPolicy="ClusterFirstWithHostNet",
    )
    pod, logs = _run_to_end(real_cluster, core, ns, body)
    assert pod["status"]["phase"] == "Succeeded", logs
    assert logs.split() == [real_cluster.node_ip("tpu-b-1")]


def test_in_cluster_clients_reach_the_apiserver_through_the_kubernetes_service(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str
) -> None:
    rbac = client.RbacAuthorizationV1Api(core.api_client)
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "read-pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "read-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-pods",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
        },
    )
    _wait_for_service_account(core, ns)
    path = f"/api/v1/namespaces/{ns}/pods"
    for name, node, host_network in (("api-pod", "cpu-0", False), ("api-host", "tpu-a-1", True)):
        body = _pod(real_cluster, name, ["kube", path], node, hostNetwork=host_network)
        pod, logs = _run_to_end(real_cluster, core, ns, body)
        assert pod["status"]["phase"] == "Succeeded", logs
        status, _, answer = logs.partition("\n")
        assert status == "200", logs
        listed = {p["metadata"]["name"] for p in json.loads(answer)["items"]}
        assert name in listed  # its own pod, read with its own token
        env = _kubectl(real_cluster, "get", "pod", "-n", ns, name, "-o", "json")
        assert json.loads(env)["spec"]["serviceAccountName"] == "default"


def _wait_for_service_account(core: client.CoreV1Api, ns: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(
            sa.metadata.name == "default" for sa in core.list_namespaced_service_account(ns).items
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"no default service account in {ns}")


def test_a_tpu_request_is_allocated_by_the_device_plugin(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str
) -> None:
    resources = {"limits": {keys.TPU_RESOURCE: "4"}, "requests": {keys.TPU_RESOURCE: "4"}}
    body = _pod(
        real_cluster, "tpu", ["sleep"], container={"resources": resources}, tolerations=TOLERATE_TPU
    )
    core.create_namespaced_pod(ns, body)
    pod = _wait_pod(core, ns, "tpu", _running, "running TPU pod")
    node = real_cluster.nodes[pod["spec"]["nodeName"]]
    assert node.spec.tpu_chips == 4
    # The kubelet records which devices it allocated to which pod.
    checkpoint = node.dir / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    entries = json.loads(checkpoint.read_text())["Data"]["PodDeviceEntries"]
    (entry,) = [e for e in entries if e["PodUID"] == pod["metadata"]["uid"]]
    assert entry["ResourceName"] == keys.TPU_RESOURCE
    devices = sorted(d for ids in entry["DeviceIDs"].values() for d in ids)
    assert devices == ["tpu-0", "tpu-1", "tpu-2", "tpu-3"]
    # Five chips fit on no host of 4: the count is the plugin's, not any number.
    too_many = {"limits": {keys.TPU_RESOURCE: "5"}, "requests": {keys.TPU_RESOURCE: "5"}}
    body = _pod(
        real_cluster,
        "tpu-5",
        ["sleep"],
        container={"resources": too_many},
        tolerations=TOLERATE_TPU,
    )
    core.create_namespaced_pod(ns, body)
    pending = _wait_pod(
        core,
        ns,
        "tpu-5",
        lambda p: any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in p["status"].get("conditions", [])
        ),
        "Unschedulable condition",
    )
    (scheduled,) = [c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert f"Insufficient {keys.TPU_RESOURCE}" in scheduled["message"]


def test_restart_all_containers_restarts_every_container_in_place(
    real_cluster: realnodes.RealCluster, core: client.CoreV1Api, ns: str
) -> None:
    # KEP-5532 (beta in 1.36): the main container's exit 42 restarts all of the pod's containers
    # in the same sandbox. The first run of main exits 42; later runs sleep. Each container
    # counts its starts in an emptyDir, which survives in place.
    volume = {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    main = {
        **volume,
        "restartPolicy": "Never",
        "restartPolicyRules": [
            {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}
        ],
    }
    side = {
        "name": "side",
        "image": real_cluster.probe_image,
        "imagePullPolicy": "Never",
        "args": ["starts", "/data/side", "sleep"],
        **volume,
    }
    body = _pod(
        real_cluster,
        "inplace",
        ["starts", "/data/main", "once", "/data/fired", "42", "sleep"],
        "tpu-b-0",
        container=main,
        sidecars=[side],
        volumes=[{"name": "data", "emptyDir": {}}],
    )
    created = core.create_namespaced_pod(ns, body)

    def restarted(pod: dict[str, Any]) -> bool:
        statuses = pod["status"].get("containerStatuses", [])
        return (
            len(statuses) == 2
            and all(s.get("restartCount", 0) >= 1 for s in statuses)
            and _running(pod)
        )

    pod = _wait_pod(core, ns, "inplace", restarted, "restart of both containers")
    assert pod["metadata"]["uid"] == created.metadata.uid  # the same pod, not a new one
    assert pod["status"]["phase"] == "Running"
    statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
    assert {n: s["restartCount"] for n, s in statuses.items()} == {"main": 1, "side": 1}
    logs = _kubectl(real_cluster, "logs", "-n", ns, "inplace", "-c", "side")
    assert logs.split("\n")[0] == "start 2"  # the side car's second start, same emptyDir


# ------------------------------------------------------------------------- stop and sweep


def _host_state(slot: realnodes.Slot) -> dict[str, list[str]]:
    """What a cluster of ``slot`` can leave on the host, read from the host itself: its links
    and routes, mounts under its directory, cgroup dirs, the processes in its cgroups or
    started from its directory, and the namespaces those processes are in."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    routes = subprocess.run(
        ["ip", "route", "show", "table", "all"], capture_output=True, text=True, check=True
    )
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    processes, namespaces = [], set()
    host_ns = {os.readlink(f"/proc/self/ns/{kind}") for kind in ("net", "mnt", "uts")}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ns = {os.readlink(proc / "ns" / kind) for kind in ("net", "mnt", "uts")}
        except OSError:  # gone meanwhile
            continue
        if (
            f"/{slot.cgroup}/" in cgroups
            or f"/{slot.cgroup}\n" in cgroups
            or (str(slot.workdir) in cmdline)
        ):
            processes.append(f"{proc.name} {cmdline.strip()}")
            namespaces |= ns - host_ns
    return {
        "links": [
            line.split(":")[1].strip()
            for line in links.stdout.splitlines()
            if line.split(":")[1].strip().startswith(f"{realnodes.PREFIX}{slot.index}")
        ],
        "routes": [r for r in routes.stdout.splitlines() if f"{slot.net}." in r],
        "mounts": [m for m in mounts if str(slot.workdir) in m],
        "cgroups": [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{slot.cgroup}")],
        "processes": processes,
        "namespaces": sorted(namespaces),
    }


def _found(state: dict[str, list[str]]) -> dict[str, list[str]]:
    return {key: value for key, value in state.items() if value}


# A cluster of one TPU host with one running pod (shims, a pod network namespace, overlay
# mounts, container processes), run as a program of its own: the crash test SIGKILLs it.
_ONE_NODE_WITH_A_POD = """
import sys, time
from kubernetes import client, config
from multislice_local import oci, realnodes

cluster = realnodes.RealCluster(realnodes.tpu_pool("tpu-x", hosts=1)).start()
core = client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
core.create_namespaced_pod("default", {
    "metadata": {"name": "p"},
    "spec": {
        "tolerations": [{"key": "google.com/tpu", "operator": "Exists"}],
        "containers": [{"name": "main", "image": cluster.probe_image,
                        "imagePullPolicy": "Never", "args": ["sleep"]}],
    },
})
deadline = time.monotonic() + 180
while True:
    pod = core.read_namespaced_pod("p", "default")
    if pod.status.container_statuses and pod.status.container_statuses[0].state.running:
        break
    if time.monotonic() > deadline:
        cluster.stop()
        sys.exit(f"pod p not running: {pod.status}")
    time.sleep(0.5)
print(cluster.slot.index, flush=True)
if sys.stdin.readline().strip() == "stop":  # the test has looked at the running cluster
    cluster.stop()
    print("stopped", flush=True)
"""


def _run_one_node() -> tuple[subprocess.Popen[str], realnodes.Slot]:
    """Start the program above; return it and its slot once its pod runs (it stops its cluster
    when told "stop" on its stdin, and waits until then)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _ONE_NODE_WITH_A_POD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # ends when the program does
        lines.append(line)
        if line.strip().isdigit():
            return proc, realnodes.Slot(int(line))
    proc.wait()
    raise AssertionError("the one-node cluster never ran its pod:\n" + "".join(lines[-60:]))


def test_a_stopped_cluster_leaves_nothing_on_the_host(
    real_cluster: realnodes.RealCluster,
) -> None:
    proc, slot = _run_one_node()
    try:
        assert slot.index != real_cluster.slot.index  # two clusters side by side
        running = _found(_host_state(slot))
        # What the check after the stop looks for is there while the cluster runs.
        assert {"links", "routes", "cgroups", "processes", "namespaces"} <= set(running), running
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("stop\n")
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=120) == 0, rest
        assert "stopped" in rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _found(_host_state(slot)) == {}
    assert not slot.workdir.exists()


def test_a_crashed_run_is_swept_by_the_next_start(
    real_cluster: realnodes.RealCluster,
) -> None:
    proc, slot = _run_one_node()
    os.killpg(proc.pid, signal.SIGKILL)  # no teardown runs: as a killed test session
    proc.wait()
    crashed = _found(_host_state(slot))
    # The shims and containers outlive their SIGKILLed owner (they are not its children), and
    # with them the node's namespaces and its end of the bridge.
    assert {"links", "routes", "cgroups", "processes", "namespaces"} <= set(crashed), crashed
    found = realnodes.sweep()  # what RealCluster.start() runs first
    assert any(line.startswith(f"cgroup {slot.cgroup} (") for line in found), found
    assert f"link {slot.bridge}" in found
    assert _found(_host_state(slot)) == {}
    assert not slot.workdir.exists()
