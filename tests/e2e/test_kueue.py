"""Kueue is the front door, with the real Kueue v0.19 controller (the ``kueue`` profile): quota
first, then the gang through the operator's AdmissionCheck, then admission. The GKE simulator's
pools become kwok TPU nodes; a witness looks at each job's Workload at every pool create."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from multislice_local import queues
from multislice_local.gke_sim import KubeNodeRegistrar
from multislice_local.harness import wait_for
from multislice_local.stack import LocalStack
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.planning.plan import node_pool_name
from multislice_operator.reconcile.reasons import Reason
from tests import msj

FLAVOR = "tpu-v5e"
CHIPS = 32  # v5litepod-16 x 2 slices


@pytest.fixture(scope="module")
def stack(kube_kueue, tmp_path_factory):
    log = tmp_path_factory.mktemp("kueue") / "operator.log"
    with msj.local_stack(kube_kueue, log, profile="kueue") as s:
        queues.apply(s.api, [queues.resource_flavor(FLAVOR, "tpu-v5-lite-podslice"),
                             queues.admission_check()])  # fmt: skip
        yield s


class Env:
    """One test's namespaces, ClusterQueue and LocalQueues (named after the test)."""

    def __init__(self, stack: LocalStack, ns: str) -> None:
        self.stack, self.ns = stack, ns
        self.custom = client.CustomObjectsApi(stack.api)
        self.core = client.CoreV1Api(stack.api)
        assert stack.sim is not None
        self.sim = stack.sim
        self.witness = queues.QuotaWitness(stack.sim, stack.api).install()
        self.objects: list[dict[str, Any]] = []

    def queue(self, chips: int = 64, **cq: Any) -> str:
        """A ClusterQueue of `chips` google.com/tpu listing the check, and LocalQueue `lq`."""
        name = f"cq-{self.ns}"
        objs = [
            queues.cluster_queue(name, chips, FLAVOR, **cq),
            queues.local_queue(self.ns, "lq", name),
        ]
        queues.apply(self.stack.api, objs)
        self.objects += objs
        queues.wait_active(self.stack.api, name)
        return name

    def create(
        self, name: str, run: str = "6s", labels: dict[str, str] | None = None, **spec: Any
    ) -> None:
        labels = {keys.KUEUE_QUEUE_NAME: "lq", **(labels or {})}
        body = msj.job(name, run=run, failure_policy={"maxRestarts": 5}, labels=labels, **spec)
        msj.create(self.stack.api, self.ns, body)

    def status(self, name: str) -> dict[str, Any]:
        return msj.status(self.stack.api, self.ns, name, missing_ok=True)

    def phase(self, name: str, phase: str, timeout: float = 120) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            st = self.status(name)
            if phase != "Failed" and st.get("phase") == "Failed":
                raise AssertionError(f"{name} failed: {st}")
            return st if st.get("phase") == phase else None

        return wait_for(check, timeout, f"{name} {phase}", interval=0.3, on_timeout=self.dump)

    def wait_running(self, selector: str, count: int, what: str) -> list[str]:
        """The `count` pods the label selector picks, each Running and none being deleted (a
        suspension's or a restart's old pods still say Running until their grace ends)."""

        def up() -> list[str] | None:
            found = self.core.list_namespaced_pod(self.ns, label_selector=selector).items
            live = [
                p.metadata.name
                for p in found
                if p.status.phase == "Running" and not p.metadata.deletion_timestamp
            ]
            return live if len(live) == count else None

        return wait_for(up, 120, what, on_timeout=self.dump)

    def finish(self, name: str, what: str) -> None:
        """End a job whose pods run until told to: each host's pod, once Running, succeeds."""
        from multislice_local.nodes import finish_pod

        hosts = sum(s["hosts"] for s in self.status(name)["slices"])
        for pod in self.wait_running(f"{keys.JOB_NAME}={name}", hosts, what):
            finish_pod(self.stack.api, self.ns, pod)

    def waiting_for_quota(self, name: str, timeout: float = 60) -> dict[str, Any]:
        """Queued with Kueue's reason for it: the first Queued says only that the Workload was
        made and Kueue has yet to look at it."""

        def check() -> dict[str, Any] | None:
            st = self.status(name)
            queued = st.get("phase") == "Queued"
            return st if queued and "insufficient unused quota" in st.get("message", "") else None

        return wait_for(check, timeout, f"{name} waiting for quota", interval=0.3,
                        on_timeout=self.dump)  # fmt: skip

    def dump(self) -> str:
        wls = {
            n: {c["type"]: (c["status"], c.get("reason")) for c in
                (w.get("status") or {}).get("conditions") or []}
            for n, w in queues.workloads(self.stack.api, self.ns).items()
        }  # fmt: skip
        assert self.stack.op is not None
        jobs = {
            i["metadata"]["name"]: {k: (i.get("status") or {}).get(k) for k in
                                    ("phase", "message", "restarts", "readySlices", "lastRestart")}
            for i in self.custom.list_namespaced_custom_object(
                models.GROUP, models.VERSION, self.ns, models.PLURAL)["items"]
        }  # fmt: skip
        # What the sim holds and what the operator did about this namespace come first: a CI
        # log keeps the head of a long failure and cuts its middle.
        pools = {n: (p.get("status"), self.sim.pool_operation(n))
                 for n, p in self.sim.pools().items()}  # fmt: skip
        marks = [f"job={self.ns}/", "WARNING", "ERROR", *(f"pool={n}" for n in pools),
                 *(f"pool={node_pool_name(self.ns, j, 0)[:-1]}" for j in jobs)]  # fmt: skip
        mine = [ln for ln in self.stack.op.log_tail(3000).splitlines()
                if any(m in ln for m in marks)]  # fmt: skip
        return (
            f"pools (status, running operation): {pools}\nworkloads: {wls}\njobs: {jobs}\n"
            f"jobsets (suspend): {self._jobsets()}\npods: {self._pods()}\n"
            "operator, this namespace's lines and warnings:\n" + "\n".join(mine[-40:])
        )

    def _jobsets(self) -> dict[str, Any]:
        items = self.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", self.ns, "jobsets"
        )["items"]
        return {j["metadata"]["name"]: j["spec"].get("suspend") for j in items}

    def _pods(self) -> dict[str, tuple[Any, ...]]:
        """Each pod's phase, node, scheduling condition and whether it is being deleted: a job
        stuck Starting (seen once under load) says which of them holds it."""
        out: dict[str, tuple[Any, ...]] = {}
        for p in self.core.list_namespaced_pod(self.ns).items:
            cond = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
            sched = (cond.status, cond.reason, (cond.message or "")[:120]) if cond else None
            gone = p.metadata.deletion_timestamp is not None
            out[p.metadata.name] = (p.status.phase, p.spec.node_name, sched, gone)
        return out

    def pools(self, name: str) -> list[str]:
        return list(msj.pools_of(self.sim, self.ns, name))

    def workload(self, name: str) -> dict[str, Any] | None:
        return queues.workloads(self.stack.api, self.ns).get(name)

    def events(self, name: str) -> list[str]:
        return msj.event_lines(self.stack.api, self.ns, name)

    def cleanup(self) -> None:
        for name in [
            i["metadata"]["name"]
            for i in self.custom.list_namespaced_custom_object(
                models.GROUP, models.VERSION, self.ns, models.PLURAL
            )["items"]
        ]:
            self.custom.delete_namespaced_custom_object(
                models.GROUP, models.VERSION, self.ns, models.PLURAL, name
            )
        wait_for(lambda: not self.custom.list_namespaced_custom_object(
            models.GROUP, models.VERSION, self.ns, models.PLURAL)["items"],
            90, "jobs deleted", on_timeout=self.dump)  # fmt: skip
        queues.delete(self.stack.api, self.objects)


