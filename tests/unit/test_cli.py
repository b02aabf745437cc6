import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from multislice_operator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "v5e-16x2-fsdp.yaml"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_ok(capsys):
    code, out, _ = run(capsys, "validate", "-f", str(EXAMPLE))
    assert code == 0
    assert "default/llm-v5e: valid (2 x v5litepod-16, 32 chips" in out


def test_validate_lists_every_error(tmp_path, capsys):
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["parallelism"]["ici"] = {"data": 1, "fsdp": 2, "tensor": 1}
    obj["spec"]["slices"] = 300
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(obj))
    code, _, err = run(capsys, "validate", "-f", str(bad))
    assert code == 1
    assert "spec.slices" in err
    obj["spec"]["slices"] = 2
    bad.write_text(yaml.safe_dump(obj))
    code, _, err = run(capsys, "validate", "-f", str(bad))
    assert code == 1
    assert "spec.parallelism.ici: data x fsdp x tensor = 1 x 2 x 1 = 2" in err


def test_plan_json_shape(capsys):
    code, out, _ = run(capsys, "plan", "-f", str(EXAMPLE), "-o", "json")
    assert code == 0
    data = json.loads(out)
    for key in (
        "accelerator",
        "generation",
        "topology",
        "chipsPerSlice",
        "hostsPerSlice",
        "chipsPerHost",
        "machineType",
        "gkeAccelerator",
        "slices",
        "totalChips",
        "totalHosts",
        "parallelism",
        "dcn",
        "nodePools",
    ):
        assert key in data, key
    assert data["dcn"]["verdict"] == "ok"
    assert data["dcn"]["tokensPerSlice"] == 4194304 // 2
    assert len(data["nodePools"]) == 2 and data["nodePools"][0]["nodeCount"] == 4


def test_plan_text(capsys):
    code, out, _ = run(capsys, "plan", "-f", str(EXAMPLE))
    assert code == 0
    assert "ct5lp-hightpu-4t" in out and "node pools:" in out


def test_render_multi_doc(capsys):
    code, out, _ = run(capsys, "render", "-f", str(EXAMPLE))
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["JobSet"]


@pytest.mark.parametrize(
    ("content", "message", "status"),
    [
        (None, "no such file", 2),
        # Read, and not a MultisliceJob: invalid input, as an invalid spec (issue 45).
        ("a: [1, 2", "invalid YAML (line", 1),
        ("kind: Pod\n", "no MultisliceJob found (kinds present: Pod)", 1),
        ("", "no YAML document found", 1),
    ],
)
def test_bad_input_one_line_no_traceback(tmp_path, capsys, content, message, status):
    path = tmp_path / "x.yaml"
    if content is not None:
        path.write_text(content)
    code, _, err = run(capsys, "validate", "-f", str(path))
    assert code == status
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_crd_command_prints_committed_crd(capsys):
    code, out, _ = run(capsys, "crd")
    assert code == 0
    committed = (ROOT / "crds" / "multislice.dev_multislicejobs.yaml").read_text()
    assert yaml.safe_load(out) == yaml.safe_load(committed)


