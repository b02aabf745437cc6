"""The in-place restart benchmark's pure helpers (benchmarks/inplace_agents.py,
restart_inplace.py, pass_cpu.py): the agents' logic, the write and pass counts, the fit."""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks.inplace_agents import ANNOTATE, EXIT, Agent, agent_actions
from benchmarks.pass_cpu import World, fit, growth, pass_bound, window_bound
from benchmarks.restart_inplace import passes_in, restart_writes

from multislice_operator.render.inplace import AGENT_CONTAINER, AGENT_EXIT_CODE


def _pod(name: str, agent_restarts: int, phase: str = "Running") -> dict[str, Any]:
    agent = {"name": AGENT_CONTAINER, "restartCount": agent_restarts, "state": {"running": {}}}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "status": {"phase": phase, "initContainerStatuses": [agent]},
    }


def test_the_agents_play_one_in_place_restart_as_jobsets_agent_does() -> None:
    agents: dict[str, Agent] = {}
    pods = [_pod("a", 0), _pod("b", 0), _pod("c", 0, phase="Pending")]
    # First start, the JobSet has no attempt yet: every running pod's agent writes 0, once.
    assert agent_actions({}, pods, agents) == [(ANNOTATE, "a", 0), (ANNOTATE, "b", 0)]
    assert agent_actions({"currentInPlaceRestartAttempt": 0}, pods, agents) == []
    # a's containers restart (its program failed): its agent starts again and writes 1.
    pods[0] = _pod("a", 1)
    status: dict[str, Any] = {"currentInPlaceRestartAttempt": 0}
    assert agent_actions(status, pods, agents) == [(ANNOTATE, "a", 1)]
    # JobSet raises previous to 0: b (on 0) exits with its code, once; a (on 1) stays.
    status["previousInPlaceRestartAttempt"] = 0
    assert agent_actions(status, pods, agents) == [(EXIT, "b", AGENT_EXIT_CODE)]
    assert agent_actions(status, pods, agents) == []
    # b's containers restart: its new agent writes current + 1 and does not exit again.
    pods[1] = _pod("b", 1)
    assert agent_actions(status, pods, agents) == [(ANNOTATE, "b", 1)]


def test_restart_writes_leave_out_reads_and_the_background() -> None:
    diff = {
        "PATCH pods": 5,
        "PATCH leases": 40,
        "PATCH nodes/status": 9,
        "GET pods": 7,
        "POST pods/binding": 3,
        "APPLY multislicejobs/status": 2,
    }
    got = restart_writes(diff)
    assert got == {"PATCH pods": 5, "POST pods/binding": 3, "APPLY multislicejobs/status": 2}


def test_passes_sum_every_result_of_the_reconcile_counter() -> None:
    text = "\n".join(
        [
            "# TYPE multislice_reconcile_total counter",
            'multislice_reconcile_total{result="success"} 12.0',
            'multislice_reconcile_total{result="error"} 3.0',
            "multislice_reconcile_created 1.7e9",
            'multislice_reconcile_seconds_count{le="1"} 99.0',
        ]
    )
    assert passes_in(text) == 15


def test_the_fit_and_the_growth_verdict() -> None:
    a, b = fit([(256, 1.0 + 256 * 0.01), (1024, 1.0 + 1024 * 0.01), (4096, 1.0 + 4096 * 0.01)])
    assert a == pytest.approx(1.0) and b == pytest.approx(0.01)
    steps, linear = growth([(1, 1.0), (2, 2.0), (4, 4.0)])
    assert steps == [1.0, 1.0] and linear
    steps, linear = growth([(1, 1.0), (2, 2.0), (4, 8.0)])  # 3x per unit from 2 to 4
    assert steps == [1.0, 3.0] and not linear
    with pytest.raises(ValueError, match="two different sizes"):
        fit([(5, 1.0), (5, 2.0)])


def test_the_bounds_of_a_burst() -> None:
    # Quiet 0.05 s: at most one pass per 0.05 s of burst, plus two; the window's: one a second.
    assert pass_bound(0.0) == 2 and pass_bound(1.0) == 22
    assert window_bound(0.0) == 1 and window_bound(2.5) == 4


def test_the_pass_benchmarks_world_is_a_running_job_of_its_size() -> None:
    w = World(256)
    for _ in range(3):
        status = w.one_pass()
    assert status["phase"] == "Running"
    assert [s["readyHosts"] for s in status["slices"]] == [64, 64, 64, 64]
    w.set_attempt(1)
    assert w.one_pass()["restarts"] == 1
    with pytest.raises(ValueError, match="multiple of 64"):
        World(100)


def test_the_summary_carries_the_cpu_per_steady_pass_of_each_size() -> None:
    from benchmarks.run import targets

    results = [
        {"pods": n, "pass_s": ms / 1000, "pass_after_restart_s": 0.002, "index_s": 0.001}
        for n, ms in ((1024, 5.5), (256, 1.75))
    ]
    fit = {"fixed_ms": 0.3, "us_per_pod": 5.0, "linear": True}
    got = targets({"pass_cpu": {"results": results, "pass_s_fit": fit}})["targets"]
    rows = {t["target"]: t["value"] for t in got if "steady Running job" in t["target"]}
    assert rows == pytest.approx(
        {
            "operator CPU per pass of a steady Running job, 256 pods (ms)": 1.75,
            "operator CPU per pass of a steady Running job, 1024 pods (ms)": 5.5,
        }
    )
