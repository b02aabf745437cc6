"""The MultisliceJob API (multislice.dev/v1alpha1): the single source of truth.

The CRD's openAPIV3Schema is generated from these models (api/crd.py); descriptions here are what
`kubectl explain` shows. Cross-field rules that need the catalog (chips per slice) live in the plan.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from multislice_operator.api import podtemplate
from multislice_operator.registry import REGISTRY
from multislice_operator.tpu import parallelism
from multislice_operator.tpu.catalog import ACCELERATOR_PATTERN, GENERATIONS

GROUP = "multislice.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MultisliceJob"
PLURAL = "multislicejobs"
SINGULAR = "multislicejob"
SHORT_NAMES = ["msj"]

# The workload's exit codes the failure policy knows (docs/environment.md section 1; the workload
# states them in multislice_workload/exitcodes.py, which the operator does not import).
EXIT_RESTART_REQUESTED = 42  # the program asks for a restart (xpk / MaxText: sys.exit(42))
EXIT_HANG = 75  # the workload's watchdog: no step within its bound; always restarts, cause hang
EXIT_CONFIG_ERROR = 78  # fatal configuration error: the default fatal code
DEFAULT_NON_RETRYABLE_EXIT_CODES = [EXIT_CONFIG_ERROR]
# xpk's get_restart_exit_codes (src/xpk/commands/workload.py): 42 and 127-255 (signals).
XPK_RESTART_EXIT_CODES = [EXIT_RESTART_REQUESTED, *range(127, 256)]
EXIT_CODE_MIN, EXIT_CODE_MAX = 1, 255  # what a process can exit with, besides 0 (success)
# Compute Engine names (RFC 1035, <= 63) and project ids (6-30 characters); a shared reservation
# is named projects/OWNER_PROJECT/reservations/NAME (GKE "Consume reserved zonal resources"). A
# reservation block or sub-block is RESERVATION/reservationBlocks/BLOCK[/reservationSubBlocks/SUB]
# after either form, as xpk sends it in --reservation (src/xpk/core/capacity.py
# to_reservation_path; GKE "Consume reserved zonal resources", reservation blocks).
_GCE_NAME = r"([a-z]|[a-z][-a-z0-9]{0,61}[a-z0-9])"
_PROJECT_ID = r"[a-z][-a-z0-9]{4,28}[a-z0-9]"
_BLOCKS = rf"(/reservationBlocks/{_GCE_NAME}(/reservationSubBlocks/{_GCE_NAME})?)?"
RESERVATION_PATTERN = rf"^({_GCE_NAME}|projects/{_PROJECT_ID}/reservations/{_GCE_NAME}){_BLOCKS}$"
# Generations GKE has no flex-start for (catalog.Generation.flex_start_min_gke None): v4.
NO_FLEX_START = tuple(p for p, g in GENERATIONS.items() if g.flex_start_min_gke is None)
RESERVATION_MAX = (
    (len("projects/") + 30 + len("/reservations/") + 63)
    + len("/reservationBlocks/")
    + 63
    + len("/reservationSubBlocks/")
    + 63
)
# A job's slices, and its slices and hot spares together (spec.slices, spec.spares).
SLICES_MAX = 256
SPARES_MAX = 16
ELASTIC_WAIT_DEFAULT_S = 600
# Flex-start VMs run at most seven days; GKE's default maxRunDurationSeconds is that maximum
# (GKE "About flex-start provisioning mode").
FLEX_START_MAX_RUN_S = 7 * 24 * 3600
# A Kubernetes resource quantity (k8s.io/apimachinery resource.Quantity's regular form).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
PREFLIGHT_TIMEOUT_DEFAULT_S = 1800  # a compile for a 256-slice topology takes minutes on CPU


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )


class CapacityType(StrEnum):
    ON_DEMAND = "OnDemand"
    SPOT = "Spot"
    RESERVED = "Reserved"
    FLEX_START = "FlexStart"  # Dynamic Workload Scheduler: waits for capacity, runs <= 7 days


# spec.provisioning.mode: a registered capacity model's (registry.py); this one when unset.
DEFAULT_MODE = "Managed"


def _modes_schema(schema: dict[str, Any]) -> None:
    """spec.provisioning.mode: the registered capacity models (a plugin's mode is in the CRD's
    enum once it is loaded), each with what it does."""
    found = REGISTRY.models().values()
    schema["enum"] = [m.mode for m in found]
    schema["description"] = " ".join(f"{m.mode}: {m.description}" for m in found)


def _option_modes_schema(schema: dict[str, Any]) -> None:
    """provisioning.fallback.options[].mode: the registered models an option can be served by
    (every one but those composed of others)."""
    schema["enum"] = [m.mode for m in REGISTRY.models().values() if m.compose is None]


class CubeSource(StrEnum):
    """Where a dynamic-slicing job's 4x4x4 cubes (reservation sub-blocks) come from."""

    MANAGED = "Managed"  # the operator creates one node pool per cube, and deletes it after
    EXISTING = "Existing"  # a platform team provisioned them; the operator only forms Slices


class Capacity(_Model):
    """Which Cloud TPU capacity the slices use."""

    type: CapacityType = Field(
        default=CapacityType.ON_DEMAND,
        description=(
            "OnDemand (queued on on-demand quota), Spot (preemptible; a preempted slice is "
            "replaced and all slices restart from the last checkpoint), Reserved (a reservation) "
            "or FlexStart (GKE flex-start, Dynamic Workload Scheduler: each slice's node pool "
            "waits for capacity without a reservation, then runs at most maxRunDurationSeconds; "
            "v5e, v5p, v6e and tpu7x, not v4)."
        ),
    )
    reservation: str | None = Field(
        default=None,
        max_length=RESERVATION_MAX,
        pattern=RESERVATION_PATTERN,
        description=(
            "The reservation to consume (required with type Reserved, invalid otherwise): a name "
            "in the node pools' project, or projects/PROJECT/reservations/NAME for a shared "
            "reservation owned by another project; either followed by /reservationBlocks/BLOCK "
            "or /reservationBlocks/BLOCK/reservationSubBlocks/SUB_BLOCK to consume one block or "
            "sub-block of it."
        ),
    )
    max_run_duration_seconds: int | None = Field(
        default=None,
        ge=60,
        le=FLEX_START_MAX_RUN_S,
        description=(
            "FlexStart only: how long the slices' VMs may run once provisioned before GKE removes "
            f"them (default and maximum {FLEX_START_MAX_RUN_S} s, seven days). Reaching it is a "
            "disruption: the slice is replaced and all slices restart from the last checkpoint."
        ),
    )

    def run_duration_seconds(self) -> int | None:
        """FlexStart: the max run duration sent to GKE (the default is GKE's maximum)."""
        if self.type != CapacityType.FLEX_START:
            return None
        return self.max_run_duration_seconds or FLEX_START_MAX_RUN_S


class DegradedPolicy(StrEnum):
    """What a dynamic-slicing job does with a Slice that goes ACTIVE_DEGRADED (formed on a
    DEGRADED cube: "impaired, still usable to form a slice", GKE "About GKE dynamic slicing")."""

    KEEP_RUNNING = "KeepRunning"  # it is usable (Ready=True): keep training, as GKE and xpk do
    REPLACE_WHEN_SPARE = "ReplaceWhenSpare"  # re-form it from free healthy cubes when there are


SLICE_DELETION_TIMEOUT_SECONDS = 600


class DynamicSlicing(_Model):
    """GKE dynamic slicing (provisioning.mode DynamicSlicing, Ironwood only): capacity comes as
    4x4x4 cubes (reservation sub-blocks of 16 tpu7x VMs, one node pool each) and the operator
    stitches them into one GKE `Slice` (accelerator.gke.io/v1beta1) per slice of the job."""

    cubes: CubeSource = Field(
        default=CubeSource.MANAGED,
        description=(
            "Managed: the operator creates the cubes it needs (one node pool per sub-block of "
            "spec.capacity.reservation, an All Capacity mode reservation; its block or sub-block "
            "when the reservation names one) and deletes them when the job ends. Existing: the "
            "cubes are node pools a platform team provisioned; the operator only forms and "
            "deletes the Slices. spec.spares counts cubes kept free for a lost cube's slice."
        ),
    )
    degraded: DegradedPolicy = Field(
        default=DegradedPolicy.KEEP_RUNNING,
        description=(
            "A Slice that goes ACTIVE_DEGRADED (a cube of it DEGRADED: impaired, still usable, "
            "GKE's word) is usable. KeepRunning: the job keeps training on it, as GKE and xpk's "
            "slice controller do. ReplaceWhenSpare: when enough free healthy cubes of one "
            "reservation block are there (spec.spares), the Slice is formed again on them and "
            "every slice restarts (cause disruption); without them it keeps running. Either way "
            "its running chip-seconds count as degraded in status.goodput."
        ),
    )
    slice_deletion_timeout_seconds: int = Field(
        default=SLICE_DELETION_TIMEOUT_SECONDS,
        ge=30,
        le=24 * 3600,
        description=(
            "How long a deleted Slice of the job may stay (GKE's troubleshooting page names "
            "Slices stuck in DEACTIVATING) before the operator removes its finalizer, as GKE's "
            "guide deletes a Slice, with a Warning event (SliceFinalizerRemoved)."
        ),
    )


FALLBACK_OPTIONS_MAX = 8
FALLBACK_SHAPES_MAX = 4
# An option's zone: a Compute Engine zone name (REGION-LETTER), e.g. us-east5-b.
ZONE_PATTERN = r"^[a-z]+-[a-z]+[0-9]+-[a-z]$"
SHAPE_NAME_PATTERN = r"^[a-z]$|^[a-z][-a-z0-9]{0,30}[a-z0-9]$"
# The capacity model serving an option when it names none (registry.py; plugins/fallback.py).
FALLBACK_OPTION_MODE = "Managed"