@pytest.fixture
def env(stack, namespace, kube_kueue):
    e = Env(stack, namespace(kube_kueue, f"q{uuid.uuid4().hex[:4]}"))
    stack.sim.clear_faults()
    yield e
    stack.sim.configure(delete_latency_s=None)  # a test may have changed it
    e.cleanup()
    e.witness.uninstall()
    stack.sim.clear_faults()


def quota_holders(env: Env) -> set[str]:
    return {n for n, w in queues.workloads(env.stack.api, env.ns).items() if queues.holds_quota(w)}


# ---------------------------------------------------------------- quota decides who gets TPUs


@pytest.mark.compat
def test_three_jobs_two_run_the_third_waits_queued_with_zero_pools(env):
    env.queue(64)
    # a, b, c in that order (StrictFIFO orders by creation time, to the second): each of a and b
    # holds its quota before the next is created, so c is the one that waits, whatever the load.
    for name in ("a", "b", "c"):
        env.create(name, run="8s" if name != "c" else "4s")
        if name != "c":
            wait_for(lambda n=name: queues.holds_quota(env.workload(n)), 60,
                     f"{name} holding quota", on_timeout=env.dump)  # fmt: skip
    env.phase("a", "Running")
    env.phase("b", "Running")
    c = env.waiting_for_quota("c")
    assert c["queue"]["clusterQueue"] == f"cq-{env.ns}"
    assert env.pools("c") == []
    js = env.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", env.ns,
                                                 "jobsets", "c")  # fmt: skip
    assert js["spec"]["suspend"] is True
    assert keys.KUEUE_QUEUE_NAME not in js["metadata"]["labels"]  # the Workload is the job's
    owner = env.workload("c")["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("MultisliceJob", "c")

    # c stays Queued with zero pools while a and b hold all 64 chips: until a slice (a Job) of
    # one of them succeeds, whose quota Kueue frees at once (the operator reports the slice's
    # pods as reclaimable on its Workload).
    def holding_all() -> bool:
        for n in "ab":
            js = env.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", env.ns,
                                                         "jobsets", n)  # fmt: skip
            if any(
                r.get("succeeded")
                for r in (js.get("status") or {}).get("replicatedJobsStatus") or []
            ):
                return False
        return True

    while True:
        pools, phase = env.pools("c"), env.status("c").get("phase")
        if not holding_all():  # looked at after the pools: they were taken while it held
            break
        assert pools == [] and phase == "Queued", env.dump()
        time.sleep(0.3)
    # The admission while c holds it: under Kueue v0.15 (the compatibility lane) the finished
    # workload was seen with no status.admission; v0.19 keeps it.
    admission = wait_for(
        lambda: ((env.workload("c") or {}).get("status") or {}).get("admission"), 60, "c admitted"
    )
    done = env.phase("c", "Succeeded")  # (its 4 s Running can pass between two polls)
    assert done["queue"]["admissionCheck"] == queues.CHECK
    wl = env.workload("c")
    (pod_set,) = wl["spec"]["podSets"]
    assert (pod_set["name"], pod_set["count"]) == ("slice", 8)  # 4 hosts x 2 slices
    (assigned,) = admission["podSetAssignments"]
    assert assigned["resourceUsage"]["google.com/tpu"] == str(CHIPS)  # 4 chips x 4 x 2
    (check,) = wl["status"]["admissionChecks"]
    assert check["state"] == "Ready"
    assert check["podSetUpdates"][0]["nodeSelector"] == {keys.JOB_KEY: env_plan_key(env, "c")}
    env.phase("a", "Succeeded")
    env.phase("b", "Succeeded")
    wait_for(lambda: not any(env.pools(n) for n in "abc"), 30, "pools released")
    assert env.witness.without_quota() == []
    assert len(env.witness.creates) == 6  # one gang each, no retry


