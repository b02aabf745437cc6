"""Helpers the integration and e2e tests share: a MultisliceJob body, the CustomObjectsApi calls
on it over a ``kubernetes.client.ApiClient`` (``LocalStack.api`` is one), waits with the
operator's log on timeout, the operator's metrics, and the operator (or whole local stack) a
test module runs.

Waiting (tests/README.md): wait for exactly what the test asserts, never sleep then assert.

* a status: ``wait_status(..., check)`` / ``wait_phase``; assert on the object they return;
* events: ``wait_events(api, ns, name, "Reason", ...)`` (the operator posts them after the
  status write, so a status seen does not mean its events are there yet);
* a metric: poll it with ``wait_for(lambda: metric(op, ...) == expected, ...)`` (recorded after
  the status and the events);
* "nothing happens": ``wait_reconciles(op, passes)`` (the operator's reconcile counter), then
  assert that nothing happened; never a fixed sleep, which covers no pass at all under load.

Imported as ``from tests import msj`` (pytest's ``pythonpath`` puts the repository root on
``sys.path``).
"""

from __future__ import annotations

import copy
import re
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.controlplane import ControlPlane
from multislice_local.harness import OperatorProcess, install_crds, wait_for
from multislice_local.nodes import RUN_DURATION_ANNOTATION
from multislice_local.stack import LocalStack, StackOptions
from multislice_operator.api import models
from multislice_operator.planning.plan import node_pool_name

IMAGE = "example.invalid/t:1"
NODE_LABEL = "e2e-test"  # a test's own nodes carry it with the namespace as value


def own_nodes(ns: str) -> dict[str, str]:
    """The label of `ns`'s own TPU nodes (``tpu_nodes(..., extra_labels=own_nodes(ns))``), and
    the nodeSelector of its jobs' pods."""
    return {NODE_LABEL: ns}


def own_pools(tpu_nodes: Callable[..., list[str]], ns: str) -> None:
    """Two node pools of 4 v5e 4x4 hosts that are `ns`'s own (the ``tpu_nodes`` fixture), for
    Existing-mode jobs that select them (``node_selector=own_nodes(ns)``): a test never lands
    on another test's nodes."""
    for p in range(2):
        tpu_nodes(f"{ns}-pool-{p}", 4, "tpu-v5-lite-podslice", "4x4", 4, extra_labels=own_nodes(ns))


def job(
    name: str,
    *,
    run: str | None = None,
    failure_policy: dict[str, Any] | None = None,
    existing: bool = False,
    node_selector: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    container: str = "train",
    image: str = IMAGE,
    **spec: Any,
) -> dict[str, Any]:
    """A MultisliceJob of 2 v5litepod-16 slices.

    `run`: the pods' run duration (kwok's RUN_DURATION_ANNOTATION); `failure_policy`: the
    spec's failurePolicy (none when None); `existing`: provisioning mode Existing;
    `node_selector`: the pod template's; `labels`: the job's; `spec`: spec fields set last
    (replacing, not merged), deep-copied.
    """
    metadata: dict[str, Any] = {"name": name}
    if labels is not None:
        metadata["labels"] = labels
    body_spec: dict[str, Any] = {"accelerator": "v5litepod-16", "slices": 2}
    if existing:
        body_spec["provisioning"] = {"mode": "Existing"}
    if failure_policy is not None:
        body_spec["failurePolicy"] = failure_policy
    template: dict[str, Any] = {}
    if run is not None:
        template["metadata"] = {"annotations": {RUN_DURATION_ANNOTATION: run}}
    pod: dict[str, Any] = {}
    if node_selector is not None:
        pod["nodeSelector"] = node_selector
    pod["containers"] = [{"name": container, "image": image}]
    template["spec"] = pod
    body_spec["template"] = template
    body_spec.update(copy.deepcopy(spec))
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": metadata,
        "spec": body_spec,
    }


# ---------------------------------------------------------------- the API


def custom(api: client.ApiClient) -> Any:
    return client.CustomObjectsApi(api)


