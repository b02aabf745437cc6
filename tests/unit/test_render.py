import copy

from multislice_operator.common import keys
from multislice_operator.planning.plan import (
    load_job,
    plan_job,
)
from multislice_operator.render.jobset import (
    coordinator_host,
    render_jobset,
)

OBJ = {
    "apiVersion": "multislice.dev/v1alpha1",
    "kind": "MultisliceJob",
    "metadata": {"name": "llm", "namespace": "ns", "labels": {"kueue.x-k8s.io/queue-name": "q"}},
    "spec": {
        "accelerator": "v5litepod-16",
        "slices": 2,
        "checkpoint": {"directory": "gs://bkt/run"},
        "failurePolicy": {"maxRestarts": 5, "nonRetryableExitCodes": [42, 7]},
        "template": {
            "metadata": {"labels": {"team": "a"}},
            "spec": {
                # A label GKE gives the job's nodes (node selection GKE never satisfies is refused
                # by the plan in Managed mode).
                "nodeSelector": {"node.kubernetes.io/instance-type": "ct5lp-hightpu-4t"},
                "containers": [
                    {
                        "name": "train",
                        "image": "img:1",
                        "env": [
                            {"name": "MY_VAR", "value": "x"},
                        ],
                    },
                    {"name": "sidecar", "image": "side:1"},
                ],
            },
        },
    },
}


def render(obj=OBJ):
    job = load_job(copy.deepcopy(obj))
    return render_jobset(plan_job(job), job.spec, job.metadata.labels)


def env_of(js):
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    return pod, pod["spec"]["containers"][0]["env"]


def test_jobset_shape():
    js = render()
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert js["metadata"]["name"] == "llm"
    # Queued (label on the job), yet no queue label: the Workload is the job's own, and Kueue's
    # JobSet integration must not make a second one for the JobSet.
    assert not any(k.startswith("kueue.x-k8s.io/") for k in js["metadata"]["labels"])
    rj_labels = js["spec"]["replicatedJobs"][0]["template"]["metadata"]["labels"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in rj_labels)
    assert js["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
    }
    (rj,) = js["spec"]["replicatedJobs"]
    assert (rj["name"], rj["replicas"]) == ("slice", 2)
    job = rj["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"], job["backoffLimit"]) == (
        4,
        4,
        "Indexed",
        0,
    )
    disruption, fatal = job["podFailurePolicy"]["rules"]
    assert disruption == {
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert fatal["action"] == "FailJob"
    assert fatal["onExitCodes"] == {"containerName": "train", "operator": "In", "values": [7, 42]}
    fp = js["spec"]["failurePolicy"]
    assert fp["maxRestarts"] == 5
    assert fp["rules"] == [
        {
            "name": "Disruption",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["PodFailurePolicy"],
            "onJobFailureMessagePatterns": [
                "^Pod .* has condition DisruptionTarget matching FailJob rule at index 0$"
            ],
        },
        {
            "name": "FatalExitCode",
            "action": "FailJobSet",
            "onJobFailureReasons": ["PodFailurePolicy"],
            "onJobFailureMessagePatterns": [
                "^Container .* failed with exit code [0-9]+ matching FailJob rule at index 1$"
            ],
        },
    ]
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["slice"]}
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    assert js["spec"]["suspend"] is True  # queued in Kueue: it starts suspended


def test_pod_gets_tpu_parts():
    pod, _ = env_of(render())
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5-lite-podslice"
    assert spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    # The user's selector is kept.
    assert spec["nodeSelector"]["node.kubernetes.io/instance-type"] == "ct5lp-hightpu-4t"
    assert "multislice.dev/job-key" in spec["nodeSelector"]  # Managed: this job's pools only
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    tpu, side = spec["containers"]
    assert tpu["resources"]["requests"]["google.com/tpu"] == "4"
    assert tpu["resources"]["limits"]["google.com/tpu"] == "4"
    assert "resources" not in side and "env" not in side
    assert pod["metadata"]["labels"]["team"] == "a"


def test_env_contract_and_user_variables():
    _, env = env_of(render())
    by = {e["name"]: e for e in env}
    assert by["MEGASCALE_NUM_SLICES"]["value"] == "2"
    assert by["MEGASCALE_PORT"]["value"] == "8080"
    assert by["MY_VAR"]["value"] == "x"
    assert (
        by["MEGASCALE_COORDINATOR_ADDRESS"]["value"]
        == coordinator_host("llm")
        == "llm-slice-0-0.llm"
    )
    assert by["MEGASCALE_SLICE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        f"metadata.annotations['{keys.JOBSET_JOB_INDEX}']"
    )
    assert by["MULTISLICE_RESTART_ATTEMPT"]["valueFrom"]["fieldRef"]["fieldPath"].endswith(
        f"['{keys.JOBSET_RESTART_ATTEMPT}']"
    )
    hosts = by["TPU_WORKER_HOSTNAMES"]["value"].split(",")
    assert hosts[0] == "llm-slice-$(MEGASCALE_SLICE_ID)-0.llm" and len(hosts) == 4
    assert by["JAX_PROCESS_COUNT"]["value"] == "8"
    assert by["MULTISLICE_CHECKPOINT_DIR"]["value"] == "gs://bkt/run"
    assert by["MULTISLICE_ICI_FSDP"]["value"] == "16"
    assert by["MULTISLICE_DCN_DATA"]["value"] == "2"
    names = [e["name"] for e in env]
    # $(MEGASCALE_SLICE_ID) must be defined before the variable that expands it.
    assert names.index("MEGASCALE_SLICE_ID") < names.index("TPU_WORKER_HOSTNAMES")


