"""Plan = f(spec): slices, hosts, topology, machine type, node pools, parallelism, DCN advice,
the sizes an elastic job can run at (each with its layout and advice), the hot spares' pools.

Pure and deterministic. Every semantic check that needs the catalog happens here, and every problem
is reported with its field path (all of them at once, not the first only).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from multislice_operator.api import kubeschema, podtemplate
from multislice_operator.api.models import (
    API_VERSION,
    KIND,
    CapacityType,
    DynamicSlicing,
    MultisliceJob,
    MultisliceJobSpec,
    MultisliceJobStatus,
    spec_rules,
)
from multislice_operator.common import keys
from multislice_operator.common.errors import (
    FieldError,
    SpecError,
)
from multislice_operator.common.names import (
    DNS1035_RE,
    DNS_LABEL_MAX,
    longest_pod_name,
    max_name_length,
)
from multislice_operator.common.records import as_camel
from multislice_operator.planning import advisor, cubes, hostports, placement
from multislice_operator.registry import REGISTRY
from multislice_operator.tpu import catalog, parallelism
from multislice_operator.tpu.parallelism import Parallelism

# Labels and annotations the operator owns.


NODE_POOL_NAME_MAX = 40
# Kubernetes' default terminationGracePeriodSeconds, for a template that sets none.
DEFAULT_POD_GRACE_SECONDS = 30
SELECTOR_PATH = "spec.template.spec.nodeSelector."


@dataclass(frozen=True)
class NodePoolSpec:
    """One slice's GKE node pool, as the provisioner will ask for it."""

    name: str
    slice_index: int
    node_count: int
    machine_type: str
    topology: str
    tpu_topology: str | None  # multi-host slices only: with COMPACT, or with a workload policy
    gke_accelerator: str
    spot: bool
    reservation: str | None  # None: no reservation; else a name or projects/P/reservations/R
    node_labels: dict[str, str]
    # The Compute Engine workload policy the pool is placed with (multi-host tpu7x), by name in
    # the pools' region; None: COMPACT placement (or none, single-host).
    workload_policy: str | None = None
    flex_start: bool = False
    max_run_duration_s: int | None = None  # flex-start: GKE removes the VMs after this long
    # A dynamic-slicing cube (one 4x4x4 sub-block): its workload policy provisions the VMs
    # without forming ICI links (PROVISION_ONLY); the Slice forms them later.
    cube: bool = False
    # The zone of the pool when the job names one (provisioning.fallback.options[].zone); None:
    # the operator's node location.
    zone: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return as_camel(self, max_run_duration_s="maxRunDurationSeconds")


@dataclass(frozen=True)
class SizePlan:
    """One slice count the job can run at: its layout (only dcn.data differs between sizes) and
    the DCN advice for it (the same global batch over fewer slices: more tokens per slice)."""

    slices: int
    parallelism: Parallelism
    advice: advisor.DcnAdvice
    chips: int  # the chips of the slices the job runs on at this size

    def as_dict(self) -> dict[str, Any]:
        return {
            "slices": self.slices,
            "totalChips": self.chips,
            "parallelism": self.parallelism.as_dict(),
            "dcn": self.advice.as_dict(),
        }


@dataclass(frozen=True)
class ElasticPlan:
    """spec.elastic as the plan resolved it."""

    min_slices: int
    wait_seconds: int

    def as_dict(self) -> dict[str, Any]:
        return {"minSlices": self.min_slices, "waitSeconds": self.wait_seconds}


@dataclass(frozen=True)
class OptionPlan:
    """One option of provisioning.fallback as planned: what it asks for, for how long."""

    index: int
    capacity: str  # its capacity type
    reservation: str | None
    zone: str | None
    shape: str  # the shape it runs as: a shapes[].name, "" for the job's own
    shape_what: str  # e.g. "v6e-16 x 2"
    mode: str  # the capacity model serving it (Managed, DynamicSlicing, Existing)
    try_seconds: int

    @property
    def what(self) -> str:
        """e.g. "Reserved res-a, v5litepod-16 x 2" or "Spot in us-east5-b, v6e-16 x 2"."""
        kind = f"{self.capacity} {self.reservation}" if self.reservation else self.capacity
        where = f" in {self.zone}" if self.zone else ""
        via = f" ({self.mode})" if self.mode != "Managed" else ""
        return f"{kind}{where}, {self.shape_what}{via}"

    def as_dict(self) -> dict[str, Any]:
        return {**as_camel(self, index="option"), "shape": self.shape or None}


