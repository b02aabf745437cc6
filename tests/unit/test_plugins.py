"""Plugins written outside the package (issue 53): tests/plugins/labelled.py (a capacity model:
pools reserved for the job by a label; refuses spares, elastic and flex-start) and
tests/plugins/blocking.py (JobSet's BlockingRecreate), loaded as `MSJ_PLUGINS` loads them, run
through the spec rules, the CRD and docs, render, the controller's observation and decide()."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from multislice_operator.api import crd, docs
from multislice_operator.api.models import MultisliceJobStatus, Phase
from multislice_operator.common import keys
from multislice_operator.common.errors import SpecError
from multislice_operator.controller import observe as ob
from multislice_operator.planning.plan import job_key
from multislice_operator.reconcile import CreateJobSet, JobSetObservation, StrategySupport
from multislice_operator.reconcile import restart_strategy as rs
from multislice_operator.registry import ENV, PluginError, Registry, from_env
from multislice_operator.render.jobset import render_jobset, render_pod_template
from tests.plugins.labelled import RESERVED_FOR
from tests.unit import jobs
from tests.unit.test_elastic_spec import Cel

PLUGINS = ("tests.plugins.labelled:register", "tests.plugins.blocking:register")
NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)
KEY = job_key("ns", "job")  # jobs.body()'s job
LABELLED = {"provisioning": {"mode": "Labelled"}}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def loaded(registry: Registry) -> Iterator[Registry]:
    registry.load(PLUGINS)
    yield registry


def test_they_are_loaded_by_reference_from_outside_the_package(loaded: Registry) -> None:
    assert "Labelled" in loaded.modes() and "BlockingRecreate" in loaded.names()
    assert loaded.sources[-2:] == list(PLUGINS)
    for module in ("labelled", "blocking"):  # nothing of them is under operator/
        assert (ROOT / "tests" / "plugins" / f"{module}.py").is_file()
    assert from_env({ENV: f" {PLUGINS[0]} ,{PLUGINS[1]}"}) == list(PLUGINS)


def test_the_crd_and_the_docs_name_them_only_once_loaded(registry: Registry) -> None:
    def enums() -> tuple[list[str], list[str]]:
        spec, status = crd.spec_schema(), crd.status_schema()
        mode = spec["properties"]["provisioning"]["properties"]["mode"]["enum"]
        strategy = status["properties"]["lastRestart"]["properties"]["strategy"]["enum"]
        return mode, strategy

    assert enums() == (["Managed", "Existing", "DynamicSlicing", "Fallback"],
                       ["InPlaceRestart", "Recreate", "Resize"])  # fmt: skip
    registry.load(PLUGINS)
    assert enums() == (["Managed", "Existing", "DynamicSlicing", "Fallback", "Labelled"],
                       ["InPlaceRestart", "Recreate", "Resize", "BlockingRecreate"])  # fmt: skip
    reference = docs.generate()
    assert "### `Labelled`" in reference and f"`{RESERVED_FOR}=<job key>`" in reference
    assert "| `BlockingRecreate` | every pod deleted, none created again" in reference


# ------------------------------------------------------------------ the spec rules


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"spares": 1}, "spec.spares"),
        ({"elastic": {"minSlices": 1}}, "spec.elastic"),
        ({"capacity": {"type": "FlexStart"}}, "spec.capacity.type"),
    ],
)
def test_what_it_does_not_accept_is_refused_naming_the_field(
    loaded: Registry, fields: dict[str, Any], path: str
) -> None:
    with pytest.raises(SpecError) as err:
        jobs.spec_and_plan(**LABELLED, **fields)
    (e,) = err.value.errors
    assert e.path == path and "provisioning.mode Labelled does not accept it" in e.message
    # The apiserver's twin: the CRD's allow-list rules (on spec) refuse it, naming the field.
    spec = jobs.body(**LABELLED, **fields)["spec"]
    lists = [r for r in crd.spec_schema()["x-kubernetes-validations"] if " in [" in r["rule"]]
    assert len(lists) == 3  # spares, elastic, flex-start
    refused = [r["message"] for r in lists if not Cel(r["rule"])(spec)]
    assert len(refused) == 1 and refused[0].startswith(f"{path} needs provisioning.mode")
    assert "Labelled" not in refused[0]  # the modes that accept it are named, not this one


def test_the_same_job_is_valid_without_them(loaded: Registry) -> None:
    _, plan = jobs.spec_and_plan(**LABELLED)
    assert plan.mode == "Labelled" and plan.pools == []  # no pool of its own


# ------------------------------------------------------------------ render


def test_its_pods_select_the_reservation_and_the_jobset_blocks(loaded: Registry) -> None:
    spec, plan = jobs.spec_and_plan(**LABELLED)
    selector = render_pod_template(plan, spec)["spec"]["nodeSelector"]
    assert selector[RESERVED_FOR] == KEY
    jobset = render_jobset(plan, spec, restart_strategy="BlockingRecreate")
    assert jobset["spec"]["failurePolicy"]["restartStrategy"] == "BlockingRecreate"
    with pytest.raises(ValueError, match="no registered restart strategy renders"):
        render_jobset(plan, spec, restart_strategy="Sideways")


# ------------------------------------------------------------------ observe and decide()


def _nodes(pools: dict[str, bool]) -> dict[str, list[dict[str, Any]]]:
    """Node summaries (kopf's index) of v5e 4x4 pools of 4 Ready hosts; True: reserved."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pool, reserved in pools.items():
        labels = {
            keys.GKE_NODEPOOL: pool,
            keys.GKE_TPU_ACCELERATOR: "tpu-v5-lite-podslice",
            keys.GKE_TPU_TOPOLOGY: "4x4",
            **({RESERVED_FOR: KEY} if reserved else {}),
        }
        ready = {"conditions": [{"type": "Ready", "status": "True"}]}
        out[pool] = [
            ob.summarize_node(
                {"metadata": {"name": f"{pool}-{h}", "labels": labels}, "status": ready}
            )
            for h in range(4)
        ]
    return out


def _pass(pools: dict[str, bool], old: Any = None, js: JobSetObservation | None = None) -> Any:
    spec, plan = jobs.spec_and_plan(**LABELLED)
    seen = ob.assemble(ob.ObserveInputs(plan, jobs.META.uid, _nodes(pools)), NOW, None, [])
    obs = jobs.Observed(now=NOW, slices=seen.slices, capacity=seen.capacity, jobset=js)
    return jobs.run(old, obs, plan=(spec, plan))


def test_a_job_waits_for_its_reserved_pools_not_for_others(loaded: Registry) -> None:
    d = _pass({"free-0": False, "free-1": False, "reserved-0": True})
    assert d.status.phase == Phase.PENDING and d.actions == []
    assert d.status.message == (
        f"waiting for 2 node pools reserved for the job ({RESERVED_FOR}={KEY}) with 4 Ready "
        "nodes: 1 ready of 1 found"
    )
    assert d.status.capacity == {"reservedFor": KEY, "pools": ["reserved-0"]}


def test_on_its_reserved_pools_its_jobset_blocks_to_restart(loaded: Registry) -> None:
    d = _pass({"free-0": False, "reserved-0": True, "reserved-1": True})
    assert d.actions == [CreateJobSet(restart_strategy="BlockingRecreate")]
    assert d.status.phase == Phase.STARTING
    assert d.status.capacity == {"reservedFor": KEY, "pools": ["reserved-0", "reserved-1"]}


def test_a_restart_it_counts_says_blocking_recreate(loaded: Registry) -> None:
    old = MultisliceJobStatus.from_dict({"phase": "Running", "jobSet": "job"})
    js = JobSetObservation(restarts=1, restarts_counted=1, restart_strategy="BlockingRecreate")
    d = _pass({"reserved-0": True, "reserved-1": True}, old, js)
    last = d.status.last_restart
    assert last is not None and (last.cause, last.strategy) == ("workload", "BlockingRecreate")
    assert d.status.restarts_by_cause is not None and d.status.restarts_by_cause.workload == 1


def test_it_outranks_the_in_tree_strategies_wherever_jobset_carries_them(loaded: Registry) -> None:
    spec, _ = jobs.spec_and_plan(**LABELLED)
    in_place = jobs.Observed(now=NOW, support={"InPlaceRestart": StrategySupport(True, "ok")})
    chosen = rs.choose(spec, None, in_place)
    assert {s.name for s in chosen.values()} == {"BlockingRecreate"}
    assert rs.jobset_value(chosen) == "BlockingRecreate"
    # A JobSet rendered before it was loaded restarts as it was rendered.
    recreating = rs.choose(spec, JobSetObservation(restart_strategy="Recreate"), in_place)
    assert {s.name for s in recreating.values()} == {"Recreate"}


# ------------------------------------------------------------------ a plugin that cannot load


def test_a_plugin_that_cannot_load_says_which_and_from_where(registry: Registry) -> None:
    with pytest.raises(PluginError, match=r"plugin nope\.mod:register cannot be loaded.*asked"):
        registry.load(["nope.mod:register"])
    with pytest.raises(PluginError, match="is not module:function"):
        registry.load(["tests.plugins.labelled"])


def test_the_cli_refuses_a_plugin_it_cannot_load_in_one_line(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(jobs.body()))
    env = {**os.environ, ENV: "nope.mod:register"}
    done = subprocess.run(
        [sys.executable, "-m", "multislice_operator.cli.main", "validate", "-f", str(job)],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    said = f"error: plugin nope.mod:register cannot be loaded: No module named 'nope' ({ENV})"
    assert done.stderr == said + "\n"


# ---------------------------------------------------------------- a strategy's own cluster check

PROBED: list[Any] = []


async def _probe(rt: Any, crd: dict[str, Any] | None) -> StrategySupport:
    PROBED.append(crd)
    return StrategySupport(bool(crd and crd.get("gate")), "the test's gate")


def test_a_strategys_probe_is_run_by_the_controller_and_read_by_decide(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A strategy registers its check of the cluster (`probe`); the controller's version check
    runs it with the JobSet CRD it read, keeps what it found by the strategy's name
    (`Runtime.support`, decide()'s `Observed.support`: the strategy's `available` reads it
    there), and logs it once, when it changes."""
    import asyncio
    from types import SimpleNamespace

    from multislice_operator.controller import versions
    from multislice_operator.plugins.recreate import JobSetRecreate

    class Probed(JobSetRecreate):
        name = "Probed"
        probe: str | None = "tests.unit.test_plugins:_probe"
        said = "probed restart"

        def available(self, spec: Any, obs: Any) -> bool:
            found = obs.support.get(self.name)
            return found is not None and found.usable

    registry = Registry()
    registry.load()
    registry.add_strategy(Probed())
    monkeypatch.setattr(versions, "REGISTRY", registry)
    crds = iter([{"gate": False}, {"gate": False}, {"gate": True}])

    class Kube:
        async def served_versions(self, group: str) -> list[str] | None:
            return None

        async def served_resources(self, group: str, version: str) -> list[str]:
            return []

        async def get_crd(self, name: str) -> dict[str, Any] | None:
            return next(crds)

    settings = SimpleNamespace(kueue=False, in_place_agent_image="", namespaces=[])
    rt: Any = SimpleNamespace(
        settings=settings, kube=Kube(), kueue_problem=None, jobset_problem=None, support={},
        slice_api=None, pod_groups=None,
    )  # fmt: skip
    caplog.set_level("INFO", logger="multislice_operator")
    seen = []
    for _ in range(3):
        asyncio.run(versions.check(rt))
        probed = Probed()
        seen.append(probed.available(None, jobs.Observed(now=NOW, support=rt.support)))
    assert PROBED == [{"gate": False}, {"gate": False}, {"gate": True}]
    assert seen == [False, False, True]
    assert rt.support["Probed"] == StrategySupport(True, "the test's gate")
    assert not rt.support["InPlaceRestart"].usable  # the in-tree probe ran beside it
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("probed restart")]
    assert said == [
        "probed restart: not used (the test's gate)",
        "probed restart: used (the test's gate)",
    ]
