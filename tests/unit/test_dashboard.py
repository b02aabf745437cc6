"""The chart's Grafana dashboard asks only for what the operator exports, by labels it has."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from multislice_operator.controller import metrics

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "charts/multislice-operator/dashboards/goodput.json"
)
METRIC = re.compile(r"\b(multislice_[a-z_]+)\b")
BY = re.compile(r"\bby \(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")


def exported() -> dict[str, set[str]]:
    """Every series name the operator serves, with its label names."""
    out: dict[str, set[str]] = {}
    for obj in vars(metrics).values():
        if isinstance(obj, metrics.PerNamespace):
            obj = obj.metric
        if isinstance(obj, MetricWrapperBase):
            name, labels = obj._name, set(obj._labelnames)
            if obj._type == "counter":
                out[f"{name}_total"] = labels
            elif obj._type == "histogram":
                for suffix in ("_bucket", "_sum", "_count"):
                    out[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
            else:
                out[name] = labels
    for obj in vars(metrics).values():
        describe = getattr(obj, "describe", None)
        if isinstance(obj, MetricWrapperBase) or not callable(describe) or isinstance(obj, type):
            continue
        if type(obj).__module__ == metrics.__name__:  # the operator's own collectors
            for family in describe():
                out[family.name] = set(family._labelnames)  # type: ignore[attr-defined]
    return out


def panels() -> list[dict[str, Any]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


def test_every_panel_queries_only_metrics_the_operator_exports():
    served = exported()
    assert panels()
    for panel in panels():
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            names = METRIC.findall(expr)
            assert names, (panel["title"], expr)
            for name in names:
                assert name in served, (panel["title"], name)
            labels = set().union(*(served[n] for n in names))
            for group in BY.findall(expr):
                for label in filter(None, (g.strip() for g in group.split(","))):
                    assert label in labels, (panel["title"], label)
            for matchers in MATCHERS.findall(expr):
                for matcher in filter(None, matchers.split(",")):
                    label = re.split(r"[=!~]", matcher.strip(), maxsplit=1)[0]
                    assert label in labels, (panel["title"], label)
            for legend in re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")):
                assert legend in labels, (panel["title"], legend)


def test_the_dashboard_covers_the_goodput_questions():
    titles = " | ".join(p["title"] for p in panels())
    for topic in (
        "goodput",
        "Time by state",
        "Chips held by state",
        "Restarts by cause",
        "Gang attempts and rollbacks",
        "Node pools held",
        "Restart recovery time",
        "Steps lost",
        "Time to first running",
    ):
        assert topic in titles, topic
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))


def test_the_namespace_variable_reads_a_per_job_series():
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    (name,) = METRIC.findall(variables["namespace"]["query"])
    assert "namespace" in exported()[name]


def test_every_panel_follows_the_namespace_filter():
    """Each series a panel reads is filtered by the $namespace variable, and can be: the
    operator labels it with the job's namespace."""
    served = exported()
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"]
            for name, matchers in re.findall(r"\b(multislice_[a-z_]+)(?:\{([^}]*)\})?", expr):
                assert "namespace" in served[name], (panel["title"], name)
                assert 'namespace=~"$namespace"' in matchers, (panel["title"], expr)