class FallbackShape(_Model):
    """Another shape the job can run as: another accelerator or slice count, with its own
    parallelism (the template, checkpoint and everything else stay the job's)."""

    name: str = Field(
        pattern=SHAPE_NAME_PATTERN,
        max_length=32,
        description="How options name it (provisioning.fallback.options[].shape).",
    )
    accelerator: str = Field(
        pattern=ACCELERATOR_PATTERN,
        max_length=32,
        description="Cloud TPU accelerator type of every slice of this shape (as "
        "spec.accelerator).",
    )
    topology: str | None = Field(
        default=None,
        pattern=r"^[0-9]+x[0-9]+(x[0-9]+)?$",
        description="Slice shape, e.g. 4x4. Default: the catalog's shape for the type.",
    )
    slices: int = Field(ge=1, le=SLICES_MAX, description="Number of identical slices.")
    parallelism: ParallelismSpec = Field(
        default_factory=lambda: ParallelismSpec(),
        description="The layout on this shape (as spec.parallelism): ICI over one slice's chips, "
        "DCN over this shape's slices.",
    )


class FallbackOption(_Model):
    """One way to get the gang: a capacity type (and reservation), a zone and a shape, tried
    all or none for at most trySeconds."""

    capacity: Capacity = Field(
        default_factory=lambda: Capacity(),
        description="The capacity of this option, as spec.capacity (type, reservation, "
        "maxRunDurationSeconds).",
    )
    zone: str | None = Field(
        default=None,
        pattern=ZONE_PATTERN,
        max_length=63,
        description="Another zone of the cluster's region for this option's node pools (a slice "
        "lives in one zone). Default: the operator's node location (--gke-node-location).",
    )
    shape: str | None = Field(
        default=None,
        pattern=SHAPE_NAME_PATTERN,
        max_length=32,
        description="The shape (provisioning.fallback.shapes[].name) this option runs the job "
        "as. Default: the job's own (spec.accelerator, spec.slices, spec.parallelism).",
    )
    mode: str = Field(
        default=FALLBACK_OPTION_MODE,
        description="The capacity model serving this option: Managed (a node pool per slice), "
        "DynamicSlicing (GKE Slices over Ironwood cubes of a reservation block; set "
        "dynamicSlicing) or Existing (node pools that are there).",
        json_schema_extra=_option_modes_schema,
    )
    dynamic_slicing: DynamicSlicing | None = Field(
        default=None, description="With mode DynamicSlicing: where the cubes come from."
    )
    try_seconds: int | None = Field(
        default=None,
        ge=10,
        le=7 * 24 * 3600,
        description="How long this option is tried (its gang provisioning, or waiting for "
        "flex-start capacity or for the quota of its Kueue flavor) before it is rolled back and "
        "the next option is tried. Default: spec.provisioning.timeoutSeconds.",
    )


class Fallback(_Model):
    """provisioning.mode Fallback: an ordered list of ways to get the gang, each all or none."""

    options: list[FallbackOption] = Field(
        min_length=1,
        max_length=FALLBACK_OPTIONS_MAX,
        description="Tried in order, each all or none (slices are never mixed across options): "
        "a stockout, a quota error, an exhausted reservation, the option's trySeconds running "
        "out or its shape refused by the preflight compile rolls it back and moves to the next; "
        "after the last, back to the first after a backoff. Errors retrying cannot fix still "
        "fail the job.",
    )
    shapes: list[FallbackShape] = Field(
        default_factory=list,
        max_length=FALLBACK_SHAPES_MAX,
        description="Alternative shapes the options may name. With spec.preflight each shape is "
        "compiled before its first option is tried; a shape the compiler refuses is skipped, "
        "never provisioned.",
    )


class Provisioning(_Model):
    """How the slices' node pools come to exist."""

    mode: str = Field(
        default=DEFAULT_MODE,
        description="How the slices get their nodes: a registered capacity model's mode.",
        json_schema_extra=_modes_schema,
    )
    dynamic_slicing: DynamicSlicing | None = Field(
        default=None,
        description="Only with mode DynamicSlicing: where the cubes come from (default Managed).",
    )
    fallback: Fallback | None = Field(
        default=None,
        description="Only with mode Fallback: the ordered capacity options and alternative shapes "
        "(docs/provisioning.md#fallback-across-capacity-types-and-shapes).",
    )
    timeout_seconds: int = Field(
        default=1800,
        ge=10,
        le=7 * 24 * 3600,
        description=(
            "How long one gang attempt may take before every node pool of the gang is deleted "
            "(mode DynamicSlicing: every Slice, and the cube pools the job created) and the "
            "attempt retried with backoff."
        ),
    )
    keep_node_pools: bool = Field(
        default=False,
        description="Keep the node pools after the job succeeds (they are still deleted with it).",
    )

    @field_validator("mode")
    @classmethod
    def _registered(cls, mode: str) -> str:
        if mode not in REGISTRY.modes():
            known = word_list(REGISTRY.modes(), "or")
            raise ValueError(
                f"{mode!r} is not a provisioning mode: use {known} (the capacity models "
                "this operator has; a plugin's mode needs the plugin loaded)"
            )
        return mode


class IciParallelism(_Model):
    """Sharding inside a slice (ICI). data x fsdp x tensor must equal the chips of one slice."""

    data: int | None = Field(default=None, ge=1, description="Data parallelism over ICI.")
    fsdp: int | None = Field(
        default=None,
        ge=1,
        description="Fully sharded data parallelism over ICI. Default: the chips per slice.",
    )
    tensor: int | None = Field(default=None, ge=1, description="Tensor parallelism over ICI.")


class DcnParallelism(_Model):
    """Sharding across slices (DCN). data x fsdp x pipeline x tensor must equal spec.slices."""

    data: int | None = Field(
        default=None, ge=1, description="Data parallelism across slices. Default: spec.slices."
    )
    fsdp: int | None = Field(default=None, ge=1, description="FSDP across slices.")
    pipeline: int | None = Field(
        default=None,
        ge=1,
        description="Pipeline stages across slices: the last resort when the batch cannot grow.",
    )
    tensor: int | None = Field(
        default=None,
        ge=1,
        description="Must be 1: DCN bandwidth is far too low for tensor parallelism.",
    )


class ParallelismSpec(_Model):
    """ICI and DCN parallelism, injected into the workload's environment."""

    ici: IciParallelism = Field(default_factory=IciParallelism)
    dcn: DcnParallelism = Field(default_factory=DcnParallelism)


class Training(_Model):
    """Hints about the training run, used by the DCN advisor."""

    global_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Global batch size in tokens per step. With it the advisor says whether data/FSDP "
            "parallelism across slices is bound by the DCN."
        ),
    )


CHECKPOINT_DIR_MAX = 1024


class RestartCause(StrEnum):
    """Why all slices restarted (the keys of status.restartsByCause)."""

    DISRUPTION = "disruption"  # DisruptionTarget or a lost node / pool: not charged to maxRestarts
    WORKLOAD = "workload"  # the program failed with a retryable code
    HANG = "hang"  # the workload's watchdog (exit code 75)
    STARTUP = "startup"  # failurePolicy.startupTimeoutSeconds: not charged to maxRestarts
    # spec.elastic: the operator recreated the JobSet on another slice count; charged to none.
    RESIZE = "resize"


class Budget(StrEnum):
    """The failurePolicy field a restart is charged to."""

    MAX_RESTARTS = "maxRestarts"  # enforced by JobSet (restartsCountTowardsMax)
    MAX_DISRUPTION_RESTARTS = "maxDisruptionRestarts"  # enforced by the operator
    NONE = "none"  # the operator's own choice (an elastic resize): no budget


# Every cause's budget: a new cause without one is a KeyError in the tests, never uncharged.
BUDGET_OF_CAUSE: dict[RestartCause, Budget] = {
    RestartCause.DISRUPTION: Budget.MAX_DISRUPTION_RESTARTS,
    RestartCause.WORKLOAD: Budget.MAX_RESTARTS,
    RestartCause.HANG: Budget.MAX_RESTARTS,
    RestartCause.STARTUP: Budget.MAX_DISRUPTION_RESTARTS,
    RestartCause.RESIZE: Budget.NONE,
}
# What each cause means: the one text the descriptions below and docs/failures.md's table take.
CAUSE_MEANING: dict[RestartCause, str] = {
    RestartCause.DISRUPTION: "a pod with the DisruptionTarget condition (preemption, graceful "
    "node shutdown, eviction) or a lost node or node pool",
    RestartCause.WORKLOAD: "the program failed with a retryable exit code",
    RestartCause.HANG: f"the workload's hang watchdog (exit code {EXIT_HANG} or a hang "
    "termination message)",
    RestartCause.STARTUP: "pods not all running within failurePolicy.startupTimeoutSeconds of "
    "the capacity being ready: the operator evicted them",
    RestartCause.RESIZE: "the operator recreated the JobSet on fewer or more slices (spec.elastic)",
}


def causes_charged_to(budget: Budget) -> tuple[RestartCause, ...]:
    return tuple(c for c, b in BUDGET_OF_CAUSE.items() if b == budget)


# Causes charged to failurePolicy.maxRestarts, and those charged to maxDisruptionRestarts.
PROGRAM_CAUSES = causes_charged_to(Budget.MAX_RESTARTS)
DISRUPTION_CAUSES = causes_charged_to(Budget.MAX_DISRUPTION_RESTARTS)


def word_list(words: Iterable[str], last: str = "and") -> str:
    """'a, b and c': every generated list of causes reads this way."""
    *init, final = [str(w) for w in words]
    return f"{', '.join(init)} {last} {final}" if init else final


def charged_to(budget: Budget) -> str:
    return "charged to no budget" if budget == Budget.NONE else f"charged to failurePolicy.{budget}"


