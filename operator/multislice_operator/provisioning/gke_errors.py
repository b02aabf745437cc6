"""What a GKE API error means: a code, whether retrying can help, and whether to retry at once.

The part of the GKE adapter that changes most: GKE's wording is matched here, and only here, with
each pattern's source. Pure: no I/O, no client calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc

from multislice_operator.common.pools import CAPACITY_CODES, PoolError
from multislice_operator.common.pools import CODE_QUOTA as CODE_QUOTA
from multislice_operator.common.pools import (
    CODE_RESERVATION_EXHAUSTED as CODE_RESERVATION_EXHAUSTED,
)
from multislice_operator.common.pools import CODE_STOCKOUT as CODE_STOCKOUT
from multislice_operator.planning.plan import NodePoolSpec

# PoolError codes this module produces (besides the cloud's own GCE_* ones and the core's
# capacity codes, common/pools.py).
CODE_RATE_LIMITED = "RATE_LIMITED"  # 429: API rate quota
CODE_CLUSTER_BUSY = "CLUSTER_BUSY"  # "incompatible operation", "currently creating ..."
CODE_UNAVAILABLE = "UNAVAILABLE"  # 5xx, timeouts, connection errors
CODE_UNAUTHENTICATED = "UNAUTHENTICATED"  # token refresh failures (Workload Identity hiccups)
CODE_INVALID = "INVALID_ARGUMENT"
CODE_INVALID_MACHINE_TYPE = "INVALID_MACHINE_TYPE"
CODE_RESERVATION = "RESERVATION_UNUSABLE"
CODE_PERMISSION = "PERMISSION_DENIED"
CODE_NOT_FOUND = "NOT_FOUND"  # the cluster or location does not exist
CODE_ALREADY_EXISTS = "ALREADY_EXISTS"
CODE_FAILED_PRECONDITION = "FAILED_PRECONDITION"
CODE_CONFLICT = "CONFLICT"
CODE_OWNED_BY_OTHER = "OWNED_BY_OTHER_JOB"  # same name, another job's uid: delete it first
CODE_NAME_TAKEN = "NAME_TAKEN"  # same name, not created by this operator: never touched
CODE_NOT_OFFERED = "ACCELERATOR_NOT_OFFERED"
CODE_POOL_ERROR = "NODE_POOL_ERROR"  # an ERROR pool whose message says nothing more specific
CODE_IP_SPACE = "IP_SPACE_EXHAUSTED"  # the cluster's pod range is full: capacity, comes back
CODE_PLACEMENT = "PLACEMENT_UNSUPPORTED"  # a placement GKE refuses for the machine type
CODE_WORKLOAD_POLICY = "WORKLOAD_POLICY_UNUSABLE"  # missing, or another type/topology
CODE_GKE_VERSION = "GKE_VERSION_TOO_OLD"  # the cluster cannot run what the job asks for
CODE_UNKNOWN = "UNKNOWN"

_BUSY_RE = re.compile(
    r"incompatible operation|is currently (creating|deleting|upgrading|updating|repairing|"
    r"reconciling|resizing)|please wait and try again|too many operations|"
    r"currently being (created|deleted|updated|repaired)",
    re.IGNORECASE,
)
DELETING_RE = re.compile(r"is currently deleting", re.IGNORECASE)
# A specific reservation without the VMs free: GKE's synchronous 429 at create, "Reservation
# does not have enough resources for the request: specific reservation "R" is insufficient for
# node pool "N" at zone "Z": required 1 and short of 1 VM count of machine type M."
# (GoogleCloudPlatform/gsutil#1000), and the managed instance group's "Reservation R does not
# have sufficient capacity for the requested resources." (the cluster autoscaler's
# RESERVATION_CAPACITY_EXCEEDED, kubernetes/autoscaler#7319). Capacity: it comes back when the
# reservation's VMs are free. Matched before the stockout and rate-limit patterns, which its
# words and its 429 would otherwise match.
_RESERVATION_FULL_RE = re.compile(
    r"reservation does not have enough resources|specific reservation \S+ is insufficient|"
    r"reservation \S+ does not have sufficient capacity",
    re.IGNORECASE,
)
_STOCKOUT_RE = re.compile(
    r"GCE_STOCKOUT|ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources|stockout|"
    r"resource pool exhausted",
    re.IGNORECASE,
)
# Create-time quota shortfall is a synchronous 403 PERMISSION_DENIED, not a permission problem:
# "Insufficient regional quota to satisfy request: resource \"CPUS\": request requires '72.0'
# and is short '48.0'. project has a quota of '24.0' ..." (GitHub issue
# kaiwaehner/hivemq-mqtt-tensorflow-kafka-realtime-iot-machine-learning-training-inference#48),
# "Insufficient project quota to satisfy request: resource
# \"CPUS_ALL_REGIONS\" ..." (jarokaz/mlops-labs#58), older "... request for resource:
# \"IN_USE_ADDRESSES\"" (kubeflow/kubeflow#842). Capacity: it comes back, so transient.
_QUOTA_RE = re.compile(
    r"GCE_QUOTA_EXCEEDED|QUOTA_EXCEEDED|quota '[^']*' exceeded|"
    r"insufficient (regional |project |zonal )?quota|exceeded quota",
    re.IGNORECASE,
)
_QUOTA_RESOURCE_RE = re.compile(r"resource:?\s*\\?\"?([A-Za-z0-9_]+)")
_QUOTA_SCOPE_RE = re.compile(r"insufficient (regional|project|zonal) quota", re.IGNORECASE)
_MACHINE_RE = re.compile(
    r"invalid machine type|machine type \S+ (does not exist|is not supported|is not available)|"
    r"machine type '[^']*' does not exist",
    re.IGNORECASE,
)
_RESERVATION_RE = re.compile(
    r"reservation\b.*\b(not found|does not exist|incompatible|not compatible|cannot be used)",
    re.IGNORECASE,
)
_PERMISSION_RE = re.compile(r"permission|forbidden|not authorized", re.IGNORECASE)
# The managed instance group cannot take node IPs from the cluster's pod range: "Current errors:
# [IP_SPACE_EXHAUSTED]: Instance '...' creation failed: IP space of '...' is exhausted."
# (hashicorp/terraform-cdk#1964, GoogleCloudPlatform/cloud-foundation-fabric#1644). Capacity: it
# comes back when other pools go.
_IP_SPACE_RE = re.compile(r"IP_SPACE_EXHAUSTED|IP space of .* is exhausted", re.IGNORECASE)
# A tpu7x pool with COMPACT placement goes to ERROR: "Creation of a managed instance group with
# tpu7x-standard-4t machine type with placement policy is not supported. Use workload policy
# instead." (vllm-project/ci-infra#547). Retrying the same request cannot help.
_PLACEMENT_RE = re.compile(
    r"with placement policy is not supported|use workload policy instead", re.IGNORECASE
)
# GKE refuses a pool naming a resource policy it cannot find ("If not found, InvalidArgument
# error is returned", NodePool.PlacementPolicy.policy_name) or one that does not fit.
_WORKLOAD_POLICY_RE = re.compile(
    r"(resource|workload) policy\b.*\b(not found|does not match)", re.IGNORECASE
)


# --------------------------------------------------------------------------------------------
# Error classification


@dataclass(frozen=True)
class Classified:
    """What an exception means for the caller."""

    code: str
    message: str
    permanent: bool  # retrying cannot help
    retry_now: bool  # worth an in-process retry within seconds

    def pool_error(
        self, spec_or_name: NodePoolSpec | str, slice_index: int | None = None
    ) -> PoolError:
        if isinstance(spec_or_name, NodePoolSpec):
            return PoolError(
                spec_or_name.slice_index, spec_or_name.name, self.code, self.message, self.permanent
            )
        return PoolError(slice_index, spec_or_name, self.code, self.message, self.permanent)


def _rpc_status(exc: gexc.GoogleAPICallError) -> str:
    """The canonical status (``FAILED_PRECONDITION``...) of an API error, REST or gRPC."""
    grpc_code = getattr(exc, "grpc_status_code", None)
    if grpc_code is not None:
        return str(getattr(grpc_code, "name", grpc_code))
    response = getattr(exc, "response", None)
    try:
        status = response.json()["error"]["status"] if response is not None else ""
    except (ValueError, KeyError, TypeError, AttributeError):
        status = ""
    return str(status or "")


def describe_quota(message: str, region: str) -> str:
    """A quota error's message, led by which quota and where ("TPU_V5E in region us-east5")."""
    resource = _QUOTA_RESOURCE_RE.search(message)
    scope = _QUOTA_SCOPE_RE.search(message)
    what = resource.group(1) if resource else "quota"
    where = (
        "project-wide" if scope and scope.group(1).lower() == "project" else f"in region {region}"
    )
    return f"insufficient quota {what} {where}: {message}"


