"""Every label, annotation, taint and resource key the operator reads or writes: one home each.

Ours live under ``multislice.dev/``; the others belong to Kubernetes, JobSet, Kueue and GKE and are
named here exactly as their owners spell them (facts.md sections 2, 4 and 5).
"""

from __future__ import annotations

# ---- ours (multislice.dev)
PREFIX = "multislice.dev"
JOB_NAME = f"{PREFIX}/job-name"
JOB_NAMESPACE = f"{PREFIX}/job-namespace"
JOB_UID = f"{PREFIX}/job-uid"
JOB_KEY = f"{PREFIX}/job-key"
SLICE = f"{PREFIX}/slice"
# provisioning.mode Fallback: the capacity type of the option a pool is for (Spot, Reserved,
# FlexStart, OnDemand); the pods and the Kueue Workload select it (docs/kueue.md).
CAPACITY_TYPE = f"{PREFIX}/capacity-type"
# On a job's Kueue Workload when what it asks for may change (Plan.quota_key: a Fallback job's
# option, its index): a Workload of another key is replaced (reconcile/kueue_gate.py).
QUOTA_KEY = f"{PREFIX}/quota-key"
# Node labels may not use the kubernetes.io / k8s.io namespaces (GKE and the kubelet refuse
# them), so node pools say who manages them under our own prefix.
NODE_MANAGED_BY = f"{PREFIX}/managed-by"
FINALIZER = f"{PREFIX}/cleanup"
# Checkpoint on demand (docs/environment.md section 3): the request on the job (a user's) and on
# every pod (the operator's copy), and the workload's acknowledgement on its pod ({"id", "step"}).
CHECKPOINT_REQUEST = f"{PREFIX}/checkpoint-request"
CHECKPOINT_SAVED = f"{PREFIX}/checkpoint-saved"
# On a JobSet the operator recreated on another slice count (spec.elastic): the job's restarts
# and those charged to maxRestarts before it, so that its counters continue the job's.
RESTARTS_BEFORE = f"{PREFIX}/restarts-before"
RESTARTS_COUNTED_BEFORE = f"{PREFIX}/restarts-counted-before"

# ---- Kubernetes (objects other than nodes)
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "multislice-operator"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# Pod Security admission: the level a namespace enforces (privileged, baseline, restricted).
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
# Well-known node label the kubelet sets from the cloud provider: the VM's machine type.
INSTANCE_TYPE = "node.kubernetes.io/instance-type"

# ---- JobSet (labels and annotations it sets on Jobs and Pods)
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
# The uid of the JobSet a Job or pod belongs to: tells a job's pods from its predecessor's.
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
# On a pod, written by JobSet's in-place restart agent at each start of its pod: JobSet's
# currentInPlaceRestartAttempt + 1 (v0.12.0 api/jobset/v1alpha2/jobset_types.go).
IN_PLACE_RESTART_ATTEMPT = "jobset.sigs.k8s.io/in-place-restart-attempt"
JOBSET_EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
# On every pod of a JobSet's Job: a hash of the Job's namespaced name (its slice here), and the
# pod's priority, written by JobSet's pod webhook (v0.12.0 pkg/constants/constants.go).
JOBSET_JOB_KEY = "jobset.sigs.k8s.io/job-key"
JOBSET_PRIORITY = "jobset.sigs.k8s.io/priority"

# ---- Kueue (v1beta2)
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"  # a WorkloadPriorityClass name
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"  # on a Workload: the uid of the job it is for
# MultiKueue (Kueue v0.15+, external frameworks): spec.managedBy of a job the manager dispatches;
# on the worker's copy, the Workload MultiKueue made for it and the manager it came from.
MULTIKUEUE_MANAGED_BY = "kueue.x-k8s.io/multikueue"
KUEUE_PREBUILT_WORKLOAD = "kueue.x-k8s.io/prebuilt-workload-name"
MULTIKUEUE_ORIGIN = "kueue.x-k8s.io/multikueue-origin"
# MultiKueue's AdmissionCheck controllerName (kueue.MultiKueueControllerName, the same string).
MULTIKUEUE_CONTROLLER = MULTIKUEUE_MANAGED_BY
# On the operator's heartbeat Lease: the dispatched jobs this worker handed back and when
# ({"namespace/workload": RFC 3339}), so that a restarted operator keeps their cooldown.
MULTIKUEUE_LOST = f"{PREFIX}/multikueue-lost"
# The AdmissionCheck controllerName this operator answers for (spec.controllerName).
GANG_CHECK_CONTROLLER = f"{PREFIX}/gang-provisioning"

# ---- GKE (node labels GKE sets; the TPU resource and taint)
GKE_NODEPOOL = "cloud.google.com/gke-nodepool"
GKE_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
GKE_SPOT = "cloud.google.com/gke-spot"
TPU_RESOURCE = "google.com/tpu"  # extended resource and taint key (GKE adds the taint itself)
# Host maintenance on GPU/TPU nodes ("Manage GKE node disruption for GPUs and TPUs", GKE 1.31+):
# the scheduled window start and the latest start it may move to (Unix epoch seconds), a label
# while maintenance runs (values seen: ONGOING, passthrough), the taint before termination.
GKE_SCHEDULED_MAINTENANCE_TIME = "cloud.google.com/scheduled-maintenance-time"
GKE_SCHEDULED_MAINTENANCE_TIME_LATEST = "cloud.google.com/scheduled-maintenance-time-latest"
GKE_ACTIVE_NODE_MAINTENANCE = "cloud.google.com/active-node-maintenance"
GKE_IMPENDING_NODE_TERMINATION = "cloud.google.com/impending-node-termination"
# GKE dynamic slicing (Ironwood): a cube's partition id and health on its nodes, the Slice a node
# belongs to once formed, the pod annotation naming the slice topology ("Use dynamic slicing with
# a custom scheduler"; xpk slice-main slice/internal/core/constants.go), and the Slice API.
GKE_TPU_PARTITION_ID = "cloud.google.com/gke-tpu-partition-4x4x4-id"
GKE_TPU_PARTITION_STATE = "cloud.google.com/gke-tpu-partition-4x4x4-state"
GKE_TPU_SLICE = "cloud.google.com/gke-tpu-slice"
GKE_TPU_SLICE_TOPOLOGY = "cloud.google.com/gke-tpu-slice-topology"
# The reservation block of a sub-block's nodes (a Slice's cubes share one).
GCE_TOPOLOGY_BLOCK = "cloud.google.com/gce-topology-block"
SLICE_GROUP, SLICE_VERSION, SLICE_PLURAL, SLICE_KIND = (
    "accelerator.gke.io",
    "v1beta1",
    "slices",
    "Slice",
)
SLICE_FINALIZER = "accelerator.gke.io/slice-finalizer"
# Kubernetes 1.37's Workload API (KEP-4671, beta; gate GenericWorkload, off by default): a
# PodGroup whose gang policy binds its pods all together or none (k8s.io/api scheduling/v1beta1).
POD_GROUP_GROUP, POD_GROUP_VERSION, POD_GROUP_PLURAL, POD_GROUP_KIND = (
    "scheduling.k8s.io",
    "v1beta1",
    "podgroups",
    "PodGroup",
)
