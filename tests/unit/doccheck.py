"""What README.md and docs/ name, checked against what the code defines (issue 21).

Pure functions over a document's text, each returning the findings (where, what), so that a test
runs them on every page and shows each one failing on a deliberately wrong snippet:

* commands and flags: `multislice-operator` / `kubectl msj` subcommands and their flags (the CLI
  parser), `multislice-local`, `python -m` modules of this repository (their argparse flags),
  `make` targets and variables, `hack/build-bins.sh` options; a flag named alone in prose must be
  one of ours;
* environment variables: `MSJ_*` (Settings), the contract and every other name the code reads;
* defaults: "`--flag` (default N)" and "`field` (default N)" against Settings and the models;
* phases, conditions and reasons: what follows "phase", "condition", "reason", "event", table
  rows `True`/`False` `Reason`, and every CamelCase name in backticks, against the models' enums
  and the names the code writes (or an explicit list of Kubernetes, JobSet, Kueue and GKE names,
  each with its owner).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from multislice_operator.api import models
from multislice_operator.cli.main import build_parser
from multislice_operator.registry import REGISTRY
from multislice_operator.settings import Settings, env_of, flag_of

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCES = ("operator", "local", "workload", "benchmarks")


@dataclass(frozen=True)
class Finding:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


# ---------------------------------------------------------------- what the code defines


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


@functools.cache
def operator_commands() -> dict[str, set[str]]:
    """`multislice-operator` (and `kubectl msj`) subcommands and their flags."""
    parser = build_parser()
    commands = {name: _options(p) for name, p in _subparsers(parser).items()}
    commands[""] = _options(parser)
    return commands


@functools.cache
def verb_defaults() -> dict[str, Any]:
    """The defaults of the CLI verbs' own flags (`logs --worker`, ...), from the parser."""
    out: dict[str, Any] = {}
    for p in _subparsers(build_parser()).values():
        for a in p._actions:
            for o in a.option_strings:
                if o.startswith("--") and a.default not in (None, argparse.SUPPRESS):
                    out.setdefault(o, a.default)
    return out


@functools.cache
def local_commands() -> dict[str, set[str]]:
    from multislice_local.cli import build_parser as local_parser

    parser = local_parser()
    return {name: _options(p) for name, p in _subparsers(parser).items()}


def _python_files() -> list[Path]:
    return [p for d in SOURCES for p in sorted((ROOT / d).rglob("*.py")) if ".venv" not in p.parts]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in ("operator", "local", "workload"):
        parts = parts[1:]
    return ".".join(p for p in parts if p != "__main__")


@functools.cache
def module_flags() -> dict[str, set[str]]:
    """The flags each of our Python modules declares with add_argument, by module name."""
    found: dict[str, set[str]] = {}
    for path in _python_files():
        tree = ast.parse(path.read_text())
        flags = {
            arg.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            # parser.add_argument, or the `add = parser.add_argument` alias the workload uses
            and (
                getattr(node.func, "attr", "") == "add_argument" or ast.unparse(node.func) == "add"
            )
            for arg in node.args
            if isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)
            and arg.value.startswith("--")
        }
        if flags:
            found[_module_name(path)] = flags
    return found


@functools.cache
def script_flags() -> set[str]:
    text = (ROOT / "hack" / "build-bins.sh").read_text()
    return set(re.findall(r"^\s*(--[a-z-]+)\)", text, re.MULTILINE))


@functools.cache
def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))


@functools.cache
def make_variables() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"\$[({]([A-Z_]+)[)}]", text)) | set(
        re.findall(r"^([A-Z_]+) \?=", text, re.MULTILINE)
    )


@functools.cache
def all_our_flags() -> set[str]:
    flags = {f for fs in operator_commands().values() for f in fs}
    flags |= {f for fs in local_commands().values() for f in fs}
    flags |= {f for fs in module_flags().values() for f in fs}
    return flags | script_flags()


@functools.cache
def code_strings() -> frozenset[str]:
    """Every string constant in our Python sources, and every CamelCase word inside one."""
    found: set[str] = set()
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
                found.update(re.findall(r"[A-Z][A-Za-z0-9]+", node.value))
    return frozenset(found)