def classify_message(message: str, rpc_code: int | None = None) -> tuple[str, bool]:
    """(code, permanent) of a failed operation's or an ERROR pool's message."""
    if _RESERVATION_FULL_RE.search(message):
        return CODE_RESERVATION_EXHAUSTED, False
    if _STOCKOUT_RE.search(message):
        return CODE_STOCKOUT, False
    if _QUOTA_RE.search(message):
        return CODE_QUOTA, False
    if _IP_SPACE_RE.search(message):
        return CODE_IP_SPACE, False
    if _PLACEMENT_RE.search(message):
        return CODE_PLACEMENT, True
    if _WORKLOAD_POLICY_RE.search(message):
        return CODE_WORKLOAD_POLICY, True
    if _MACHINE_RE.search(message):
        return CODE_INVALID_MACHINE_TYPE, True
    if _RESERVATION_RE.search(message):
        return CODE_RESERVATION, True
    if rpc_code == 3:  # google.rpc.Code INVALID_ARGUMENT
        return CODE_INVALID, True
    if rpc_code == 7 or (rpc_code is None and _PERMISSION_RE.search(message)):
        return CODE_PERMISSION, True
    return CODE_POOL_ERROR, False


def classify_exception(exc: BaseException) -> Classified:
    """Map an exception from a client call to a code, permanence and in-process retryability."""
    if not isinstance(exc, gexc.GoogleAPICallError):
        return _classify_non_api(exc)
    message = str(exc.message or exc)
    status = _rpc_status(exc)
    if isinstance(exc, gexc.Conflict | gexc.AlreadyExists):
        if status == "ALREADY_EXISTS" or "already exists" in message.lower():
            return Classified(CODE_ALREADY_EXISTS, message, False, False)
        return Classified(CODE_CONFLICT, message, False, True)
    if _BUSY_RE.search(message):
        return Classified(CODE_CLUSTER_BUSY, message, False, True)
    if _RESERVATION_FULL_RE.search(message):  # a 429 too, but capacity, not the API's rate
        return Classified(CODE_RESERVATION_EXHAUSTED, message, False, False)
    if isinstance(exc, gexc.TooManyRequests | gexc.ResourceExhausted):
        return Classified(CODE_RATE_LIMITED, message, False, True)
    if isinstance(exc, gexc.ServerError | gexc.DeadlineExceeded | gexc.ServiceUnavailable):
        return Classified(CODE_UNAVAILABLE, message, False, True)
    code, _ = classify_message(message)
    if code in CAPACITY_CODES:
        return Classified(code, message, False, False)
    if isinstance(exc, gexc.Unauthorized):
        return Classified(CODE_UNAUTHENTICATED, message, False, True)
    if isinstance(exc, gexc.Forbidden):
        return Classified(CODE_PERMISSION, message, True, False)
    if isinstance(exc, gexc.NotFound):
        return Classified(CODE_NOT_FOUND, message, True, False)
    if status == "FAILED_PRECONDITION" or isinstance(exc, gexc.FailedPrecondition):
        return Classified(CODE_FAILED_PRECONDITION, message, False, False)
    if isinstance(exc, gexc.ClientError):
        if code in (CODE_INVALID_MACHINE_TYPE, CODE_RESERVATION, CODE_WORKLOAD_POLICY):
            return Classified(code, message, True, False)
        return Classified(CODE_INVALID, message, True, False)
    return Classified(CODE_UNKNOWN, message, False, False)


def _classify_non_api(exc: BaseException) -> Classified:
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, auth_exc.RefreshError | auth_exc.TransportError):
        return Classified(CODE_UNAUTHENTICATED, message, False, True)
    if isinstance(exc, requests.exceptions.RequestException | OSError | TimeoutError):
        return Classified(CODE_UNAVAILABLE, message, False, True)
    return Classified(CODE_UNKNOWN, message, False, False)
