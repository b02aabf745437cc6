"""The `multislice-operator` command (and `kubectl msj`): validate, plan, render, crd, status, run;
the cluster verbs list, logs, events, suspend, resume, checkpoint, delete live in cli/verbs.py.

Bad input (missing file, invalid YAML, wrong kind, invalid spec) gets clear lines naming the field
and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import yaml

from multislice_operator import __version__
from multislice_operator.cli.yamlload import MAX_DEPTH, MAX_INPUT_BYTES
from multislice_operator.common.errors import FieldError, SpecError
from multislice_operator.registry import PluginError

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # sysexits.h EX_SOFTWARE
EXIT_WRITE = 74  # sysexits.h EX_IOERR
EXIT_INTERRUPTED = 128 + 2  # as a shell reports a process killed by SIGINT
EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a process killed by SIGPIPE

# Every exit status of every verb, one row each (docs/cli.md's table is generated from it:
# `make docs`; tests/unit/test_cli_robust.py fails when the two differ).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done"),
    (
        EXIT_INVALID,
        "invalid input, or not done in time: the file is not a valid MultisliceJob (invalid "
        f"YAML, a duplicate key, larger than {MAX_INPUT_BYTES // 2**20} MiB or nested deeper "
        f"than {MAX_DEPTH} levels, no "
        "MultisliceJob in it, a wrong `apiVersion`, any field error: `validate` lists every "
        "one); or a `--wait`/`--timeout` ran out before the job got there",
    ),
    (
        EXIT_USAGE,
        "the command could not run: a usage error (missing or wrong flags), a file that cannot "
        "be read, a dependency the thin install lacks, or kubectl failed (its message, one "
        "line: not found, forbidden, unreachable; `logs` when `kubectl logs` fails)",
    ),
    (
        EXIT_INTERNAL,
        "a bug in the CLI: one line naming it instead of a traceback (`MULTISLICE_DEBUG=1` "
        "shows the traceback); please report it with the input",
    ),
    (EXIT_WRITE, "the output could not be written (stdout on a full disk, a closed terminal)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C), as a shell reports SIGINT"),
    (
        EXIT_BROKEN_PIPE,
        "the reader of stdout left (`-o json \\| head`), as a shell reports SIGPIPE",
    ),
)


class InputError(Exception):
    """A problem with the input: `code` says whether it could not be read (EXIT_USAGE) or was
    read and is not a MultisliceJob (EXIT_INVALID)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def _invalid(message: str) -> InputError:
    return InputError(message, EXIT_INVALID)