@functools.cache
def environment_names() -> frozenset[str]:
    """Variables the code reads or sets: Settings' MSJ_* (derived from the fields) and every
    upper-case name that is a string constant in the code or the build script."""
    names = {env_of(f) for f in dataclasses.fields(Settings)}
    names |= {s for s in code_strings() if re.fullmatch(r"[A-Z][A-Z0-9_]+", s)}
    names |= set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", (ROOT / "hack" / "build-bins.sh").read_text()))
    names |= set(
        re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", (ROOT / "hack" / "build-bins.sh").read_text())
    )
    return frozenset(names)


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@functools.cache
def settings_defaults() -> dict[str, Any]:
    """Default of every setting, by its flag and by its variable."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        out[flag_of(f)] = out[env_of(f)] = _default(f)
    return out


@functools.cache
def model_defaults() -> dict[str, list[Any]]:
    """Defaults of the spec's fields, by camelCase name and by spec.path (a name may repeat)."""
    out: dict[str, list[Any]] = {}

    def walk(model: type[BaseModel], path: str) -> None:
        for name, field in model.model_fields.items():
            alias = field.alias or name
            sub = field.annotation
            full = f"{path}.{alias}"
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                walk(sub, full)
                continue
            default = field.get_default(call_default_factory=True)
            out.setdefault(alias, []).append(default)
            out.setdefault(full, []).append(default)

    walk(models.MultisliceJobSpec, "spec")
    return out


# Names of Kubernetes, JobSet, Kueue and GKE the docs may name, with whose they are: the code
# does not spell them, the docs explain them.
EXTERNAL_NAMES = {
    # Kubernetes
    "BackoffLimitExceeded": "Job", "FailedCreate": "Job controller event",
    "PodScheduled": "pod condition", "DisruptionTarget": "pod condition",
    "PreemptionByScheduler": "DisruptionTarget reason", "TerminationByKubelet": "idem",
    "DeletionByTaintManager": "idem", "EvictionByEvictionAPI": "idem", "DeletionByPodGC": "idem",
    "OwnerReferencesPermissionEnforcement": "admission plugin", "ClusterFirstWithHostNet": "DNS",
    "ReadWriteOnce": "PVC", "PersistentVolumeClaim": "kind", "ResourceQuota": "kind",
    "RoleBinding": "kind", "ClusterRole": "kind", "ClusterRoleBinding": "kind",
    "ServiceAccount": "kind", "ConfigMap": "kind", "ServiceMonitor": "Prometheus Operator",
    "CustomResourceDefinition": "kind", "PodTemplateSpec": "type", "DeleteOptions": "kind",
    "RuntimeDefault": "seccomp", "ImagePullBackOff": "kubelet", "ErrImagePull": "kubelet",
    # JobSet
    "FailJobSetFailurePolicyAction": "JobSet", "ReachedMaxRestarts": "JobSet",
    "FailedJobs": "JobSet", "RestartJobSetAndIgnoreMaxRestarts": "JobSet",
    "RestartJobSet": "JobSet", "FailJobSet": "JobSet", "BlockingRecreate": "JobSet",
    "InPlaceRestart": "JobSet KEP 467",
    # Kueue
    "ResourceFlavor": "Kueue", "ClusterQueue": "Kueue", "LocalQueue": "Kueue",
    "AdmissionCheck": "Kueue", "WorkloadPriorityClass": "Kueue", "ProvisioningRequest": "Kueue",
    "QuotaReserved": "Kueue", "StrictFIFO": "Kueue", "BestEffortFIFO": "Kueue",
    "LowerPriority": "Kueue", "ReclaimablePods": "Kueue", "VisibilityOnDemand": "Kueue",
    "RequeueState": "Kueue", "Started": "Kueue event", "Reactivated": "Kueue",
    "GetQueueOrderTimestamp": "Kueue source", "IsEvictedByAdmissionCheck": "Kueue source",
    # Argo CD, Flux, Helm
    "CreateReplace": "Flux", "ServerSideApply": "Argo CD", "IgnoreExtraneous": "Argo CD",
    "OutOfSync": "Argo CD", "HelmRelease": "Flux", "ApplyOutOfSyncOnly": "Argo CD",
    # GKE / Compute Engine
    "ZONE_RESOURCE_POOL_EXHAUSTED": "GCE",
}  # fmt: skip


@functools.cache
def decide_reasons() -> frozenset[str]:
    """Every reason decide() gives: its registry (reconcile/reasons.py)."""
    from multislice_operator.reconcile.reasons import Reason

    return frozenset(r.value for r in Reason)


