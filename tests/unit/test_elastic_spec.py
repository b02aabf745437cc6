"""Elastic slice count and hot spare slices (issue 25): spec.elastic and spec.spares, their rules
at both levels (the CEL the apiserver runs, evaluated here by a small interpreter of the subset
those rules use, and their Python twins in the plan), and what the plan makes of them."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from multislice_operator.api import models
from multislice_operator.api.crd import generate_crd
from multislice_operator.cli.main import main
from multislice_operator.common import keys
from multislice_operator.common.errors import SpecError
from multislice_operator.planning.plan import load_job, make_plan, node_pool_name

TEMPLATE = {"spec": {"containers": [{"name": "c", "image": "i"}]}}
NEW_FIELDS = ("spec.elastic.minSlices", "spec.parallelism.dcn", "spec.spares")


def spec_dict(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "accelerator": "v5litepod-16",
        "slices": 4,
        "checkpoint": {"directory": "gs://bkt/ckpt"},
        "template": copy.deepcopy(TEMPLATE),
    }
    return {**base, **kw}


def spec(**kw: Any) -> models.MultisliceJobSpec:
    return models.MultisliceJobSpec.model_validate(spec_dict(**kw))


def plan(**kw: Any) -> Any:
    return make_plan(spec(**kw), "team", "llm")


def refusals(**kw: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as exc:
        plan(**kw)
    return {e.path: e.message for e in exc.value.errors}


# ---------------------------------------------------------------- a CEL subset, for the rules


class Cel:
    """An interpreter of the CEL the new rules use: has(), self.a.b, ints, 'strings', string(),
    [lists], ! && || ?: == != < <= > >= in + * / %. Enough to run the rules as written in the
    CRD, so that a misspelt field or a wrong operator fails here and not only on a real
    apiserver."""

    TOKEN = re.compile(
        r"\s*(?:(\d+)|'([^']*)'|([A-Za-z_]\w*)|(&&|\|\||==|!=|<=|>=|[!<>+*/%?:().,\[\]-]))"
    )

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, Any]] = []
        pos, text = 0, text.strip()
        while pos < len(text):
            m = self.TOKEN.match(text, pos)
            assert m and m.end() > pos, f"cannot read CEL at {text[pos:]!r}"
            number, string, ident, op = m.groups()
            if number is not None:
                self.tokens.append(("int", int(number)))
            elif string is not None:
                self.tokens.append(("str", string))
            elif ident is not None:
                self.tokens.append(("id", ident))
            else:
                self.tokens.append(("op", op))
            pos = m.end()
        self.i = 0
        self.fn = self.ternary()
        assert self.i == len(self.tokens), f"trailing CEL: {self.tokens[self.i :]}"

    def __call__(self, obj: dict[str, Any]) -> Any:
        return self.fn(obj)

    def peek(self, value: str) -> bool:
        return self.i < len(self.tokens) and self.tokens[self.i] == ("op", value)

    def take(self, value: str) -> None:
        assert self.peek(value), f"expected {value!r} at {self.tokens[self.i :]}"
        self.i += 1

    Fn = Callable[[dict[str, Any]], Any]

    def ternary(self) -> Fn:
        cond = self.binary(0)
        if not self.peek("?"):
            return cond
        self.take("?")
        yes = self.ternary()
        self.take(":")
        no = self.ternary()
        return lambda o: yes(o) if cond(o) else no(o)

    LEVELS: list[dict[str, Callable[[Any, Any], Any]]] = [
        {"||": lambda a, b: a or b},
        {"&&": lambda a, b: a and b},
        {
            "==": lambda a, b: a == b,
            "!=": lambda a, b: a != b,
            "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b,
            ">": lambda a, b: a > b,
            ">=": lambda a, b: a >= b,
        },
        {"+": lambda a, b: a + b, "-": lambda a, b: a - b},
        {"*": lambda a, b: a * b, "/": lambda a, b: a // b, "%": lambda a, b: a % b},
    ]

    def binary(self, level: int) -> Fn:
        if level == len(self.LEVELS):
            return self.unary()
        ops = self.LEVELS[level]
        left = self.binary(level + 1)
        if level == 2 and self.i < len(self.tokens) and self.tokens[self.i] == ("id", "in"):
            self.i += 1
            within = self.binary(level + 1)
            return (lambda a, b: lambda o: a(o) in b(o))(left, within)
        while self.i < len(self.tokens) and self.tokens[self.i][0] == "op":
            op = self.tokens[self.i][1]
            if op not in ops:
                break
            self.i += 1
            right = self.binary(level + 1)
            if op in ("||", "&&"):  # short-circuit, as CEL (an error on the skipped side)
                left = (
                    (lambda a, b: lambda o: a(o) or b(o))(left, right)
                    if op == "||"
                    else (lambda a, b: lambda o: a(o) and b(o))(left, right)
                )
            else:
                left = (lambda a, b, f: lambda o: f(a(o), b(o)))(left, right, ops[op])
        return left

    def unary(self) -> Fn:
        if self.peek("!"):
            self.take("!")
            inner = self.unary()
            return lambda o: not inner(o)
        return self.primary()

    def path(self) -> list[str]:
        assert self.tokens[self.i] == ("id", "self"), self.tokens[self.i :]
        self.i += 1
        parts = []
        while self.peek("."):
            self.take(".")
            kind, name = self.tokens[self.i]
            assert kind == "id"
            parts.append(name)
            self.i += 1
        return parts

    @staticmethod
    def lookup(obj: dict[str, Any], parts: list[str]) -> Any:
        for part in parts:
            if part not in obj:  # CEL: "no such key", an error the apiserver reports
                raise KeyError(".".join(parts))
            obj = obj[part]
        return obj

    def primary(self) -> Fn:
        kind, value = self.tokens[self.i]
        if kind in ("int", "str"):
            self.i += 1
            return lambda o: value
        if (kind, value) == ("op", "("):
            self.take("(")
            inner = self.ternary()
            self.take(")")
            return inner
        if (kind, value) == ("op", "["):
            self.take("[")
            items = [] if self.peek("]") else [self.ternary()]
            while self.peek(","):
                self.take(",")
                items.append(self.ternary())
            self.take("]")
            return lambda o: [item(o) for item in items]
        if (kind, value) == ("id", "has"):
            self.i += 1
            self.take("(")
            parts = self.path()
            self.take(")")
            return lambda o: parts[-1] in self.lookup(o, parts[:-1])
        if (kind, value) == ("id", "string"):
            self.i += 1
            self.take("(")
            inner = self.ternary()
            self.take(")")
            return lambda o: str(inner(o))
        parts = self.path()
        return lambda o: self.lookup(o, parts)


def new_rules() -> list[models.Rule]:
    rules = [
        r
        for r in models.spec_rules()
        if r.field in NEW_FIELDS and ("elastic" in r.cel or "spares" in r.cel)
    ]
    assert len(rules) == 5
    return rules


def crd_spec() -> dict[str, Any]:
    root = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec_schema: dict[str, Any] = root["properties"]["spec"]
    return spec_schema


def cel_refusals(obj: dict[str, Any]) -> list[str]:
    """What the apiserver would answer for spec `obj`: the message of every failing rule on spec
    (its messageExpression where it has one), as the CRD carries them."""
    out = []
    for rule in crd_spec()["x-kubernetes-validations"]:
        if not ("elastic" in rule["rule"] or "spares" in rule["rule"]) or "oldSelf" in rule["rule"]:
            continue
        if not Cel(rule["rule"])(obj):
            expr = rule.get("messageExpression")
            out.append(Cel(expr)(obj) if expr else rule["message"])
    return out


def test_the_interpreter_runs_cel_as_cel() -> None:
    obj = {"a": {"b": 7}, "s": "x"}
    assert Cel("has(self.a) && !has(self.c) && self.a.b % 4 == 3")(obj)
    assert Cel("self.a.b / 2 * 2 == 6 && 1 + 2 * 3 == 7")(obj)
    assert Cel("(has(self.c) ? self.c : 5) < self.a.b")(obj)
    assert Cel("'n=' + string(self.a.b) + self.s")(obj) == "n=7x"
    assert Cel("!has(self.c) || self.c.d == 1")(obj)  # the right side is never evaluated
    with pytest.raises(KeyError):
        Cel("self.c.d == 1")(obj)


# ---------------------------------------------------------------- the fields


def test_fields_defaults_and_limits() -> None:
    s = spec()
    assert s.elastic is None and s.spares == 0
    e = spec(elastic={"minSlices": 2}).elastic
    assert e is not None and (e.min_slices, e.wait_seconds) == (2, 600)
    props = crd_spec()["properties"]
    assert props["spares"] == {**props["spares"], "default": 0, "minimum": 0, "maximum": 16}
    elastic = props["elastic"]
    assert elastic["required"] == ["minSlices"]
    assert elastic["properties"]["minSlices"]["minimum"] == 1
    assert elastic["properties"]["minSlices"]["maximum"] == 255
    wait = elastic["properties"]["waitSeconds"]
    assert (wait["default"], wait["minimum"], wait["maximum"]) == (600, 0, 7 * 24 * 3600)


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"spares": 17}, "spec.spares"),
        ({"spares": -1}, "spec.spares"),
        ({"elastic": {"minSlices": 0}}, "spec.elastic.minSlices"),
        ({"elastic": {}}, "spec.elastic.minSlices"),
        ({"elastic": {"minSlices": 2, "waitSeconds": -1}}, "spec.elastic.waitSeconds"),
        ({"elastic": {"minSlices": 2, "grow": True}}, "spec.elastic.grow"),
    ],
)
def test_schema_refusals_name_the_field(change: dict[str, Any], path: str) -> None:
    obj = {"apiVersion": models.API_VERSION, "kind": models.KIND, "spec": spec_dict(**change)}
    with pytest.raises(SpecError) as exc:
        load_job(obj)
    assert [e.path for e in exc.value.errors] == [path]


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("slices", "dcn", "min_slices", "sizes"),
    [
        (4, {"pipeline": 2}, 2, [4, 2]),
        (4, {}, 1, [4, 3, 2, 1]),
        (4, {}, 3, [4, 3]),
        (8, {"fsdp": 2}, 2, [8, 6, 4, 2]),
        (8, {"fsdp": 2, "pipeline": 2}, 4, [8, 4]),
        (6, {"pipeline": 3}, 3, [6, 3]),
        (16, {"pipeline": 4}, 8, [16, 12, 8]),
        (4, {"data": 2, "pipeline": 2}, 2, [4, 2]),  # dcn.data set: it changes all the same
        (4, {}, None, [4]),  # not elastic: the one size
        (4, {"pipeline": 4}, None, [4]),
    ],
)
def test_allowed_sizes(
    slices: int, dcn: dict[str, int], min_slices: int | None, sizes: list[int]
) -> None:
    elastic = {"elastic": {"minSlices": min_slices}} if min_slices else {}
    p = plan(slices=slices, parallelism={"dcn": dcn}, **elastic)
    assert [s.slices for s in p.sizes] == sizes
    fixed = p.parallelism.dcn_fsdp * p.parallelism.dcn_pipeline * p.parallelism.dcn_tensor
    for size in p.sizes:
        par = size.parallelism
        assert par.dcn_data == size.slices // fixed
        assert (par.dcn_fsdp, par.dcn_pipeline, par.dcn_tensor) == (
            p.parallelism.dcn_fsdp,
            p.parallelism.dcn_pipeline,
            p.parallelism.dcn_tensor,
        )
        assert (par.ici_data, par.ici_fsdp, par.ici_tensor) == (1, 16, 1)
        assert size.chips == 16 * size.slices
    assert p.sizes[0].parallelism == p.parallelism and p.sizes[0].advice == p.advice
    if min_slices:
        assert p.elastic is not None and (p.elastic.min_slices, p.elastic.wait_seconds) == (
            min_slices,
            600,
        )
    else:
        assert p.elastic is None


def test_parallelism_at() -> None:
    p = plan(slices=8, parallelism={"dcn": {"pipeline": 2}}, elastic={"minSlices": 4})
    assert p.parallelism_at(8) == p.parallelism
    at6 = p.parallelism_at(6)
    assert (at6.dcn_data, at6.dcn_pipeline) == (3, 2)
    assert p.parallelism_at(4).dcn_data == 2
    for bad in (7, 5, 2, 9, 0):
        with pytest.raises(ValueError, match=f"cannot run on {bad} slices: 8, 6, 4"):
            p.parallelism_at(bad)
    fixed = plan(slices=2)
    assert fixed.parallelism_at(2) == fixed.parallelism
    with pytest.raises(ValueError):
        fixed.parallelism_at(1)


def test_each_size_has_its_own_dcn_advice() -> None:
    """The global batch stays: fewer slices, more tokens each (the advice of each size)."""
    batch = 1 << 22
    p = plan(
        slices=4,
        parallelism={"dcn": {"fsdp": 2}},
        elastic={"minSlices": 2},
        training={"globalBatchTokens": batch},
    )
    assert [(s.slices, s.advice.tokens_per_slice) for s in p.sizes] == [
        (4, batch // 4),
        (2, batch // 2),
    ]
    assert [s.advice.bits_per_parameter for s in p.sizes] == [32 / 2 + 32, 0 / 2 + 32]


# ---------------------------------------------------------------- spares


def test_spare_pools_are_apart_from_the_slices() -> None:
    p = plan(slices=2, spares=3)
    assert p.spares == 3 and [n.slice_index for n in p.node_pools] == [0, 1]
    assert [n.slice_index for n in p.spare_pools] == [2, 3, 4]
    assert [n.name for n in p.spare_pools] == [node_pool_name("team", "llm", i) for i in (2, 3, 4)]
    assert not {n.name for n in p.spare_pools} & {n.name for n in p.node_pools}
    first = p.node_pools[0]
    for pool in p.spare_pools:
        assert pool.node_labels == {
            keys.JOB_KEY: p.job_key,
            keys.JOB_NAME: "llm",
            keys.JOB_NAMESPACE: "team",
            keys.SLICE: str(pool.slice_index),
            keys.NODE_MANAGED_BY: keys.MANAGED_BY_VALUE,
        }
        same = ("node_count", "machine_type", "topology", "tpu_topology", "gke_accelerator")
        assert all(getattr(pool, f) == getattr(first, f) for f in same)
    assert (p.total_chips, p.spare_chips) == (32, 48)
    assert plan(slices=2).spare_pools == [] and plan(slices=2).spare_chips == 0


def test_spares_keep_the_capacity_of_the_slices() -> None:
    p = plan(slices=2, spares=1, capacity={"type": "Spot"})
    assert p.spare_pools[0].spot and p.node_pools[0].spot
    r = plan(slices=2, spares=1, capacity={"type": "Reserved", "reservation": "res"})
    assert r.spare_pools[0].reservation == "res"


def test_plan_as_dict_shows_sizes_and_the_cost_of_spares() -> None:
    p = plan(slices=4, spares=2, parallelism={"dcn": {"pipeline": 2}}, elastic={"minSlices": 2})
    d = json.loads(json.dumps(p.as_dict()))
    assert (d["slices"], d["totalChips"], d["spares"], d["spareChips"]) == (4, 64, 2, 32)
    assert d["elastic"] == {"minSlices": 2, "waitSeconds": 600}
    assert [(s["slices"], s["totalChips"]) for s in d["sizes"]] == [(4, 64), (2, 32)]
    assert [s["parallelism"]["dcn"]["data"] for s in d["sizes"]] == [2, 1]
    assert all(s["dcn"]["verdict"] for s in d["sizes"])
    assert [n["sliceIndex"] for n in d["sparePools"]] == [4, 5]
    assert len(d["nodePools"]) == 4
    plain = plan(slices=2).as_dict()
    assert (plain["elastic"], plain["spares"], plain["sparePools"]) == (None, 0, [])
    assert [s["slices"] for s in plain["sizes"]] == [2]


# ---------------------------------------------------------------- refusals, at both levels

GOOD = [
    {},
    {"elastic": {"minSlices": 2}},
    {"elastic": {"minSlices": 1, "waitSeconds": 0}},
    {"elastic": {"minSlices": 2}, "parallelism": {"dcn": {"pipeline": 2}}},
    {"spares": 16, "slices": 240},
    {"spares": 2, "provisioning": {"mode": "Managed"}},
    {"provisioning": {"mode": "Existing"}, "spares": 0},
]

BAD = [
    # (change, field, what the message must say) at both levels
    ({"elastic": {"minSlices": 4}}, "spec.elastic.minSlices", "less than spec.slices (4)"),
    ({"elastic": {"minSlices": 9}}, "spec.elastic.minSlices", "got 9"),
    ({"slices": 1, "elastic": {"minSlices": 1}}, "spec.elastic.minSlices", "less than spec.slices"),
    (
        {"elastic": {"minSlices": 1}, "parallelism": {"dcn": {"pipeline": 2}}},
        "spec.elastic.minSlices",
        "multiples of 2",
    ),
    (
        {
            "slices": 8,
            "elastic": {"minSlices": 3},
            "parallelism": {"dcn": {"fsdp": 2, "pipeline": 2}},
        },
        "spec.elastic.minSlices",
        "multiples of 4",
    ),
    (
        {"elastic": {"minSlices": 2}, "parallelism": {"dcn": {"pipeline": 4}}},
        "spec.parallelism.dcn",
        "cannot shrink",
    ),
    (
        {"elastic": {"minSlices": 1}, "parallelism": {"dcn": {"fsdp": 2, "pipeline": 2}}},
        "spec.parallelism.dcn",
        "cannot shrink",
    ),
    ({"spares": 1, "provisioning": {"mode": "Existing"}}, "spec.spares", "Managed"),
    (
        {"elastic": {"minSlices": 3}, "provisioning": {"mode": "Existing"}},
        "spec.elastic",
        "Managed",
    ),
    ({"slices": 250, "spares": 7}, "spec.spares", "at most 256"),
]


@pytest.mark.parametrize("change", GOOD)
def test_valid_specs_pass_both_levels(change: dict[str, Any]) -> None:
    obj = spec_dict(**change)
    s = models.MultisliceJobSpec.model_validate(obj)
    assert all(r.holds(s) for r in new_rules())
    make_plan(s, "team", "llm")
    assert cel_refusals(obj) == []
    assert cel_refusals(s.model_dump(by_alias=True, exclude_none=True, mode="json")) == []


@pytest.mark.parametrize(("change", "field", "says"), BAD)
def test_refusals_name_the_field_at_both_levels(
    change: dict[str, Any], field: str, says: str
) -> None:
    obj = spec_dict(**change)
    # The plan (validate, the operator): the field and the fix.
    found = refusals(**change)
    assert field in found, found
    assert says in found[field]
    assert not set(found) - {field}, found  # one error for one mistake
    # The apiserver: the same field, first in the message.
    for doc in (
        obj,
        models.MultisliceJobSpec.model_validate(obj).model_dump(
            by_alias=True, exclude_none=True, mode="json"
        ),
    ):
        messages = cel_refusals(doc)
        assert len(messages) == 1 and messages[0].startswith(field + " "), messages
        # Static at admission: a messageExpression on spec (string(int) concatenations) was
        # refused by the real apiserver's CEL cost estimate (over budget by more than 100x);
        # the plan's message above gives the sizes that work.
        if "multiples" in says:
            assert "multiples of dcn.fsdp x dcn.pipeline x dcn.tensor" in messages[0]


def test_cel_and_python_twins_agree() -> None:
    """Each rule's CEL and its Python twin on every spec of the tables (and a sweep)."""
    cases = [spec_dict(**c) for c in GOOD] + [spec_dict(**c) for c, _, _ in BAD]
    for slices in (1, 2, 4, 6, 8):
        for pipeline in (1, 2, 4):
            for low in range(1, 9):
                cases.append(
                    spec_dict(
                        slices=slices,
                        elastic={"minSlices": low},
                        parallelism={"dcn": {"pipeline": pipeline}},
                    )
                )
    for obj in cases:
        s = models.MultisliceJobSpec.model_validate(obj)
        for rule in new_rules():
            assert Cel(rule.cel)(obj) == rule.holds(s), (rule.field, rule.cel, obj)