def _restarts_of(cause: RestartCause) -> str:
    """A counter of status.restartsByCause: what its cause means and what it is charged to."""
    meaning = CAUSE_MEANING[cause]
    return f"{meaning[0].upper()}{meaning[1:]}; {charged_to(BUDGET_OF_CAUSE[cause])}."


def _charged_elsewhere(budget: Budget) -> str:
    """The restarts a failurePolicy field does not count, and what they are charged to."""
    parts = []
    for other in Budget:
        causes = causes_charged_to(other)
        if other != budget and causes:
            word = "cause" if len(causes) == 1 else "causes"
            parts.append((f"{word} {word_list(causes)}", charged_to(other)))
    (first, to), *rest = parts
    more = "".join(f", those of {w} {t.removeprefix('charged ')}" for w, t in rest)
    return f"Restarts of {first} are {to}{more}."


class Checkpoint(_Model):
    """Where the workload saves and resumes checkpoints."""

    directory: str | None = Field(
        default=None,
        min_length=1,
        max_length=CHECKPOINT_DIR_MAX,
        description="Checkpoint directory: gs://bucket/path or an absolute path of a mounted "
        "volume (/...), handed to the workload as MULTISLICE_CHECKPOINT_DIR.",
    )


class ExitCodePolicy(StrEnum):
    """Which non-zero exit codes of the TPU container restart all slices."""

    RESTART_UNLESS_LISTED = "RestartUnlessListed"  # ours: every code but nonRetryableExitCodes
    RESTART_IF_LISTED = "RestartIfListed"  # xpk's: only restartExitCodes


class FailurePolicy(_Model):
    """When a failure restarts all slices, what it is charged to, and when it ends the job."""

    max_restarts: int = Field(
        default=10,
        ge=0,
        le=10000,
        description=(
            "Restarts of all slices for the program's own failures (cause "
            f"{word_list(PROGRAM_CAUSES, 'or')}) allowed before the job fails. Every slice "
            "restarts and resumes from its last checkpoint. "
            + _charged_elsewhere(Budget.MAX_RESTARTS)
        ),
    )
    max_disruption_restarts: int = Field(
        default=30,
        ge=0,
        le=10000,
        description=(
            "Restarts not caused by the program ("
            + "; ".join(f"cause {c}: {CAUSE_MEANING[c]}" for c in DISRUPTION_CAUSES)
            + ") allowed before the job fails: stops an endless loop on a broken zone. Enforced "
            "by the operator (JobSet does not bound them)."
        ),
    )
    exit_code_policy: ExitCodePolicy = Field(
        default=ExitCodePolicy.RESTART_UNLESS_LISTED,
        description=(
            "RestartUnlessListed: every non-zero exit code restarts all slices except "
            "nonRetryableExitCodes. RestartIfListed (xpk's policy): only restartExitCodes "
            "restart, every other non-zero code fails the job. Under both, exit code 75 (the "
            "workload's hang watchdog) restarts."
        ),
    )
    non_retryable_exit_codes: list[int] = Field(
        default_factory=lambda: list(DEFAULT_NON_RETRYABLE_EXIT_CODES),
        max_length=255,
        description=(
            "RestartUnlessListed: exit codes of the TPU container that fail the job at once "
            f"instead of restarting (1-255, not {EXIT_HANG}). Default [{EXIT_CONFIG_ERROR}], "
            "the workload's configuration-error code."
        ),
        json_schema_extra={
            "items": {"type": "integer", "minimum": EXIT_CODE_MIN, "maximum": EXIT_CODE_MAX}
        },
    )
    unschedulable_timeout_seconds: int = Field(
        default=600,
        ge=10,
        le=7 * 24 * 3600,
        description=(
            "How long a pod may stay unschedulable while every slice's capacity is ready before "
            "the job fails with the scheduler's reason and releases its node pools (e.g. a "
            "nodeSelector no node of the slices carries)."
        ),
    )
    restart_exit_codes: list[int] | None = Field(
        default=None,
        max_length=255,
        description=(
            "RestartIfListed: the exit codes that restart all slices (1-255); every other "
            f"non-zero code fails the job. Default xpk's: {EXIT_RESTART_REQUESTED} and "
            f"127-255 (signals); {EXIT_HANG} always restarts."
        ),
        json_schema_extra={
            "items": {"type": "integer", "minimum": EXIT_CODE_MIN, "maximum": EXIT_CODE_MAX}
        },
    )
    startup_timeout_seconds: int | None = Field(
        default=None,
        ge=10,
        le=7 * 24 * 3600,
        description=(
            "Once every slice's capacity is ready, how long a start or restart may take until "
            "every pod runs. Past it the operator replaces a ready node pool of the job that "
            "hosts none of its pods while some cannot schedule (Managed, once per pool and "
            "attempt), else restarts all slices (cause startup). Keep it below "
            "unschedulableTimeoutSeconds for it to act on unschedulable pods. Unset: no deadline."
        ),
    )

    def restart_codes(self) -> list[int]:
        """RestartIfListed: the codes that restart (the hang code always does)."""
        listed = (
            XPK_RESTART_EXIT_CODES if self.restart_exit_codes is None else self.restart_exit_codes
        )
        return sorted({*listed, EXIT_HANG})

    def is_fatal(self, code: int | None) -> bool:
        """Whether this exit code of the TPU container fails the job at once."""
        if not code or code == EXIT_HANG:
            return False
        if self.exit_code_policy == ExitCodePolicy.RESTART_IF_LISTED:
            return code not in self.restart_codes()
        return code in self.non_retryable_exit_codes


class Maintenance(_Model):
    """Host maintenance announced on the slices' nodes (GKE's labels, node conditions)."""

    checkpoint_ahead_seconds: int | None = Field(
        default=None,
        ge=1,
        le=7 * 24 * 3600,
        description=(
            "Ask the workload for a checkpoint (annotation multislice.dev/checkpoint-request "
            "on every pod) this long before the earliest maintenance GKE scheduled on a node "
            "of the job (label cloud.google.com/scheduled-maintenance-time), so that the "
            "restart the maintenance forces loses almost nothing; at once for a node whose "
            "condition MaintenancePlanned is True (it names no start). Unset: no request."
        ),
    )


class Elastic(_Model):
    """Run on fewer slices when one is lost and not replaced in time, and grow back later."""

    min_slices: int = Field(
        ge=1,
        le=SLICES_MAX - 1,
        description=(
            "The fewest slices the job may run on: at least 1, less than spec.slices, and a size "
            "the DCN layout allows. Only dcn.data changes with the slice count (dcn.fsdp, "
            "dcn.pipeline and dcn.tensor stay as set), so the job runs at every k from "
            "spec.slices down to minSlices that is a multiple of dcn.fsdp x dcn.pipeline x "
            "dcn.tensor, with dcn.data = k / that product; a layout whose dcn.data is 1 cannot "
            "shrink. Each change of the slice count restarts all slices from the last checkpoint; "
            "the DCN advice of each size (`multislice-operator plan`) keeps "
            "spec.training.globalBatchTokens, so fewer slices get more tokens each."
        ),
    )
    wait_seconds: int = Field(
        default=ELASTIC_WAIT_DEFAULT_S,
        ge=0,
        le=7 * 24 * 3600,
        description=(
            "How long a lost slice's replacement may take to be Ready before the job restarts "
            "on the slices it has (at once when GKE answers stockout or quota); it grows back "
            "to spec.slices when capacity returns."
        ),
    )


class Preflight(_Model):
    """Compile the program for the job's TPUs on a CPU Job before any node pool is created."""

    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description=(
            "The compile command, run in the job's own image (its first container's) as a CPU "
            "Job with the job's environment. Unset: the workload's `multislice_workload compile "
            "--topology <generation>:<topology> --slices <n> --json` followed by the first "
            "container's args. Exit 0: the program fits; any other exit fails the job before any "
            "node pool (reason PreflightFailed, the command's message in the condition). The "
            'last line of JSON it writes to /dev/termination-log ({"fits", '
            '"hbm_bytes_per_device", "hbm_capacity_bytes", "step_time_s"}) is recorded '
            "in status.preflight. For MaxText: its train_compile module, e.g. [python3, -m, "
            "MaxText.train_compile, MaxText/configs/base.yml, compile_topology=v5e-16, "
            "compile_topology_num_slices=2]."
        ),
    )
    timeout_seconds: int = Field(
        default=PREFLIGHT_TIMEOUT_DEFAULT_S,
        ge=30,
        le=24 * 3600,
        description=(
            "The compile Job's activeDeadlineSeconds: a compile that runs longer fails the job "
            "(PreflightFailed)."
        ),
    )
    cpu: str = Field(
        default="2",
        pattern=QUANTITY_PATTERN,
        description="CPU the compile container requests (a Kubernetes quantity, e.g. 2 or 500m).",
    )
    memory: str = Field(
        default="8Gi",
        pattern=QUANTITY_PATTERN,
        description=(
            "Memory the compile container requests and is limited to (a Kubernetes quantity, "
            "e.g. 8Gi): compiling for a large topology holds the whole program on the CPU."
        ),
    )


