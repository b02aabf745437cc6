"""The DynamicSlicing model's appliers (plugins/dynamic.py registers them): its GKE Slices
created and deleted through the operator's Kubernetes client. Loaded by the controller when a
Slice is first acted on; the CLI never imports it."""

from __future__ import annotations

import asyncio
import logging

from multislice_operator.controller.appliers import Target
from multislice_operator.controller.runtime import Runtime
from multislice_operator.plugins.dynamic import CreateSlice, DeleteSlices, ReleaseSlices
from multislice_operator.render.slice import render_slice

log = logging.getLogger("multislice_operator")


async def create_slice(rt: Runtime, t: Target, a: CreateSlice) -> None:
    _, plan = t.planned()
    await rt.kube.create_slice(render_slice(plan, a.name, a.topology, a.partitions))
    log.info(
        "slice created job=%s/%s slice=%d name=%s partitions=%s",
        t.namespace, t.name, a.index, a.name, ",".join(a.partitions),
    )  # fmt: skip


async def delete_slices(rt: Runtime, t: Target, a: DeleteSlices) -> None:
    await asyncio.gather(*(rt.kube.delete_slice(name) for name in a.names))
    log.info("slices deleted job=%s/%s names=%s", t.namespace, t.name, ",".join(a.names))


async def release_slices(rt: Runtime, t: Target, a: ReleaseSlices) -> None:
    await asyncio.gather(*(rt.kube.release_slice(name) for name in a.names))
    log.warning(
        "slice finalizers removed job=%s/%s names=%s", t.namespace, t.name, ",".join(a.names)
    )
