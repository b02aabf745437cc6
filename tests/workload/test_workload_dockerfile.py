"""workload/Dockerfile installs exactly the versions pinned in workload/pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

WORKLOAD = Path(__file__).resolve().parents[2] / "workload"


def pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((WORKLOAD / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    pins = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^;\s]+)", requirement.strip())
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def dockerfile_pins() -> dict[str, str]:
    """ARG <PACKAGE>_VERSION=x.y.z -> {package: x.y.z} (ORBAX_CHECKPOINT -> orbax-checkpoint)."""
    text = (WORKLOAD / "Dockerfile").read_text()
    return {
        name.lower().replace("_", "-"): version
        for name, version in re.findall(r"^ARG ([A-Z0-9_]+)_VERSION=(\S+)$", text, re.MULTILINE)
    }


def test_dockerfile_pins_match_pyproject() -> None:
    pins = pyproject_pins()
    assert {"jax", "optax", "orbax-checkpoint"} <= pins.keys()
    assert dockerfile_pins() == pins


def test_every_pinned_version_is_used_by_the_install_line() -> None:
    text = (WORKLOAD / "Dockerfile").read_text()
    for package in dockerfile_pins():
        variable = package.upper().replace("-", "_") + "_VERSION"
        assert f"==${{{variable}}}" in text, f"{variable} is declared but not installed"


def test_image_is_slim_python_311_and_non_root() -> None:
    text = (WORKLOAD / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", text, re.MULTILINE)
    user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user and user[-1] not in ("root", "0")
    assert 'ENTRYPOINT ["python", "-m", "multislice_workload"]' in text


def test_local_environment_runs_the_pinned_versions() -> None:
    # What the tests exercise is what the image ships (gcsfs is image-only).
    for package, version in pyproject_pins().items():
        if package != "gcsfs":
            assert metadata.version(package) == version, package
