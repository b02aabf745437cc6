from pathlib import Path

import yaml

from multislice_operator.api.crd import generate_crd

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / "multislice.dev_multislicejobs.yaml"


def test_committed_crd_matches_models():
    committed = yaml.safe_load(COMMITTED.read_text())
    assert committed == generate_crd(), "CRD drifted from the models: run `make crd` and commit"


def test_schema_is_structural_and_documented():
    crd = generate_crd()
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def walk(node, path):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(spec, "spec")
    for name, prop in spec["properties"].items():
        assert prop.get("description"), f"spec.{name} has no description for kubectl explain"
    assert spec["required"] == ["accelerator", "slices", "template"]
    assert spec["properties"]["slices"]["minimum"] == 1
    assert spec["properties"]["slices"]["maximum"] == 256
    assert spec["properties"]["template"]["x-kubernetes-preserve-unknown-fields"] is True
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:5] == ["Phase", "Accelerator", "Slices", "Ready", "Restarts"]
    assert crd["spec"]["names"]["shortNames"] == ["msj"]


def test_cel_rules_present():
    spec = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    dcn = spec["properties"]["parallelism"]["properties"]["dcn"]
    assert any("self.tensor == 1" in r["rule"] for r in dcn["x-kubernetes-validations"])
    # Immutability sits on spec, where both sides always have a value: absent -> present and
    # present -> absent are changes too (a rule on the field itself would not run then).
    rules = {r["rule"] for r in spec["x-kubernetes-validations"]}
    for field in ("accelerator", "slices", "template", "capacity", "checkpoint", "failurePolicy"):
        assert (
            f"has(self.{field}) == has(oldSelf.{field}) && "
            f"(!has(self.{field}) || self.{field} == oldSelf.{field})"
        ) in rules
        own = spec["properties"][field].get("x-kubernetes-validations") or []
        assert all("oldSelf" not in r["rule"] for r in own)
    env = spec["properties"]["template"]["properties"]["spec"]["properties"]["containers"]
    env_rule = env["items"]["properties"]["env"]["items"]["x-kubernetes-validations"][0]
    assert "'MEGASCALE_NUM_SLICES'" in env_rule["rule"]
    assert env_rule["messageExpression"].startswith("self.name + ")