def env_plan_key(env: Env, name: str) -> str:
    from multislice_operator.planning.plan import job_key

    return job_key(env.ns, name)


def test_stockout_retry_hands_the_quota_to_the_next_job_and_gets_in_later(env):
    """Retry (no requeueAfterSeconds): Kueue evicts at once and, in a StrictFIFO ClusterQueue,
    orders the evicted Workload by its eviction time, so the job waiting behind it goes first."""
    env.queue(64)
    # a and c run until told to end, so the moment asserted below (c running, b waiting) lasts
    # until the test has seen it: with 20 s and 4 s runs, no poll of a CI run (13ef20d) fell
    # inside it (b's Queued was written 2.6 s after its Retry, near the end of a's 20 s).
    env.create("a", run="1h")  # holds its 32 chips throughout: c gets b's, not a's
    env.phase("a", "Running")
    env.sim.set_faults(stockout_next=1)
    env.create("b", run="4s")
    # b is admitted (its gang asked for) before c exists: c queues behind it, whatever the load.
    wait_for(lambda: env.witness.for_job(f"{env.ns}/b"), 60, "b's gang asked for",
             on_timeout=env.dump)  # fmt: skip
    env.create("c", run="1h")
    env.phase("c", "Queued", 30)

    def c_runs_while_b_waits() -> dict[str, Any] | None:
        c, b = env.status("c"), env.status("b")
        if c.get("phase") in ("Starting", "Running") and b.get("phase") == "Queued":
            return b
        return None

    b = wait_for(c_runs_while_b_waits, 90, "c admitted while b waits", interval=0.3,
                 on_timeout=env.dump)  # fmt: skip
    assert env.pools("b") == [] or all(
        p["status"] == "STOPPING" for n, p in env.sim.pools().items() if n in env.pools("b")
    )
    assert b["queue"]["lastEviction"]["reason"] == "AdmissionCheck"
    (check,) = env.workload("b")["status"]["admissionChecks"]
    # No requeueAfterSeconds on our Retry: with it Kueue v0.17.0 keeps the quota until requeueAt.
    assert "requeueAfterSeconds" not in check and check["retryCount"] == 1, check
    assert not (env.workload("b")["status"].get("requeueState") or {}).get("requeueAt")
    lines = msj.wait_events(
        env.stack.api, env.ns, "b", Reason.GANG_ROLLED_BACK, log=env.stack.op.log_tail
    )
    assert any(e.startswith(Reason.GANG_ROLLED_BACK) and "GCE_STOCKOUT" in e for e in lines), lines
    assert quota_holders(env) == {"a", "c"}  # b waits without quota until c ends
    env.finish("c", "c's pods running")
    env.phase("c", "Succeeded")
    done = env.phase("b", "Succeeded", 120)
    assert done["provisioningAttempts"] == 2
    assert done["queue"]["retryCount"] >= 1  # Kueue counted the Retry (retryCount kept)
    env.finish("a", "a's pods running")
    env.phase("a", "Succeeded")
    wait_for(lambda: not any(env.pools(n) for n in "abc"), 30, "no pool left", on_timeout=env.dump)
    assert env.witness.without_quota() == []
    b_gangs = [create.at for create in env.witness.for_job(f"{env.ns}/b")]
    assert len(b_gangs) == 4  # two gangs of two, one at a time
    # c got the quota b handed back, and b got in after it: c's gang between b's two.
    c_gang = [create.at for create in env.witness.for_job(f"{env.ns}/c")]
    assert len(c_gang) == 2 and max(b_gangs[:2]) < min(c_gang) <= max(c_gang) < min(b_gangs[2:])