class MultisliceJobSpec(_Model):
    """A training program run over several identical TPU slices, provisioned all or none."""

    accelerator: str = Field(
        pattern=ACCELERATOR_PATTERN,
        max_length=32,
        description=(
            "Cloud TPU accelerator type of every slice: v4-N, v5p-N or tpu7x-N (N counts "
            "TensorCores, two per chip: tpu7x-128 is 64 chips), v5litepod-N or v6e-N (N counts "
            "chips). e.g. v5litepod-16."
        ),
    )
    topology: str | None = Field(
        default=None,
        pattern=r"^[0-9]+x[0-9]+(x[0-9]+)?$",
        description="Slice shape, e.g. 4x4 or 2x2x4. Default: the catalog's shape for the type.",
    )
    slices: int = Field(
        ge=1, le=SLICES_MAX, description=f"Number of identical slices (1-{SLICES_MAX})."
    )
    elastic: Elastic | None = Field(
        default=None,
        description=(
            "Elastic slice count: when a slice is lost and its replacement is not Ready within "
            "waitSeconds, restart on fewer slices (never fewer than minSlices) instead of "
            "waiting. Unset: the job runs on spec.slices or not at all."
        ),
    )
    spares: int = Field(
        default=0,
        ge=0,
        le=SPARES_MAX,
        description=(
            "Hot spare slices (Managed mode): extra node pools of the same shape, created "
            "with the job's and kept provisioned for it but not used by its JobSet, so that a "
            "lost slice is replaced by a Ready pool instead of a new one. Spares cost as much as "
            "running slices (their chips are billed while idle: `multislice-operator plan` shows "
            f"them apart). spec.slices + spec.spares is at most {SLICES_MAX}. With mode "
            "DynamicSlicing spares count 4x4x4 cubes kept free: a lost cube's slice is re-formed "
            "from a spare cube."
        ),
    )
    capacity: Capacity = Field(default_factory=Capacity)
    provisioning: Provisioning = Field(default_factory=Provisioning)
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    training: Training = Field(default_factory=Training)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    maintenance: Maintenance = Field(default_factory=Maintenance)
    preflight: Preflight | None = Field(
        default=None,
        description=(
            "Compile the program for the job's TPUs before any node pool exists: the job's image "
            "runs the compile command as a CPU Job (no TPU), and a program that does not fit or "
            "does not compile fails the job at once, holding no TPU. Unset: no preflight."
        ),
    )
    suspend: bool = Field(
        default=False,
        description=(
            "Suspend the job: its pods are deleted and, in Managed mode, its node pools released; "
            "resuming re-provisions and resumes from the last checkpoint."
        ),
    )
    managed_by: Literal["kueue.x-k8s.io/multikueue"] | None = Field(
        default=None,
        description=(
            "Which controller runs the job. Unset: this cluster's operator. "
            "kueue.x-k8s.io/multikueue: the job is on a MultiKueue manager cluster; it names a "
            "queue (label kueue.x-k8s.io/queue-name), the operator here only makes its Workload, "
            "and Kueue's MultiKueue dispatches it to a worker cluster whose operator runs it; its "
            "status is the worker's (docs/kueue.md#several-clusters-multikueue). Immutable."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the MultisliceJob this many seconds after it succeeds or fails.",
    )
    template: dict[str, Any] = Field(
        description=(
            "Pod template (metadata and spec) run on every host of every slice. The first "
            "container is the TPU container: the operator adds the TPU resource, node selector, "
            "toleration and the multislice environment, whose variables no container may set; a "
            "google.com/tpu count or TPU accelerator/topology selector of the template that "
            "differs from the operator's is refused, and so (Managed) is node selection the "
            "job's own node pools can never satisfy. "
            "Pods run with hostNetwork: true and dnsPolicy: ClusterFirstWithHostNet (DCN traffic "
            "over the hosts' NICs, as GKE's Multislice example and xpk do) unless the template "
            "sets hostNetwork itself: hostNetwork: false opts out. The whole template is checked "
            "by the apiserver and the JobSet webhook (a dry run) before any node pool is created."
        ),
        json_schema_extra=podtemplate.schema(),
    )


@dataclass(frozen=True)
class Rule:
    """A cross-field rule, stated once: its CEL expression (enforced by the apiserver at
    admission, on the schema node at `path` under spec) and the same rule in Python (checked by
    the plan, so `validate` and the operator report it together with every other error)."""

    path: tuple[str, ...]  # schema node under spec the CEL rule sits on; () is spec itself
    field: str  # the field the error names, as spec.<...>
    cel: str
    message: str
    holds: Callable[[MultisliceJobSpec], bool]
    # The message from the value (CEL messageExpression, and its Python twin), when it must name
    # what is wrong; `message` is then the apiserver's fallback.
    message_expression: str | None = None
    explain: Callable[[MultisliceJobSpec], str] | None = None


# gs://BUCKET[/PATH] (bucket names as Cloud Storage allows them) or an absolute local path; never
# "..", a control character (a newline splits the env value) or $(VAR), which Kubernetes expands.
GCS_DIR_RE = r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?$"
CHECKPOINT_DIR_MESSAGE = (
    "spec.checkpoint.directory must be gs://BUCKET/PATH or an absolute path of a mounted volume "
    "(/...), without '..' segments, control characters (a newline) or $(VAR) references"
)


def checkpoint_dir_ok(directory: str | None) -> bool:
    if directory is None:
        return True
    scheme_ok = bool(re.match(GCS_DIR_RE, directory)) or directory.startswith("/")
    return (
        scheme_ok
        and "$(" not in directory
        and not re.search(r"[\x00-\x1f\x7f]", directory)
        and not re.search(r"(^|/)\.\.(/|$)", directory)
    )


def _cel_dcn(axis: str) -> str:
    """CEL: spec.parallelism.dcn.<axis> as the plan reads it (unset: 1), on spec."""
    return (
        f"(has(self.parallelism) && has(self.parallelism.dcn) && "
        f"has(self.parallelism.dcn.{axis}) ? self.parallelism.dcn.{axis} : 1)"
    )


# What the slice counts must be multiples of: the DCN axes an elastic shrink keeps.
_CEL_FIXED = "(" + " * ".join(_cel_dcn(a) for a in parallelism.FIXED_DCN_AXES) + ")"
_CEL_MIN = "self.elastic.minSlices"
# CEL, on spec: the job's provisioning.mode as it takes effect (unset: the default).
CEL_MODE = (
    "(has(self.provisioning) && has(self.provisioning.mode) ? self.provisioning.mode : "
    f"'{DEFAULT_MODE}')"
)


def _fixed(s: MultisliceJobSpec) -> tuple[int, dict[str, int]]:
    return parallelism.fixed_dcn(s.parallelism.dcn.model_dump())


def _min_slices(s: MultisliceJobSpec) -> int:
    return s.elastic.min_slices if s.elastic else 0


def _elastic_layout_explain(s: MultisliceJobSpec) -> str:
    fixed, named = _fixed(s)
    axes = " x ".join(f"dcn.{a} {v}" for a, v in named.items())
    axes += f" = {fixed}" if len(named) > 1 else ""
    return (
        f"cannot shrink with spec.elastic: {axes} takes all {s.slices} slices "
        "(dcn.data is 1) and only dcn.data changes with the slice count; lower dcn.fsdp or "
        "dcn.pipeline so that dcn.data is at least 2, or remove spec.elastic"
    )


def _min_slices_explain(s: MultisliceJobSpec) -> str:
    fixed, named = _fixed(s)
    return (
        f"{_min_slices(s)} is not a slice count the job can run at: only dcn.data changes with "
        f"the slice count, and {parallelism.sizes_phrase(named, fixed, s.slices)}; set minSlices "
        "to one of them"
    )


SPEC_RULES: list[Rule] = [
    Rule(
        path=("parallelism", "dcn"),
        field="spec.parallelism.dcn.tensor",
        cel="!has(self.tensor) || self.tensor == 1",
        message="spec.parallelism.dcn.tensor must be 1: DCN bandwidth between slices is far too "
        "low for tensor parallelism; use spec.parallelism.ici.tensor instead",
        holds=lambda s: s.parallelism.dcn.tensor in (None, 1),
    ),
    Rule(
        path=("capacity",),
        field="spec.capacity.reservation",
        cel="!has(self.reservation) || (has(self.type) && self.type == 'Reserved')",
        message="spec.capacity.reservation is only valid with type: Reserved; set type: Reserved "
        "or remove the reservation",
        holds=lambda s: not s.capacity.reservation or s.capacity.type == CapacityType.RESERVED,
    ),
    Rule(
        path=("capacity",),
        field="spec.capacity.reservation",
        cel="!has(self.type) || self.type != 'Reserved' || has(self.reservation)",
        # Without a name GKE consumes any matching reservation and falls back to on-demand
        # capacity: not what "Reserved" promises, so refuse it rather than do it.
        message="spec.capacity.reservation is required with type: Reserved: name the reservation "
        "(RESERVATION, or projects/PROJECT/reservations/RESERVATION for a shared one); without a "
        "name the slices could land on on-demand capacity; use type: OnDemand for that",
        holds=lambda s: s.capacity.type != CapacityType.RESERVED or bool(s.capacity.reservation),
    ),
    Rule(
        path=("capacity",),
        field="spec.capacity.maxRunDurationSeconds",
        cel="!has(self.maxRunDurationSeconds) || (has(self.type) && self.type == 'FlexStart')",
        message="spec.capacity.maxRunDurationSeconds is only valid with type: FlexStart (GKE "
        "bounds the run time of flex-start VMs only); remove it or set type: FlexStart",
        holds=lambda s: (
            s.capacity.max_run_duration_seconds is None
            or s.capacity.type == CapacityType.FLEX_START
        ),
    ),
    Rule(
        path=(),
        field="spec.capacity.type",
        cel="!has(self.capacity) || !has(self.capacity.type) || "
        "self.capacity.type != 'FlexStart' || "
        + " && ".join(f"!self.accelerator.startsWith('{p}-')" for p in NO_FLEX_START),
        message="spec.capacity.type FlexStart is not offered for "
        + ", ".join(f"{p}-N" for p in NO_FLEX_START)
        + " (GKE flex-start supports TPU v5e, v5p, v6e and tpu7x; not v3 or v4): use OnDemand, "
        "Spot or Reserved, or another accelerator",
        holds=lambda s: (
            s.capacity.type != CapacityType.FLEX_START
            or s.accelerator.split("-")[0] not in NO_FLEX_START
        ),
    ),
    Rule(
        path=("failurePolicy",),
        field="spec.failurePolicy.nonRetryableExitCodes",
        cel=f"!has(self.nonRetryableExitCodes) || self.nonRetryableExitCodes.all(c, "
        f"c >= {EXIT_CODE_MIN} && c <= {EXIT_CODE_MAX})",
        message=f"spec.failurePolicy.nonRetryableExitCodes: exit codes must be "
        f"{EXIT_CODE_MIN}-{EXIT_CODE_MAX}",
        holds=lambda s: all(
            EXIT_CODE_MIN <= c <= EXIT_CODE_MAX for c in s.failure_policy.non_retryable_exit_codes
        ),
    ),
    Rule(
        path=("checkpoint",),
        field="spec.checkpoint.directory",
        cel="!has(self.directory) || ((self.directory.matches('" + GCS_DIR_RE + "') || "
        "self.directory.startsWith('/')) && !self.directory.contains('$(') && "
        "!self.directory.matches('[[:cntrl:]]') && "
        "!self.directory.matches('(^|/)[.][.](/|$)'))",
        message=CHECKPOINT_DIR_MESSAGE,
        holds=lambda s: checkpoint_dir_ok(s.checkpoint.directory),
    ),
    # The contract variables are refused at admission by the CEL rule on each env entry of the
    # template (api/podtemplate.py); this is its Python twin, naming every variable at once.
    Rule(
        path=(),
        field="spec.template.spec.containers[].env",
        cel="",
        message=f"sets contract variables: {podtemplate.RESERVED_ENV_MESSAGE}",
        holds=lambda s: not podtemplate.reserved_env(s.template),
        explain=lambda s: (
            f"{', '.join(podtemplate.reserved_env(s.template))} {podtemplate.RESERVED_ENV_MESSAGE}"
        ),
    ),
    Rule(
        path=("failurePolicy",),
        field="spec.failurePolicy.restartExitCodes",
        cel=f"!has(self.restartExitCodes) || self.restartExitCodes.all(c, "
        f"c >= {EXIT_CODE_MIN} && c <= {EXIT_CODE_MAX})",
        message=f"spec.failurePolicy.restartExitCodes: exit codes must be "
        f"{EXIT_CODE_MIN}-{EXIT_CODE_MAX}",
        holds=lambda s: all(
            EXIT_CODE_MIN <= c <= EXIT_CODE_MAX for c in s.failure_policy.restart_exit_codes or []
        ),
    ),
    Rule(
        path=("failurePolicy",),
        field="spec.failurePolicy.nonRetryableExitCodes",
        cel=f"!has(self.nonRetryableExitCodes) || !({EXIT_HANG} in self.nonRetryableExitCodes)",
        message=f"spec.failurePolicy.nonRetryableExitCodes: {EXIT_HANG} is the workload's hang "
        "code, which always restarts all slices (cause hang)",
        holds=lambda s: EXIT_HANG not in s.failure_policy.non_retryable_exit_codes,
    ),
    Rule(
        path=("failurePolicy",),
        field="spec.failurePolicy.restartExitCodes",
        cel="!has(self.restartExitCodes) || "
        "(has(self.exitCodePolicy) && self.exitCodePolicy == 'RestartIfListed')",
        message="spec.failurePolicy.restartExitCodes is only valid with exitCodePolicy: "
        "RestartIfListed (xpk's policy); with RestartUnlessListed list the fatal codes in "
        "nonRetryableExitCodes",
        holds=lambda s: (
            s.failure_policy.restart_exit_codes is None
            or s.failure_policy.exit_code_policy == ExitCodePolicy.RESTART_IF_LISTED
        ),
    ),
    Rule(
        path=("failurePolicy",),
        field="spec.failurePolicy.nonRetryableExitCodes",
        cel="!has(self.nonRetryableExitCodes) || !has(self.exitCodePolicy) || "
        "self.exitCodePolicy == 'RestartUnlessListed'",
        message="spec.failurePolicy.nonRetryableExitCodes is only valid with exitCodePolicy: "
        "RestartUnlessListed; with RestartIfListed every code not in restartExitCodes fails "
        "the job",
        holds=lambda s: (
            "non_retryable_exit_codes" not in s.failure_policy.model_fields_set
            or s.failure_policy.exit_code_policy == ExitCodePolicy.RESTART_UNLESS_LISTED
        ),
    ),
    # Both deadlines judge the same stall from the same clock (status.capacityReadyTime): the
    # startup deadline can only act on unschedulable pods if it comes first.
    Rule(
        path=("failurePolicy",),
        field="spec.failurePolicy.startupTimeoutSeconds",
        cel="!has(self.startupTimeoutSeconds) || self.startupTimeoutSeconds < "
        "(has(self.unschedulableTimeoutSeconds) ? self.unschedulableTimeoutSeconds : 600)",
        message="spec.failurePolicy.startupTimeoutSeconds must be less than "
        "unschedulableTimeoutSeconds (default 600): both count from the moment every slice's "
        "capacity is ready, and past the unschedulable deadline the job has failed already; "
        "lower startupTimeoutSeconds or raise unschedulableTimeoutSeconds",
        holds=lambda s: (
            s.failure_policy.startup_timeout_seconds is None
            or s.failure_policy.startup_timeout_seconds
            < s.failure_policy.unschedulable_timeout_seconds
        ),
    ),
    # Elastic slice count (issue 25): the job shrinks from spec.slices to minSlices, dcn.data
    # taking the change; the rules on spec itself, where spec.slices and the layout are seen.
    Rule(
        path=(),
        field="spec.elastic.minSlices",
        cel=f"!has(self.elastic) || {_CEL_MIN} < self.slices",
        message="spec.elastic.minSlices must be less than spec.slices: the job shrinks from "
        "spec.slices down to minSlices; lower minSlices or remove spec.elastic",
        holds=lambda s: s.elastic is None or s.elastic.min_slices < s.slices,
        explain=lambda s: (
            f"must be less than spec.slices ({s.slices}), got {_min_slices(s)}: the job shrinks "
            "from spec.slices down to minSlices; lower minSlices or remove spec.elastic"
        ),
    ),
    Rule(
        path=(),
        field="spec.parallelism.dcn",
        # P > slices is no layout at all (the plan names spec.parallelism.dcn for it).
        cel=f"!has(self.elastic) || {_CEL_MIN} >= self.slices || {_CEL_FIXED} != self.slices",
        message="spec.parallelism.dcn cannot shrink with spec.elastic: dcn.fsdp x dcn.pipeline "
        "x dcn.tensor takes every slice (dcn.data is 1) and only dcn.data changes with the "
        "slice count; lower dcn.fsdp or dcn.pipeline so that dcn.data is at least 2, or remove "
        "spec.elastic",
        holds=lambda s: (
            s.elastic is None or s.elastic.min_slices >= s.slices or _fixed(s)[0] != s.slices
        ),
        explain=_elastic_layout_explain,
    ),
    Rule(
        path=(),
        field="spec.elastic.minSlices",
        # Skipped where the rules above refuse the spec already (one error each), and where
        # the layout does not divide spec.slices (the plan names spec.parallelism.dcn then).
        cel=f"!has(self.elastic) || {_CEL_MIN} >= self.slices || {_CEL_FIXED} >= self.slices || "
        f"self.slices % {_CEL_FIXED} != 0 || {_CEL_MIN} % {_CEL_FIXED} == 0",
        message="spec.elastic.minSlices must be a slice count the job can run at: only "
        "dcn.data changes with the slice count, so the sizes are the multiples of dcn.fsdp x "
        "dcn.pipeline x dcn.tensor; set minSlices to one of them",
        holds=lambda s: (
            s.elastic is None
            or s.elastic.min_slices >= s.slices
            or _fixed(s)[0] >= s.slices
            or s.slices % _fixed(s)[0] != 0
            or s.elastic.min_slices % _fixed(s)[0] == 0
        ),
        explain=_min_slices_explain,
    ),
    Rule(
        path=(),
        field="spec.spares",
        cel=f"!has(self.spares) || self.slices + self.spares <= {SLICES_MAX}",
        message=f"spec.spares must keep spec.slices + spec.spares at most {SLICES_MAX}; lower "
        "spares",
        holds=lambda s: s.slices + s.spares <= SLICES_MAX,
        explain=lambda s: (
            f"must keep spec.slices + spec.spares at most {SLICES_MAX}, got {s.slices} + "
            f"{s.spares} = {s.slices + s.spares}; lower spares"
        ),
    ),
]


@dataclass(frozen=True)
class _Feature:
    """A spec feature a capacity model may accept (registry.Feature): the field it shows in,
    when the spec uses it (CEL on spec and Python), and what to do without it."""

    field: str
    cel: str
    used: Callable[[MultisliceJobSpec], bool]
    what: str
    remedy: str


FEATURES: dict[str, _Feature] = {
    "spares": _Feature(
        "spec.spares",
        "has(self.spares) && self.spares > 0",
        lambda s: s.spares > 0,
        "the operator keeps the spares itself",
        "set spares: 0 (provision spare pools yourself)",
    ),
    "elastic": _Feature(
        "spec.elastic",
        "has(self.elastic)",
        lambda s: s.elastic is not None,
        "the operator shrinks the job when a pool it replaces does not come back in time",
        "remove spec.elastic",
    ),
    "flexStart": _Feature(
        "spec.capacity.type",
        f"has(self.capacity) && has(self.capacity.type) && "
        f"self.capacity.type == '{CapacityType.FLEX_START.value}'",
        lambda s: s.capacity.type == CapacityType.FLEX_START,
        "the capacity waits for flex-start VMs",
        "use another capacity.type",
    ),
}


def _feature_rule(name: str, accepting: dict[str, str]) -> Rule:
    """The allow-list of one feature: the modes whose capacity models accept it."""
    feature = FEATURES[name]
    modes = ", ".join(f"'{m}'" for m in accepting)
    which = word_list((f"{m} ({phrase})" if phrase else m for m, phrase in accepting.items()),
                      "or") if accepting else "none"  # fmt: skip
    message = (
        f"{feature.field} needs provisioning.mode: {which}: {feature.what}; with another mode "
        f"{feature.remedy}"
    )
    return Rule(
        path=(),
        field=feature.field,
        cel=f"!({feature.cel}) || {CEL_MODE} in [{modes}]",
        message=message,
        holds=lambda s: not feature.used(s) or s.provisioning.mode in accepting,
        explain=lambda s: (
            f"provisioning.mode {s.provisioning.mode} does not accept it (its capacity model "
            f"refuses it): {message.removeprefix(feature.field + ' ')}"
        ),
    )


def spec_rules() -> list[Rule]:
    """Every cross-field rule: the API's own, then, from the registered capacity models, which
    modes accept each feature and each model's own rules (registry.py)."""
    plugins = REGISTRY.models().values()
    features = [
        _feature_rule(name, {p.mode: p.accepts[name] for p in plugins if name in p.accepts})
        for name in FEATURES
    ]
    return [*SPEC_RULES, *features, *(r for p in plugins for r in p.rules)]


class Phase(StrEnum):
    PENDING = "Pending"
    QUEUED = "Queued"
    PROVISIONING = "Provisioning"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


TERMINAL_PHASES = (Phase.SUCCEEDED.value, Phase.FAILED.value)


class ConditionType(StrEnum):
    VALIDATED = "Validated"
    PROVISIONED = "Provisioned"
    SLICES_READY = "SlicesReady"
    DCN_BOUND = "DCNBound"
    COMPLETED = "Completed"
    FAILED = "Failed"
    ADMITTED = "Admitted"  # Kueue admitted the job (only for jobs that name a queue)
    MAINTENANCE_SCHEDULED = "MaintenanceScheduled"  # GKE or a node announced maintenance on it
    DEGRADED = "Degraded"  # spec.elastic: running on fewer slices than spec.slices
    # Its JobSet restarts the program's failures in place, or recreates them (and why).
    RESTART_IN_PLACE = "RestartInPlace"


class SlicePhase(StrEnum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    RUNNING = "Running"
    REPAIRING = "Repairing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    RELEASING = "Releasing"


class Condition(_Model):
    """A Kubernetes-style condition."""

    type: str = Field(
        description="Validated, Provisioned, SlicesReady, DCNBound, Completed, Failed, Admitted "
        "(Kueue; only for jobs that name a queue), MaintenanceScheduled (only once GKE or "
        "the node announced maintenance on a node of the job) or RestartInPlace (once its JobSet "
        "exists: whether the program's failures restart in place, and why not)."
    )
    status: str = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="Why, in one CamelCase word.")
    message: str = Field(default="", description="What happened and what to do, for people.")
    last_transition_time: datetime | None = Field(
        default=None, description="When the status last changed."
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation this condition describes."
    )


class SliceStatus(_Model):
    """The state of one slice."""

    index: int = Field(description="Slice index, as MEGASCALE_SLICE_ID.")
    node_pool: str | None = Field(default=None, description="The slice's GKE node pool.")
    hosts: int = Field(description="Hosts (Kubernetes nodes) the slice needs.")
    ready_hosts: int = Field(default=0, description="Hosts whose nodes are Ready.")
    phase: SlicePhase = Field(
        default=SlicePhase.PENDING,
        description="Pending, Provisioning, Ready, Running, Repairing, Succeeded, Failed or "
        "Releasing.",
    )
    message: str | None = Field(default=None, description="The slice's last cloud error.")
    seen_ready: bool = Field(
        default=False,
        description="Every host of this slice has been Ready since its node pool was created: "
        "losing them now is a slice loss, not nodes still registering.",
    )
    lost_time: datetime | None = Field(
        default=None,
        description="When this slice was seen to lose its capacity; cleared once it is ready "
        "again.",
    )
    not_ready_time: datetime | None = Field(
        default=None,
        description="When this slice, once ready, was first seen with fewer Ready hosts than it "
        "needs while its nodes are still there (a blip until the node NotReady grace period "
        "passes); cleared once it is ready again.",
    )


class PodFailureStatus(_Model):
    """A pod failure the operator saw (the pod itself is deleted by the restart)."""

    pod: str = Field(description="The failed pod.")
    slice: int | None = Field(default=None, description="Its slice index.")
    exit_code: int | None = Field(default=None, description="The TPU container's exit code.")
    reason: str = Field(default="", description="The container's or pod's reason.")
    restart_attempt: int | None = Field(
        default=None,
        description="The JobSet restart attempt the pod belonged to (0 before the first restart).",
    )
    step: int | None = Field(
        default=None,
        description="The last training step the workload completed, from its termination message.",
    )
    checkpoint_step: int | None = Field(
        default=None,
        description="The step of the workload's last durable checkpoint, from its termination "
        "message.",
    )
    cause: str | None = Field(
        default=None,
        description="What the failure is counted as: disruption (the pod's DisruptionTarget "
        "condition), hang (exit code 75 or a hang termination message) or workload.",
    )
    disruption: str | None = Field(
        default=None,
        description="The reason of the pod's DisruptionTarget condition (e.g. "
        "TerminationByKubelet, PreemptionByScheduler, EvictionByEvictionAPI, DeletionByPodGC).",
    )


class GoodputState(StrEnum):
    """Where a job's time goes: every second since creation is in exactly one of these (or the
    clock has stopped: the job finished)."""

    QUEUED = "queued"
    PROVISIONING = "provisioning"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    REPAIRING = "repairing"
    SUSPENDED = "suspended"


class StateSeconds(_Model):
    """A total per accounting state (seconds, or chip-seconds)."""

    queued: int = Field(
        default=0, ge=0, description="Waiting for capacity or admission (phases Pending, Queued)."
    )
    provisioning: int = Field(
        default=0, ge=0, description="Creating node pools, rollbacks and backoff included."
    )
    starting: int = Field(default=0, ge=0, description="Capacity ready, slices not all running.")
    running: int = Field(default=0, ge=0, description="Every slice running: the goodput.")
    restarting: int = Field(default=0, ge=0, description="Restarting all slices after a failure.")
    repairing: int = Field(
        default=0, ge=0, description="Replacing the node pool of a slice that lost its capacity."
    )
    suspended: int = Field(default=0, ge=0, description="spec.suspend set.")

    def get(self, state: GoodputState | str) -> int:
        value: int = getattr(self, GoodputState(state).value)
        return value

    def add(self, state: GoodputState | str, amount: int) -> None:
        name = GoodputState(state).value
        setattr(self, name, getattr(self, name) + max(0, amount))

    def total(self) -> int:
        return sum(self.get(s) for s in GoodputState)


class GoodputSegment(_Model):
    """One entry of the timeline: the job entered `state` at `since`."""

    state: GoodputState = Field(description="The accounting state entered.")
    since: datetime = Field(description="When.")


GOODPUT_TIMELINE_MAX = 32


class GoodputStatus(_Model):
    """Where every second and every chip-second of the job went, since its creation.

    Totals cover the closed states only, up to `since`; the current state has run from `since`
    to now (the CLI and the metrics add it). Written only when the state or the chips held change,
    so an idle job costs no status write."""

    state: GoodputState | None = Field(
        default=None,
        description="The current accounting state; unset once the job finished (the clock "
        "stopped).",
    )
    since: datetime | None = Field(
        default=None,
        description="When the current state began; every total below is as of this time.",
    )
    held_chips: int = Field(
        default=0,
        ge=0,
        description="TPU chips held since `since` and charged to `state`: chips of the node "
        "pools that exist (Managed; DynamicSlicing with Managed cubes: the cube pools) but the "
        "spares' (`spareChips`), of every slice while the JobSet runs on existing pools "
        "(Existing), or of the cubes the job's Slices hold (DynamicSlicing, Existing cubes).",
    )
    spare_chips: int = Field(
        default=0,
        ge=0,
        description="Of `heldChips`, the chips of the pools held beyond spec.slices (hot "
        "spares, spec.spares; spare cubes with DynamicSlicing), counted in `spareChipSeconds` "
        "and in no state.",
    )
    seconds: StateSeconds = Field(
        default_factory=StateSeconds, description="Wall-clock seconds spent in each state."
    )
    chip_seconds: StateSeconds = Field(
        default_factory=StateSeconds,
        description="Chip-seconds held in each state; `running` is the productive part.",
    )
    spare_chip_seconds: int = Field(
        default=0,
        ge=0,
        description="Chip-seconds of hot spare pools or cubes (spec.spares): held and paid for, "
        "idle. "
        "Part of held chip-seconds, so chipGoodput shows their cost.",
    )
    admitted_time: datetime | None = Field(
        default=None, description="When the job first left `queued`."
    )
    chip_goodput: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Running chip-seconds / held chip-seconds (spares' included), as of `since`.",
    )
    wall_goodput: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Running seconds / seconds since admission, as of `since`.",
    )
    degraded: bool = Field(
        default=False,
        description="Since `since` the job runs on fewer slices than spec.slices (spec.elastic) "
        "or on degraded capacity (DynamicSlicing: an ACTIVE_DEGRADED Slice it keeps running on).",
    )
    degraded_chip_seconds: int = Field(
        default=0,
        ge=0,
        description="Of `chipSeconds.running`, the chip-seconds run on fewer slices than "
        "spec.slices (spec.elastic) or on degraded capacity (an ACTIVE_DEGRADED Slice), as of "
        "`since`.",
    )
    lost_steps: int = Field(
        default=0,
        ge=0,
        description="Training steps thrown away by restarts (last step - last checkpoint step, "
        "from the workload's termination messages), over the restarts where it is known.",
    )
    timeline: list[GoodputSegment] = Field(
        default_factory=list,
        max_length=GOODPUT_TIMELINE_MAX,
        description=f"The last {GOODPUT_TIMELINE_MAX} state changes, oldest first.",
    )


