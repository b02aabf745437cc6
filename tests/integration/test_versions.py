"""Older JobSet and Kueue than the operator needs, against a real apiserver (issue 21).

An apiserver of its own (api profile) carries the real JobSet v0.10.1 CRD with
onJobFailureMessagePatterns removed (what JobSet < v0.10.0 serves) and Kueue v0.17.0's CRDs with
v1beta2 removed (what Kueue v0.13/v0.14 serve): the CRDs are cluster-wide, so the shared
control plane of the other tests must not see them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from multislice_local.controlplane import KUEUE_CRDS_FILE, ControlPlane, bin_dir
from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar, SimConfig
from multislice_local.harness import OperatorProcess, install_crds, wait_for
from multislice_local.stack import CLUSTER, LOCATION, PROJECT, ZONE
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.controller import admission, versions
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.render.jobset import render_jobset

JOBSET_CRD = "jobset.x-k8s.io_jobsets.yaml"
KUEUE_KINDS = ("admissionchecks", "localqueues", "workloads")


def old_jobset_crd() -> dict[str, Any]:
    """The real CRD without the field JobSet v0.10.0 added (kubernetes-sigs/jobset#1033)."""
    crd = yaml.safe_load((bin_dir() / JOBSET_CRD).read_text())
    for version in crd["spec"]["versions"]:
        rule = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
            "failurePolicy"
        ]["properties"]["rules"]["items"]
        assert rule["properties"].pop(versions.JOBSET_FIELD) is not None
    return crd


def v1beta1_only_kueue_crds() -> list[dict[str, Any]]:
    crds = []
    for doc in yaml.safe_load_all((bin_dir() / KUEUE_CRDS_FILE).read_text()):
        if not doc or doc["spec"]["names"]["plural"] not in KUEUE_KINDS:
            continue
        doc["spec"]["versions"] = [v for v in doc["spec"]["versions"] if v["name"] == "v1beta1"]
        doc["spec"]["versions"][0]["storage"] = True
        doc["spec"].pop("conversion", None)
        crds.append(doc)
    assert len(crds) == len(KUEUE_KINDS)
    return crds


@pytest.fixture(scope="module")
def old_cluster() -> Iterator[ControlPlane]:
    with ControlPlane("api") as cp:
        api = cp.api_client()
        old = cp.workdir / "old-jobset-crd.yaml"
        old.write_text(yaml.safe_dump(old_jobset_crd()))
        install_crds(api, old)
        ext: Any = client.ApiextensionsV1Api(api)
        for crd in v1beta1_only_kueue_crds():
            ext.create_custom_resource_definition(crd)
        for crd in v1beta1_only_kueue_crds():
            name = crd["metadata"]["name"]
            wait_for(
                lambda name=name: any(
                    c.type == "Established" and c.status == "True"
                    for c in ext.read_custom_resource_definition(name).status.conditions or []
                ),
                30,
                f"CRD {name}",
            )
        api.close()
        yield cp


def job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "checkpoint": {"directory": "gs://bkt/run"},
            "template": {"spec": {"containers": [{"name": "train", "image": "img:1"}]}},
        },
    }


def test_the_start_up_checks_name_what_is_installed_and_what_is_needed(old_cluster):
    kueue_message = versions.kueue_problem(["v1beta1"])
    assert kueue_message and "kueue.x-k8s.io/v1beta1 only" in kueue_message
    assert "kueue.x-k8s.io/v1beta2 (Kueue v0.15.0 or newer" in kueue_message
    real = yaml.safe_load((bin_dir() / JOBSET_CRD).read_text())
    assert versions.jobset_problem(real) is None
    problem = versions.jobset_problem(old_jobset_crd())
    assert problem and "older than v0.10.0" in problem and versions.JOBSET_FIELD in problem


def test_an_older_jobset_crd_refuses_the_field_only_under_strict_validation(old_cluster):
    """Without fieldValidation=Strict the old CRD drops onJobFailureMessagePatterns and the dry
    run passes: a fatal exit would then restart uncharged until maxDisruptionRestarts."""
    cp = old_cluster
    parsed = load_job(job("lax"))
    jobset = render_jobset(plan_job(parsed), parsed.spec)
    path = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets?dryRun=All"
    status, answer = cp._request("POST", path, jobset)
    assert status == 201  # the silent drop the operator must not rely on
    assert all(versions.JOBSET_FIELD not in r for r in answer["spec"]["failurePolicy"]["rules"])
    status, answer = cp._request("POST", f"{path}&fieldValidation=Strict", jobset)
    assert status == 400, answer
    assert "strict decoding error" in answer["message"]
    assert f"spec.failurePolicy.rules[0].{versions.JOBSET_FIELD}" in answer["message"]
    explained = admission.explain(answer["message"])
    assert "the installed JobSet is older than v0.10.0" in explained


