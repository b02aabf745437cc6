"""Issue 45, section 2: no gang held for a mistake the operator could see (pure tests).

A scheduler that is not running, a sidecar port that becomes a duplicate host port, a
PriorityClass that does not exist: each fails before the first pool or within a deadline that is
on by default, naming the field. And two false alarms: a deletion's pod losses are no restart, a
Kueue resume is no restart."""

from __future__ import annotations

from typing import Any

import pytest

from multislice_operator.errors import SpecError
from multislice_operator.plan import load_job, plan_job
from multislice_operator.render import render_jobset
from tests.unit import jobs

SIDECAR_8080 = {"name": "metrics", "image": "m", "ports": [{"containerPort": 8080}]}


def errors(body: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as exc:
        plan_job(load_job(body))
    return {e.path: e.message for e in exc.value.errors}


def template(**pod: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c", "image": "i"}], **pod}}


# ---------------------------------------------------------------- a duplicate host port


def test_a_sidecar_on_the_operators_port_is_refused_naming_the_field_and_the_fix():
    found = errors(jobs.body(template=template(containers=[{"name": "c", "image": "i"},
                                                           SIDECAR_8080])))  # fmt: skip
    path = "spec.template.spec.containers[1].ports[0].containerPort"
    assert set(found) == {path}
    message = found[path]
    assert '"TCP//8080"' in message and "megascale" in message and "containers[0]" in message
    assert "hostNetwork: false" in message and "another port" in message


def test_the_coordinator_port_and_two_sidecars_on_one_port_are_refused_too():
    sidecars = [
        {"name": "a", "image": "a", "ports": [{"containerPort": 8476}]},
        {"name": "b", "image": "b", "ports": [{"containerPort": 9090, "protocol": "UDP"}]},
        {"name": "d", "image": "d", "ports": [{"containerPort": 9090, "protocol": "UDP"}]},
    ]
    found = errors(jobs.body(template=template(containers=[{"name": "c", "image": "i"},
                                                           *sidecars])))  # fmt: skip
    assert "jax-coord" in found["spec.template.spec.containers[1].ports[0].containerPort"]
    assert (
        "containers[2].ports[0]" in found["spec.template.spec.containers[3].ports[0].containerPort"]
    )


@pytest.mark.parametrize(
    "pod",
    [
        # Off the host network a container port is no host port.
        {"hostNetwork": False, "containers": [{"name": "c", "image": "i"}, SIDECAR_8080]},
        # The TPU container declaring the port itself: the render adds nothing.
        {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 8080}]}]},
        # Another protocol is another host port.
        {"containers": [{"name": "c", "image": "i"},
                        {"name": "m", "image": "m",
                         "ports": [{"containerPort": 8080, "protocol": "UDP"}]}]},
        # Init containers run one by one: each is checked alone (validateInitContainers).
        {"containers": [{"name": "c", "image": "i"}], "initContainers": [SIDECAR_8080]},
    ],
)  # fmt: skip
def test_ports_kubernetes_accepts_pass(pod):
    spec, plan = jobs.spec_and_plan(template={"spec": pod})
    render_jobset(plan, spec)


def test_explicit_host_ports_off_the_host_network_are_checked_as_kubernetes_does():
    pod = {
        "hostNetwork": False,
        "containers": [
            {"name": "c", "image": "i", "ports": [{"containerPort": 1, "hostPort": 7000}]},
            {"name": "m", "image": "m", "ports": [{"containerPort": 2, "hostPort": 7000}]},
        ],
    }
    found = errors(jobs.body(template={"spec": pod}))
    assert "TCP//7000" in found["spec.template.spec.containers[1].ports[0].hostPort"]
    one_init = {"initContainers": [{"name": "x", "image": "x", "ports": [
        {"containerPort": 5000}, {"containerPort": 5000}]}]}  # fmt: skip
    found = errors(jobs.body(template=template(**one_init)))
    assert "spec.template.spec.initContainers[0].ports[1].containerPort" in found
