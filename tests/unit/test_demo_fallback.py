"""The fallback demo scenario's two jobs (issue 55): what the operator's planner makes of them, and
the demo's verdict on a run, which must fail when a move, the option that ran or the node pools
asked for are not the story's (the e2e run is tests/e2e/test_demo.py)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from multislice_local.demo import (
    FALLBACK_MODEL_ARGS,
    FLEX_TRY_S,
    SCENARIOS,
    Create,
    demo_job,
    fallback_first_job,
    fallback_first_problems,
    fallback_second_problems,
)
from multislice_operator.planning.plan import load_job, plan_job


def options(body: dict[str, Any]) -> list[tuple[str, int]]:
    plan = plan_job(load_job(body))
    assert plan.fallback is not None
    return [(o.what, o.try_seconds) for o in plan.fallback.options]


def test_the_first_job_tries_the_reservation_then_flex_start_briefly_then_spot() -> None:
    assert options(fallback_first_job("demo")) == [
        ("Reserved team-v5e, v5litepod-16 x 2", 120),
        ("FlexStart, v5litepod-16 x 2", FLEX_TRY_S),
        ("Spot, v5litepod-16 x 2", 120),
    ]


def test_the_second_job_tries_its_own_shape_then_v5e_8_then_one_v6e_slice() -> None:
    body = demo_job(SCENARIOS["fallback"], namespace="demo")
    assert body["spec"]["preflight"] == {}
    assert [what for what, _ in options(body)] == [
        "Reserved team-v5e, v5litepod-16 x 2",
        "Spot, v5litepod-8 x 4",
        "Spot, v6e-32 x 1",
    ]


def test_the_second_jobs_model_is_about_6_4_b_parameters_in_narrow_scanned_layers() -> None:
    """What docs/demo.md says of it: about 6.4 B parameters (their float32 Adam state is what
    does not fit 8 v5e chips), as many narrow layers (one lax.scan: libtpu compiles one layer,
    so the depth costs no compile time, the width does)."""
    import argparse

    from multislice_workload import train

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(FALLBACK_MODEL_ARGS[1:])  # after the "train" subcommand
    cfg = train.TrainConfig(**{
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(train.TrainConfig) if f.name not in ("vocab", "eos_id")
    })  # fmt: skip
    model = train.model_config(cfg)
    assert 6.35e9 < model.parameter_count() < 6.5e9
    assert (model.layers, model.embed, model.seq_len) == (512, 1024, 256)


def left(*reasons: str | None) -> list[dict[str, Any]]:
    return [{"option": k, "what": "-", "lastLeft": r} for k, r in enumerate(reasons)]


FIRST_LEFT = left("ReservationExhausted", "Timeout", None)
FIRST = {"phase": "Succeeded", "fallback": {"option": 2, "options": FIRST_LEFT}}
FIRST_CREATES: list[Create] = [
    ("Reserved", "ct5lp-hightpu-4t", "4x4"),
    *[("FlexStart", "ct5lp-hightpu-4t", "4x4")] * 2,
    *[("Spot", "ct5lp-hightpu-4t", "4x4")] * 2,
]


def test_the_first_job_is_judged_on_its_moves_its_spot_gang_and_flex_start_released() -> None:
    assert fallback_first_problems(FIRST, FIRST_CREATES, 0) == []
    stayed = copy.deepcopy(FIRST)
    stayed["fallback"]["options"] = left("ReservationExhausted", None)
    assert "options left" in fallback_first_problems(stayed, FIRST_CREATES, 0)[0]
    again = [*FIRST_CREATES, ("Spot", "ct5lp-hightpu-4t", "4x4")]
    assert fallback_first_problems(FIRST, again, 0) == [
        "3 spot node-pool creates, expected the gang's 2"
    ]
    assert fallback_first_problems(FIRST, FIRST_CREATES, 16) == ["16 flex-start chips still held"]


SHAPES = [{"name": "", "fits": True}, {"name": "v5e-8", "fits": False},
          {"name": "v6e", "fits": True}]  # fmt: skip
SECOND = {"phase": "Succeeded",
          "fallback": {"option": 2, "shape": "v6e", "shapes": SHAPES,
                       "options": left("ReservationExhausted", "DidNotCompile", None)}}  # fmt: skip
SECOND_CREATES: list[Create] = [
    ("Reserved", "ct5lp-hightpu-4t", "4x4"),
    ("Spot", "ct6e-standard-4t", "4x8"),
]


def test_a_pool_asked_for_the_refused_shape_fails_the_second_job() -> None:
    assert fallback_second_problems(SECOND, SECOND_CREATES) == []
    asked = [*SECOND_CREATES, ("Spot", "ct5lp-hightpu-4t", "2x4")]
    assert fallback_second_problems(SECOND, asked) == [
        "1 creates for the refused shape, 1 v6e; expected 0 and 1"
    ]


def test_the_second_job_is_judged_on_the_compilers_verdicts_and_the_shape_that_ran() -> None:
    fitted = copy.deepcopy(SECOND)
    fitted["fallback"]["shapes"][1]["fits"] = True
    assert fallback_second_problems(fitted, SECOND_CREATES) == [
        "compiler verdicts {'': True, 'v5e-8': True, 'v6e': True}"
    ]
    own = copy.deepcopy(SECOND)
    own["fallback"]["shape"] = ""
    assert "options left" in fallback_second_problems(own, SECOND_CREATES)[0]


class StackSeen:
    """The demo's LocalStack, as far as stop() uses it: whether it was stopped."""

    stopped = False

    def stop(self) -> None:
        self.stopped = True


def test_the_demo_stops_its_processes_when_cleaning_a_borrowed_cluster_fails() -> None:
    """A fallback run's apiserver answered 504 to the job's delete: the clean-up raised and the
    operator the demo started was left running (stop() never reached the stack)."""
    import argparse
    import io

    import pytest
    from kubernetes.client.exceptions import ApiException

    from multislice_local.demo import Demo

    args = argparse.Namespace(scenario="fallback", kubeconfig="/borrowed", namespace="demo-x")
    demo = Demo(args, io.StringIO())
    stack = StackSeen()
    demo.stack = stack  # type: ignore[assignment]

    def unreachable() -> None:
        raise ApiException(status=504, reason="Gateway Timeout")

    demo.clean_borrowed = unreachable  # type: ignore[method-assign]
    with pytest.raises(ApiException):
        demo.stop()
    assert stack.stopped
    assert demo.stack is None
