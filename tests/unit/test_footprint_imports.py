"""`run` starts lean: the CLI parser and the kopf handlers import neither the local tooling nor
the Google client libraries (gRPC and friends weigh ~20 MiB), nor rich (the `status` view's, an
optional extra the image does not install); the GKE adapter loads only when a cluster is
configured."""

import subprocess
import sys

HEAVY = (
    "multislice_local",
    "grpc",
    "google.cloud.container_v1",
    "google.cloud.tpu_v2",
    "google.cloud.compute_v1",
    "jax",
    "rich",  # the status view's terminal library (the cli extra): never in the operator
)


def test_run_parser_and_handlers_import_nothing_heavy():
    code = (
        "import sys\n"
        "from multislice_operator.cli.main import build_parser\n"
        "build_parser().parse_args(['run', '-A'])\n"
        "import multislice_operator.controller.handlers\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout
