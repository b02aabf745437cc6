"""What a job that cannot start holds (issue 56): node pools and Kueue quota, and for how long.

    python -m benchmarks.held [--log-dir DIR]

The local stack (real apiserver, scheduler, controller-manager, JobSet, kwok nodes, the GKE
simulator, the operator as a process; Managed mode), one job at a time in namespaces of their own,
in this order:

* volcano-30-60: spec.template.spec.schedulerName names a scheduler that does not run, with
  startupTimeoutSeconds 30 and unschedulableTimeoutSeconds 60 (the issue's regression: it never
  failed); the operator has not seen that scheduler yet;
* volcano: the same with the default timeouts, after it: the scheduler is known not to run;
* volcano-sidecar: the same with a native sidecar;
* no-cpu: pods the scheduler refuses (more CPU than a TPU node has), with startupTimeoutSeconds
  30 and unschedulableTimeoutSeconds 60;
* multikueue-no-kueue: spec.managedBy kueue.x-k8s.io/multikueue and a queue, the operator
  without --kueue.

Then the `kueue` profile: multikueue-no-check, a MultiKueue job on a ClusterQueue of 64 chips
that lists the operator's check but no MultiKueue one (the issue's quota hostage).

Per job: the reason it failed (or the phase it holds), the node pools created, the seconds any
pool of it existed (from the first seen to the last gone), the seconds from its creation to its
verdict, and for the Kueue case the seconds its Workload held quota. Polled every 0.5 s: figures
are to that. Writes benchmarks/results/held.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.common import MSJ, save, say, table
from multislice_local import queues
from multislice_local.harness import wait_for
from multislice_local.stack import LocalStack, StackOptions
from multislice_operator.common import keys
from multislice_operator.controller import observe as ob
from multislice_operator.planning.plan import node_pool_name

POLL_S = 0.5
IMAGE = "example.invalid/train:1"


def body(name: str, failure_policy: dict[str, Any] | None = None, labels: dict[str, str] | None
         = None, managed_by: str | None = None, **pod: Any) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {
        "accelerator": "v5litepod-16",
        "slices": 2,
        "failurePolicy": {"maxRestarts": 5, **(failure_policy or {})},
        "checkpoint": {"directory": "gs://bench/held"},
        "template": {
            "metadata": {"annotations": {"multislice.dev/run-duration": "1h"}},
            "spec": {"containers": [{"name": "train", "image": IMAGE}], **pod},
        },
    }
    if managed_by:
        spec["managedBy"] = managed_by
    return {"apiVersion": f"{MSJ[0]}/{MSJ[1]}", "kind": "MultisliceJob",
            "metadata": {"name": name, "labels": labels or {}}, "spec": spec}  # fmt: skip


@dataclass
class Held:
    case: str
    outcome: str = ""
    pools_created: int = 0
    pool_s: float = 0.0
    verdict_s: float | None = None
    quota_s: float | None = None
    message: str = ""


def _status(custom: Any, ns: str, name: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(MSJ[0], MSJ[1], ns, MSJ[2], name)
    return dict(obj.get("status") or {})


def _outcome(st: dict[str, Any]) -> str:
    failed = next((c for c in st.get("conditions") or [] if c["type"] == "Failed"), None)
    return f"Failed {failed['reason']}" if failed else str(st.get("phase") or "")


def run_case(stack: LocalStack, case: str, job: dict[str, Any], done: Any, limit: float,
             quota: Any = None, prepare: Any = None) -> Held:  # fmt: skip
    """Create `job` in a namespace of its own (`prepare(ns)` first) and poll until
    `done(status)` and no pool of it is left (or `limit` seconds); `quota(ns)`: the seconds its
    Workload held quota, read once it is done."""
    assert stack.sim is not None
    core, custom = client.CoreV1Api(stack.api), client.CustomObjectsApi(stack.api)
    ns = f"held-{case}"
    core.create_namespace({"metadata": {"name": ns}})
    if prepare is not None:
        prepare(ns)
    name = job["metadata"]["name"]
    prefix = node_pool_name(ns, name, 0)[:-2]
    h = Held(case)
    start = time.monotonic()
    custom.create_namespaced_custom_object(MSJ[0], MSJ[1], ns, MSJ[2], job)
    first = last = None
    while time.monotonic() - start < limit:
        now = time.monotonic() - start
        pools = [p for p in stack.sim.pools() if p.startswith(prefix)]
        if pools:
            first = now if first is None else first
            last = now
        if h.verdict_s is None and done(_status(custom, ns, name)):
            h.verdict_s = round(now, 1)
        if h.verdict_s is not None and not pools:
            break
        time.sleep(POLL_S)
    st = _status(custom, ns, name)
    h.outcome, h.message = _outcome(st), str(st.get("message") or "")
    h.pools_created = sum(
        1 for c in stack.sim.received_creates()
        if str((c.get("nodePool") or {}).get("name", "")).startswith(prefix)
    )  # fmt: skip
    h.pool_s = round((last - first) if first is not None and last is not None else 0.0, 1)
    h.quota_s = quota(ns) if quota is not None else None
    say(f"{case}: {h.outcome}, {h.pools_created} pools created, held {h.pool_s}s, "
        f"verdict after {h.verdict_s}s; {h.message[:160]}")  # fmt: skip
    custom.delete_namespaced_custom_object(MSJ[0], MSJ[1], ns, MSJ[2], name)
    return h


def _finished(wl: dict[str, Any] | None) -> dict[str, Any] | None:
    return wl if queues.condition(wl, "Finished").get("status") == "True" else None


def failed(st: dict[str, Any]) -> bool:
    return st.get("phase") == "Failed"


def said(st: dict[str, Any]) -> bool:
    return bool(st.get("phase")) and bool(st.get("message"))


def cluster_cases(log: Path) -> list[Held]:
    mk = keys.MULTIKUEUE_MANAGED_BY
    queued = {keys.KUEUE_QUEUE_NAME: "lq"}
    issue = {"startupTimeoutSeconds": 30, "unschedulableTimeoutSeconds": 60}
    sidecar = [{"name": "log", "image": IMAGE, "restartPolicy": "Always"}]
    greedy = {"name": "train", "image": IMAGE, "resources": {"requests": {"cpu": "1000"}}}
    out = []
    with LocalStack(StackOptions(resync_seconds=2.0, operator_log=log)) as stack:
        for case, job, done in (
            ("volcano-30-60", body("j", issue, schedulerName="volcano"), failed),
            ("volcano", body("j", schedulerName="volcano"), failed),
            ("volcano-sidecar", body("j", schedulerName="volcano", initContainers=sidecar),
             failed),
            ("no-cpu", body("j", issue, containers=[greedy]), failed),
            ("multikueue-no-kueue", body("j", labels=queued, managed_by=mk), said),
        ):  # fmt: skip
            out.append(run_case(stack, case, job, done, 900))
    return out


def kueue_case(log: Path) -> Held:
    mk = keys.MULTIKUEUE_MANAGED_BY
    with LocalStack(StackOptions(profile="kueue", resync_seconds=2.0, operator_log=log)) as stack:
        queues.apply(stack.api, [queues.resource_flavor("tpu-v5e", "tpu-v5-lite-podslice"),
                                 queues.admission_check(),
                                 queues.cluster_queue("held-cq", 64, "tpu-v5e")])  # fmt: skip
        queues.wait_active(stack.api, "held-cq")

        def lq(ns: str) -> None:
            queues.apply(stack.api, [queues.local_queue(ns, "lq", "held-cq")])

        def held(ns: str) -> float | None:
            """Kueue's own times: from QuotaReserved to Finished (a second's resolution)."""
            wl = wait_for(lambda: _finished(queues.workloads(stack.api, ns).get("j")), 60,
                          "the Workload finished")  # fmt: skip
            since = ob.parse_time(queues.condition(wl, "QuotaReserved").get("lastTransitionTime"))
            until = ob.parse_time(queues.condition(wl, "Finished").get("lastTransitionTime"))
            return (until - since).total_seconds() if since and until else None

        job = body("j", labels={keys.KUEUE_QUEUE_NAME: "lq"}, managed_by=mk)
        return run_case(stack, "multikueue-no-check", job, failed, 300, quota=held, prepare=lq)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args()
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-held-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    say(f"operator logs in {log_dir}")
    rows = [*cluster_cases(log_dir / "operator.log"), kueue_case(log_dir / "operator-kueue.log")]
    headers = ["case", "outcome", "pools created", "pools held s", "verdict s", "quota held s"]
    table("What a job that cannot start holds", headers,
          [[h.case, h.outcome, h.pools_created, h.pool_s, h.verdict_s, h.quota_s]
           for h in rows])  # fmt: skip
    save("held", {"cases": [h.__dict__ for h in rows]})


if __name__ == "__main__":
    main()
