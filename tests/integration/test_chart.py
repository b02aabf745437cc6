"""The Helm chart: lint, render, schema, server-side dry-run on the real apiserver, `kubectl
explain`, and RBAC proven by running the operator as the chart's ServiceAccount through a whole
Existing-mode lifecycle (and failing it with one verb removed)."""

from __future__ import annotations

import copy
import json
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.controlplane import KUEUE_CRDS_FILE, ControlPlane, bin_dir
from multislice_local.harness import OperatorProcess, install_crds, install_kueue_crds, wait_for
from multislice_local.nodes import delete_nodes, register_tpu_nodes
from multislice_operator import __version__
from multislice_operator.api import models
from multislice_operator.api.crd import generate_crd
from multislice_operator.reconcile.reasons import Reason

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "multislice-operator"
KUBE_VERSION = "1.36.0"  # what users run (facts.md section 13); the chart targets >=1.29
JS = ("jobset.x-k8s.io", "v1alpha2")
PG = ("scheduling.k8s.io", "v1beta1")  # PodGroups: Kubernetes 1.37 with the Workload API on
CHECKPOINT_REQUEST = "multislice.dev/checkpoint-request"

CUSTOM_VALUES: dict[str, Any] = {
    "replicaCount": 2,
    "image": {"repository": "registry.example/msj/operator", "tag": "1.2.3"},
    "serviceAccount": {"gcpServiceAccount": "msj-operator@my-proj.iam.gserviceaccount.com"},
    "watchNamespaces": ["team-a", "team-b"],
    "gke": {
        "project": "my-proj",
        "location": "us-central2",
        "cluster": "tpu",
        "nodeLocations": ["us-central2-b"],
        "nodes": {
            "workloadIdentity": True,
            "serviceAccount": "tpu-nodes@my-proj.iam.gserviceaccount.com",
            "oauthScopes": ["https://www.googleapis.com/auth/cloud-platform"],
        },
    },
    "operator": {"logLevel": "debug", "logFormat": "text", "resyncSeconds": 5},
    "metrics": {
        "port": 9100,
        "service": {"port": 9100},
        "serviceMonitor": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    },
    "health": {"port": 8081},
    "nodeSelector": {"pool": "system"},
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "extraEnv": [{"name": "MSJ_GC_INTERVAL_SECONDS", "value": "60"}],
}


# ---------------------------------------------------------------- helpers


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(bin_dir() / "helm"), *args], capture_output=True, text=True, timeout=60
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_the_local_helm_templates_the_chart_without_a_kube_version() -> None:
    """hack/build-bins.sh stamps helm's default Kubernetes version as upstream's Makefile does;
    unstamped, helm assumed v1.20 and refused the chart's kubeVersion (>=1.29) without
    --kube-version."""
    out = helm("template", "x", str(CHART)).stdout
    assert any(d and d["kind"] == "Deployment" for d in yaml.safe_load_all(out))


def values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def render(
    tmp_path: Path,
    values: dict[str, Any] | None = None,
    release: str = "multislice-operator",
    namespace: str = "msj-system",
    kube_version: str = KUBE_VERSION,
) -> list[dict[str, Any]]:
    out = helm(
        "template",
        release,
        str(CHART),
        "-n",
        namespace,
        "--kube-version",
        kube_version,
        "-f",
        values_file(tmp_path, values or {}),
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = by_kind(docs, kind)
    return doc


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(docs)["env"]}


def operator_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ClusterRole and Roles bound to the operator's ServiceAccount (not the user roles,
    the metrics reader or a scraper's)."""
    (sa,) = [d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")][:1] or ["default"]
    bound = {
        (b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
        for b in docs
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and any(s.get("name") == sa and s["kind"] == "ServiceAccount" for s in b["subjects"])
    }
    return [
        d
        for d in docs
        if (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) in bound
        or (d["kind"] == "ClusterRole" and ("ClusterRole", d["metadata"]["name"], None) in bound)
    ]


def grants_of(roles: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for role in roles
        for rule in role["rules"]
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule["verbs"]
    }


def rules_of(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) granted to the operator, by its ClusterRole and Roles."""
    return grants_of(operator_roles(docs))


def kubectl(
    cp: ControlPlane, *args: str, stdin: str | None = None, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = cp.client_env(kubeconfig)
    return subprocess.run(
        [str(bin_dir() / "kubectl"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


# ---------------------------------------------------------------- lint, render, schema

# In-place restart (on by default): the agents' ServiceAccount and RoleBinding in each job
# namespace, bound to the chart's ClusterRole for them.
IN_PLACE_RULES = {
    ("", "serviceaccounts", "create"),  # a server-side apply that creates needs create
    ("", "serviceaccounts", "patch"),
    ("rbac.authorization.k8s.io", "rolebindings", "create"),
    ("rbac.authorization.k8s.io", "rolebindings", "patch"),
    ("rbac.authorization.k8s.io", "clusterroles", "bind"),
}
BASE_RULES = {
    ("multislice.dev", "multislicejobs", "list"),
    ("multislice.dev", "multislicejobs", "watch"),
    ("multislice.dev", "multislicejobs", "patch"),
    ("multislice.dev", "multislicejobs", "delete"),
    ("multislice.dev", "multislicejobs/status", "patch"),
    ("multislice.dev", "multislicejobs/finalizers", "update"),
    ("jobset.x-k8s.io", "jobsets", "get"),
    ("jobset.x-k8s.io", "jobsets", "list"),
    ("jobset.x-k8s.io", "jobsets", "watch"),
    ("jobset.x-k8s.io", "jobsets", "create"),
    ("jobset.x-k8s.io", "jobsets", "patch"),
    ("jobset.x-k8s.io", "jobsets", "delete"),
    ("scheduling.k8s.io", "podgroups", "create"),
    ("scheduling.k8s.io", "podgroups", "patch"),
    ("batch", "jobs", "create"),
    ("batch", "jobs", "get"),  # spec.preflight: its compile Job read back
    ("batch", "jobs", "delete"),  # ... and deleted once it finished
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods", "patch"),
    ("", "pods/eviction", "create"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "namespaces", "get"),
    ("scheduling.k8s.io", "priorityclasses", "get"),
    ("", "events", "create"),
    ("", "events", "patch"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    # GKE dynamic slicing: a job's Slices (cluster-scoped), made from its cubes and deleted after;
    # patched to remove the finalizer of one stuck deleting (sliceDeletionTimeoutSeconds).
    *(
        ("accelerator.gke.io", "slices", v)
        for v in ("get", "list", "watch", "create", "patch", "delete")
    ),
    # The metrics endpoint's delegated authentication and authorization.
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
    # The Role in the release namespace: the leader-election and heartbeat Leases.
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    # The Role in kube-node-lease: the kubelets' heartbeats, listed.
    ("coordination.k8s.io", "leases", "list"),
    *IN_PLACE_RULES,
}


@pytest.mark.parametrize("values", [{}, CUSTOM_VALUES], ids=["default", "custom"])
def test_lint(tmp_path: Path, values: dict[str, Any]) -> None:
    result = helm(
        "lint",
        "--strict",
        "--kube-version",
        KUBE_VERSION,
        str(CHART),
        "-f",
        values_file(tmp_path, values),
    )
    assert "0 chart(s) failed" in result.stdout


def test_chart_versions_follow_the_operator() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__


def test_chart_crd_is_the_generated_one() -> None:
    shipped = (CHART / "crds" / "multislice.dev_multislicejobs.yaml").read_text()
    assert shipped == (ROOT / "crds" / "multislice.dev_multislicejobs.yaml").read_text()
    assert yaml.safe_load(shipped) == generate_crd()


def test_default_render(tmp_path: Path) -> None:
    docs = render(tmp_path)
    assert sorted(d["kind"] for d in docs) == [
        # the operator's, the metrics reader, the editor and viewer, the in-place restart agents'
        *["ClusterRole"] * 5,
        "ClusterRoleBinding",
        "Deployment",
        *["Role"] * 2,  # the leader-election Leases, and the node Leases (heartbeats)
        *["RoleBinding"] * 2,
        "Service",
        "ServiceAccount",
        # pod patches, evictions, Job dry runs, JobSets, events, the agents' pod patches
        *["ValidatingAdmissionPolicy"] * 6,
        *["ValidatingAdmissionPolicyBinding"] * 8,
    ]
    deploy = one(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "multislice-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(docs)
    assert (
        c["image"] == f"us-docker.pkg.dev/my-project/multislice/multislice-operator:{__version__}"
    )
    assert "args" not in c
    assert env_of(docs)["MSJ_LEADER_ELECT"] == "1"  # one replica too: `kubectl scale` is safe
    assert env_of(docs)["MSJ_LEADER_ELECTION_NAME"] == "multislice-operator"
    assert env_of(docs)["MSJ_LEADER_ELECTION_NAMESPACE"] == "msj-system"
    assert env_of(docs)["MSJ_METRICS_BIND_ADDRESS"] == "0.0.0.0"  # scraped from the Service
    assert env_of(docs)["MSJ_METRICS_AUTH"] == "kubernetes"  # ... over HTTPS, with a token
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "healthz"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 8000, "healthz": 8080}
    env = env_of(docs)
    assert env["MSJ_HEALTH_PORT"] == "8080" and env["MSJ_HEALTH_BIND_ADDRESS"] == "0.0.0.0"
    assert "MSJ_LIVENESS" not in env and "MSJ_READY_STANDBY" not in env
    assert "MSJ_NAMESPACES" not in env and "MSJ_GKE_PROJECT" not in env
    # In-place restart with no value set: the agent is the operator's own image, which carries it.
    assert env["MSJ_IN_PLACE_AGENT_IMAGE"] == c["image"]
    assert one(docs, "Service")["spec"]["ports"][0]["port"] == 8000
    assert "annotations" not in one(docs, "ServiceAccount")["metadata"]
    assert one(docs, "Service")["spec"]["type"] == "ClusterIP"
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "multislice-operator", "namespace": "msj-system"}
    ]
    assert rules_of(docs) == BASE_RULES


def test_in_place_restart_can_be_turned_off_or_given_another_agent_image(tmp_path: Path) -> None:
    off = render(tmp_path, {"inPlaceRestart": {"enabled": False}})
    assert "MSJ_IN_PLACE_AGENT_IMAGE" not in env_of(off)
    assert rules_of(off) == BASE_RULES - IN_PLACE_RULES
    names = {d["metadata"]["name"] for d in off}
    assert not any("inplace" in n for n in names), names
    pinned = {"image": {"digest": "sha256:" + "ab" * 32}}
    docs = render(tmp_path, pinned)  # the agent by the digest the operator runs by, not its tag
    assert env_of(docs)["MSJ_IN_PLACE_AGENT_IMAGE"] == container(docs)["image"]
    assert "@sha256:" in container(docs)["image"]
    other = {"inPlaceRestart": {"agentImage": "registry.example/jobset/agent:v0.12.0"}}
    assert env_of(render(tmp_path, other))["MSJ_IN_PLACE_AGENT_IMAGE"] == (
        "registry.example/jobset/agent:v0.12.0"
    )


def test_custom_render(tmp_path: Path) -> None:
    docs = render(tmp_path, CUSTOM_VALUES, release="ml")
    c = container(docs)
    assert c["image"] == "registry.example/msj/operator:1.2.3"
    digest = "sha256:" + "0123456789abcdef" * 4
    pinned = {**CUSTOM_VALUES, "image": {**CUSTOM_VALUES["image"], "digest": digest}}
    assert container(render(tmp_path, pinned, release="ml"))["image"] == (
        f"registry.example/msj/operator@{digest}"  # the digest names the bytes; the tag goes
    )
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    assert env_of(docs)["MSJ_LEADER_ELECT"] == "1"
    assert env_of(docs)["MSJ_LEADER_ELECTION_NAME"] == "ml-multislice-operator"
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-election")]
    assert role["metadata"]["namespace"] == "msj-system"
    assert role["rules"] == [  # only its two Leases read or written (a create has no name)
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["ml-multislice-operator", "ml-multislice-operator-heartbeat"],
            "verbs": ["get", "update"],
        },
    ]
    sa = one(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "msj-operator@my-proj.iam.gserviceaccount.com"
    }
    assert rules_of(docs) == BASE_RULES | {
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
    }
    monitor = one(docs, "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == "metrics"
    assert endpoint["honorLabels"] is True  # the jobs' namespace label
    assert endpoint["scheme"] == "https"  # with Prometheus' own token
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert one(docs, "Service")["spec"]["ports"][0]["port"] == 9100
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names))
    assert env_of(docs)["MSJ_GC_INTERVAL_SECONDS"] == "60"  # extraEnv replaces the chart-set one


# leases: their own Role; the reviews are cluster-scoped questions to the apiserver.
CLUSTER_SCOPED = (
    "nodes", "namespaces", "priorityclasses", "customresourcedefinitions", "leases",
    "tokenreviews", "subjectaccessreviews",
)  # fmt: skip
NAMESPACED = {r for r in BASE_RULES if r[1] not in CLUSTER_SCOPED}
LEASES = {r for r in BASE_RULES if r[1] == "leases"}


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return grants_of([role])


def test_watched_namespaces_get_roles_and_the_cluster_role_keeps_only_cluster_objects(
    tmp_path: Path,
) -> None:
    docs = render(tmp_path, {"watchNamespaces": ["team-a", "team-b"]}, release="ml")
    roles = {
        r["metadata"]["namespace"]: r
        for r in by_kind(docs, "Role")
        if not r["metadata"]["name"].endswith(("-leader-election", "-node-leases"))
    }
    assert set(roles) == {"team-a", "team-b"}
    for ns, role in roles.items():
        assert grants(role) == NAMESPACED
        (binding,) = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["namespace"] == ns]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"][0]["namespace"] == "msj-system"
    (cluster_role,) = by_kind(operator_roles(docs), "ClusterRole")
    assert grants(cluster_role) == (BASE_RULES - NAMESPACED - LEASES) | {
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
    }
    # A glob cannot name a Role's namespace: then the ClusterRole grants it all, as before.
    globbed = render(tmp_path, {"watchNamespaces": ["team-*"]})
    assert [r["metadata"]["namespace"] for r in by_kind(globbed, "Role")] == [
        "kube-node-lease",
        "msj-system",
    ]
    (cluster_role,) = by_kind(operator_roles(globbed), "ClusterRole")
    assert grants(cluster_role) >= NAMESPACED


def test_grafana_dashboard_configmap_for_the_sidecar(tmp_path: Path) -> None:
    """Labelled as kube-prometheus-stack's Grafana sidecar finds dashboards (its values:
    grafana.sidecar.dashboards.label grafana_dashboard, labelValue "1")."""
    assert not by_kind(render(tmp_path), "ConfigMap")  # opt-in
    docs = render(tmp_path, {"metrics": {"grafanaDashboard": {"enabled": True}}})
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "msj-system"
    board = json.loads(cm["data"]["multislice-goodput.json"])
    assert board == json.loads((CHART / "dashboards" / "goodput.json").read_text())
    custom = {
        "enabled": True,
        "namespace": "monitoring",
        "label": "dashboards.example/grafana",
        "labelValue": "yes",
        "annotations": {"grafana_folder": "TPU"},
    }
    cm = one(render(tmp_path, {"metrics": {"grafanaDashboard": custom}}), "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["dashboards.example/grafana"] == "yes"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "TPU"}


def test_replicas_elect_a_leader_on_one_lease(tmp_path: Path) -> None:
    docs = render(tmp_path, {"replicaCount": 3})
    assert env_of(docs)["MSJ_LEADER_ELECT"] == "1"
    assert env_of(render(tmp_path, {"replicaCount": 0}))["MSJ_LEADER_ELECT"] == "1"
    assert env_of(docs)["MSJ_LEADER_ELECTION_NAMESPACE"] == "msj-system"
    assert {b["roleRef"]["name"] for b in by_kind(docs, "RoleBinding")} == {
        "multislice-operator-leader-election",
        "multislice-operator-node-leases",
    }
    # electing a leader watches no namespaces: only reading a job's own one (its Pod Security level)
    assert {r for r in rules_of(docs) if r[1] == "namespaces"} == {("", "namespaces", "get")}


def test_rendered_env_is_what_the_operator_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's MSJ_* names and flags are the ones settings.py reads (flags win)."""
    from multislice_operator.cli.main import build_parser
    from multislice_operator.settings import from_args

    docs = render(tmp_path, CUSTOM_VALUES, release="ml")
    for name, value in env_of(docs).items():
        monkeypatch.setenv(name, value)
    settings = from_args(build_parser().parse_args(["run", *container(docs).get("args", [])]))
    assert settings.namespaces == ["team-a", "team-b"]
    assert (settings.gke_project, settings.gke_location, settings.gke_cluster) == (
        "my-proj",
        "us-central2",
        "tpu",
    )
    assert settings.gke_node_locations == ["us-central2-b"]
    node = settings.node_options()
    assert node.workload_identity and node.service_account == (
        "tpu-nodes@my-proj.iam.gserviceaccount.com"
    )
    assert node.oauth_scopes == ("https://www.googleapis.com/auth/cloud-platform",)
    assert settings.verbose is True and settings.log_format == "text"
    assert settings.metrics_port == 9100
    assert (settings.health_port, settings.health_bind_address) == (8081, "0.0.0.0")
    assert settings.metrics_auth == "kubernetes" and settings.problems() == []
    assert settings.resync_seconds == 5 and settings.gc_interval_seconds == 60
    assert settings.leader_elect is True
    assert settings.leader_election_name == "ml-multislice-operator"
    assert settings.metrics_bind_address == "0.0.0.0"


def test_rbac_has_no_wildcards_and_no_secrets(tmp_path: Path) -> None:
    mk_worker = {"kueue": {"enabled": True}, "multikueue": {"role": "worker"}}
    for values in (
        {}, CUSTOM_VALUES, {"replicaCount": 2}, {"kueue": {"enabled": True}}, MK_MANAGER, mk_worker,
    ):  # fmt: skip
        docs = render(tmp_path, values)
        for group, resource, verb in grants_of(
            by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
        ):
            assert "*" not in (group, resource, verb)
            assert resource not in ("secrets", "configmaps", "serviceaccounts/token")
            assert verb not in ("escalate", "impersonate", "deletecollection")
        # bind: only the in-place restart agents' ClusterRole (their RoleBinding per namespace).
        binds = [
            rule
            for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
            for rule in role["rules"]
            if "bind" in rule["verbs"]
        ]
        assert all(
            r["verbs"] == ["bind"] and r["resources"] == ["clusterroles"]
            and r.get("resourceNames") == ["multislice-inplace-restart"]
            for r in binds
        ), binds  # fmt: skip


OPERATOR_USER = "system:serviceaccount:msj-system:multislice-operator"


def test_admission_policies_render_where_the_cluster_serves_them(tmp_path: Path) -> None:
    docs = render(tmp_path)
    policies = {p["metadata"]["name"]: p for p in by_kind(docs, "ValidatingAdmissionPolicy")}
    assert set(policies) == {
        "multislice-operator-pod-patch.multislice.dev",
        "multislice-operator-job-dry-run.multislice.dev",
        "multislice-operator-pod-eviction.multislice.dev",
        "multislice-operator-jobset.multislice.dev",
        "multislice-operator-event.multislice.dev",
        "multislice-operator-inplace-agent.multislice.dev",  # the agents': only their annotation
    }
    agent = policies.pop("multislice-operator-inplace-agent.multislice.dev")
    (cond,) = agent["spec"]["matchConditions"]
    assert "multislice-inplace-restart" in cond["expression"]
    for policy in policies.values():  # the operator's own requests only
        (cond,) = policy["spec"]["matchConditions"]
        assert cond["expression"] == f"request.userInfo.username == '{OPERATOR_USER}'"
        assert policy["spec"]["failurePolicy"] == "Fail"
    bindings = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert {b["spec"]["policyName"] for b in bindings} == {*policies, agent["metadata"]["name"]}
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    # Kubernetes 1.29 has no ValidatingAdmissionPolicy v1 (GA in 1.30): none rendered.
    old = render(tmp_path, kube_version="1.29.0")
    assert not by_kind(old, "ValidatingAdmissionPolicy")
    off = render(tmp_path, {"rbac": {"admissionPolicy": {"enabled": False}}})
    assert not by_kind(off, "ValidatingAdmissionPolicy")
    no_evictions = render(tmp_path, {"rbac": {"admissionPolicy": {"evictions": False}}})
    assert len(by_kind(no_evictions, "ValidatingAdmissionPolicy")) == 5


def test_the_jobset_policy_refuses_the_system_namespaces_unless_listed(tmp_path: Path) -> None:
    def refused(values: dict[str, Any] | None = None) -> str:
        (policy,) = [
            p for p in by_kind(render(tmp_path, values), "ValidatingAdmissionPolicy")
            if p["metadata"]["name"].endswith("-jobset.multislice.dev")
        ]  # fmt: skip
        return str(policy["spec"]["validations"][0]["expression"])

    system = '"kube-system","kube-public","kube-node-lease"'
    assert refused() == f'!(request.namespace in [{system},"msj-system"])'
    allowed = {"rbac": {"admissionPolicy": {"allowedSystemNamespaces": ["kube-system"]}}}
    assert (
        refused(allowed) == '!(request.namespace in ["kube-public","kube-node-lease","msj-system"])'
    )


def test_an_existing_service_account_must_be_named_and_not_default(tmp_path: Path) -> None:
    for sa in ({"create": False}, {"create": False, "name": "default"}):
        result = helm(
            "template", "x", str(CHART), "--kube-version", KUBE_VERSION,
            "-f", values_file(tmp_path, {"serviceAccount": sa}), check=False,
        )  # fmt: skip
        assert result.returncode != 0
        assert "set serviceAccount.name to the operator's own ServiceAccount" in result.stderr
    docs = render(tmp_path, {"serviceAccount": {"create": False, "name": "msj-ops"}})
    assert not by_kind(docs, "ServiceAccount")
    subjects = [s for b in by_kind(docs, "ClusterRoleBinding") for s in b["subjects"]]
    assert {s["name"] for s in subjects} == {"msj-ops"}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "msj-ops"


def user_roles(tmp_path: Path, values: dict[str, Any] | None = None) -> dict[str, Any]:
    docs = render(tmp_path, values)
    return {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole")}


def aggregated_into(role: dict[str, Any]) -> set[str]:
    prefix = "rbac.authorization.k8s.io/aggregate-to-"
    labels = role["metadata"]["labels"]
    return {k.removeprefix(prefix) for k, v in labels.items() if k.startswith(prefix) and v}


def test_user_roles_the_viewer_aggregates_and_the_editor_only_when_asked(tmp_path: Path) -> None:
    """Creating a MultisliceJob spends TPUs, which `edit` alone never allows: the editor joins
    Kubernetes' roles only when the install says so (as JobSet's and Kueue's editors never do);
    the viewer joins view, edit and admin, as Kueue's viewers."""
    roles = user_roles(tmp_path)
    editor, viewer = roles["multislice-editor"], roles["multislice-viewer"]
    assert aggregated_into(editor) == set()
    assert aggregated_into(viewer) == {"view", "edit", "admin"}
    assert grants_of([editor]) >= {("multislice.dev", "multislicejobs", "create")}
    assert {v for _, _, v in grants_of([viewer])} == {"get", "list", "watch"}
    for choice, into in (("none", set()), ("admin", {"admin"}), ("edit", {"edit", "admin"})):
        values = {"rbac": {"userRoles": {"editorAggregation": choice}}}
        assert aggregated_into(user_roles(tmp_path, values)["multislice-editor"]) == into
    off = user_roles(tmp_path, {"rbac": {"userRoles": {"create": False}}})
    assert "multislice-editor" not in off


def test_metrics_reader_role_and_its_optional_binding(tmp_path: Path) -> None:
    docs = render(tmp_path)
    (reader,) = [
        r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("-metrics-reader")
    ]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert len(by_kind(docs, "ClusterRoleBinding")) == 1  # nobody bound by default
    prom = {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
    docs = render(tmp_path, {"metrics": {"reader": {"subjects": [prom]}}})
    (binding,) = [
        b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"].endswith("-reader")
    ]
    assert binding["subjects"] == [prom]


def test_metrics_network_policy_admits_only_the_listed_peers(tmp_path: Path) -> None:
    assert not by_kind(render(tmp_path), "NetworkPolicy")
    peers = [{"namespaceSelector": {"matchLabels": {"team": "sre"}}}]
    docs = render(tmp_path, {"metrics": {"networkPolicy": {"enabled": True, "from": peers}}})
    policy = one(docs, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}], "from": peers}]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "multislice-operator"


