"""In-place restart (issue 40, docs/restarts.md): the JobSet and pods rendered for it, what the
start-up check concludes from what it finds, and what a job says on a cluster with and without
it (a condition, an event, status.lastRestart.strategy)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from kopf._cogs.clients import errors as kopf_errors

from multislice_operator.api.models import (
    EXIT_HANG,
    ConditionType,
    MultisliceJobStatus,
    RestartCause,
)
from multislice_operator.common import keys
from multislice_operator.common.pools import PoolState
from multislice_operator.controller import observe
from multislice_operator.plugins import inplace_shell
from multislice_operator.plugins.inplace_shell import InPlaceFindings
from multislice_operator.reconcile import (
    CreateJobSet,
    JobSetObservation,
    Reason,
    SliceObservation,
    StrategySupport,
    ValidateJobSet,
)
from multislice_operator.reconcile.types import Observed as RawObserved
from multislice_operator.render import inplace
from multislice_operator.render.jobset import render_jobset
from multislice_operator.settings import Settings
from tests.unit import jobs
from tests.unit.jobs import Observed, spec_and_plan

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
AGENT = "registry.example/in-place-restart-agent:v0.12.0"
WITH_AGENT = Settings(in_place_agent_image=AGENT)
EXISTING = {"provisioning": {"mode": "Existing"}}
SLICES = [SliceObservation(i, f"pool-{i}", PoolState.READY, 4) for i in range(2)]
run = partial(jobs.run, now=NOW)


def rendered(**spec: Any) -> dict[str, Any]:
    s, plan = spec_and_plan(**spec)
    return render_jobset(plan, s, restart_strategy="InPlaceRestart", settings=WITH_AGENT)


def pod_of(js: dict[str, Any]) -> dict[str, Any]:
    return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


# ------------------------------------------------------------------------- render


def test_the_jobset_meets_what_jobsets_webhook_demands_under_in_place_restart() -> None:
    js = rendered()
    assert js["spec"]["failurePolicy"]["restartStrategy"] == "InPlaceRestart"
    job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    # pkg/webhooks/jobset_webhook.go (v0.12.0): MaxInt32, Failed, completions == parallelism.
    assert job["backoffLimit"] == 2**31 - 1
    assert job["podReplacementPolicy"] == "Failed"
    assert job["completions"] == job["parallelism"] == 4
    # The disruption and fatal rules still fail the Job, which JobSet then recreates or fails.
    assert [r["action"] for r in job["podFailurePolicy"]["rules"]] == ["FailJob", "FailJob"]


def test_the_agent_sidecar_its_barrier_probe_and_account() -> None:
    pod = pod_of(rendered())
    (agent,) = pod["initContainers"]
    assert agent["name"] == "in-place-restart-agent" and agent["image"] == AGENT
    assert agent["restartPolicy"] == "Always"  # a sidecar
    # The agent where JobSet's own agent image has it (its cmd/in-place-restart-agent/Dockerfile:
    # ENTRYPOINT ["/in-place-restart-agent"]), which the operator's image carries too: its own
    # entry point is the operator, so the command is named.
    assert agent["command"] == ["/in-place-restart-agent"]
    assert agent["restartPolicyRules"] == [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}
    ]
    probe = agent["startupProbe"]
    assert probe["httpGet"] == {"path": "/barrier-is-down", "port": 8081}
    assert probe["periodSeconds"] * probe["failureThreshold"] == 600
    env = {e["name"]: e for e in agent["env"]}
    assert env["JOBSET_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"
    )
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["STARTUP_PROBE_PORT"]["value"] == "8081"
    assert pod["serviceAccountName"] == "multislice-inplace-restart"
    # The user's own service account (workload identity) is kept; the agent runs as it.
    template = {
        "spec": {"serviceAccountName": "trainer", "containers": [{"name": "c", "image": "i"}]}
    }
    assert pod_of(rendered(template=template))["serviceAccountName"] == "trainer"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({}, {"operator": "NotIn", "values": [0, 78]}),
        ({"nonRetryableExitCodes": [3, 78]}, {"operator": "NotIn", "values": [0, 3, 78]}),
        (
            {"exitCodePolicy": "RestartIfListed", "restartExitCodes": [42]},
            {"operator": "In", "values": [42, 75]},
        ),
    ],
)
def test_only_retryable_exits_restart_in_place(policy: dict[str, Any], expected: Any) -> None:
    """A fatal exit matches no rule: the pod fails and podFailurePolicy fails the job."""
    tpu = pod_of(rendered(failurePolicy=policy))["containers"][0]
    assert tpu["restartPolicy"] == "Never"
    assert tpu["restartPolicyRules"] == [{"action": "RestartAllContainers", "exitCodes": expected}]


def test_the_workload_reads_its_restart_attempt_from_the_agents_annotation() -> None:
    """An in-place restart does not move JobSet's restart-attempt label: the program's restart
    attempt (which its first-attempt-only hooks and its logs read) follows the agent's."""
    env = {e["name"]: e for e in pod_of(rendered())["containers"][0]["env"]}
    assert env["MULTISLICE_RESTART_ATTEMPT"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['jobset.sigs.k8s.io/in-place-restart-attempt']"
    )
    s, plan = spec_and_plan()
    recreate = {e["name"]: e for e in pod_of(render_jobset(plan, s))["containers"][0]["env"]}
    assert recreate["MULTISLICE_RESTART_ATTEMPT"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"
    )