def test_the_operator_refuses_jobs_before_any_pool_on_an_older_jobset_and_kueue(
    old_cluster, tmp_path
):
    cp = old_cluster
    with GkeSimulator(SimConfig(op_latency_s=0.2), registrar=InMemoryRegistrar()) as sim:
        op = OperatorProcess(
            cp.kubeconfig,
            [
                "--resync-seconds", "1", "--gke-project", PROJECT, "--gke-location", LOCATION,
                "--gke-cluster", CLUSTER, "--gke-node-location", ZONE, "--gke-simulator", sim.url,
                "--kueue",
            ],
            namespaces=["default"],
            log_path=tmp_path / "operator.log",
        )  # fmt: skip
        api = cp.api_client()
        custom = client.CustomObjectsApi(api)
        try:
            op.start()  # inside the try: a start that times out still stops the process
            wait_for(lambda: "unsupported jobset" in op.log_tail(200), 30, "the jobset error",
                     on_timeout=op.log_tail)  # fmt: skip
            log = op.log_tail(200)
            assert (
                "unsupported kueue: the installed Kueue serves kueue.x-k8s.io/v1beta1 only" in log
            )
            assert "needs kueue.x-k8s.io/v1beta2 (Kueue v0.15.0 or newer" in log
            assert "tpu nodes: service account the Compute Engine default service account" in log
            custom.create_namespaced_custom_object(
                models.GROUP, models.VERSION, "default", models.PLURAL, job("old")
            )

            def status() -> dict[str, Any]:
                obj = custom.get_namespaced_custom_object(
                    models.GROUP, models.VERSION, "default", models.PLURAL, "old"
                )
                return obj.get("status") or {}

            st = wait_for(lambda: status().get("phase") == "Failed" and status(), 60,
                          "the job refused", on_timeout=op.log_tail)  # fmt: skip
            assert "strict decoding error" in st["message"], st
            assert "JobSet is older than v0.10.0" in st["message"], st
            assert sim.counters()["calls"].get("create_node_pool", 0) == 0
        finally:
            op.stop()
            api.close()


def test_the_chart_notes_name_the_kueue_needed(old_cluster, tmp_path):
    cp = old_cluster
    chart = Path(__file__).resolve().parents[2] / "charts" / "multislice-operator"
    helm = [str(bin_dir() / "helm"), "--kubeconfig", str(cp.kubeconfig)]
    env = cp.client_env()
    result = subprocess.run(
        [*helm, "install", "old-kueue", str(chart), "-n", "default", "--set", "kueue.enabled=true"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    try:
        assert result.returncode == 0, result.stderr
        assert "serves kueue.x-k8s.io/v1beta1 only" in result.stdout, result.stdout
        refused = subprocess.run(
            [*helm, "install", "old-check", str(chart), "-n", "default", "--set",
             "kueue.enabled=true", "--set", "kueue.admissionCheck.create=true"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "needs kueue.x-k8s.io/v1beta2 (Kueue v0.15.0 or newer" in refused.stderr
    finally:
        subprocess.run([*helm, "uninstall", "old-kueue", "-n", "default"], env=env,
                       capture_output=True, timeout=120)  # fmt: skip


def test_a_cluster_without_the_slice_api_is_said_once_in_the_operators_words(old_cluster, tmp_path):
    """Issue 56: every operator start on a cluster without GKE's Slice CRD logged kopf's
    "Unresolved resources cannot be served (try creating their CRDs): Selector(...slices)", and
    kopf says it again on every CRD event. The Slice API is optional (dynamic slicing only): the
    operator says once, in its own words, that it is not served and what that means."""
    op = OperatorProcess(
        old_cluster.kubeconfig, ["--resync-seconds", "1"], namespaces=["default"],
        log_path=tmp_path / "operator.log",
    )  # fmt: skip
    try:
        op.start()
        wait_for(lambda: "dynamic slicing:" in op.log_tail(400), 60, "the Slice API line",
                 on_timeout=op.log_tail)  # fmt: skip
        log = op.log_tail(400)
        assert log.count("dynamic slicing:") == 1, log
        assert f"{keys.SLICE_GROUP}/{keys.SLICE_VERSION} {keys.SLICE_PLURAL}) is not served" in log
        assert "DynamicSlicing jobs" in log
        assert "Unresolved resources" not in log, log
    finally:
        op.stop()