def test_a_higher_priority_job_preempts_and_the_low_one_finishes_later(env, stack):
    high, low = f"high-{env.ns}", f"low-{env.ns}"
    classes = [queues.priority_class(high, 1000), queues.priority_class(low, 10)]
    queues.apply(stack.api, classes)
    env.objects += classes
    env.queue(32, preemption={"withinClusterQueue": "LowerPriority"})
    # The pods run until told to end: with 12 s pods, a fresh-clone run under a CPU burner saw
    # them finish while Kueue's suspension was stopping them (the JobSet completed, the job
    # Succeeded Queued, no second gang).
    env.create("slow", run="1h", labels={keys.KUEUE_PRIORITY_CLASS: low})
    running = env.phase("slow", "Running")
    assert running["restarts"] == 0
    # Pools that go at once end whatever still runs on them: the pools of the preempted job
    # must wait for its JobSet to stop (a CI flake: they were deleted while Kueue suspended it).
    registrar = env.sim.registrar
    assert isinstance(registrar, KubeNodeRegistrar)
    shut = len(registrar.shut_down)
    env.sim.configure(delete_latency_s=0.0)
    env.create("urgent", run="4s", labels={keys.KUEUE_PRIORITY_CLASS: high})

    def preempted() -> dict[str, Any] | None:
        st = env.status("slow")
        return st if (st.get("queue") or {}).get("preemptions") == 1 else None

    st = wait_for(preempted, 60, "slow preempted", interval=0.3, on_timeout=env.dump)
    assert st["queue"]["lastEviction"]["reason"] == "Preempted"
    assert st["queue"]["lastEviction"]["preemptedBy"] == f"{env.ns}/urgent"
    msj.wait_events(stack.api, env.ns, "slow", "Preempted:", log=stack.op.log_tail)
    env.phase("slow", "Queued")
    # Bounded by the design (the pods' grace period and STOP_MARGIN_SECONDS past the suspension),
    # not by the 30 s a loaded CI machine once needed more than.
    wait_for(lambda: env.pools("slow") == [], 90, "slow's pools released", on_timeout=env.dump)
    # Its pods ended by the Job's suspension (their grace period), none by node shutdown.
    assert [p for p in registrar.shut_down[shut:] if "/slow-" in p] == []
    env.phase("urgent", "Succeeded")
    env.phase("slow", "Running", 120)  # admitted again, on a new gang
    env.finish("slow", "slow's pods running again")
    done = env.phase("slow", "Succeeded", 120)
    assert done["restarts"] == 0  # a preemption is not a restart of all slices
    assert done["queue"]["preemptions"] == 1
    assert done["provisioningAttempts"] == 2  # a new gang after the preemption
    js = env.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", env.ns,
                                                 "jobsets", "slow")  # fmt: skip
    assert (js.get("status") or {}).get("restarts", 0) == 0
    wait_for(lambda: not env.pools("slow"), 30, "no pool left")
    # Never both gangs at once: the quota holds one job, and the witness saw creates only then.
    assert env.witness.without_quota() == []