def test_installed_entry_point():
    exe = shutil.which("multislice-operator", path=str(Path(sys.executable).parent))
    assert exe, "make install must put the CLI into the venv"
    proc = subprocess.run([exe, "validate", "-f", str(EXAMPLE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_render_gke_requests_placeholders_and_flags(capsys, monkeypatch):
    # Issue 12: the dry run of what the operator asks GKE for, one request per slice.
    for var in ("GKE_PROJECT", "GKE_LOCATION", "GKE_CLUSTER", "GKE_NODE_LOCATIONS"):
        monkeypatch.delenv(f"MSJ_{var}", raising=False)
    code, out, _ = run(capsys, "render", "--gke-requests", "-f", str(EXAMPLE))
    assert code == 0
    requests = json.loads(out)
    assert [r["parent"] for r in requests] == [
        "projects/PROJECT/locations/LOCATION/clusters/CLUSTER"
    ] * 2
    pool = requests[0]["nodePool"]
    assert (
        pool["locations"] == ["ZONE"]
        and pool["config"]["labels"]["multislice.dev/job-uid"] == "JOB_UID"
    )
    assert pool["placementPolicy"] == {"type": 1, "tpuTopology": "4x4"}
    flags = ["--gke-project", "p", "--gke-location", "us-east5-b", "--gke-cluster", "c"]
    code, out, _ = run(
        capsys,
        "render",
        "--gke-requests",
        "--enum-names",
        "--gke-workload-identity",
        "-f",
        str(EXAMPLE),
        *flags,
    )
    pool = json.loads(out)[1]["nodePool"]
    assert json.loads(out)[1]["parent"] == "projects/p/locations/us-east5-b/clusters/c"
    assert pool["locations"] == ["us-east5-b"] and pool["placementPolicy"]["type"] == "COMPACT"
    assert pool["config"]["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    code, _, err = run(
        capsys, "render", "--gke-requests", "-f", str(EXAMPLE), "--gke-location", "us-east5"
    )
    assert code == 2 and "--gke-node-location" in err


def test_validate_warns_on_stderr_without_failing(capsys):
    # Issue 21: no checkpoint, and Workload Identity with host-network pods.
    code, out, err = run(capsys, "validate", "-f", str(EXAMPLE), "--gke-workload-identity")
    assert code == 0 and "valid" in out
    warnings = [line for line in err.splitlines() if ": warning: " in line]
    assert any("act as the Compute Engine default service account" in w for w in warnings), err
    code, _, err = run(capsys, "validate", "-f", str(EXAMPLE))
    assert "Workload Identity" not in err


def test_plan_names_the_pods_identity(capsys, monkeypatch):
    monkeypatch.setenv("MSJ_GKE_NODE_SERVICE_ACCOUNT", "tpu@p.iam.gserviceaccount.com")
    code, out, _ = run(capsys, "plan", "-f", str(EXAMPLE), "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert data["podIdentity"]["via"] == "node-service-account"
    assert "tpu@p.iam.gserviceaccount.com" in data["podIdentity"]["principal"]
    assert "tpu@p.iam.gserviceaccount.com" in data["nodeIdentity"]
    code, out, _ = run(capsys, "plan", "-f", str(EXAMPLE))
    assert code == 0 and "pod identity" in out and "tpu nodes" in out


def test_output_into_a_closed_pipe_is_no_traceback(tmp_path):
    # Issue 21: `plan -o json | head` printed a BrokenPipeError traceback.
    many = tmp_path / "many.yaml"
    many.write_text("---\n".join([EXAMPLE.read_text()] * 400))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "multislice_operator.cli.main",
            "plan",
            "-f",
            str(many),
            "-o",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline()
    proc.stdout.close()  # the reader leaves, as head does
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err
    assert proc.returncode == 141


IRONWOOD = ROOT / "examples" / "tpu7x-256x2-dynamic-slicing.yaml"


def test_plan_shows_the_cubes_and_the_slices(capsys):
    code, out, _ = run(capsys, "plan", "-f", str(IRONWOOD))
    assert code == 0
    assert "cubes (4x4x4, Managed): 5 (2 slices x 2 + 1 spare)" in out
    assert out.count("  cube ") == 4 and out.count("spare cube 4") == 1
    slices = [line for line in out.splitlines() if "partitionIds [" in line]
    assert len(slices) == 2 and all("4x4x8" in line for line in slices)
    assert "partition id of cube 2, partition id of cube 3" in slices[1]


def test_render_gke_requests_shows_cube_pools_then_the_slices(capsys):
    code, out, _ = run(capsys, "render", "--gke-requests", "-f", str(IRONWOOD))
    assert code == 0
    docs = json.loads(out)
    policy = docs[0]["resourcePolicyResource"]["workloadPolicy"]
    assert policy["acceleratorTopologyMode"] == "PROVISION_ONLY"
    pools = [d for d in docs if "nodePool" in d]
    assert len(pools) == 5 and {p["nodePool"]["initialNodeCount"] for p in pools} == {16}
    slices = [d for d in docs if d.get("kind") == "Slice"]
    assert [s["spec"]["partitionIds"] for s in slices] == [
        ["PARTITION_ID_OF_CUBE_0", "PARTITION_ID_OF_CUBE_1"],
        ["PARTITION_ID_OF_CUBE_2", "PARTITION_ID_OF_CUBE_3"],
    ]


def test_validate_refuses_two_slices_aimed_at_one_sub_block(tmp_path, capsys):
    """The reported bug, through the CLI: accepted with no warning before."""
    obj = yaml.safe_load((ROOT / "examples" / "tpu7x-128x2.yaml").read_text())
    obj["spec"]["capacity"]["reservation"] += "/reservationSubBlocks/sub-1"
    bad = tmp_path / "sub.yaml"
    bad.write_text(yaml.safe_dump(obj))
    code, _, err = run(capsys, "validate", "-f", str(bad))
    assert code == 1 and "spec.capacity.reservation" in err and "one 4x4x4 cube" in err


@pytest.mark.parametrize(
    ("accelerator", "topology", "gib"),
    [("v5litepod-16", "4x4", "15.75"), ("v4-32", "2x2x4", "30.75"), ("tpu7x-32", "2x2x4", "94.75")],
)
def test_plan_shows_the_hbm_the_compiler_gives_a_device(
    tmp_path, capsys, accelerator, topology, gib
):
    """The preflight's capacity is libtpu's usable HBM per device (its out-of-HBM refusals state
    it; test_catalog_libtpu.py checks the catalog against them), not the spec sheet's: a v5e
    chip's 16 GB (14.90 GiB) is 15.75 GiB for a program, a v4 chip's 32 GiB 30.75, a TPU7x
    device's 96 GiB 94.75."""
    from multislice_operator.tpu import catalog

    obj = yaml.safe_load((ROOT / "examples" / "v5e-16x2-preflight.yaml").read_text())
    obj["spec"].update(accelerator=accelerator, topology=topology)
    gen = catalog.parse_accelerator(accelerator)[0]
    chips = catalog.slice_shape(accelerator, topology).chips
    obj["spec"]["parallelism"]["ici"]["fsdp"] = chips * gen.devices_per_chip
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(obj))
    code, out, err = run(capsys, "plan", "-f", str(path), "-o", "json")
    assert code == 0, err
    capacity = json.loads(out)["preflight"]["hbmCapacityBytes"]
    assert capacity == gen.usable_hbm_bytes != gen.hbm_bytes // gen.devices_per_chip
    code, out, _ = run(capsys, "plan", "-f", str(path))
    assert code == 0 and f"must fit {gib} GiB of HBM per device" in out