def test_metrics_network_policy_admits_the_gmp_collector_when_pod_monitoring_is_on(
    tmp_path: Path,
) -> None:
    """GKE Managed Prometheus scrapes from its collector's namespace (gmp-system), not from
    `monitoring`: with both on, the policy admits the namespaces of podMonitoring's
    collectorSubjects too (issue 44)."""
    on = {"networkPolicy": {"enabled": True}}

    def sources(metrics: dict[str, Any]) -> list[Any]:
        (rule,) = one(render(tmp_path, {"metrics": metrics}), "NetworkPolicy")["spec"]["ingress"]
        return list(rule["from"])

    def namespace(name: str) -> dict[str, Any]:
        return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}

    assert sources(on) == [namespace("monitoring")]
    assert sources({**on, "podMonitoring": {"enabled": True}}) == [
        namespace("monitoring"),
        namespace("gmp-system"),
    ]
    collectors = [
        {"kind": "ServiceAccount", "name": "collector", "namespace": "gmp-public"},
        {"kind": "ServiceAccount", "name": "rule-evaluator", "namespace": "gmp-public"},
    ]
    both = {**on, "podMonitoring": {"enabled": True, "collectorSubjects": collectors}}
    assert sources(both) == [namespace("monitoring"), namespace("gmp-public")]


def test_default_resources_bound_ephemeral_storage(tmp_path: Path) -> None:
    """kube-score's ephemeral-storage finding (issue 44): the default requests and limits it.
    The kubelet evicts a pod whose disk use (its containers' logs and writable layers, and its
    emptyDirs) passes the sum of its containers' limits: the limit must leave room for the /tmp
    emptyDir and the kubelet's rotated logs (10Mi x 5 by default) besides."""
    docs = render(tmp_path)
    resources = container(docs)["resources"]
    (tmp,) = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]

    def mib(quantity: str) -> int:
        assert quantity.endswith("Mi"), quantity
        return int(quantity[:-2])

    assert mib(resources["requests"]["ephemeral-storage"]) >= mib(tmp["emptyDir"]["sizeLimit"])
    limit = mib(resources["limits"]["ephemeral-storage"])
    assert limit >= mib(tmp["emptyDir"]["sizeLimit"]) + 50 + 64  # and the image's writable layer
    assert "cpu" not in resources["limits"]  # by choice: docs/install.md#what-kube-score-reports


def test_disruption_budget_and_topology_spread(tmp_path: Path) -> None:
    assert not by_kind(render(tmp_path), "PodDisruptionBudget")
    pdb = one(render(tmp_path, {"podDisruptionBudget": {"enabled": True}}), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # Two replicas, only the leader ready: the budget would never let it go.
    values = {"replicaCount": 2, "podDisruptionBudget": {"enabled": True}}
    result = helm(
        "template", "x", str(CHART), "--kube-version", KUBE_VERSION,
        "-f", values_file(tmp_path, values), check=False,
    )  # fmt: skip
    assert result.returncode != 0 and "health.standbyReady: true" in result.stderr
    docs = render(tmp_path, {**values, "health": {"standbyReady": True}})
    assert one(docs, "PodDisruptionBudget") and env_of(docs)["MSJ_READY_STANDBY"] == "1"
    spread = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
              "whenUnsatisfiable": "ScheduleAnyway"}  # fmt: skip
    pod = one(render(tmp_path, {"topologySpreadConstraints": [spread]}), "Deployment")
    (constraint,) = pod["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert constraint == {
        **spread,
        "labelSelector": {"matchLabels": {
            "app.kubernetes.io/name": "multislice-operator",
            "app.kubernetes.io/instance": "multislice-operator",
        }},
    }  # fmt: skip