def test_without_in_place_nothing_of_it_is_rendered() -> None:
    s, plan = spec_and_plan()
    js = render_jobset(plan, s)
    pod = pod_of(js)
    assert js["spec"]["failurePolicy"]["restartStrategy"] == "Recreate"
    assert "initContainers" not in pod and "restartPolicyRules" not in pod["containers"][0]
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] == 0


def test_the_namespace_objects_bind_the_pods_account_to_the_agents_role() -> None:
    ours = inplace.render_rbac("team-a", "multislice-inplace-restart")
    assert [o["kind"] for _, o in ours] == ["ServiceAccount", "RoleBinding"]
    path, binding = ours[1]
    assert path.endswith("/namespaces/team-a/rolebindings/multislice-inplace-restart-"
                         "multislice-inplace-restart")  # fmt: skip
    assert binding["roleRef"]["name"] == "multislice-inplace-restart"
    theirs = inplace.render_rbac("team-a", "trainer")
    assert [o["kind"] for _, o in theirs] == ["RoleBinding"]  # never create the user's account
    assert theirs[0][1]["subjects"] == [
        {"kind": "ServiceAccount", "name": "trainer", "namespace": "team-a"}
    ]


# ------------------------------------------------------------------------- discovery


def crd(*strategies: str) -> dict[str, Any]:
    prop = {"type": "string", "enum": list(strategies)}
    schema = {
        "properties": {
            "spec": {"properties": {"failurePolicy": {"properties": {"restartStrategy": prop}}}}
        }
    }
    version = {"name": "v1alpha2", "served": True, "schema": {"openAPIV3Schema": schema}}
    return {"spec": {"versions": [version]}}


V012 = crd("Recreate", "BlockingRecreate", "InPlaceRestart")
GOOD = InPlaceFindings(AGENT, V012, None, "v1.36.3", True)
GATE_OFF = (
    'admission webhook "vjobset.kb.io" denied the request: InPlaceRestart restart strategy '
    "cannot be set when InPlaceRestart feature gate is disabled"
)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"agent_image": ""}, "no in-place restart agent image is configured"),
        ({"crd": crd("Recreate", "BlockingRecreate")}, "JobSet is older than v0.11.0"),
        ({"crd": None}, "JobSet is older than v0.11.0"),
        ({"gate_refusal": GATE_OFF}, "InPlaceRestart feature gate is off"),
        ({"kube_version": "v1.34.4"}, "Kubernetes v1.34.4 has no RestartAllContainers"),
        ({"pod_rule_kept": False}, "RestartAllContainersOnContainerExits is off"),
    ],
)
def test_each_missing_piece_says_why_in_place_is_not_used(changes: dict[str, Any], why: str):
    found = InPlaceFindings(**{**GOOD.__dict__, **changes})
    support = inplace_shell.in_place_support(found)
    assert not support.usable
    assert why in support.why