@dataclass(frozen=True)
class FallbackPlan:
    """provisioning.mode Fallback: the options in order and the one this plan is for (the plan's
    shape, capacity and pools are that option's)."""

    option: int
    options: tuple[OptionPlan, ...]

    @property
    def current(self) -> OptionPlan:
        return self.options[self.option]

    def as_dict(self) -> dict[str, Any]:
        return {"option": self.option, "options": [o.as_dict() for o in self.options]}


@dataclass(frozen=True)
class Plan:
    namespace: str
    name: str
    job_key: str
    shape: catalog.SliceShape
    slices: int
    parallelism: parallelism.Parallelism
    advice: advisor.DcnAdvice
    capacity: str
    mode: str
    node_pools: list[NodePoolSpec] = field(default_factory=list)
    # What `validate` and `plan` warn about: the job can run, but probably not as meant.
    warnings: list[FieldError] = field(default_factory=list)
    # The slice counts the job can run at, largest (spec.slices) first; [spec.slices] alone
    # unless spec.elastic is set (filled in from slices, parallelism and advice when empty).
    sizes: list[SizePlan] = field(default_factory=list)
    elastic: ElasticPlan | None = None
    spares: int = 0
    # Managed: the hot spares' node pools, slice indexes slices..slices+spares-1; never part of
    # node_pools (the JobSet's slices).
    spare_pools: list[NodePoolSpec] = field(default_factory=list)
    # The pods' terminationGracePeriodSeconds: how long a stopping pod may keep its node.
    pod_grace_seconds: int = DEFAULT_POD_GRACE_SECONDS
    # DynamicSlicing: the 4x4x4 cubes each slice's GKE Slice is stitched from, and where the
    # cubes come from (Managed: node_pools and spare_pools are the cubes' pools; Existing).
    cubes_per_slice: int = 0
    cubes_source: str | None = None
    # DynamicSlicing: spec.provisioning.dynamicSlicing as the model reads it on every pass
    # (what a degraded Slice is to the job, how long a deleted Slice may take to go).
    dynamic_slicing: DynamicSlicing | None = None
    # A model composed of others (provisioning.mode Fallback): its mode, which decide() asks
    # (capacity.model_of); `mode` is then the model serving this plan (the option's).
    composed: str | None = None
    fallback: FallbackPlan | None = None
    # Node labels the job's pools carry and its pods (and its Kueue Workload) select besides the
    # capacity model's own: the fallback option's capacity type.
    node_selector: dict[str, str] = field(default_factory=dict)
    # The shape the plan is for when the job has several (provisioning.fallback.shapes: a name,
    # "" for the job's own; None: it has one), and how many other shapes it may still move to
    # (not refused by the preflight compile): a refused compile fails it only at none.
    shape_key: str | None = None
    shape_alternatives: int = 0
    # What the job's Kueue Workload asks for when that may change (a Fallback job's option): its
    # Workload carries it and one of another key is replaced; None: the job's one Workload.
    quota_key: str | None = None

    def __post_init__(self) -> None:
        if not self.sizes:
            one = SizePlan(self.slices, self.parallelism, self.advice, self.total_chips)
            object.__setattr__(self, "sizes", [one])

    def parallelism_at(self, slices: int) -> Parallelism:
        """The layout at one of `sizes` (ValueError for a slice count the job cannot run at)."""
        for size in self.sizes:
            if size.slices == slices:
                return size.parallelism
        allowed = ", ".join(str(s.slices) for s in self.sizes)
        raise ValueError(f"{self.namespace}/{self.name} cannot run on {slices} slices: {allowed}")

    def running_on(self, slices: int) -> Plan:
        """The plan as its JobSet runs on another of `sizes` (spec.elastic): the slice count,
        layout and advice the environment contract states. Its pools stay the job's."""
        if slices == self.slices:
            return self
        for size in self.sizes:
            if size.slices == slices:
                return dataclasses.replace(
                    self, slices=slices, parallelism=size.parallelism, advice=size.advice
                )
        self.parallelism_at(slices)  # raises, naming the sizes
        raise AssertionError("unreachable")

    @property
    def total_chips(self) -> int:
        """The chips of the job's slices (spares not counted: see spare_chips)."""
        return self.shape.chips * self.slices

    @property
    def pools(self) -> list[NodePoolSpec]:
        """Every node pool the job holds (Managed): its slices', then its spares'. What is
        provisioned, observed, repaired and released; the JobSet runs on any spec.slices of them."""
        return [*self.node_pools, *self.spare_pools]

    @property
    def pool_chips(self) -> int:
        """The chips of one of the job's node pools: a slice's, or with dynamic slicing a cube's
        (spec.spares counts pools of this size)."""
        cube = self.shape.generation.sub_block_topology
        if self.dynamic and cube is not None:
            return catalog.topology_chips(cube)
        return self.shape.chips

    @property
    def spare_chips(self) -> int:
        """The chips of the hot spares: held and billed, never used by the JobSet (spare cubes
        with dynamic slicing)."""
        return self.pool_chips * self.spares

    @property
    def total_hosts(self) -> int:
        return self.shape.hosts * self.slices

    @property
    def dynamic(self) -> bool:
        """Each slice a GKE `Slice` over cubes (the DynamicSlicing model's plan sets
        cubes_per_slice: plugins/dynamic.py)."""
        return self.cubes_per_slice > 0

    @property
    def cubes_needed(self) -> int:
        """DynamicSlicing: the cubes the job holds, its slices' and its spare cubes."""
        return self.slices * self.cubes_per_slice + self.spares if self.dynamic else 0

    def dynamic_slicing_dict(self) -> dict[str, Any] | None:
        if not self.dynamic:
            return None
        return {
            "cubes": self.cubes_source,
            "cubeTopology": self.shape.generation.sub_block_topology,
            "cubesPerSlice": self.cubes_per_slice,
            "sliceTopology": self.shape.topology,
            "slices": self.slices,
            "spareCubes": self.spares,
            "totalCubes": self.cubes_needed,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "accelerator": self.shape.accelerator,
            "generation": self.shape.generation.name,
            "topology": self.shape.topology,
            "chipsPerSlice": self.shape.chips,
            "tensorCoresPerChip": self.shape.generation.cores_per_chip,
            "tensorCoresPerSlice": self.shape.tensorcores,
            "hostsPerSlice": self.shape.hosts,
            "chipsPerHost": self.shape.chips_per_host,
            "machineType": self.shape.machine_type,
            "gkeAccelerator": self.shape.generation.gke_accelerator,
            "slices": self.slices,
            "totalChips": self.total_chips,
            "totalHosts": self.total_hosts,
            "spares": self.spares,
            "spareChips": self.spare_chips,
            "elastic": self.elastic.as_dict() if self.elastic else None,
            "sizes": [s.as_dict() for s in self.sizes],
            "peakBf16FlopsPerChip": self.shape.generation.peak_bf16_flops,
            "hbmBytesPerChip": self.shape.generation.hbm_bytes,
            "capacity": self.capacity,
            "provisioningMode": self.mode,
            "parallelism": self.parallelism.as_dict(),
            "dcn": self.advice.as_dict(),
            "nodePools": [p.as_dict() for p in self.node_pools],
            "sparePools": [p.as_dict() for p in self.spare_pools],
            "dynamicSlicing": self.dynamic_slicing_dict(),
            "fallback": self.fallback.as_dict() if self.fallback else None,
            "warnings": [{"path": w.path, "message": w.message} for w in self.warnings],
        }