def create(api: client.ApiClient, ns: str, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Create the job (a copy of `body`); `kwargs` go to the call (``dry_run="All"``)."""
    obj: dict[str, Any] = custom(api).create_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, copy.deepcopy(body), **kwargs
    )
    return obj


def get(
    api: client.ApiClient, ns: str, name: str, *, missing_ok: bool = False
) -> dict[str, Any] | None:
    """The job; None when it does not exist and `missing_ok` (else the 404 is raised)."""
    try:
        obj: dict[str, Any] = custom(api).get_namespaced_custom_object(
            models.GROUP, models.VERSION, ns, models.PLURAL, name
        )
    except ApiException as exc:
        if missing_ok and exc.status == 404:
            return None
        raise
    return obj


def jobset(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    """The JobSet `name`, or None when there is none."""
    try:
        obj: dict[str, Any] = custom(api).get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj


def wait_jobset(
    api: client.ApiClient, ns: str, name: str, timeout: float, *, log: Callable[[int], str]
) -> dict[str, Any]:
    """The job's JobSet once it exists. The operator writes a job's Starting status before it
    creates the JobSet, so a test that saw Starting and plays the JobSet controller waits here."""

    return wait_for(
        lambda: jobset(api, ns, name), timeout, f"JobSet {ns}/{name}", on_timeout=lambda: log(30)
    )


def status(
    api: client.ApiClient, ns: str, name: str, *, missing_ok: bool = False
) -> dict[str, Any]:
    """The job's status, {} when it has none (or, with `missing_ok`, no job)."""
    return (get(api, ns, name, missing_ok=missing_ok) or {}).get("status") or {}


def events(api: client.ApiClient, ns: str, name: str) -> list[Any]:
    """The events about the object `name` in `ns` (V1Event)."""
    return list(
        client.CoreV1Api(api)
        .list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        .items
    )


def event_lines(api: client.ApiClient, ns: str, name: str) -> list[str]:
    """The events about `name` as "Reason: message"."""
    return [f"{e.reason}: {e.message}" for e in events(api, ns, name)]


# ---------------------------------------------------------------- waits


def wait_events(
    api: client.ApiClient,
    ns: str,
    name: str,
    *needles: str,
    timeout: float = 30,
    log: Callable[[int], str] | None = None,
) -> list[str]:
    """The events about `name` ("Reason: message" lines) once every one of `needles` is a
    substring of one of them. The operator posts a pass's events after its status write: a
    test that saw the status waits here for the events instead of reading them once."""

    def look() -> list[str] | None:
        lines = event_lines(api, ns, name)
        return lines if all(any(n in line for line in lines) for n in needles) else None

    return wait_for(
        look,
        timeout,
        f"events {list(needles)} about {name}",
        interval=0.5,
        on_timeout=lambda: "\n".join(event_lines(api, ns, name)) + (f"\n{log(40)}" if log else ""),
    )


def wait_status(
    api: client.ApiClient,
    ns: str,
    name: str,
    what: str,
    check: Callable[[dict[str, Any]], bool],
    timeout: float,
    *,
    log: Callable[[int], str],
    tail: int = 40,
    missing_ok: bool = False,
) -> dict[str, Any]:
    """Poll the job (every 0.5 s) until it has a status and `check(status)`; return the whole
    object. On timeout the error says `what`, the status and the last `tail` lines of `log`
    (``op.log_tail``)."""

    def look() -> dict[str, Any] | None:
        obj = get(api, ns, name, missing_ok=missing_ok) or {}
        st = obj.get("status") or {}
        return obj if st and check(st) else None

    return wait_for(
        look,
        timeout,
        what,
        interval=0.5,
        on_timeout=lambda: f"{status(api, ns, name, missing_ok=missing_ok)}\n{log(tail)}",
    )


def wait_phase(
    api: client.ApiClient,
    ns: str,
    name: str,
    phase: str,
    timeout: float,
    *,
    log: Callable[[int], str],
    tail: int = 40,
    what: str | None = None,
    missing_ok: bool = False,
) -> dict[str, Any]:
    """`wait_status` for `phase` (`what` defaults to "<name> <phase>"); a job that fails while
    another phase is awaited raises AssertionError("job failed: <status>") at once."""

    def check(st: dict[str, Any]) -> bool:
        if phase != "Failed" and st.get("phase") == "Failed":
            raise AssertionError(f"job failed: {st}")
        return st.get("phase") == phase

    return wait_status(
        api,
        ns,
        name,
        what or f"{name} {phase}",
        check,
        timeout,
        log=log,
        tail=tail,
        missing_ok=missing_ok,
    )


# ---------------------------------------------------------------- the operator's metrics


def metrics(op: OperatorProcess) -> dict[str, float]:
    """The operator's /metrics as {'family{label="v",...}': value} (samples only)."""
    with urllib.request.urlopen(op.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def metric(op: OperatorProcess, family: str, **labels: str) -> float:
    """The sum of `family`'s samples whose labels include `labels` (0 when none)."""
    total = 0.0
    for series, value in metrics(op).items():
        fam, _, rest = series.partition("{")
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if fam == family and all(found.get(k) == v for k, v in labels.items()):
            total += value
    return total


def reconciles(op: OperatorProcess) -> int:
    """Reconcile passes the operator finished (every result): the counter is incremented once a
    pass has written its status, posted its events and recorded its metrics."""
    return int(metric(op, "multislice_reconcile_total"))


def wait_reconciles(op: OperatorProcess, passes: int = 2, timeout: float = 90) -> int:
    """Until the operator has finished `passes` more reconcile passes per job it knows (the
    ``multislice_jobs`` gauge, at least 1) than when called; the counter then. The wait before
    asserting that something did *not* happen (no pool deleted, the phase kept): it lasts as many
    passes as it says whatever the load, where a sleep may cover none. The counter is the
    operator's, for all jobs: passes per job are an average (a Running job is resynced every
    --resync-seconds, a finished one 6 times less often)."""
    start = reconciles(op)
    jobs = max(1, int(metric(op, "multislice_jobs")))
    want = start + passes * jobs
    return wait_for(
        lambda: (n := reconciles(op)) >= want and n,
        timeout,
        f"{passes} reconcile passes for each of {jobs} job(s) (counter {start} -> {want})",
        interval=0.25,
        on_timeout=lambda: op.log_tail(30),
    )


# ---------------------------------------------------------------- node pools (GKE simulator)


def pools_of(sim: Any, ns: str, name: str) -> dict[str, Any]:
    """The simulator's node pools whose names start as the job's do."""
    prefix = node_pool_name(ns, name, 0)[:-2]
    return {k: v for k, v in sim.pools().items() if k.startswith(prefix)}


# ---------------------------------------------------------------- what a module runs


@contextmanager
def operator_process(
    control_plane: ControlPlane, log: Path, resync_seconds: int, *, crds: bool = True
) -> Iterator[OperatorProcess]:
    """The operator as a process (``--resync-seconds``), logging to `log`; with `crds`, the
    MultisliceJob CRD is installed first."""
    if crds:
        api = control_plane.api_client()
        try:
            install_crds(api)
        finally:
            api.close()
    proc = OperatorProcess(
        control_plane.kubeconfig, ["--resync-seconds", str(resync_seconds)], log_path=log
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@contextmanager
def local_stack(control_plane: ControlPlane, log: Path, **options: Any) -> Iterator[LocalStack]:
    """The GKE simulator and the operator on `control_plane` (op_latency_s 1.0 unless
    `options` say otherwise; the other StackOptions from `options`)."""
    options.setdefault("op_latency_s", 1.0)
    stack = LocalStack(StackOptions(operator_log=log, **options), control_plane=control_plane)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def pods_and_nodes(api: client.ApiClient, ns: str, pool_prefix: str = "") -> str:
    """What a stuck restart looks like from the cluster: the namespace's pods (phase, node,
    being deleted, why not scheduled), its Jobs, the nodes of pools named `pool_prefix`*, and the
    namespace's last warning events (a FailedCreate of the Job controller, say)."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    lines = ["pods:"]
    for p in core.list_namespaced_pod(ns).items:
        sched = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
        why = f" {sched.reason}: {sched.message}" if sched and sched.status != "True" else ""
        gone = " deleting" if p.metadata.deletion_timestamp else ""
        lines.append(f"  {p.metadata.name} {p.status.phase} on={p.spec.node_name}{gone}{why}")
    lines.append("jobs:")
    for j in batch.list_namespaced_job(ns).items:
        s = j.status
        lines.append(
            f"  {j.metadata.name} active={s.active} failed={s.failed} ready={s.ready}"
            f" deleting={bool(j.metadata.deletion_timestamp)}"
        )
    lines.append("nodes:")
    for n in core.list_node().items:
        if n.metadata.name.startswith(pool_prefix or "\0"):
            ready = next((c.status for c in n.status.conditions or [] if c.type == "Ready"), "?")
            lines.append(f"  {n.metadata.name} ready={ready} taints={n.spec.taints}")
    lines.append("warnings:")
    warned = [e for e in core.list_namespaced_event(ns).items if e.type == "Warning"]
    for e in warned[-15:]:
        lines.append(f"  {e.involved_object.name} {e.reason}: {e.message}")
    return "\n".join(lines)
