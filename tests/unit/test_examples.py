"""Every manifest in examples/ is valid through the same path as `multislice-operator plan`, and
together they cover the seed's scenarios."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from multislice_operator.api.models import KIND
from multislice_operator.planning.plan import Plan, load_job, plan_job
from multislice_operator.render import kueue_workload
from multislice_operator.render.jobset import render_jobset, render_pod_template

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "examples").glob("*.yaml"))


def documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in FILES:
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def plans() -> dict[str, Plan]:
    return {name: plan_job(load_job(doc)) for name, doc in documents()}


@pytest.mark.parametrize(("name", "doc"), documents(), ids=[n for n, _ in documents()])
def test_example_plans_and_renders(name: str, doc: dict[str, Any]) -> None:
    assert doc["kind"] == KIND
    job = load_job(doc)
    plan = plan_job(job)  # raises SpecError naming the field on any problem
    assert plan.advice.verdict == "ok", f"{name}: {plan.advice.message}"
    jobset = render_jobset(plan, job.spec, job.metadata.labels)
    assert jobset["spec"]["replicatedJobs"][0]["replicas"] == plan.slices


def test_names_are_unique() -> None:
    # tests/integration/test_crd_admission.py creates them all in one namespace.
    names = [doc["metadata"]["name"] for _, doc in documents()]
    assert len(names) == len(set(names))


def test_seed_scenarios_are_covered() -> None:
    by_file = plans()
    v4 = by_file["v4-16x4-data.yaml"]
    assert (v4.shape.accelerator, v4.slices, v4.parallelism.dcn_data) == ("v4-16", 4, 4)
    # The seed's v4 numbers: more than two slices need > 352,000 tokens per slice, ~700k with
    # the margin; the example clears both.
    assert v4.advice.hardware_intensity == 22_000
    assert v4.advice.min_tokens_per_slice == 352_000
    assert v4.advice.recommended_tokens_per_slice == 704_000
    assert (v4.advice.tokens_per_slice or 0) >= 704_000
    assert by_file["v5e-16x2-fsdp.yaml"].parallelism.ici_fsdp == 16
    spot = by_file["v5e-16x2-spot.yaml"]
    assert spot.capacity == "Spot" and all(p.spot for p in spot.node_pools)
    reserved = by_file["v5p-32x2-reservation.yaml"]
    assert reserved.capacity == "Reserved"
    assert {p.reservation for p in reserved.node_pools} == {"tpu-v5p-reservation"}
    existing = by_file["v6e-16x2-existing.yaml"]
    assert existing.mode == "Existing" and existing.node_pools == []
    # Ironwood (issue 24): 64 chips, 16 hosts, 4x4x4 per slice, placed by a workload policy,
    # from a reservation block.
    iw = by_file["tpu7x-128x2.yaml"]
    assert (iw.shape.chips, iw.shape.hosts, iw.shape.topology) == (64, 16, "4x4x4")
    assert {p.workload_policy for p in iw.node_pools} == {"msj-tpu7x-4x4x4"}
    assert {p.reservation for p in iw.node_pools} == {
        "ironwood-reservation/reservationBlocks/block-0001"
    }


def test_cli_validates_every_example(capsys: pytest.CaptureFixture[str]) -> None:
    from multislice_operator.cli.main import main

    for path in FILES:
        assert main(["validate", "-f", str(path)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.count("valid (") == len(documents())


def test_the_kueue_example_is_a_queued_job_whose_chips_fit_one_team_quota() -> None:
    """examples/kueue/: the queue objects docs/kueue.md shows, and a job naming one of them."""
    objs = [d for d in yaml.safe_load_all((ROOT / "examples/kueue/queues.yaml").read_text()) if d]
    kinds = {d["kind"] for d in objs}
    assert {"ResourceFlavor", "AdmissionCheck", "ClusterQueue", "LocalQueue",
            "WorkloadPriorityClass"} <= kinds  # fmt: skip
    (check,) = [d for d in objs if d["kind"] == "AdmissionCheck"]
    assert check["spec"]["controllerName"] == "multislice.dev/gang-provisioning"
    cqs = [d for d in objs if d["kind"] == "ClusterQueue"]
    assert {cq["spec"]["cohortName"] for cq in cqs} == {"tpu"} and len(cqs) == 2
    job = load_job(yaml.safe_load((ROOT / "examples/kueue/job.yaml").read_text()))
    plan = plan_job(job)
    quotas = [
        r["nominalQuota"]
        for cq in cqs
        for g in cq["spec"]["resourceGroups"]
        for f in g["flavors"]
        for r in f["resources"]
        if r["name"] == "google.com/tpu"
    ]
    assert quotas == [plan.total_chips] * 2
    queues = {d["metadata"]["name"] for d in objs if d["kind"] == "LocalQueue"}
    assert job.metadata.labels["kueue.x-k8s.io/queue-name"] in queues
    flavor = next(d for d in objs if d["kind"] == "ResourceFlavor")
    jobset = render_jobset(plan, job.spec, job.metadata.labels)
    selector = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "nodeSelector"
    ]
    # The pods must already select the flavor's nodes: the operator starts the JobSet itself
    # and does not add a ResourceFlavor's nodeLabels as Kueue's job integrations do.
    for key, value in flavor["spec"]["nodeLabels"].items():
        assert selector[key] == value
    assert jobset["spec"]["suspend"] is True
    wl = kueue_workload.render_workload(
        plan, render_pod_template(plan, job.spec), uid="u", queue="q",
        priority_class=job.metadata.labels["kueue.x-k8s.io/priority-class"], priority=100,
    )  # fmt: skip
    assert wl["spec"]["priorityClassRef"]["name"] == "research"
    assert any(d["kind"] == "WorkloadPriorityClass" and d["metadata"]["name"] == "research"
               for d in objs)  # fmt: skip


WORKLOAD_IMAGE = "multislice/workload:"


def workload_containers() -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, c)
        for name, doc in documents()
        for c in doc["spec"]["template"]["spec"]["containers"]
        if WORKLOAD_IMAGE in c.get("image", "")
    ]


@pytest.mark.parametrize(("name", "container"), workload_containers(),
                         ids=[n for n, _ in workload_containers()])  # fmt: skip
def test_example_workload_args_parse(name: str, container: dict[str, Any]) -> None:
    """The args an example gives the shipped workload image are ones it accepts (they once said
    --checkpoint-every, which it refuses with its configuration error, exit 78)."""
    from multislice_workload.cli import build_parser

    args = build_parser().parse_args(container.get("args") or [])
    assert args.mode == "train" and args.checkpoint_every > 0


def test_most_examples_run_the_shipped_workload() -> None:
    assert len(workload_containers()) >= 5


def test_no_example_job_names_a_namespace() -> None:
    """`kubectl apply -n team-a -f examples/...` puts the job in team-a: a namespace in the
    file would make kubectl refuse it (the namespace from the provided object does not match)."""
    for path in sorted((ROOT / "examples").glob("**/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == KIND:
                assert "namespace" not in doc["metadata"], path.relative_to(ROOT)