def _read_bytes(path: str) -> bytes:
    """At most MAX_INPUT_BYTES + 1 bytes: a larger input is refused before it is all read."""
    try:
        if path == "-":
            return sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        with open(path, "rb") as f:
            return f.read(MAX_INPUT_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:  # a directory, no permission, an I/O error
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _read_documents(path: str) -> list[Any]:
    from multislice_operator.cli.yamlload import InputTooLarge, load_all

    data = _read_bytes(path)
    try:
        docs = load_all(data)
    except InputTooLarge:
        raise _invalid(
            f"{path}: larger than {MAX_INPUT_BYTES // 2**20} MiB ({MAX_INPUT_BYTES} bytes), the "
            "most a Kubernetes apiserver accepts in one request; split the file"
        ) from None
    except UnicodeDecodeError as exc:
        raise _invalid(f"{path}: not UTF-8 text (byte {exc.start}): {exc.reason}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _invalid(f"{path}: invalid YAML{where}: {problem}") from None
    except RecursionError:  # a guard missed: still one line, not a traceback
        raise _invalid(f"{path}: invalid YAML: nested too deeply") from None
    if not docs:
        raise _invalid(f"{path}: no YAML document found")
    return docs


def _jobs(path: str) -> list[dict[str, Any]]:
    from multislice_operator.api.models import KIND

    docs = _read_documents(path)
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if not jobs:
        kinds = ", ".join(sorted({str(d.get("kind"))[:60] for d in docs if isinstance(d, dict)}))
        raise _invalid(f"{path}: no {KIND} found (kinds present: {kinds or 'none'})")
    return jobs


def _label(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"


def _load_job(obj: Any) -> Any:
    """load_job, and what the apiserver asks of a file that the operator's own reads (always of
    a stored object) need not: a name."""
    from multislice_operator.planning.plan import load_job

    job = load_job(obj)
    if not job.metadata.name:
        raise SpecError(
            [
                FieldError(
                    "metadata.name",
                    "required: the apiserver refuses an object without a name; add one "
                    "(a DNS-1035 label, e.g. llm-train)",
                )
            ]
        )
    return job


class _Planned:
    """The jobs of a file that plan, as (object, job, plan) in the file's order, each other
    one's errors said on stderr as it comes; `status`: EXIT_INVALID once any did not plan."""

    def __init__(self, path: str) -> None:
        self.path, self.status = path, EXIT_OK

    def __iter__(self) -> Iterator[tuple[dict[str, Any], Any, Any]]:
        from multislice_operator.planning.plan import plan_job

        for obj in _jobs(self.path):
            try:
                job = _load_job(obj)
                plan = plan_job(job)
            except SpecError as exc:
                _print_errors(obj, exc, sys.stderr)
                self.status = EXIT_INVALID
                continue
            yield obj, job, plan


def _identity(obj: dict[str, Any], plan: Any, args: argparse.Namespace) -> Any:
    """Who the pods will be to Google APIs, under the operator settings given (--gke-*, MSJ_*)."""
    from multislice_operator.render.identity import pod_identity
    from multislice_operator.settings import Settings, gke_settings

    settings = Settings(**gke_settings(args))
    return pod_identity(
        obj["spec"].get("template") or {},
        plan.namespace,
        managed=_own_nodes(plan),
        workload_identity=settings.gke_workload_identity,
        service_account=settings.gke_node_service_account,
    )


def _own_nodes(plan: Any) -> bool:
    """The TPU nodes are the operator's: it creates the slices' pools (their identity is its)."""
    from multislice_operator.registry import REGISTRY

    return REGISTRY.model(plan.mode).own_slice_pools


def _warnings(obj: dict[str, Any], plan: Any, identity: Any) -> list[FieldError]:
    found = list(plan.warnings)
    if identity.warning:
        found.append(FieldError("spec.template.spec.hostNetwork", identity.warning))
    return found


def _print_errors(obj: dict[str, Any], exc: SpecError, out: TextIO) -> None:
    for err in exc.errors:
        print(f"{_label(obj)}: {err}", file=out)


def cmd_validate(args: argparse.Namespace) -> int:
    planned = _Planned(args.file)
    for obj, _, plan in planned:
        print(f"{_label(obj)}: valid ({_summary(plan)})")
        for warning in _warnings(obj, plan, _identity(obj, plan, args)):
            print(f"{_label(obj)}: warning: {warning}", file=sys.stderr)
    return planned.status


def cmd_plan(args: argparse.Namespace) -> int:
    from multislice_operator.reconcile.restart_strategy import summary as restart_summary
    from multislice_operator.render.identity import node_identity
    from multislice_operator.settings import Settings, gke_settings

    settings = Settings(**gke_settings(args))
    nodes = node_identity(
        settings.gke_workload_identity,
        settings.gke_node_service_account,
        settings.gke_node_scopes,
    )
    plans, planned = [], _Planned(args.file)
    for obj, _, plan in planned:
        identity = _identity(obj, plan, args)
        plans.append((plan, identity, _warnings(obj, plan, identity), _preflight(obj, plan)))
    if args.output == "json":
        data = [
            {
                **p.as_dict(),
                "podIdentity": i.as_dict(),
                "restarts": restart_summary(),
                **({"nodeIdentity": nodes} if _own_nodes(p) else {}),
                **({"preflight": pre} if pre else {}),
                "warnings": [{"path": w.path, "message": w.message} for w in warnings],
            }
            for p, i, warnings, pre in plans
        ]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=2))
    else:
        for plan, identity, warnings, pre in plans:
            extra = [("pod identity", identity.principal), ("restarts", restart_summary())]
            extra += [("tpu nodes", nodes)] if _own_nodes(plan) else []
            extra += [("preflight", _preflight_text(pre))] if pre else []
            text = format_plan(plan, extra)
            print(text + "".join(f"warning: {w}\n" for w in warnings))
    return planned.status


def _preflight(obj: dict[str, Any], plan: Any) -> dict[str, Any] | None:
    """spec.preflight as the operator will run it: the Job, its command and the HBM per device
    of the job's TPU generation it must fit in (what the TPU compiler lets a device use)."""
    from multislice_operator.common.names import preflight_job
    from multislice_operator.render.preflight import command

    spec = _load_job(obj).spec
    if spec.preflight is None:
        return None
    gen = plan.shape.generation
    return {
        "job": preflight_job(plan.name),
        "command": command(plan, spec),
        "timeoutSeconds": spec.preflight.timeout_seconds,
        "hbmCapacityBytes": gen.usable_hbm_bytes,
    }


def _preflight_text(pre: dict[str, Any]) -> str:
    return (
        f"Job {pre['job']} (CPU, before any node pool; {pre['timeoutSeconds']}s at most): "
        f"{shlex.join(pre['command'])}; must fit {pre['hbmCapacityBytes'] / 2**30:.2f} GiB of "
        "HBM per device"
    )


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _summary(plan: Any) -> str:
    """`validate`'s one line: the job's size and chips, and what elasticity and spares add."""
    text = f"{plan.slices} x {plan.shape.accelerator}, {plan.total_chips} chips"
    if plan.elastic:
        text += f", elastic down to {plan.elastic.min_slices} slices"
    if plan.spares:
        spare = "spare cube" if plan.dynamic else "spare slice"
        text += f", {_count(plan.spares, spare)} ({plan.spare_chips} chips more)"
    return f"{text}, DCN {plan.advice.verdict}"


def _sizes_rows(plan: Any) -> list[tuple[str, str]]:
    """Elastic: each slice count the job may run at, its dcn.data and advice; spares: their
    count and what they cost in chips."""
    rows = []
    if plan.elastic:
        rows.append(
            (
                "elastic",
                f"down to {plan.elastic.min_slices} slices after {plan.elastic.wait_seconds} s "
                "without a lost slice's replacement, at once if GKE answers it with a stockout "
                "or quota error (only dcn.data changes); grows back after a checkpoint",
            )
        )
        rows += [
            (
                f"  at {s.slices} slices",
                f"{s.chips} chips, dcn data {s.parallelism.dcn_data}; dcn advice "
                f"{s.advice.verdict}: {s.advice.message}",
            )
            for s in plan.sizes
        ]
    if plan.spares:
        rows.append(
            (
                "spares",
                f"{_count(plan.spares, 'spare cube' if plan.dynamic else 'hot spare slice')}, "
                f"{plan.spare_chips} chips held "
                f"beside the job's {plan.total_chips} "
                f"({plan.total_chips + plan.spare_chips} in all), unused by the JobSet",
            )
        )
    return rows


def format_plan(plan: Any, extra: list[tuple[str, str]] | None = None) -> str:
    shape, par, advice = plan.shape, plan.parallelism, plan.advice
    rows = [
        ("job", f"{plan.namespace}/{plan.name}"),
        ("accelerator", f"{shape.accelerator} ({shape.generation.name})"),
        ("topology", shape.topology),
        ("slices", str(plan.slices)),
        ("chips", _chips_row(plan)),
        (
            "hosts",
            f"{shape.hosts} per slice ({shape.chips_per_host} chips each), "
            f"{plan.total_hosts} total",
        ),
        ("machine type", f"{shape.machine_type} ({shape.generation.gke_accelerator})"),
        ("capacity", plan.capacity),
        ("provisioning", plan.mode),
        ("ici", f"data {par.ici_data} x fsdp {par.ici_fsdp} x tensor {par.ici_tensor}"),
        (
            "dcn",
            f"data {par.dcn_data} x fsdp {par.dcn_fsdp} x pipeline {par.dcn_pipeline} "
            f"x tensor {par.dcn_tensor}",
        ),
        ("dcn advice", f"{advice.verdict}: {advice.message}"),
        *_sizes_rows(plan),
        *(extra or []),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    if plan.dynamic:
        return "\n".join(lines + _dynamic_lines(plan)) + "\n"
    if plan.node_pools:
        lines.append("node pools:")
        lines += [_pool_line(p, "slice") for p in plan.node_pools]
    if plan.spare_pools:
        lines.append("spare node pools (not used by the JobSet):")
        lines += [_pool_line(p, "spare") for p in plan.spare_pools]
    return "\n".join(lines) + "\n"


def _dynamic_lines(plan: Any) -> list[str]:
    """Dynamic slicing: the cubes (created, or the cluster's), then the GKE Slices, each over
    its cubes' partition ids (known once the cubes' nodes exist: the cubes it starts from)."""
    from multislice_operator.planning import cubes

    per, topo = plan.cubes_per_slice, plan.shape.generation.sub_block_topology
    lines = [f"cubes ({topo}, {plan.cubes_source}): {plan.cubes_needed} "
             f"({plan.slices} slices x {per} + {plan.spares} spare)"]  # fmt: skip
    lines += [_pool_line(p, "cube") for p in plan.node_pools]
    lines += [_pool_line(p, "spare cube") for p in plan.spare_pools]
    lines.append("slices (GKE Slice objects, accelerator.gke.io/v1beta1):")
    for i in range(plan.slices):
        first, second = cubes.slice_names(plan.job_key, i)
        parts = ", ".join(f"partition id of cube {i * per + k}" for k in range(per))
        lines.append(
            f"  {first} (re-formed as {second})  slice {i}  {plan.shape.topology}  "
            f"partitionIds [{parts}]"
        )
    return lines


def slice_requests(plan: Any) -> list[dict[str, Any]]:
    """The Slices a dynamic-slicing job creates first, partition ids as placeholders (each is
    the cloud.google.com/gke-tpu-partition-4x4x4-id of the cube's nodes, known once they exist)."""
    from multislice_operator.planning import cubes
    from multislice_operator.render.slice import render_slice

    per = plan.cubes_per_slice
    return [
        render_slice(
            plan,
            cubes.slice_names(plan.job_key, i)[0],
            plan.shape.topology,
            tuple(f"PARTITION_ID_OF_CUBE_{i * per + k}" for k in range(per)),
        )
        for i in range(plan.slices)
    ]


def _pool_line(p: Any, what: str) -> str:
    return (
        f"  {p.name}  {what} {p.slice_index}  {p.node_count} x {p.machine_type}"
        + (f"  topology {p.tpu_topology}" if p.tpu_topology else "")
        + (f"  workload policy {p.workload_policy}" if p.workload_policy else "")
        + ("  spot" if p.spot else "")
        + (f"  flex-start (max run {p.max_run_duration_s} s)" if p.flex_start else "")
        + (f"  reservation {p.reservation or '(any)'}" if p.reservation is not None else "")
    )


def _chips_row(plan: Any) -> str:
    shape = plan.shape
    row = f"{shape.chips} per slice, {plan.total_chips} total"
    cores = shape.generation.cores_per_chip
    if cores > 1:  # v4, v5p, tpu7x: the number in the name counts TensorCores
        devices = shape.chips * shape.generation.devices_per_chip
        row += (
            f" ({shape.accelerator} counts TensorCores: {shape.tensorcores} = {shape.chips} "
            f"chips x {cores}; {devices} JAX devices per slice)"
        )
    return row


# Dry-run placeholders for what only the running operator knows.
PLACEHOLDER_PROJECT, PLACEHOLDER_LOCATION, PLACEHOLDER_CLUSTER = "PROJECT", "LOCATION", "CLUSTER"
PLACEHOLDER_ZONE, PLACEHOLDER_UID, PLACEHOLDER_REGION = "ZONE", "JOB_UID", "REGION"


def cmd_render(args: argparse.Namespace) -> int:
    from multislice_operator.render.jobset import render_jobset

    if args.gke_requests:
        return render_gke_requests(args)
    planned = _Planned(args.file)
    rendered = [render_jobset(plan, job.spec, job.metadata.labels) for _, job, plan in planned]
    if rendered:
        print(yaml.safe_dump_all(rendered, sort_keys=False), end="")
    return planned.status


def render_gke_requests(args: argparse.Namespace) -> int:
    """Print the requests the operator will send, as JSON (`terraform plan`): the workload
    policies the slices need (InsertResourcePolicyRequest, sent when the policy does not exist
    yet), then one CreateNodePoolRequest per slice."""
    from multislice_operator.provisioning.gke import resolve_node_locations
    from multislice_operator.provisioning.gke_requests import (
        cluster_path,
        create_requests,
        policy_insert_json,
        region_of,
        workload_policies,
    )
    from multislice_operator.settings import Settings, gke_settings

    settings = Settings(**gke_settings(args))
    location = settings.gke_location or PLACEHOLDER_LOCATION
    try:
        zones = resolve_node_locations(location, settings.gke_node_locations)
    except ValueError:
        if settings.gke_location:  # a real region without a zone: the operator refuses it too
            raise InputError(
                f"--gke-location {location} is a region: give --gke-node-location (one zone)"
            ) from None
        zones = [PLACEHOLDER_ZONE]
    parent = cluster_path(
        settings.gke_project or PLACEHOLDER_PROJECT,
        location,
        settings.gke_cluster or PLACEHOLDER_CLUSTER,
    )
    project = settings.gke_project or PLACEHOLDER_PROJECT
    region = PLACEHOLDER_REGION if zones == [PLACEHOLDER_ZONE] else region_of(zones[0])
    policies: dict[str, dict[str, Any]] = {}
    requests: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []  # dynamic slicing: the Slices, after the cubes' pools
    planned = _Planned(args.file)
    for obj, job, plan in planned:
        if plan.dynamic:
            slices += slice_requests(plan)
        if not plan.pools:
            print(f"{_label(obj)}: {_no_pools(plan)}: no node pool requests", file=sys.stderr)
            continue
        uid = job.metadata.uid or PLACEHOLDER_UID
        for policy in workload_policies(plan, region):
            policies.setdefault(policy.name, policy_insert_json(project, policy))
        requests += create_requests(
            plan, parent, uid, zones, settings.node_options(), enum_names=args.enum_names
        )
    print(json.dumps([*policies.values(), *requests, *slices], indent=2))
    return planned.status


def _no_pools(plan: Any) -> str:
    if plan.dynamic:
        return "dynamic slicing on Existing cubes"
    return "provisioning mode Existing"


def cmd_crd(_: argparse.Namespace) -> int:
    from multislice_operator.api.crd import generate_crd

    print(yaml.safe_dump(generate_crd(), sort_keys=False, width=100), end="")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """One job: phase and why, slices, restarts, where its time went, the next retry."""
    from datetime import datetime

    from multislice_operator.cli import view

    if args.file:
        docs = _read_documents(args.file)
        obj = next(
            (d for d in docs if isinstance(d, dict) and d.get("kind") == "MultisliceJob"), None
        )
        if obj is None:
            raise _invalid(f"{args.file}: no MultisliceJob found")
    else:
        if not args.name:
            raise InputError("give the job's NAME (or -f FILE)")
        try:
            obj = view.fetch_job(
                args.name, args.namespace, args.kubectl, args.context, args.kubeconfig
            )
        except view.FetchError as exc:
            raise InputError(str(exc)) from None
    try:
        now = (
            datetime.fromisoformat(args.now.replace("Z", "+00:00")) if args.now else view.now_utc()
        )
    except ValueError:
        raise InputError(f"--now {args.now}: not an ISO 8601 time") from None
    data = view.view(obj, now)
    if args.output == "json":
        print(json.dumps(data, indent=2))
        return EXIT_OK
    try:
        from rich.console import Console
    except ImportError:
        raise InputError(
            "the status view needs rich: pip install 'multislice-operator[cli]' (or use -o json)"
        ) from None
    view.render(data, Console(highlight=False))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from multislice_operator.controller import memory

    memory.configure()  # may start this process again, before any thread or connection
    from multislice_operator.controller.main import run_operator

    code: int = run_operator(args)
    return code


def build_parser(prog: str = "multislice-operator") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run Cloud TPU Multislice training on GKE: validate, plan and render "
        "MultisliceJobs, or run the operator.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from multislice_operator.settings import add_gke_arguments

    p = sub.add_parser(
        "validate",
        help="check MultisliceJobs; exit 1 listing every error; warnings on stderr (the --gke-* "
        "flags of run say which identity the pods get)",
    )
    p.add_argument("-f", "--file", required=True, help="YAML file (or - for stdin)")
    add_gke_arguments(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "plan",
        help="show slices, hosts, node pools, parallelism, DCN advice, the pods' Google identity",
    )
    p.add_argument("-f", "--file", required=True, help="YAML file (or - for stdin)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    add_gke_arguments(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "render",
        help="print the JobSet the operator would create, as YAML (--gke-requests: the GKE "
        "CreateNodePoolRequests, as JSON)",
    )
    p.add_argument("-f", "--file", required=True, help="YAML file (or - for stdin)")
    p.add_argument(
        "--gke-requests",
        action="store_true",
        help="print the CreateNodePoolRequest of every slice as sent on the wire (REST JSON: "
        "parent and nodePool), after the InsertResourcePolicyRequest of each workload policy the "
        "slices need (tpu7x), with the same --gke-* flags as run; placeholders when omitted",
    )
    p.add_argument(
        "--enum-names",
        action="store_true",
        help="with --gke-requests: enums by name instead of the integers sent on the wire",
    )
    add_gke_arguments(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("crd", help="print the generated CustomResourceDefinition")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser(
        "status",
        help="one job as a person reads it: phase and why, slices, restarts, where its TPU time "
        "went (goodput), a timeline, the next retry",
    )
    p.add_argument("name", nargs="?", help="the MultisliceJob's name")
    p.add_argument("-n", "--namespace", help="its namespace (default: kubectl's)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.add_argument("-f", "--file", help="read the job from a file (kubectl get -o json/yaml)")
    p.add_argument("--kubectl", default="kubectl", help="the kubectl to read the job with")
    p.add_argument("--context", help="kubeconfig context (passed to kubectl)")
    p.add_argument("--kubeconfig", help="kubeconfig file (passed to kubectl)")
    p.add_argument("--now", help=argparse.SUPPRESS)  # tests: a fixed 'now' (ISO 8601)
    p.set_defaults(func=cmd_status)

    from multislice_operator.cli.verbs import add_verbs

    add_verbs(sub)  # list, logs, events, suspend, resume, checkpoint, delete

    p = sub.add_parser("run", help="run the operator (kopf)")
    from multislice_operator.settings import add_run_arguments

    add_run_arguments(p)
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None, prog: str = "multislice-operator") -> int:
    """Run one verb; every way it can end is a row of EXIT_CODES, never a traceback."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a write error surfaces here, not in the interpreter's exit
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except PluginError as exc:  # a plugin named by MSJ_PLUGINS or an entry point
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SpecError as exc:  # pragma: no cover - commands catch their own
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `... -o json | head`: the reader left. Python would print a traceback on exit while
        # flushing stdout again; point stdout at /dev/null and exit as a SIGPIPE would (141).
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except ModuleNotFoundError as exc:  # the CLI alone (pip install multislice-operator)
        # A module of ours is a bug; any other is a dependency of `run` or `render
        # --gke-requests` (kopf, the Google client libraries and theirs) the thin install lacks.
        if not exc.name or exc.name.split(".")[0] == "multislice_operator":
            return _internal(args, exc)
        print(
            f"error: {args.command} needs the operator's dependencies ({exc.name} is not "
            "installed): pip install 'multislice-operator[operator]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except OSError as exc:
        if exc.filename is not None:  # a file of ours, not stdout: a bug to report
            return _internal(args, exc)
        _drop_stdout()  # stdout on a full disk (/dev/full), a closed terminal
        print(f"error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_WRITE
    except Exception as exc:  # the last guard: one line and a code of its own
        return _internal(args, exc)
    return code


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit finds nothing."""
    with contextlib.suppress(OSError, ValueError):  # no file descriptor (captured in tests)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _internal(args: argparse.Namespace, exc: BaseException) -> int:
    if os.environ.get("MULTISLICE_DEBUG"):
        raise exc
    where = exc.__traceback__
    while where is not None and where.tb_next is not None:
        where = where.tb_next
    at = f" at {Path(where.tb_frame.f_code.co_filename).name}:{where.tb_lineno}" if where else ""
    print(
        f"error: internal error in {args.command}: {type(exc).__name__}: {exc}{at}; this is a "
        "bug, please report it with the input (MULTISLICE_DEBUG=1 prints the traceback)",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def exit_codes_table() -> str:
    """docs/cli.md's exit status table, from EXIT_CODES."""
    rows = ["| Exit status | Meaning |", "| --- | --- |"]
    rows += [f"| `{code}` | {meaning} |" for code, meaning in EXIT_CODES]
    return "\n".join(rows) + "\n"


EXIT_TABLE_BEGIN = "<!-- exit codes: generated from cli.EXIT_CODES (make docs) -->\n"
EXIT_TABLE_END = "<!-- end of exit codes -->"


def write_exit_codes(path: str) -> None:
    """`make docs`: rewrite the exit status table in docs/cli.md."""
    import re

    file = Path(path)
    pattern = re.compile(re.escape(EXIT_TABLE_BEGIN) + ".*?" + re.escape(EXIT_TABLE_END), re.S)
    text = file.read_text()
    if not pattern.search(text):
        raise SystemExit(f"{path}: no exit codes table markers")
    file.write_text(
        pattern.sub(lambda _: EXIT_TABLE_BEGIN + exit_codes_table() + EXIT_TABLE_END, text)
    )


def kubectl_main() -> int:
    """`kubectl msj ...`: kubectl runs an executable named kubectl-msj found on PATH."""
    return main(prog="kubectl msj")


__all__ = ["FieldError", "kubectl_main", "main"]

if __name__ == "__main__":
    sys.exit(main())
