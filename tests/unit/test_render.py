import copy

from multislice_operator import keys
from multislice_operator.plan import (
    load_job,
    plan_job,
)
from multislice_operator.render import (
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
                "nodeSelector": {"pool-class": "tpu"},
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
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
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
    rule = job["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {"containerName": "train", "operator": "In", "values": [7, 42]}
    fp = js["spec"]["failurePolicy"]
    assert fp["maxRestarts"] == 5
    assert fp["rules"] == [
        {
            "name": "FatalExitCode",
            "action": "FailJobSet",
            "onJobFailureReasons": ["PodFailurePolicy"],
        }
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
    assert spec["nodeSelector"]["pool-class"] == "tpu"  # the user's selector is kept
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


def test_no_fatal_codes_no_pod_failure_policy():
    obj = copy.deepcopy(OBJ)
    obj["spec"]["failurePolicy"]["nonRetryableExitCodes"] = []
    js = render(obj)
    assert "podFailurePolicy" not in js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert "rules" not in js["spec"]["failurePolicy"]


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