def test_everything_found_uses_in_place() -> None:
    support = inplace_shell.in_place_support(GOOD)
    assert support == StrategySupport(True, "JobSet with InPlaceRestart on Kubernetes v1.36.3")
    assert inplace_shell.kube_minor("v1.35.0-gke.1") == (1, 35)


def test_the_probe_jobset_is_one_jobsets_webhook_judges_only_on_the_gate() -> None:
    probe = inplace_shell.probe_jobset("team-a")
    job = probe["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert probe["spec"]["failurePolicy"]["restartStrategy"] == "InPlaceRestart"
    assert (job["backoffLimit"], job["podReplacementPolicy"]) == (2**31 - 1, "Failed")
    assert job["completions"] == job["parallelism"]
    # What the chart's JobSet admission policy demands of the operator's JobSets.
    meta = probe["metadata"]
    assert meta["namespace"] == "team-a"
    assert meta["labels"]["multislice.dev/job-name"] == meta["name"]
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "multislice-operator"
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == (
        "MultisliceJob",
        meta["name"],
        True,
    )


def test_the_probes_go_to_a_namespace_the_operator_watches() -> None:
    assert inplace_shell.probe_namespace([]) == "default"
    assert inplace_shell.probe_namespace(["team-*", "ml"]) == "ml"


class FakeKube:
    """The apiserver's answers to the start-up check's dry runs."""

    def __init__(self, jobset_error: Exception | None, job_kept: bool) -> None:
        self.jobset_error, self.job_kept = jobset_error, job_kept

    async def dry_run_returned(self, body: dict[str, Any]) -> dict[str, Any]:
        if body["kind"] == "JobSet":
            if self.jobset_error is not None:
                raise self.jobset_error
            return body
        if not self.job_kept:
            body["spec"]["template"]["spec"]["containers"][0].pop("restartPolicyRules")
        return body

    async def server_version(self) -> str:
        return "v1.36.3"


def _found(kube: FakeKube) -> InPlaceFindings:
    from types import SimpleNamespace

    settings = SimpleNamespace(in_place_agent_image=AGENT, namespaces=[])
    rt: Any = SimpleNamespace(settings=settings, kube=kube)
    return asyncio.run(inplace_shell.find_in_place(rt, V012))


def test_the_check_reads_the_webhooks_gate_refusal_and_a_dropped_rule() -> None:
    assert inplace_shell.in_place_support(_found(FakeKube(None, True))).usable
    gate = kopf_errors.APIForbiddenError({"message": GATE_OFF}, status=403, headers={})
    assert "gate is off" in inplace_shell.in_place_support(_found(FakeKube(gate, True))).why
    dropped = inplace_shell.in_place_support(_found(FakeKube(None, False)))
    assert "RestartAllContainersOnContainerExits is off" in dropped.why
    # RBAC (or any other refusal) is no answer: the check raises and is tried again.
    rbac = kopf_errors.APIForbiddenError(
        {"message": "jobsets is forbidden"}, status=403, headers={}
    )
    with pytest.raises(kopf_errors.APIError):
        _found(FakeKube(rbac, True))


# ------------------------------------------------------------------------- decide


def create_pass(support: StrategySupport | None) -> Any:
    return run(
        obs=Observed(
            now=NOW,
            slices=list(SLICES),
            support={} if support is None else {"InPlaceRestart": support},
        ),
        **EXISTING,
    )


def test_a_cluster_with_in_place_creates_the_jobset_for_it_and_says_so() -> None:
    d = create_pass(StrategySupport(True, "JobSet with InPlaceRestart on Kubernetes v1.36.3"))
    assert d.actions == [CreateJobSet(restart_strategy="InPlaceRestart")]
    cond = d.status.condition(ConditionType.RESTART_IN_PLACE)
    assert cond is not None and (cond.status, cond.reason) == ("True", Reason.IN_PLACE_RESTART)
    assert Reason.IN_PLACE_UNAVAILABLE not in [e.reason for e in d.events]


def test_a_cluster_without_it_recreates_with_a_condition_saying_why_and_no_event() -> None:
    # A fact about the cluster, not the job: the condition says it; an event per job was a
    # fourth write for every job on a cluster without an agent image (issue 57).
    why = "the installed JobSet is older than v0.11.0: ..."
    d = create_pass(StrategySupport(False, why))
    assert d.actions == [CreateJobSet(restart_strategy="Recreate")]
    cond = d.status.condition(ConditionType.RESTART_IN_PLACE)
    assert cond is not None
    assert (cond.status, cond.reason) == ("False", Reason.IN_PLACE_UNAVAILABLE)
    assert cond.message == f"every restart recreates the pods: {why}"
    assert [e.reason for e in d.events if e.reason == Reason.IN_PLACE_UNAVAILABLE] == []


def test_not_found_out_yet_recreates_and_says_nothing() -> None:
    d = create_pass(None)
    assert d.actions == [CreateJobSet()]
    assert d.status.condition(ConditionType.RESTART_IN_PLACE) is None
    assert d.events == []


def test_the_dry_run_judges_the_jobset_that_will_be_created() -> None:
    obs = RawObserved(now=NOW, slices=[], support={"InPlaceRestart": StrategySupport(True, "ok")})
    d = run(obs=obs)  # Managed, no pool yet, not judged: the dry run comes first
    assert d.actions == [ValidateJobSet(restart_strategy="InPlaceRestart")]


@pytest.mark.parametrize(
    ("counted", "cause", "strategy"),
    [(1, RestartCause.WORKLOAD, "InPlaceRestart"), (0, RestartCause.DISRUPTION, "Recreate")],
)
def test_last_restart_says_which_strategy_ran(counted: int, cause: RestartCause, strategy: str):
    old = MultisliceJobStatus.from_dict({"phase": "Running", "jobSet": "job"})
    old.conditions = create_pass(StrategySupport(True, "ok")).status.conditions
    js = JobSetObservation(
        ready_jobs=0, restarts=1, restarts_counted=counted, restart_strategy="InPlaceRestart"
    )
    d = run(old, Observed(now=NOW, slices=list(SLICES), jobset=js), **EXISTING)
    last = d.status.last_restart
    assert last is not None and (last.cause, last.strategy) == (cause.value, strategy)
    assert d.status.restarts_by_cause is not None
    assert d.status.restarts_by_cause.model_dump()[cause.value] == 1


# ------------------------------------------------------------------------- counting
# JobSet counts an in-place restart in status.currentInPlaceRestartAttempt, not in
# status.restarts (kubernetes-sigs/jobset v0.12.0 pkg/controllers/in_place_restart.go).


def jobset_body(restarts: int, counted: int, current: int | None) -> dict[str, Any]:
    status: dict[str, Any] = {"restarts": restarts, "restartsCountTowardsMax": counted}
    if current is not None:
        status["currentInPlaceRestartAttempt"] = current
    meta = {
        "name": "job",
        "uid": "js-uid",
        "labels": {keys.MANAGED_BY: keys.MANAGED_BY_VALUE},
        "ownerReferences": [{"controller": True, "uid": jobs.META.uid}],
    }
    spec = {"failurePolicy": {"restartStrategy": "InPlaceRestart"}}
    return {"metadata": meta, "spec": spec, "status": status}


def observed_jobset(restarts: int, counted: int, current: int | None) -> JobSetObservation:
    summary = observe.summarize_jobset(jobset_body(restarts, counted, current))
    js = observe.jobset_observation(summary, ("ns", "job"), jobs.META.uid)
    assert js is not None
    return js


def in_place_status(**fields: Any) -> MultisliceJobStatus:
    old = MultisliceJobStatus.from_dict({"phase": "Running", "jobSet": "job", **fields})
    old.conditions = create_pass(StrategySupport(True, "ok")).status.conditions
    return old


def test_an_in_place_restart_counts_one_restart_of_the_program() -> None:
    js = observed_jobset(restarts=0, counted=0, current=1)
    d = run(in_place_status(), Observed(now=NOW, slices=list(SLICES), jobset=js), **EXISTING)
    assert d.status.restarts == 1
    assert d.status.restarts_by_cause is not None
    assert d.status.restarts_by_cause.model_dump() == {
        "disruption": 0, "workload": 1, "hang": 0, "startup": 0, "resize": 0
    }  # fmt: skip
    last = d.status.last_restart
    assert last is not None and (last.restart, last.cause, last.strategy) == (
        1, "workload", "InPlaceRestart"
    )  # fmt: skip
    restarting = [e for e in d.events if e.reason == Reason.RESTARTING_ALL_SLICES]
    assert (
        len(restarting) == 1 and "1/10 of spec.failurePolicy.maxRestarts" in restarting[0].message
    )


@pytest.mark.parametrize(
    ("restarts", "counted", "current", "attempt", "charged"),
    [
        (0, 0, None, 0, 0),  # a JobSet without in-place restart: JobSet's counters as they are
        (0, 0, 0, 0, 0),  # the first start: every agent wrote 0
        (0, 0, 2, 2, 2),  # two in-place restarts, both charged (JobSet's exceededMaxRestarts)
        # A recreate under InPlaceRestart: the new pods' agents write current + 1, so JobSet's
        # current attempt counts it too. Once, not twice; a disruption stays uncharged.
        (1, 0, 1, 1, 0),
        (1, 0, 3, 3, 2),  # a disruption, then two program failures restarted in place
        (2, 1, 1, 2, 1),  # a recreate counted before the agents agree on their attempt
    ],
)
def test_the_attempt_is_every_restart_once(
    restarts: int, counted: int, current: int | None, attempt: int, charged: int
) -> None:
    js = observed_jobset(restarts, counted, current)
    assert (js.restarts, js.restarts_counted) == (attempt, charged)


def test_a_pods_attempt_counts_its_in_place_restarts() -> None:
    js = observed_jobset(restarts=1, counted=0, current=3)
    pod = {
        "metadata": {
            "name": "job-slice-0-0",
            "labels": {keys.JOBSET_UID: "js-uid", keys.JOBSET_RESTART_ATTEMPT: "1"},
            "annotations": {keys.IN_PLACE_RESTART_ATTEMPT: "3"},
        },
        "status": {"phase": "Running"},
    }
    without = {**pod, "metadata": {**pod["metadata"], "annotations": {}}}
    records = observe.pod_records([observe.summarize_pod(pod), observe.summarize_pod(without)], js)
    assert [p.attempt for p in records] == [3, 1]


def test_an_in_place_restart_records_its_recovery_once_every_slice_runs_again() -> None:
    js = observed_jobset(restarts=0, counted=0, current=1)
    down = dataclasses.replace(js, ready_jobs=0, restarts_counted=1)
    first = run(in_place_status(), Observed(now=NOW, slices=list(SLICES), jobset=down), **EXISTING)
    assert first.status.last_restart is not None
    assert first.status.last_restart.recovery_seconds is None
    later = NOW + timedelta(seconds=12)
    up = dataclasses.replace(js, ready_jobs=2, restarts=1, restarts_counted=1)
    pods = jobs.running({0: 4, 1: 4}, attempt=1)
    d = run(
        first.status, Observed(now=later, slices=list(SLICES), jobset=up, pods=pods), **EXISTING
    )
    last = d.status.last_restart
    assert last is not None and last.strategy == "InPlaceRestart"
    assert last.recovery_seconds == 12
    assert d.status.restarts == 1


def restarted_pod(name: str, attempt: int, tpu_exit: int, agent_exit: int, message: str = ""
                  ) -> dict[str, Any]:  # fmt: skip
    """A pod after the kubelet restarted all its containers in place: running again on
    `attempt`, with its TPU container's and its agent's previous runs in lastState."""

    def last(container: str, code: int, said: str = "") -> dict[str, Any]:
        terminated = {"exitCode": code, "reason": "Error", "message": said}
        return {"name": container, "restartCount": 1, "lastState": {"terminated": terminated},
                "state": {"running": {}}}  # fmt: skip

    return {
        "metadata": {
            "name": name,
            "labels": {keys.JOBSET_UID: "js-uid", keys.JOBSET_RESTART_ATTEMPT: "0"},
            "annotations": {keys.IN_PLACE_RESTART_ATTEMPT: str(attempt)},
        },
        "spec": {"containers": [{"name": "tpu"}], "initContainers": [{"name": "agent"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [last("tpu", tpu_exit, message)],
            "initContainerStatuses": [last(inplace.AGENT_CONTAINER, agent_exit)],
        },
    }


@pytest.mark.parametrize(("code", "message", "cause"), [
    (EXIT_HANG, "", RestartCause.HANG),
    (1, json.dumps({"reason": "hang", "step": 40}), RestartCause.HANG),  # said hang
    (17, "", RestartCause.WORKLOAD),
])  # fmt: skip
def test_an_in_place_restart_counts_by_the_exit_of_the_pod_that_failed(
    code: int, message: str, cause: RestartCause
) -> None:
    """The pod whose program exited is restarted by the kubelet (its agent stopped with it,
    143); every other pod by its agent's exit 1 at JobSet's word (its program killed, 143). Only
    the first one's exit says why, though no pod is failed."""
    js = observed_jobset(restarts=0, counted=0, current=1)
    summaries = [
        observe.summarize_pod(restarted_pod("job-slice-0-0", 1, 143, inplace.AGENT_EXIT_CODE)),
        observe.summarize_pod(restarted_pod("job-slice-1-0", 1, code, 143, message)),
        observe.summarize_pod(restarted_pod("job-slice-1-1", 1, 143, inplace.AGENT_EXIT_CODE)),
    ]
    pods = observe.pod_records(summaries, js)
    assert not any(p.failed for p in pods)  # all run again, on attempt 1
    d = run(in_place_status(), Observed(now=NOW, slices=list(SLICES), jobset=js, pods=pods),
            **EXISTING)  # fmt: skip
    assert d.status.restarts_by_cause is not None
    counts = d.status.restarts_by_cause.model_dump()
    assert counts == {**dict.fromkeys(counts, 0), cause.value: 1}
    failure = d.status.last_failure
    assert failure is not None and (failure.pod, failure.exit_code, failure.restart_attempt) == (
        "job-slice-1-0", code, 0
    )  # fmt: skip


def kubelet_restarted_pod(name: str, attempt: int) -> dict[str, Any]:
    """A pod as a real kubelet reports it once it restarted all its containers in place
    (Kubernetes v1.36.3 pkg/kubelet/kubelet_pods.go: every removed container's lastState is
    137, reason RestartingAllContainers, whichever exit fired the rule). Seen on the real
    nodes: the program's own exit survives only in its `state` until the kubelet removes it."""
    removed = {
        "exitCode": 137,
        "reason": "RestartingAllContainers",
        "message": "The container is removed because RestartAllContainers in place",
    }
    pod = restarted_pod(name, attempt, 0, 0)
    for key in ("containerStatuses", "initContainerStatuses"):
        for status in pod["status"][key]:
            status["lastState"] = {"terminated": dict(removed)}
    return pod


def test_the_kubelets_record_of_a_restart_in_place_is_no_pods_failure() -> None:
    """After a real kubelet's restart of all containers every pod's lastState reads 137: none
    of them is the pod that failed. Read as failures, they named an arbitrary pod with exit 137
    as the job's last failure; the restart itself is JobSet's to count, charged as a program
    failure when its exit was not seen."""
    js = observed_jobset(restarts=0, counted=1, current=1)
    summaries = [
        observe.summarize_pod(kubelet_restarted_pod(f"job-slice-{s}-0", 1)) for s in (0, 1)
    ]
    assert [s["lastExit"] for s in summaries] == [None, None]
    pods = observe.pod_records(summaries, js)
    d = run(in_place_status(), Observed(now=NOW, slices=list(SLICES), jobset=js, pods=pods),
            **EXISTING)  # fmt: skip
    assert d.status.restarts_by_cause is not None
    assert d.status.restarts_by_cause.workload == 1
    assert d.status.last_failure is None or d.status.last_failure.exit_code != 137