def _strategies_schema(schema: dict[str, Any]) -> None:
    """status.lastRestart.strategy: the registered restart strategies (registry.py), each with
    what it does; a plugin's strategy is in the CRD's enum once it is loaded."""
    found = REGISTRY.strategies().values()
    schema["enum"] = [s.name for s in found]
    each = word_list((f"{s.name} ({s.description})" for s in found), "or")
    schema["description"] = (
        f"How the slices restarted: {each}; unset in a status written before it was recorded."
    )


class RestartStatus(_Model):
    """The most recent restart of all slices: why, what it cost, how long it took."""

    restart: int = Field(description="Which restart (status.restarts once it happened).")
    cause: str = Field(
        default="workload",
        description=f"Why: {word_list(RestartCause, 'or')} (as in restartsByCause).",
    )
    time: datetime | None = Field(
        default=None, description="When the slices stopped running (the failure, as observed)."
    )
    lost_steps: int | None = Field(
        default=None,
        ge=0,
        description="Steps lost: the failed workload's last step - its last checkpoint step; "
        "unset when no termination message said.",
    )
    recovery_seconds: int | None = Field(
        default=None,
        ge=0,
        description="From `time` to every slice running again; unset until then.",
    )
    strategy: str | None = Field(
        default=None,
        description="How the slices restarted: a registered restart strategy's name.",
        json_schema_extra=_strategies_schema,
    )