def test_no_fatal_codes_keeps_only_the_disruption_rules():
    obj = copy.deepcopy(OBJ)
    obj["spec"]["failurePolicy"]["nonRetryableExitCodes"] = []
    js = render(obj)
    (rule,) = js["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    assert rule["onPodConditions"][0]["type"] == "DisruptionTarget"
    assert [r["name"] for r in js["spec"]["failurePolicy"]["rules"]] == ["Disruption"]


# The Job controller's messages (k8s v1.34 pkg/controller/job/pod_failure_policy.go), as the
# JobSet controller matches them (Go RE2; Python's re agrees on these patterns).
DISRUPTED = "Pod ns/llm-slice-1-0-x has condition DisruptionTarget matching FailJob rule at index 0"
FATAL = (
    "Container train for pod ns/llm-slice-0-3-y failed with exit code 78 matching FailJob rule "
    "at index 1"
)


def test_the_jobset_rules_tell_a_disruption_from_a_fatal_exit():
    import re

    disruption, fatal = render()["spec"]["failurePolicy"]["rules"]
    (d,), (f,) = disruption["onJobFailureMessagePatterns"], fatal["onJobFailureMessagePatterns"]
    assert re.search(d, DISRUPTED) and not re.search(d, FATAL)
    assert re.search(f, FATAL) and not re.search(f, DISRUPTED)
    assert not re.search(f, FATAL.replace("index 1", "index 10"))


def test_default_fatal_code_is_the_workloads_config_error():
    obj = copy.deepcopy(OBJ)
    del obj["spec"]["failurePolicy"]["nonRetryableExitCodes"]
    rules = render(obj)["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]
    assert rules["rules"][1]["onExitCodes"]["values"] == [78]  # 42 restarts now (xpk's 42)


def test_xpk_policy_restarts_only_on_listed_codes_and_the_hang_code():
    obj = copy.deepcopy(OBJ)
    obj["spec"]["failurePolicy"] = {"exitCodePolicy": "RestartIfListed"}
    js = render(obj)
    fatal = js["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"][1]
    assert fatal["action"] == "FailJob"
    assert fatal["onExitCodes"]["operator"] == "NotIn"
    assert fatal["onExitCodes"]["values"] == [42, 75, *range(127, 256)]  # xpk's + hang
    obj["spec"]["failurePolicy"]["restartExitCodes"] = [3, 42]
    fatal = render(obj)["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]
    assert fatal["rules"][1]["onExitCodes"]["values"] == [3, 42, 75]


def test_podinfo_volume_env_and_termination_message_policy():
    pod, env = env_of(render())
    spec = pod["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "multislice-podinfo"]
    assert vol["downwardAPI"]["items"] == [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
    ]
    tpu, side = spec["containers"]
    assert tpu["volumeMounts"] == [
        {"name": "multislice-podinfo", "mountPath": "/etc/multislice/podinfo", "readOnly": True}
    ]
    assert tpu["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "volumeMounts" not in side and "terminationMessagePolicy" not in side
    by = {e["name"]: e for e in env}
    assert by["MULTISLICE_PODINFO_DIR"]["value"] == "/etc/multislice/podinfo"
    assert by["MULTISLICE_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert by["MULTISLICE_POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )


def test_the_templates_own_termination_policy_and_volumes_are_kept():
    obj = copy.deepcopy(OBJ)
    tpu = obj["spec"]["template"]["spec"]["containers"][0]
    tpu["terminationMessagePolicy"] = "File"
    tpu["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    obj["spec"]["template"]["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod, _ = env_of(render(obj))
    tpu = pod["spec"]["containers"][0]
    assert tpu["terminationMessagePolicy"] == "File"
    assert [m["name"] for m in tpu["volumeMounts"]] == ["data", "multislice-podinfo"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["data", "multislice-podinfo"]


def test_existing_mode_selects_by_shape_only_and_render_is_pure():
    obj = copy.deepcopy(OBJ)
    obj["spec"]["provisioning"] = {"mode": "Existing"}
    js = render(obj)
    pod, _ = env_of(js)
    assert "multislice.dev/job-key" not in pod["spec"]["nodeSelector"]
    assert render(obj) == js
    assert OBJ["spec"]["template"]["spec"]["containers"][0].get("resources") is None


def test_host_network_by_default_with_cluster_dns():
    # Issue 12, defect 7: GKE's Multislice example JobSet and xpk run TPU pods on the host
    # network (DCN over the hosts' NICs), with cluster DNS kept for the worker hostnames.
    pod, env = env_of(render())
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    values = {e["name"]: e.get("value") for e in env}
    assert values["MEGASCALE_COORDINATOR_ADDRESS"] == coordinator_host("llm") == "llm-slice-0-0.llm"
    assert values["TPU_WORKER_HOSTNAMES"].split(",")[0] == "llm-slice-$(MEGASCALE_SLICE_ID)-0.llm"
    ports = {p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert {8080, 8476} <= ports


def test_host_network_opt_out_is_the_templates_own_field():
    obj = copy.deepcopy(OBJ)
    obj["spec"]["template"]["spec"]["hostNetwork"] = False
    pod, _ = env_of(render(obj))
    assert pod["spec"]["hostNetwork"] is False and "dnsPolicy" not in pod["spec"]
    obj["spec"]["template"]["spec"].update(hostNetwork=True, dnsPolicy="Default")
    pod, _ = env_of(render(obj))
    assert pod["spec"]["dnsPolicy"] == "Default"