def test_prometheus_rule_ships_the_alerts_file(tmp_path: Path) -> None:
    assert not by_kind(render(tmp_path), "PrometheusRule")
    values = {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}}
    rule = one(render(tmp_path, values), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    shipped = yaml.safe_load((CHART / "alerts" / "multislice-operator.yaml").read_text())
    assert rule["spec"] == shipped
    alerts = {r["alert"] for r in rule["spec"]["groups"][0]["rules"]}
    assert {"MultisliceOperatorNotReconciling", "MultisliceGangRollbacks"} <= alerts


def test_pod_monitoring_scrapes_with_a_token_of_its_own(tmp_path: Path) -> None:
    docs = render(tmp_path, {"metrics": {"podMonitoring": {"enabled": True}}})
    (endpoint,) = one(docs, "PodMonitoring")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["port"] == "metrics"
    secret = endpoint["authorization"]["credentials"]["secret"]
    token = one(docs, "Secret")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert secret == {"name": token["metadata"]["name"], "key": "token"}
    scraper = token["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    (binding,) = [
        b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"].endswith("-reader")
    ]
    assert {"kind": "ServiceAccount", "name": scraper, "namespace": "msj-system"} in binding[
        "subjects"
    ]
    # GMP's collector may read that one Secret, and the operator still no Secret at all.
    (reader,) = [r for r in by_kind(docs, "Role") if r["rules"][0]["resources"] == ["secrets"]]
    assert reader["rules"][0]["resourceNames"] == [token["metadata"]["name"]]
    assert not any(r[1] == "secrets" for r in rules_of(docs))


def test_kueue_status_patch_is_limited_to_the_named_checks(tmp_path: Path) -> None:
    values = {"kueue": {"enabled": True, "admissionCheck": {"name": "gang", "extraNames": ["b"]}}}
    (cluster_role,) = by_kind(operator_roles(render(tmp_path, values)), "ClusterRole")
    (rule,) = [r for r in cluster_role["rules"] if r["resources"] == ["admissionchecks/status"]]
    assert rule["resourceNames"] == ["gang", "b"]


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"replicaCount": "two"}, "/replicaCount"),
        ({"operator": {"logFormat": "xml"}}, "/operator/logFormat"),
        ({"operator": {"logLevel": "trace"}}, "/operator/logLevel"),
        ({"metrics": {"port": 70000}}, "/metrics/port"),
        ({"gke": {"nodeLocations": "us-central2-b"}}, "/gke/nodeLocations"),
        ({"gke": {"nodes": {"oauthScopes": ["storage-full"]}}}, "/gke/nodes/oauthScopes/0"),
        ({"gke": {"nodes": {"workloadIdentity": "yes"}}}, "/gke/nodes/workloadIdentity"),
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
        ({"serviceAccount": {"gcpServiceAccount": "not-an-email"}}, "gcpServiceAccount"),
        ({"metric": {"port": 1}}, "'metric' not allowed"),
        ({"image": {"repository": ""}}, "/image/repository"),
        ({"image": {"repository": "r", "digest": "latest"}}, "/image/digest"),
        ({"image": {"repository": "r", "digest": "sha256:abc"}}, "/image/digest"),
        ({"extraEnv": [{"name": "MSJ_GC_INTERVAL_SECONDS", "value": 60}]}, "/extraEnv/0/value"),
        # Metrics name every tenant's jobs: never outside the cluster.
        ({"metrics": {"service": {"type": "LoadBalancer"}}}, "/metrics/service/type"),
        ({"metrics": {"service": {"type": "NodePort"}}}, "/metrics/service/type"),
        # An endpoint override keeps the credentials: never over plain HTTP.
        ({"gke": {"endpoint": "http://10.0.0.2"}}, "/gke/endpoint"),
        # An empty peer list would admit everyone.
        (
            {"metrics": {"networkPolicy": {"enabled": True, "from": []}}},
            "/metrics/networkPolicy/from",
        ),
        ({"liveness": {"port": 8080}}, "'liveness' not allowed"),  # now health.port
        # A misspelt key of an env entry would silently drop the value.
        ({"extraEnv": [{"name": "MSJ_GC_INTERVAL_SECONDS", "vaule": "60"}]}, "/extraEnv/0"),
        # The operator's pod stays within the Pod Security "restricted" level.
        ({"securityContext": {"privileged": True}}, "/securityContext/privileged"),
        ({"securityContext": {"allowPrivilegeEscalation": True}}, "allowPrivilegeEscalation"),
        ({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "/capabilities/add/0"),
        ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
        ({"podSecurityContext": {"runAsNonroot": True}}, "'runAsNonroot' not allowed"),
        ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
        ({"resources": {"requests": {"cpu": "1 core"}}}, "/resources/requests/cpu"),
        ({"rbac": {"userRoles": {"editorAggregation": True}}}, "editorAggregation"),
    ],
)
def test_schema_rejects_bad_values(tmp_path: Path, values: dict[str, Any], needle: str) -> None:
    assert_refused(tmp_path, values, needle)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        # Two listeners on one port: the second never binds and the pod crash-loops.
        ({"health": {"port": 8000}}, "health.port (8000) is metrics.port"),
        ({"metrics": {"port": 8081}, "health": {"port": 8081}}, "health.port (8081)"),
        # Prometheus and GMP refuse a scrape timeout longer than the interval.
        (
            {"metrics": {"serviceMonitor": {"enabled": True, "interval": "30s",
                                            "scrapeTimeout": "1m"}}},
            "metrics.serviceMonitor.scrapeTimeout (1m) is longer than its interval (30s)",
        ),
        (
            {"metrics": {"podMonitoring": {"enabled": True, "interval": "1m",
                                           "timeout": "1m500ms"}}},
            "metrics.podMonitoring.timeout (1m500ms) is longer than its interval (1m)",
        ),
        # A budget that never allows an eviction: every node drain hangs on the operator.
        ({"podDisruptionBudget": {"enabled": True, "minAvailable": 1}}, "never allows"),
        ({"podDisruptionBudget": {"enabled": True, "minAvailable": "100%"}}, "never allows"),
        ({"podDisruptionBudget": {"enabled": True, "minAvailable": "60%"}}, "never allows"),
        ({"podDisruptionBudget": {"enabled": True, "maxUnavailable": 0}}, "never allows"),
        (
            {"replicaCount": 2, "health": {"standbyReady": True},
             "podDisruptionBudget": {"enabled": True, "minAvailable": 2}},
            "never allows",
        ),
        # No metrics endpoint: nothing may scrape it.
        ({"metrics": {"port": 0, "serviceMonitor": {"enabled": True}}}, "metrics.port is 0"),
        ({"metrics": {"port": 0, "podMonitoring": {"enabled": True}}}, "metrics.port is 0"),
        ({"metrics": {"port": 0, "prometheusRule": {"enabled": True}}}, "metrics.port is 0"),
        # An agent image for an in-place restart that is off would be silently unused.
        (
            {"inPlaceRestart": {"enabled": False, "agentImage": "a/b:1"}},
            "inPlaceRestart.agentImage (a/b:1) is set but inPlaceRestart.enabled is false",
        ),
    ],
)  # fmt: skip
def test_chart_refuses_values_that_contradict_each_other(
    tmp_path: Path, values: dict[str, Any], needle: str
) -> None:
    """What a JSON schema cannot say (it compares no two values): the templates' `fail`."""
    assert_refused(tmp_path, values, needle)