class RestartsByCause(_Model):
    """status.restarts split by cause (a field per RestartCause): they add up to it."""

    disruption: int = Field(default=0, ge=0, description=_restarts_of(RestartCause.DISRUPTION))
    workload: int = Field(default=0, ge=0, description=_restarts_of(RestartCause.WORKLOAD))
    hang: int = Field(default=0, ge=0, description=_restarts_of(RestartCause.HANG))
    startup: int = Field(default=0, ge=0, description=_restarts_of(RestartCause.STARTUP))
    resize: int = Field(default=0, ge=0, description=_restarts_of(RestartCause.RESIZE))

    def get(self, cause: RestartCause | str) -> int:
        value: int = getattr(self, RestartCause(cause).value)
        return value

    def add(self, cause: RestartCause | str, n: int = 1) -> None:
        name = RestartCause(cause).value
        setattr(self, name, getattr(self, name) + max(0, n))

    def program(self) -> int:
        """Charged to maxRestarts."""
        return sum(self.get(c) for c in PROGRAM_CAUSES)

    def not_program(self) -> int:
        """Charged to maxDisruptionRestarts."""
        return sum(self.get(c) for c in DISRUPTION_CAUSES)

    def total(self) -> int:
        return sum(self.get(c) for c in RestartCause)


class MaintenanceStatus(_Model):
    """Host maintenance announced on the job's nodes (labels, conditions, as last seen)."""

    time: datetime | None = Field(
        default=None,
        description="The earliest scheduled start (label "
        "cloud.google.com/scheduled-maintenance-time) over the job's nodes; for a node whose "
        "condition MaintenancePlanned or MaintenanceInProgress is True (no start given: due at "
        "once), when it turned True.",
    )
    latest_time: datetime | None = Field(
        default=None,
        description="The latest time GKE may move a window start to (label "
        "cloud.google.com/scheduled-maintenance-time-latest), over the job's nodes.",
    )
    slices: list[int] = Field(
        default_factory=list, description="The slices with a node under maintenance."
    )
    nodes: int = Field(default=0, ge=0, description="How many of the job's nodes.")
    active: bool = Field(
        default=False,
        description="Maintenance runs now on one of them (label "
        "cloud.google.com/active-node-maintenance, the impending-node-termination taint, or "
        "condition MaintenanceInProgress True).",
    )


