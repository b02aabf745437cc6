"""The pod template checked against Kubernetes' own schema, at every depth.

`kubeschema.json` (package data) is the closure of `io.k8s.api.core.v1.PodTemplateSpec` in the
OpenAPI v3 document of the Kubernetes version we target (k8s.io/kubernetes in
hack/tools/kube/go.mod, `api/openapi-spec/v3/api__v1_openapi.json`), reduced to what validation
needs: each type's fields, their types and its required fields. It is generated
(`make kube-schema`); tests/unit/test_kubeschema.py fails when its version is not go.mod's and
tests/integration/test_kubeschema_source.py when it differs from a fresh generation. The CLI thus
needs no Kubernetes client library.

What it refuses is what the apiserver refuses once the operator creates the JobSet (whose CRD is
generated from the same Go types): an unknown field (`resources.limitz`, `runAsUsr`), a wrong type
(`args: 5`), a missing required field, a quantity that is not one.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from importlib import resources
from typing import Any

from multislice_operator.common.errors import FieldError

SOURCE_MODULE = "k8s.io/kubernetes"
SOURCE_FILE = "api/openapi-spec/v3/api__v1_openapi.json"
ROOT_TYPE = "io.k8s.api.core.v1.PodTemplateSpec"
DATA_FILE = "kubeschema.json"
# resource.Quantity's grammar (its doc comment; the pattern Kubernetes' generated CRDs carry).
QUANTITY_RE = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

# ---------------------------------------------------------------- generation (from OpenAPI v3)

_SPECIAL = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": "quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": "int-or-string",
}


def _short(ref: str) -> str:
    return ref.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def _ref_of(prop: dict[str, Any]) -> str | None:
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    for sub in prop.get("allOf") or []:
        if "$ref" in sub:
            return str(sub["$ref"]).rsplit("/", 1)[-1]
    return None


def _type(prop: dict[str, Any], schemas: dict[str, Any], todo: list[str]) -> Any:
    """One field's type, compactly: a scalar name, {"ref": T}, {"array": X} or {"map": X}."""
    ref = _ref_of(prop)
    if ref is not None:
        if ref in _SPECIAL:
            return _SPECIAL[ref]
        target = schemas[ref]
        if "properties" not in target:  # Time, FieldsV1, RawExtension: a plain JSON type
            return _scalar(target)
        todo.append(ref)
        return {"ref": _short(ref)}
    kind = prop.get("type")
    if kind == "array":
        return {"array": _type(prop["items"], schemas, todo)}
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return {"map": _type(prop["additionalProperties"], schemas, todo)}
    return _scalar(prop)


def _scalar(prop: dict[str, Any]) -> str:
    kind, fmt = prop.get("type"), prop.get("format")
    if kind == "integer":
        return "int32" if fmt == "int32" else "int64"
    if kind in ("string", "number", "boolean", "object"):
        return str(kind)
    raise ValueError(f"unexpected OpenAPI type {prop!r}")


def generate(openapi: dict[str, Any], version: str) -> dict[str, Any]:
    """The compact schema of PodTemplateSpec and every type under it."""
    schemas = openapi["components"]["schemas"]
    types: dict[str, Any] = {}
    names: dict[str, str] = {}
    todo = [ROOT_TYPE]
    while todo:
        full = todo.pop()
        short = _short(full)
        if short in types:
            if names[short] != full:
                raise ValueError(f"two types named {short}: {names[short]}, {full}")
            continue
        names[short] = full
        schema = schemas[full]
        props = schema.get("properties") or {}
        types[short] = {
            "properties": {k: _type(v, schemas, todo) for k, v in sorted(props.items())},
            "required": sorted(schema.get("required") or []),
        }
    return {
        "source": f"{SOURCE_MODULE}@{version} {SOURCE_FILE}",
        "root": _short(ROOT_TYPE),
        "types": dict(sorted(types.items())),
    }


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


# ---------------------------------------------------------------- checking


@functools.cache
def load() -> dict[str, Any]:
    text = resources.files("multislice_operator.api").joinpath(DATA_FILE).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def source_version() -> str:
    """The Kubernetes version the shipped schema was generated from (hack/tools/kube/go.mod)."""
    return str(load()["source"].split("@", 1)[1].split(" ", 1)[0])


# JSON's type of a Python value, in this order (a bool is an int to Python, not to JSON).
_JSON_TYPES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _json_type(value: Any) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)),
                type(value).__name__)  # fmt: skip


def describe(kind: Any) -> str:
    """A type as a person reads it: 'a list of strings', 'a Container object'."""
    if isinstance(kind, dict):
        if "ref" in kind:
            return f"a {kind['ref']} object"
        if "array" in kind:
            inner = describe(kind["array"])
            return "a list of " + (inner[2:] if inner.startswith("a ") else inner) + "s"
        return "a map of string keys to " + describe(kind["map"]).removeprefix("a ") + " values"
    return {
        "string": "a string",
        "int32": "an integer",
        "int64": "an integer",
        "number": "a number",
        "boolean": "a boolean (true or false)",
        "object": "an object",
        "quantity": "a quantity (e.g. 4, 500m, 16Gi)",
        "int-or-string": "an integer or a string",
    }[kind]