def test_min_slices_message_lists_the_sizes_that_work() -> None:
    found = refusals(elastic={"minSlices": 1}, parallelism={"dcn": {"pipeline": 2}})
    assert "with dcn.pipeline 2 the sizes are multiples of 2: 2;" in found["spec.elastic.minSlices"]
    found = refusals(slices=12, elastic={"minSlices": 5}, parallelism={"dcn": {"fsdp": 2}})
    assert (
        "with dcn.fsdp 2 the sizes are multiples of 2: 2, 4, 6, 8, 10;"
        in (found["spec.elastic.minSlices"])
    )
    found = refusals(slices=256, elastic={"minSlices": 3}, parallelism={"dcn": {"pipeline": 2}})
    assert "multiples of 2: 2, 4, 6, 8, 10, 12, 14, ..., 254;" in found["spec.elastic.minSlices"]


def test_a_layout_that_does_not_divide_is_named_once() -> None:
    """dcn.pipeline 4 on 6 slices is no layout: the plan names spec.parallelism.dcn only."""
    found = refusals(slices=6, elastic={"minSlices": 2}, parallelism={"dcn": {"pipeline": 4}})
    assert (
        list(found) == ["spec.parallelism.dcn"] and "must equal 6" in found["spec.parallelism.dcn"]
    )


