"""multislice_local.realnodes without starting anything: node specs, the one-line host check,
the addresses of a slot and the configuration files a node gets."""

from __future__ import annotations

import ipaddress
import shutil
from pathlib import Path

import pytest

from multislice_local import realnodes
from multislice_operator.common import keys


def test_default_nodes_are_two_v5litepod_8_pools_and_a_plain_node() -> None:
    nodes = realnodes.default_nodes()
    assert [n.name for n in nodes] == ["tpu-a-0", "tpu-a-1", "tpu-b-0", "tpu-b-1", "cpu-0"]
    for node in nodes[:4]:
        assert node.labels == {
            keys.GKE_NODEPOOL: node.name[:5],
            keys.GKE_TPU_ACCELERATOR: "tpu-v5-lite-podslice",
            keys.GKE_TPU_TOPOLOGY: "2x4",
        }
        assert node.taints == ("google.com/tpu=present:NoSchedule",)
        assert node.tpu_chips == 4
    assert nodes[4].taints == () and nodes[4].tpu_chips == 0


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([], "give 1 to 120"),
        ([realnodes.plain_node("a"), realnodes.plain_node("a")], "names must be unique"),
        ([realnodes.NodeSpec("Big_Name")], "lower-case letters, digits and '-'"),
        (
            [realnodes.NodeSpec("n", {"node-role.kubernetes.io/x": ""})],
            "may not set kubernetes.io labels",
        ),
        ([realnodes.NodeSpec("n", taints=("google.com/tpu",))], "write key=value:Effect"),
    ],
)
def test_bad_node_specs_are_refused_naming_the_fix(
    nodes: list[realnodes.NodeSpec], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        realnodes.RealCluster(nodes)


def test_a_host_without_root_gets_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnodes.os, "geteuid", lambda: 1000)
    reason = realnodes.unavailable_reason()
    assert reason is not None and "\n" not in reason
    assert "need root" in reason and "run them as root" in reason


def test_a_host_without_the_tools_gets_their_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnodes.os, "geteuid", lambda: 0)
    real_which = shutil.which
    monkeypatch.setattr(
        realnodes.shutil, "which", lambda t: None if t in ("nsenter", "ip") else real_which(t)
    )
    reason = realnodes.unavailable_reason()
    assert reason is not None and reason.startswith("real nodes need ip, nsenter on PATH")


def test_a_host_without_cgroup_v1_controllers_gets_their_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(realnodes.os, "geteuid", lambda: 0)
    monkeypatch.setattr(realnodes.shutil, "which", lambda t: f"/usr/bin/{t}")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "cgroup.procs").write_text("")
    monkeypatch.setattr(realnodes, "CGROUP_FS", tmp_path)
    reason = realnodes.unavailable_reason()
    if reason is not None and "overlayfs" in reason:
        pytest.skip("this host has no overlayfs: that line comes first")
    assert reason is not None
    assert "cgroup v1 controllers cpu, cpuacct, cpuset, pids, devices, freezer" in reason


def test_slots_own_disjoint_private_ranges() -> None:
    ranges = [ipaddress.ip_network(realnodes.Slot(i).cidr) for i in range(realnodes.SLOTS)]
    assert all(r.is_private for r in ranges)
    assert len({r for r in ranges}) == realnodes.SLOTS
    assert not any(a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])
    slot = realnodes.Slot(3)
    inside = [slot.gateway, slot.dns_ip, slot.node_ip(119)]
    inside += [str(next(ipaddress.ip_network(slot.pod_cidr(i)).hosts())) for i in (0, 119)]
    assert all(ipaddress.ip_address(a) in ranges[3] for a in inside)
    service = ipaddress.ip_network(slot.service_cidr)
    assert ipaddress.ip_address(slot.dns_ip) in service
    assert str(next(service.hosts())) == "10.203.1.1"  # the API server: kubernetes' ClusterIP
    assert len(f"{slot.bridge}") <= 15 and len(slot.veth(119)) <= 15  # IFNAMSIZ


def _node(tmp_path: Path, spec: realnodes.NodeSpec) -> realnodes.Node:
    slot = realnodes.Slot(0)
    return realnodes.Node(spec, 2, slot.node_ip(2), slot.pod_cidr(2), tmp_path, "msj0/n")


def test_the_kubelet_config_carries_what_these_machines_need(tmp_path: Path) -> None:
    (spec,) = realnodes.tpu_pool("p", hosts=1)
    config = realnodes._kubelet_config(_node(tmp_path, spec), realnodes.Slot(0))
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/msj0/n" and config["oomScoreAdj"] == 0
    assert config["clusterDNS"] == ["10.200.1.10"]
    assert config["registerWithTaints"] == [
        {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert set(config["evictionHard"].values()) == {"0%"}
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["authentication"]["anonymous"] == {"enabled": False}


def test_the_node_network_and_runtime_stay_inside_the_node(tmp_path: Path) -> None:
    node = _node(tmp_path, realnodes.plain_node())
    cni = realnodes._cni_config(node)["plugins"][0]
    assert cni["ipMasq"] is False and cni["isGateway"] is True
    assert cni["ipam"]["ranges"] == [[{"subnet": "10.200.130.0/24", "gateway": "10.200.130.1"}]]
    bins = realnodes.NodeBinaries(Path("/b"), Path("/l"))
    toml = realnodes._containerd_config(bins, node)
    assert "restrict_oom_score_adj = true" in toml
    assert f'sandbox = "{realnodes.PAUSE_IMAGE}"' in toml
    assert 'BinaryName = "/b/runc"' in toml
    assert f'path = "{tmp_path / "opt"}"' in toml  # not the host's /opt/containerd
