"""The Workload a MultisliceJob owns (render/kueue_workload.py) against the real Kueue v0.19
controller and webhooks (the ``kueue`` profile; no operator runs here, the test plays the owner):

* Kueue accepts the rendered Workload, owned by a MultisliceJob, and reserves exactly the chips
  of its slices and its spares; a job whose chips do not fit waits;
* the owner's writes are the ones Kueue's job reconciler makes and Kueue acts on them: after a
  preemption, the released reservation lets the preemptor in and queues the job again
  (Requeued=True); Finished gives the quota back and the preempted job is admitted again;
* `status.reclaimablePods` gives quota back but cannot be lowered while quota is reserved: why an
  elastic job keeps its full quota while degraded (the module's docstring).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local import queues
from multislice_local.harness import install_crds, wait_for
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.render import kueue_workload as kw
from multislice_operator.render.jobset import render_pod_template
from tests import msj

FLAVOR = "tpu-v5e"
G, V = queues.GROUP, queues.VERSION


class Owner:
    """Plays the MultisliceJob's owner of its Workload, as the operator would."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.api, self.ns = api, ns
        self.custom: Any = client.CustomObjectsApi(api)

    def submit(self, name: str, slices: int, spares: int, priority: tuple[str, int] | None = None
               ) -> str:  # fmt: skip
        """A suspended MultisliceJob (nothing runs it here) and the Workload it owns."""
        body = msj.job(name, slices=slices, spares=spares, suspend=True)
        body["metadata"]["namespace"] = self.ns
        created = msj.create(self.api, self.ns, body)
        plan = plan_job(load_job(created))
        template = render_pod_template(plan, load_job(created).spec)
        wl = kw.render_workload(
            plan, template, uid=created["metadata"]["uid"], queue="lq",
            priority_class=priority[0] if priority else None,
            priority=priority[1] if priority else None,
        )  # fmt: skip
        self.custom.create_namespaced_custom_object(G, V, self.ns, "workloads", wl)
        return str(wl["metadata"]["name"])

    def get(self, wl: str) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_namespaced_custom_object(
            G, V, self.ns, "workloads", wl
        )
        return got

    def cond(self, wl: str, kind: str) -> str:
        return str(queues.condition(self.get(wl), kind).get("status", ""))

    def wait(self, wl: str, kind: str, status: str = "True", timeout: float = 60) -> dict[str, Any]:
        return wait_for(
            lambda: self.get(wl) if self.cond(wl, kind) == status else None,
            timeout, f"{wl} {kind}={status}", interval=0.2,
            on_timeout=lambda: str((self.get(wl).get("status") or {}).get("conditions")),
        )  # fmt: skip

    def patch_status(self, wl: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            G, V, self.ns, "workloads", wl, {"status": status}
        )

    def release(self, wl: str) -> None:
        got = self.get(wl)
        st = got.get("status") or {}
        out = kw.released_status(list(st.get("conditions") or []),
                                 list(st.get("admissionChecks") or []),
                                 int(got["metadata"]["generation"]), datetime.now(UTC))  # fmt: skip
        assert out is not None, f"{wl} is not evicted"
        self.patch_status(wl, out)

    def finish(self, wl: str) -> None:
        got = self.get(wl)
        conds = list((got.get("status") or {}).get("conditions") or [])
        gen = int(got["metadata"]["generation"])
        self.patch_status(wl, kw.finished_status(conds, True, "done", gen, datetime.now(UTC)))

    def usage(self, wl: str) -> dict[str, int]:
        """google.com/tpu Kueue reserved, per pod set."""
        adm = (self.get(wl).get("status") or {}).get("admission") or {}
        return {
            a["name"]: int((a.get("resourceUsage") or {}).get(queues.TPU, 0))
            for a in adm.get("podSetAssignments") or []
        }

    def drop_finalizers(self) -> None:
        """The owner's last duty (jobframework removes Kueue's resource-in-use finalizer)."""
        for wl in self.custom.list_namespaced_custom_object(G, V, self.ns, "workloads")["items"]:
            if wl["metadata"].get("finalizers"):
                self.custom.patch_namespaced_custom_object(
                    G, V, self.ns, "workloads", wl["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )  # fmt: skip


@pytest.fixture
def owner(kube_kueue, kube_client: Callable[..., client.ApiClient], namespace):
    api = kube_client(kube_kueue)
    install_crds(api)
    ns = namespace(kube_kueue, "kw")
    cq = f"cq-{ns}"
    objs = [
        queues.resource_flavor(FLAVOR, "tpu-v5-lite-podslice"),
        queues.priority_class(f"{ns}-high", 1000),
        # BestEffortFIFO: a job that does not fit does not hold back a later one that does
        # (StrictFIFO would keep b behind the requeued a, whose 48 chips no longer fit).
        queues.cluster_queue(
            cq,
            64,
            FLAVOR,
            check=None,
            strategy="BestEffortFIFO",
            preemption={"withinClusterQueue": "LowerPriority"},
        ),
        queues.local_queue(ns, "lq", cq),
    ]
    created = queues.apply(api, objs)
    queues.wait_active(api, cq)
    o = Owner(api, ns)
    yield o
    o.drop_finalizers()
    queues.delete(api, [c for c in created if c["kind"] != "ResourceFlavor"])


def test_kueue_reserves_the_slices_and_spares_and_acts_on_the_owners_writes(owner):
    # a: 2 x v5litepod-16 + 1 spare slice = 48 of the ClusterQueue's 64 chips.
    a = owner.submit("a", slices=2, spares=1)
    owner.wait(a, "Admitted")  # no check listed: admitted on quota
    assert owner.usage(a) == {"slice": 32, "spare": 16}
    # b: 1 slice + 1 spare = 32 > the 16 left: it waits, and Kueue says why.
    b = owner.submit("b", slices=1, spares=1)
    pending = owner.wait(b, "QuotaReserved", "False")
    assert "insufficient" in queues.condition(pending, "QuotaReserved")["message"].lower()
    # c, high priority, 2 slices (32): Kueue evicts a for it; a keeps its quota until its owner
    # says the job has stopped.
    c = owner.submit("c", slices=2, spares=0, priority=(f"{owner.ns}-high", 1000))
    evicted = owner.wait(a, "Evicted")
    assert queues.condition(evicted, "Evicted")["reason"] == "Preempted"
    assert owner.cond(a, "QuotaReserved") == "True" and owner.cond(c, "QuotaReserved") != "True"
    owner.release(a)
    owner.wait(c, "Admitted")
    assert owner.usage(c) == {"slice": 32}
    requeued = owner.wait(a, "Requeued")
    assert queues.condition(requeued, "Requeued")["reason"] == "Preempted"
    assert owner.cond(a, "QuotaReserved") == "False" and owner.usage(a) == {}
    owner.wait(b, "Admitted")  # 32 + 32: b fits beside c now; a (48) does not
    assert owner.cond(a, "QuotaReserved") == "False"
    # The jobs end: Finished gives the quota back and a is admitted again, slices and spare.
    owner.finish(c)
    owner.finish(b)
    owner.wait(a, "Admitted")
    assert owner.usage(a) == {"slice": 32, "spare": 16}


def test_reclaimable_pods_give_quota_back_and_cannot_be_taken_back(owner):
    a = owner.submit("a", slices=4, spares=0)  # 64: the whole ClusterQueue
    owner.wait(a, "Admitted")
    b = owner.submit("b", slices=1, spares=0)
    owner.wait(b, "QuotaReserved", "False")
    # One slice's hosts (4 pods) reclaimable: Kueue frees their 16 chips and b gets in.
    owner.patch_status(a, {"reclaimablePods": [{"name": "slice", "count": 4}]})
    owner.wait(b, "Admitted")
    # The slice comes back: the count cannot go down while a holds quota (Kueue's webhook).
    with pytest.raises(ApiException) as err:
        owner.patch_status(a, {"reclaimablePods": [{"name": "slice", "count": 0}]})
    # Denied by Kueue's validating webhook (403, its field error in the message).
    assert err.value.status == 403, err.value.body
    assert "status.reclaimablePods[slice].count: Invalid value: 0: cannot be less than 4" in str(
        err.value.body
    ), err.value.body