# ---------------------------------------------------------------- the CLI


def job_file(tmp_path: Any, **kw: Any) -> str:
    obj = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": "llm", "namespace": "team"},
        "spec": spec_dict(**kw),
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(obj))
    return str(path)


ELASTIC = {"spares": 1, "elastic": {"minSlices": 2}, "parallelism": {"dcn": {"pipeline": 2}}}


def test_validate_names_elasticity_and_the_cost_of_spares(tmp_path: Any, capsys: Any) -> None:
    assert main(["validate", "-f", job_file(tmp_path, **ELASTIC)]) == 0
    out = capsys.readouterr().out
    assert "team/llm: valid (4 x v5litepod-16, 64 chips, elastic down to 2 slices, " in out
    assert "1 spare slice (16 chips more), DCN " in out


def test_plan_text_shows_sizes_and_spare_pools(tmp_path: Any, capsys: Any) -> None:
    assert main(["plan", "-f", job_file(tmp_path, **ELASTIC)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^elastic +down to 2 slices after 600 s", out, re.M)
    assert re.search(r"^  at 4 slices +64 chips, dcn data 2; dcn advice ", out, re.M)
    assert re.search(r"^  at 2 slices +32 chips, dcn data 1; dcn advice ", out, re.M)
    assert re.search(
        r"^spares +1 hot spare slice, 16 chips held beside the job's 64 \(80 in all\)", out, re.M
    )
    spare = node_pool_name("team", "llm", 4)
    assert (
        "spare node pools (not used by the JobSet):\n"
        f"  {spare}  spare 4  4 x ct5lp-hightpu-4t  topology 4x4\n" in out
    )
    node_pools = out.split("node pools:\n")[1].split("spare node pools")[0]
    assert spare not in node_pools and node_pools.count("msj-") == 4


def test_plan_json_shows_sizes_and_spare_pools(tmp_path: Any, capsys: Any) -> None:
    assert main(["plan", "-f", job_file(tmp_path, **ELASTIC), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["slices"] for s in data["sizes"]] == [4, 2]
    assert (data["spares"], data["spareChips"], len(data["sparePools"])) == (1, 16, 1)


def test_plan_text_of_a_plain_job_is_unchanged(tmp_path: Any, capsys: Any) -> None:
    assert main(["plan", "-f", job_file(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "elastic" not in out and "spare" not in out
