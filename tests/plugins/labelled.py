"""Capacity model `Labelled`, a plugin written outside the package (issue 53's proof): node pools
that a platform team reserved for one job by labelling their nodes
`labelled.multislice.dev/reserved-for=<the job's key>` (planning.plan.job_key: a short hash of
namespace/name, a valid label value).

Everything it needs it registers (`register`, loaded by
`MSJ_PLUGINS=tests.plugins.labelled:register` or an entry point of group
`multislice_operator.plugins`): its mode, what it accepts (nothing:
spares, an elastic slice count and flex-start are refused, naming the field), how its pools are
observed (the pools of the job's shape whose every node carries the reservation), its part of
the pod template (the pods select the reservation label, so they land on no other pool), its
status part and its docs section. decide()'s half builds on the Existing model: the pools are
there, the operator creates and releases none of them.
"""

from __future__ import annotations

from typing import Any

from multislice_operator.controller.observe import ObserveInputs
from multislice_operator.planning.plan import Plan
from multislice_operator.plugins.existing import ExistingPools, Found, matching_pools
from multislice_operator.reconcile.facts import Facts
from multislice_operator.reconcile.types import SliceObservation
from multislice_operator.registry import CapacityPlugin, Registry

MODE = "Labelled"
RESERVED_FOR = "labelled.multislice.dev/reserved-for"


class Labelled(ExistingPools):
    """Pools reserved for the job (decide()'s half): waits for them, holds none of its own."""

    name = "Labelled"

    def waiting(self, f: Facts) -> str:
        assert f.plan is not None
        found = f.obs.capacity.found if isinstance(f.obs.capacity, Found) else 0
        return (
            f"waiting for {f.plan.slices} node pools reserved for the job ({RESERVED_FOR}="
            f"{f.plan.job_key}) with {f.plan.shape.hosts} Ready nodes: {len(f.slices.ready)} "
            f"ready of {found} found"
        )

    def status(self, f: Facts) -> dict[str, Any] | None:
        assert f.plan is not None
        pools = sorted(str(s.pool) for s in f.obs.slices)
        return {"reservedFor": f.plan.job_key, "pools": pools}


LABELLED = Labelled()


def observe(i: ObserveInputs) -> tuple[list[SliceObservation], Found]:
    """The pools of the job's shape (and template nodeSelector) reserved for this job."""
    reserved = {**i.node_selector, RESERVED_FOR: i.plan.job_key}
    slices, found = matching_pools(i.plan, i.nodes, reserved)
    return slices, Found(found)


def place(template: dict[str, Any], plan: Plan) -> None:
    """The job's pods select its reservation: no other pool of its shape takes them."""
    template["spec"]["nodeSelector"][RESERVED_FOR] = plan.job_key


DOCS = f"""\
Node pools reserved for one job: every node labelled `{RESERVED_FOR}=<job key>` (the short hash
`multislice-operator plan` prints as the job's key). A plugin written outside the package
(`tests/plugins/labelled.py`). `status.capacity`: `reservedFor` (the key) and `pools` (the
reserved pools found).
"""


def register(r: Registry) -> None:
    r.add_model(
        CapacityPlugin(
            mode=MODE,
            model=LABELLED,
            description="the slices run on node pools reserved for the job by a label.",
            observe=observe,
            place=place,
            waits_for_nodes=True,
            docs=DOCS,
        )
    )