@pytest.mark.parametrize("point", ["after-jobset-create", "after-pool-create", "after-check-write"])
def test_operator_killed_while_the_check_is_pending_or_provisioning_converges(env, stack, point):
    """Killed right after the JobSet (Kueue then reserves quota, check Pending, nobody acts),
    after the gang's creates, or after the check was set Ready: one gang, no duplicate."""
    env.queue(64)
    stack.stop_operator()
    op = stack.start_operator(extra_env={"MSJ_CRASH_POINT": point})
    env.create("crash", run="4s")
    assert op.wait_exit(90) == 3
    if point == "after-jobset-create":
        wait_for(lambda: queues.holds_quota(env.workload("crash")), 30, "quota reserved")
        # Kueue lists the check states in a later update than QuotaReserved (seen under load)
        checks = wait_for(
            lambda: env.workload("crash")["status"].get("admissionChecks"), 30, "check listed"
        )
        (check,) = checks
        assert check["state"] == "Pending" and env.pools("crash") == []
    stack.start_operator()
    # Not its Running, which a 4 s run can end between two polls under load (seen): the end.
    env.phase("crash", "Succeeded")
    assert len(env.witness.for_job(f"{env.ns}/crash")) == 2  # one gang, never two
    wait_for(lambda: not env.pools("crash"), 30, "pools released")
    assert env.witness.without_quota() == []


@pytest.mark.compat
def test_a_restart_of_all_slices_inside_an_admitted_job_does_not_requeue(env, stack):
    from multislice_local.nodes import fail_pod, finish_pod

    env.queue(64)
    # The pods run until told to end: with 10 s pods, a cold fresh-clone run at load 16 saw them
    # all finish (the job Succeeded) before the victim's failure was injected.
    env.create("flaky", run="1h")
    env.phase("flaky", "Running")
    wl_before = env.workload("flaky")
    pods = env.core.list_namespaced_pod(env.ns, label_selector="jobset.sigs.k8s.io/job-index=1")
    victim = sorted(p.metadata.name for p in pods.items)[0]
    fail_pod(stack.api, env.ns, victim, 17)  # retryable: the JobSet restarts all slices
    wait_for(lambda: env.status("flaky").get("restarts") == 1, 60, "a restart of all slices",
             on_timeout=env.dump)  # fmt: skip
    hosts = sum(s["hosts"] for s in env.status("flaky")["slices"])

    restarted = env.wait_running(f"{keys.JOBSET_RESTART_ATTEMPT}=1", hosts,
                                 "every host's pod of attempt 1 running")  # fmt: skip
    for pod in restarted:
        finish_pod(stack.api, env.ns, pod)
    done = env.phase("flaky", "Succeeded", 120)
    assert done["restarts"] == 1
    assert done["queue"]["preemptions"] == 0 and "lastEviction" not in done["queue"]
    assert done["provisioningAttempts"] == 1  # the same gang throughout
    wl = env.workload("flaky")
    assert wl["metadata"]["uid"] == wl_before["metadata"]["uid"]
    assert not (wl["status"].get("schedulingStats") or {}).get("evictions")  # never requeued
    assert len(env.witness.for_job(f"{env.ns}/flaky")) == 2