def job_key(namespace: str, name: str) -> str:
    """Short stable id of a job (namespace/name): node label value and node-pool name suffix."""
    return hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:10]


def node_pool_name(namespace: str, name: str, index: int) -> str:
    """Deterministic, unique per job and slice, <= 40 chars, valid GKE name."""
    suffix = f"-{job_key(namespace, name)[:6]}-{index}"
    room = NODE_POOL_NAME_MAX - len("msj-") - len(suffix)
    stem = re.sub(r"[^a-z0-9-]", "-", name.lower())[:room].strip("-") or "job"
    return f"msj-{stem}{suffix}"


WORKLOAD_POLICY_PREFIX = "msj-"


def workload_policy_name(shape: catalog.SliceShape) -> str | None:
    """The workload policy a slice of this shape is placed with, one per generation and topology
    (and region: the policy lives in the pools' region), shared by every job of that shape; None
    when GKE places the slice itself (COMPACT, or a single host). <= 63 characters, RFC 1035."""
    if not shape.workload_policy:
        return None
    return f"{WORKLOAD_POLICY_PREFIX}{shape.generation.prefix}-{shape.topology}"


def load_job(obj: dict[str, Any]) -> MultisliceJob:
    """Parse a MultisliceJob object; pydantic errors become field-path errors."""
    if not isinstance(obj, dict):
        raise SpecError([FieldError("(document)", "expected a YAML mapping (a Kubernetes object)")])
    errors: list[FieldError] = []
    if obj.get("kind", KIND) != KIND:
        errors.append(FieldError("kind", f"expected {KIND}, got {obj.get('kind')!r}"))
    if obj.get("apiVersion", API_VERSION) != API_VERSION:
        errors.append(
            FieldError("apiVersion", f"expected {API_VERSION}, got {obj.get('apiVersion')!r}")
        )
    if "spec" not in obj or obj.get("spec") is None:
        errors.append(FieldError("spec", "required"))
    if errors:
        raise SpecError(errors)
    try:
        return MultisliceJob.model_validate(obj)
    except ValidationError as exc:
        raise SpecError([_field_error(e) for e in exc.errors()]) from None