class CheckpointStatus(_Model):
    """The last checkpoint requested from the workload (annotation
    multislice.dev/checkpoint-request on every pod) and the step it saved."""

    request_id: str | None = Field(
        default=None, description="The request's id, as put on the pods."
    )
    source: str = Field(
        default="user",
        description="user (the job's multislice.dev/checkpoint-request annotation), "
        "maintenance (spec.maintenance.checkpointAheadSeconds before GKE's maintenance), "
        "flex-start (as long before a flex-start pool's VMs reach their maximum run duration) or "
        "elastic (before the job grows back to more slices).",
    )
    request_time: datetime | None = Field(default=None, description="When it was requested.")
    restart_attempt: int = Field(
        default=0,
        description="The attempt (status.restarts) whose pods carry it; a restart ends it.",
    )
    pods_annotated: int = Field(
        default=0, ge=0, description="Pods of that attempt carrying the request, as last seen."
    )
    saved_step: int | None = Field(
        default=None,
        description="The step the workload saved for this request (its pod's "
        "multislice.dev/checkpoint-saved annotation or its termination message).",
    )
    saved_time: datetime | None = Field(default=None, description="When that was seen.")
    user_request: str | None = Field(
        default=None,
        description="The job's multislice.dev/checkpoint-request annotation as last handled "
        "(a new value is a new request).",
    )
    maintenance_request: str | None = Field(
        default=None, description="The last request made for a maintenance window."
    )
    flex_start_request: str | None = Field(
        default=None,
        description="The last request made ahead of flex-start capacity's maximum run duration.",
    )
    elastic_request: str | None = Field(
        default=None,
        description="The last request made before an elastic job grows back (spec.elastic).",
    )


class StartupStatus(_Model):
    """failurePolicy.startupTimeoutSeconds: the (re)start being timed."""

    attempt: int = Field(description="The attempt (status.restarts) being timed.")
    since: datetime | None = Field(
        default=None,
        description="When this attempt was first seen, or when the operator last acted on it; "
        "the deadline counts from this or status.capacityReadyTime, whichever is later.",
    )
    evicted: bool = Field(
        default=False,
        description="The deadline passed and the operator evicted the slow pods to restart "
        "all slices: the restart that follows has cause startup.",
    )
    repaired: list[int] = Field(
        default_factory=list,
        description="Node pools (by their index in status.slices) replaced in this attempt "
        "because the job's pods could not schedule on them.",
    )


class SchedulingStatus(_Model):
    """Pods waiting for a node: the clocks no action of the operator's own resets (a startup
    deadline's pool replacement or restart), so a job whose pods are never bound fails."""

    waiting_since: datetime | None = Field(
        default=None,
        description="When a pod of the job was first seen waiting for a node (unschedulable, or "
        "not looked at by any scheduler) while every slice's capacity was ready; kept through "
        "pool replacements and restarts until every pod of an attempt was scheduled: "
        "spec.failurePolicy.unschedulableTimeoutSeconds counts from it.",
    )
    unseen_since: datetime | None = Field(
        default=None,
        description="When the first pod of the job was created that no scheduler has looked at "
        "(no PodScheduled condition), while none has looked at any of its pods since: past "
        "--scheduler-grace-seconds the job fails (SchedulerNotRunning).",
    )
    pods_missing_since: datetime | None = Field(
        default=None,
        description="After the job ran (a restart since, or it was Running): when a slice was "
        "first seen without any pod of the current attempt while every slice's capacity was "
        "ready and JobSet did not count every slice's Job ready or done, kept until every slice "
        "has one: spec.failurePolicy.unschedulableTimeoutSeconds "
        "counts from it (PodsNotCreated). A drained node's slice or a restart's new pods are "
        "gone a moment; a job that ran an hour is not failed for that moment.",
    )


class EvictionStatus(_Model):
    """The last time Kueue took the job's quota back (preemption, reclaim, a Retry check)."""

    reason: str = Field(description="Kueue's eviction reason, e.g. Preempted or AdmissionCheck.")
    message: str = Field(default="", description="Kueue's message.")
    preempted_by: str | None = Field(
        default=None,
        description="namespace/name of the job whose Workload preempted this one, when Kueue "
        "names it.",
    )
    time: datetime | None = Field(default=None, description="When Kueue evicted the Workload.")


class QueueStatus(_Model):
    """Where a job that names a Kueue queue (label kueue.x-k8s.io/queue-name) waits, and why."""

    local_queue: str = Field(description="The LocalQueue named by the job's label.")
    cluster_queue: str | None = Field(
        default=None, description="The ClusterQueue behind it (the LocalQueue's spec)."
    )
    workload: str | None = Field(default=None, description="The job's Kueue Workload.")
    workload_replaced_time: datetime | None = Field(
        default=None,
        description="When the job's Workload was last deleted to be made again for other quota "
        "(provisioning.mode Fallback moved to another option): the wait for Kueue to see the new "
        "one counts from then, not from the job's start.",
    )
    cluster: str | None = Field(
        default=None,
        description="On a job MultiKueue dispatched (label kueue.x-k8s.io/multikueue-origin): the "
        "GKE cluster that runs it, projects/P/locations/L/clusters/C (the manager's copy shows "
        "the worker's status, this included).",
    )
    admission_check: str | None = Field(
        default=None,
        description="The Workload's AdmissionCheck run by this operator (controllerName "
        "multislice.dev/gang-provisioning); unset: its ClusterQueue lists none (quota only).",
    )
    check_state: str | None = Field(
        default=None, description="That check's state: Pending, Ready, Retry or Rejected."
    )
    retry_count: int | None = Field(
        default=None, description="Kueue's count of Retry states of that check."
    )
    pending_workloads: int | None = Field(
        default=None,
        description="Workloads pending in the LocalQueue (Kueue's count). A position in the "
        "queue is only served by Kueue's visibility API, which the operator does not query.",
    )
    message: str | None = Field(
        default=None,
        description="Why the job waits in the queue (Kueue's word where it gave one); unset once "
        "it no longer waits (its gang provisioned, admitted, or ended).",
    )
    preemptions: int = Field(
        default=0, description="Times Kueue preempted the job after it held quota."
    )
    suspended: bool = Field(
        default=False,
        description="spec.suspend deactivated the Workload (spec.active: false); it is activated "
        "again when the job resumes.",
    )
    last_eviction: EvictionStatus | None = Field(default=None)