def test_suspending_an_admitted_queued_job_goes_through_its_workload(env, stack):
    """spec.suspend on a job Kueue admitted: the operator deactivates its Workload (Kueue evicts
    it) and suspends the JobSet; once the pods are gone the pools go and the quota is given back;
    resuming activates it again and Kueue admits it anew."""
    env.queue(64)
    env.create("paused", run="30s")
    env.phase("paused", "Running")
    env.custom.patch_namespaced_custom_object(
        models.GROUP, models.VERSION, env.ns, models.PLURAL, "paused", {"spec": {"suspend": True}}
    )
    env.phase("paused", "Suspended")
    wl = wait_for(
        lambda: (
            (w := env.workload("paused")) is not None and w["spec"].get("active") is False and w
        ),
        30,
        "the Workload deactivated",
        on_timeout=env.dump,
    )
    assert wl
    wait_for(lambda: env.pools("paused") == [], 60, "pools released", on_timeout=env.dump)

    def suspended_js() -> bool:
        js = env.custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", env.ns, "jobsets", "paused"
        )
        return bool(js["spec"].get("suspend"))

    wait_for(suspended_js, 30, "the JobSet suspended", on_timeout=env.dump)
    wait_for(lambda: not queues.holds_quota(env.workload("paused")), 60, "the quota given back",
             on_timeout=env.dump)  # fmt: skip
    # No tug of war: over several seconds the JobSet stays suspended and the job Suspended.
    for _ in range(10):
        time.sleep(0.5)
        assert suspended_js() and env.status("paused").get("phase") == "Suspended"
    env.custom.patch_namespaced_custom_object(
        models.GROUP, models.VERSION, env.ns, models.PLURAL, "paused", {"spec": {"suspend": False}}
    )
    wait_for(
        lambda: (env.workload("paused") or {}).get("spec", {}).get("active") is not False,
        30,
        "the Workload active again",
        on_timeout=env.dump,
    )
    env.phase("paused", "Running", 120)
    assert env.witness.without_quota() == []


# ---------------------------------------------------------------- spares and elastic, queued


def usage(wl: dict[str, Any]) -> dict[str, str]:
    """google.com/tpu Kueue reserved, per pod set."""
    assigned = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    return {a["name"]: a["resourceUsage"]["google.com/tpu"] for a in assigned}


def lose_a_slice(env: Env, name: str) -> None:
    """A pool that runs pods of the job loses its nodes (spot preemption) and every replacement
    is stocked out. (With a spare, any of the job's pools may be the idle one: the scheduler
    picks, so pool 0 is not always a running slice's.)"""
    core = client.CoreV1Api(env.stack.api)
    pods = core.list_namespaced_pod(env.ns).items
    ours = [p for p in pods if p.metadata.name.startswith(f"{name}-")]
    nodes = {p.spec.node_name for p in ours if p.spec.node_name}
    pools = sorted({str(core.read_node(n).metadata.labels[keys.GKE_NODEPOOL]) for n in nodes})
    assert pools, f"no pod of {name} on a node"
    env.sim.set_faults(stockout_next=1000)
    env.sim.preempt(pools[0], recreate_after_s=None)


def test_a_queued_job_with_a_spare_takes_its_chips_and_runs_on_it_without_requeueing(env):
    """Issue 43: spec.spares with a queue label. The Workload counts the spare slice's chips (48
    of the ClusterQueue's 48: a 16-chip job waits); a lost slice's place is taken by the spare
    with the quota kept (never evicted), and the waiting job gets in once the job is deleted.
    (It runs for minutes: a short run can end before the loss is seen on a busy machine.)"""
    env.queue(48)
    env.create("sp", run="600s", spares=1, capacity={"type": "Spot"})
    env.phase("sp", "Running")
    first = env.workload("sp")
    assert usage(first) == {"slice": "32", "spare": "16"}
    assert len(env.pools("sp")) == 3  # 2 slices + the spare, provisioned as one gang
    env.create("small", run="2s", slices=1)
    env.waiting_for_quota("small")
    lose_a_slice(env, "sp")

    def on_the_spare() -> dict[str, Any] | None:
        st = env.status("sp")
        return st if st.get("restarts", 0) >= 1 and st.get("phase") == "Running" else None

    # Lost nodes, their pods gone, JobSet's restart onto the spare: a chain of controllers, slow
    # on a loaded 2-core machine (a CI run took over 120 s).
    st = wait_for(on_the_spare, 300, "Running on the spare", interval=0.5, on_timeout=env.dump)
    provisioned = next(c for c in st["conditions"] if c["type"] == "Provisioned")
    assert provisioned["reason"] == Reason.REPAIRING_SPARE, provisioned
    wl = env.workload("sp")
    assert wl["metadata"]["uid"] == first["metadata"]["uid"] and queues.holds_quota(wl)
    assert queues.condition(wl, "Evicted").get("status") != "True"  # never back to the queue
    assert env.status("small").get("phase") == "Queued" and env.pools("small") == []
    env.sim.clear_faults()
    env.custom.delete_namespaced_custom_object(
        models.GROUP, models.VERSION, env.ns, models.PLURAL, "sp"
    )
    env.phase("small", "Succeeded", 120)
    assert env.witness.without_quota() == []


