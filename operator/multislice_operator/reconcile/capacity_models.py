"""The capacity models' registry: spec.provisioning.mode -> its `CapacityModel` (capacity.py).

As Kueue's job integrations register a `GenericJob` each, a new capacity model is one module
implementing the interface and one entry here; facts.derive chooses the job's model once per
pass (`Facts.capacity`) and nothing downstream tests which one it has. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from multislice_operator.api.models import ProvisioningMode
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile.capacity import CapacityModel
from multislice_operator.reconcile.capacity_dynamic import DYNAMIC_SLICES
from multislice_operator.reconcile.capacity_existing import EXISTING_POOLS
from multislice_operator.reconcile.capacity_nodepools import NODE_POOLS

MODELS: Mapping[ProvisioningMode, CapacityModel] = {
    ProvisioningMode.MANAGED: NODE_POOLS,
    ProvisioningMode.EXISTING: EXISTING_POOLS,
    ProvisioningMode.DYNAMIC_SLICING: DYNAMIC_SLICES,
}

# A job without a plan (an invalid spec) holds no slice of its own: like an Existing job, only
# the pools labelled with its uid (strays) are released.
WITHOUT_PLAN: CapacityModel = EXISTING_POOLS


def model_of(plan: Plan | None) -> CapacityModel:
    """The capacity model of a job's plan (KeyError: a mode without a model)."""
    return WITHOUT_PLAN if plan is None else MODELS[ProvisioningMode(plan.mode)]