class PreflightState(StrEnum):
    RUNNING = "Running"
    PASSED = "Passed"
    FAILED = "Failed"


class PreflightStatus(_Model):
    """The compile before the first node pool (spec.preflight)."""

    state: PreflightState = Field(description="Running, Passed or Failed.")
    job: str = Field(description="The compile Job (batch/v1), deleted once it finished.")
    generation: int = Field(default=0, description="The spec generation it compiled.")
    hbm_bytes_per_device: int | None = Field(
        default=None,
        ge=0,
        description="The compiled program's peak HBM per TPU device (with its code), as the "
        "TPU compiler counts it.",
    )
    hbm_capacity_bytes: int | None = Field(
        default=None,
        ge=0,
        description="HBM the TPU compiler lets one device of the job's generation use (its "
        "HBM less what libtpu reserves).",
    )
    step_time_seconds: float | None = Field(
        default=None, ge=0, description="The compiler's estimated step time (roofline)."
    )
    message: str | None = Field(default=None, description="The compile command's last words.")
    time: datetime | None = Field(default=None, description="When it finished.")
    shape: str | None = Field(
        default=None,
        description="provisioning.mode Fallback: the shape it compiled (a shapes[].name; empty: "
        "the job's own).",
    )


class FallbackLeave(StrEnum):
    """Why an option of provisioning.fallback was left."""

    STOCKOUT = "Stockout"  # the zone had not the VMs (GCE_STOCKOUT)
    QUOTA = "Quota"  # the project's quota (GCE_QUOTA_EXCEEDED, the synchronous 403)
    RESERVATION = "ReservationExhausted"  # the named reservation has not the VMs free
    TIMEOUT = "Timeout"  # trySeconds ran out (provisioning, flex-start capacity, Kueue quota)
    REFUSED = "DidNotCompile"  # the preflight compile refused its shape
    FAILED = "Failed"  # another error of the gang that may pass (a pool in ERROR, ...)


class FallbackOptionStatus(_Model):
    """One option of provisioning.fallback, as tried so far."""

    option: int = Field(ge=0, description="Its index in provisioning.fallback.options.")
    what: str = Field(description="Its capacity, zone and shape, in words.")
    attempts: int = Field(default=0, ge=0, description="Times it was tried.")
    waited_seconds: int = Field(
        default=0,
        ge=0,
        description="Seconds spent trying it (provisioning, waiting for capacity or quota), over "
        "every attempt that ended.",
    )
    last_left: FallbackLeave | None = Field(default=None, description="Why it was last left.")
    message: str | None = Field(default=None, description="What the cloud or compiler said.")


class FallbackShapeStatus(_Model):
    """One shape as the preflight compile judged it (spec.preflight)."""

    name: str = Field(description="shapes[].name; empty: the job's own shape.")
    what: str = Field(description="Accelerator and slices, e.g. v6e-16 x 2.")
    fits: bool = Field(description="The compiler accepted the program for it.")
    generation: int = Field(default=0, description="The spec generation it compiled.")
    hbm_bytes_per_device: int | None = Field(default=None, ge=0)
    hbm_capacity_bytes: int | None = Field(default=None, ge=0)
    message: str | None = Field(default=None, description="The compiler's words when refused.")


class FallbackStatus(_Model):
    """provisioning.mode Fallback: which option and shape are tried, why the last was left."""

    option: int = Field(default=0, ge=0, description="The option tried now (its index).")
    shape: str = Field(
        default="",
        description="The shape it runs the job as (a shapes[].name; empty: the job's own).",
    )
    round: int = Field(default=1, ge=1, description="Passes over the options, this one included.")
    since: datetime | None = Field(
        default=None, description="When the option tried now began (its trySeconds count from it)."
    )
    leaving: FallbackLeave | None = Field(
        default=None,
        description="Set while the option is rolled back: its capacity is released, then the "
        "next option is tried.",
    )
    leaving_message: str | None = Field(default=None, description="Why, in the cloud's words.")
    last_left: FallbackLeave | None = Field(
        default=None, description="Why the option tried before this one was left."
    )
    last_left_option: int | None = Field(
        default=None, ge=0, description="The option tried before this one (its index)."
    )
    ready: bool = Field(default=False, description="The option's gang is up: the job runs on it.")
    options: list[FallbackOptionStatus] = Field(default_factory=list)
    shapes: list[FallbackShapeStatus] = Field(default_factory=list)

    def option_status(self, index: int) -> FallbackOptionStatus | None:
        return next((o for o in self.options if o.option == index), None)

    def shape_status(self, name: str) -> FallbackShapeStatus | None:
        return next((s for s in self.shapes if s.name == name), None)


class MultisliceJobStatus(_Model):
    """Observed state, written by the operator only: what it observes, and what it must remember."""

    phase: Phase | None = Field(
        default=None,
        description="Pending, Queued (waiting in Kueue), Provisioning, Starting, Running, "
        "Restarting, Succeeded, Failed or Suspended.",
    )
    message: str | None = Field(default=None, description="One line on what happens now.")
    observed_generation: int | None = Field(
        default=None, description="The spec generation this status describes."
    )
    slices: list[SliceStatus] = Field(default_factory=list)
    restarts: int = Field(default=0, description="Times all slices were restarted.")
    restarts_by_cause: RestartsByCause | None = Field(
        default=None,
        description=f"status.restarts by cause: {word_list(RestartCause)}.",
    )
    conditions: list[Condition] = Field(default_factory=list)
    job_set: str | None = Field(default=None, description="Name of the JobSet that runs the job.")
    start_time: datetime | None = Field(default=None, description="When the job became active.")
    completion_time: datetime | None = Field(
        default=None, description="When the job succeeded or failed."
    )
    total_chips: int | None = Field(default=None, description="Chips over all slices.")
    active_slices: int | None = Field(
        default=None,
        description="The slices the job's JobSet runs on now: spec.slices, or fewer while an "
        "elastic job (spec.elastic) is degraded; unset without a JobSet.",
    )
    ready_slices: str | None = Field(default=None, description="Ready slices, as 'ready/total'.")
    provisioning_attempts: int | None = Field(
        default=None, description="Gang provisioning attempts so far (Managed mode)."
    )
    next_attempt_time: datetime | None = Field(
        default=None, description="When the next gang provisioning attempt starts (backoff)."
    )
    last_failure: PodFailureStatus | None = Field(
        default=None, description="The most recent pod failure seen: pod, slice, exit code, reason."
    )
    attempt_start_time: datetime | None = Field(
        default=None, description="When the current gang provisioning attempt started."
    )
    running_time: datetime | None = Field(
        default=None, description="When every slice was first seen running."
    )
    capacity_ready_time: datetime | None = Field(
        default=None,
        description="Since when every slice's capacity has been ready without a break while the "
        "job's JobSet may run: the one clock both spec.failurePolicy.unschedulableTimeoutSeconds "
        "and startupTimeoutSeconds count from.",
    )
    goodput: GoodputStatus | None = Field(
        default=None,
        description="Where the job's time and chips went, by state, since its creation.",
    )
    last_restart: RestartStatus | None = Field(
        default=None, description="The most recent restart: cause, steps lost, recovery time."
    )
    queue: QueueStatus | None = Field(
        default=None, description="Kueue: only for jobs with the kueue.x-k8s.io/queue-name label."
    )
    maintenance: MaintenanceStatus | None = Field(
        default=None,
        description="Host maintenance GKE or the nodes announced on the job's nodes; unset "
        "when none.",
    )
    checkpoint: CheckpointStatus | None = Field(
        default=None, description="The last checkpoint requested on demand and the step saved."
    )
    preflight: PreflightStatus | None = Field(
        default=None, description="The compile before the first node pool (spec.preflight)."
    )
    startup: StartupStatus | None = Field(
        default=None,
        description="The start being timed against failurePolicy.startupTimeoutSeconds; unset "
        "once every pod runs.",
    )
    fallback: FallbackStatus | None = Field(
        default=None,
        description="provisioning.mode Fallback: the option and shape tried now, why the last was "
        "left, and how long each option was tried.",
    )
    scheduling: SchedulingStatus | None = Field(
        default=None,
        description="Since when the job's pods wait for a node, kept once the startup deadline "
        "acted on them (its pool replacement or restart would reset it); unset once every pod of "
        "an attempt was scheduled.",
    )
    capacity: dict[str, Any] | None = Field(
        default=None,
        description="What the job's capacity model (spec.provisioning.mode) says of its capacity, "
        "in its own words (each model's section of docs/api.md says what); unset when it says "
        "nothing.",
    )

    def condition(self, ctype: ConditionType | str) -> Condition | None:
        return next((c for c in self.conditions if c.type == ctype), None)

    def slice(self, index: int) -> SliceStatus | None:
        return next((s for s in self.slices if s.index == index), None)

    def to_dict(self) -> dict[str, Any]:
        """As the apiserver stores it: camelCase, no nulls."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> MultisliceJobStatus:
        """Read a stored status leniently: a field written by another version (or by hand) that
        does not parse is dropped, never a crash."""
        if not data:
            return cls()
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            kept = {k: v for k, v in data.items() if k not in bad}
            try:
                return cls.model_validate(kept)
            except ValidationError:
                return cls()


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = ""
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class MultisliceJob(BaseModel):
    """The whole object as read from YAML or the apiserver."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    api_version: str = Field(default=API_VERSION, alias="apiVersion")
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MultisliceJobSpec
    status: MultisliceJobStatus | None = None