def test_a_queued_elastic_job_keeps_its_quota_while_it_runs_on_fewer_slices(env):
    """Issue 43: spec.elastic with a queue label. Admitted at its full size (32 chips, the whole
    ClusterQueue); when a slice is lost and stocked out it runs on 1 slice, its JobSet recreated
    but not its Workload: the quota stays reserved (a 16-chip job keeps waiting) and the job is
    never requeued. Deleting it frees the quota."""
    env.queue(32)
    elastic = {"minSlices": 1, "waitSeconds": 5}
    env.create("el", run="300s", elastic=elastic, capacity={"type": "Spot"})
    env.phase("el", "Running")
    first = env.workload("el")
    assert usage(first) == {"slice": "32"}
    env.create("small", run="2s", slices=1)
    env.waiting_for_quota("small")
    lose_a_slice(env, "el")

    def on_one() -> dict[str, Any] | None:
        st = env.status("el")
        return st if st.get("phase") == "Running" and st.get("activeSlices") == 1 else None

    wait_for(on_one, 120, "Running on 1 slice", interval=0.5, on_timeout=env.dump)
    wl = env.workload("el")
    assert wl["metadata"]["uid"] == first["metadata"]["uid"]
    assert queues.holds_quota(wl) and usage(wl) == {"slice": "32"}  # the full size, kept
    assert queues.condition(wl, "Evicted").get("status") != "True"
    assert env.status("small").get("phase") == "Queued" and env.pools("small") == []
    env.sim.clear_faults()
    env.custom.delete_namespaced_custom_object(
        models.GROUP, models.VERSION, env.ns, models.PLURAL, "el"
    )
    env.phase("small", "Succeeded", 120)
    assert env.witness.without_quota() == []


def _reserved(env: Env, cq: str) -> tuple[int, int]:
    """The ClusterQueue's Workloads holding quota, and the TPU chips they hold."""
    status = queues.get_cluster_queue(env.stack.api, cq).get("status") or {}
    chips = sum(
        int(r.get("total") or 0)
        for f in status.get("flavorsReservation") or []
        for r in f.get("resources") or []
        if r.get("name") == keys.TPU_RESOURCE
    )
    return int(status.get("reservingWorkloads") or 0), chips


@pytest.mark.parametrize("check", [queues.CHECK, None], ids=["our-check-only", "no-check"])
def test_a_job_for_multikueue_on_a_queue_without_its_check_gives_the_quota_back(env, check):
    """Issue 56: spec.managedBy kueue.x-k8s.io/multikueue on a ClusterQueue with no MultiKueue
    admission check: its Workload reserved 32 of the 64 chips and was never admitted (or, with
    no check at all, admitted here where nothing runs it), with no status. Now the job fails
    naming the ClusterQueue, its Workload is finished and the quota is back, no pool made."""
    cq = env.queue(check=check)
    env.create("mk", managedBy=keys.MULTIKUEUE_MANAGED_BY)
    st = env.phase("mk", "Failed")
    failed = {c["type"]: c for c in st["conditions"]}["Failed"]
    assert failed["reason"] == Reason.MULTIKUEUE_UNAVAILABLE, failed
    assert f"ClusterQueue {cq} has no MultiKueue admission check" in failed["message"], failed
    admitted = {c["type"]: c for c in st["conditions"]}["Admitted"]
    assert (admitted["status"], admitted["reason"]) == ("False", Reason.MULTIKUEUE_UNAVAILABLE)
    wait_for(lambda: _reserved(env, cq) == (0, 0), 60, "the quota released", on_timeout=env.dump)
    finished = lambda: queues.condition(env.workload("mk"), "Finished").get("status") == "True"  # noqa: E731
    wait_for(finished, 60, "the Workload finished", on_timeout=env.dump)
    assert env.pools("mk") == [] and msj.jobset(env.stack.api, env.ns, "mk") is None