def _field_error(err: Any) -> FieldError:
    path = ".".join(str(p) for p in err["loc"])
    msg = err["msg"]
    if err["type"] == "value_error":  # a validator's own words, without pydantic's prefix
        msg = msg.removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field; remove it or check its spelling (see kubectl explain multislicejob)"
    elif err["type"] == "string_pattern_mismatch" and err["loc"][-1] == "accelerator":
        msg = (
            f"{err.get('input')!r} is not a Cloud TPU accelerator type; use one of "
            f"{catalog.known_families()}, e.g. v5litepod-16"
        )
    return FieldError(path, msg)


def make_plan(
    spec: MultisliceJobSpec,
    namespace: str = "default",
    name: str = "job",
    status: MultisliceJobStatus | None = None,
) -> Plan:
    """Resolve a spec into a plan, or raise SpecError listing every field at fault. A model
    composed of others (registry.CapacityPlugin.compose: provisioning.mode Fallback) plans the
    job as the option its `status` says it tries now."""
    model = REGISTRY.model(spec.provisioning.mode)  # the mode was validated: it is registered
    if model.compose is not None:
        composed: Plan = model.compose(spec, namespace, name, status)
        return composed
    return plan_spec(spec, namespace, name)


def plan_spec(spec: MultisliceJobSpec, namespace: str = "default", name: str = "job") -> Plan:
    """make_plan of a spec its own mode's model plans (no composition)."""
    errors: list[FieldError] = []
    try:
        shape = catalog.slice_shape(spec.accelerator, spec.topology)
    except catalog.CatalogError as exc:
        path = "spec.topology" if isinstance(exc, catalog.TopologyError) else "spec.accelerator"
        raise SpecError([FieldError(path, str(exc))]) from None
    par, par_errors = parallelism.resolve(
        spec.parallelism.ici.model_dump(),
        spec.parallelism.dcn.model_dump(),
        shape.chips,
        spec.slices,
        spec.accelerator,
        shape.generation.devices_per_chip,
    )
    errors += par_errors
    errors += rule_errors(spec, {e.path for e in errors})
    template_errors = _check_template(spec.template)
    errors += template_errors
    errors += _check_name(name, spec.slices, shape.hosts)
    errors += _check_multislice(spec, shape)
    errors += cubes.sub_block_errors(spec, shape)
    model = REGISTRY.model(spec.provisioning.mode)
    errors += model.check(spec, shape) if model.check else []
    if errors and any(e.path == "spec.topology" for e in errors):
        raise SpecError(errors)
    fields = dict(model.pools(spec, shape, namespace, name)) if model.pools else {}
    pools: list[NodePoolSpec] = fields.pop("node_pools", [])
    if not template_errors:
        errors += _check_tpu_overrides(spec.template["spec"], shape, job_key(namespace, name))
        errors += _check_placement(spec.template["spec"], pools, {e.path for e in errors})
        errors += hostports.conflicts(spec.template["spec"])
    if errors:
        raise SpecError(errors)
    advice = advisor.advise(shape, spec.slices, par, spec.training.global_batch_tokens)
    return Plan(
        namespace=namespace,
        name=name,
        job_key=job_key(namespace, name),
        shape=shape,
        slices=spec.slices,
        parallelism=par,
        advice=advice,
        capacity=str(spec.capacity.type),
        mode=str(spec.provisioning.mode),
        node_pools=pools,
        warnings=checkpoint_warnings(spec),
        sizes=_sizes(spec, shape, par),
        elastic=(
            ElasticPlan(spec.elastic.min_slices, spec.elastic.wait_seconds)
            if spec.elastic
            else None
        ),
        spares=spec.spares,
        pod_grace_seconds=int(
            spec.template["spec"].get("terminationGracePeriodSeconds", DEFAULT_POD_GRACE_SECONDS)
        ),
        **fields,
    )


