"""GKE dynamic slicing, simulated: sub-blocks of a reservation and the slice controller.

The GKE objects and rules are listed, with their sources, in docs/dynamic-slicing-contract.md;
the CRD is ``crds/slice.yaml`` beside this module.
"""

from __future__ import annotations

from pathlib import Path

CRD_FILE = Path(__file__).with_name("crds") / "slice.yaml"

GROUP = "accelerator.gke.io"
VERSION = "v1beta1"
PLURAL = "slices"
KIND = "Slice"
FINALIZER = "accelerator.gke.io/slice-finalizer"
RETRY_ANNOTATION = "slice.gke.io/retry-on-failure"

# Node labels GKE sets on every node of a sub-block pool (create-dynamic-slices, "Verify the
# status of the nodes and the partitions"; xpk templates/kueue_super_slicing_topology.yaml.j2).
PARTITION_ID_LABEL = "cloud.google.com/gke-tpu-partition-4x4x4-id"
PARTITION_STATE_LABEL = "cloud.google.com/gke-tpu-partition-4x4x4-state"
TOPOLOGY_MODE_LABEL = "cloud.google.com/gke-accelerator-topology-mode"
BLOCK_LABEL = "cloud.google.com/gce-topology-block"
SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
# Node labels the slice controller sets on the nodes of a formed slice (same page, "Run workloads
# on dynamic slicing" and "Disable the Slice Controller").
SLICE_LABEL = "cloud.google.com/gke-tpu-slice"
SLICE_TOPOLOGY_ANNOTATION = "cloud.google.com/gke-tpu-slice-topology"

# Partition states (the PARTITION_STATE_LABEL values).
HEALTHY = "HEALTHY"
DEGRADED = "DEGRADED"
UNHEALTHY = "UNHEALTHY"
UNSET = "UNSET"
INCOMPLETE = "INCOMPLETE"
PARTITION_STATES = (HEALTHY, DEGRADED, UNHEALTHY, UNSET, INCOMPLETE)

# Slice states: the reason of the Ready condition (create-dynamic-slices, "Monitor the status of
# the Slice custom resource"; reference/crds/slice).
READY = "Ready"
SLICE_NOT_CREATED = "SliceNotCreated"
SLICE_CREATION_FAILED = "SliceCreationFailed"
ACTIVATING = "ACTIVATING"
ACTIVE = "ACTIVE"
ACTIVE_DEGRADED = "ACTIVE_DEGRADED"
FAILED = "FAILED"
DEACTIVATING = "DEACTIVATING"
SLICE_STATES = (
    SLICE_NOT_CREATED,
    SLICE_CREATION_FAILED,
    ACTIVATING,
    ACTIVE,
    ACTIVE_DEGRADED,
    FAILED,
    DEACTIVATING,
    INCOMPLETE,
)
# Ready is True in these (xpk slice/internal/core/core.go, GetSliceState).
READY_STATES = (ACTIVE, ACTIVE_DEGRADED)

# A sub-block: a 4x4x4 cube of tpu7x chips on 16 VMs of 4 chips (concepts/dynamic-slicing).
CUBE_TOPOLOGY = "4x4x4"
CHIPS_PER_CUBE = 64
VMS_PER_CUBE = 16
MAX_SLICE_CHIPS = 9216
MAX_NAME_LENGTH = 54
SLICE_TYPE = "tpu7x"
