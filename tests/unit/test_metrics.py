"""Metrics computed from what the operator knows now: deleted jobs drop out, counters only grow."""

from __future__ import annotations

from multislice_operator.controller import metrics


def sample(metric: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(metric, labels)


def test_jobs_by_phase_forget_a_deleted_job():
    metrics.JOBS.set(("t", "a"), "Running")
    metrics.JOBS.set(("t", "b"), "Running")
    metrics.JOBS.set(("t", "c"), "Pending")
    metrics.JOBS.set(("u", "a"), "Running")  # another namespace: a series of its own
    before = sample("multislice_jobs", namespace="t", phase="Running") or 0
    assert before == 2 and sample("multislice_jobs", namespace="u", phase="Running") == 1
    metrics.forget_job(("t", "a"))
    assert sample("multislice_jobs", namespace="t", phase="Running") == before - 1
    metrics.JOBS.set(("t", "c"), "Running")  # a phase change moves the job, never adds it
    assert sample("multislice_jobs", namespace="t", phase="Running") == before
    assert sample("multislice_jobs", namespace="t", phase="Pending") in (None, 0)
    metrics.forget_job(("u", "a"))
    for key in (("t", "b"), ("t", "c")):
        metrics.forget_job(key)


def zeros(**values: int) -> dict[str, int]:
    states = ("queued", "provisioning", "starting", "running", "restarting", "repairing")
    return {s: values.get(s, 0) for s in (*states, "suspended")}


def test_goodput_gauges_per_job_and_gone_with_it():
    key = ("t", "gauged")
    metrics.GOODPUT.update(key, zeros(), zeros(), (0.75, None), (32, 2), from_zero=True)
    assert sample("multislice_job_goodput_ratio", namespace="t", name="gauged") == 0.75
    assert sample("multislice_job_wall_goodput_ratio", namespace="t", name="gauged") is None
    assert sample("multislice_job_held_chips", namespace="t", name="gauged") == 32
    assert sample("multislice_job_held_node_pools", namespace="t", name="gauged") == 2
    metrics.forget_job(key)
    for metric in ("multislice_job_goodput_ratio", "multislice_job_held_chips"):
        assert sample(metric, namespace="t", name="gauged") is None


def test_state_counters_move_by_what_each_pass_added():
    key = ("t", "counted")
    run = "multislice_job_state_seconds_total"
    chips = "multislice_job_state_chip_seconds_total"
    r0 = sample(run, namespace="t", state="running") or 0
    c0 = sample(chips, namespace="t", state="running") or 0
    # A job found at startup: its past is not this process' to count.
    metrics.GOODPUT.update(key, zeros(running=100), zeros(running=3200), (1, 1), (32, 2), False)
    assert (sample(run, namespace="t", state="running") or 0) == r0
    metrics.GOODPUT.update(key, zeros(running=130), zeros(running=4160), (1, 1), (32, 2), False)
    assert sample(run, namespace="t", state="running") == r0 + 30
    assert sample(chips, namespace="t", state="running") == c0 + 960
    # Never backwards, even if a reading is behind the last one.
    metrics.GOODPUT.update(key, zeros(running=120), zeros(running=4160), (1, 1), (32, 2), False)
    assert sample(run, namespace="t", state="running") == r0 + 30
    metrics.forget_job(key)
    # A job created after the process started counts from zero.
    new = ("t", "new")
    q0 = sample(run, namespace="t", state="queued") or 0
    metrics.GOODPUT.update(new, zeros(queued=4), zeros(), (None, None), (0, 0), from_zero=True)
    assert sample(run, namespace="t", state="queued") == q0 + 4
    metrics.forget_job(new)


def test_pass_metrics_carry_the_namespace_of_the_job_being_reconciled():
    """The worker sets JOB_NAMESPACE; the counters and histograms moved in the pass take it."""
    restarts = "multislice_restarts_total"
    workload = {"cause": "workload", "budget": "maxRestarts"}
    before = sample(restarts, namespace="team-x", **workload) or 0
    token = metrics.JOB_NAMESPACE.set("team-x")
    try:
        metrics.RESTARTS_TOTAL.labels("workload").inc()
        metrics.GANG_ATTEMPTS_TOTAL.inc(2)
        metrics.RESTART_LOST_STEPS.observe(7)
    finally:
        metrics.JOB_NAMESPACE.reset(token)
    assert sample(restarts, namespace="team-x", **workload) == before + 1
    assert (sample("multislice_gang_attempts_total", namespace="team-x") or 0) >= 2
    assert (sample("multislice_restart_lost_steps_sum", namespace="team-x") or 0) >= 7
    # Outside a pass nothing is charged to team-x.
    metrics.RESTARTS_TOTAL.labels("workload").inc()
    assert sample(restarts, namespace="team-x", **workload) == before + 1


def test_preset_label_sets_are_exported_at_zero_per_namespace_from_its_first_pass():
    """The restart causes, failure reasons and checkpoint sources are exported at 0 in each
    namespace once a pass runs there (rate() sees the first failure), never under the empty
    namespace of no pass."""
    from multislice_operator.controller import reconciler  # noqa: F401  (the presets)

    assert ("workload",) in metrics.RESTARTS_TOTAL.presets
    hang = {"cause": "hang", "budget": "maxRestarts"}
    assert sample("multislice_restarts_total", namespace="fresh-ns", **hang) is None
    token = metrics.enter_namespace("fresh-ns")
    metrics.JOB_NAMESPACE.reset(token)
    budgets = {
        "disruption": "maxDisruptionRestarts",
        "workload": "maxRestarts",
        "hang": "maxRestarts",
        "startup": "maxDisruptionRestarts",
        "resize": "none",
    }
    for cause, budget in budgets.items():
        found = sample(
            "multislice_restarts_total", namespace="fresh-ns", cause=cause, budget=budget
        )
        assert found == 0, cause
    for source in ("user", "maintenance", "flex-start", "elastic"):
        found = sample("multislice_checkpoint_requests_total", namespace="fresh-ns", source=source)
        assert found == 0, source
    # A resize is no pod failure: no slice-failure series for it.
    assert sample("multislice_slice_failures_total", namespace="fresh-ns", reason="pod_failure",
                  cause="resize") is None  # fmt: skip
    failures = sample(
        "multislice_slice_failures_total", namespace="fresh-ns", reason="gang_rollback",
        cause="provisioning",
    )  # fmt: skip
    assert failures == 0
    # On a registry of its own: a preset makes series only in the namespaces a pass has run in
    # (none under ""), and one added later reaches those already seen.
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    own = metrics.PerNamespace(Counter("t", "t", ["namespace", "cause"], registry=registry))
    own.preset("a")
    made = {s.labels["namespace"] for f in registry.collect() for s in f.samples}
    assert "fresh-ns" in made and "" not in made and "other-ns" not in made
    metrics.JOB_NAMESPACE.reset(metrics.enter_namespace("other-ns"))
    own.preset("b")
    for cause in ("a", "b"):
        assert registry.get_sample_value("t_total", {"namespace": "fresh-ns", "cause": cause}) == 0
        assert registry.get_sample_value("t_total", {"namespace": "other-ns", "cause": cause}) == 0


def test_runtime_and_build_metrics():
    from importlib.metadata import version

    from multislice_operator import __version__

    state = metrics.RUNTIME
    saved = (state.depth, state.active_workers, state.workers, state.leader)
    try:
        state.depth, state.active_workers = (lambda: 3), (lambda: 2)
        state.workers, state.leader = (lambda: 16), (lambda: True)
        assert sample("multislice_workqueue_depth") == 3
        assert sample("multislice_active_workers") == 2
        assert sample("multislice_max_workers") == 16
        assert sample("multislice_leader") == 1
        state.leader = lambda: False
        assert sample("multislice_leader") == 0
    finally:
        state.depth, state.active_workers, state.workers, state.leader = saved
    info = {"version": __version__, "kopf_version": version("kopf")}
    families = {f.name: f for f in metrics.REGISTRY.collect()}
    (build,) = families["multislice_build_info"].samples
    assert build.value == 1 and info.items() <= build.labels.items()
    assert (sample("process_resident_memory_bytes") or 0) > 0  # the process collector