@functools.cache
def packaging_words() -> frozenset[str]:
    """Names in the chart and the Dockerfiles (values, settings of the image)."""
    texts = [p.read_text() for p in (ROOT / "charts").rglob("*") if p.suffix in (".yaml", ".tpl")]
    texts += [(ROOT / "Dockerfile").read_text(), (ROOT / "workload" / "Dockerfile").read_text()]
    return frozenset(w for t in texts for w in re.findall(r"[A-Za-z][A-Za-z0-9_]+", t))


@functools.cache
def known_names() -> frozenset[str]:
    enums = {
        str(v.value)
        for e in (
            models.Phase,
            models.ConditionType,
            models.SlicePhase,
            models.CapacityType,
            models.ExitCodePolicy,
        )
        for v in e
    }
    enums |= set(REGISTRY.modes()) | set(REGISTRY.names())  # the plugins' modes and strategies
    return frozenset(
        code_strings() | enums | set(EXTERNAL_NAMES) | decide_reasons() | packaging_words()
    )


# ---------------------------------------------------------------- what the docs name


def _fenced(text: str) -> list[tuple[int, str, str]]:
    """(first line, language, body) of every fenced block."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)", lines[i])
        if not m:
            i += 1
            continue
        start, lang, body = i + 1, m.group(1), []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i])
            i += 1
        out.append((start + 1, lang, "\n".join(body)))
        i += 1
    return out


def prose(text: str) -> str:
    """The text outside fenced blocks (same line numbers: blocks become empty lines)."""
    lines = text.splitlines()
    inside = False
    for i, line in enumerate(lines):
        fence = line.strip().startswith("```")
        if fence or inside:
            lines[i] = ""
        if fence:
            inside = not inside
    return "\n".join(lines)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def shell_lines(text: str) -> list[tuple[int, str]]:
    """Shell command lines: in sh/bash/console/plain fences (continuations joined, comments
    dropped), and inline code spans of prose."""
    out: list[tuple[int, str]] = []
    for start, lang, body in _fenced(text):
        if lang not in ("", "sh", "bash", "console", "shell"):
            continue
        joined, first = "", start
        for n, raw in enumerate(body.splitlines()):
            line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
            if not joined:
                first = start + n
            if line.endswith("\\"):
                joined += line[:-1] + " "
                continue
            joined += line
            if joined.strip():
                out.append((first, joined.strip()))
            joined = ""
    text_only = prose(text)
    for m in re.finditer(r"`([^`\n]+)`", text_only):
        out.append((_line(text_only, m.start()), m.group(1).strip()))
    return out


def _tokens(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _commands(line: str) -> list[list[str]]:
    parts = re.split(r"\s(?:\||&&|;|\|\|)\s|&\s*$", line)
    return [t for t in (_tokens(p) for p in parts) if t]


def _flag(token: str) -> str | None:
    m = re.match(r"^(--[a-z][a-z0-9-]*[a-z0-9])(=.*)?$", token)
    return m.group(1) if m else None


def _check_tokens(tokens: list[str], where: str) -> list[Finding]:
    while tokens and re.match(r"^[A-Z_]+=", tokens[0]):
        tokens = tokens[1:]  # VAR=value prefixes
    if not tokens:
        return []
    head = tokens[0].removeprefix(".venv/bin/")
    flags = [f for f in (_flag(t) for t in tokens[1:]) if f]
    if head in ("multislice-operator", "kubectl-msj") or tokens[:2] == ["kubectl", "msj"]:
        rest = tokens[2:] if head == "kubectl" else tokens[1:]
        word = next((t for t in rest if not t.startswith("-")), "")
        if word in ("...", "…"):  # `kubectl msj ...`: the program, no verb named
            return []
        commands = operator_commands()
        found = []
        for sub in word.split("/"):  # `kubectl msj validate/plan/render`
            if sub not in commands:
                found.append(
                    Finding(where, f"`{head} {sub}`: no such command ({sorted(commands)})")
                )
                continue
            known = commands[sub] | commands[""]
            found += [Finding(where, f"`{head} {sub}` has no flag {f}") for f in flags
                      if f not in known]  # fmt: skip
        return found
    if head == "multislice-local":
        sub = tokens[1] if len(tokens) > 1 else ""
        if sub not in local_commands():
            return [Finding(where, f"`multislice-local {sub}`: no such command")]
        return [
            Finding(where, f"`multislice-local {sub}` has no flag {f}")
            for f in flags
            if f not in local_commands()[sub] | {"--help"}
        ]
    if head in ("python", "python3") and len(tokens) > 2 and tokens[1] == "-m":
        module = tokens[2]
        ours = module.split(".")[0] in ("benchmarks", "multislice_local", "multislice_operator")
        if not ours:
            return []
        known = module_flags().get(module) or (
            operator_commands()["run"] if module == "multislice_operator.cli.main" else set()
        )
        return [Finding(where, f"`python -m {module}` has no flag {f}") for f in flags
                if f not in known | {"--help"}]  # fmt: skip
    if head == "make":
        found = []
        for t in tokens[1:]:
            if "=" in t:
                var = t.split("=", 1)[0]
                if var not in make_variables():
                    found.append(Finding(where, f"`make`: no variable {var}"))
            elif not t.startswith("-") and t not in make_targets():
                found.append(Finding(where, f"`make {t}`: no such target"))
        return found
    if head.endswith("build-bins.sh"):
        return [Finding(where, f"build-bins.sh has no option {f}") for f in flags
                if f not in script_flags()]  # fmt: skip
    if _flag(tokens[0]):  # a flag named alone in prose: one of ours (or a named neighbour's)
        flag = _flag(tokens[0])
        if flag not in all_our_flags() and flag not in EXTERNAL_FLAGS:
            return [Finding(where, f"no command of ours has the flag {flag}")]
    return []


# Flags of other tools the docs name alone in prose, with the tool.
EXTERNAL_FLAGS = {
    "--restart-on-exit-codes": "xpk workload create",
    "--workload-metadata": "gcloud container node-pools create (as xpk runs it)",
    "--tpu-topology": "gcloud container node-pools create",
    "--enable-gvnic": "gcloud container node-pools create (as xpk runs it)",
    "--reservation": "gcloud container node-pools create",
    "--set": "helm install / helm upgrade",
    "--authorization-mode": "kube-apiserver (the real nodes' control plane)",
    "--enable-aggregator-routing": "kube-apiserver (the real nodes' control plane)",
}


def check_commands(text: str, name: str = "doc") -> list[Finding]:
    found = []
    for line, command in shell_lines(text):
        for tokens in _commands(command):
            found += _check_tokens(tokens, f"{name}:{line}")
    return found


ENV_RE = re.compile(
    r"\b((?:MSJ|MULTISLICE|MEGASCALE|TPU_WORKER|JAX_COORDINATOR|JAX_PROCESS)_?[A-Z0-9_]*)(\*)?"
)


def check_environment(text: str, name: str = "doc") -> list[Finding]:
    found = []
    names = environment_names()
    for m in ENV_RE.finditer(text):
        var, star = m.group(1), m.group(2)
        if star or var.endswith("_"):
            if not any(n.startswith(var) for n in names):
                found.append(Finding(f"{name}:{_line(text, m.start())}", f"no variable {var}*"))
        elif var not in names:
            found.append(Finding(f"{name}:{_line(text, m.start())}", f"no variable {var}"))
    return found


DEFAULT_RE = re.compile(
    r"`(?P<name>--[a-z][a-z0-9-]*|spec(?:\.[a-zA-Z]+)+|[a-z]+[A-Z][A-Za-z]*)`[^`()\n]{0,40}?"
    r"\(default:? `?(?P<value>[0-9][0-9.]*)`?"
)


def _same(a: Any, b: str) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == b


def check_defaults(text: str, name: str = "doc") -> list[Finding]:
    found = []
    for m in DEFAULT_RE.finditer(prose(text)):
        key, value = m.group("name"), m.group("value")
        where = f"{name}:{_line(text, m.start())}"
        if key.startswith("--"):
            if key not in settings_defaults() and key in verb_defaults():
                if not _same(verb_defaults()[key], value):
                    found.append(Finding(where, f"{key} defaults to {verb_defaults()[key]}, "
                                                f"not {value}"))  # fmt: skip
                continue
            if key not in settings_defaults():
                found.append(Finding(where, f"{key} is not a setting with a default"))
            elif not _same(settings_defaults()[key], value):
                found.append(Finding(where, f"{key} defaults to {settings_defaults()[key]}, "
                                            f"not {value}"))  # fmt: skip
            continue
        defaults = model_defaults().get(key)
        if defaults is None:
            found.append(Finding(where, f"{key}: no such spec field"))
        elif not any(_same(d, value) for d in defaults):
            found.append(Finding(where, f"{key} defaults to {defaults}, not {value}"))
    return found


def _listed(text: str, start: int) -> list[tuple[int, str]]:
    """The backticked words right after `start`: `A`, `B` or `C` (with their positions)."""
    out = []
    pos = start
    pattern = re.compile(r"\s*(?:\(|:|,|/|or\b|and\b|is\b|goes\b|to\b)?\s*`([A-Za-z]+)`")
    while True:
        m = pattern.match(text, pos)
        if not m:
            return out
        out.append((m.start(1), m.group(1)))
        pos = m.end()


WORDS = {
    "phase": ("phase", "phases"),
    "condition": ("condition", "conditions"),
}


def check_states(text: str, name: str = "doc") -> list[Finding]:
    """Phases after "phase", conditions after "condition", `Type=True|False`, reasons in
    `True`/`False` `Reason` rows and after "reason", and every backticked CamelCase name."""
    body = prose(text)
    phases = {p.value for p in models.Phase}
    conditions = {c.value for c in models.ConditionType}
    known = known_names()
    found: list[Finding] = []

    def report(pos: int, what: str) -> None:
        found.append(Finding(f"{name}:{_line(body, pos)}", what))

    slice_phases = {p.value for p in models.SlicePhase}
    for m in re.finditer(r"\b(slice\s+)?phases?\b", body):
        valid = slice_phases if m.group(1) else phases
        for pos, word in _listed(body, m.end()):
            if word[0].isupper() and word not in valid:
                report(pos, f"phase `{word}` is not a phase ({sorted(valid)})")
    for m in re.finditer(r"\b(?:reasons?|events?)\b", body):
        for pos, word in _listed(body, m.end()):
            if word[0].isupper() and word not in known:
                report(pos, f"reason `{word}` is named nowhere in the code")
    for m in re.finditer(r"`(?:True|False)` `([A-Za-z]+)`", body):
        if m.group(1) not in known:
            report(m.start(1), f"reason `{m.group(1)}` is named nowhere in the code")
    for m in re.finditer(r"\bconditions?\b", body):
        for pos, word in _listed(body, m.end()):
            if word[0].isupper() and word not in conditions | known:
                report(pos, f"condition `{word}` does not exist")
    for m in re.finditer(r"`([A-Z][A-Za-z]+)=(True|False)`", body):
        if m.group(1) not in conditions | known:
            report(m.start(), f"condition `{m.group(1)}` does not exist")
    for m in re.finditer(r"`([A-Z][a-zA-Z]*[A-Z][A-Za-z]*)`", body):
        if m.group(1) not in known:
            report(m.start(), f"`{m.group(1)}` is named nowhere in the code")
    return found


def yaml_blocks(text: str) -> list[tuple[int, str]]:
    return [(line, body) for line, lang, body in _fenced(text) if lang in ("yaml", "yml")]


# ---------------------------------------------------------------- metric label values (issue 44)


def _exposed(metric: Any) -> str:
    """The name Prometheus sees: the client keeps a counter's name without `_total`."""
    return f"{metric._name}_total" if metric._type == "counter" else str(metric._name)


