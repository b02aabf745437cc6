"""The names the docs give the chart's objects, checked against `helm template` (issue 44): the
docs write `<release>-...` or `<fullname>-...`, which a release named other than the chart tells
apart. Needs only the project's helm binary (no control plane)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_chart import CHART, render
from tests.unit import doccheck

ROOT = Path(__file__).resolve().parents[2]
PAGES = [p.relative_to(ROOT).as_posix() for p in [*doccheck.doc_files(), CHART / "README.md"]]
RELEASE, FULLNAME = "prod", "prod-multislice-operator"  # a release not named like the chart
# Every optional object on, so that every name the docs can mean is rendered.
EVERYTHING: dict[str, Any] = {
    "metrics": {
        "reader": {"subjects": [{"kind": "ServiceAccount", "name": "p", "namespace": "mon"}]},
        "serviceMonitor": {"enabled": True},
        "podMonitoring": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "networkPolicy": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    },
    "podDisruptionBudget": {"enabled": True},
    "replicaCount": 2,
    "health": {"standbyReady": True},  # a budget over two replicas needs ready standbys
    "kueue": {"enabled": True, "admissionCheck": {"create": True}},
    "multikueue": {
        "role": "manager",
        "manager": {"create": True, "workers": [{"name": "w", "kubeconfigSecret": "w"}]},
    },
}
# A cluster is a MultiKueue manager or a worker: the worker's objects come from a second render.
WORKER: dict[str, Any] = {**EVERYTHING, "multikueue": {"role": "worker"}}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return {
        name
        for values in (EVERYTHING, WORKER)
        for name in doccheck.chart_names(
            render(tmp_path_factory.mktemp("chart"), values, release=RELEASE)
        )
    }


@pytest.mark.parametrize("page", PAGES)
def test_every_chart_name_in_the_docs_is_rendered(page: str, rendered: set[str]) -> None:
    text = (ROOT / page).read_text()
    findings = doccheck.check_chart_names(text, page, rendered, RELEASE, FULLNAME)
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.parametrize(
    "snippet",
    ["the `<release>-metrics-reader` ClusterRole", "the Lease `<fullname>-leader`"],
)
def test_the_name_check_fails_on_a_wrong_doc(snippet: str, rendered: set[str]) -> None:
    assert doccheck.check_chart_names(snippet, "wrong.md", rendered, RELEASE, FULLNAME)


def test_the_right_names_pass(rendered: set[str]) -> None:
    """The check resolves the placeholders as the chart does (else it would fail everything)."""
    right = (
        "`<fullname>-metrics-reader`, `<fullname>-heartbeat`, `<fullname>-jobset.multislice.dev`"
    )
    assert not doccheck.check_chart_names(right, "right.md", rendered, RELEASE, FULLNAME)
