"""api/kubeschema.json is what `make kube-schema` generates from its source: the OpenAPI v3
document of the k8s.io/kubernetes module hack/tools/kube/go.mod pins (issue 45). The module comes
from the Go module cache (`go mod download`, as hack/build-bins.sh fetches it for the build)."""

from __future__ import annotations

from pathlib import Path

from multislice_operator.api import kubeschema

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_schema_is_a_fresh_generation_from_its_source() -> None:
    openapi, version = kubeschema.read_source(str(ROOT / "hack" / "tools" / "kube" / "go.mod"))
    shipped = (Path(kubeschema.__file__).parent / kubeschema.DATA_FILE).read_text()
    assert kubeschema.dumps(kubeschema.generate(openapi, version)) == shipped, (
        "run make kube-schema"
    )