def _strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _literal_label_values(metrics: Any) -> dict[tuple[str, str], set[str]]:
    """The label values written as literals at `METRIC.labels(...)` calls of the operator, one
    call deep: an argument that is a parameter of the calling function takes the literals its
    callers in the same module pass (applier's `_count("create", ...)`)."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in sorted((ROOT / "operator").rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)] + [tree]:
            params = [a.arg for a in fn.args.args] if isinstance(fn, ast.FunctionDef) else []
            for call in ast.walk(fn):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                    continue
                owner = call.func.value
                var = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                metric = getattr(metrics, var, None) if call.func.attr == "labels" else None
                if isinstance(metric, metrics.PerNamespace):
                    metric, labels = metric.metric, metric.metric._labelnames[1:]
                elif metric is not None and hasattr(metric, "_labelnames"):
                    labels = metric._labelnames
                else:
                    continue
                for label, arg in zip(labels, call.args, strict=False):
                    values = _strings(arg)
                    if isinstance(arg, ast.Name) and arg.id in params:
                        at = params.index(arg.id)
                        for c in calls:
                            if getattr(c.func, "id", None) == fn.name and len(c.args) > at:  # type: ignore[union-attr]
                                values |= _strings(c.args[at])
                    found.setdefault((_exposed(metric), label), set()).update(values)
    return found


@functools.cache
def emitted_label_values() -> dict[tuple[str, str], frozenset[str]]:
    """(metric, label) -> every value the operator can give that label: the label sets preset at
    0 (registered when the reconciler is imported), the literals at `.labels(...)` calls, and the
    enums the scrape-time collectors read (a job's phase, a goodput state)."""
    from multislice_operator.controller import metrics, reconciler  # noqa: F401 (the presets)

    found = _literal_label_values(metrics)
    for per in metrics._PER_NAMESPACE:
        labels = per.metric._labelnames[1:]
        for values in per.presets:
            for label, value in zip(labels, per.full(values), strict=True):
                found.setdefault((_exposed(per.metric), label), set()).add(value)
    found[("multislice_jobs", "phase")] = {str(p) for p in models.Phase}
    for name in ("multislice_job_state_seconds_total", "multislice_job_state_chip_seconds_total"):
        found[(name, "state")] = {str(s) for s in models.GoodputState}
    return {key: frozenset(values) for key, values in found.items()}


def _named_label_values(text: str) -> list[tuple[int, str, str, str]]:
    """(offset, metric, label, value) for `metric{label="value"}` selectors and for the value
    lists of docs/metrics.md's table (`label`: `a`, `b`; words in parentheses are remarks)."""
    named: list[tuple[int, str, str, str]] = []
    for m in re.finditer(r"\b(multislice_\w+)\{([^}]*)\}", text):
        for pair in re.finditer(r'(\w+)\s*=\s*"([^"]*)"', m.group(2)):
            named.append((m.start(), m.group(1), pair.group(1), pair.group(2)))
    for row in re.finditer(r"^\| `(multislice_\w+)` \| \w+ \| ([^|\n]*) \|", text, re.MULTILINE):
        column = re.sub(r"<!--.*?-->|\([^)]*\)", "", row.group(2))
        for part in column.split(";"):
            if values := re.match(r"\s*`(\w+)`:(.*)", part):
                for value in re.findall(r"`([^`]+)`", values.group(2)):
                    named.append((row.start(), row.group(1), values.group(1), value))
    return named


def check_metric_labels(text: str, name: str = "doc") -> list[Finding]:
    """Every metric label value a page names is one the operator can emit."""
    emitted = emitted_label_values()
    found = []
    for pos, metric, label, value in _named_label_values(text):
        where = f"{name}:{_line(text, pos)}"
        if (metric, label) not in emitted:
            found.append(Finding(where, f"{metric}{{{label}}}: the code gives no values to check"))
        elif value not in emitted[(metric, label)]:
            can = ", ".join(sorted(emitted[(metric, label)]))
            found.append(Finding(where, f'{metric}{{{label}="{value}"}} is never emitted ({can})'))
    return found


# ---------------------------------------------------------------- chart resource names (issue 44)


def chart_names(rendered: list[dict[str, Any]]) -> set[str]:
    """The names a rendered chart gives: every object's, and the `resourceNames` its roles grant
    (the leader-election and heartbeat Leases, made by the operator at run time)."""
    names = {d["metadata"]["name"] for d in rendered}
    for d in rendered:
        for rule in d.get("rules", []) if d["kind"] in ("Role", "ClusterRole") else []:
            names.update(rule.get("resourceNames", []))
    return names


def check_chart_names(
    text: str, name: str, rendered: set[str], release: str, fullname: str
) -> list[Finding]:
    """Every `<release>-...` / `<fullname>-...` name a page writes is rendered by the chart for a
    release named `release` (whose fullname is `fullname`)."""
    found = []
    for m in re.finditer(r"`(<(?:release|fullname)>[\w.<>-]*)`", text):
        written = m.group(1).rstrip(".")
        resolved = written.replace("<release>", release).replace("<fullname>", fullname)
        if resolved not in rendered:
            found.append(
                Finding(
                    f"{name}:{_line(text, m.start())}",
                    f"`{written}` ({resolved} for release {release}) is not a name the chart "
                    "renders",
                )
            )
    return found
