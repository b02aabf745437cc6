"""The kind path cannot run without Docker; it must say so at once, naming what is missing."""

import pytest

from multislice_local.controlplane import ControlPlaneError
from multislice_local.kind import KindControlPlane, missing_tools


def test_kind_without_docker_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither docker nor kind
    assert missing_tools() == ["docker", "kind"]
    with pytest.raises(ControlPlaneError, match="CLUSTER=kind needs docker and kind on PATH"):
        KindControlPlane().start()


def test_demo_accepts_cluster_kind():
    from multislice_local.cli import build_parser

    args = build_parser().parse_args(["demo", "--cluster", "kind", "--scenario", "fatal"])
    assert (args.cluster, args.scenario) == ("kind", "fatal")
