"""The ``api`` profile: a real kube-apiserver with TLS client auth and RBAC."""

from __future__ import annotations

import os
import re
import ssl
import stat
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client, config

from multislice_local.controlplane import ControlPlane, ControlPlaneError, bin_dir

# The apiserver is built with ldflags stamping the version its tools module pins
# (hack/build-bins.sh reads it from the same go.mod).
KUBE_VERSION = re.search(
    r"^\s*k8s\.io/kubernetes (v\S+)$",
    (Path(__file__).parents[2] / "hack/tools/kube/go.mod").read_text(),
    re.M,
)[1]  # type: ignore[index]


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_version_is_pinned_release(
    kube_api: ControlPlane, kube_client: Callable[[ControlPlane], client.ApiClient]
) -> None:
    info = client.VersionApi(kube_client(kube_api)).get_code()
    assert info.git_version == KUBE_VERSION
    assert (info.major, info.minor) == tuple(KUBE_VERSION.removeprefix("v").split(".")[:2])


def test_admin_is_system_masters(
    kube_api: ControlPlane,
    kube_client: Callable[[ControlPlane], client.ApiClient],
    namespace: Callable[..., str],
) -> None:
    ns = namespace(kube_api)
    core = client.CoreV1Api(kube_client(kube_api))
    core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}, "data": {"k": "v"}})  # type: ignore[arg-type]
    assert core.read_namespaced_config_map("c", ns).data == {"k": "v"}


def test_anonymous_request_is_denied(kube_api: ControlPlane) -> None:
    ctx = ssl.create_default_context(cafile=str(kube_api.ca_file))
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{kube_api.server}/api/v1/namespaces", context=ctx, timeout=5)
    assert err.value.code in (401, 403)


