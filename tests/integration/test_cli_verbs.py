"""`kubectl msj` list, logs, events, suspend, resume, checkpoint, delete against the real
apiserver, through the real kubectl (the verbs call it as a user's shell would).

The api profile has no operator: where a verb waits for the operator (delete, --wait), the test
writes the status the operator would write, through the status subresource, and reads what the
CLI printed meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from multislice_local.controlplane import ControlPlane, bin_dir
from multislice_local.harness import install_crds, wait_for
from multislice_operator.api import models
from multislice_operator.common import keys
from tests import msj

T0 = "2026-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def api(kube_api: ControlPlane) -> Any:
    api_client = kube_api.api_client()
    install_crds(api_client)
    yield api_client
    api_client.close()


def cli(cp: ControlPlane, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "multislice_operator.cli.main", *argv, "--kubectl", kubectl_path()],
        env=cp.client_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def cli_background(cp: ControlPlane, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "multislice_operator.cli.main", *argv, "--kubectl", kubectl_path()],
        env=cp.client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def kubectl_path() -> str:
    return str(bin_dir() / "kubectl")


def patch_status(api: Any, ns: str, name: str, status: dict[str, Any]) -> None:
    msj.custom(api).patch_namespaced_custom_object_status(
        models.GROUP, models.VERSION, ns, models.PLURAL, name, {"status": status}
    )


def patch_meta(api: Any, ns: str, name: str, meta: dict[str, Any]) -> None:
    msj.custom(api).patch_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, name, {"metadata": meta}
    )


def once(ready: Callable[[], bool], action: Callable[[], None], delay: float = 3.0) -> None:
    """In the background: when `ready()` (the CLI's write arrived), `delay` seconds later (the
    CLI has read the status once by then), `action()` (what the operator would write)."""

    def run() -> None:
        wait_for(ready, 60, "the CLI's write", interval=0.2)
        time.sleep(delay)
        action()

    threading.Thread(target=run, daemon=True).start()


# ---------------------------------------------------------------- list


def test_list_one_namespace_and_all(
    kube_api: ControlPlane, api: Any, namespace: Callable[..., str]
) -> None:
    a, b = namespace(kube_api, "list-a"), namespace(kube_api, "list-b")
    msj.create(api, a, msj.job("llm"))
    msj.create(api, a, msj.job("small", slices=4))
    msj.create(api, b, msj.job("other"))
    # A finished job: 300 s running, 100 s provisioning, on 32 chips: chip goodput 75%.
    patch_status(api, a, "llm", {
        "phase": "Succeeded", "readySlices": "2/2", "restarts": 3,
        "goodput": {
            "since": T0, "heldChips": 0,
            "seconds": {"provisioning": 100, "running": 300},
            "chipSeconds": {"provisioning": 3200, "running": 9600},
        },
    })  # fmt: skip

    rows = json.loads(cli(kube_api, "list", "-n", a, "-o", "json").stdout)
    assert [(r["namespace"], r["name"]) for r in rows] == [(a, "llm"), (a, "small")]
    llm, small = rows
    assert (llm["phase"], llm["readySlices"], llm["slices"], llm["restarts"]) == (
        "Succeeded", 2, 2, 3,
    )  # fmt: skip
    assert llm["chipGoodput"] == 0.75 and llm["accelerator"] == "v5litepod-16"
    assert (small["phase"], small["readySlices"], small["slices"]) == ("Pending", 0, 4)
    assert 0 <= small["ageSeconds"] < 600

    text = cli(kube_api, "list", "-n", a).stdout.splitlines()
    assert text[0].split() == [
        "NAME",
        "PHASE",
        "SLICES",
        "ACCELERATOR",
        "RESTARTS",
        "GOODPUT",
        "AGE",
    ]
    assert text[1].split()[:6] == ["llm", "Succeeded", "2/2", "v5litepod-16", "3", "75.0%"]
    assert text[2].split()[:6] == ["small", "Pending", "0/4", "v5litepod-16", "0", "-"]

    every = cli(kube_api, "list", "-A")
    assert every.returncode == 0, every.stderr
    lines = every.stdout.splitlines()
    assert lines[0].split()[0] == "NAMESPACE"
    mine = [line.split()[:2] for line in lines[1:] if line.split()[0] in (a, b)]
    assert mine == [[a, "llm"], [a, "small"], [b, "other"]]
    empty = cli(kube_api, "list", "-n", namespace(kube_api, "list-empty"))
    assert empty.returncode == 0 and empty.stdout == "" and "No MultisliceJobs" in empty.stderr


# ---------------------------------------------------------------- logs


def _pod(name: str, job: str, slice_: int, worker: int, attempt: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                keys.JOB_NAME: job,
                keys.JOBSET_JOB_INDEX: str(slice_),
                keys.JOB_COMPLETION_INDEX: str(worker),
                keys.JOBSET_RESTART_ATTEMPT: str(attempt),
            },
        },
        "spec": {"containers": [{"name": "train", "image": msj.IMAGE}]},
    }


def test_logs_reads_the_current_attempts_workers(
    kube_api: ControlPlane, api: Any, namespace: Callable[..., str]
) -> None:
    ns = namespace(kube_api, "logs")
    msj.create(api, ns, msj.job("llm"))
    core = client.CoreV1Api(api)
    pods = [("llm-slice-0-0-old00", 0, 0, 0), ("llm-slice-1-0-old11", 1, 0, 0)]  # attempt 0
    pods += [(f"llm-slice-{s}-{w}-new{s}{w}", s, w, 1) for s in (0, 1) for w in (0, 1)]
    pods += [("other-slice-0-0-abcde", 0, 0, 1)]  # another job's
    for name, s, w, attempt in pods:
        job = "other" if name.startswith("other") else "llm"
        core.create_namespaced_pod(ns, _pod(name, job, s, w, attempt))

    every = cli(kube_api, "logs", "llm", "-n", ns, "--print-pods")
    assert every.returncode == 0, every.stderr
    assert every.stdout.split() == ["llm-slice-0-0-new00", "llm-slice-1-0-new10"]
    one = cli(kube_api, "logs", "llm", "-n", ns, "--slice", "1", "--worker", "1", "--print-pods")
    assert one.stdout.split() == ["llm-slice-1-1-new11"]
    # The reads themselves: kubectl logs through the apiserver, which answers 204 No Content for a
    # pod without a node (no kubelet serves logs here), so the output is empty and the header on
    # stderr says which pods were read.
    read = cli(kube_api, "logs", "llm", "-n", ns, "--slice", "1", "--worker", "1")
    assert read.returncode == 0, read.stderr
    assert read.stderr == "# llm-slice-1-1-new11: slice 1, worker 1, restart attempt 1\n"
    assert read.stdout == ""
    both = cli(kube_api, "logs", "llm", "-n", ns, "--tail", "5")
    assert both.returncode == 0, both.stderr
    assert both.stderr.splitlines() == [
        "# llm-slice-0-0-new00: slice 0, worker 0, restart attempt 1",
        "# llm-slice-1-0-new10: slice 1, worker 0, restart attempt 1",
    ]
    missing = cli(kube_api, "logs", "llm", "-n", ns, "--worker", "7")
    assert missing.returncode == 2
    assert f"{ns}/llm: no pod for worker 7 (job phase Pending, 4 pods in the current attempt)" in (
        missing.stderr
    )
    gone = cli(kube_api, "logs", "nope", "-n", ns)
    assert gone.returncode == 2 and "NotFound" in gone.stderr


# ---------------------------------------------------------------- events


def _event(ns: str, name: str, kind: str, obj: str, reason: str, at: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "involvedObject": {"kind": kind, "name": obj, "namespace": ns},
        "reason": reason,
        "message": f"{reason} on {obj}",
        "type": "Normal",
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
        "source": {"component": "test"},
    }


def test_events_of_the_job_and_what_it_owns(
    kube_api: ControlPlane, api: Any, namespace: Callable[..., str]
) -> None:
    ns = namespace(kube_api, "events")
    msj.create(api, ns, msj.job("llm"))
    core = client.CoreV1Api(api)
    ours = [
        ("MultisliceJob", "llm", "Provisioning", "2026-01-01T00:00:01Z"),
        ("JobSet", "llm", "Created", "2026-01-01T00:00:03Z"),
        ("Job", "llm-slice-1", "SuccessfulCreate", "2026-01-01T00:00:04Z"),
        ("Pod", "llm-slice-0-2-abcde", "Scheduled", "2026-01-01T00:00:05Z"),
        ("Workload", "jobset-llm-1a2b3", "Admitted", "2026-01-01T00:00:02Z"),
    ]
    theirs = [
        ("MultisliceJob", "llm-2", "Provisioning", "2026-01-01T00:00:01Z"),
        ("Pod", "llm-2-slice-0-0-abcde", "Scheduled", "2026-01-01T00:00:05Z"),
        ("JobSet", "llm-slice", "Created", "2026-01-01T00:00:03Z"),
    ]
    for i, (kind, obj, reason, at) in enumerate(ours + theirs):
        core.create_namespaced_event(ns, _event(ns, f"e{i}", kind, obj, reason, at))

    data = json.loads(cli(kube_api, "events", "llm", "-n", ns, "-o", "json").stdout)
    assert [e["reason"] for e in data] == [
        "Provisioning",
        "Admitted",
        "Created",
        "SuccessfulCreate",
        "Scheduled",
    ]  # fmt: skip  (by time; nothing of llm-2's or of a JobSet merely named like a child)
    text = cli(kube_api, "events", "llm", "-n", ns).stdout.splitlines()
    assert text[0].split()[:4] == ["LAST", "SEEN", "TYPE", "REASON"]
    assert "pod/llm-slice-0-2-abcde" in text[-1] and "Scheduled on llm-slice-0-2-abcde" in text[-1]
    assert len(text) == 1 + len(ours)


# ---------------------------------------------------------------- suspend, resume


def test_suspend_and_resume(
    kube_api: ControlPlane, api: Any, namespace: Callable[..., str]
) -> None:
    ns = namespace(kube_api, "suspend")
    msj.create(api, ns, msj.job("llm"))
    patch_status(api, ns, "llm", {"phase": "Running"})

    once(
        lambda: msj.get(api, ns, "llm")["spec"].get("suspend") is True,  # type: ignore[index]
        lambda: patch_status(api, ns, "llm", {"phase": "Suspended"}),
    )
    out = cli(kube_api, "suspend", "llm", "-n", ns, "--wait", "--timeout", "60")
    assert out.returncode == 0, out.stderr
    assert msj.get(api, ns, "llm")["spec"]["suspend"] is True  # type: ignore[index]
    assert out.stdout.splitlines() == [
        f"{ns}/llm: suspend requested (pods deleted; in Managed mode the node pools are released)",
        "  phase Running",
        "  phase Suspended",
        f"{ns}/llm: suspended",
    ]
    resumed = cli(kube_api, "resume", "llm", "-n", ns)
    assert resumed.returncode == 0, resumed.stderr
    assert msj.get(api, ns, "llm")["spec"]["suspend"] is False  # type: ignore[index]
    timeout = cli(kube_api, "resume", "llm", "-n", ns, "--wait", "--timeout", "1")
    assert timeout.returncode == 1 and "not resumed after 1s (phase Suspended)" in timeout.stderr
    assert cli(kube_api, "suspend", "nope", "-n", ns).returncode == 2


# ---------------------------------------------------------------- checkpoint


def test_checkpoint_request(
    kube_api: ControlPlane, api: Any, namespace: Callable[..., str]
) -> None:
    ns = namespace(kube_api, "checkpoint")
    msj.create(api, ns, msj.job("llm"))

    def annotation() -> str | None:
        meta = msj.get(api, ns, "llm")["metadata"]  # type: ignore[index]
        return (meta.get("annotations") or {}).get(keys.CHECKPOINT_REQUEST)  # type: ignore[no-any-return]

    first = cli(kube_api, "checkpoint", "llm", "-n", ns)
    assert first.returncode == 0, first.stderr
    assert (annotation() or "").startswith("cli-") and annotation()[4:].isdigit()  # type: ignore[index]
    bad = cli(kube_api, "checkpoint", "llm", "-n", ns, "--id", 'say "now"')
    assert bad.returncode == 2 and "--id" in bad.stderr and "double quote" in bad.stderr
    assert (annotation() or "").startswith("cli-")  # unchanged

    def operator_and_workload() -> None:
        patch_status(api, ns, "llm", {"checkpoint": {
            "requestId": "before-upgrade", "source": "user", "podsAnnotated": 8,
        }})  # fmt: skip
        time.sleep(3)
        patch_status(api, ns, "llm", {"checkpoint": {
            "requestId": "before-upgrade", "source": "user", "podsAnnotated": 8, "savedStep": 1200,
        }})  # fmt: skip

    once(lambda: annotation() == "before-upgrade", operator_and_workload)
    out = cli(kube_api, "checkpoint", "llm", "-n", ns, "--id", "before-upgrade", "--wait")
    assert out.returncode == 0, out.stderr
    assert annotation() == "before-upgrade"
    assert out.stdout.splitlines() == [
        f"{ns}/llm: checkpoint requested (id before-upgrade)",
        "  waiting for the operator to take the request",
        "  8 pods asked; waiting for the save",
        "  saved at step 1200",
        f"{ns}/llm: saved",
    ]


# ---------------------------------------------------------------- delete


def test_delete_waits_until_the_pools_are_released(
    kube_api: ControlPlane, api: Any, namespace: Callable[..., str]
) -> None:
    ns = namespace(kube_api, "delete")
    body = msj.job("llm")
    body["metadata"]["finalizers"] = [keys.FINALIZER]
    msj.create(api, ns, body)
    slices = [{"index": i, "hosts": 4, "nodePool": f"pool-{i}", "phase": "Running"} for i in (0, 1)]
    patch_status(api, ns, "llm", {"phase": "Running", "slices": slices})

    proc = cli_background(kube_api, "delete", "llm", "-n", ns, "--timeout", "120")
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(iter(proc.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    first = (
        "  deleting: releasing 2 node pools first; node pools: pool-0 (Releasing), "
        "pool-1 (Releasing)"
    )
    second = "  deleting: releasing 1 node pools first; node pools: pool-1 (Releasing)"
    try:
        wait_for(
            lambda: (msj.get(api, ns, "llm") or {})["metadata"].get("deletionTimestamp"),
            30, "the deletion",
        )  # fmt: skip
        # The operator's answers, as flow._deleting writes them; each held until the CLI said it
        # (a fixed 2.5 s each was missed once by a CLI that polls every second, under load).
        released = [{**s, "phase": "Releasing"} for s in slices]
        patch_status(api, ns, "llm", {"message": "deleting: releasing 2 node pools first",
                                      "slices": released})  # fmt: skip
        wait_for(lambda: first + "\n" in printed, 60, "the CLI's first progress line")
        gone = {**slices[0], "phase": "Pending", "nodePool": None}
        patch_status(api, ns, "llm", {"message": "deleting: releasing 1 node pools first",
                                      "slices": [gone, released[1]]})  # fmt: skip
        wait_for(lambda: second + "\n" in printed, 60, "the CLI's second progress line")
        patch_meta(api, ns, "llm", {"finalizers": None})
        proc.wait(timeout=60)
        reader.join(timeout=10)
        err = proc.stderr.read()  # type: ignore[union-attr]
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    lines = "".join(printed).splitlines()
    assert (
        lines[0] == f"{ns}/llm: deleting; the operator releases every node pool before the job goes"
    )
    assert lines[-1] == f"{ns}/llm: deleted; every node pool released"
    progress = lines[1:-1]
    # Each change once, in order (the first poll may come before the operator's first word).
    assert progress[-2:] == [first, second]
    assert msj.get(api, ns, "llm", missing_ok=True) is None


def test_delete_no_wait_and_missing(
    kube_api: ControlPlane, api: Any, namespace: Callable[..., str]
) -> None:
    ns = namespace(kube_api, "delete-nowait")
    body = msj.job("llm")
    body["metadata"]["finalizers"] = [keys.FINALIZER]
    msj.create(api, ns, body)
    out = cli(kube_api, "delete", "llm", "-n", ns, "--no-wait")
    assert out.returncode == 0, out.stderr
    obj = msj.get(api, ns, "llm")
    assert obj is not None and obj["metadata"].get("deletionTimestamp")  # held by the finalizer
    timeout = cli(kube_api, "delete", "llm", "-n", ns, "--timeout", "1")
    assert timeout.returncode == 1 and "still deleting after 1s" in timeout.stderr
    patch_meta(api, ns, "llm", {"finalizers": None})
    missing = cli(kube_api, "delete", "llm", "-n", ns)
    assert missing.returncode == 2 and "NotFound" in missing.stderr