def assert_refused(tmp_path: Path, values: dict[str, Any], needle: str) -> None:
    result = helm(
        "template", "x", str(CHART), "--kube-version", KUBE_VERSION,
        "-f", values_file(tmp_path, values), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert needle in result.stderr, result.stderr


def test_budgets_and_timeouts_that_leave_room_render(tmp_path: Path) -> None:
    budget = {"enabled": True, "minAvailable": 1}
    values = {"replicaCount": 2, "health": {"standbyReady": True}, "podDisruptionBudget": budget}
    assert one(render(tmp_path, values), "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    budget = {"enabled": True, "minAvailable": "50%"}
    values = {"replicaCount": 2, "health": {"standbyReady": True}, "podDisruptionBudget": budget}
    assert one(render(tmp_path, values), "PodDisruptionBudget")["spec"]["minAvailable"] == "50%"
    monitor = {"enabled": True, "interval": "1m", "scrapeTimeout": "1m"}  # equal is allowed
    (endpoint,) = one(render(tmp_path, {"metrics": {"serviceMonitor": monitor}}), "ServiceMonitor")[
        "spec"
    ]["endpoints"]
    assert endpoint["scrapeTimeout"] == "1m"
    monitor = {"enabled": True, "interval": "1m30s", "timeout": "90000ms"}
    assert one(render(tmp_path, {"metrics": {"podMonitoring": monitor}}), "PodMonitoring")
    limits = {"cpu": 1, "memory": "512Mi", "ephemeral-storage": "1.5Gi"}
    resources = {"limits": limits, "requests": {"cpu": "100m", "memory": "1e8"}}
    assert container(render(tmp_path, {"resources": resources}))["resources"]["limits"] == limits


def test_metrics_port_0_turns_the_metrics_off(tmp_path: Path) -> None:
    """docs/metrics.md: `metrics.port: 0` turns the metrics off (MSJ_METRICS_PORT=0), so the
    pod has no metrics port and nothing points at one."""
    docs = render(tmp_path, {"metrics": {"port": 0}})
    assert env_of(docs)["MSJ_METRICS_PORT"] == "0"
    assert [p["name"] for p in container(docs)["ports"]] == ["healthz"]
    assert not by_kind(docs, "Service")


# ---------------------------------------------------------------- against the real apiserver


@pytest.fixture(scope="module")
def api(kube_api: ControlPlane) -> Iterator[client.ApiClient]:
    api_client = kube_api.api_client()
    install_crds(api_client, bin_dir() / "jobset.x-k8s.io_jobsets.yaml")
    yield api_client
    api_client.close()


@pytest.mark.parametrize("values", [{}, CUSTOM_VALUES], ids=["default", "custom"])
def test_manifests_pass_server_side_dry_run(
    api: client.ApiClient, kube_api: ControlPlane, namespace: Any, tmp_path: Path, values: Any
) -> None:
    release_ns = namespace(kube_api, "msj-chart")
    values = copy.deepcopy(values)
    if values.get("watchNamespaces"):  # KopfPeerings live in the watched namespaces
        values["watchNamespaces"] = [namespace(kube_api, "team") for _ in range(2)]
    docs = render(tmp_path, values, namespace=release_ns)
    # ServiceMonitor needs the Prometheus Operator's CRD, which this apiserver lacks.
    applied = [d for d in docs if d["kind"] != "ServiceMonitor"]
    server_dry_run(kube_api, applied)


def server_dry_run(kube_api: ControlPlane, docs: list[dict[str, Any]]) -> None:
    """Every document accepted by a server-side apply dry run (schemas, CEL, admission)."""
    result = kubectl(
        kube_api,
        "apply", "--server-side", "--dry-run=server", "--field-manager=chart-test", "-f", "-",
        stdin=yaml.safe_dump_all(docs),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for doc in docs:
        assert f"{doc['metadata']['name']} serverside-applied (server dry run)" in result.stdout


def notes(cp: ControlPlane, tmp_path: Path, values: dict[str, Any]) -> str:
    """NOTES.txt as `helm install` prints it (a client dry run: nothing is installed)."""
    result = subprocess.run(
        [str(bin_dir() / "helm"), "install", "notes", str(CHART), "-n", "msj-notes",
         "--dry-run=client", "-f", values_file(tmp_path, values)],
        capture_output=True, text=True, timeout=60, env=cp.client_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_warn_when_the_tpu_nodes_would_run_as_the_default_account(
    api: client.ApiClient, kube_api: ControlPlane, tmp_path: Path
) -> None:
    managed = {"gke": {"project": "p", "location": "us-east5-b", "cluster": "c"}}
    text = notes(kube_api, tmp_path, managed)
    assert "WARNING: gke.nodes.serviceAccount is empty" in text
    assert "cloud-platform scope" in text and "docs/install.md#the-tpu-nodes-identity" in text
    assert "Admission policies: on" in text  # this apiserver serves them (1.34)
    dedicated = {
        "gke": {**managed["gke"], "nodes": {"serviceAccount": "n@p.iam.gserviceaccount.com"}}
    }
    assert "WARNING" not in notes(kube_api, tmp_path, dedicated)
    assert "WARNING" not in notes(kube_api, tmp_path, {})  # Existing mode: no node pools made


def explain(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl explain`, once the apiserver publishes the CRD's OpenAPI v3 document.

    The apiserver builds that document asynchronously after the CRD is established, so a first
    explain can read "couldn't find resource" (seen in CI); only that answer is retried."""
    deadline = time.monotonic() + 60
    while True:
        result = kubectl(cp, "explain", *args)
        if result.returncode == 0 or "couldn't find resource" not in result.stderr:
            return result
        if time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def test_kubectl_explain(api: client.ApiClient, kube_api: ControlPlane) -> None:
    spec = explain(kube_api, "multislicejob.spec")
    assert spec.returncode == 0, spec.stderr
    text = " ".join(spec.stdout.split())  # kubectl wraps descriptions
    for needle in (
        "identical TPU slices, provisioned all or none",  # the spec's own description
        "Cloud TPU accelerator type of every slice",
        "Number of identical slices (1-256)",
        "Suspend the job",
    ):
        assert needle in text, spec.stdout
    tree = explain(kube_api, "multislicejob.spec", "--recursive")
    assert tree.returncode == 0, tree.stderr
    for field in ("nonRetryableExitCodes", "globalBatchTokens", "timeoutSeconds", "reservation"):
        assert field in tree.stdout
    nested = explain(kube_api, "msj.spec.failurePolicy.maxRestarts")
    assert (
        "Restarts of all slices for the program's own failures (cause workload or hang) "
        "allowed before the job fails" in " ".join(nested.stdout.split())
    )


# ---------------------------------------------------------------- RBAC: enough and no more


class Rbac:
    """The chart's ServiceAccount, ClusterRole and binding, created for real, then removed."""

    def __init__(self, cp: ControlPlane, api_client: client.ApiClient, tmp_path: Path) -> None:
        self.cp, self.api_client, self.tmp_path = cp, api_client, tmp_path
        self.cluster_scoped: list[tuple[str, str]] = []
        self.lease_name = ""  # the last install's leader-election Lease (its fullname)

    def install(
        self,
        ns: str,
        drop: tuple[str, str, str] | None = None,
        kueue: str | None = None,
        values: dict[str, Any] | None = None,
    ) -> Path:
        """Apply the rendered RBAC (minus one verb) and admission policies, and return a
        kubeconfig acting as the SA. `kueue`: the AdmissionCheck the operator may set Active."""
        release = f"r-{uuid.uuid4().hex[:6]}"  # cluster-scoped names must not collide
        # The SA name as installed by default; the user name must fit a certificate CN (64).
        values = {
            "watchNamespaces": [ns],
            "serviceAccount": {"name": "multislice-operator"},
            "rbac": {
                "userRoles": {"create": False},  # cluster-wide, one name: not here
                # The operator runs its jobs in its own namespace here, which the JobSet policy
                # refuses unless listed.
                "admissionPolicy": {"allowedSystemNamespaces": [ns]},
            },
            **(values or {}),
        }
        if kueue:
            values["kueue"] = {"enabled": True, "admissionCheck": {"name": kueue}}
        docs = render(self.tmp_path, values, release=release, namespace=ns)
        self.lease_name = env_of(docs)["MSJ_LEADER_ELECTION_NAME"]
        kinds = (
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        )
        objs = [d for d in docs if d["kind"] in kinds]
        ours = operator_roles(docs)
        assert any(d["kind"] == "Role" for d in ours)  # namespaced grants: a Role in `ns`
        if drop is not None:  # the same grants, one rule per verb, minus one
            assert drop in rules_of(docs)
            for each in ours:
                each["rules"] = [
                    {"apiGroups": [g], "resources": [r], "verbs": [v]}
                    for g, r, v in sorted(grants_of([each]) - {drop})
                ]
        result = kubectl(self.cp, "apply", "-f", "-", stdin=yaml.safe_dump_all(objs))
        assert result.returncode == 0, result.stderr
        plural = {
            "ClusterRole": "clusterroles",
            "ClusterRoleBinding": "clusterrolebindings",
            "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
            "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
        }
        self.cluster_scoped += [
            (plural[d["kind"]], d["metadata"]["name"]) for d in objs if d["kind"] in plural
        ]
        sa = next(d for d in objs if d["kind"] == "ServiceAccount")["metadata"]["name"]
        written = self.cp.user_kubeconfig(
            f"system:serviceaccount:{ns}:{sa}",
            ("system:serviceaccounts", f"system:serviceaccounts:{ns}"),
        )
        # Its file name holds the user name's colons, and KUBECONFIG is a colon-separated list.
        path = self.tmp_path / f"kubeconfig-{release}"
        path.write_text(written.read_text())
        return path

    def cleanup(self) -> None:
        for kind, name in self.cluster_scoped:
            kubectl(self.cp, "delete", kind, name, "--ignore-not-found")


@pytest.fixture
def rbac(api: client.ApiClient, kube_api: ControlPlane, tmp_path: Path) -> Iterator[Rbac]:
    r = Rbac(kube_api, api, tmp_path)
    yield r
    r.cleanup()


POOLS = ("chart-v4-0", "chart-v4-1")


@pytest.fixture(scope="module")
def v4_pools(api: client.ApiClient) -> Iterator[None]:
    """Two Ready v4-16 node pools (2 hosts each): Existing-mode capacity no other test matches."""
    core = client.CoreV1Api(api)
    for pool in POOLS:
        for name in register_tpu_nodes(api, pool, 2, "tpu-v4-podslice", "2x2x2", 4):
            core.patch_node_status(
                name, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            )
    yield
    for pool in POOLS:
        delete_nodes(api, pool)


def job(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": name},
        "spec": {
            "accelerator": "v4-16",
            "slices": 2,
            "provisioning": {"mode": "Existing"},
            "template": {"spec": {"containers": [{"name": "train", "image": "img:1"}]}},
        },
    }
    body["spec"].update(spec)
    return body


class Jobs:
    def __init__(self, api_client: client.ApiClient, ns: str, op: OperatorProcess) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.ns, self.op = ns, op

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            models.GROUP, models.VERSION, self.ns, models.PLURAL, body
        )

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                models.GROUP, models.VERSION, self.ns, models.PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            models.GROUP, models.VERSION, self.ns, models.PLURAL, name, patch
        )

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            models.GROUP, models.VERSION, self.ns, models.PLURAL, name
        )

    def jobset(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                *JS, self.ns, "jobsets", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def jobset_status(self, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            *JS, self.ns, "jobsets", name, {"status": status}
        )

    def phase(self, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            got = self.get(name)
            return got if got and (got.get("status") or {}).get("phase") == phase else None

        return wait_for(
            check,
            timeout,
            f"{name} phase {phase}",
            on_timeout=lambda: f"{self.get(name)}\noperator log:\n{self.op.log_tail(40)}",
        )

    def gone(self, name: str, timeout: float = 30) -> None:
        wait_for(
            lambda: self.get(name) is None, timeout, f"{name} deleted", on_timeout=self.op.log_tail
        )

    def reasons(self, name: str) -> set[str]:
        events = self.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={name}"
        ).items
        return {e.reason for e in events}

    def pod(self, job_name: str, name: str, labels: dict[str, str] | None = None) -> None:
        """A pod of the job's JobSet, labelled as the operator's template and the JobSet
        controller label it (no JobSet controller here); `labels` replaces them."""
        if labels is None:
            labels = {
                "multislice.dev/job-name": job_name,
                "app.kubernetes.io/managed-by": "multislice-operator",
                "jobset.sigs.k8s.io/jobset-name": job_name,
                "jobset.sigs.k8s.io/job-index": "0",
                "jobset.sigs.k8s.io/restart-attempt": "0",
            }
        body = {
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "train", "image": "img:1"}]},
        }
        self.core.create_namespaced_pod(self.ns, body)

    def unschedulable(self, name: str) -> None:
        """The pod as kube-scheduler leaves one it cannot place (there is none here): a pod no
        scheduler looked at is the scheduler grace's, not the startup deadline's (issue 56)."""
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/0 nodes are available"}  # fmt: skip
        self.core.patch_namespaced_pod_status(name, self.ns, {"status": {"conditions": [cond]}})

    def pod_annotations(self, name: str) -> dict[str, str] | None:
        try:
            pod = self.core.read_namespaced_pod(name, self.ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(pod.metadata.annotations or {})


def rj_status(ready: int = 0, active: int = 0, succeeded: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "name": "slice",
            "ready": ready,
            "active": active,
            "succeeded": succeeded,
            "failed": 0,
            "suspended": 0,
        }
    ]


COMPLETED = {
    "terminalState": "Completed",
    "conditions": [
        {
            "type": "Completed",
            "status": "True",
            "reason": "AllJobsCompleted",
            "message": "done",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ],
    "replicatedJobsStatus": rj_status(succeeded=2),
}


def refused(log: str) -> bool:
    """The apiserver said no: an ApiException (403) or kopf's "Not enough permissions"."""
    lowered = log.lower()
    return any(s in lowered for s in ("(403)", "status=403", "forbidden", "not enough permissions"))


def start_operator(kubeconfig: Path, ns: str, tmp_path: Path, lease: str) -> OperatorProcess:
    return OperatorProcess(
        kubeconfig,
        # Leader election as the chart runs it, on the Leases its Role names (release namespace).
        [
            "--resync-seconds",
            "2",
            "--leader-elect",
            "--leader-election-namespace",
            ns,
            "--leader-election-name",
            lease,
        ],
        namespaces=[ns],
        log_path=tmp_path / "operator.log",
    ).start()


def test_chart_rbac_is_enough_for_a_whole_lifecycle(
    api: client.ApiClient,
    kube_api: ControlPlane,
    namespace: Any,
    rbac: Rbac,
    v4_pools: None,
    tmp_path: Path,
) -> None:
    ns = namespace(kube_api, "msj-rbac")
    op = start_operator(rbac.install(ns), ns, tmp_path, rbac.lease_name)
    try:
        jobs = Jobs(api, ns, op)
        # create -> JobSet (jobsets create, status patch, finalizer patch, events create)
        jobs.create(job("life"))
        jobs.phase("life", "Starting")
        js = wait_for(lambda: jobs.jobset("life"), 10, "JobSet created")
        assert js["metadata"]["ownerReferences"][0]["name"] == "life"
        # suspend and resume (jobsets patch)
        jobs.patch("life", {"spec": {"suspend": True}})
        jobs.phase("life", "Suspended")
        wait_for(lambda: (jobs.jobset("life") or {})["spec"]["suspend"], 10, "JobSet suspended")
        jobs.patch("life", {"spec": {"suspend": False}})
        wait_for(
            lambda: (jobs.jobset("life") or {})["spec"]["suspend"] is False, 10, "JobSet resumed"
        )
        # Running -> Succeeded (jobsets list/watch feed the index)
        jobs.jobset_status("life", {"replicatedJobsStatus": rj_status(ready=2, active=2)})
        jobs.phase("life", "Running")
        # A user's checkpoint request reaches the job's pods (pods patch).
        jobs.pod("life", "life-slice-0-0-a")
        jobs.patch("life", {"metadata": {"annotations": {CHECKPOINT_REQUEST: "r1"}}})
        wait_for(
            lambda: (
                (jobs.pod_annotations("life-slice-0-0-a") or {}).get(CHECKPOINT_REQUEST) == "r1"
            ),
            20,
            "the checkpoint request on the pod",
            on_timeout=op.log_tail,
        )
        jobs.jobset_status("life", COMPLETED)
        jobs.phase("life", "Succeeded")
        assert {"Starting", "Suspended", "Running", "Succeeded"} <= jobs.reasons("life")
        # delete completes: kopf removes its finalizer (multislicejobs patch)
        jobs.delete("life")
        jobs.gone("life")

        # ttlSecondsAfterFinished: the operator deletes the job itself (multislicejobs delete)
        jobs.create(job("ttl", ttlSecondsAfterFinished=0))
        jobs.phase("ttl", "Starting")
        # The Starting status is written before the JobSet is created (it says why first).
        wait_for(lambda: jobs.jobset("ttl"), 10, "JobSet ttl created")
        jobs.jobset_status("ttl", COMPLETED)
        jobs.gone("ttl")

        # A JobSet of the same name that is not ours: 409, read back (jobsets get), Failed.
        stranger = {
            "apiVersion": "/".join(JS),
            "kind": "JobSet",
            "metadata": {"name": "taken"},
            "spec": {"replicatedJobs": []},
        }
        jobs.custom.create_namespaced_custom_object(*JS, ns, "jobsets", stranger)
        jobs.create(job("taken"))
        failed = jobs.phase("taken", "Failed")
        assert "not owned by this job" in failed["status"]["message"]
        jobs.delete("taken")  # leave no finalizer behind for the next test module's operator
        jobs.gone("taken")

        # The startup deadline evicts the pods that never ran (pods/eviction create).
        jobs.create(job("slow", failurePolicy={"startupTimeoutSeconds": 10}))
        jobs.phase("slow", "Starting")
        wait_for(lambda: jobs.jobset("slow"), 10, "JobSet created")
        jobs.pod("slow", "slow-slice-0-0-a")
        jobs.unschedulable("slow-slice-0-0-a")
        wait_for(
            lambda: jobs.pod_annotations("slow-slice-0-0-a") is None,
            40,
            "the pod evicted after the startup deadline",
            on_timeout=op.log_tail,
        )
        # The event is posted after the evictions, in the same pass: it may trail the pod's end.
        wait_for(
            lambda: Reason.STARTUP_DEADLINE_EXCEEDED in jobs.reasons("slow"),
            10,
            "the StartupDeadlineExceeded event",
            on_timeout=op.log_tail,
        )

        # The disruption budget spent: the job fails and its JobSet goes (jobsets delete).
        jobs.create(job("budget", failurePolicy={"maxDisruptionRestarts": 0}))
        jobs.phase("budget", "Starting")
        wait_for(lambda: jobs.jobset("budget"), 10, "JobSet created")
        jobs.jobset_status("budget", {"restarts": 1})
        failed = jobs.phase("budget", "Failed")
        assert "maxDisruptionRestarts (0)" in failed["status"]["message"]
        wait_for(
            lambda: jobs.jobset("budget") is None, 20, "JobSet deleted", on_timeout=op.log_tail
        )
    finally:
        op.stop()
    assert not refused(op.log_path.read_text()), op.log_path.read_text()


def test_chart_rbac_lets_the_operator_apply_the_in_place_agents_objects(
    api: client.ApiClient, kube_api: ControlPlane, namespace: Any, rbac: Rbac
) -> None:
    """In-place restart is on by default: before an in-place JobSet the operator server-side
    applies the agents' ServiceAccount and RoleBinding in the job's namespace (render_rbac). An
    apply that creates needs `create` besides `patch`; with `patch` alone every in-place job
    stayed Starting with no JobSet (403 on each pass), first seen on the real-node lane."""
    from multislice_operator.render import inplace

    ns = namespace(kube_api, "msj-ipr")
    op = AsOperator(rbac.install(ns), ns)
    apply = {
        "ServiceAccount": client.CoreV1Api(op.api).patch_namespaced_service_account,
        "RoleBinding": client.RbacAuthorizationV1Api(op.api).patch_namespaced_role_binding,
    }
    for _, body in inplace.render_rbac(ns, inplace.AGENT_SERVICE_ACCOUNT):
        for _ in range(2):  # a create, then an apply of what is there: both are the operator's
            apply[body["kind"]](
                body["metadata"]["name"], ns, body, field_manager="multislice-operator",
                force=True, _content_type="application/apply-patch+yaml",
            )  # fmt: skip
    binding = client.RbacAuthorizationV1Api(api).read_namespaced_role_binding(
        f"{inplace.CLUSTER_ROLE}-{inplace.AGENT_SERVICE_ACCOUNT}", ns
    )
    assert binding.role_ref.name == inplace.CLUSTER_ROLE
    assert binding.subjects[0].name == inplace.AGENT_SERVICE_ACCOUNT


# ---------------------------------------------------------------- admission policies


class AsOperator:
    """The operator's ServiceAccount's own requests (its kubeconfig), each one's verdict."""

    def __init__(self, kubeconfig: Path, ns: str) -> None:
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core, self.batch = client.CoreV1Api(self.api), client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ns = ns

    def verdict(self, call: Any) -> str:
        """ "allowed", or the apiserver's refusal message."""
        try:
            call()
        except ApiException as exc:
            assert exc.status == 403, exc.body
            return str(json.loads(exc.body)["message"])
        return "allowed"

    def annotate(self, pod: str, key: str) -> str:
        patch = {"metadata": {"annotations": {key: "r1"}}}
        return self.verdict(lambda: self.core.patch_namespaced_pod(pod, self.ns, patch))

    def patch(self, pod: str, patch: dict[str, Any]) -> str:
        return self.verdict(lambda: self.core.patch_namespaced_pod(pod, self.ns, patch))

    def evict(self, pod: str, dry_run: bool = False) -> str:
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": self.ns}}  # fmt: skip
        kwargs = {"dry_run": "All"} if dry_run else {}
        return self.verdict(
            lambda: self.core.create_namespaced_pod_eviction(pod, self.ns, body, **kwargs)
        )

    def create_job(self, name: str, dry_run: bool, **meta: Any) -> str:
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, **meta},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "img:1"}]}}},
        }  # fmt: skip
        kwargs = {"dry_run": "All"} if dry_run else {}
        return self.verdict(lambda: self.batch.create_namespaced_job(self.ns, body, **kwargs))

    def delete_job(self, name: str) -> str:
        return self.verdict(
            lambda: self.batch.delete_namespaced_job(name, self.ns, propagation_policy="Background")
        )

    def create_jobset(self, ns: str, body: dict[str, Any], dry_run: bool = False) -> str:
        kwargs = {"dry_run": "All"} if dry_run else {}
        return self.verdict(
            lambda: self.custom.create_namespaced_custom_object(*JS, ns, "jobsets", body, **kwargs)
        )

    def patch_jobset(self, ns: str, name: str, patch: dict[str, Any]) -> str:
        return self.verdict(
            lambda: self.custom.patch_namespaced_custom_object(*JS, ns, "jobsets", name, patch)
        )

    def delete_jobset(self, ns: str, name: str) -> str:
        return self.verdict(
            lambda: self.custom.delete_namespaced_custom_object(*JS, ns, "jobsets", name)
        )

    def create_pod_group(self, ns: str, body: dict[str, Any], dry_run: bool = False) -> str:
        kwargs = {"dry_run": "All"} if dry_run else {}
        return self.verdict(
            lambda: self.custom.create_namespaced_custom_object(
                *PG, ns, "podgroups", body, **kwargs
            )
        )

    def patch_pod_group(self, ns: str, name: str, patch: dict[str, Any]) -> str:
        return self.verdict(
            lambda: self.custom.patch_namespaced_custom_object(*PG, ns, "podgroups", name, patch)
        )

    def post_event(self, ns: str, about: dict[str, Any], message: str = "m") -> tuple[str, str]:
        """An Event about `about` (an involvedObject) in `ns`: (verdict, its name if made)."""
        body = {"metadata": {"generateName": "probe.", "namespace": ns}, "involvedObject": about,
                "type": "Normal", "reason": "Probe", "message": message, "count": 1}  # fmt: skip
        made: list[str] = []
        verdict = self.verdict(
            lambda: made.append(self.core.create_namespaced_event(ns, body).metadata.name)
        )
        return verdict, (made or [""])[0]

    def patch_event(self, ns: str, name: str, patch: dict[str, Any]) -> str:
        return self.verdict(lambda: self.core.patch_namespaced_event(name, ns, patch))

    def close(self) -> None:
        self.api.close()


POLICY = "ValidatingAdmissionPolicy"


def jobset_labels(job: str) -> dict[str, str]:
    return {"multislice.dev/job-name": job, "app.kubernetes.io/managed-by": "multislice-operator"}


def msj_owner(job: str, kind: str = models.KIND, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": models.API_VERSION, "kind": kind, "name": job,
            "uid": str(uuid.uuid4()), "controller": controller}  # fmt: skip


def jobset_body(
    name: str,
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    pod: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A JobSet as the operator renders one (its labels, one controller owner reference to the
    MultisliceJob of its name), unless told otherwise."""
    meta: dict[str, Any] = {
        "name": name,
        "labels": jobset_labels(name) if labels is None else labels,
        "ownerReferences": [msj_owner(name)] if owners is None else owners,
    }
    pod = pod or {"restartPolicy": "Never", "containers": [{"name": "c", "image": "img:1"}]}
    return {
        "apiVersion": "/".join(JS), "kind": "JobSet", "metadata": meta,
        "spec": {"replicatedJobs": [{"name": "slice", "replicas": 1,
                                     "template": {"spec": {"template": {"spec": pod}}}}]},
    }  # fmt: skip


def test_admission_policies_narrow_the_operators_pod_and_job_grants(
    api: client.ApiClient, kube_api: ControlPlane, namespace: Any, rbac: Rbac
) -> None:
    """The operator's ServiceAccount, by its own requests to the real apiserver: what it needs
    passes (a checkpoint annotation on a MultisliceJob's pod, evicting it, a Job dry run), and
    the same grants used otherwise are refused by the chart's policies, not by RBAC."""
    ns = namespace(kube_api, "msj-vap")
    op = AsOperator(rbac.install(ns), ns)
    jobs = Jobs(api, ns, None)  # type: ignore[arg-type]
    try:
        jobs.pod("train", "train-slice-0-0-a")
        jobs.pod("train", "train-slice-0-1-b")
        jobs.pod("x", "web-7d9f8-abcde", labels={"app": "web"})  # no MultisliceJob's
        jobs.pod("x", "fake-0", labels={"multislice.dev/job-name": "x"})  # ours in part only

        # The policies take effect once the apiserver has seen them (and, for evictions, listed
        # the pods they read): wait for a first refusal of each. The eviction probe is a dry run;
        # a Job created before the policy is in force is deleted again at once, so that the dry
        # run of the same name below meets no AlreadyExists.
        def job_refused() -> bool:
            verdict = op.create_job("probe", dry_run=False)
            if verdict == "allowed":
                client.BatchV1Api(api).delete_namespaced_job(
                    "probe", ns, propagation_policy="Background"
                )  # not Orphan, batch/v1's default: its finalizer would wait for a GC
            return POLICY in verdict

        # Each eviction binding has its own informer on pods: wait for every one (web lacks
        # every label, fake-0 only the JobSet's and managed-by), not only the first.
        wait_for(
            lambda: (
                job_refused()
                and POLICY in op.evict("web-7d9f8-abcde", dry_run=True)
                and POLICY in op.evict("fake-0", dry_run=True)
            ),
            30,
            "the policies in force",
        )
        ours = "train-slice-0-0-a"
        assert op.annotate(ours, CHECKPOINT_REQUEST) == "allowed"
        assert (jobs.pod_annotations(ours) or {})[CHECKPOINT_REQUEST] == "r1"
        assert op.create_job("probe", dry_run=True) == "allowed"
        # A pod of the job, changed otherwise: another annotation, its image, labels, finalizers.
        for change in (
            {"metadata": {"annotations": {"example.com/x": "1"}}},
            {"spec": {"containers": [{"name": "train", "image": "evil:1"}]}},
            {"metadata": {"labels": {"app": "web"}}},
            {"metadata": {"finalizers": ["example.com/hold"]}},
        ):
            verdict = op.patch(ours, change)
            assert POLICY in verdict and "only the multislice.dev/ annotations" in verdict, change
        # Pods outside any MultisliceJob: neither annotated nor evicted.
        for pod in ("web-7d9f8-abcde", "fake-0"):
            verdict = op.annotate(pod, CHECKPOINT_REQUEST)
            assert POLICY in verdict and "only the pods of a MultisliceJob" in verdict, pod
            verdict = op.evict(pod)
            assert POLICY in verdict and f"pod {pod} lacks" in verdict, pod
            assert jobs.pod_annotations(pod) == {}
        assert POLICY in op.create_job("real", dry_run=False)
        # spec.preflight: a MultisliceJob's compile Job, and only that, is created and deleted.
        labels = {"multislice.dev/job-name": "train"}
        owner = [msj_owner("train")]
        assert POLICY in op.create_job("train-compile", False, labels=labels, ownerReferences=owner)
        assert POLICY in op.create_job("train-preflight", False, labels=labels)  # no owner
        assert op.create_job("train-preflight", False, labels=labels, ownerReferences=owner) == (
            "allowed"
        )
        assert op.delete_job("train-preflight") == "allowed"
        client.BatchV1Api(api).create_namespaced_job(
            ns, {"metadata": {"name": "other"}, "spec": {"template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}},
        )  # fmt: skip
        assert POLICY in op.delete_job("other")
        assert jobs.pod_annotations(ours) is not None
        assert op.evict(ours) == "allowed"
        wait_for(lambda: jobs.pod_annotations(ours) is None, 10, "the job's pod evicted")
        assert jobs.pod_annotations("train-slice-0-1-b") is not None  # only the one asked
    finally:
        op.close()


def test_admission_policy_narrows_the_operators_jobset_grants(
    api: client.ApiClient, kube_api: ControlPlane, namespace: Any, rbac: Rbac
) -> None:
    """The default cluster-wide install (no watchNamespaces): RBAC lets the operator's
    ServiceAccount create, patch and delete JobSets in every namespace, with any pod template.
    The chart's JobSet policy lets through only what the operator does (the JobSet of a
    MultisliceJob: its labels, one controller owner reference to that job) and nothing in a
    system namespace: issue 44's probe, a JobSet in kube-system running as another account on
    the host's network and PID namespace, privileged, is refused."""
    release_ns = namespace(kube_api, "msj-js-op")  # the operator's own: a system namespace too
    team = namespace(kube_api, "msj-js-team")
    values = {"watchNamespaces": [], "rbac": {"userRoles": {"create": False}}}
    op = AsOperator(rbac.install(release_ns, values=values), team)
    admin = client.CustomObjectsApi(api)
    hostile = {
        "restartPolicy": "Never", "serviceAccountName": "attachdetach-controller",
        "hostNetwork": True, "hostPID": True,
        "containers": [{"name": "c", "image": "img:1", "securityContext": {"privileged": True}}],
    }  # fmt: skip
    probe = jobset_body("probe", pod=hostile)
    try:
        wait_for(
            lambda: POLICY in op.create_jobset("kube-system", probe, dry_run=True),
            30,
            "the JobSet policy in force",
        )
        for ns in ("kube-system", "kube-public", "kube-node-lease", release_ns):
            verdict = op.create_jobset(ns, probe)
            assert POLICY in verdict and f"in the system namespace {ns}" in verdict, ns
        # Even a JobSet of a MultisliceJob there (made by someone else) is neither changed nor
        # deleted.
        admin.create_namespaced_custom_object(*JS, "kube-system", "jobsets", jobset_body("sys"))
        try:
            assert "system namespace" in op.patch_jobset("kube-system", "sys", {"spec": {}})
            assert "system namespace" in op.delete_jobset("kube-system", "sys")
        finally:
            admin.delete_namespaced_custom_object(*JS, "kube-system", "jobsets", "sys")
        # What the operator does: its dry run, the create, suspend/resume, the delete.
        assert op.create_jobset(team, jobset_body("train"), dry_run=True) == "allowed"
        assert op.create_jobset(team, jobset_body("train")) == "allowed"
        assert op.patch_jobset(team, "train", {"spec": {"suspend": True}}) == "allowed"
        # Not a MultisliceJob's JobSet.
        ours = "only the JobSet of a MultisliceJob"
        for bad in (
            jobset_body("bare", labels={}),
            jobset_body("unmanaged", labels={"multislice.dev/job-name": "unmanaged"}),
            jobset_body("orphan", owners=[]),
            jobset_body("deployed", owners=[msj_owner("deployed", kind="Deployment")]),
            jobset_body("borrowed", owners=[msj_owner("another-job")]),
            jobset_body("not-controlled", owners=[msj_owner("not-controlled", controller=False)]),
        ):
            verdict = op.create_jobset(team, bad, dry_run=True)
            assert POLICY in verdict and ours in verdict, bad["metadata"]
        relabel = {"metadata": {"labels": {"app.kubernetes.io/managed-by": "someone"}}}
        assert ours in op.patch_jobset(team, "train", relabel)
        # Someone else's JobSet: neither relabelled into ours, nor changed, nor deleted.
        admin.create_namespaced_custom_object(
            *JS, team, "jobsets", jobset_body("theirs", labels={}, owners=[])
        )
        adopt = {"metadata": {"labels": jobset_labels("theirs"),
                              "ownerReferences": [msj_owner("theirs")]}}  # fmt: skip
        verdict = op.patch_jobset(team, "theirs", adopt)
        assert POLICY in verdict and "as stored before the request too" in verdict
        assert POLICY in op.patch_jobset(team, "theirs", {"spec": {"suspend": True}})
        assert POLICY in op.delete_jobset(team, "theirs")
        assert op.delete_jobset(team, "train") == "allowed"
    finally:
        op.close()


def pod_group_body(
    name: str, labels: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A PodGroup as the operator renders one (render/podgroup.py), unless told otherwise."""
    meta: dict[str, Any] = {
        "name": name,
        "labels": jobset_labels(name) if labels is None else labels,
        "ownerReferences": [msj_owner(name)] if owners is None else owners,
    }
    return {"apiVersion": "/".join(PG), "kind": "PodGroup", "metadata": meta,
            "spec": {"schedulingPolicy": {"gang": {"minCount": 8}}}}  # fmt: skip


def test_admission_policy_limits_the_operators_pod_groups_to_its_jobs(
    kube_next: ControlPlane, kube_client: Any, namespace: Any, tmp_path: Path
) -> None:
    """On the 1.37 lane, which serves PodGroups: RBAC lets the operator create and patch any
    PodGroup of a namespace it watches; the chart's policy lets through only a MultisliceJob's,
    outside the system namespaces, as for its JobSets."""
    rbac = Rbac(kube_next, kube_client(kube_next), tmp_path)
    release_ns, team = namespace(kube_next, "msj-pg-op"), namespace(kube_next, "msj-pg-team")
    values = {"watchNamespaces": [], "rbac": {"userRoles": {"create": False}}}
    op = AsOperator(rbac.install(release_ns, values=values), team)
    ours = "only the PodGroup of a MultisliceJob"
    try:
        wait_for(
            lambda: ours in op.create_pod_group(team, pod_group_body("probe", owners=[]), True),
            30,
            "the policy in force for PodGroups",
        )
        for ns in ("kube-system", release_ns):
            verdict = op.create_pod_group(ns, pod_group_body("train"), dry_run=True)
            assert f"create, change or delete PodGroups in the system namespace {ns}" in verdict
        # What the operator does: apply its job's group (create, then patch its minCount).
        assert op.create_pod_group(team, pod_group_body("train")) == "allowed"
        resized = {"spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}}
        assert op.patch_pod_group(team, "train", resized) == "allowed"
        for bad in (
            pod_group_body("bare", labels={}),
            pod_group_body("orphan", owners=[]),
            pod_group_body("borrowed", owners=[msj_owner("another-job")]),
            pod_group_body("deployed", owners=[msj_owner("deployed", kind="Deployment")]),
        ):
            verdict = op.create_pod_group(team, bad, dry_run=True)
            assert POLICY in verdict and ours in verdict, bad["metadata"]
        relabel = {"metadata": {"labels": {"app.kubernetes.io/managed-by": "someone"}}}
        assert ours in op.patch_pod_group(team, "train", relabel)
    finally:
        op.close()
        rbac.cleanup()


def test_admission_policy_limits_the_operators_events_to_its_jobs(
    api: client.ApiClient, kube_api: ControlPlane, namespace: Any, rbac: Rbac
) -> None:
    """RBAC lets the operator post and patch any Event of a namespace it watches, about any
    object; the chart's event policy lets through only what the operator posts (an Event about a
    MultisliceJob of that namespace) and the repeat count it patches."""
    ns = namespace(kube_api, "msj-ev")
    op = AsOperator(rbac.install(ns), ns)
    job = {"apiVersion": models.API_VERSION, "kind": models.KIND, "name": "train",
           "namespace": ns, "uid": str(uuid.uuid4())}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "name": "web-0", "namespace": ns}
    only = "only about a MultisliceJob of the event's namespace"
    try:
        wait_for(lambda: POLICY in op.post_event(ns, pod)[0], 30, "the event policy in force")
        verdict, name = op.post_event(ns, job)
        assert verdict == "allowed"
        assert op.patch_event(ns, name, {"count": 2, "lastTimestamp": "2026-12-04T00:00:00Z"}) == (
            "allowed"
        )
        posted = client.CoreV1Api(api).read_namespaced_event(name, ns)
        assert (posted.count, posted.involved_object.kind) == (2, models.KIND)
        for about in (
            pod,
            {**job, "apiVersion": "example.com/v1"},  # another group's kind of that name
            {"apiVersion": "/".join(JS), "kind": "JobSet", "name": "train", "namespace": ns},
        ):
            verdict, _ = op.post_event(ns, about)
            assert POLICY in verdict and only in verdict, about
        repeat = "only to count a repeat"
        for change in (
            {"message": "the pod was fine after all"},
            {"reason": "Other"},
            {"type": "Warning"},
            {"involvedObject": {"name": "another"}},
        ):
            verdict = op.patch_event(ns, name, change)
            assert POLICY in verdict and repeat in verdict, change
        assert client.CoreV1Api(api).read_namespaced_event(name, ns).message == "m"
    finally:
        op.close()


def test_without_the_policies_rbac_alone_grants_all_of_it(
    api: client.ApiClient, kube_api: ControlPlane, namespace: Any, rbac: Rbac
) -> None:
    """What the policies add: with rbac.admissionPolicy.enabled false the same requests pass."""
    ns = namespace(kube_api, "msj-novap")
    values = {"rbac": {"admissionPolicy": {"enabled": False}, "userRoles": {"create": False}}}
    op = AsOperator(rbac.install(ns, values=values), ns)
    jobs = Jobs(api, ns, None)  # type: ignore[arg-type]
    try:
        jobs.pod("x", "web-7d9f8-abcde", labels={"app": "web"})
        assert op.patch("web-7d9f8-abcde", {"metadata": {"labels": {"stolen": "1"}}}) == "allowed"
        assert op.create_job("real", dry_run=False) == "allowed"
        assert op.evict("web-7d9f8-abcde") == "allowed"
        assert op.create_jobset(ns, jobset_body("bare", labels={}, owners=[])) == "allowed"
        about = {"apiVersion": "v1", "kind": "Pod", "name": "web-7d9f8-abcde", "namespace": ns}
        assert op.post_event(ns, about)[0] == "allowed"
    finally:
        op.close()


# ---------------------------------------------------------------- user roles, aggregated


def test_namespace_editors_run_jobs_and_viewers_read_them_through_the_aggregated_roles(
    api: client.ApiClient, kube_api: ControlPlane, namespace: Any, tmp_path: Path
) -> None:
    """The chart's multislice-editor/viewer, aggregated by Kubernetes' own clusterrole-aggregation
    controller (kube-controller-manager, run here with that controller alone) into the built-in
    roles. By default only the viewer is: a user bound to `edit` or `admin` reads MultisliceJobs
    and creates none (no TPU spending). With `editorAggregation: admin` the namespace admin
    creates them and the editor still not; with `edit` a user bound to `edit` creates, patches
    and deletes MultisliceJobs there without any hand-written rule, one bound to `view` reads
    them and creates none. Before the roles exist `edit` grants nothing on MultisliceJobs."""
    ns = namespace(kube_api, "msj-roles")
    rbac_api = client.RbacAuthorizationV1Api(api)
    for user, role in (("alice", "edit"), ("bob", "view"), ("carol", "admin")):
        rbac_api.create_namespaced_role_binding(ns, {
            "metadata": {"name": f"{user}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        })  # fmt: skip
    from kubernetes import config

    clients = {
        user: client.CustomObjectsApi(
            config.new_client_from_config(config_file=str(kube_api.user_kubeconfig(user)))
        )
        for user in ("alice", "bob", "carol")
    }
    group, version = models.API_VERSION.split("/")

    def as_user(user: str, verb: str, name: str = "", body: Any = None) -> int:
        c = clients[user]
        calls = {
            "create": lambda: c.create_namespaced_custom_object(group, version, ns, models.PLURAL,
                                                                body),
            "list": lambda: c.list_namespaced_custom_object(group, version, ns, models.PLURAL),
            "patch": lambda: c.patch_namespaced_custom_object(
                group, version, ns, models.PLURAL, name, {"spec": {"suspend": True}}),
            "delete": lambda: c.delete_namespaced_custom_object(group, version, ns,
                                                                models.PLURAL, name),
        }  # fmt: skip
        try:
            calls[verb]()
        except ApiException as exc:
            return int(exc.status)
        return 200

    def roles_for(aggregation: str) -> list[dict[str, Any]]:
        values = {"rbac": {"userRoles": {"editorAggregation": aggregation}}}
        return [
            r for r in by_kind(render(tmp_path, values), "ClusterRole")
            if r["metadata"]["name"] in ("multislice-editor", "multislice-viewer")
        ]  # fmt: skip

    roles = roles_for("edit")
    assert len(roles) == 2
    log = (tmp_path / "kcm.log").open("w")
    kcm = subprocess.Popen(
        [str(bin_dir() / "kube-controller-manager"), f"--kubeconfig={kube_api.kubeconfig}",
         "--controllers=clusterrole-aggregation", "--leader-elect=false", "--secure-port=0"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def aggregated(role: str) -> set[str]:
        rules = rbac_api.read_cluster_role(role).rules or []
        return {
            v for r in rules if "multislice.dev" in (r.api_groups or [])
            and "multislicejobs" in (r.resources or []) for v in r.verbs
        }  # fmt: skip

    try:
        assert as_user("alice", "create", body=job("before")) == 403  # `edit` alone: nothing
        assert aggregated("edit") == set()
        # The default: every role reads, none spends.
        result = kubectl(kube_api, "apply", "-f", "-", stdin=yaml.safe_dump_all(roles_for("none")))
        assert result.returncode == 0, result.stderr
        for role in ("view", "edit", "admin"):
            wait_for(lambda r=role: aggregated(r) == {"get", "list", "watch"}, 60, f"{role} reads",
                     on_timeout=lambda: (tmp_path / "kcm.log").read_text())  # fmt: skip
        for user in ("alice", "bob", "carol"):
            assert as_user(user, "list") == 200
            assert as_user(user, "create", body=job(f"{user}-default")) == 403
        # Namespace admins spend, editors still not.
        result = kubectl(kube_api, "apply", "-f", "-", stdin=yaml.safe_dump_all(roles_for("admin")))
        assert result.returncode == 0, result.stderr
        wait_for(lambda: "create" in aggregated("admin"), 60, "admin aggregated")
        assert as_user("carol", "create", body=job("carols")) == 200
        assert as_user("alice", "create", body=job("alices")) == 403
        assert as_user("carol", "delete", "carols") == 200
        result = kubectl(kube_api, "apply", "-f", "-", stdin=yaml.safe_dump_all(roles))
        assert result.returncode == 0, result.stderr
        wait_for(lambda: "create" in aggregated("edit"), 60, "edit aggregated",
                 on_timeout=lambda: (tmp_path / "kcm.log").read_text())  # fmt: skip
        wait_for(lambda: "create" in aggregated("admin"), 30, "admin aggregated")
        wait_for(lambda: aggregated("view") == {"get", "list", "watch"}, 30, "view aggregated")
        assert as_user("alice", "create", body=job("mine")) == 200
        assert as_user("alice", "patch", "mine") == 200
        assert as_user("bob", "list") == 200
        assert as_user("bob", "create", body=job("theirs")) == 403
        assert as_user("bob", "patch", "mine") == 403
        assert as_user("bob", "delete", "mine") == 403
        assert as_user("alice", "delete", "mine") == 200
    finally:
        for role in roles:  # out of edit/admin/view again while the controller still runs
            kubectl(kube_api, "delete", "clusterrole", role["metadata"]["name"],
                    "--ignore-not-found")  # fmt: skip
        try:
            wait_for(lambda: aggregated("edit") == set(), 30, "edit without the roles")
        finally:
            kcm.terminate()
            kcm.wait(30)
            log.close()
            for c in clients.values():
                c.api_client.close()


# ---------------------------------------------------------------- metrics: HTTPS + TokenReview


def curl(url: str, token: str | None = None) -> tuple[str, str]:
    """(HTTP status, body) as curl sees them (-k: the operator's certificate is self-signed)."""
    args = ["curl", "-sk", "-o", "-", "-w", "\n%{http_code}", "--max-time", "10", url]
    if token is not None:
        args[1:1] = ["-H", f"Authorization: Bearer {token}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=30).stdout
    body, _, status = out.rpartition("\n")
    return status, body


def test_metrics_need_a_token_bound_to_the_metrics_reader_role(
    api: client.ApiClient, kube_api: ControlPlane, namespace: Any, rbac: Rbac, tmp_path: Path
) -> None:
    """The operator as the chart runs it (its RBAC, --metrics-auth kubernetes): curl without a
    token is refused, a token the apiserver does not know too, a real ServiceAccount's token
    without the metrics-reader role gets 403, one bound to it the metrics."""
    ns = namespace(kube_api, "msj-metrics")
    kubeconfig = rbac.install(ns)
    reader_role = f"{rbac.lease_name}-metrics-reader"
    op = OperatorProcess(
        kubeconfig,
        ["--metrics-auth", "kubernetes", "--leader-elect", "--leader-election-namespace", ns,
         "--leader-election-name", rbac.lease_name],
        namespaces=[ns],
        log_path=tmp_path / "operator.log",
    ).start()  # fmt: skip
    core, authz = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    binding = f"{reader_role}-{ns}"
    try:
        assert op.metrics_url.startswith("https://")
        for sa in ("prometheus", "stranger"):
            core.create_namespaced_service_account(ns, {"metadata": {"name": sa}})
        authz.create_cluster_role_binding({
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": reader_role},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": ns}],
        })  # fmt: skip

        def token(sa: str) -> str:
            req = core.create_namespaced_service_account_token(sa, ns, {"spec": {}})
            return str(req.status.token)

        assert curl(op.metrics_url)[0] == "401"
        assert curl(op.metrics_url, "not-a-token")[0] == "401"
        status, body = curl(op.metrics_url, token("stranger"))
        assert (status, body) == (
            "403",
            f"Authorization denied for user system:serviceaccount:{ns}:stranger",
        )
        status, body = curl(op.metrics_url, token("prometheus"))
        assert status == "200", (status, body, op.log_tail())
        assert "multislice_build_info{" in body and "multislice_leader 1.0" in body
        # Not over plain HTTP.
        plain = op.metrics_url.replace("https://", "http://")
        assert curl(plain, token("prometheus"))[0] != "200"
    finally:
        op.stop()
        authz.delete_cluster_role_binding(binding)
    assert "metrics authentication failed" not in op.log_path.read_text()


def _no_jobset(jobs: Jobs, name: str) -> None:
    assert jobs.jobset(name) is None


def _no_status(jobs: Jobs, name: str) -> None:
    assert not (jobs.get(name) or {}).get("status")


def _no_events(jobs: Jobs, name: str) -> None:
    assert jobs.reasons(name) == set()


def _pod_not_annotated(jobs: Jobs, name: str) -> None:
    assert CHECKPOINT_REQUEST not in (jobs.pod_annotations(f"{name}-slice-0-0-a") or {})


def _pod_not_evicted(jobs: Jobs, name: str) -> None:
    assert jobs.pod_annotations(f"{name}-slice-0-0-a") is not None


@pytest.mark.parametrize(
    ("drop", "broken"),
    [
        (("jobset.x-k8s.io", "jobsets", "create"), _no_jobset),
        (("multislice.dev", "multislicejobs/status", "patch"), _no_status),
        (("", "nodes", "list"), _no_jobset),  # Existing node pools are invisible
        (("", "events", "create"), _no_events),
        (("", "pods", "patch"), _pod_not_annotated),
        (("", "pods/eviction", "create"), _pod_not_evicted),
    ],
    ids=[
        "jobsets-create",
        "status-patch",
        "nodes-list",
        "events-create",
        "pods-patch",
        "pods-eviction-create",
    ],
)
def test_chart_rbac_minus_one_verb_breaks_the_lifecycle(
    api: client.ApiClient,
    kube_api: ControlPlane,
    namespace: Any,
    rbac: Rbac,
    v4_pools: None,
    tmp_path: Path,
    drop: tuple[str, str, str],
    broken: Any,
) -> None:
    """No more than needed: drop one verb and the same lifecycle breaks at its first step."""
    ns = namespace(kube_api, "msj-minus")
    op = start_operator(rbac.install(ns, drop=drop), ns, tmp_path, rbac.lease_name)
    jobs = Jobs(api, ns, op)
    try:
        # A checkpoint request and a startup deadline, and a pod for them to act on.
        body = job("minus", failurePolicy={"startupTimeoutSeconds": 10})
        body["metadata"]["annotations"] = {CHECKPOINT_REQUEST: "r1"}
        jobs.pod("minus", "minus-slice-0-0-a")
        jobs.unschedulable("minus-slice-0-0-a")
        jobs.create(body)
        wait_for(
            lambda: refused(op.log_tail(200)),
            30,
            f"the operator to be refused {drop}",
            on_timeout=op.log_tail,
        )
        broken(jobs, "minus")
        assert (jobs.get("minus") or {}).get("status", {}).get("phase") != "Running"
        jobs.delete("minus")  # while the operator runs, so that it lifts its finalizer
        jobs.gone("minus")
    finally:
        op.stop()


def test_chart_rbac_without_jobsets_delete_cannot_stop_a_job_out_of_disruption_budget(
    api: client.ApiClient,
    kube_api: ControlPlane,
    namespace: Any,
    rbac: Rbac,
    v4_pools: None,
    tmp_path: Path,
) -> None:
    ns = namespace(kube_api, "msj-minus")
    op = start_operator(
        rbac.install(ns, drop=("jobset.x-k8s.io", "jobsets", "delete")), ns, tmp_path,
        rbac.lease_name,
    )  # fmt: skip
    jobs = Jobs(api, ns, op)
    try:
        jobs.create(job("minus", failurePolicy={"maxDisruptionRestarts": 0}))
        wait_for(lambda: jobs.jobset("minus"), 20, "JobSet created", on_timeout=op.log_tail)
        jobs.jobset_status("minus", {"restarts": 1})
        jobs.phase("minus", "Failed")
        wait_for(lambda: refused(op.log_tail(200)), 30, "delete refused", on_timeout=op.log_tail)
        assert jobs.jobset("minus") is not None
        jobs.delete("minus")
        jobs.gone("minus")
    finally:
        op.stop()


# ---------------------------------------------------------------- RBAC with Kueue (kueue.enabled)

KUEUE = ("kueue.x-k8s.io", "v1beta2")
KUEUE_RULES = {
    ("kueue.x-k8s.io", "workloads", "list"),
    ("kueue.x-k8s.io", "workloads", "watch"),
    ("kueue.x-k8s.io", "localqueues", "list"),
    ("kueue.x-k8s.io", "localqueues", "watch"),
    ("kueue.x-k8s.io", "admissionchecks", "list"),
    ("kueue.x-k8s.io", "admissionchecks", "watch"),
    ("kueue.x-k8s.io", "workloads/status", "patch"),
    ("kueue.x-k8s.io", "workloads", "get"),
    ("kueue.x-k8s.io", "workloads", "create"),
    ("kueue.x-k8s.io", "workloads", "patch"),
    ("kueue.x-k8s.io", "workloadpriorityclasses", "get"),
    ("kueue.x-k8s.io", "admissionchecks/status", "patch"),
}


def test_kueue_values_add_exactly_the_kueue_rules_and_the_admission_check(tmp_path: Path) -> None:
    values = {"kueue": {"enabled": True, "admissionCheck": {"create": True, "name": "gang"}}}
    docs = render(tmp_path, values)
    assert rules_of(docs) == BASE_RULES | KUEUE_RULES
    assert env_of(docs)["MSJ_KUEUE"] == "1"
    check = one(docs, "AdmissionCheck")
    assert check["metadata"]["name"] == "gang"
    assert check["spec"] == {"controllerName": "multislice.dev/gang-provisioning"}
    assert "MSJ_KUEUE" not in env_of(render(tmp_path)) and not by_kind(
        render(tmp_path), "AdmissionCheck"
    )


@pytest.fixture(scope="module")
def kueue_crds(api: client.ApiClient, kube_api: ControlPlane) -> None:
    """Kueue's CRDs without its controller: the test plays Kueue (v1beta2 only, no conversion)."""
    install_kueue_crds(api, bin_dir() / KUEUE_CRDS_FILE)


def start_kueue_operator(kubeconfig: Path, ns: str, tmp_path: Path, lease: str) -> OperatorProcess:
    return OperatorProcess(
        kubeconfig,
        # Leader election as the chart runs it, on the Leases its Role names (release namespace).
        [
            "--resync-seconds",
            "2",
            "--kueue",
            "--kueue-workload-wait-seconds",
            "600",
            "--leader-elect",
            "--leader-election-namespace",
            ns,
            "--leader-election-name",
            lease,
        ],
        namespaces=[ns],
        log_path=tmp_path / "operator.log",
    ).start()


class PlayKueue:
    """The Kueue controller's writes, done by the test as the admin."""

    def __init__(self, api_client: client.ApiClient, ns: str, check: str) -> None:
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.ns, self.check = ns, check

    def setup(self) -> None:
        self.custom.create_cluster_custom_object(*KUEUE, "admissionchecks", {
            "apiVersion": "/".join(KUEUE), "kind": "AdmissionCheck",
            "metadata": {"name": self.check},
            "spec": {"controllerName": "multislice.dev/gang-provisioning"},
        })  # fmt: skip
        self.custom.create_namespaced_custom_object(*KUEUE, self.ns, "localqueues", {
            "apiVersion": "/".join(KUEUE), "kind": "LocalQueue",
            "metadata": {"name": "lq"}, "spec": {"clusterQueue": "cq"},
        })  # fmt: skip

    def teardown(self) -> None:
        try:
            self.custom.delete_cluster_custom_object(*KUEUE, "admissionchecks", self.check)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def active(self) -> bool:
        ac = self.custom.get_cluster_custom_object(*KUEUE, "admissionchecks", self.check)
        conds = (ac.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

    def workload(self, job: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                *KUEUE, self.ns, "workloads", f"multislicejob-{job}"
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None
        return found

    def reserve(self, job: str, on_timeout: Any) -> str:
        """The job's Workload, made by the operator (workloads create): quota reserved, our check
        Pending, as Kueue writes them."""
        wl = wait_for(lambda: self.workload(job), 20, "the Workload created", on_timeout=on_timeout)
        owner = wl["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("MultisliceJob", job, True)
        name = str(wl["metadata"]["name"])
        now = "2026-12-01T00:00:00Z"
        self.custom.patch_namespaced_custom_object_status(*KUEUE, self.ns, "workloads", name, {
            "status": {
                "admission": {"clusterQueue": "cq", "podSetAssignments": [
                    {"name": "slice", "count": 4, "flavors": {"google.com/tpu": "tpu"},
                     "resourceUsage": {"google.com/tpu": "16"}}]},
                "conditions": [{"type": "QuotaReserved", "status": "True",
                                "reason": "QuotaReserved", "lastTransitionTime": now,
                                "message": "Quota reserved in ClusterQueue cq"}],
                "admissionChecks": [{"name": self.check, "state": "Pending", "message": "",
                                     "lastTransitionTime": now, "retryCount": 2}],
            }
        })  # fmt: skip
        return name

    def admit(self, workload: str) -> None:
        wl = self.custom.get_namespaced_custom_object(*KUEUE, self.ns, "workloads", workload)
        conds = [*wl["status"]["conditions"], {
            "type": "Admitted", "status": "True", "reason": "Admitted", "message": "admitted",
            "lastTransitionTime": "2026-12-01T00:00:01Z"}]  # fmt: skip
        self.custom.patch_namespaced_custom_object_status(
            *KUEUE, self.ns, "workloads", workload, {"status": {"conditions": conds}}
        )

    def condition(self, workload: str, kind: str) -> dict[str, Any]:
        wl = self.custom.get_namespaced_custom_object(*KUEUE, self.ns, "workloads", workload)
        conds = (wl.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == kind), {})

    def check_state(self, workload: str) -> dict[str, Any]:
        wl = self.custom.get_namespaced_custom_object(*KUEUE, self.ns, "workloads", workload)
        (state,) = wl["status"]["admissionChecks"]
        found: dict[str, Any] = state
        return found


def queued_job(name: str) -> dict[str, Any]:
    body = job(name)
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "lq"}
    return body


def test_chart_rbac_with_kueue_is_enough_for_a_queued_lifecycle(
    api: client.ApiClient,
    kube_api: ControlPlane,
    namespace: Any,
    rbac: Rbac,
    v4_pools: None,
    kueue_crds: None,
    tmp_path: Path,
) -> None:
    ns = namespace(kube_api, "msj-kueue")
    kueue = PlayKueue(api, ns, f"gang-{ns}")
    kueue.setup()
    op = start_kueue_operator(rbac.install(ns, kueue=kueue.check), ns, tmp_path, rbac.lease_name)
    try:
        jobs = Jobs(api, ns, op)
        wait_for(kueue.active, 20, "AdmissionCheck Active (admissionchecks/status patch)",
                 on_timeout=op.log_tail)  # fmt: skip
        jobs.create(queued_job("q"))
        queued = jobs.phase("q", "Queued")
        assert queued["status"]["queue"]["clusterQueue"] == "cq"  # localqueues list/watch
        js = wait_for(lambda: jobs.jobset("q"), 10, "JobSet created")
        assert js["spec"]["suspend"] is True
        workload = kueue.reserve("q", op.log_tail)
        # Existing mode: nothing to provision, the check goes Ready (workloads/status patch).
        ready = wait_for(
            lambda: kueue.check_state(workload)["state"] == "Ready" and kueue.check_state(workload),
            20,
            "check Ready",
            on_timeout=op.log_tail,
        )
        assert ready["retryCount"] == 2  # kept as Kueue wrote it
        jobs.phase("q", "Starting")
        # Kueue admits: the operator resumes the JobSet (jobsets patch); it runs and succeeds,
        # and the operator finishes the Workload (workloads/status patch: the quota is freed).
        kueue.admit(workload)
        wait_for(lambda: not (jobs.jobset("q") or {}).get("spec", {}).get("suspend", True), 20,
                 "JobSet resumed", on_timeout=op.log_tail)  # fmt: skip
        jobs.jobset_status("q", {"replicatedJobsStatus": rj_status(ready=2, active=2)})
        jobs.phase("q", "Running")
        jobs.jobset_status("q", COMPLETED)
        jobs.phase("q", "Succeeded")
        wait_for(lambda: kueue.condition(workload, "Finished").get("status") == "True", 20,
                 "Workload Finished", on_timeout=op.log_tail)  # fmt: skip
        jobs.delete("q")
        jobs.gone("q")
    finally:
        op.stop()
        kueue.teardown()
    assert not refused(op.log_path.read_text()), op.log_path.read_text()


@pytest.mark.parametrize(
    "drop",
    [
        ("kueue.x-k8s.io", "workloads/status", "patch"),
        ("kueue.x-k8s.io", "admissionchecks/status", "patch"),
        ("kueue.x-k8s.io", "workloads", "create"),
    ],
    ids=["workloads-status-patch", "admissionchecks-status-patch", "workloads-create"],
)
def test_chart_rbac_with_kueue_minus_one_verb_breaks_it(
    api: client.ApiClient,
    kube_api: ControlPlane,
    namespace: Any,
    rbac: Rbac,
    v4_pools: None,
    kueue_crds: None,
    tmp_path: Path,
    drop: tuple[str, str, str],
) -> None:
    ns = namespace(kube_api, "msj-kminus")
    kueue = PlayKueue(api, ns, f"gang-{ns}")
    kueue.setup()
    op = start_kueue_operator(
        rbac.install(ns, drop=drop, kueue=kueue.check), ns, tmp_path, rbac.lease_name
    )
    try:
        jobs = Jobs(api, ns, op)
        jobs.create(queued_job("m"))
        jobs.phase("m", "Queued")
        if drop[2] == "create":
            wait_for(lambda: refused(op.log_tail(200)), 30, f"the operator to be refused {drop}",
                     on_timeout=op.log_tail)  # fmt: skip
            assert kueue.workload("m") is None  # nothing queues it
        else:
            wait_for(lambda: jobs.jobset("m"), 10, "JobSet created")
            workload = kueue.reserve("m", op.log_tail)
            wait_for(lambda: refused(op.log_tail(200)), 30,
                     f"the operator to be refused {drop}", on_timeout=op.log_tail)  # fmt: skip
            if drop[1] == "workloads/status":
                assert kueue.check_state(workload)["state"] == "Pending"
            else:
                assert not kueue.active()
        jobs.delete("m")
        jobs.gone("m")
    finally:
        op.stop()
        kueue.teardown()


# ---------------------------------------------------------------- MultiKueue (multikueue.role)

MK_WORKERS = [
    {"name": "us-east5", "kubeconfigSecret": "us-east5-kubeconfig"},
    {"name": "europe-west4", "kubeconfigSecret": "ew4"},
]
MK_MANAGER: dict[str, Any] = {
    "kueue": {"enabled": True, "admissionCheck": {"create": True}, "namespace": "kq"},
    "multikueue": {
        "role": "manager",
        "manager": {"create": True, "configName": "msj-mk", "workers": MK_WORKERS},
    },
}
# Kueue's create-multikueue-kubeconfig.sh (v0.19.2), its verbs for a built-in job kind (e.g.
# jobsets, jobsets/status), for Workloads and for the queues, with MultisliceJob as the kind.
MK_WORKER_RULES = {
    *(
        ("multislice.dev", "multislicejobs", v)
        for v in ("create", "delete", "get", "list", "watch")
    ),
    ("multislice.dev", "multislicejobs/status", "get"),
    *(
        ("kueue.x-k8s.io", "workloads", v)
        for v in ("create", "delete", "get", "list", "watch", "update", "patch")
    ),
    *(("kueue.x-k8s.io", "workloads/status", v) for v in ("get", "patch", "update")),
    *(
        ("kueue.x-k8s.io", q, v)
        for q in ("clusterqueues", "localqueues")
        for v in ("get", "list", "watch")
    ),
}
MK_KINDS = ("MultiKueueCluster", "MultiKueueConfig")


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def test_multikueue_manager_renders_a_cluster_per_worker_their_config_and_the_check(
    tmp_path: Path,
) -> None:
    for each in (MK_MANAGER, {"kueue": {"enabled": True}, "multikueue": {"role": "worker"}}):
        lint = helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART),
                    "-f", values_file(tmp_path, each))  # fmt: skip
        assert "0 chart(s) failed" in lint.stdout
    docs = render(tmp_path, MK_MANAGER)
    clusters = by_kind(docs, "MultiKueueCluster")
    assert [c["metadata"]["name"] for c in clusters] == ["us-east5", "europe-west4"]
    assert [c["spec"] for c in clusters] == [
        {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": secret}}}
        for secret in ("us-east5-kubeconfig", "ew4")
    ]
    config = one(docs, "MultiKueueConfig")
    assert config["metadata"]["name"] == "msj-mk"
    assert config["spec"] == {"clusters": ["us-east5", "europe-west4"]}  # in order: preference
    checks = {c["metadata"]["name"]: c["spec"] for c in by_kind(docs, "AdmissionCheck")}
    assert checks == {
        "multislice-gang": {"controllerName": "multislice.dev/gang-provisioning"},
        "multikueue": {
            "controllerName": "kueue.x-k8s.io/multikueue",
            "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig",
                           "name": "msj-mk"},
        },
    }  # fmt: skip
    # The operator's own grants do not change on the manager; Kueue's controller gets the job kind.
    assert rules_of(docs) == BASE_RULES | KUEUE_RULES
    kueue_role = named(docs, "ClusterRole", "multislice-operator-multikueue-kueue")
    assert grants_of([kueue_role]) == {
        ("multislice.dev", r, v)
        for r in ("multislicejobs", "multislicejobs/status")
        for v in ("get", "list", "watch", "patch", "update")
    }
    binding = named(docs, "ClusterRoleBinding", "multislice-operator-multikueue-kueue")
    assert binding["roleRef"]["name"] == "multislice-operator-multikueue-kueue"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kq"}
    ]
    assert "MSJ_MULTIKUEUE_LOST_COOLDOWN_SECONDS" not in env_of(docs)  # a worker's setting
    assert [
        r["metadata"]["name"]
        for r in by_kind(docs, "ClusterRole")
        if "multikueue" in r["metadata"]["name"]
    ] == ["multislice-operator-multikueue-kueue"]  # no worker role
    # Without manager.create: Kueue's objects are the admin's, the RBAC is still rendered.
    values: dict[str, Any] = copy.deepcopy(MK_MANAGER)
    values["multikueue"]["manager"].update(create=False, kueueServiceAccount="")
    docs = render(tmp_path, values)
    assert not [d for d in docs if d["kind"] in MK_KINDS]
    assert [c["metadata"]["name"] for c in by_kind(docs, "AdmissionCheck")] == ["multislice-gang"]
    assert named(docs, "ClusterRole", "multislice-operator-multikueue-kueue")
    assert not [
        d for d in by_kind(docs, "ClusterRoleBinding") if "multikueue" in d["metadata"]["name"]
    ]
    # No role: nothing of MultiKueue.
    docs = render(tmp_path, {"kueue": {"enabled": True}})
    assert not [d for d in docs if "multikueue" in d["metadata"]["name"] or d["kind"] in MK_KINDS]


def test_multikueue_worker_grants_what_multikueue_does_and_passes_the_cooldown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from multislice_operator.cli.main import build_parser
    from multislice_operator.settings import from_args

    subject = {"kind": "ServiceAccount", "name": "multikueue-sa", "namespace": "kueue-system"}
    values: dict[str, Any] = {
        "kueue": {"enabled": True, "admissionCheck": {"create": True}},
        "multikueue": {"role": "worker", "worker": {"cooldownSeconds": 90, "subjects": [subject]}},
    }
    docs = render(tmp_path, values, release="ml")
    role = named(docs, "ClusterRole", "ml-multislice-operator-multikueue-worker")
    assert grants_of([role]) == MK_WORKER_RULES
    assert not any(rule.get("resourceNames") for rule in role["rules"])
    binding = named(docs, "ClusterRoleBinding", "ml-multislice-operator-multikueue-worker")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
        "name": "ml-multislice-operator-multikueue-worker",
    }  # fmt: skip
    assert binding["subjects"] == [subject]
    # The operator's own grants are the Kueue ones: adopting a prebuilt Workload is a patch.
    assert rules_of(docs) == BASE_RULES | KUEUE_RULES
    assert not [d for d in docs if d["kind"] in MK_KINDS]
    assert [c["metadata"]["name"] for c in by_kind(docs, "AdmissionCheck")] == ["multislice-gang"]
    env = env_of(docs)
    assert env["MSJ_MULTIKUEUE_LOST_COOLDOWN_SECONDS"] == "90"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = from_args(build_parser().parse_args(["run", *container(docs).get("args", [])]))
    assert settings.multikueue_lost_cooldown_seconds == 90.0 and settings.kueue is True
    # The default is the operator's; no subjects: no binding (the admin binds the role).
    values["multikueue"]["worker"] = {"cooldownSeconds": 0.5}
    docs = render(tmp_path, values)
    assert env_of(docs)["MSJ_MULTIKUEUE_LOST_COOLDOWN_SECONDS"] == "0.5"
    assert not [
        d for d in by_kind(docs, "ClusterRoleBinding") if "multikueue" in d["metadata"]["name"]
    ]
    docs = render(tmp_path, {"kueue": {"enabled": True}, "multikueue": {"role": "worker"}})
    assert env_of(docs)["MSJ_MULTIKUEUE_LOST_COOLDOWN_SECONDS"] == "600"
    from multislice_operator.settings import Settings

    assert Settings().multikueue_lost_cooldown_seconds == 600.0  # values.yaml follows the operator
    assert "MSJ_MULTIKUEUE_LOST_COOLDOWN_SECONDS" not in env_of(render(tmp_path, MK_MANAGER))
    # rbac.create false: no RBAC at all, the worker's role included.
    values = {
        "kueue": {"enabled": True},
        "multikueue": {"role": "worker"},
        "rbac": {"create": False},
    }
    assert not [d for d in render(tmp_path, values) if "multikueue" in d["metadata"]["name"]]


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        (
            {"multikueue": {"role": "worker"}},
            'multikueue.role is "worker" but kueue.enabled is false',
        ),
        (
            {"multikueue": {"role": "manager", "manager": {"create": True,
                                                           "workers": MK_WORKERS}}},
            "set kueue.enabled: true",
        ),
        (
            {"kueue": {"enabled": True}, "multikueue": {"role": "workers"}},
            'multikueue.role ("workers") is not a role: set "manager"',
        ),
        (
            {"kueue": {"enabled": True}, "multikueue": {"role": "Manager"}},
            'multikueue.role ("Manager") is not a role',
        ),
        (
            {"kueue": {"enabled": True},
             "multikueue": {"role": "manager", "manager": {"create": True}}},
            "multikueue.manager.workers is empty",
        ),
        (
            {"kueue": {"enabled": True},
             "multikueue": {"role": "manager", "manager": {
                 "create": True, "workers": [*MK_WORKERS, {"name": "us-east5",
                                                           "kubeconfigSecret": "x"}]}}},
            'multikueue.manager.workers names "us-east5" twice',
        ),
        (
            {"kueue": {"enabled": True, "admissionCheck": {"create": True, "name": "mk"}},
             "multikueue": {"role": "manager", "manager": {
                 "create": True, "admissionCheckName": "mk", "workers": MK_WORKERS}}},
            'admissionCheckName and kueue.admissionCheck.name are both "mk"',
        ),
    ],
    ids=["worker-no-kueue", "manager-no-kueue", "unknown-role", "role-case", "no-workers",
         "worker-twice", "check-name-clash"],
)  # fmt: skip
def test_chart_refuses_multikueue_values_that_cannot_work(
    tmp_path: Path, values: dict[str, Any], needle: str
) -> None:
    assert_refused(tmp_path, values, needle)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"multikueue": {"manager": {"workers": [{"name": "a"}]}}}, "kubeconfigSecret"),
        ({"multikueue": {"manager": {"workers": [{"name": "A", "kubeconfigSecret": "s"}]}}},
         "/multikueue/manager/workers/0/name"),
        ({"multikueue": {"manager": {"workers": [
            {"name": f"w{i}", "kubeconfigSecret": "s"} for i in range(21)]}}},
         "/multikueue/manager/workers"),
        ({"multikueue": {"worker": {"cooldownSeconds": -1}}}, "/multikueue/worker/cooldownSeconds"),
        ({"multikueue": {"worker": {"cooldownSeconds": "10m"}}},
         "/multikueue/worker/cooldownSeconds"),
        ({"multikueue": {"worker": {"subjects": [{"kind": "Robot", "name": "r"}]}}},
         "/multikueue/worker/subjects/0/kind"),
        ({"multikueue": {"workers": []}}, "'workers' not allowed"),
        ({"kueue": {"namespace": "Kueue_System"}}, "/kueue/namespace"),
    ],
)  # fmt: skip
def test_schema_rejects_bad_multikueue_values(
    tmp_path: Path, values: dict[str, Any], needle: str
) -> None:
    assert_refused(tmp_path, values, needle)


def test_multikueue_manager_objects_pass_kueues_own_schema(
    api: client.ApiClient, kube_api: ControlPlane, kueue_crds: None, tmp_path: Path
) -> None:
    """Server-side dry run against Kueue v0.19.2's CRDs (their OpenAPI schema and CEL rules)."""
    docs = render(tmp_path, MK_MANAGER)
    kueue_docs = [d for d in docs if d["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert len(kueue_docs) == 5  # two clusters, the config, two checks
    server_dry_run(kube_api, kueue_docs)
    # The CRD's own rule: a MultiKueueConfig names each cluster once (the chart refuses earlier).
    bad = copy.deepcopy(one(docs, "MultiKueueConfig"))
    bad["spec"]["clusters"] = ["us-east5", "us-east5"]
    result = kubectl(kube_api, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(bad))
    assert result.returncode != 0 and "must be unique" in result.stderr, result.stderr


def test_multikueue_worker_role_is_what_multikueues_user_does_and_no_more(
    api: client.ApiClient,
    kube_api: ControlPlane,
    namespace: Any,
    kueue_crds: None,
    tmp_path: Path,
) -> None:
    """The worker ClusterRole, bound to a user as the admin binds MultiKueue's identity: that
    user creates, reads (status included), watches and deletes MultisliceJobs and Workloads, and
    writes a Workload's status, as MultiKueue does; it cannot change a job, nor read pods."""
    from kubernetes import config

    ns = namespace(kube_api, "msj-mkw")
    user = f"multikueue-{ns}"
    release = f"r-{uuid.uuid4().hex[:6]}"
    values = {
        "kueue": {"enabled": True},
        "multikueue": {"role": "worker", "worker": {"subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}},
    }  # fmt: skip
    objs = [
        d for d in render(tmp_path, values, release=release, namespace=ns)
        if "multikueue" in d["metadata"]["name"]
    ]  # fmt: skip
    assert sorted(d["kind"] for d in objs) == ["ClusterRole", "ClusterRoleBinding"]
    result = kubectl(kube_api, "apply", "-f", "-", stdin=yaml.safe_dump_all(objs))
    assert result.returncode == 0, result.stderr
    as_user = config.new_client_from_config(config_file=str(kube_api.user_kubeconfig(user)))
    custom: Any = client.CustomObjectsApi(as_user)
    group, version = models.API_VERSION.split("/")
    msj = (group, version, ns, models.PLURAL)

    def status(call: Any) -> int:
        try:
            call()
        except ApiException as exc:
            return int(exc.status)
        return 200

    workload = {
        "apiVersion": "/".join(KUEUE), "kind": "Workload",
        "metadata": {"name": "multislicejob-mk",
                     "labels": {"kueue.x-k8s.io/multikueue-origin": "m"}},
        "spec": {"queueName": "lq", "podSets": [{"name": "slice", "count": 4, "template": {
            "spec": {"containers": [{"name": "c", "image": "img:1"}]}}}]},
    }  # fmt: skip
    wl = (*KUEUE, ns, "workloads")
    try:
        # RBAC takes effect at once (the authorizer reads the informer: allow a moment).
        wait_for(lambda: status(lambda: custom.list_namespaced_custom_object(*msj)) == 200, 20,
                 "the binding in effect")  # fmt: skip
        assert status(lambda: custom.create_namespaced_custom_object(*msj, job("mk"))) == 200
        assert status(lambda: custom.get_namespaced_custom_object(*msj, "mk")) == 200
        assert status(lambda: custom.get_namespaced_custom_object_status(*msj, "mk")) == 200
        assert status(lambda: custom.create_namespaced_custom_object(*wl, workload)) == 200
        assert status(lambda: custom.patch_namespaced_custom_object(
            *wl, "multislicejob-mk", {"spec": {"active": False}})) == 200  # fmt: skip
        assert status(lambda: custom.patch_namespaced_custom_object_status(
            *wl, "multislicejob-mk", {"status": {"conditions": []}})) == 200  # fmt: skip
        # Not MultiKueue's to do: change a job or its status, read the pods or the Secrets.
        assert status(lambda: custom.patch_namespaced_custom_object(
            *msj, "mk", {"spec": {"suspend": True}})) == 403  # fmt: skip
        assert status(lambda: custom.patch_namespaced_custom_object_status(
            *msj, "mk", {"status": {"phase": "Failed"}})) == 403  # fmt: skip
        core = client.CoreV1Api(as_user)
        assert status(lambda: core.list_namespaced_pod(ns)) == 403
        assert status(lambda: core.list_namespaced_secret(ns)) == 403
        assert (
            status(lambda: custom.delete_namespaced_custom_object(*wl, "multislicejob-mk")) == 200
        )
        assert status(lambda: custom.delete_namespaced_custom_object(*msj, "mk")) == 200
    finally:
        as_user.close()
        for d in objs:
            kubectl(
                kube_api, "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"
            )


def test_notes_say_what_the_multikueue_admin_still_has_to_do(
    api: client.ApiClient, kube_api: ControlPlane, kueue_crds: None, tmp_path: Path
) -> None:
    """`helm install --dry-run=client` maps every kind: Kueue's CRDs must be there."""
    text = notes(kube_api, tmp_path, MK_MANAGER)
    # Kueue decodes its Configuration strictly and case-sensitively: multiKueue, not multikueue.
    assert (
        "       multiKueue:\n"
        "         externalFrameworks:\n"
        "           - name: MultisliceJob.v1alpha1.multislice.dev\n"
    ) in text
    assert "MultiKueueCluster(s) us-east5, europe-west4" in text
    for secret, cluster in (("us-east5-kubeconfig", "us-east5"), ("ew4", "europe-west4")):
        command = f"kubectl -n kq create secret generic {secret} --from-file=kubeconfig="
        assert f"{command}{cluster}.kubeconfig" in text
    assert "spec.admissionChecksStrategy.admissionChecks lists multikueue" in text
    assert "MultiKueue worker" not in text
    # Kueue v0.19.2 itself loads that fragment (it refuses `multikueue:` as an unknown field).
    fragment = text.split("controller:\n\n", 1)[1].split("\n\n", 1)[0]
    config = tmp_path / "kueue-config.yaml"
    config.write_text(
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
        + textwrap.dedent(fragment)
    )
    loaded = subprocess.run(
        [str(bin_dir() / "kueue-controller"), "--config", str(config)],
        capture_output=True, text=True, timeout=60, env={"KUBECONFIG": str(tmp_path / "none")},
    )  # fmt: skip
    assert "Configuration loaded" in loaded.stderr + loaded.stdout, loaded.stderr
    assert "MultisliceJob.v1alpha1.multislice.dev" in loaded.stderr + loaded.stdout
    worker = {
        "kueue": {"enabled": True, "admissionCheck": {"name": "gang-x"}},
        "multikueue": {"role": "worker", "worker": {"cooldownSeconds": 120}},
    }
    text = " ".join(notes(kube_api, tmp_path, worker).split())
    assert "lists the operator's gang check (gang-x, kueue.admissionCheck)" in text
    assert "handed back to MultiKueue" in text
    assert "LocalQueues of the manager, with the same names" in text
    assert "waits 120 s" in text
    assert "Bind the ClusterRole notes-multislice-operator-multikueue-worker" in text
    assert "MultiKueue manager" not in text