def test_rbac_denies_then_allows_unprivileged_user(
    kube_api: ControlPlane,
    kube_client: Callable[[ControlPlane], client.ApiClient],
    namespace: Callable[..., str],
) -> None:
    ns = namespace(kube_api)
    user_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube_api.user_kubeconfig("alice", ("developers",)))
    )
    user_core = client.CoreV1Api(user_client)
    with pytest.raises(client.ApiException) as err:
        user_core.list_namespaced_pod(ns)
    assert err.value.status == 403
    with pytest.raises(client.ApiException) as err:
        user_core.list_namespace()
    assert err.value.status == 403

    # Granting a Role makes the same request pass: authorization is RBAC, not deny-all.
    rbac = client.RbacAuthorizationV1Api(kube_client(kube_api))
    rbac.create_namespaced_role(
        ns,
        {  # type: ignore[arg-type]
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {  # type: ignore[arg-type]
            "metadata": {"name": "alice-reads-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [
                {"kind": "Group", "name": "developers", "apiGroup": "rbac.authorization.k8s.io"}
            ],
        },
    )
    assert user_core.list_namespaced_pod(ns).items == []
    user_client.close()


def test_start_stop_leaves_no_process(tmp_path: Path) -> None:
    cp = ControlPlane("api")
    try:
        cp.start()
        pids = cp.pids
        workdir = cp.workdir
        assert set(pids) == {"etcd", "kube-apiserver"}
        assert all(_alive(pid) for pid in pids.values())
        assert stat.S_IMODE(cp.kubeconfig.stat().st_mode) == 0o600
    finally:
        cp.stop()
    assert [pid for pid in pids.values() if _alive(pid)] == []
    assert _processes_mentioning(str(workdir)) == []
    assert not workdir.exists()
    assert cp.pids == {}


def test_failed_start_reports_log_tail_and_cleans_up(tmp_path: Path) -> None:
    # A stand-in etcd that dies at once: start() must name it, show its log and kill the rest.
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in os.listdir(bin_dir()):
        (fake / name).symlink_to(bin_dir() / name)
    (fake / "etcd").unlink()
    (fake / "etcd").write_text("#!/bin/sh\necho 'etcd: simulated disk failure' >&2\nexit 3\n")
    (fake / "etcd").chmod(0o755)
    cp = ControlPlane("api", workdir=tmp_path / "work", binaries=fake)
    with pytest.raises(ControlPlaneError, match="simulated disk failure") as err:
        cp.start(timeout=30)
    assert "etcd exited with code 3" in str(err.value)
    assert cp.pids == {}


def test_kubectl_keeps_its_discovery_cache_per_control_plane(kube_api: ControlPlane) -> None:
    """kubectl keys $HOME/.kube/cache by host:port: a control plane that reuses a port of an
    earlier one read that one's stale resource list (the old flaky `kubectl explain`). Each
    control plane's client environment points kubectl at a cache of its own."""
    import subprocess

    env = kube_api.client_env()
    cache = Path(env["KUBECACHEDIR"])
    assert cache.is_relative_to(kube_api.workdir)
    out = subprocess.run(
        [str(bin_dir() / "kubectl"), "api-resources", "-o", "name"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    port = kube_api.server.rsplit(":", 1)[1]
    assert any(p.name.endswith(f"_{port}") for p in (cache / "discovery").iterdir())


# ---------------------------------------------------------------- profiles as component lists


def test_each_profile_is_the_previous_one_plus_components() -> None:
    from multislice_local.controlplane import BINARIES, COMPONENTS, PROFILES

    api, cluster, kueue = PROFILES["api"], PROFILES["cluster"], PROFILES["kueue"]
    assert [c.name for c in api] == ["etcd", "kube-apiserver"]
    assert cluster[: len(api)] == api and kueue[: len(cluster)] == cluster
    assert [c.name for c in kueue[len(cluster) :]] == ["kueue-controller"]
    assert all(c.blocking for c in api)  # everything after them talks to the API server
    assert len(COMPONENTS) == len(kueue)
    for component in kueue:
        assert component.binary in BINARIES
        assert component.ready, f"{component.name} has no readiness check"


KUEUE_API = ("kueue.x-k8s.io", "v1beta2")


def test_kueue_profile_serves_kueue_on_loopback_and_only_while_it_runs(tmp_path: Path) -> None:
    """The kueue profile: CRDs whose conversion webhook is on 127.0.0.1, only Kueue's own and its
    JobSet webhooks (not the Pod/Job ones), a queue-labelled JobSet suspended by Kueue's mutating
    webhook; stopping Kueue first removes its webhooks, so JobSets can still be created."""
    import subprocess

    cp = ControlPlane("kueue")
    try:
        cp.start(timeout=240)
        assert "kueue-controller" in cp.pids
        api = cp.api_client()
        ext = client.ApiextensionsV1Api(api)
        converted = {
            crd.spec.names.plural: crd.spec.conversion.webhook.client_config.url
            for crd in ext.list_custom_resource_definition().items
            if crd.spec.group == "kueue.x-k8s.io" and crd.spec.conversion.strategy == "Webhook"
        }
        assert set(converted) == {
            "localqueues",
            "clusterqueues",
            "cohorts",
            "workloads",
            "multikueueclusters",
        }
        assert all(url.startswith("https://127.0.0.1:") for url in converted.values())
        adm = client.AdmissionregistrationV1Api(api)
        hooks = [
            h.client_config.url
            for cfg in (
                *adm.list_mutating_webhook_configuration().items,
                *adm.list_validating_webhook_configuration().items,
            )
            if cfg.metadata.name.startswith("kueue-")
            for h in cfg.webhooks
        ]
        assert len(hooks) == 9, hooks
        assert not [u for u in hooks if "-v1-pod" in u or "batch-v1-job" in u]
        # v1beta1 reads go through the conversion webhook, which answers while Kueue runs.
        custom = client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(
            *KUEUE_API,
            "default",
            "localqueues",
            {
                "apiVersion": "/".join(KUEUE_API),
                "kind": "LocalQueue",
                "metadata": {"name": "lq"},
                "spec": {"clusterQueue": "cq"},
            },
        )
        old = custom.get_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta1", "default", "localqueues", "lq"
        )
        assert old["spec"]["clusterQueue"] == "cq"

        def jobset(name: str) -> dict:
            return {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "slice",
                            "replicas": 1,
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "restartPolicy": "Never",
                                            "containers": [{"name": "c", "image": "i"}],
                                        }
                                    }
                                }
                            },
                        }
                    ]
                },
            }

        created = custom.create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", jobset("queued")
        )
        assert created["spec"]["suspend"] is True  # Kueue's mutating webhook
        cp.stop_component("kueue-controller")
        assert "kueue-controller" not in cp.pids
        left = subprocess.run(
            [str(bin_dir() / "kubectl"), "get", "mutatingwebhookconfigurations,"
             "validatingwebhookconfigurations", "-o", "name"],
            env=cp.client_env(), capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        assert "kueue" not in left and "jobset-" in left, left
        # Kueue's webhooks are gone with it: a JobSet is admitted by JobSet's webhooks alone.
        after = custom.create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", jobset("after-kueue")
        )
        assert after["metadata"]["name"] == "after-kueue"
        api.close()
        workdir = cp.workdir
    finally:
        cp.stop()
    assert _processes_mentioning(str(workdir)) == []
