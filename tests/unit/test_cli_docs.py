"""Every `kubectl msj` verb is shown in the docs (docs/cli.md and the README's CLI section), and
the offline parts of the cluster verbs (tests/integration/test_cli_verbs.py runs them against
the real apiserver)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import pytest

from multislice_operator.cli import verbs as cli_verbs
from multislice_operator.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]


def verbs() -> list[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [v for v in sub.choices if v != "run"]


def test_every_verb_is_in_the_docs() -> None:
    cli_md, readme = (ROOT / "docs" / "cli.md").read_text(), (ROOT / "README.md").read_text()
    assert {"list", "logs", "events", "suspend", "resume", "checkpoint", "delete"} <= set(verbs())
    for verb in verbs():
        assert f"kubectl msj {verb} " in cli_md, verb
    for verb in ("list", "logs", "events", "suspend", "resume", "checkpoint", "delete", "status"):
        assert f"kubectl msj {verb} " in readme, verb


@pytest.mark.parametrize(
    ("kind", "name", "ours"),
    [
        ("MultisliceJob", "llm", True),
        ("JobSet", "llm", True),
        ("Job", "llm-slice-3", True),
        ("Pod", "llm-slice-3-12-ab1cd", True),
        ("Workload", "jobset-llm-0f3a9", True),
        ("MultisliceJob", "llm-2", False),
        ("JobSet", "llm-slice", False),  # another job named like one of our Jobs
        ("Pod", "llm-2-slice-0-0-ab1cd", False),
        ("Pod", "llm-slice-0-0-ab1cd-x", False),
        ("Job", "llm-slice-x", False),
        ("Workload", "jobset-llm-2-0f3a9", False),
    ],
)
def test_events_belong_to_the_job_by_kind_and_name(kind: str, name: str, ours: bool) -> None:
    event = {"involvedObject": {"kind": kind, "name": name}}
    assert cli_verbs._related("llm")(event) is ours


def test_delete_progress_names_the_pools_still_held() -> None:
    obj = {
        "metadata": {"finalizers": [cli_verbs.keys.FINALIZER, "other.example/hold"]},
        "status": {
            "message": "deleting: releasing 1 node pools first",
            "slices": [
                {"index": 0, "hosts": 4, "nodePool": "p0", "phase": "Pending"},
                {"index": 1, "hosts": 4, "nodePool": "p1", "phase": "Releasing"},
            ],
        },
    }
    assert cli_verbs.delete_progress(obj) == (
        "deleting: releasing 1 node pools first; node pools: p1 (Releasing); "
        "other finalizers: other.example/hold"
    )
    assert cli_verbs.delete_progress({"metadata": {}}) == "waiting for the operator"


@pytest.mark.parametrize(
    ("seconds", "shown"), [(5, "5s"), (59, "59s"), (60, "1m"), (7199, "119m"), (7200, "2h"),
                           (2 * 86400 - 1, "47h"), (2 * 86400, "2d")],
)  # fmt: skip
def test_age_reads_as_kubectl_prints_it(seconds: int, shown: str) -> None:
    now = datetime(2026, 1, 3, tzinfo=UTC)
    since = datetime.fromtimestamp(now.timestamp() - seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert cli_verbs.age(since, now) == shown