class _Walker:
    def __init__(self, limit: int) -> None:
        self.types: dict[str, Any] = load()["types"]
        self.errors: list[FieldError] = []
        self.limit = limit

    def add(self, path: str, message: str) -> None:
        if len(self.errors) < self.limit:
            self.errors.append(FieldError(path, message))

    def wrong(self, kind: Any, value: Any, path: str) -> None:
        got = _json_type(value)
        self.add(path, f"must be {describe(kind)}, got {got} {_short_repr(value)}")

    def walk(self, kind: Any, value: Any, path: str) -> None:
        if value is None or len(self.errors) >= self.limit:
            return  # null: as absent (the apiserver drops a null field)
        if isinstance(kind, dict):
            self._composite(kind, value, path)
        else:
            self._scalar(kind, value, path)

    def _composite(self, kind: dict[str, Any], value: Any, path: str) -> None:
        if "ref" in kind:
            if not isinstance(value, dict):
                self.wrong(kind, value, path)
            else:
                self.object(kind["ref"], value, path)
        elif "array" in kind:
            if not isinstance(value, list):
                self.wrong(kind, value, path)
                return
            for i, item in enumerate(value):
                self.walk(kind["array"], item, f"{path}[{i}]")
        elif not isinstance(value, dict):
            self.wrong(kind, value, path)
        else:
            for key, item in value.items():
                if not isinstance(key, str):
                    self.add(f"{path}.{key}", f"a key must be a string, got {_json_type(key)}")
                self.walk(kind["map"], item, f"{path}.{key}")

    def _scalar(self, kind: str, value: Any, path: str) -> None:
        got = _json_type(value)
        if kind in ("int32", "int64"):
            low, high = INT32 if kind == "int32" else INT64
            if got != "integer":
                self.wrong(kind, value, path)
            elif not low <= value <= high:
                self.add(path, f"{value} is out of range for a {kind} ({low} to {high})")
        elif kind == "quantity":
            if got == "string" and not QUANTITY_RE.match(value):
                self.add(path, f"{value!r} is not a quantity (e.g. 4, 500m, 16Gi)")
            elif got == "number":
                self.add(
                    path, f"{value} is not an integer: write a fraction as a string: '{value}'"
                )
            elif got not in ("string", "integer"):
                self.wrong(kind, value, path)
        elif kind == "int-or-string":
            if got not in ("string", "integer"):
                self.wrong(kind, value, path)
        elif kind == "number":
            if got not in ("number", "integer"):
                self.wrong(kind, value, path)
        elif got != kind:
            self.wrong(kind, value, path)

    def object(self, name: str, value: dict[str, Any], path: str) -> None:
        spec = self.types[name]
        props: dict[str, Any] = spec["properties"]
        for key, item in value.items():
            if key in props:
                self.walk(props[key], item, f"{path}.{key}")
            else:
                self.add(f"{path}.{key}", _unknown_message(str(key), name, props))
        for key in spec["required"]:
            if value.get(key) is None:
                self.add(f"{path}.{key}", f"required: a {name} must have {key}")


def _short_repr(value: Any) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else ""
    return f"({text[:40]}{'...' if len(text) > 40 else ''})" if text else ""


def _unknown_message(key: str, type_name: str, props: dict[str, Any]) -> str:
    close = difflib.get_close_matches(key, sorted(props), n=1, cutoff=0.75)
    hint = f"did you mean {close[0]}?" if close else f"the fields are: {', '.join(sorted(props))}"
    return f"unknown field: a {type_name} has no field {key!r} (Kubernetes would refuse it); {hint}"


def check(template: Any, path: str = "spec.template", limit: int = 50) -> list[FieldError]:
    """Every place `template` breaks Kubernetes' PodTemplateSpec, by field path (at most
    `limit`: one mistake repeated in a long list is said often enough)."""
    walker = _Walker(limit)
    walker.walk({"ref": load()["root"]}, template, path)
    return walker.errors


def gomod_version(gomod: str) -> str:
    """The k8s.io/kubernetes version a tools go.mod pins (hack/tools/kube/go.mod)."""
    from pathlib import Path

    found = re.search(
        rf"^\s*(?:require\s+)?{re.escape(SOURCE_MODULE)} (v\S+)", Path(gomod).read_text(), re.M
    )
    if not found:
        raise ValueError(f"{gomod}: no {SOURCE_MODULE} requirement")
    return found.group(1)


def read_source(gomod: str) -> tuple[dict[str, Any], str]:
    """The OpenAPI document and version the schema is generated from: `go mod download` puts the
    pinned k8s.io/kubernetes module in the module cache (a no-op when it is there)."""
    import subprocess
    from pathlib import Path

    version = gomod_version(gomod)
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"{SOURCE_MODULE}@{version}"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    directory = Path(json.loads(done.stdout)["Dir"])
    return json.loads((directory / SOURCE_FILE).read_text()), version


def main(argv: list[str] | None = None) -> int:
    """Regenerate kubeschema.json from the go.mod given (`make kube-schema`)."""
    import sys
    from pathlib import Path

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m multislice_operator.api.kubeschema hack/tools/kube/go.mod")
        return 2
    openapi, version = read_source(args[0])
    Path(__file__).with_name(DATA_FILE).write_text(dumps(generate(openapi, version)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