def _sizes(spec: MultisliceJobSpec, shape: catalog.SliceShape, par: Parallelism) -> list[SizePlan]:
    """Every slice count the job can run at (the rules have checked minSlices), largest first:
    dcn.data takes the change, the other DCN axes and ICI stay as resolved."""
    fixed = par.dcn_fsdp * par.dcn_pipeline * par.dcn_tensor
    low = spec.elastic.min_slices if spec.elastic else spec.slices
    out = []
    for k in parallelism.elastic_sizes(spec.slices, low, fixed):
        at = dataclasses.replace(par, dcn_data=k // fixed)
        advice = advisor.advise(shape, k, at, spec.training.global_batch_tokens)
        out.append(SizePlan(k, at, advice, shape.chips * k))
    return out


def plan_job(job: MultisliceJob) -> Plan:
    """The plan of a whole job (a queued one too: its Workload counts its spares and an elastic
    job at its full size, render/kueue_workload.py)."""
    return make_plan(job.spec, job.metadata.namespace, job.metadata.name or "job", job.status)


def rule_errors(spec: MultisliceJobSpec, reported: set[str]) -> list[FieldError]:
    """The model's cross-field rules (the CRD enforces the same ones at admission)."""
    errors = []
    for rule in spec_rules():
        if rule.field in reported or rule.holds(spec):
            continue
        text = rule.explain(spec) if rule.explain else rule.message
        text = text.removeprefix(f"{rule.field}: ").removeprefix(f"{rule.field} ")
        errors.append(FieldError(rule.field, text))
    return errors


def _check_multislice(spec: MultisliceJobSpec, shape: catalog.SliceShape) -> list[FieldError]:
    if spec.slices == 1 or shape.multi_host:
        return []
    # GKE "Deploy TPU Multislice": Multislice only supports multi-host TPU slice node pools.
    bigger = catalog.smallest_multi_host(shape.generation)
    return [
        FieldError(
            "spec.slices",
            f"{shape.accelerator} is a single-host slice ({shape.topology}, one "
            f"{shape.machine_type} VM) and GKE Multislice only supports multi-host slices; use "
            f"slices: 1, or the smallest multi-host shape accelerator: {bigger.accelerator} "
            f"({bigger.topology}, {bigger.hosts} x {bigger.machine_type})",
        )
    ]


def _check_template(template: dict[str, Any]) -> list[FieldError]:
    found = _check_template_fields(template)
    # Then Kubernetes' own schema at every depth (api/kubeschema.py): `args: 5`,
    # `resources.limitz`, a missing required field; what is already said above is not repeated.
    said = [e.path for e in found]
    deep = [
        e
        for e in kubeschema.check(template)
        if not any(e.path == p or e.path.startswith((f"{p}.", f"{p}[")) for p in said)
    ]
    return found + deep


def _check_template_fields(template: dict[str, Any]) -> list[FieldError]:
    # The types the renderer merges into, as the CRD declares them (api/podtemplate.py): what
    # passes is always renderable. The apiserver judges the rest by a dry run before any pool.
    typed = podtemplate.check(template)
    if typed:
        return typed
    # A misspelt field (`contianers`) first: what follows from it ("no containers") would hide it.
    unknown = podtemplate.unknown_fields(template)
    if unknown:
        return unknown
    pod = template.get("spec")
    if not isinstance(pod, dict):
        return [FieldError("spec.template.spec", "required: a pod spec with containers")]
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        return [
            FieldError(
                "spec.template.spec.containers",
                "at least one container is required; the first one gets the TPUs",
            )
        ]
    errors = []
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
            errors.append(
                FieldError(f"spec.template.spec.containers[{i}]", "needs a name and an image")
            )
    policy = pod.get("restartPolicy")
    if policy not in (None, "Never"):
        errors.append(
            FieldError(
                "spec.template.spec.restartPolicy",
                f"must be Never (or unset), got {policy!r}: a restart of one host must restart "
                "all slices, which the JobSet failure policy does",
            )
        )
    return errors


def _check_name(name: str, slices: int, hosts: int) -> list[FieldError]:
    errors = []
    if not DNS1035_RE.match(name):
        errors.append(
            FieldError(
                "metadata.name",
                f"{name!r} is not a DNS-1035 label: start with a lowercase letter, use only "
                "lowercase letters, digits and '-', end with a letter or digit (JobSet names the "
                "job's headless service after it)",
            )
        )
    longest = longest_pod_name(name, slices, hosts)
    if len(longest) > DNS_LABEL_MAX:
        errors.append(
            FieldError(
                "metadata.name",
                f"too long for {slices} slices x {hosts} hosts: JobSet would name a pod "
                f"{longest!r} ({len(longest)} characters, more than {DNS_LABEL_MAX}); use at "
                f"most {max_name_length(slices, hosts)} characters",
            )
        )
    return errors


def node_pools_of(
    spec: MultisliceJobSpec,
    shape: catalog.SliceShape,
    namespace: str,
    name: str,
    indexes: range,
) -> list[NodePoolSpec]:
    """The node pools of these slice indexes: the job's slices (0..slices-1), or its hot spares
    (slices..slices+spares-1), alike in all but name and index."""
    cap = spec.capacity
    reservation = cap.reservation if cap.type == CapacityType.RESERVED.value else None
    pools = []
    for i in indexes:
        pool = node_pool_name(namespace, name, i)
        labels = {
            keys.JOB_KEY: job_key(namespace, name),
            keys.JOB_NAME: name,
            keys.JOB_NAMESPACE: namespace,
            keys.SLICE: str(i),
            keys.NODE_MANAGED_BY: keys.MANAGED_BY_VALUE,
        }
        pools.append(
            NodePoolSpec(
                name=pool,
                slice_index=i,
                node_count=shape.hosts,
                machine_type=shape.machine_type,
                topology=shape.topology,
                tpu_topology=shape.topology if shape.multi_host else None,
                gke_accelerator=shape.generation.gke_accelerator,
                spot=cap.type == CapacityType.SPOT.value,
                reservation=reservation,
                node_labels=labels,
                workload_policy=workload_policy_name(shape),
                flex_start=cap.type == CapacityType.FLEX_START.value,
                max_run_duration_s=cap.run_duration_seconds(),
            )
        )
    return pools


# ---------------------------------------------------------------- what the operator sets itself


def _same_quantity(value: Any, chips: int) -> bool:
    try:
        return float(str(value)) == chips
    except ValueError:
        return False


def _check_tpu_overrides(
    pod: dict[str, Any], shape: catalog.SliceShape, key: str
) -> list[FieldError]:
    """The template may not say otherwise than the operator about the TPUs: the render sets the
    TPU container's google.com/tpu and the node selector's accelerator and topology (and, in
    Managed mode, the job key), so a different value would be silently replaced."""
    errors = []
    ours = {
        keys.GKE_TPU_ACCELERATOR: shape.generation.gke_accelerator,
        keys.GKE_TPU_TOPOLOGY: shape.topology,
        keys.JOB_KEY: key,
    }
    for label, theirs in sorted((pod.get("nodeSelector") or {}).items()):
        if label in ours and str(theirs) != ours[label]:
            errors.append(
                FieldError(
                    f"spec.template.spec.nodeSelector.{label}",
                    f"{theirs!r} conflicts with the operator's {ours[label]!r} for "
                    f"{shape.accelerator} ({shape.topology}): the operator sets this selector "
                    "itself; remove it (or change spec.accelerator / spec.topology)",
                )
            )
    for i, c in enumerate(pod.get("containers") or []):
        resources = c.get("resources") or {}
        for kind in ("requests", "limits"):
            value = (resources.get(kind) or {}).get(keys.TPU_RESOURCE)
            if value is None:
                continue
            path = f"spec.template.spec.containers[{i}].resources.{kind}.{keys.TPU_RESOURCE}"
            if i > 0:
                errors.append(
                    FieldError(
                        path,
                        "only the first container gets the TPUs (the operator sets "
                        f"{shape.chips_per_host} there): remove it from this container",
                    )
                )
            elif not _same_quantity(value, shape.chips_per_host):
                errors.append(
                    FieldError(
                        path,
                        f"{value!r} conflicts with the {shape.chips_per_host} chips per host of "
                        f"{shape.accelerator} ({shape.machine_type}), which the operator sets: "
                        "remove it",
                    )
                )
    return errors


def pool_node_labels(pool: NodePoolSpec) -> dict[str, str]:
    """The labels every node of `pool` will carry that the plan knows: the operator's (sent in
    the CreateNodePoolRequest, but the job uid) and those GKE derives from the request
    (facts.md sections 2 and 6; node.kubernetes.io/instance-type from the machine type)."""
    labels = dict(pool.node_labels)
    labels[keys.GKE_NODEPOOL] = pool.name
    labels[keys.GKE_TPU_ACCELERATOR] = pool.gke_accelerator
    labels[keys.GKE_TPU_TOPOLOGY] = pool.topology
    labels[keys.INSTANCE_TYPE] = pool.machine_type
    if pool.spot:
        labels[keys.GKE_SPOT] = "true"
    return labels


def _check_placement(
    pod: dict[str, Any], pools: list[NodePoolSpec], reported: set[str]
) -> list[FieldError]:
    if not pools:
        return []  # Existing mode: the nodes are someone else's
    # Conflicts with what the operator sets are _check_tpu_overrides' to report, and a selector
    # a capacity model's rule refused already (`reported`) is said once, in the model's words.
    skip = {keys.GKE_TPU_ACCELERATOR, keys.GKE_TPU_TOPOLOGY, keys.JOB_KEY}
    skip |= {p.removeprefix(SELECTOR_PATH) for p in reported if p.startswith(SELECTOR_PATH)}
    return placement.never_matched(
        pod,
        [(p.name, pool_node_labels(p)) for p in pools],
        unknown=frozenset({keys.JOB_UID}),
        skip=frozenset(skip),
    )


# ---------------------------------------------------------------- warnings

# Volume types whose data outlives the pod and is reachable from every host of a slice again
# after a restart (a restart recreates every pod, a lost slice gets a new node pool).
PERSISTENT_VOLUMES = (
    "persistentVolumeClaim",
    "csi",  # e.g. Cloud Storage FUSE (gcsfuse.csi.storage.gke.io), Filestore
    "nfs",
    "gcePersistentDisk",
    "cephfs",
    "glusterfs",
    "iscsi",
    "rbd",
    "fc",
    "azureFile",
    "azureDisk",
)


def _under(path: str, mount_path: str) -> bool:
    root = mount_path.rstrip("/")
    return mount_path.startswith("/") and (path == root or path.startswith(root + "/"))


def checkpoint_warnings(spec: MultisliceJobSpec) -> list[FieldError]:
    """A job whose progress does not survive a restart of all slices (any preemption,
    maintenance or failure restarts every slice from its last checkpoint)."""
    directory = spec.checkpoint.directory
    path = "spec.checkpoint.directory"
    if not directory:
        return [
            FieldError(
                path,
                "unset: the workload gets no MULTISLICE_CHECKPOINT_DIR, so unless the program "
                "checkpoints somewhere of its own, every restart of all slices (preemption, "
                "maintenance, a failure) starts training from step 0; set gs://BUCKET/PATH",
            )
        ]
    if not directory.startswith("/"):
        return []
    pod = spec.template.get("spec") or {}
    containers = pod.get("containers") or [{}]
    mounts = [m for m in containers[0].get("volumeMounts") or [] if isinstance(m, dict)]
    mount = max(
        (m for m in mounts if _under(directory, str(m.get("mountPath") or ""))),
        key=lambda m: len(str(m["mountPath"]).rstrip("/")),
        default=None,
    )
    if mount is None:
        return [
            FieldError(
                path,
                f"{directory} is on no volume of the TPU container: it is the container's own "
                "filesystem, lost when the pods are recreated at every restart; mount a "
                "persistent volume there (a PersistentVolumeClaim, Cloud Storage FUSE) or use "
                "gs://BUCKET/PATH",
            )
        ]
    volume = next(
        (
            v
            for v in pod.get("volumes") or []
            if isinstance(v, dict) and v.get("name") == mount.get("name")
        ),
        {},
    )
    kind = next((k for k in volume if k != "name"), "none")
    if kind in PERSISTENT_VOLUMES:
        return []
    return [
        FieldError(
            path,
            f"{directory} is on volume {mount.get('name')!r} ({kind}), which does not outlive "
            "the pod on every host (a restart recreates every pod, a lost slice gets new "
            "nodes): use a PersistentVolumeClaim, Cloud Storage FUSE or gs://BUCKET/PATH",
        )
    ]
