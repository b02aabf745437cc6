"""The repo's Dockerfiles read as data: the offline image builder (:mod:`multislice_local.images`)
takes each image's runtime config (ENV, LABEL, USER, WORKDIR, ENTRYPOINT, CMD, EXPOSE) from the
Dockerfile itself, so the two cannot disagree, and lists the RUN/COPY instructions it reproduces
in code (a test fails when the Dockerfile gains or changes one the builder does not know).

Only what these Dockerfiles use is understood: one instruction per logical line (backslash
continuations), ``#`` comment lines, ``ARG NAME[=default]`` before and after ``FROM``, ``${NAME}``
and ``$NAME`` (no ``:-``/``:+`` forms outside RUN), JSON-form ENTRYPOINT/CMD, ``key=value``
ENV and LABEL pairs (shell-quoted values).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: RUN, COPY, ENV, ...
    args: str  # the rest of the logical line, continuations joined with one space


@dataclass
class Stage:
    """One FROM ... section: its base expression, its name and its instructions."""

    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def texts(self, *keywords: str) -> list[str]:
        """The stage's instructions of these keywords as `KEYWORD args` lines."""
        return [f"{i.keyword} {i.args}" for i in self.instructions if i.keyword in keywords]


@dataclass
class Dockerfile:
    global_args: dict[str, str]  # ARGs before the first FROM, with their defaults
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        """A stage by its AS name; "" is the last (the image a build produces)."""
        if not name:
            return self.stages[-1]
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"no stage {name!r}: {[s.name for s in self.stages]}")


def logical_lines(text: str) -> list[str]:
    """Instructions one per line: comment lines dropped, continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        line = (pending + stripped).strip()
        pending = ""
        if line:
            lines.append(line)
    if pending.strip():
        lines.append(pending.strip())
    return lines


def parse(path: Path) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            base, _, name = args.partition(" AS ")
            stages.append(Stage(base=base.strip(), name=name.strip()))
        elif not stages:
            if keyword != "ARG":
                raise ValueError(f"{path}: {keyword} before the first FROM")
            name, _, default = args.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, args))
    if not stages:
        raise ValueError(f"{path}: no FROM")
    return Dockerfile(global_args, stages)


def substitute(text: str, values: Mapping[str, str]) -> str:
    """`${NAME}` and `$NAME` replaced by their values (unknown names: empty, as Docker does)."""
    return _VAR.sub(lambda m: values.get(m.group(1) or m.group(2), ""), text)


def _pairs(args: str, values: Mapping[str, str]) -> dict[str, str]:
    """`k=v k2="v 2"` (ENV, LABEL) with variables substituted."""
    pairs = {}
    for token in shlex.split(substitute(args, values)):
        key, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"{token!r}: only the key=value form is understood")
        pairs[key] = value
    return pairs


def stage_args(
    dockerfile: Dockerfile, stage: Stage, build_args: Mapping[str, str]
) -> dict[str, str]:
    """The ARG values a stage sees at its end: its own ARG lines (a global ARG re-declared
    without a default takes the global default), overridden by `build_args`."""
    values: dict[str, str] = {}
    for ins in stage.instructions:
        if ins.keyword != "ARG":
            continue
        name, sep, default = ins.args.partition("=")
        if name in build_args:
            values[name] = build_args[name]
        elif sep:
            values[name] = substitute(default, values)
        else:
            values[name] = build_args.get(name, dockerfile.global_args.get(name, ""))
    return values


def runtime_config(
    dockerfile: Dockerfile, build_args: Mapping[str, str], base_env: Mapping[str, str]
) -> dict[str, Any]:
    """The OCI image config's `config` object the last stage declares, on top of a base whose
    environment is `base_env` (ENV overrides it key by key, as a build would)."""
    stage = dockerfile.stage("")
    args = stage_args(dockerfile, stage, build_args)
    env = dict(base_env)
    config: dict[str, Any] = {}
    labels: dict[str, str] = {}
    ports: dict[str, dict[str, Any]] = {}
    for ins in stage.instructions:
        values = {**args, **env}
        if ins.keyword == "ENV":
            env.update(_pairs(ins.args, values))
        elif ins.keyword == "LABEL":
            labels.update(_pairs(ins.args, values))
        elif ins.keyword in ("USER", "WORKDIR"):
            config["User" if ins.keyword == "USER" else "WorkingDir"] = substitute(ins.args, values)
        elif ins.keyword in ("ENTRYPOINT", "CMD"):
            config["Entrypoint" if ins.keyword == "ENTRYPOINT" else "Cmd"] = json.loads(ins.args)
        elif ins.keyword == "EXPOSE":
            for port in ins.args.split():
                ports[port if "/" in port else f"{port}/tcp"] = {}
    config["Env"] = [f"{k}={v}" for k, v in env.items()]
    if labels:
        config["Labels"] = labels
    if ports:
        config["ExposedPorts"] = ports
    return config
