"""What the operator needs of the controllers it depends on (issue 21): Kueue serving v1beta2,
a JobSet CRD with onJobFailureMessagePatterns, objects sent with fieldValidation=Strict, and a
namespace's Pod Security level read before any pool."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from multislice_operator.controller import admission, kube, versions
from multislice_operator.render import podsecurity

RULES = {"type": "object", "properties": {"name": {"type": "string"}}}


def jobset_crd(*fields: str, version: str = "v1alpha2", served: bool = True) -> dict[str, Any]:
    rule = {"type": "object", "properties": {f: {"type": "array"} for f in fields}}
    schema = {
        "properties": {
            "spec": {
                "properties": {
                    "failurePolicy": {"properties": {"rules": {"type": "array", "items": rule}}}
                }
            }
        }
    }
    return {
        "spec": {
            "versions": [{"name": version, "served": served, "schema": {"openAPIV3Schema": schema}}]
        }
    }


def test_kueue_v1beta1_only_is_refused_naming_both_versions():
    problem = versions.kueue_problem(["v1beta1"])
    assert problem is not None
    assert "serves kueue.x-k8s.io/v1beta1 only (Kueue v0.14 or older)" in problem
    assert "needs kueue.x-k8s.io/v1beta2 (Kueue v0.15.0 or newer" in problem
    assert versions.kueue_problem(["v1beta1", "v1beta2"]) is None
    assert versions.kueue_problem(None) is None  # not installed: the jobs say so themselves


def test_a_jobset_crd_without_message_patterns_is_refused():
    new = jobset_crd("name", "action", "onJobFailureReasons", "onJobFailureMessagePatterns")
    assert versions.jobset_problem(new) is None
    old = jobset_crd("name", "action", "onJobFailureReasons")
    problem = versions.jobset_problem(old)
    assert problem and "older than v0.10.0" in problem and "onJobFailureMessagePatterns" in problem
    unserved = jobset_crd("onJobFailureMessagePatterns", served=False)
    assert "serves no v1alpha2" in (versions.jobset_problem(unserved) or "")
    assert versions.jobset_problem(None) is None


def test_a_strict_refusal_of_the_failure_policy_names_the_jobset_needed():
    message = (
        'JobSet in version "v1alpha2" cannot be handled as a JobSet: strict decoding error: '
        'unknown field "spec.failurePolicy.rules[0].onJobFailureMessagePatterns"'
    )
    assert "JobSet is older than v0.10.0" in admission.explain(message)
    other = 'strict decoding error: unknown field "spec.template.spec.fooBar"'
    assert admission.explain(other) == other


class Recorder:
    def __init__(self) -> None:
        self.urls: list[str] = []

    async def __call__(self, method: str, url: str, **_: Any) -> Any:
        self.urls.append(url)
        raise kube.NotFound({"message": "gone", "code": 404}, status=404, headers={})


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(kube.kopf_api, "request", rec)
    return rec


JOBSET = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "metadata": {"name": "j", "namespace": "ns"}}  # fmt: skip


def test_every_create_and_dry_run_of_a_rendered_object_is_strict(recorder: Recorder):
    k = kube.Kube(settings=None)  # type: ignore[arg-type]
    with pytest.raises(kube.NotFound):
        asyncio.run(k.create_jobset(copy.deepcopy(JOBSET)))
    for body in (JOBSET, {**JOBSET, "apiVersion": "batch/v1", "kind": "Job"}):
        with pytest.raises(kube.NotFound):
            asyncio.run(k.dry_run_create(copy.deepcopy(body)))
    assert len(recorder.urls) == 3
    assert all("fieldValidation=Strict" in u for u in recorder.urls), recorder.urls
    assert all("dryRun=All" in u for u in recorder.urls[1:])


def test_the_start_up_reads_are_what_rbac_allows(recorder: Recorder):
    k = kube.Kube(settings=None)  # type: ignore[arg-type]
    assert asyncio.run(k.served_versions("kueue.x-k8s.io")) is None  # 404: not installed
    assert asyncio.run(k.get_namespace("ns")) is None
    assert asyncio.run(k.get_priority_class("hi")) is None
    # CRDs: a list with a field selector (the chart grants list and watch, not get).
    with pytest.raises(kube.NotFound):
        asyncio.run(k.get_crd("jobsets.jobset.x-k8s.io"))
    assert recorder.urls == [
        "/apis/kueue.x-k8s.io",
        "/api/v1/namespaces/ns",
        "/apis/scheduling.k8s.io/v1/priorityclasses/hi",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        "?fieldSelector=metadata.name%3Djobsets.jobset.x-k8s.io",
    ]


HOST = {"hostNetwork": True, "containers": [{"name": "c", "image": "i"}]}


@pytest.mark.parametrize(
    ("labels", "pod", "level"),
    [
        ({"pod-security.kubernetes.io/enforce": "baseline"}, HOST, "baseline"),
        ({"pod-security.kubernetes.io/enforce": "restricted"}, HOST, "restricted"),
        ({"pod-security.kubernetes.io/enforce": "strict"}, HOST, "restricted"),  # invalid
        ({"pod-security.kubernetes.io/enforce": "baseline"}, {"hostPID": True}, "baseline"),
        ({"pod-security.kubernetes.io/enforce": "privileged"}, HOST, None),
        ({"pod-security.kubernetes.io/warn": "restricted"}, HOST, None),  # warn only
        ({}, HOST, None),
        ({"pod-security.kubernetes.io/enforce": "baseline"}, {"hostNetwork": False}, None),
    ],
)
def test_pod_security_refuses_host_network_pods_at_baseline(labels, pod, level):
    text = podsecurity.refusal("team", labels, pod)
    if level is None:
        assert text is None
        return
    assert text is not None
    assert f"enforces Pod Security level {level}" in text
    assert f"pod-security.kubernetes.io/enforce={labels['pod-security.kubernetes.io/enforce']}" in (
        text
    )
    assert "kubectl label namespace team pod-security.kubernetes.io/enforce=privileged" in text
    assert "hostNetwork: false" in text


def test_the_rendered_pods_are_judged_with_their_defaults():
    from multislice_operator.planning.plan import load_job, plan_job
    from multislice_operator.render.jobset import render_pod_template

    job = load_job(
        {
            "apiVersion": "multislice.dev/v1alpha1",
            "kind": "MultisliceJob",
            "metadata": {"name": "j", "namespace": "team"},
            "spec": {
                "accelerator": "v5litepod-16",
                "slices": 2,
                "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
            },
        }
    )
    pod = render_pod_template(plan_job(job), job.spec)["spec"]
    labels = {"pod-security.kubernetes.io/enforce": "baseline"}
    assert "hostNetwork: true" in (podsecurity.refusal("team", labels, pod) or "")
